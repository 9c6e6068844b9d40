"""Extraction pipeline: one Episode -> entities, facts and invalidations in its group's graph.

graphiti's ``add_episode`` cannot be used as is (see shared/PLATFORM-NOTES.md): it cannot
create an episode under a uuid we choose, and it always runs ``extract_attributes_from_nodes``
(inline summaries, which belong to engram's separate summary service). So this module composes
graphiti-core 0.31's stage functions itself, as plain async functions over pydantic models:

1. idempotency: ``EpisodicNode.get_by_uuid(Episode.episode_id)``; a stored episode returns
   ``already_present=True`` with no LLM call (:func:`deltas_for_existing_episode` rebuilds
   its NodeDeltas from the stored graph so the caller can re-publish them);
2. previous episodes: ``retrieve_episodes`` (``previous_window`` before reference_time);
3. extraction, ONE pass by default (``mode="combined"``): ``extract_nodes_and_edges``
   (graphiti's combined node+edge stage, the one ``add_episode_bulk`` uses, with engram's own
   shorter prompt and answer schema: :mod:`engram.services.extractor.extraction_prompt`). Why combined:
   the product goal is a single extraction LLM pass per turn, and this prompt is that pass --
   one large prompt instead of ``extract_nodes`` + ``extract_edges`` (which each repeat ~1.9k
   tokens of fixed instructions and the previous-episodes block), the custom instructions are
   applied to entities and facts together, and every entity it returns has at least one fact
   (orphans are dropped upstream). Its cost: a *small* call that dates the facts in a batch
   (``extract_timestamps_batch``, one per 20 facts), where the separate edge prompt dates facts
   inline -- made only for facts with a date engram cannot resolve itself
   (:mod:`engram.services.extractor.local_answers`, which also skips edge dedupe calls with no close
   candidate). The prompt also carries the turn's reference time and the group's facts in force
   nearest the turn (:func:`known_facts_for`: the graph's fulltext index over the turn's words,
   free slots filled over the previous turns' words, ``known_facts`` of them), and the answer
   gives each fact's dates and the known facts it restates or replaces, and it names a known
   entity (a known fact's, or a stored one the turn's words name: :func:`known_entity_names`) by
   its stored name: graphiti's timestamp, edge dedupe and node dedupe questions
   about them are answered from it, so a turn is one model call (the edge dedupe questions left
   are asked together: services/extractor/dedupe_batch.py). A fact the model copied from a
   speaker's line ("I enjoy reading.") is put in the third person before anything reads the answer
   (:mod:`engram.services.extractor.first_person`). ``mode="separate"`` runs
   add_episode's two-prompt path (``extract_nodes`` -> ``resolve_extracted_nodes`` -> ``extract_edges`` -> merge of
   materialised endpoints) for comparison or for LLMs that handle the big prompt badly;
   ``custom_instructions`` go to both prompts there;
4. unsafe entity names ("It", "Is", "Will", punctuation) are dropped -- with the edges that
   use them as endpoints -- BEFORE anything queries the database: FalkorDB 4.16 segfaults on
   graphiti's exact-name lookup when a name equals a stopword of graphiti's fulltext index;
5. ``resolve_extracted_nodes`` (dedupe), ``resolve_edge_pointers``, ``resolve_extracted_edges``
   (dedupe + contradiction -> invalidated edges, with graphiti's ``invalidated_by`` mapping;
   a contradicted fact in force when the episode was told is ended even when the new fact is
   dated earlier: :mod:`engram.services.extractor.told_later`);
   then an invalidation whose invalidating fact restates the invalidated one (same episode,
   same text or words, or embeddings at least ``restatement_similarity`` apart from a replaced
   value) is rejected and the edge restored before the save -- a fact must not invalidate
   itself (:mod:`engram.services.extractor.restatement`; ``engram_extractor_invalidations_total``);
6. NO ``extract_attributes_from_nodes``: no summaries, no attribute extraction;
7. embeddings: ``create_entity_node_embeddings`` for new nodes (edges are embedded by
   resolve_extracted_edges; any edge still without a vector is embedded here), and the turn's
   own text (``engram_embedding`` on the Episodic node: recall's dense search over past turns).
   The embedder is a :class:`~engram.models.embedding_cache.BatchingEmbedder` (the service's,
   shared by its episodes, or one per episode): right after extraction the turn's text, its
   entity names and its facts are embedded in ONE call (:func:`prefetch_embeddings`), so
   graphiti's dedupe searches, its edge resolution and this step find them ready -- one embedder
   call per turn instead of five (``separate`` and ``chunked`` modes: two, the facts come after
   node resolution; a fact graphiti re-embeds that this process has not seen, e.g. one it
   invalidates after a restart: one more);
8. save with ``build_episodic_edges`` + ``add_nodes_and_edges_bulk`` in two steps -- new
   entity nodes and all touched entity edges first, then the EpisodicNode and its MENTIONS
   edges -- so the episode node, the idempotency marker, is written only after its facts;
   then its source message ids, turn embedding and extraction cost (LLM calls, tokens, stage
   times: ``engram.schemas.messages.ExtractionCost``) as properties of the Episodic node, in one write.

Partial / known gaps:

* no custom entity or edge types (graphiti's default ``Entity`` / free relation names), no
  sagas, no communities;
* large, entity-dense episodes (seed 002, :mod:`engram.services.extractor.chunking`) and every episode
  above ``max_unchunked_tokens`` take a third path, ``chunked``: entities are extracted per
  chunk concurrently (``extract_nodes``, the chunk as content, the full previous-episodes
  context) and merged case-insensitively. Up to ``max_unchunked_tokens`` they are then resolved
  once and facts come from ``extract_edges`` over covering groups of at most
  ``max_nodes_per_chunk`` resolved entities, each call seeing the FULL episode, and a group
  keeps only the facts between pairs it owns, so every pair is examined exactly once. Above it
  (a long pasted message) resolution and fact extraction work per chunk, so no call reads more
  than one chunk; the bound on calls and prompt size is in :func:`_extract_chunked`. Facts
  naming an entity outside the group (graphiti would materialise it) are dropped there: that
  entity was not found by node extraction, and keeping them would examine pairs twice;
* previous episodes go into the prompts as graphiti's context, each cut to its last
  :data:`PREVIOUS_EPISODE_CHARS` characters: a long message is not read whole again by the next
  ``previous_window`` turns' prompts;
* FalkorDB runs no multi-query transactions: a crash between the two save steps, or between
  the episode node and its MENTIONS edges, is possible. A crash before the episode node is
  written means a redelivery extracts again (and dedupes against the facts already written,
  so deltas may then show fewer new facts/nodes); a crash after it leaves an episode with
  missing MENTIONS edges, which :func:`deltas_for_existing_episode` covers by also taking the
  endpoints of the episode's facts;
* existing entity nodes are never re-written (so a concurrently written summary is not
  clobbered); label promotion of existing nodes, which only custom entity types can cause,
  is therefore not persisted;
* unsafe names are dropped, not renamed: a person called just "Will" is lost (the name
  crashes FalkorDB 4.16); "Will Smith" is kept;
* ``llm_calls`` counts calls made through ``clients.llm_client``; with a graphiti
  ``llm_runtime`` configured the calls bypass it and are not counted;
* the driver must be a FalkorDriver for the episode's group (``database=group_id``) or a Neo4j
  driver (one database shared by every group, separated by ``group_id``) -- it is checked; Kuzu
  and Neptune are refused. The Neo4j path is covered by a testcontainers test that skips where no
  Docker engine is reachable (so it has not run on the machines this was built on).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterable, Sequence
from datetime import datetime, timezone
from time import perf_counter
from typing import Any, Literal, NamedTuple, get_args

from graphiti_core.driver.driver import GraphProvider
from graphiti_core.driver.falkordb import STOPWORDS as FALKOR_FULLTEXT_STOPWORDS
from graphiti_core.edges import EntityEdge, EpisodicEdge, create_entity_edge_embeddings, get_entity_edge_from_record
from graphiti_core.errors import NodeNotFoundError
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.helpers import semaphore_gather
from graphiti_core.models.edges.edge_db_queries import get_entity_edge_return_query
from graphiti_core.nodes import EntityNode, EpisodeType, EpisodicNode, create_entity_node_embeddings
from graphiti_core.search.search_filters import ComparisonOperator, DateFilter, SearchFilters
from graphiti_core.search.search_utils import edge_fulltext_search, get_mentioned_nodes, node_fulltext_search
from graphiti_core.utils.bulk_utils import add_nodes_and_edges_bulk, resolve_edge_pointers
from graphiti_core.utils.datetime_utils import ensure_utc, utc_now
from graphiti_core.utils.maintenance.combined_extraction import extract_nodes_and_edges
from graphiti_core.utils.maintenance.edge_operations import (
    build_episodic_edges,
    extract_edges,
    resolve_extracted_edges,
)
from graphiti_core.utils.maintenance.graph_data_operations import retrieve_episodes
from graphiti_core.utils.maintenance.node_operations import (
    extract_attributes_only_from_nodes,
    extract_nodes,
    resolve_extracted_nodes,
)
from pydantic import BaseModel, ConfigDict, Field

from engram.compat import driver_database, normalize_name_exact
from engram.models.accounting import AccountingLLMClient
from engram.models.embedding_cache import BatchingEmbedder
from engram.models.factory import embedder_kind
from engram.graph.ontology import Ontology
from engram.text.tokens import CountTokens, token_counter
from engram.schemas import Episode, NodeDelta, TripletFact
from engram.schemas.messages import ExtractionCost, Role
from engram.schemas.relations import canonical_relation
from engram.services.extractor.chunking import (
    ChunkingSettings,
    assign_pairs,
    chunk_json,
    chunk_labelled,
    chunk_messages,
    chunk_text,
    should_chunk,
)
from engram.services.extractor.deltas import build_node_deltas
from engram.services.extractor.extraction_prompt import KNOWN_FACTS, TurnContext, engram_clients
from engram.services.extractor.first_person import ThirdPersonLLMClient
from engram.services.extractor.local_answers import (DEDUPE_COSINE, DEDUPE_SIMILARITY, NAME_SIMILARITY,
                                                     LocalAnswersLLMClient, statement_key)
from engram.services.extractor.restatement import INVALIDATIONS, Rejection, restore_edges, review_invalidations
from engram.services.extractor.told_later import telling

log = logging.getLogger("engram.extractor")
DEFAULT_ONTOLOGY = Ontology()
"""graphiti's ``Entity`` only: engram's own lean prompt (services/extractor/extraction_prompt.py)."""

ExtractionMode = Literal["combined", "separate", "chunked", "triplet"]
DEFAULT_EDGE_TYPE_MAP: dict[tuple[str, str], list[str]] = {("Entity", "Entity"): []}

# Names made only of these words are not entities. The explicit list of the brief, graphiti's
# FalkorDB fulltext stopwords (an entity named exactly one of them -- "Is", "No", "Will" --
# segfaults FalkorDB 4.16 in graphiti's exact-name lookup), and the remaining pronouns.
UNSAFE_NAME_WORDS: frozenset[str] = frozenset(
    {
        "is", "it", "this", "that", "the", "a", "an", "i", "we", "you", "he", "she", "they",
        "me", "my", "our", "and", "or", "of", "to", "in", "on", "at",
        "him", "her", "us", "them", "its", "it's", "his", "hers", "their", "theirs", "your",
        "yours", "mine", "ours", "myself", "yourself", "himself", "herself", "itself",
        "ourselves", "themselves", "these", "those", "here", "there",
    }
    | {w.lower() for w in FALKOR_FULLTEXT_STOPWORDS}
)
_NAME_TOKEN = re.compile(r"[\w']+", re.UNICODE)


def safe_entity_name(name: str | None) -> bool:
    """False for names that are empty, only punctuation (underscores included: "\\_\\_" is a
    markdown blank, not a name), or only stopwords/pronouns.

    Case-insensitive; curly apostrophes count as straight ones ("It’s" is unsafe).
    """
    if not name or not name.strip():
        return False
    tokens = _NAME_TOKEN.findall(name.replace("\u2019", "'").casefold())
    tokens = [t.strip("'_") for t in tokens if t.strip("'_")]
    if not tokens:
        return False
    return not all(t in UNSAFE_NAME_WORDS for t in tokens)


def drop_unsafe_entities(nodes: list[EntityNode]) -> list[EntityNode]:
    """``nodes`` without unsafe names (see :func:`safe_entity_name`); logs a count, never a name."""
    kept = [n for n in nodes if safe_entity_name(n.name)]
    if len(kept) != len(nodes):
        log.warning("dropped %d extracted entities with unsafe names", len(nodes) - len(kept))
    return kept


def _without_endpoints(edges: list[EntityEdge], node_uuids: set[str]) -> list[EntityEdge]:
    return [e for e in edges if e.source_node_uuid not in node_uuids and e.target_node_uuid not in node_uuids]


class ExtractionResult(BaseModel):
    """What one :func:`extract_episode` call did to the group's graph."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    episode_id: str
    group_id: str
    already_present: bool = False
    mode: ExtractionMode | None = None
    episode: EpisodicNode | None = None
    nodes: list[EntityNode] = Field(default_factory=list, description="Entities the episode mentions (resolved).")
    context_nodes: list[EntityNode] = Field(
        default_factory=list, description="Endpoints of invalidated facts that the episode does not mention."
    )
    new_node_uuids: list[str] = Field(default_factory=list, description="Entities created by this episode.")
    resolved_edges: list[EntityEdge] = Field(
        default_factory=list, description="All facts of the episode, incl. re-used duplicates."
    )
    new_edges: list[EntityEdge] = Field(default_factory=list, description="Facts new to the graph.")
    invalidated_edges: list[EntityEdge] = Field(default_factory=list)
    invalidated_by: dict[str, list[str]] = Field(
        default_factory=dict, description="invalidated edge uuid -> uuids of the episode's edges that invalidated it."
    )
    rejected_invalidations: list[Rejection] = Field(
        default_factory=list,
        description="Invalidations not applied because the invalidating fact restates the invalidated one.",
    )
    episodic_edges: list[EpisodicEdge] = Field(default_factory=list)
    dropped_entities: int = 0
    dropped_edges: int = 0
    previous_episodes: int = 0
    chunks: int = Field(1, description="Entity-extraction chunks (1: the episode was not chunked).")
    edge_groups: int = Field(0, description="Covering groups used for edge extraction (chunked mode only).")
    llm_calls: dict[str, int] = Field(default_factory=dict, description="LLM calls by graphiti prompt name.")
    llm_tokens: dict[str, dict[str, int]] = Field(
        default_factory=dict, description="cl100k tokens by prompt name: {'input': n, 'output': n}."
    )
    timings: dict[str, float] = Field(default_factory=dict, description="Milliseconds per stage.")

    @property
    def llm_call_count(self) -> int:
        return sum(self.llm_calls.values())


