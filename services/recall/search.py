"""Searching one group's graph for recall, in one graphiti ``search()`` call:

* facts: graphiti's hybrid edge search (BM25 + cosine, RRF), expired facts excluded;
* episodes: BM25 over the stored turns (graphiti's episode fulltext index).

The two rankings are fused per group by reciprocal rank (RRF). Why episodes too: with the
offline rules extractor most facts are one sentence each and many answers never become a fact;
bench/recall_quality.py measured LoCoMo evidence recall@10 at 31% from facts alone and 63% from
episode search on the same graph. Each item carries its provenance: episodes and their source
message ids (stored on the Episodic node by the extractor)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from bm25s.stopwords import STOPWORDS_EN_PLUS
from graphiti_core.driver.driver import GraphProvider
from graphiti_core.edges import EntityEdge
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.search.search import search
from graphiti_core.search.search_config import EpisodeReranker, EpisodeSearchConfig, EpisodeSearchMethod
from graphiti_core.search.search_config_recipes import EDGE_HYBRID_SEARCH_RRF
from graphiti_core.search.search_filters import ComparisonOperator, DateFilter, SearchFilters

from engram.compat import falkor_graph
from engram.graph.drivers import as_utc, query_rows
from engram.schemas import Provenance, RecallItem
from engram.services.extractor.pipeline import MESSAGE_IDS_PROPERTY
from engram.schemas.relations import canonical_relation
from engram.services.recall.entities import entity_fact_ranking
from engram.services.turn_detector.pairing import NAMED_SPEAKER
from engram.services.recall.fact_keywords import bm25_fact_ranking
from engram.services.recall.lexical import LexicalEpisodes, resolved
from engram.services.recall.time_window import OVERFETCH, TimeWindow
from engram.services.recall.turns import GraphTurns
from engram.services.recall.vector import fulltext_fact_search, hybrid_fact_search_scored

NOT_EXPIRED = SearchFilters(expired_at=[[DateFilter(comparison_operator=ComparisonOperator.is_null)]])
FACTS_AND_EPISODES = EDGE_HYBRID_SEARCH_RRF.model_copy(
    update={"episode_config": EpisodeSearchConfig(search_methods=[EpisodeSearchMethod.bm25], reranker=EpisodeReranker.rrf)}
)
RRF_K = 60
# one-word phrases that never name an entity ("what", "did", "she"): bm25s's longer English list
ENGLISH_STOPWORDS = frozenset(STOPWORDS_EN_PLUS)
EPISODE_CHARS = 1000  # default cut of a past turn in the prompt section (ENGRAM_RECALL_EPISODE_CHARS)


@dataclass
class _Turn:
    uuid: str
    content: str
    valid_at: Any
    created_at: Any


def shorten(text: str, limit: int = EPISODE_CHARS, speaker_names: bool = False) -> str:
    """A past turn as recall shows it: whitespace collapsed, cut to ``limit`` characters.
    ``speaker_names``: a speaker the turn names is labelled by the name alone ("Caroline: ",
    not "user (Caroline): "); an unnamed one keeps its role ("user: ")."""
    if speaker_names:
        text = NAMED_SPEAKER.sub(r"\1: ", text)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1].rstrip() + "…"


def fuse(facts: list[RecallItem], episodes: list[RecallItem], limit: int, episode_weight: float = 1.0,
         by_score: bool = False) -> list[RecallItem]:
    """The facts' and the turns' rankings (each best first) as one, ``limit`` items.

    ``by_score`` False: reciprocal-rank fusion of the two fused rankings (an item's place in its
    own list is all that counts). True: each item keeps its own RRF score (k = 60) over the
    rankings that found it -- facts' BM25, vector and entity rankings, turns' BM25 and vector --
    the turns' times ``episode_weight``: one fusion of all of them, so a fact both halves found
    outranks a turn only one found (what the flat facts+turns store of bench/recall_quality.py
    does with equal weights)."""
    if by_score:
        scored = [(item.score or 0.0, item) for item in facts]
        scored += [(episode_weight * (item.score or 0.0), item) for item in episodes]
    else:
        scored = [(1.0 / (RRF_K + i), item) for i, item in enumerate(facts)]
        scored += [(episode_weight / (RRF_K + i), item) for i, item in enumerate(episodes)]
    scored.sort(key=lambda pair: -pair[0])
    return [item.model_copy(update={"score": round(score, 6)}) for score, item in scored[:limit]]


async def provenance(driver: Any, group_id: str, episode_uuids: list[str]) -> dict[str, list[str]]:
    """episode uuid -> its source message ids (empty for episodes written before they were stored)."""
    if not episode_uuids:
        return {}
    rows = await query_rows(
        driver,
        f"MATCH (e:Episodic) WHERE e.uuid IN $uuids AND e.group_id = $group_id "
        f"RETURN e.uuid AS uuid, e.{MESSAGE_IDS_PROPERTY} AS ids",
        uuids=episode_uuids, group_id=group_id,
    )
    return {r["uuid"]: list(r["ids"] or []) for r in rows}


async def search_group(
    clients: GraphitiClients,
    group_id: str,
    scope: str | None,
    query: str,
    limit: int,
    *,
    query_vector: list[float] | Awaitable[list[float]] | None = None,
    lexical: LexicalEpisodes | GraphTurns | None = None,
    episode_weight: float = 1.0,
    ranks_episode_weight: float | None = None,
    episodes: bool = True,
    episode_chars: int = EPISODE_CHARS,
    dense_episodes: bool = False,
    followers: int = 0,
    with_facts: bool = True,
    entity_facts: int = 0,
    min_cosine: float | None = None,
    fact_lexical: LexicalEpisodes | None = None,
    fusion: str = "ranks",
    window: TimeWindow | None = None,
    fact_rrf_k: int = 1,
    speaker_names: bool = False,
    entity_weight: float = 1.0,
    fact_rescore: bool = False,
) -> list[RecallItem]:
    """The group's best ``limit`` current facts and past turns for ``query``, best first.
    ``query_vector`` may still be being computed (an awaitable, shared by the request's groups):
    the reads that need no vector (keyword halves, named entities) start before it is ready.

    Past turns come from ``lexical`` when given -- the graph's fulltext and turn vector indices
    (``GraphTurns``, services/recall/turns.py) or the BM25 index kept by the recall service
    (``LexicalEpisodes``), either fused with the turn vectors' cosine to ``query_vector`` when
    ``dense_episodes`` -- else from graphiti's episode search. ``with_facts`` False: past turns only, no fact search.
    ``entity_facts``: the current facts of the entities the question names, this many at most,
    fused as a third fact ranking (services/recall/entities.py); 0: none. ``min_cosine``: the
    relevance floor, a fact or turn found only by embedding counts at this cosine or above.
    ``fact_lexical``: BM25 over the current facts' text (services/recall/lexical.py, ``FACTS``)
    as the facts' keyword half instead of the graph's fulltext index (FalkorDB's TF-IDF).
    ``fusion``: ``ranks`` or ``scores`` (:func:`fuse`); ``scores`` needs the RRF scores of the
    vector index path and of ``lexical``'s hybrid ranking, and falls back to ``ranks`` when the
    facts came from graphiti's own search (its scores are on another scale), the turns then weighed
    by ``ranks_episode_weight`` (None: ``episode_weight``). ``window``: facts
    and turns of a time, ended or not, or of some relations (services/recall/time_window.py):
    facts from graphiti's search with its filters, turns filtered after the search. ``fact_rrf_k``:
    the rank constant of the facts' own fusion (their keyword, vector and entity rankings) with
    ``fusion`` ``ranks``: 1/(k + rank), rank from 0 (graphiti's 1; ``scores`` always uses 61).
    ``speaker_names``: :func:`shorten`'s. ``entity_weight``: the entity ranking's weight in the
    facts' fusion (their keyword and vector halves weigh 1). ``fact_rescore``: without
    ``fact_lexical``, the graph's fulltext candidates ranked by BM25 (services/recall/fact_keywords.py)
    instead of by the index's TF-IDF (FalkorDB only)."""
    # one scale for both rankings: the facts' RRF (vector index path) and the turns' (lexical hybrid)
    by_score = fusion == "scores" and query_vector is not None and lexical is not None and dense_episodes
    config = FACTS_AND_EPISODES if episodes and lexical is None else EDGE_HYBRID_SEARCH_RRF
    cfg = config.model_copy(update={"limit": limit})

    async def facts() -> tuple[list[EntityEdge], list[float | None], list[Any], bool]:
        """The facts, their scores, graphiti's episodes (its search only) and whether the scores
        are recall's RRF (k 60 with ``by_score``), the turns' scale."""
        # FalkorDB with the vector index (engram/graph/drivers.py): ~3/7 ms p50/p95 at 10k facts instead
        # of graphiti's brute-force cosine (~30/44 ms); graphiti's search when it cannot answer.
        if window is not None:
            # graphiti's search with the window's filters: recall's vector path knows current facts only
            results = await search(clients, query, [group_id], config.model_copy(update={"limit": OVERFETCH * limit}),
                                   window.search_filters(), query_vector=await resolved(query_vector))
            kept = [(e, s) for e, s in zip(results.edges, results.edge_reranker_scores or [None] * len(results.edges))
                    if window.keeps_fact(e.name, e.valid_at, e.invalid_at, e.expired_at)][:limit]
            return [e for e, _ in kept], [s for _, s in kept], results.episodes, False
        if query_vector is not None:
            async def keyword_ranking() -> list[str] | None:
                if not query.strip():
                    return None
                if fact_lexical is None:  # the graph's fulltext half, read while the question is embedded
                    if getattr(clients.driver, "provider", None) != GraphProvider.FALKORDB:
                        return None  # in hybrid_fact_search_scored
                    if fact_rescore:
                        return await bm25_fact_ranking(falkor_graph(clients.driver), group_id, query, 2 * limit)
                    return await fulltext_fact_search(clients.driver, group_id, query, 2 * limit)
                return [d.uuid for d, _ in await fact_lexical.search(clients.driver, group_id, query, 2 * limit)]

            async def named_ranking() -> list[tuple[str, float]]:
                if not entity_facts:
                    return []
                return await entity_fact_ranking(clients.driver, group_id, query, query_vector, entity_facts,
                                                 min_cosine, ENGLISH_STOPWORDS)

            # independent reads: the entity ranking and the facts' keyword half side by side
            named, keyword = await asyncio.gather(named_ranking(), keyword_ranking())
            scored = await hybrid_fact_search_scored(clients, group_id, query, await resolved(query_vector), limit,
                                                     extra=[[u for u, _ in named]] if named else (),
                                                     min_cosine=min_cosine, keyword=keyword,
                                                     rank_const=RRF_K + 1 if by_score else fact_rrf_k,
                                                     extra_weight=entity_weight)
            if scored is not None:
                return [e for e, _ in scored], [s for _, s in scored], [], True
        # graphiti's search: its scores (RRF with rank constant 1) are not the turns' scale
        results = await search(clients, query, [group_id], cfg, NOT_EXPIRED, query_vector=await resolved(query_vector))
        edges = results.edges[:limit]
        return edges, list(results.edge_reranker_scores or [None] * len(edges)), results.episodes[:limit], False

    if episodes and lexical is not None:
        turn_search = lexical.search(clients.driver, group_id, query,
                                     OVERFETCH * limit if window is not None and window.as_of else limit,
                                     vector=query_vector if dense_episodes else None, followers=followers,
                                     min_cosine=min_cosine)
        if with_facts:
            (edges, scores, _, same_scale), hits = await asyncio.gather(facts(), turn_search)
            by_score = by_score and same_scale
        else:
            edges, scores, hits = [], [], await turn_search
        turns_found = [_Turn(d.uuid, d.content, d.valid_at, d.created_at) for d, _ in hits]
        turn_scores = {d.uuid: score for d, score in reversed(hits)}  # a follower repeated: its first score
    else:
        edges, scores, graph_episodes, same_scale = await facts()
        by_score = by_score and same_scale
        if not with_facts:
            edges, scores = [], []
        turns_found = [_Turn(ep.uuid, ep.content, ep.valid_at, ep.created_at) for ep in graph_episodes] if episodes else []
        turn_scores = {}
    sources = await provenance(
        clients.driver, group_id, sorted({u for e in edges for u in e.episodes} | {ep.uuid for ep in turns_found})
    )
    turns_found = [ep for ep in turns_found if ep.uuid in sources]  # deleted since it was indexed
    if window is not None:
        turns_found = [ep for ep in turns_found if window.keeps_turn(ep.valid_at)][:limit]
    fact_items = [
        RecallItem(
            uuid=edge.uuid,
            fact=edge.fact,
            name=canonical_relation(edge.name),
            scope=scope,  # type: ignore[arg-type]
            group_id=group_id,
            valid_at=as_utc(edge.valid_at),
            invalid_at=as_utc(edge.invalid_at),
            created_at=as_utc(edge.created_at),
            expired_at=as_utc(edge.expired_at),
            score=score,
            provenance=[Provenance(episode_id=u, message_ids=sources.get(u, [])) for u in edge.episodes],
        )
        for edge, score in zip(edges, scores)
    ]
    turns = [
        RecallItem(
            uuid=ep.uuid,
            fact=shorten(ep.content, episode_chars, speaker_names),
            kind="episode",
            scope=scope,  # type: ignore[arg-type]
            group_id=group_id,
            valid_at=as_utc(ep.valid_at),
            created_at=as_utc(ep.created_at),
            provenance=[Provenance(episode_id=ep.uuid, message_ids=sources.get(ep.uuid, []))],
            score=turn_scores.get(ep.uuid),
        )
        for ep in turns_found
    ]
    weight = episode_weight if by_score or ranks_episode_weight is None else ranks_episode_weight
    return fuse(fact_items, turns, limit, weight, by_score=by_score)
