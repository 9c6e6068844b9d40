"""Sessions, user memory and the agent's context (seed 004): the contract of the session layer.

* :class:`SessionSegmentClosed` -- the turn-detector closes a *segment* of a publisher's chat
  session (at ``ENGRAM_SESSION_TOKEN_LIMIT`` tokens, after ``ENGRAM_SESSION_IDLE_CLOSE_S`` without
  a message, or on an explicit ``SessionClosed``) and publishes this on
  ``engram.session.closed.<session>``; the publisher's session id never changes, the next message
  simply starts the next segment. It carries the (already scrubbed) tail of the segment's
  transcript, because the raw input is erased once processed.
* The session close stage turns it into a :class:`SessionRecord` (hybrid summary) plus
  preferences and notes, stored in the *memory group*: the user's group when the session named a
  user, else the workspace's, else the session's (:func:`memory_group_for`).
* Proactive memory (request/reply): save a note, set/get/remove a preference, log an activity,
  add a favorite, and list or remove each; list sessions. Every request names its owner with :class:`MemoryScopes` (the same keys as recall).
* The context builder (request/reply on ``engram.context``): the prompt sections an agent injects,
  each cut to its cl100k token budget.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field

from .messages import MESSAGE_ID_PATTERN, AdminStatus, RecallScopes, Role, ScopeKeys, _Model
from .subjects import SESSION_ID_PATTERN, TOKEN_PATTERN, session_group, user_group, workspace_group

CloseReason = Literal["token_limit", "idle", "explicit", "scope_change"]
"""Why a segment closed: its token limit at a turn boundary, inactivity, the publisher's close, or
a turn naming another user, workspace or group than the segment (``scope_change``: two people in
one chat; a segment's summary goes to one memory, so it holds one person's conversation)."""
MemorySource = Literal["conversation", "extraction"]
"""``conversation``: saved by the agent with a tool during the chat; ``extraction``: found by
the session close stage in the closed segment's transcript (seed 004, 5.3)."""
SummarySource = Literal["llm", "rules", "fallback", "empty"]
"""Who wrote a session summary: a language model, the offline rules model (no model ran), the
fallback text after a failed call, or the empty-session text."""
"""``llm``: the model's hybrid summary; ``fallback``: the model failed, the fixed fallback text
(seed 004, 7); ``empty``: nothing to summarise (no user/assistant text), no LLM call."""

FALLBACK_SUMMARY = "Session closed due to {reason} (summary unavailable)."
EMPTY_SUMMARY = "Session closed due to {reason} (no conversation to summarise)."


class TranscriptLine(_Model):
    """One scrubbed message of a closed segment's transcript."""

    message_id: str = Field(pattern=MESSAGE_ID_PATTERN)
    role: Role
    name: str | None = None
    text: str
    timestamp: AwareDatetime


class SessionSegmentClosed(_Model):
    """Published by the turn-detector on ``engram.session.closed.<session_id>`` when one segment of a
    publisher session ends; ``Nats-Msg-Id`` = ``segment_id`` (a re-publish after a crash is dropped)."""

    schema_version: Literal[1] = 1
    session_id: str = Field(pattern=SESSION_ID_PATTERN)
    segment: int = Field(ge=0, description="0 for the first segment of the session, then 1, 2, ...")
    segment_id: str = Field(pattern=TOKEN_PATTERN, description="Unique and deterministic: session, epoch and segment.")
    reason: CloseReason
    token_count: int = Field(ge=0, description="cl100k tokens of every accepted message of the segment.")
    message_count: int = Field(ge=0)
    opened_at: AwareDatetime | None = Field(None, description="Timestamp of the segment's first message.")
    closed_at: AwareDatetime
    scopes: ScopeKeys = Field(default_factory=ScopeKeys, description="The scopes the segment's messages named (merged).")
    transcript: list[TranscriptLine] = Field(
        default_factory=list,
        description="The segment's last messages (ENGRAM_SESSION_TRANSCRIPT_MESSAGES / _TOKENS), oldest first.",
    )
    transcript_dropped: int = Field(0, ge=0, description="Earlier messages of the segment left out of the transcript.")


class MemoryScopes(RecallScopes):
    """Whose memory: the user's when ``user`` is set, else the workspace's, else the session's."""