class _Extracted(NamedTuple):
    nodes: list[EntityNode]  # resolved, unique by uuid
    edges: list[EntityEdge]  # endpoints already pointing at resolved nodes
    generated_uuids: set[str]  # uuids minted by this run's extraction
    dropped_entities: int
    dropped_edges: int


def _ms(start: float) -> float:
    return round((perf_counter() - start) * 1000, 3)


def _unique_nodes(nodes: Iterable[EntityNode]) -> list[EntityNode]:
    seen: dict[str, EntityNode] = {}
    for node in nodes:
        seen.setdefault(node.uuid, node)
    return list(seen.values())


def _unique_edges(edges: Iterable[EntityEdge]) -> list[EntityEdge]:
    seen: dict[str, EntityEdge] = {}
    for edge in edges:
        seen.setdefault(edge.uuid, edge)
    return list(seen.values())


def check_driver_for_group(clients: GraphitiClients, group_id: str) -> None:
    """The driver may serve ``group_id``'s episodes.

    FalkorDB keeps one graph per group: the driver must target ``database=group_id``. Neo4j
    (Community: one database) keeps every group in one shared database, separated by graphiti's
    ``group_id`` property, so any database passes. Other backends (Kuzu, Neptune) are refused:
    untested here, and Kuzu is broken for group_id.
    """
    driver = clients.driver
    if driver.provider == GraphProvider.FALKORDB:
        database = driver_database(driver)
        if database != group_id:
            raise ValueError(f"FalkorDriver targets graph {database!r}, episode belongs to group {group_id!r}")
    elif driver.provider != GraphProvider.NEO4J:
        raise ValueError(f"unsupported graph backend {driver.provider!r}: use FalkorDB or Neo4j")


