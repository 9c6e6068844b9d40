"""NATS subjects, stream names and group ids: the addressing half of the contract.

Every service builds subjects through these helpers so a subject is spelled in one place.
Tokens that end up inside a subject (session ids, group ids, stage names) are restricted to
``[a-zA-Z0-9_-]`` so they can never inject ``.``, ``*`` or ``>`` into a subject.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:  # engram.schemas.messages imports this module: no runtime import the other way
    from .messages import ScopeKeys

TOKEN_PATTERN = r"^[a-zA-Z0-9_-]{1,200}$"
SESSION_ID_PATTERN = r"^[a-zA-Z0-9_-]{1,128}$"
_TOKEN_RE = re.compile(TOKEN_PATTERN)

Scope = Literal["session", "workspace", "user"]

# --- input side (publishers -> turn-detector) ---------------------------------------------
IN_MESSAGE = "engram.in.message.{session}"
"""A ChatMessage of one chat session. Publishers set ``Nats-Msg-Id`` = :func:`message_dedupe_id`."""
IN_CLOSE = "engram.in.close.{session}"
"""A SessionClosed event: flushes the session's open turn now."""
IN_IDLE = "engram.in.idle.{session}"
"""A SessionIdle tick fired by the server-side schedule; internal to the turn-detector."""
SCHED_IDLE = "engram.sched.idle.{session}"
"""Where the turn-detector stores the idle schedule of a session (one pending per session), in
ENGRAM_SCHED."""
SCHED_IDLE_FIRED = "engram.sched.fired.idle.{session}"
"""Where an idle schedule fires (in ENGRAM_SCHED); ENGRAM_IN sources it as ``engram.in.<p>.idle.<session>``.

Schedules live in a stream of their own because nats-server forces ``allow_rollup_hdrs`` on any
stream that allows message schedules: in ENGRAM_IN, one publisher's ``Nats-Rollup: all`` header
would purge every stored message. ENGRAM_IN and ENGRAM_DELTAS refuse rollup and schedule headers."""

# --- pipeline ------------------------------------------------------------------------------
EPISODE = "engram.episode.{group}"
DELTA = "engram.delta.{group}"
SUMMARY = "engram.summary.{group}"
SUMMARY_AUDIT = "engram.summary.audit.{group}"
SCHED_SUMMARY = "engram.sched.summary.{group}.{node}"
"""Where the summary-gate stores a deferred refresh's flush schedule (one pending per node), in
ENGRAM_SCHED."""
SCHED_SUMMARY_FIRED = "engram.sched.fired.summary.{group}"
"""Where a summary schedule fires (in ENGRAM_SCHED); ENGRAM_DELTAS sources it as the group's
delta subject ``engram.delta.<p>.<group>``, in order with the group's deltas."""
RECALL = "engram.recall"
CTL_FORGET_SESSIONS = "engram.ctl.sessions.forget"
"""Core NATS (no stream): a JSON list of session ids whose state a delete erased; every
turn-detector replica drops them from its cache."""
DLQ = "engram.dlq.{stage}"

# --- sessions and user memory (seed 004) ----------------------------------------------------
SESSION_CLOSED = "engram.session.closed.{session}"
"""A SessionSegmentClosed: one segment of a publisher session ended (token limit, idle, explicit)."""
MEMORY_NOTE_SAVE = "engram.memory.note.save"
"""SaveUserNoteRequest -> MemoryResponse (request/reply, served by the sessions service)."""
MEMORY_NOTE_DELETE = "engram.memory.note.delete"
"""DeleteUserNoteRequest -> MemoryResponse."""
MEMORY_NOTES_LIST = "engram.memory.notes.list"
"""ListUserNotesRequest -> MemoryResponse."""
MEMORY_PREFERENCE_SET = "engram.memory.preference.set"
"""SetUserPreferenceRequest -> MemoryResponse."""
MEMORY_PREFERENCE_GET = "engram.memory.preference.get"
"""GetUserPreferencesRequest -> MemoryResponse."""
MEMORY_PREFERENCE_REMOVE = "engram.memory.preference.remove"
"""RemoveUserPreferenceRequest -> MemoryResponse."""
MEMORY_SESSIONS_LIST = "engram.memory.sessions.list"
"""ListSessionsRequest -> MemoryResponse."""
MEMORY_ACTIVITY_LOG = "engram.memory.activity.log"
"""LogActivityRequest -> MemoryResponse (seed 004 ``log_activity``)."""
MEMORY_ACTIVITIES_LIST = "engram.memory.activities.list"
"""ListActivitiesRequest -> MemoryResponse."""
MEMORY_ACTIVITY_DELETE = "engram.memory.activity.delete"
"""DeleteActivityRequest -> MemoryResponse."""
MEMORY_FAVORITE_ADD = "engram.memory.favorite.add"
"""AddFavoriteRequest -> MemoryResponse (seed 004 ``add_favorite``)."""
MEMORY_FAVORITES_LIST = "engram.memory.favorites.list"
"""ListFavoritesRequest -> MemoryResponse."""
MEMORY_FAVORITE_REMOVE = "engram.memory.favorite.remove"
"""RemoveFavoriteRequest -> MemoryResponse."""
CONTEXT = "engram.context"
"""ContextRequest -> ContextResponse: the agent's layered context (served by the sessions service)."""
MEMORY_SUBJECTS = (MEMORY_NOTE_SAVE, MEMORY_NOTE_DELETE, MEMORY_NOTES_LIST, MEMORY_PREFERENCE_SET,
                   MEMORY_PREFERENCE_GET, MEMORY_PREFERENCE_REMOVE, MEMORY_SESSIONS_LIST,
                   MEMORY_ACTIVITY_LOG, MEMORY_ACTIVITIES_LIST, MEMORY_ACTIVITY_DELETE,
                   MEMORY_FAVORITE_ADD, MEMORY_FAVORITES_LIST, MEMORY_FAVORITE_REMOVE)

