"""Choose the similarity below which engram skips graphiti's edge dedupe call
(services/extractor/local_answers.py, :data:`DEDUPE_SIMILARITY`; issue 25, item 6).

Reads the labelled pairs of ``bench/data/fact_changes.jsonl`` (earlier, later statement; label
``change`` / ``restatement`` / ``unrelated``; split ``tuning`` / ``heldout``). A dedupe call is
needed for a change (the model must see the contradicted fact) and for a restatement (a
duplicate), not for an unrelated pair. On the tuning split the threshold is the lowest
content-word overlap (:func:`fact_similarity`) of a pair that needs the call, rounded down to a
multiple of 0.05 (a margin), so every tuning
pair that needs it still makes it; the held-out split (never used to choose) then reports how
many needed calls the threshold would skip (misses) and how many unneeded ones it saves.

Limits: the pairs are hand-written statements, not extracted facts, and the gate compares the
new fact with *every* candidate graphiti found (a call is made when any one is close): in a
graph the saving is smaller than the unrelated-pair rate here.

    python bench/dedupe_threshold.py
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engram.services.extractor.local_answers import DEDUPE_SIMILARITY, fact_similarity  # noqa: E402

PAIRS = Path(__file__).resolve().parent / "data" / "fact_changes.jsonl"
NEEDED = ("change", "restatement")


def main() -> int:
    rows = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    for row in rows:
        row["similarity"] = fact_similarity(row["earlier"], row["later"])
    tuning = [r for r in rows if r["split"] == "tuning"]
    lowest = min(r["similarity"] for r in tuning if r["label"] in NEEDED)
    chosen = math.floor(lowest * 20) / 20  # a margin: rounded down to a multiple of 0.05
    print(f"chosen on tuning ({len(tuning)} pairs): lowest needed {lowest:.3f} -> threshold {chosen:.2f} "
          f"(the module uses {DEDUPE_SIMILARITY:.2f})")
    for split in ("tuning", "heldout"):
        part = [r for r in rows if r["split"] == split]
        needed = [r for r in part if r["label"] in NEEDED]
        unneeded = [r for r in part if r["label"] not in NEEDED]
        missed = [r for r in needed if r["similarity"] < chosen]
        saved = [r for r in unneeded if r["similarity"] < chosen]
        print(f"{split:8s}: needed calls kept {len(needed) - len(missed)}/{len(needed)}, "
              f"unneeded calls skipped {len(saved)}/{len(unneeded)}")
        for r in missed:
            print(f"  MISSED ({r['label']}, {r['similarity']:.2f}): {r['earlier']!r} -> {r['later']!r}")
    return 0 if chosen == DEDUPE_SIMILARITY else 1


if __name__ == "__main__":
    sys.exit(main())