def memory_group_for(prefix: str, *, user: str | None = None, workspace: str | None = None,
                     session: str | None = None) -> str | None:
    """The group a session's summary, preferences and notes live in (seed 004: the user scope)."""
    if user:
        return user_group(prefix, user)
    if workspace:
        return workspace_group(prefix, workspace)
    if session:
        return session_group(prefix, session)
    return None


class SessionRecord(_Model):
    """A closed segment as stored in its memory group."""

    session_id: str
    segment: int = 0
    segment_id: str
    summary: str
    summary_source: SummarySource
    close_reason: CloseReason
    token_count: int = 0
    message_count: int = 0
    opened_at: AwareDatetime | None = None
    closed_at: AwareDatetime
    language: str | None = Field(None, description="ISO 639-1 code of the conversation's language, when detected.")


class UserPreference(_Model):
    key: str = Field(min_length=1, max_length=128)
    value: str = Field(max_length=2000)
    source: MemorySource
    set_at: AwareDatetime
    session_id: str | None = None
    current: bool = Field(True, description="False for earlier values (history) and removed preferences.")
    ended_at: AwareDatetime | None = None
    ended_by: Literal["replaced", "removed"] | None = None


class UserNote(_Model):
    uuid: str
    text: str
    source: MemorySource
    created_at: AwareDatetime
    session_id: str | None = None


ACTIVITY_KIND_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"


class UserActivity(_Model):
    """Something the agent did for the user (seed 004 ``log_activity``: "RAG search: Python
    tutorials"): a log, newest first, the oldest pruned past ``ENGRAM_SESSION_ACTIVITIES_KEPT``."""

    uuid: str
    kind: str = Field(description="What sort of activity, e.g. search, tool, visit (lowercase).")
    text: str
    occurred_at: AwareDatetime
    source: MemorySource
    session_id: str | None = None


class UserFavorite(_Model):
    """An item the user marked as a favorite (seed 004 ``add_favorite``); adding an equal item
    (same kind; case, spacing and punctuation aside) returns the stored one."""

    uuid: str
    item: str
    kind: str | None = Field(None, description="What sort of item, e.g. doc, recipe, repo (lowercase).")
    added_at: AwareDatetime
    source: MemorySource
    session_id: str | None = None


class SaveUserNoteRequest(_Model):
    """``engram.memory.note.save``: remember a note about the user (seed 004 ``save_user_note``)."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    text: str = Field(min_length=1, max_length=4000)
    source: MemorySource = "conversation"
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)


class SetUserPreferenceRequest(_Model):
    """``engram.memory.preference.set``: key -> value; the latest value wins, earlier ones stay as history."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    key: str = Field(min_length=1, max_length=128)
    value: str = Field(min_length=1, max_length=2000)
    source: MemorySource = "conversation"
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)


class GetUserPreferencesRequest(_Model):
    """``engram.memory.preference.get``: the current preferences (and, with ``include_history``, earlier values)."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    include_history: bool = False


class RemoveUserPreferenceRequest(_Model):
    """``engram.memory.preference.remove``: end the current value of ``key`` (it stays in the history)."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    key: str = Field(min_length=1, max_length=128)


class ListUserNotesRequest(_Model):
    """``engram.memory.notes.list``: the newest notes first."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    limit: int = Field(50, ge=1, le=1000)


class DeleteUserNoteRequest(_Model):
    """``engram.memory.note.delete``: delete one note by uuid."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    uuid: str = Field(min_length=1, max_length=256)


class LogActivityRequest(_Model):
    """``engram.memory.activity.log``: add an entry to the user's activity log (seed 004 ``log_activity``)."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    text: str = Field(min_length=1, max_length=2000)
    kind: str = Field("activity", pattern=ACTIVITY_KIND_PATTERN)
    occurred_at: AwareDatetime | None = Field(None, description="When it happened (not in the future); the time the "
                                              "request is served when unset.")
    activity_id: str | None = Field(
        None, pattern=TOKEN_PATTERN,
        description="The caller's id for this entry: a retried request with the same id is logged once. Without it, "
        "an entry equal to a logged one (kind, text, session and occurred_at) is logged once.",
    )
    source: MemorySource = "conversation"
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)


class ListActivitiesRequest(_Model):
    """``engram.memory.activities.list``: the activity log, newest first."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    limit: int = Field(50, ge=1, le=1000)
    kind: str | None = Field(None, pattern=ACTIVITY_KIND_PATTERN, description="Only entries of this kind.")


