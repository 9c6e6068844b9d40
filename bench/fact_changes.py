"""Invalidation precision and recall of the offline rules model on facts that change (issue 11, item 6).

Reads ``bench/data/fact_changes.jsonl``: pairs of statements a user makes some days apart
(``earlier``, ``later``), labelled ``change`` (the later one makes the earlier one false:
"we switched the billing service to SQLite" after "the billing service uses Postgres 15"),
``restatement`` (it says the same again, sometimes with a change verb: "we migrated the frontend
to React in 2023" after "the frontend is built with React") or ``unrelated`` (another subject,
often with shared words or a change phrase about something else). Each row belongs to a
``split``: ``tuning`` (the pairs the change rules were chosen on) or ``heldout`` (written at the
same time, before any rule was changed, and never looked at while choosing them). Change pairs
also carry ``question``, ``old`` and ``new`` (a question about the value, the words naming it
before and after), read by bench/knowledge_updates.py.

For each pair it runs the path the extractor runs with the offline default, minus the graph:

1. the rules model's combined extraction (graphiti's ``extract_nodes_and_edges`` prompt, built by
   graphiti's own prompt library) over ``user (Ada): <statement>``, for each statement;
2. for each fact of the later statement, graphiti's ``dedupe_edges.resolve_edge`` prompt with the
   earlier statement's facts as invalidation candidates, answered by the rules model
   (``contradicted_facts``);
3. the extractor's restatement review (services/extractor/restatement.py) with the hashing
   embedder and its threshold: an invalidation by a restating fact is rejected.

The pair is *invalidated* when some fact of the earlier statement is contradicted and not
rejected. Precision = invalidated changes / invalidated pairs; recall = invalidated changes /
changes. Not modelled in this default mode: graphiti's search for invalidation candidates (the
earlier facts are always offered) and the date checks that follow.

``--graph`` runs the whole offline extractor instead (services/extractor/pipeline.py
``extract_episode``: rules model, hashing embedder, restatement review) on a FalkorDB it starts,
one fresh graph per pair: the earlier statement as a turn on day 0, the later one on day 3; the
pair is invalidated when a fact of the earlier turn ends up with ``invalid_at`` set. This adds
what the default mode leaves out (the earlier fact must be found by graphiti's hybrid search over
the new fact, and the dates must agree).

Run: ``python bench/fact_changes.py [--graph] [--split tuning|heldout|all] [--show]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # `python bench/x.py` finds bench._smoke

from graphiti_core.prompts import prompt_library  # noqa: E402
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate  # noqa: E402
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction  # noqa: E402

from bench._smoke import Checks, parse  # noqa: E402
from engram.models.factory import EmbedderSettings, build_embedder  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.services.extractor.restatement import DEFAULT_SIMILARITY, cosine, restatement_reason  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "data" / "fact_changes.jsonl"
SPEAKER = "Ada"
LABELS = ("change", "restatement", "unrelated")


@dataclass(frozen=True)
class Pair:
    earlier: str
    later: str
    label: str
    split: str
    # change pairs only: a question about the value and the words naming the value before and
    # after (bench/knowledge_updates.py asks the question and looks for the words)
    question: str = ""
    old: str = ""
    new: str = ""


@dataclass(frozen=True)
class Decision:
    pair: Pair
    invalidated: bool
    earlier_facts: tuple[str, ...]
    later_facts: tuple[str, ...]
    contradicted: tuple[tuple[str, str], ...]  # (earlier fact, later fact) the model called contradicted
    rejected: tuple[tuple[str, str], ...]  # of those, the ones the restatement review rejected


def load(path: Path = CORPUS) -> list[Pair]:
    pairs = [Pair(**json.loads(line)) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for p in pairs:
        if p.label not in LABELS or p.split not in ("tuning", "heldout"):
            raise ValueError(f"bad row in {path}: {p}")
    return pairs


def facts_of(client: RulesExtractorClient, statement: str) -> list[str]:
    """The facts the rules model extracts from one user turn (graphiti's combined prompt)."""
    messages = prompt_library.extract_nodes_and_edges.extract_message({
        "episode_content": f"user ({SPEAKER}): {statement}",
        "previous_episodes": [],
        "custom_extraction_instructions": "",
        "entity_types": [{"entity_type_id": 0, "entity_type_name": "Entity",
                          "entity_type_description": "Default entity classification."}],
        "edge_types": [],
        "strict_edge_types": False,
    })
    answer = client.respond(messages, CombinedExtraction)
    return list(dict.fromkeys(e["fact"] for e in answer["edges"]))


def contradicted(client: RulesExtractorClient, new_fact: str, old_facts: list[str]) -> list[str]:
    """The old facts the rules model calls contradicted by ``new_fact`` (graphiti's resolve_edge prompt)."""
    messages = prompt_library.dedupe_edges.resolve_edge({
        "existing_edges": [],
        "new_edge": new_fact,
        "edge_invalidation_candidates": [{"idx": i, "fact": f} for i, f in enumerate(old_facts)],
    })
    answer = client.respond(messages, EdgeDuplicate)
    return [old_facts[i] for i in answer["contradicted_facts"] if 0 <= i < len(old_facts)]


async def decide(pairs: list[Pair]) -> list[Decision]:
    client = RulesExtractorClient()
    embedder = build_embedder(EmbedderSettings(provider="hashing"))
    threshold = DEFAULT_SIMILARITY["hashing"]
    extracted = {s: facts_of(client, s) for s in dict.fromkeys(x for p in pairs for x in (p.earlier, p.later))}
    texts = sorted({f for facts in extracted.values() for f in facts})
    vectors = dict(zip(texts, await embedder.create_batch(texts), strict=True)) if texts else {}
    out = []
    for p in pairs:
        old_facts, new_facts = extracted[p.earlier], extracted[p.later]
        hits = [(old, new) for new in new_facts for old in contradicted(client, new, old_facts)]
        rejected = [
            (old, new) for old, new in hits
            if restatement_reason(old, new, similarity=cosine(vectors[old], vectors[new]), threshold=threshold)
        ]
        # an old fact stays invalidated when any of its invalidators is not a restatement
        invalidated = {old for old, new in hits if (old, new) not in rejected}
        out.append(Decision(p, bool(invalidated), tuple(old_facts), tuple(new_facts), tuple(hits), tuple(rejected)))
    return out


async def decide_in_graph(pairs: list[Pair]) -> list[Decision]:
    """:func:`decide` through the extractor's real pipeline on a FalkorDB it starts (``--graph``)."""
    import logging
    import tempfile
    import uuid
    from datetime import datetime, timedelta, timezone

    from graphiti_core.graphiti_types import GraphitiClients
    from graphiti_core.tracer import NoOpTracer

    from engram.stack.embedded import start_falkordb
    from engram.graph.drivers import EngramFalkorDriver
    from engram.models.hashing_embedder import HashingEmbedder
    from engram.schemas import Episode, EpisodeMessage
    from engram.services.extractor.app import NoRerank
    from engram.services.extractor.pipeline import extract_episode
    from engram.services.extractor.preprocessing import ExtractionSettings, validate_at_startup

    logging.disable(logging.WARNING)
    day0 = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
    instructions = validate_at_startup(ExtractionSettings()) or ""  # the extractor's default preprocessing

    def episode(group: str, turn: str, text: str, at: datetime) -> Episode:
        return Episode(episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"fact_changes/{group}/{turn}")), group_id=group,
                       scope="session", turn_id=turn, session_id=turn, reference_time=at,
                       content=f"user ({SPEAKER}): {text}",
                       messages=[EpisodeMessage(message_id=f"{turn}-m", role="user", name=SPEAKER, timestamp=at)])

    out = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_falkordb(Path(tmp))
        host, port = server.url.split("://", 1)[1].rsplit(":", 1)
        try:
            for i, p in enumerate(pairs):
                group = f"fc_{i}_{uuid.uuid4().hex[:6]}"
                driver = EngramFalkorDriver(host=host, port=int(port), database=group)
                clients = GraphitiClients(driver=driver, llm_client=RulesExtractorClient(), embedder=HashingEmbedder(256),
                                          cross_encoder=NoRerank(), tracer=NoOpTracer())
                try:
                    first = await extract_episode(clients, episode(group, "earlier", p.earlier, day0),
                                                  custom_instructions=instructions, previous_window=5,
                                                  restatement_similarity=DEFAULT_SIMILARITY["hashing"])
                    second = await extract_episode(clients, episode(group, "later", p.later, day0 + timedelta(days=3)),
                                                   custom_instructions=instructions, previous_window=5,
                                                   restatement_similarity=DEFAULT_SIMILARITY["hashing"])
                    old = {e.uuid: e.fact for e in first.resolved_edges}
                    ended = [e for e in second.invalidated_edges if e.uuid in old]
                    out.append(Decision(
                        p, bool(ended), tuple(old.values()), tuple(e.fact for e in second.resolved_edges),
                        tuple((e.fact, "") for e in ended),
                        tuple((old.get(r.invalidated_uuid, ""), "") for r in second.rejected_invalidations),
                    ))
                finally:
                    # no GRAPH.DELETE per pair: the server is thrown away with its directory, and
                    # deleting graphs between index builds crashed FalkorDB 4.16.3 once in a full
                    # suite run at 100 pairs (the crash of docs/architecture.md, upstream #2126)
                    await driver.close()
        finally:
            server.stop()
    return out


