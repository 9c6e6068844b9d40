"""Does asking a turn's edge dedupe questions in one call judge them as well as asking each alone?
(services/extractor/dedupe_batch.py; issue 25, item 6: one model call per turn, quality held.)

The questions are the labelled pairs of ``bench/data/fact_changes.jsonl`` (earlier, later
statement; ``change`` / ``restatement`` / ``unrelated``), each as graphiti's ``resolve_edge``
question: the later statement is the new fact, the earlier one its existing fact (the same
entity pair), and two statements of other pairs are its invalidation candidates (the next pairs
in the file: about other things, so neither may be marked). The right answer: a change
contradicts its earlier statement, a restatement duplicates it, an unrelated pair neither; no
other candidate is marked.

Each question is asked twice by the same model: alone with graphiti's own prompt (what graphiti
sends) and in a batch of ``--batch`` questions with engram's batched prompt
(``dedupe_batch.batch_messages``, read back by ``answers_by_question`` exactly as the extractor
reads it). The table gives, per way of asking and split: questions answered right, changes
caught, restatements caught, wrong marks (an unrelated pair or another candidate marked), calls
and tokens; then how often the two ways agree. A question the batch's answer leaves out counts
as asked alone (what the extractor does).

    python bench/dedupe_batch_quality.py                   # the offline rules model (deterministic)
    python bench/dedupe_batch_quality.py --llm-base-url http://127.0.0.1:8080/v1 --llm-model qwen2.5-coder-1.5b
    python bench/dedupe_batch_quality.py --smoke           # CI: 8 pairs, the rules model

Limits: the pairs are hand-written statements, one question per pair, and the batches are made of
unrelated pairs (a turn's questions usually share an entity); a small model's answers vary from
run to run (temperature as the client sends it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from graphiti_core.prompts import prompt_library  # noqa: E402
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate  # noqa: E402

from bench._smoke import Checks, parse  # noqa: E402
from bench.extraction_quality import make_llm  # noqa: E402
from engram.models.openai_compat import llm_stats  # noqa: E402
from engram.services.extractor.dedupe_batch import (  # noqa: E402
    BATCH_PROMPT,
    DedupeQuestion,
    EdgeDuplicates,
    answers_by_question,
    batch_messages,
)

PAIRS = Path(__file__).resolve().parent / "data" / "fact_changes.jsonl"
EDGE_DEDUPE_PROMPT = "dedupe_edges.resolve_edge"
DISTRACTORS = 2  # invalidation candidates per question, from other pairs


@dataclass
class Case:
    pair: dict[str, Any]
    question: DedupeQuestion
    answers: dict[str, dict[str, list[int]]] = field(default_factory=dict)  # way -> graphiti's answer

    @property
    def expected(self) -> dict[str, list[int]]:
        label = self.pair["label"]
        return {"duplicate_facts": [0] if label == "restatement" else [],
                "contradicted_facts": [0] if label == "change" else []}


def cases_of(pairs: list[dict[str, Any]]) -> list[Case]:
    cases = []
    for i, pair in enumerate(pairs):
        others = [pairs[(i + k) % len(pairs)]["earlier"] for k in range(1, DISTRACTORS + 1)]
        cases.append(Case(pair, DedupeQuestion(pair["later"], [(0, pair["earlier"])],
                                               [(1 + k, fact) for k, fact in enumerate(others)])))
    return cases


def single_messages(q: DedupeQuestion) -> list[Any]:
    """graphiti's own prompt for ``q`` (its idx values as the question holds them)."""
    return prompt_library.dedupe_edges.resolve_edge({
        "existing_edges": [{"idx": i, "fact": f} for i, f in q.existing],
        "new_edge": q.new,
        "edge_invalidation_candidates": [{"idx": i, "fact": f} for i, f in q.others],
    })


NOTHING: dict[str, list[int]] = {"duplicate_facts": [], "contradicted_facts": []}


def sorted_lists(found: dict[str, list[int]] | None) -> dict[str, list[int]] | None:
    """An answer's lists sorted, so the two ways compare."""
    return {k: sorted(v) for k, v in found.items()} if found is not None else None


def as_read(answer: Any, q: DedupeQuestion) -> dict[str, list[int]]:
    """graphiti's one-question answer read as the extractor reads a batched row
    (``answers_by_question``: idx values outside the lists dropped, as graphiti drops them)."""
    row = {"answers": [{"id": 0, **answer}]} if isinstance(answer, dict) else None
    return sorted_lists(answers_by_question(row, [q]).get(0)) or NOTHING


@dataclass
class Way:
    llm: Any  # this way's own AccountingLLMClient around the model: its calls and cl100k tokens
    failed: int = 0
    seconds: float = 0.0

    @property
    def calls(self) -> int:
        return sum(self.llm.calls.values())

    def tokens(self, direction: str) -> int:
        return sum(t[direction] for t in self.llm.tokens.values())


async def ask_alone(case: Case, way: Way) -> dict[str, list[int]]:
    try:
        answer = await way.llm.generate_response(single_messages(case.question), response_model=EdgeDuplicate,
                                             prompt_name=EDGE_DEDUPE_PROMPT)
    except Exception as exc:  # noqa: BLE001 - a failed call is counted, its question answered "none"
        print(f"  call failed ({type(exc).__name__}): {case.pair['later']!r}", file=sys.stderr)
        way.failed += 1
        return NOTHING
    return as_read(answer, case.question)