class DeleteActivityRequest(_Model):
    """``engram.memory.activity.delete``: delete one activity entry by uuid."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    uuid: str = Field(min_length=1, max_length=256)


class AddFavoriteRequest(_Model):
    """``engram.memory.favorite.add``: mark an item as the user's favorite (seed 004 ``add_favorite``)."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    item: str = Field(min_length=1, max_length=2000, description="The item: a title, a link, a name.")
    kind: str | None = Field(None, pattern=ACTIVITY_KIND_PATTERN)
    source: MemorySource = "conversation"
    session_id: str | None = Field(None, pattern=SESSION_ID_PATTERN)


class ListFavoritesRequest(_Model):
    """``engram.memory.favorites.list``: the favorites, newest first."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    limit: int = Field(100, ge=1, le=1000)


class RemoveFavoriteRequest(_Model):
    """``engram.memory.favorite.remove``: remove one favorite by uuid."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    uuid: str = Field(min_length=1, max_length=256)


class ListSessionsRequest(_Model):
    """``engram.memory.sessions.list``: closed segments, newest first."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes
    limit: int = Field(20, ge=1, le=1000)


class MemoryResponse(_Model):
    """The reply to every ``engram.memory.*`` request (only the fields the request is about are filled)."""

    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    group_id: str | None = None
    note: UserNote | None = None
    notes: list[UserNote] = Field(default_factory=list)
    preference: UserPreference | None = None
    preferences: list[UserPreference] = Field(default_factory=list)
    sessions: list[SessionRecord] = Field(default_factory=list)
    activity: UserActivity | None = None
    activities: list[UserActivity] = Field(default_factory=list)
    favorite: UserFavorite | None = None
    favorites: list[UserFavorite] = Field(default_factory=list)


ContextLayer = Literal["identity", "agent_memory", "user_context", "session_summary", "skills", "recall"]


class ContextBudgets(_Model):
    """cl100k token budget per layer (seed 004, 6). Unset fields take the service's
    ``ENGRAM_CONTEXT_BUDGET_*`` defaults; 0 leaves a layer out."""

    identity: int | None = Field(None, ge=0, le=100_000)
    agent_memory: int | None = Field(None, ge=0, le=100_000)
    user_context: int | None = Field(None, ge=0, le=100_000)
    session_summary: int | None = Field(None, ge=0, le=100_000)
    skills: int | None = Field(None, ge=0, le=100_000)
    recall: int | None = Field(None, ge=0, le=100_000)


class ContextRequest(_Model):
    """``engram.context`` (request/reply): the layered context for an agent about to answer."""

    schema_version: Literal[1] = 1
    scopes: MemoryScopes = Field(default_factory=MemoryScopes)
    query: str | None = Field(None, max_length=8000, description="The current user message: the recall layer searches for it.")
    identity: str | None = Field(None, max_length=100_000, description="The agent's own identity text (engram does not store it).")
    skills: str | None = Field(None, max_length=200_000, description="The agent's skills/tools text (engram does not store it).")
    budgets: ContextBudgets = Field(default_factory=ContextBudgets)
    timeout_ms: int = Field(1000, ge=10, le=60_000)


class ContextSection(_Model):
    layer: ContextLayer
    tag: str = Field(description="The XML-like tag the section is wrapped in, e.g. graphiti_memory.")
    source: str = Field(description="Where the content came from (request, group ids, counts), no content.")
    text: str = Field(description="The tagged section as injected, within its budget.")
    tokens: int = Field(ge=0)
    budget: int = Field(ge=0)
    truncated: bool = False


class ContextResponse(_Model):
    schema_version: Literal[1] = 1
    status: AdminStatus = "ok"
    reason: str | None = None
    sections: list[ContextSection] = Field(default_factory=list)
    prompt: str = Field("", description="Every non-empty section, in layer order, joined by blank lines.")
    tokens: int = 0
    degraded: bool = Field(False, description="A layer's source failed or timed out; the other layers are served.")
    took_ms: float = 0.0


MEMORY_MODELS = (
    SessionSegmentClosed,
    SaveUserNoteRequest,
    SetUserPreferenceRequest,
    GetUserPreferencesRequest,
    RemoveUserPreferenceRequest,
    ListUserNotesRequest,
    DeleteUserNoteRequest,
    ListSessionsRequest,
    LogActivityRequest,
    ListActivitiesRequest,
    DeleteActivityRequest,
    AddFavoriteRequest,
    ListFavoritesRequest,
    RemoveFavoriteRequest,
    MemoryResponse,
    ContextRequest,
    ContextResponse,
)
