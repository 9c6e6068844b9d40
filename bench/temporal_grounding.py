"""Benchmark: "when" questions and temporal grounding on LoCoMo, over a flat retriever (issue 11, item 4).

A proxy for what services/recall/temporal.py's ``prefer_dated`` can do, before it is wired into
the search: stemmed BM25 over engram's turns (bench/recall_quality.py's "BM25 turns, stemmed"
row, same corpus, pairing, budgets and ``fill`` rule), for the questions ``is_when_question``
accepts. Rows: the turns as they are; the turns grounded against the day they were said
(``engram.text.temporal.ground``: what recall renders for a past turn, its extra tokens counted); and
grounded with dated turns lifted by N places (``prefer_dated(lift=N)``). A question is a hit
when one of its evidence messages is in a kept turn (by id, so a grounding label cannot hide a
hit). Tuning split and report split printed apart: choose ``lift`` on the tuning split.

    python bench/temporal_grounding.py                      # 7 conversations, ~30 s
    python bench/temporal_grounding.py --samples conv-26 --sessions 3 --lifts 0 5
    python bench/temporal_grounding.py --smoke       # CI: conv-26, 3 sessions, lifts 0 and 5
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

from bench._recall_common import LOCOMO, load_conversations  # noqa: E402
from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from bench._ranking import bm25_index, bm25_ranking, fill, normalized  # noqa: E402
from bench.recall_quality import BUDGETS, Corpus, build_corpus  # noqa: E402
from engram.text.temporal import ground  # noqa: E402
from engram.schemas import RecallItem  # noqa: E402
from engram.services.extractor.chunking import token_counter  # noqa: E402
from engram.services.recall.temporal import is_when_question, prefer_dated  # noqa: E402

LIFTS = (0, 1, 2, 3, 5, 10)
RAW = -1  # the row key of the ungrounded turns


def when_recall(corpora: Sequence[Corpus], lifts: Sequence[int], budgets: Sequence[int]) -> tuple[int, dict[tuple[int, int], int]]:
    """(when-questions, hits per (row, budget)); row RAW = ungrounded turns, else the lift."""
    count = token_counter()
    hits = {(row, b): 0 for row in (RAW, *lifts) for b in budgets}
    asked = 0
    for corpus in corpora:
        by_id = {m.message_id: m for m in corpus.messages}
        texts = [" ".join(f"{by_id[i].name}: {by_id[i].content}" for i in turn) for turn in corpus.turns]
        said = [by_id[turn[0]].timestamp for turn in corpus.turns]
        index, tokenize = bm25_index(texts, stem=True)
        for q in corpus.questions:
            if not is_when_question(q.text):
                continue
            asked += 1
            ranking = bm25_ranking(index, tokenize(q.text))
            items = [RecallItem(uuid=str(d), fact=texts[d], kind="episode", group_id="g", valid_at=said[d]) for d in ranking]
            for row in (RAW, *lifts):
                order = [int(i.uuid) for i in prefer_dated(items, lift=max(row, 0))]
                lines = [f"- {normalized(texts[d] if row == RAW else ground(texts[d], said[d]))}\n" for d in order]
                for b in budgets:
                    n = fill(lines, b, count)
                    hits[(row, b)] += bool({m for d in order[:n] for m in corpus.turns[d]} & q.evidence)
    return asked, hits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", default=str(LOCOMO), help="a LoCoMo-format JSON file")
    parser.add_argument("--samples", nargs="+", default=["all"], help="sample ids (default: all)")
    parser.add_argument("--sessions", type=int, default=None, help="first N sessions of each conversation")
    parser.add_argument("--lifts", type=int, nargs="+", default=list(LIFTS))
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS))
    args = parse(parser, {"samples": ["conv-26"], "sessions": 3, "lifts": [0, 5]}, argv)
    start = time.perf_counter()
    path = Path(args.data)
    require_locomo(path)
    convs = [c for c in load_conversations(path) if "all" in args.samples or c.get("sample_id") in args.samples]
    corpora = [build_corpus(path, c, args.sessions) for c in convs]
    check = Checks()
    check.that(bool(corpora), f"no conversation among {args.samples}")
    for split in ("tuning", "report", "other"):
        part = [c for c in corpora if c.split == split]
        if not part:
            continue
        asked, hits = when_recall(part, args.lifts, args.budgets)
        check.that(asked > 0, f"no when-question in the {split} split")
        print(f"\n{split} split ({', '.join(c.sample for c in part)}): {asked} when-questions, "
              "stemmed BM25 over turns, evidence recall (%) at a token budget")
        print(f"{'row':<24}" + "".join(f"{b:>8}" for b in args.budgets))
        for row in (RAW, *args.lifts):
            label = "turns as said" if row == RAW else f"grounded, lift {row}"
            values = [100 * hits[(row, b)] / max(asked, 1) for b in args.budgets]
            for b, v in zip(args.budgets, values, strict=True):
                check.number(f"{split} {label} @{b}", v)
            print(f"{label:<24}" + "".join(f"{v:>8.1f}" for v in values))
    print(f"\nrun time {time.perf_counter() - start:.1f} s")
    return check.verdict() if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