TRIPLET_ADD = "engram.triplet.add"
"""TripletAddRequest -> TripletAddResponse: a fact given whole (served by the gateway; POST /triplets
and MCP add_triplet are its other doors)."""

# --- graph admin (NATS request/reply, served by the recall service; used by the gateway) ----
GRAPH_EPISODES = "engram.graph.episodes"
"""GraphEpisodesRequest -> GraphEpisodesResponse: a group's latest episodes, newest first."""
GRAPH_EDGE_GET = "engram.graph.edge.get"
"""GraphEdgeRequest -> GraphEdgeResponse: one fact by uuid, whatever its group."""
GRAPH_EDGE_DELETE = "engram.graph.edge.delete"
"""GraphEdgeRequest -> GraphDeleteResponse: delete one fact by uuid."""
GRAPH_EPISODE_DELETE = "engram.graph.episode.delete"
"""GraphEpisodeDeleteRequest -> GraphDeleteResponse: an episode, the facts only it supported,
and the entities that are left with no mention and no fact."""
GRAPH_GROUP_DELETE = "engram.graph.group.delete"
"""GraphGroupDeleteRequest -> GraphDeleteResponse: everything of one group."""
GRAPH_GROUPS = "engram.graph.groups"
"""GraphGroupsRequest -> GraphGroupsResponse: every group that holds a node."""
GRAPH_ENTITY_SAVE = "engram.graph.entity.save"
"""GraphEntityNodeRequest -> GraphEntityNodeResponse: create (or update) one entity node."""
GRAPH_ENTITIES = "engram.graph.entities"
"""GraphEntitiesRequest -> GraphEntitiesResponse: a group's entity nodes with their summaries."""
GRAPH_EPISODE_ENTITIES = "engram.graph.episode.entities"
"""GraphEpisodeEntitiesRequest -> GraphEpisodeEntitiesResponse: the entities and facts of some
episodes (Graphiti's get_episode_entities)."""
GRAPH_ADMIN_SUBJECTS = (GRAPH_EPISODES, GRAPH_EDGE_GET, GRAPH_EDGE_DELETE, GRAPH_EPISODE_DELETE, GRAPH_GROUP_DELETE,
                        GRAPH_GROUPS, GRAPH_ENTITY_SAVE, GRAPH_ENTITIES, GRAPH_EPISODE_ENTITIES)

# --- streams -------------------------------------------------------------------------------
STREAM_IN = "ENGRAM_IN"
STREAM_EPISODES = "ENGRAM_EPISODES"
STREAM_DLQ = "ENGRAM_DLQ"
STREAM_DELTAS = "ENGRAM_DELTAS"
STREAM_SUMMARY = "ENGRAM_SUMMARY"
STREAM_SESSIONS = "ENGRAM_SESSIONS"
STREAM_SCHED = "ENGRAM_SCHED"
"""The turn-detector's idle schedules and the summary-gate's refresh schedules, and where they
fire; written only by those two services (see SCHED_IDLE_FIRED for why it is a stream of its own)."""

KV_TURN_SESSIONS = "engram_turn_sessions"

# Headers engram sets on dead letters (the body stays the original bytes, for exact replay).
HDR_DLQ_REASON = "Engram-Dlq-Reason"
HDR_DLQ_DETAIL = "Engram-Dlq-Detail"
HDR_DLQ_STAGE = "Engram-Dlq-Stage"
HDR_DLQ_SUBJECT = "Engram-Dlq-Subject"
HDR_DLQ_TIME = "Engram-Dlq-Time"
HDR_MSG_ID = "Nats-Msg-Id"

KV_SESSION_EPOCHS = "engram_session_epochs"
"""Session -> epoch (milliseconds of the last delete that erased the session). Absent = 0."""

KV_GATEWAY_REQUESTS = "engram_gateway_requests"
"""The front doors' request records (services/gateway/idempotency.py): recent request hashes
(per-message TTL = the retry window) and Idempotency-Key body fingerprints (a day)."""

KV_LLM_LIMITS = "engram_llm_limits"
"""The deployment's LLM rate limit (engram/models/rate_limit.py): one key per (server, model)
with the requests/tokens budget every replica reserves from and a 429's pause."""