async def run(llm: Any, cases: list[Case], batch: int) -> dict[str, Way]:
    from engram.models.accounting import AccountingLLMClient

    ways = {"alone": Way(AccountingLLMClient(llm, stage="bench")), "batched": Way(AccountingLLMClient(llm, stage="bench"))}
    started = time.perf_counter()
    for case in cases:
        case.answers["alone"] = await ask_alone(case, ways["alone"])
    ways["alone"].seconds = time.perf_counter() - started
    started = time.perf_counter()
    for start in range(0, len(cases), batch):
        group = cases[start:start + batch]
        answered: dict[int, dict[str, list[int]]] = {}
        if len(group) > 1:
            try:
                answer = await ways["batched"].llm.generate_response(batch_messages([c.question for c in group]),
                                                     response_model=EdgeDuplicates, prompt_name=BATCH_PROMPT)
                answered = answers_by_question(answer, [c.question for c in group])
            except Exception as exc:  # noqa: BLE001 - the extractor then asks each question alone
                print(f"  batched call failed ({type(exc).__name__}): its questions asked alone", file=sys.stderr)
                ways["batched"].failed += 1
        for i, case in enumerate(group):
            case.answers["batched"] = sorted_lists(answered.get(i)) or await ask_alone(case, ways["batched"])
    ways["batched"].seconds = time.perf_counter() - started
    return ways


def score(cases: list[Case], way: str) -> dict[str, int]:
    out = {"right": 0, "changes": 0, "restatements": 0, "wrong_marks": 0}
    for c in cases:
        got, label = c.answers[way], c.pair["label"]
        out["right"] += got == c.expected
        out["changes"] += label == "change" and 0 in got["contradicted_facts"]
        out["restatements"] += label == "restatement" and 0 in got["duplicate_facts"]
        marked = set(got["duplicate_facts"]) | set(got["contradicted_facts"])
        out["wrong_marks"] += bool(marked - {0}) or (label == "unrelated" and 0 in marked)
    return out


def report(cases: list[Case], ways: dict[str, Way], model: str, batch: int) -> list[str]:
    lines = [f"edge dedupe judged alone vs {batch} per call, {model}, {len(cases)} labelled pairs "
             f"(bench/data/fact_changes.jsonl)", "",
             "| asked | split | right | changes caught | restatements caught | wrong marks |",
             "|---|---|---|---|---|---|"]
    for way in ways:
        for split in ("tuning", "heldout"):
            part = [c for c in cases if c.pair["split"] == split]
            if not part:
                continue
            s = score(part, way)
            n_change = sum(c.pair["label"] == "change" for c in part)
            n_restate = sum(c.pair["label"] == "restatement" for c in part)
            lines.append(f"| {way} | {split} | {s['right']}/{len(part)} | {s['changes']}/{n_change} | "
                         f"{s['restatements']}/{n_restate} | {s['wrong_marks']} |")
    agree = sum(c.answers["alone"] == c.answers["batched"] for c in cases)
    lines += ["", f"the same answer both ways: {agree}/{len(cases)}"]
    for name, way in ways.items():
        lines.append(f"{name}: {way.calls} calls ({way.failed} failed), {way.tokens('input'):,} input and "
                     f"{way.tokens('output'):,} output tokens (cl100k), {way.seconds:.1f}s")
    return lines


async def main(args: argparse.Namespace) -> int:
    pairs = [json.loads(line) for line in PAIRS.read_text().splitlines() if line.strip()]
    if args.pairs:
        pairs = pairs[: args.pairs]
    cases = cases_of(pairs)
    llm = make_llm(args)
    ways = await run(llm, cases, args.batch)
    model = args.llm_model if args.llm_base_url else "rules model (offline)"
    print("\n".join(report(cases, ways, model, args.batch)))
    stats = llm_stats(llm)
    if stats is not None:
        print(f"client: {stats.truncated} answers cut at max_tokens, {stats.invalid} invalid, {stats.retried} retried")
    if args.show_disagreements:
        for c in cases:
            if c.answers["alone"] != c.answers["batched"]:
                print(f"  {c.pair['label']}: {c.pair['earlier']!r} -> {c.pair['later']!r}: "
                      f"alone {c.answers['alone']}, batched {c.answers['batched']}")
    if args.smoke:
        checks = Checks()
        checks.that(all(len(c.answers) == 2 for c in cases), "a question was not answered both ways")
        checks.that(ways["batched"].calls < ways["alone"].calls, "batching made no fewer calls")
        if not args.llm_base_url:  # the rules model judges a batch as it judges each question
            checks.that(all(c.answers["alone"] == c.answers["batched"] for c in cases),
                        "the rules model judged a batched question differently")
        return checks.verdict()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4, help="questions per batched call (a turn's usual 2-5)")
    parser.add_argument("--pairs", type=int, default=0, help="the file's first N pairs only (0: all)")
    parser.add_argument("--llm-base-url", help="an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--llm-model", default="local")
    parser.add_argument("--llm-api-key", default="unused")
    parser.add_argument("--show-disagreements", action="store_true")
    args = parse(parser, {"pairs": 8})
    sys.exit(asyncio.run(main(args)))