async def find_episode(clients: GraphitiClients, episode_id: str, group_id: str | None = None) -> EpisodicNode | None:
    """The stored EpisodicNode with uuid ``episode_id`` (in ``group_id`` when given), or None.

    The group check matters on Neo4j, where all groups share one database: an episode id reused
    by another group (only possible for hand-made ids) must not count as already extracted."""
    try:
        node = await EpisodicNode.get_by_uuid(clients.driver, episode_id)
    except NodeNotFoundError:
        return None
    return node if group_id is None or node.group_id == group_id else None


MESSAGE_IDS_PROPERTY = "engram_message_ids"


EMBEDDING_PROPERTY = "engram_embedding"

# What extracting the episode cost (engram.schemas.messages.ExtractionCost), on its Episodic node: plain
# properties like the two above (graphiti reads Episodic nodes field by field and ignores them);
# the stage times as a JSON object in a string, since neither FalkorDB nor Neo4j stores a map.
LLM_CALLS_PROPERTY = "engram_llm_calls"
INPUT_TOKENS_PROPERTY = "engram_input_tokens"
OUTPUT_TOKENS_PROPERTY = "engram_output_tokens"
STAGE_MS_PROPERTY = "engram_stage_ms"


async def embed_episode(embedder: Any, episode: Episode) -> list[float] | None:
    """The embedding of the turn's text, as stored text (an e5 model's ``passage:`` side), for
    recall's dense half over past turns. None when the embedder fails: the turn is still stored
    and found by BM25; a redelivery or a later re-extraction writes the vector."""
    try:
        vector = await embedder.create([episode.content])
    except Exception as exc:  # noqa: BLE001 - a missing vector must not lose the turn
        log.warning("episode embedding failed (%s); the turn is stored without one", type(exc).__name__)
        return None
    return [float(x) for x in vector] if vector else None


def extraction_cost(llm_calls: dict[str, int], llm_tokens: dict[str, dict[str, int]],
                    timings: dict[str, float]) -> ExtractionCost:
    """The cost of one extraction run: calls and tokens summed over prompts, stage times without
    their ``_ms`` suffix (the ``stage`` label of ``engram_extractor_stage_seconds``)."""
    return ExtractionCost(
        llm_calls=sum(llm_calls.values()),
        input_tokens=sum(t.get("input", 0) for t in llm_tokens.values()),
        output_tokens=sum(t.get("output", 0) for t in llm_tokens.values()),
        stage_ms={name.removesuffix("_ms"): round(ms, 1) for name, ms in timings.items()},
    )


def stored_extraction_cost(llm_calls: Any, input_tokens: Any, output_tokens: Any, stage_ms: Any) -> ExtractionCost | None:
    """The ExtractionCost read back from an Episodic node's properties; None when none was
    recorded. What does not parse is left out (stage times that are not a JSON object of numbers:
    no stage times; counts that are not numbers: no cost): a cost is informational, never a
    failed read."""
    if llm_calls is None:
        return None
    try:
        stages = json.loads(stage_ms) if isinstance(stage_ms, str) else {}
        stage_times = {str(k): float(v) for k, v in stages.items()} if isinstance(stages, dict) else {}
    except (TypeError, ValueError):
        stage_times = {}
    try:
        return ExtractionCost(llm_calls=int(llm_calls), input_tokens=int(input_tokens or 0),
                              output_tokens=int(output_tokens or 0), stage_ms=stage_times)
    except (TypeError, ValueError):  # pydantic's ValidationError is a ValueError
        return None


async def record_episode_properties(driver: Any, episode: Episode, vector: list[float] | None = None,
                                    cost: ExtractionCost | None = None) -> None:
    """Store the episode's source message ids (recall's provenance), when given the turn's
    embedding (recall's dense search over past turns) and what extracting it cost, on its
    Episodic node, in one query.

    graphiti's EpisodicNode has none of these fields, so plain properties (FalkorDB: a vecf32,
    4 bytes a dimension); idempotent. Without ``cost`` the recorded cost is left as it is: a
    redelivery of a stored episode costs nothing and must not overwrite the first run's cost."""
    extra = ""
    if vector:
        is_falkor = getattr(driver, "provider", None) == GraphProvider.FALKORDB
        extra += f", e.{EMBEDDING_PROPERTY} = " + ("vecf32($vector)" if is_falkor else "$vector")
    if cost is not None:
        extra += (f", e.{LLM_CALLS_PROPERTY} = $llm_calls, e.{INPUT_TOKENS_PROPERTY} = $input_tokens, "
                  f"e.{OUTPUT_TOKENS_PROPERTY} = $output_tokens, e.{STAGE_MS_PROPERTY} = $stage_ms")
    await driver.execute_query(
        f"MATCH (e:Episodic {{uuid: $uuid}}) WHERE e.group_id = $group_id SET e.{MESSAGE_IDS_PROPERTY} = $ids"
        + extra,
        uuid=episode.episode_id, group_id=episode.group_id, ids=[m.message_id for m in episode.messages],
        vector=vector,
        llm_calls=cost.llm_calls if cost else None, input_tokens=cost.input_tokens if cost else None,
        output_tokens=cost.output_tokens if cost else None,
        stage_ms=json.dumps(cost.stage_ms, separators=(",", ":")) if cost else None,
    )


GROUP_LABEL = "EngramGroup"
"""One node per group graph naming the group: its scope and the key its id hashes (the explorer's
group list; recall's ``engram.graph.groups`` with names)."""


async def record_group_name(driver: Any, episode: Episode) -> None:
    """Name ``episode``'s group in its own graph (idempotent MERGE; the key stays inside the group's
    data, never in a graph name, subject or metric, which carry the hash)."""
    if not episode.scope_key:
        return
    await driver.execute_query(
        f"MERGE (g:{GROUP_LABEL} {{group_id: $group_id}}) SET g.scope = $scope, g.key = $key, g.uuid = $group_id",
        group_id=episode.group_id, scope=episode.scope, key=episode.scope_key,
    )


def build_episodic_node(episode: Episode, now: datetime) -> EpisodicNode:
    """The EpisodicNode of ``episode``: uuid = episode_id, valid_at = reference_time in UTC.

    FalkorDB stores datetimes as ISO strings that graphiti compares as strings
    (``retrieve_episodes``: ``e.valid_at <= $reference_time``); graphiti's FalkorDriver already
    converts to UTC when it writes, and normalising here keeps the node we return (and the
    previous-episodes query) in UTC whatever the driver does.
    """
    return EpisodicNode(
        uuid=episode.episode_id,
        name=episode.turn_id,
        group_id=episode.group_id,
        labels=[],
        source=EpisodeType.message,
        content=episode.content,
        source_description=episode.source_description or f"engram {episode.kind} ({episode.scope} scope)",
        created_at=now,
        valid_at=episode.reference_time.astimezone(timezone.utc),
    )


PREVIOUS_EPISODE_CHARS = 4000
"""How much of each previous episode goes into an extraction prompt, as context (its end: what
the new turn follows on from). A turn of ordinary length is whole; a long pasted message, which
its own episode extracts in chunks, would otherwise be sent whole again by the next turns."""