KV_GROUP_ORDER = "engram_group_order"
"""Per-group progress of the stages that keep a group's order over one shared durable
(engram/runtime/group_order.py): the last sequence done, failed attempts and the lease of the replica
working on the group; keys ``<stage>.g.<group>``, and ``<stage>.floor.<p>`` left by the
migration from partition durables."""


# --- deduplication ids -----------------------------------------------------------------------
def _dedupe_digest(*parts: object) -> str:
    key = json.dumps(parts, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


def message_dedupe_id(session_id: str, scopes: "ScopeKeys | Mapping[str, Any] | None", message_id: str,
                      epoch: int = 0) -> str:
    """The ``Nats-Msg-Id`` of a ChatMessage on ``engram.in.message.<session>``.

    JetStream deduplicates per *stream*, over every subject, for ``duplicate_window`` (600 s):
    a bare message id such as "m1" would make session s2's first message a duplicate of session
    s1's and drop it. The id is therefore a hash of everything that makes a message distinct:

        sha256(json([session_id, scopes, message_id, epoch]))[:40]  (hex; scopes as a dict without
        null fields, keys sorted; ``epoch`` is 0 unless the session was erased by a delete)

    so the same message re-published (a retry, a re-ingest) is dropped, while the same id in
    another session, or sent to other workspace/user scopes, is stored. ``epoch`` is the
    session's value in the ``engram_session_epochs`` KV bucket (:mod:`engram.runtime.epochs`): deleting a
    group bumps the epochs of the sessions that fed it, so content posted again after a delete
    is stored instead of being dropped as a duplicate of what was deleted. Publishers that never
    delete can leave it 0.
    """
    if scopes is None:
        scope_dict: dict[str, Any] = {"session": True}
    elif hasattr(scopes, "model_dump"):
        scope_dict = scopes.model_dump(exclude_none=True)  # type: ignore[union-attr]
    else:
        scope_dict = {k: v for k, v in dict(scopes).items() if v is not None}
    return "m-" + _dedupe_digest(session_id, scope_dict, message_id, int(epoch))


def close_dedupe_id(session_id: str, closed_at: str, epoch: int = 0, after: str = "") -> str:
    """The ``Nats-Msg-Id`` of a SessionClosed (``closed_at`` as ISO-8601 text). ``after`` is the
    Nats-Msg-Id of the message it closes after, when known: a transcript ingested again into other
    scopes closes its session again (and flushes the last turn) instead of being a duplicate."""
    return "c-" + _dedupe_digest(session_id, closed_at, int(epoch), after)


def is_valid_token(value: str) -> bool:
    return bool(_TOKEN_RE.match(value))


def require_token(value: str, what: str) -> str:
    if not is_valid_token(value):
        raise ValueError(f"{what} must match {TOKEN_PATTERN}, got {len(value)} chars")
    return value


def in_message(session_id: str) -> str:
    return IN_MESSAGE.format(session=require_token(session_id, "session_id"))


def in_close(session_id: str) -> str:
    return IN_CLOSE.format(session=require_token(session_id, "session_id"))


def in_idle(session_id: str) -> str:
    return IN_IDLE.format(session=require_token(session_id, "session_id"))


def sched_idle(session_id: str) -> str:
    return SCHED_IDLE.format(session=require_token(session_id, "session_id"))


def sched_idle_fired(session_id: str) -> str:
    return SCHED_IDLE_FIRED.format(session=require_token(session_id, "session_id"))


def episode(group_id: str) -> str:
    return EPISODE.format(group=require_token(group_id, "group_id"))


def delta(group_id: str) -> str:
    return DELTA.format(group=require_token(group_id, "group_id"))


def summary(group_id: str) -> str:
    return SUMMARY.format(group=require_token(group_id, "group_id"))


def summary_audit(group_id: str) -> str:
    return SUMMARY_AUDIT.format(group=require_token(group_id, "group_id"))


def sched_summary(group_id: str, node_uuid: str) -> str:
    return SCHED_SUMMARY.format(group=require_token(group_id, "group_id"), node=require_token(node_uuid, "node_uuid"))


def sched_summary_fired(group_id: str) -> str:
    return SCHED_SUMMARY_FIRED.format(group=require_token(group_id, "group_id"))


def session_closed(session_id: str) -> str:
    return SESSION_CLOSED.format(session=require_token(session_id, "session_id"))


def dlq(stage: str) -> str:
    return DLQ.format(stage=require_token(stage, "stage"))


def session_token_of(subject: str) -> str:
    """Last token of an ``engram.in.<kind>[.<partition>].<session>`` subject."""
    return subject.rsplit(".", 1)[-1]


# --- scopes -> group ids (seed 003) --------------------------------------------------------
def _key_hash(key: str) -> str:
    # Workspace and user keys are often paths or e-mail addresses: hash them so the group id is
    # a valid token and does not leak the key into subjects, metrics or database names.
    return hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]


def session_group(prefix: str, session_id: str) -> str:
    return require_token(f"{prefix}_session_{session_id}", "session group id")


def workspace_group(prefix: str, workspace_key: str) -> str:
    return f"{prefix}_workspace_{_key_hash(workspace_key)}"


def user_group(prefix: str, user_key: str) -> str:
    return f"{prefix}_user_{_key_hash(user_key)}"