def scores(decisions: list[Decision]) -> dict[str, float | int]:
    tp = sum(d.invalidated and d.pair.label == "change" for d in decisions)
    fp = sum(d.invalidated and d.pair.label != "change" for d in decisions)
    changes = sum(d.pair.label == "change" for d in decisions)
    return {
        "pairs": len(decisions), "changes": changes, "invalidated": tp + fp, "true": tp, "false": fp,
        "precision": tp / (tp + fp) if tp + fp else 1.0, "recall": tp / changes if changes else 1.0,
        **{f"fired_{label}": sum(d.invalidated and d.pair.label == label for d in decisions) for label in LABELS},
        **{f"n_{label}": sum(d.pair.label == label for d in decisions) for label in LABELS},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--split", choices=["tuning", "heldout", "all"], default="all",
                        help="which rows to print one by one with --show (the table always shows both)")
    parser.add_argument("--show", action="store_true", help="print every pair's decision and the facts behind it")
    parser.add_argument("--limit", type=int, default=0, help="first N rows of each split and label (0: all)")
    parser.add_argument("--graph", action="store_true",
                        help="run the whole offline extractor on a FalkorDB it starts, one graph per pair")
    args = parse(parser, {"limit": 2}, argv)
    pairs = load(args.corpus)
    if args.limit:
        seen: dict[tuple[str, str], int] = {}
        kept = []
        for p in pairs:
            key = (p.split, p.label)
            if seen.get(key, 0) < args.limit:
                seen[key] = seen.get(key, 0) + 1
                kept.append(p)
        pairs = kept
    decisions = asyncio.run(decide_in_graph(pairs) if args.graph else decide(pairs))
    if args.show:
        for d in decisions:
            if args.split not in ("all", d.pair.split):
                continue
            right = d.invalidated == (d.pair.label == "change")
            print(f"{'ok ' if right else 'BAD'} {d.pair.split:8} {d.pair.label:11} invalidated={d.invalidated!s:5} "
                  f"| {d.pair.earlier} -> {d.pair.later}")
            print(f"      facts: {list(d.earlier_facts)} -> {list(d.later_facts)}; contradicted: {len(d.contradicted)}, "
                  f"rejected as restatement: {len(d.rejected)}")
    path = "extractor pipeline on FalkorDB" if args.graph else "rules model + restatement review (hashing)"
    print(f"fact-change invalidation, {path}, corpus {args.corpus.name}")
    print(f"{'split':9} {'pairs':>5} {'chg/rst/unr':>11} {'invalidated':>11} {'false':>5} {'precision':>9} {'recall':>6}")
    check = Checks()
    for split in ("tuning", "heldout", "all"):
        rows = [d for d in decisions if split == "all" or d.pair.split == split]
        s = scores(rows)
        counts = f"{s['n_change']}/{s['n_restatement']}/{s['n_unrelated']}"
        print(f"{split:9} {s['pairs']:5} {counts:>11} {s['invalidated']:11} {s['false']:5} "
              f"{s['precision']:9.3f} {s['recall']:6.3f}")
        check.number(f"{split} precision", s["precision"])
        check.number(f"{split} recall", s["recall"])
        check.that(s["pairs"] > 0, f"no {split} pairs")
    print("tuning: the rows the change rules were chosen on; heldout: written with them, never used to choose")
    return check.verdict() if args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())