def _tail(text: str, limit: int = PREVIOUS_EPISODE_CHARS) -> str:
    return text if len(text) <= limit else "…" + text[len(text) - limit + 1:]


async def previous_episodes_for(clients: GraphitiClients, episode: Episode, window: int) -> list[EpisodicNode]:
    """Up to ``window`` stored message episodes at or before the episode's reference time, each cut
    to its last :data:`PREVIOUS_EPISODE_CHARS` characters (context for the prompt, never written)."""
    if window <= 0:
        return []
    found = await retrieve_episodes(
        clients.driver,
        episode.reference_time.astimezone(timezone.utc),
        last_n=window,
        group_ids=[episode.group_id],
        source=EpisodeType.message,
    )
    return [ep if len(ep.content) <= PREVIOUS_EPISODE_CHARS else ep.model_copy(update={"content": _tail(ep.content)})
            for ep in found]


#: graphiti's FalkorDB fulltext query is refused above 128 terms (words and their ``|``): the
#: turn's distinct words beyond this are dropped, names and longer words kept first.
KNOWN_FACT_QUERY_WORDS = 60
_QUERY_WORD = re.compile(r"[^\W\d_][\w'’-]*", re.UNICODE)
_TURN_ROLES = frozenset(get_args(Role))  # the turn text's role labels, not its content
_IN_FORCE = SearchFilters(expired_at=[[DateFilter(comparison_operator=ComparisonOperator.is_null)]])


def known_fact_query(text: str) -> str:
    """The turn's distinct words for the known-facts lookup (an OR query): capitalised words
    (names) and longer words first, at most :data:`KNOWN_FACT_QUERY_WORDS`."""
    words: dict[str, str] = {}
    for w in _QUERY_WORD.findall(text):
        key = w.casefold()
        if len(key) > 2 and key not in FALKOR_FULLTEXT_STOPWORDS and key not in _TURN_ROLES and key not in words:
            words[key] = w
    ranked = sorted(words.values(), key=lambda w: (not w[:1].isupper(), -len(w)))
    return " ".join(ranked[:KNOWN_FACT_QUERY_WORDS])


async def known_facts_for(clients: GraphitiClients, episode: Episode, limit: int,
                          previous: Sequence[EpisodicNode] = ()) -> list[EntityEdge]:
    """The group's facts in force that share the most words with the turn (the graph's fulltext
    index, best first, at most ``limit`` distinct texts): shown to the extraction call, which says
    which of them each new fact restates or replaces (services/extractor/extraction_prompt.py), so
    graphiti's dedupe questions about them need no call (services/extractor/local_answers.py).
    Slots the turn's words leave free are filled with the facts sharing the most words with the
    ``previous`` episodes (the prompt's PREVIOUS MESSAGES, which a model restates too): in a Qwen
    1.5B run every turn that made a dedupe call had shown 4-8 known facts, and the close candidates
    asked about had come from earlier turns (docs/architecture.md); the block never grows past
    ``limit``, so neither does the prompt.
    No embedding: the turn's one embedder call comes after extraction, with its names and facts."""
    if limit <= 0:
        return []
    # one statement once (a copy with another closing full stop too: statement_key, as the answers
    # are read): the model's answer names a known fact by its position, and a repeat takes a slot
    first: dict[str, EntityEdge] = {}
    for text in (episode.content, "\n".join(p.content for p in previous)):
        if len(first) >= limit:
            break
        query = known_fact_query(text)
        if not query:
            continue
        hits = await edge_fulltext_search(clients.driver, query, _IN_FORCE, group_ids=[episode.group_id],
                                          limit=2 * limit)
        for edge in hits:
            first.setdefault(statement_key(edge.fact), edge)
    return list(first.values())[:limit]


# the graph's own state, not graphiti's search: its invalidation candidates include ended facts
Q_FACTS_IN_FORCE = (
    "MATCH (:Entity)-[e:RELATES_TO]->(:Entity) WHERE e.group_id = $group_id AND e.fact IN $facts "
    "AND e.expired_at IS NULL AND e.invalid_at IS NULL RETURN DISTINCT e.fact AS fact"
)


async def facts_in_force(clients: GraphitiClients, group_id: str, facts: list[str]) -> set[str]:
    """Which of ``facts`` (texts as stored) a fact of the group still in force holds: neither
    superseded (expired) nor dated to an end. services/extractor/local_answers.py asks it about
    a new fact's twins."""
    if not facts:
        return set()
    records, _, _ = await clients.driver.execute_query(Q_FACTS_IN_FORCE, group_id=group_id, facts=facts)
    return {r["fact"] for r in records}


Q_ENTITY_NAMES = "UNWIND $uuids AS u MATCH (n:Entity {uuid: u}) WHERE n.group_id = $group_id RETURN n.uuid AS uuid, n.name AS name"


#: Entities named like the turn's words added to KNOWN ENTITIES beside the known facts' own: in
#: the eleventh session's Qwen 1.5B runs the node dedupe questions left for the model were all
#: about a stored entity the turn names ("dogs", "LGBT support group", "bird") that no known fact
#: touched, so the model had not seen it. A name costs a few prompt tokens.
KNOWN_NAMES_BY_WORDS = 6


async def known_entity_names(clients: GraphitiClients, group_id: str, facts: list[EntityEdge],
                             turn: str = "", by_words: int = KNOWN_NAMES_BY_WORDS) -> list[str]:
    """The names of ``facts``' entities as the graph holds them, in the facts' order, then at most
    ``by_words`` more entities sharing the most words with ``turn`` (the graph's fulltext index
    over names), each once: shown with the known facts, so the model names an existing entity
    exactly as it is stored, and a different name it writes is its answer "not that one"
    (services/extractor/local_answers.py)."""
    uuids = list(dict.fromkeys(u for e in facts for u in (e.source_node_uuid, e.target_node_uuid)))
    names: list[str] = []
    if uuids:
        records, _, _ = await clients.driver.execute_query(Q_ENTITY_NAMES, uuids=uuids, group_id=group_id)
        by_uuid = {r["uuid"]: r["name"] for r in records}
        names = list(dict.fromkeys(by_uuid[u] for u in uuids if by_uuid.get(u)))
    query = known_fact_query(turn) if by_words > 0 else ""
    if query:
        shown = set(names)
        hits = await node_fulltext_search(clients.driver, query, SearchFilters(), group_ids=[group_id],
                                          limit=by_words + len(shown))
        names += [n for n in dict.fromkeys(h.name for h in hits) if n and n not in shown][:by_words]
    return names


async def prefetch_embeddings(clients: GraphitiClients, episode_node: EpisodicNode, nodes: Iterable[EntityNode],
                              edges: Iterable[EntityEdge] = ()) -> None:
    """Embed, in one call, everything graphiti and this module will ask the embedder for next:
    the turn's text (recall's dense half), the entities' names (as graphiti's dedupe search and
    its node embeddings write them) and the facts. A no-op unless ``clients.embedder`` is a
    :class:`~engram.models.embedding_cache.BatchingEmbedder` (extract_episode makes it one)."""
    embedder = clients.embedder
    if not isinstance(embedder, BatchingEmbedder):
        return
    names = [text for node in nodes for text in (node.name, node.name.replace("\n", " "))]
    await embedder.prefetch([episode_node.content, *names, *(edge.fact for edge in edges)])


