"""Pick the embedding threshold of the restatement check (services/extractor/restatement.py).

Reads the labelled pairs ``services/extractor/data/restatement_pairs.jsonl`` (old fact, new fact,
"restatement" | "contradiction"), embeds both facts with each embedder, and reports per embedder:

* the cosine similarity of every pair, by label;
* which pairs the embedding-free rules already decide (polarity -> accepted; same_text /
  same_words -> rejected);
* the threshold: the highest similarity of a contradiction that no rule decides (same polarity,
  no replaced value: the pairs the threshold alone must keep accepted), plus ``--margin``
  (default 0.02); and what it then gives on the set (restatements rejected, contradictions
  wrongly rejected).

``restatement_pairs_heldout.jsonl`` (written apart, never used to choose) is then scored at the
chosen threshold.

Run: ``python -m bench.restatement_threshold [--embedders hashing,minilm]`` (minilm needs the
``local-models`` extra). Numbers are for this small hand-written set: they bound, not measure,
production behaviour.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/x.py` finds bench._smoke

from bench._smoke import Checks, parse  # noqa: E402
from engram.models.factory import EmbedderSettings, build_embedder
from engram.services.extractor.restatement import cosine, negated, replaced_value, restatement_reason

DATA = Path(__file__).resolve().parents[1] / "services" / "extractor" / "data"
PAIRS = DATA / "restatement_pairs.jsonl"
# Written separately and never used to choose the threshold: how the chosen one does on new pairs.
HELD_OUT = DATA / "restatement_pairs_heldout.jsonl"


def load_pairs(path: Path = PAIRS) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def similarities(provider: str, pairs: list[dict[str, str]]) -> list[float]:
    embedder = build_embedder(EmbedderSettings(provider=provider))  # type: ignore[arg-type]
    texts = sorted({p[k] for p in pairs for k in ("old", "new")})
    vectors = dict(zip(texts, await embedder.create_batch(texts), strict=True))
    return [cosine(vectors[p["old"]], vectors[p["new"]]) or 0.0 for p in pairs]


def choose_threshold(pairs: list[dict[str, str]], sims: list[float], margin: float) -> float:
    same_polarity_contradictions = [
        s for p, s in zip(pairs, sims, strict=True)
        if p["label"] == "contradiction" and negated(p["old"]) == negated(p["new"])
        and restatement_reason(p["old"], p["new"]) is None and not replaced_value(p["old"], p["new"])
    ]
    return round(max(same_polarity_contradictions, default=0.0) + margin, 2)


def evaluate(pairs: list[dict[str, str]], sims: list[float], threshold: float, title: str) -> dict[str, object]:
    rows = []
    for p, s in zip(pairs, sims, strict=True):
        lexical = restatement_reason(p["old"], p["new"])
        with_embedding = restatement_reason(p["old"], p["new"], similarity=s, threshold=threshold)
        rows.append((p["label"], s, lexical, with_embedding, p["old"], p["new"]))
    restatements = [r for r in rows if r[0] == "restatement"]
    contradictions = [r for r in rows if r[0] == "contradiction"]
    print(f"\n== {title}")
    for label, s, lexical, decided, old, new in sorted(rows, key=lambda r: -r[1]):
        print(f"  {s:6.3f} {label:13s} {str(lexical):10s} -> {str(decided):15s} {old!r} / {new!r}")
    out = {
        "threshold": threshold,
        "restatements_rejected_lexical": sum(r[2] is not None for r in restatements),
        "restatements_rejected": sum(r[3] is not None for r in restatements),
        "restatements": len(restatements),
        "contradictions_wrongly_rejected": sum(r[3] is not None for r in contradictions),
        "contradictions": len(contradictions),
    }
    print("  " + json.dumps(out))
    return out


def report(provider: str, pairs: list[dict[str, str]], sims: list[float], margin: float) -> float:
    threshold = choose_threshold(pairs, sims, margin)
    evaluate(pairs, sims, threshold, f"{provider}: threshold {threshold:.2f} "
             f"(the most similar contradiction no rule decides + {margin})")
    return threshold


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--embedders", default="hashing,minilm")
    parser.add_argument("--margin", type=float, default=0.02)
    args = parse(parser, {"embedders": "hashing"})  # the whole labelled set is small: smoke = hashing only
    pairs, held_out = load_pairs(), load_pairs(HELD_OUT)
    checks = Checks()
    for provider in args.embedders.split(","):
        threshold = report(provider, pairs, await similarities(provider, pairs), args.margin)
        held = evaluate(held_out, await similarities(provider, held_out), threshold,
                        f"{provider}: held-out pairs at threshold {threshold:.2f}")
        checks.number(f"{provider} threshold", threshold)
        checks.that(held.get("restatements", 0) + held.get("contradictions", 0) == len(held_out),
                    f"{provider}: held-out counts do not add up to {len(held_out)}")
        checks.that(held.get("contradictions_wrongly_rejected", 1) == 0,
                    f"{provider}: a held-out contradiction was rejected as a restatement")
    return checks.verdict() if args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
