"""Fact search through FalkorDB's vector index, for recall.

graphiti 0.31's hybrid edge search scores the query against every RELATES_TO edge of the group
(``vec.cosineDistance`` per edge, no index) and ships each edge's properties, embedding
included: that similarity half is most of recall's latency on large graphs. Here the similarity
half goes through the HNSW index that ``engram.graph.drivers.GraphDrivers.ensure_indices`` creates on
``RELATES_TO.fact_embedding`` (``db.idx.vector.queryRelationships``), and only uuids and scores
come back; the BM25 half is graphiti's fulltext query, also returning uuids only; the two are
fused with graphiti's RRF and the winners' fields fetched without their embeddings.

Semantics follow graphiti's ``EDGE_HYBRID_SEARCH_RRF`` search with recall's filter (expired facts
excluded): each half yields up to ``2 * limit`` candidates, the cosine half keeps those above
graphiti's ``sim_min_score`` (0.6 on graphiti's ``(1 + cos) / 2`` scale, i.e. cos > 0.2), RRF
(rank constant 1, BM25 list first) orders them, the best ``limit`` are returned. Differences: the
vector index is approximate (HNSW), and the returned edges carry no ``fact_embedding`` and empty
``attributes`` (recall uses neither).

Either function returns None when the index cannot answer (FalkorDB: not created, still being
built -- "Invalid arguments" -- or of another dimension; Neo4j: never built): the caller then
falls back to graphiti's search.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from graphiti_core.driver.driver import GraphProvider
from graphiti_core.edges import EntityEdge
from graphiti_core.graph_queries import get_relationships_query
from graphiti_core.helpers import parse_db_date
from graphiti_core.search.search_config import DEFAULT_MIN_SCORE
from graphiti_core.search.search_filters import (
    ComparisonOperator,
    DateFilter,
    SearchFilters,
    edge_search_filter_query_constructor,
)
from graphiti_core.search.search_utils import fulltext_query, rrf

from engram.compat import falkor_graph

log = logging.getLogger("engram.recall.vector")

# Recall's filter (as engram.services.recall.search.NOT_EXPIRED, kept here to avoid an import cycle).
_NOT_EXPIRED = SearchFilters(expired_at=[[DateFilter(comparison_operator=ComparisonOperator.is_null)]])
# graphiti's cosine score is (2 - cosineDistance) / 2 = (1 + cos) / 2; its default threshold 0.6
# is cos > 0.2 on the similarity scale returned here.
GRAPHITI_MIN_COSINE = 2 * DEFAULT_MIN_SCORE - 1
MAX_K = 1024  # candidates asked of the index at most, when expired facts crowd the nearest ones

# The index returns a cosine *distance* (0 = same direction, 2 = opposite): similarity = 1 - score.
# Expired and foreign facts are flagged, not filtered, so the caller can tell "k nearest exhausted"
# from "fewer than k current facts".
_VECTOR_QUERY = (
    "WITH vecf32($vector) AS qv "
    "CALL db.idx.vector.queryRelationships('RELATES_TO', 'fact_embedding', $k, qv) YIELD relationship AS e, score "
    "WITH e, score, startNode(e) AS n, endNode(e) AS m "
    "RETURN e.uuid AS uuid, 1 - score AS similarity, "
    "e.expired_at IS NULL AND e.group_id = $group_id AND n:Entity AND m:Entity AS current "
    "ORDER BY score"
)
# Only what recall needs from a fact -- no fact_embedding, no properties(e). The endpoints are read
# from the edge: FalkorDB plans "(n:Entity)-[e {uuid: u}]->(m:Entity)" as a label scan of every
# entity per uuid (30 ms at 2k facts instead of 0.3 ms).
_FETCH_QUERY = (
    "UNWIND $uuids AS u "
    "MATCH ()-[e:RELATES_TO {uuid: u}]->() "
    "WITH e, startNode(e) AS n, endNode(e) AS m "
    "WHERE n:Entity AND m:Entity AND e.group_id = $group_id AND e.expired_at IS NULL "
    "RETURN e.uuid AS uuid, n.uuid AS source_node_uuid, m.uuid AS target_node_uuid, e.group_id AS group_id, "
    "e.name AS name, e.fact AS fact, e.episodes AS episodes, e.created_at AS created_at, "
    "e.expired_at AS expired_at, e.valid_at AS valid_at, e.invalid_at AS invalid_at, "
    "e.reference_time AS reference_time"
)


_UNUSABLE = (
    "Invalid arguments",  # no index, or still being built
    "dimension mismatch",  # "Vector dimension mismatch, expected 384 but got 256": another embedder
    "undefined attribute",  # no index and the graph never had a fact_embedding
)


def _unusable(exc: Exception) -> bool:
    """Errors that mean "the vector index cannot answer" (FalkorDB 4.16's messages)."""
    return any(marker in str(exc) for marker in _UNUSABLE)


async def vector_fact_search(
    driver: Any, group_id: str, vector: list[float], limit: int, min_score: float | None = None
) -> list[tuple[str, float]] | None:
    """The group's ``limit`` current facts nearest to ``vector`` as (edge uuid, cosine similarity
    in [-1, 1]), best first, only those with similarity > ``min_score`` when given. None when the
    vector index cannot answer (see the module docstring): fall back to graphiti's search."""
    if getattr(driver, "provider", None) != GraphProvider.FALKORDB or limit <= 0 or not vector:
        return None
    from redis.exceptions import ResponseError

    graph = falkor_graph(driver)  # raw graph: the driver logs every failure as an error
    k = limit
    while True:
        try:
            result = await graph.ro_query(_VECTOR_QUERY, {"vector": vector, "k": k, "group_id": group_id})
        except ResponseError as exc:
            if _unusable(exc):
                log.debug("graph %s: vector index unusable (%s); falling back", group_id, exc)
                return None
            raise
        rows = result.result_set
        hits = [(uuid, float(sim)) for uuid, sim, current in rows
                if current and (min_score is None or float(sim) > min_score)]
        exhausted = len(rows) < k or (min_score is not None and rows and float(rows[-1][1]) <= min_score)
        if len(hits) >= limit or exhausted or k >= MAX_K:
            return hits[:limit]
        k = min(k * 4, MAX_K)  # expired (or foreign) facts took some of the k nearest: ask for more


async def fulltext_fact_search(driver: Any, group_id: str, query: str, limit: int) -> list[str]:
    """graphiti's BM25 half (``edge_fulltext_search``, same query text, index and filters), as
    edge uuids, best first -- without shipping each edge's properties."""
    fuzzy = fulltext_query(query, [group_id], driver)
    if not fuzzy:
        return []
    filters, params = edge_search_filter_query_constructor(_NOT_EXPIRED, driver.provider)
    filters.append("e.group_id IN $group_ids")
    cypher = (
        get_relationships_query("edge_name_and_fact", limit=limit, provider=driver.provider)
        + " YIELD relationship AS e, score WITH e, score, startNode(e) AS n, endNode(e) AS m"
        + " WHERE n:Entity AND m:Entity AND " + " AND ".join(filters)
        + " RETURN e.uuid AS uuid, score ORDER BY score DESC LIMIT $limit"
    )
    records, _, _ = await driver.execute_query(cypher, query=fuzzy, group_ids=[group_id], limit=limit,
                                               routing_="r", **params)
    return [r["uuid"] for r in records]


async def fetch_facts(driver: Any, group_id: str, uuids: list[str]) -> list[EntityEdge]:
    """The current facts among ``uuids``, in that order, without embeddings or attributes."""
    if not uuids:
        return []
    records, _, _ = await driver.execute_query(_FETCH_QUERY, uuids=uuids, group_id=group_id, routing_="r")
    by_uuid = {
        r["uuid"]: EntityEdge(
            uuid=r["uuid"], source_node_uuid=r["source_node_uuid"], target_node_uuid=r["target_node_uuid"],
            group_id=r["group_id"], name=r["name"], fact=r["fact"], episodes=list(r["episodes"] or []),
            created_at=parse_db_date(r["created_at"]), expired_at=parse_db_date(r["expired_at"]),
            valid_at=parse_db_date(r["valid_at"]), invalid_at=parse_db_date(r["invalid_at"]),
            reference_time=parse_db_date(r["reference_time"]), fact_embedding=None, attributes={},
        )
        for r in records
    }
    return [by_uuid[u] for u in uuids if u in by_uuid]


def weighted_rrf(rankings: Sequence[Sequence[str]], weights: Sequence[float],
                 rank_const: int = 1) -> tuple[list[str], list[float]]:
    """graphiti's ``rrf`` (sum of 1/(rank + rank_const), rank from 0; ties in first-seen order)
    with each ranking's terms times its weight."""
    scores: dict[str, float] = {}
    for ranking, weight in zip(rankings, weights):
        for rank, uuid in enumerate(ranking):
            scores[uuid] = scores.get(uuid, 0.0) + weight / (rank + rank_const)
    ordered = sorted(scores.items(), key=lambda term: term[1], reverse=True)
    return [u for u, _ in ordered], [s for _, s in ordered]


def above_floor(nearest: list[tuple[str, float]], min_cosine: float | None,
                others: Sequence[Sequence[str]]) -> list[tuple[str, float]]:
    """The vector half's hits at ``min_cosine`` (the relevance floor) or above, and those below it
    that another ranking (keyword, entity) found too: the floor is for facts sharing no word with
    the question, and taking a found fact's vector vote away would demote what it should keep."""
    if min_cosine is None or min_cosine <= GRAPHITI_MIN_COSINE:
        return nearest
    found = {uuid for ranking in others for uuid in ranking}
    return [(uuid, sim) for uuid, sim in nearest if sim >= min_cosine or uuid in found]


async def hybrid_fact_search_scored(
    clients: Any, group_id: str, query: str, vector: list[float], limit: int,
    *, extra: Sequence[list[str]] = (), min_cosine: float | None = None, keyword: list[str] | None = None,
    rank_const: int = 1, extra_weight: float = 1.0,
) -> list[tuple[EntityEdge, float]] | None:
    """:func:`hybrid_fact_search` with each fact's RRF score (graphiti's ``edge_reranker_scores``).
    ``extra``: further rankings of edge uuids fused with the two (recall's entity-centric one);
    ``min_cosine``: the relevance floor of the vector half, when above graphiti's own.
    ``keyword``: the BM25 half already ranked (recall's own index over the facts' text), instead
    of the graph's fulltext query. ``rank_const``: RRF's constant, 1/(rank + rank_const) from rank
    0 (graphiti's 1; recall's score fusion passes 61, the usual k = 60, to put facts and turns on
    one scale). ``extra_weight``: each ``extra`` ranking's weight in the fusion (the two halves
    weigh 1)."""
    if not query.strip() or limit <= 0:
        return []  # graphiti's search() answers an empty query with nothing
    driver = clients.driver
    if getattr(driver, "provider", None) != GraphProvider.FALKORDB:
        return None
    if keyword is None:
        keyword, nearest = await asyncio.gather(
            fulltext_fact_search(driver, group_id, query, 2 * limit),
            vector_fact_search(driver, group_id, vector, 2 * limit, min_score=GRAPHITI_MIN_COSINE),
        )
    else:
        nearest = await vector_fact_search(driver, group_id, vector, 2 * limit, min_score=GRAPHITI_MIN_COSINE)
    if nearest is None:
        return None
    nearest = above_floor(nearest, min_cosine, [keyword, *extra])
    rankings = [keyword, [u for u, _ in nearest], *extra]
    uuids, scores = weighted_rrf(rankings, [1.0, 1.0] + [extra_weight] * len(extra), rank_const) \
        if extra_weight != 1.0 else rrf(rankings, rank_const=rank_const)
    score_of = dict(zip(uuids[:limit], scores[:limit]))
    edges = await fetch_facts(driver, group_id, uuids[:limit])
    return [(edge, score_of[edge.uuid]) for edge in edges]


async def hybrid_fact_search(
    clients: Any, group_id: str, query: str, vector: list[float], limit: int
) -> list[EntityEdge] | None:
    """The group's best ``limit`` current facts for ``query`` (text) and ``vector`` (its
    embedding), best first: BM25 + vector index fused by RRF, as graphiti's
    ``EDGE_HYBRID_SEARCH_RRF`` with expired facts excluded. None when the vector index cannot
    answer: the caller falls back to graphiti's search."""
    scored = await hybrid_fact_search_scored(clients, group_id, query, vector, limit)
    return None if scored is None else [edge for edge, _ in scored]