async def _extract_combined(
    clients: GraphitiClients,
    episode_node: EpisodicNode,
    previous: list[EpisodicNode],
    instructions: str,
    timings: dict[str, float],
    ontology: Ontology = DEFAULT_ONTOLOGY,
    known: list[EntityEdge] | None = None,
    known_names: list[str] | None = None,
) -> _Extracted:
    start = perf_counter()
    # engram's own combined prompt and lean answer schema (services/extractor/extraction_prompt.py),
    # with the turn's time and the known facts it may restate or change: the facts' dates and
    # their relations to the graph come in this one call; graphiti's own prompt, which lists the
    # types, with a custom ontology
    turn = TurnContext(reference_time=episode_node.valid_at, known_facts=tuple(e.fact for e in known or ()),
                       known_entities=tuple(known_names or ()))
    nodes, edges, _ = await extract_nodes_and_edges(
        engram_clients(clients, turn), episode_node, previous, custom_extraction_instructions=instructions or None,
        entity_types=ontology.graphiti_entity_types(),
        excluded_entity_types=ontology.graphiti_excluded(),
        edge_type_map=ontology.graphiti_edge_type_map(DEFAULT_EDGE_TYPE_MAP) if ontology.edge_types else None,
        edge_types=ontology.graphiti_edge_types(),
    )
    timings["extract_ms"] = _ms(start)

    kept = drop_unsafe_entities(nodes)
    unsafe = {n.uuid for n in nodes} - {n.uuid for n in kept}
    kept_edges = _without_endpoints(edges, unsafe)
    # The combined prompt keeps only entities with a fact; keep that true after the guard.
    connected = {u for e in kept_edges for u in (e.source_node_uuid, e.target_node_uuid)}
    orphans = [n for n in kept if n.uuid not in connected]
    kept = [n for n in kept if n.uuid in connected]
    if orphans:
        log.info("dropped %d entities left without facts by the unsafe-name guard", len(orphans))

    # The combined path already dated every fact in one batched call. A fact it left undated
    # would be asked again, one call per fact, while resolving edges; it holds from the time it
    # was said, so date it with the episode's reference time instead (measured: ~1.4 calls and
    # ~900 tokens per turn saved on LoCoMo, bench/extraction_cost.py).
    for edge in kept_edges:
        if edge.valid_at is None and edge.invalid_at is None:
            edge.valid_at = episode_node.valid_at

    start = perf_counter()
    await prefetch_embeddings(clients, episode_node, kept, kept_edges)  # the turn's one embedding call
    timings["embed_ms"] = _ms(start)

    start = perf_counter()
    resolved, uuid_map, _ = await resolve_extracted_nodes(clients, kept, episode_node, previous)
    timings["resolve_nodes_ms"] = _ms(start)
    return _Extracted(
        nodes=_unique_nodes(resolved),
        edges=resolve_edge_pointers(kept_edges, uuid_map),
        generated_uuids={n.uuid for n in kept},
        dropped_entities=len(unsafe) + len(orphans),
        dropped_edges=len(edges) - len(kept_edges),
    )


class TripletRejected(ValueError):
    """A triplet whose entity name engram cannot store (empty, punctuation, only stopwords)."""


async def _triplet(clients: GraphitiClients, episode_node: EpisodicNode, triplet: TripletFact,
                   timings: dict[str, float]) -> _Extracted:
    """A fact given whole (Graphiti's ``add_triplet``) in place of the extraction pass: its two
    entities resolved against the group's as extracted ones are (same names merge), the fact
    pointing at them; the caller resolves it like an extracted fact (dedupe, invalidation)."""
    if not (safe_entity_name(triplet.source) and safe_entity_name(triplet.target)):
        raise TripletRejected("an entity name is empty, punctuation or only stopwords/pronouns")
    now = episode_node.created_at
    source, target = (EntityNode(name=name, group_id=episode_node.group_id, labels=["Entity"], created_at=now)
                      for name in (triplet.source, triplet.target))
    edge = EntityEdge(
        source_node_uuid=source.uuid, target_node_uuid=target.uuid, name=canonical_relation(triplet.relation.strip())
        or triplet.relation, fact=triplet.fact, group_id=episode_node.group_id, episodes=[episode_node.uuid],
        created_at=now, valid_at=ensure_utc(triplet.valid_at) or episode_node.valid_at,
        invalid_at=ensure_utc(triplet.invalid_at),
    )
    nodes = [source] if source.name.strip().casefold() == target.name.strip().casefold() else [source, target]
    start = perf_counter()
    await prefetch_embeddings(clients, episode_node, nodes, [edge])
    timings["embed_ms"] = _ms(start)
    start = perf_counter()
    resolved, uuid_map, _ = await resolve_extracted_nodes(clients, nodes, episode_node, [])
    if len(nodes) == 1:
        uuid_map[target.uuid] = uuid_map.get(source.uuid, source.uuid)
    timings["resolve_nodes_ms"] = _ms(start)
    return _Extracted(nodes=_unique_nodes(resolved), edges=resolve_edge_pointers([edge], uuid_map),
                      generated_uuids={n.uuid for n in nodes}, dropped_entities=0, dropped_edges=0)


async def _merge_materialized_endpoints(
    clients: GraphitiClients,
    materialized: list[EntityNode],
    episode_node: EpisodicNode,
    previous: list[EpisodicNode],
    nodes: list[EntityNode],
    uuid_map: dict[str, str],
) -> None:
    """graphiti's ``Graphiti._merge_materialized_endpoint_nodes`` as a function.

    Endpoints that extract_edges materialised never went through node extraction: match
    them by name against this episode's resolved nodes, resolve the rest against the graph.
    ``nodes`` and ``uuid_map`` are updated in place.
    """
    by_name = {normalize_name_exact(n.name): n for n in nodes}
    known = {n.uuid for n in nodes}
    unresolved: list[EntityNode] = []
    for node in materialized:
        if node.uuid in known:
            continue
        existing = by_name.get(normalize_name_exact(node.name))
        if existing is not None:
            uuid_map[node.uuid] = existing.uuid
            continue
        unresolved.append(node)
    if not unresolved:
        return
    resolved, more_map, _ = await resolve_extracted_nodes(clients, unresolved, episode_node, previous)
    uuid_map.update(more_map)
    for node in resolved:
        if node.uuid not in known:
            nodes.append(node)
            known.add(node.uuid)


async def _extract_separate(
    clients: GraphitiClients,
    episode_node: EpisodicNode,
    previous: list[EpisodicNode],
    instructions: str,
    timings: dict[str, float],
    ontology: Ontology = DEFAULT_ONTOLOGY,
) -> _Extracted:
    start = perf_counter()
    extracted, _ = await extract_nodes(clients, episode_node, previous, ontology.graphiti_entity_types(),
                                       ontology.graphiti_excluded(), instructions or None)
    timings["extract_nodes_ms"] = _ms(start)
    kept = drop_unsafe_entities(extracted)
    dropped_entities = len(extracted) - len(kept)

    start = perf_counter()
    # facts are not extracted yet: they make a second call when resolve_extracted_edges asks
    await prefetch_embeddings(clients, episode_node, kept)
    timings["embed_ms"] = _ms(start)

    start = perf_counter()
    resolved, uuid_map, _ = await resolve_extracted_nodes(clients, kept, episode_node, previous)
    resolved = _unique_nodes(resolved)
    timings["resolve_nodes_ms"] = _ms(start)

    start = perf_counter()
    edge_nodes = list(kept)  # extract_edges appends materialised endpoints to this list
    edges, materialized = await extract_edges(
        clients,
        episode_node,
        edge_nodes,
        previous,
        ontology.graphiti_edge_type_map(DEFAULT_EDGE_TYPE_MAP),
        episode_node.group_id,
        ontology.graphiti_edge_types(),
        False,
        instructions or None,
    )
    timings["extract_edges_ms"] = _ms(start)
    safe_materialized = drop_unsafe_entities(materialized)
    unsafe = {n.uuid for n in materialized} - {n.uuid for n in safe_materialized}
    kept_edges = _without_endpoints(edges, unsafe)

    start = perf_counter()
    await _merge_materialized_endpoints(clients, safe_materialized, episode_node, previous, resolved, uuid_map)
    timings["resolve_nodes_ms"] += _ms(start)
    return _Extracted(
        nodes=_unique_nodes(resolved),
        edges=resolve_edge_pointers(kept_edges, uuid_map),
        generated_uuids={n.uuid for n in kept} | {n.uuid for n in safe_materialized},
        dropped_entities=dropped_entities + len(unsafe),
        dropped_edges=len(edges) - len(kept_edges),
    )


# A role block of Episode.content starts a line with "<role>: " or "<role> (<name>): " and blocks
# are separated by a blank line (services/turn_detector/pairing.py:render_turn).
_ROLE_BLOCK = re.compile(r"\n\n(?=(?:user|assistant|system|tool)(?: \([^)\n]*\))?: )")


_ROLE_LABEL = re.compile(r"(?:user|assistant|system|tool)(?: \([^)\n]*\))?: ")


def _role_block_pieces(block: str, settings: ChunkingSettings, count: CountTokens) -> list[str]:
    """``block`` whole when it fits a chunk, else cut (chunk_labelled) into pieces that each
    start with the block's speaker label, so a piece from the middle still says who said it."""
    match = _ROLE_LABEL.match(block)
    label = match.group() if match else ""
    return chunk_labelled(label, block[len(label):], settings, count)


def episode_chunks(episode: Episode, settings: ChunkingSettings, count_tokens: CountTokens | None = None) -> list[str]:
    """The entity-extraction chunks of ``episode``: ``[content]`` when it should not be chunked
    (:func:`~engram.services.extractor.chunking.should_chunk`: dense and large, or above
    ``max_unchunked_tokens`` whatever its density).

    A chat turn is chunked between its role blocks (chunk_messages); a block larger than
    ``chunk_token_size`` (one long pasted message) is first cut at paragraph/sentence/word
    boundaries with overlap, every piece starting with the block's speaker label
    (``"user (Ada): "``). Other content is chunked at JSON element/key boundaries when it is
    JSON, else at paragraph and sentence boundaries with overlap.
    """
    count = count_tokens or token_counter()
    content = episode.content
    if not should_chunk(content, settings, count):
        return [content]
    if episode.kind == "chat_turn":
        blocks = [piece for block in _ROLE_BLOCK.split(content) for piece in _role_block_pieces(block, settings, count)]
        chunks = ["\n\n".join(group) for group in chunk_messages(blocks, settings, count)]
    else:
        try:
            json.loads(content)
        except (ValueError, RecursionError):  # RecursionError: JSON nested deeper than json goes
            chunks = chunk_text(content, settings, count)
        else:
            chunks = chunk_json(content, settings, count)
    return chunks or [content]


def _merge_case_insensitive(chunk_nodes: list[list[EntityNode]]) -> list[EntityNode]:
    """Entities of all chunks, one per name (case-insensitive, first seen wins, in order)."""
    seen: set[str] = set()
    merged: list[EntityNode] = []
    for nodes in chunk_nodes:
        for node in nodes:
            key = _name_key(node)
            if key and key not in seen:
                seen.add(key)
                merged.append(node)
    return merged


def _name_key(node: EntityNode) -> str:
    return (node.name or "").strip().casefold()


def _with_content(episode_node: EpisodicNode, content: str) -> EpisodicNode:
    """The episode as an LLM prompt sees it, with ``content`` (a chunk) as its text; same uuid,
    so facts still name the episode."""
    return episode_node.model_copy(update={"content": content})


async def _extract_chunked(
    clients: GraphitiClients,
    episode_node: EpisodicNode,
    previous: list[EpisodicNode],
    instructions: str,
    timings: dict[str, float],
    chunks: list[str],
    max_nodes_per_chunk: int,
    per_chunk_facts: bool = False,
    ontology: Ontology = DEFAULT_ONTOLOGY,
) -> tuple[_Extracted, int]:
    """Entities per chunk (concurrently), merged; facts per covering group, each pair once.

    ``per_chunk_facts`` False (an episode up to ``max_unchunked_tokens``, made of a few
    chunks): entities are resolved in one call against the whole episode, and facts come from
    covering groups over ALL the episode's entities, each call reading the whole episode, so
    a fact between entities of different chunks is found.

    ``per_chunk_facts`` True (a long episode): no call reads more than one chunk of it. Each
    entity is resolved with the text of the first chunk that named it (one resolution call at
    most per chunk), and facts are extracted per chunk, between the resolved entities extracted
    from that chunk, with that chunk as the text (covering groups within the chunk when it
    named more than ``max_nodes_per_chunk`` entities; a chunk naming fewer than two makes no
    call). Bound, for C chunks of at most S = ``chunk_token_size`` tokens and k =
    ``max_nodes_per_chunk``: C node-extraction calls, at most C resolution calls, and
    ``sum_i covering_chunk_count(e_i, k)`` edge calls, e_i the entities of chunk i (one call
    per chunk while e_i <= k; quadratic only in the entities of one chunk, never of the
    episode); every prompt holds at most S tokens of the episode plus graphiti's fixed
    instructions, the previous-episodes window and an entity list. The cost: a fact between
    entities named only in different chunks, more than an overlap apart, is not found; a pair
    named in several chunks is examined in each (identical facts are merged by
    resolve_extracted_edges).

    Returns the extraction and the number of covering groups used.
    """
    start = perf_counter()
    per_chunk = await semaphore_gather(
        *(
            extract_nodes(clients, _with_content(episode_node, chunk), previous, ontology.graphiti_entity_types(),
                          ontology.graphiti_excluded(), instructions or None)
            for chunk in chunks
        )
    )
    chunk_nodes = [nodes for nodes, _ in per_chunk]
    extracted = _merge_case_insensitive(chunk_nodes)
    timings["extract_nodes_ms"] = _ms(start)
    kept = drop_unsafe_entities(extracted)

    start = perf_counter()
    await prefetch_embeddings(clients, episode_node, kept)  # facts come later: a second call
    timings["embed_ms"] = _ms(start)

    start = perf_counter()
    if per_chunk_facts:
        origin: dict[str, int] = {}
        for i, nodes in enumerate(chunk_nodes):
            for node in nodes:
                origin.setdefault(node.uuid, i)
        by_chunk: dict[int, list[EntityNode]] = {}
        for node in kept:
            by_chunk.setdefault(origin[node.uuid], []).append(node)
        order = sorted(by_chunk)
        answers = await semaphore_gather(
            *(resolve_extracted_nodes(clients, by_chunk[i], _with_content(episode_node, chunks[i]), previous)
              for i in order)
        )
        # resolve_extracted_nodes answers in the order it was given
        resolved_of = {
            _name_key(node): found
            for i, (found_nodes, _, _) in zip(order, answers, strict=True)
            for node, found in zip(by_chunk[i], found_nodes, strict=True)
        }
        resolved = _unique_nodes(n for found_nodes, _, _ in answers for n in found_nodes)
    else:
        resolved, _, _ = await resolve_extracted_nodes(clients, kept, episode_node, previous)
        resolved = _unique_nodes(resolved)
    timings["resolve_nodes_ms"] = _ms(start)

    start = perf_counter()
    # (the text each call reads, the entities its pairs are among)
    scopes: list[tuple[EpisodicNode, list[EntityNode]]] = []
    if per_chunk_facts:
        for chunk, nodes in zip(chunks, chunk_nodes, strict=True):
            members = _unique_nodes(resolved_of[k] for k in map(_name_key, nodes) if k in resolved_of)
            if len(members) >= 2:  # no pair, no fact to look for
                scopes.append((_with_content(episode_node, chunk), members))
    else:
        scopes.append((episode_node, resolved))

    async def edges_of(text: EpisodicNode, group: Any, position: dict[str, int]) -> tuple[list[EntityEdge], int]:
        # Only this group's entities; extract_edges appends materialised endpoints to the list
        # it is given, so it gets a copy.
        edges, _ = await extract_edges(
            clients, text, list(group.entities), previous, ontology.graphiti_edge_type_map(DEFAULT_EDGE_TYPE_MAP),
            episode_node.group_id, ontology.graphiti_edge_types(), False, instructions or None,
        )
        owned = set(group.owned_pairs)
        kept_edges = []
        for edge in edges:
            a, b = position.get(edge.source_node_uuid), position.get(edge.target_node_uuid)
            if a is not None and b is not None and a != b and (min(a, b), max(a, b)) in owned:
                kept_edges.append(edge)
        return kept_edges, len(edges) - len(kept_edges)

    calls = []
    for text, members in scopes:
        position = {node.uuid: i for i, node in enumerate(members)}
        calls.extend(edges_of(text, group, position) for group in assign_pairs(members, max_nodes_per_chunk))
    results = await semaphore_gather(*calls)
    timings["extract_edges_ms"] = _ms(start)
    edges = [e for group_edges, _ in results for e in group_edges]
    return (
        _Extracted(
            nodes=resolved,
            edges=edges,
            generated_uuids={n.uuid for n in kept},
            dropped_entities=len(extracted) - len(kept),
            dropped_edges=sum(dropped for _, dropped in results),
        ),
        len(calls),
    )


async def _context_nodes(
    clients: GraphitiClients, invalidated: list[EntityEdge], known: set[str], group_id: str
) -> list[EntityNode]:
    """Entity nodes at the ends of invalidated facts that are not in ``known``."""
    missing = sorted({u for e in invalidated for u in (e.source_node_uuid, e.target_node_uuid)} - known)
    if not missing:
        return []
    return await EntityNode.get_by_uuids(clients.driver, missing, group_id=group_id)


async def extract_episode(
    clients: GraphitiClients,
    episode: Episode,
    *,
    custom_instructions: str,
    previous_window: int,
    mode: ExtractionMode = "combined",
    chunking: ChunkingSettings | None = None,
    restatement_similarity: float | None = None,
    dedupe_similarity: float | None = DEDUPE_SIMILARITY,
    dedupe_cosine: float | None | Literal["auto"] = "auto",
    name_similarity: float | None | Literal["auto"] = "auto",
    ontology: Ontology = DEFAULT_ONTOLOGY,
    known_facts: int = KNOWN_FACTS,
) -> ExtractionResult:
    """Extract ``episode`` into its group's graph once; see the module docstring for the stages.

    ``ontology``: the entity and edge types to extract with (engram/graph/ontology.py; the default is
    graphiti's ``Entity`` only). An entity type with fields gets its attributes from graphiti's
    attribute prompt, one call per typed entity of the turn.

    With ``chunking`` set, a large entity-dense episode (:func:`episode_chunks` gives more than
    one chunk) is extracted in ``chunked`` mode whatever ``mode`` says.

    ``restatement_similarity``: fact-embedding cosine at or above which an invalidating fact
    restates the invalidated one (for the configured embedder; see
    :data:`engram.services.extractor.restatement.DEFAULT_SIMILARITY`). None: only the rules that need
    no embedding (same episode, same text, same words) reject invalidations.

    ``dedupe_similarity``: a ``dedupe_edges.resolve_edge`` call is made only when a candidate's
    content-word overlap with the new fact reaches it (None: always asked; see
    :mod:`engram.services.extractor.local_answers`, which also dates the facts engram can date).

    ``dedupe_cosine``: with it the edge dedupe call also needs a candidate whose fact-embedding
    cosine reaches it; ``auto``: the value measured for the configured embedder
    (:data:`~engram.services.extractor.local_answers.DEDUPE_COSINE`; None for hashing).

    ``name_similarity``: a ``dedupe_nodes.nodes`` call is made only when an entity and a candidate
    show a lexical sign of one entity or their names' cosine reaches it; ``auto``: the value
    measured for the configured embedder (:data:`~engram.services.extractor.local_answers.NAME_SIMILARITY`,
    None for hashing: names are then not compared).

    ``known_facts``: how many of the group's facts in force the combined extraction call is shown
    (:func:`known_facts_for`; 0: none, graphiti's dedupe questions then go to the model as before).

    ``clients.driver`` must target ``episode.group_id``. Returns ``already_present=True``
    (and does nothing else, no LLM call) when the episode's node is already stored.
    """
    if mode not in ("combined", "separate", "chunked"):
        raise ValueError(f"unknown extraction mode {mode!r}: expected 'combined', 'separate' or 'chunked'")
    check_driver_for_group(clients, episode.group_id)
    total = perf_counter()
    timings: dict[str, float] = {}

    start = perf_counter()
    stored = await find_episode(clients, episode.episode_id, episode.group_id)
    timings["lookup_ms"] = _ms(start)
    if stored is not None:
        log.info("episode already in the graph; skipping extraction")
        # a crash may have come before these were written
        await record_episode_properties(clients.driver, episode, await embed_episode(clients.embedder, episode))
        timings["total_ms"] = _ms(total)
        return ExtractionResult(
            episode_id=episode.episode_id, group_id=episode.group_id, already_present=True, episode=stored, timings=timings
        )

    now = utc_now()
    counting = AccountingLLMClient(clients.llm_client, stage="extractor")
    # every text embedded once, the turn's in one call (engram/models/embedding_cache.py)
    # what engram answers itself (dates it resolves, dedupe with no close candidate) is no call:
    # services/extractor/local_answers.py, outside the accounting so only real calls count
    embedder = BatchingEmbedder.around(clients.embedder)
    kind = embedder_kind(embedder.inner)
    if name_similarity == "auto":
        name_similarity = NAME_SIMILARITY.get(kind)
    if dedupe_cosine == "auto":
        dedupe_cosine = DEDUPE_COSINE.get(kind) if dedupe_similarity is not None else None
    # a fact copied from a speaker's line ("I enjoy reading.") is put in the third person before
    # anything reads the answer (services/extractor/first_person.py)
    local = LocalAnswersLLMClient(ThirdPersonLLMClient(counting), dedupe_similarity=dedupe_similarity,
                                  dedupe_cosine=dedupe_cosine,
                                  name_similarity=name_similarity, embedder=embedder,
                                  in_force=lambda texts: facts_in_force(clients, episode.group_id, texts))
    run = clients.model_copy(update={"llm_client": local, "embedder": embedder})
    episode_node = build_episodic_node(episode, now)

    start = perf_counter()
    # a triplet is not extracted: no previous episodes to read for it
    previous = [] if episode.triplet is not None else await previous_episodes_for(run, episode, previous_window)
    timings["previous_episodes_ms"] = _ms(start)

    chunks = [episode.content]
    settings = chunking or ChunkingSettings()
    if episode.triplet is None and (chunking is not None or mode == "chunked"):
        chunks = episode_chunks(episode, settings)
    edge_groups = 0
    if episode.triplet is not None:
        mode = "triplet"  # a fact given whole: no extraction call
        extracted = await _triplet(run, episode_node, episode.triplet, timings)
    elif len(chunks) > 1 or mode == "chunked":
        mode = "chunked"
        # A long episode's facts are extracted per chunk: no prompt then reads more of it than
        # one chunk (the bound is in _extract_chunked's docstring).
        long_episode = len(chunks) > 1 and token_counter()(episode.content) > settings.max_unchunked_tokens
        extracted, edge_groups = await _extract_chunked(
            run, episode_node, previous, custom_instructions, timings, chunks, settings.max_nodes_per_chunk,
            per_chunk_facts=long_episode, ontology=ontology,
        )
    elif mode == "combined":
        start = perf_counter()
        # a custom ontology gets graphiti's own prompt, which shows no known facts: none looked up
        custom = bool(ontology.entity_types or ontology.edge_types)
        known = [] if custom else await known_facts_for(run, episode, known_facts, previous)
        # known_facts 0 turns the turn blocks off: no names either (graphiti's questions asked as before)
        names = [] if custom or known_facts <= 0 else await known_entity_names(run, episode.group_id, known,
                                                                                 episode.content)
        timings["known_facts_ms"] = _ms(start)
        extracted = await _extract_combined(run, episode_node, previous, custom_instructions, timings,
                                            ontology=ontology, known=known, known_names=names)
    else:
        extracted = await _extract_separate(run, episode_node, previous, custom_instructions, timings,
                                            ontology=ontology)
    nodes = extracted.nodes
    if ontology.typed_attributes and episode.triplet is None:
        start = perf_counter()
        # typed entities' fields (graphiti's attribute prompt); an existing entity's stored
        # attributes are merged with what this turn says (graphiti's overlay)
        await extract_attributes_only_from_nodes(run, nodes, episode_node, previous, dict(ontology.entity_types))
        timings["attributes_ms"] = _ms(start)

    start = perf_counter()
    invalidated_by: dict[str, list[str]] = {}
    # a change told now but dated earlier ("moved to Porto last month") still ends the fact it
    # contradicts when that fact was in force by now (services/extractor/told_later.py)
    with telling(episode_node.valid_at):
        resolved_edges, invalidated_edges, new_edges = await resolve_extracted_edges(
            run, extracted.edges, episode_node, nodes, dict(ontology.edge_types),
            ontology.graphiti_edge_type_map(DEFAULT_EDGE_TYPE_MAP), invalidated_by=invalidated_by
        )
    # A fact must not invalidate itself: drop invalidations by a restatement, and restore the
    # edge before the save so nothing is written for it.
    review = review_invalidations(
        resolved_edges, invalidated_edges, invalidated_by, episode_node.uuid, restatement_similarity
    )
    await restore_edges(run.driver, review.rejected)
    invalidated_edges, invalidated_by = review.invalidated, review.invalidated_by
    INVALIDATIONS.labels(outcome="accepted").inc(len(review.invalidated))
    INVALIDATIONS.labels(outcome="rejected_restatement").inc(len(review.rejected))
    if review.rejected:
        log.warning("rejected %d invalidations by a restatement of the invalidated fact (%s)", len(review.rejected),
                    ", ".join(sorted({r.reason for r in review.rejections})))
    timings["resolve_edges_ms"] = _ms(start)

    new_nodes = [n for n in nodes if n.uuid in extracted.generated_uuids]
    entity_edges = _unique_edges([*resolved_edges, *invalidated_edges])

    start = perf_counter()
    # answered from the prefetch (extraction's embed stage), unless something was not prefetched
    await create_entity_node_embeddings(run.embedder, [n for n in new_nodes if n.name_embedding is None])
    await create_entity_edge_embeddings(run.embedder, [e for e in entity_edges if e.fact_embedding is None])
    episode_vector = await embed_episode(run.embedder, episode)
    timings["embed_ms"] = timings.get("embed_ms", 0.0) + _ms(start)

    start = perf_counter()
    context_nodes = await _context_nodes(run, invalidated_edges, {n.uuid for n in nodes}, episode.group_id)
    episode_node.entity_edges = [e.uuid for e in entity_edges]
    episodic_edges = build_episodic_edges(nodes, episode_node.uuid, now)
    # Facts first, the episode (the idempotency marker) last; existing nodes are not re-written.
    await add_nodes_and_edges_bulk(run.driver, [], [], new_nodes, entity_edges, run.embedder)
    await add_nodes_and_edges_bulk(run.driver, [episode_node], episodic_edges, [], [], run.embedder)
    # The cost goes on the node with the message ids, in one write, so it is measured up to here:
    # save and total leave out this last small write.
    timings["save_ms"] = _ms(start)
    timings["total_ms"] = _ms(total)
    cost = extraction_cost(counting.calls, counting.tokens, timings)
    await record_episode_properties(run.driver, episode, episode_vector, cost)

    result = ExtractionResult(
        episode_id=episode.episode_id,
        group_id=episode.group_id,
        mode=mode,
        episode=episode_node,
        nodes=nodes,
        context_nodes=context_nodes,
        new_node_uuids=[n.uuid for n in new_nodes],
        resolved_edges=resolved_edges,
        new_edges=new_edges,
        invalidated_edges=invalidated_edges,
        invalidated_by=invalidated_by,
        rejected_invalidations=review.rejections,
        episodic_edges=episodic_edges,
        dropped_entities=extracted.dropped_entities,
        dropped_edges=extracted.dropped_edges,
        previous_episodes=len(previous),
        chunks=len(chunks),
        edge_groups=edge_groups,
        llm_calls=dict(counting.calls),
        llm_tokens={k: dict(v) for k, v in counting.tokens.items()},
        timings=timings,
    )
    log.info(
        "episode extracted: %d nodes (%d new), %d new facts, %d invalidated, %d LLM calls, %.0f ms",
        len(nodes),
        len(new_nodes),
        len(new_edges),
        len(invalidated_edges),
        result.llm_call_count,
        timings["total_ms"],
    )
    return result


async def _episode_edges(clients: GraphitiClients, stored: EpisodicNode) -> list[EntityEdge]:
    """Entity edges listed on the stored episode or carrying its uuid in ``episodes``, with vectors."""
    driver = clients.driver
    records, _, _ = await driver.execute_query(
        """
        MATCH (n:Entity)-[e:RELATES_TO]->(m:Entity)
        WHERE e.uuid IN $uuids OR $episode_uuid IN e.episodes
        RETURN
        """
        + get_entity_edge_return_query(driver.provider)
        + ", e.fact_embedding AS fact_embedding",
        uuids=list(stored.entity_edges),
        episode_uuid=stored.uuid,
        routing_="r",
    )
    edges = [get_entity_edge_from_record(record, driver.provider) for record in records]
    for edge, record in zip(edges, records, strict=True):
        vector = record.get("fact_embedding")
        edge.fact_embedding = [float(x) for x in vector] if vector is not None else None
    return _unique_edges(edges)


async def stored_extraction(clients: GraphitiClients, episode: Episode, stored: EpisodicNode) -> ExtractionResult:
    """An ExtractionResult rebuilt from the stored graph (no LLM), for re-publishing deltas.

    Mentioned nodes: MENTIONS targets plus endpoints of the episode's facts. The episode's
    facts: edges whose ``episodes`` contain it; new ones are those it created (first in
    ``episodes``). Invalidated: edges on the episode's ``entity_edges`` list that are not its
    own facts. New nodes: created at or after the episode node (extraction runs strictly one
    episode at a time per group). ``invalidated_by`` is left empty: the deltas infer it.
    """
    check_driver_for_group(clients, episode.group_id)
    driver = clients.driver
    mentioned = await get_mentioned_nodes(driver, [stored])
    edges = await _episode_edges(clients, stored)
    own = [e for e in edges if stored.uuid in (e.episodes or [])]
    listed = set(stored.entity_edges)
    invalidated = [e for e in edges if stored.uuid not in (e.episodes or []) and e.uuid in listed]
    new_edges = [e for e in own if e.episodes and e.episodes[0] == stored.uuid]

    known = {n.uuid for n in mentioned}
    endpoint_uuids = sorted({u for e in own for u in (e.source_node_uuid, e.target_node_uuid)} - known)
    if endpoint_uuids:
        mentioned = [*mentioned, *await EntityNode.get_by_uuids(driver, endpoint_uuids, group_id=episode.group_id)]
    nodes = _unique_nodes(mentioned)
    context = await _context_nodes(clients, invalidated, {n.uuid for n in nodes}, episode.group_id)
    episode_created = ensure_utc(stored.created_at)
    new_node_uuids = [
        n.uuid
        for n in nodes
        if episode_created is not None and (ensure_utc(n.created_at) or episode_created) >= episode_created
    ]
    return ExtractionResult(
        episode_id=episode.episode_id,
        group_id=episode.group_id,
        already_present=True,
        episode=stored,
        nodes=nodes,
        context_nodes=context,
        new_node_uuids=new_node_uuids,
        resolved_edges=own,
        new_edges=new_edges,
        invalidated_edges=invalidated,
    )


async def deltas_for_existing_episode(clients: GraphitiClients, episode: Episode) -> list[NodeDelta]:
    """The NodeDeltas of an already extracted episode, rebuilt from the stored graph.

    Raises NodeNotFoundError when the episode is not stored. See :func:`stored_extraction`
    for what can differ from the first run (``invalidated_by`` is inferred).
    """
    stored = await find_episode(clients, episode.episode_id, episode.group_id)
    if stored is None:
        raise NodeNotFoundError(episode.episode_id)
    return build_node_deltas(episode, await stored_extraction(clients, episode, stored))
