"""Proactive memory (seed 004, 3.1): what an agent saves and reads about its user during a chat.

Plain functions over the request models of schemas/memory.py and a :class:`MemoryStore`
(services/sessions/store.py); services/sessions/requests.py serves them over NATS
request/reply and the gateway over HTTP. Seed 004's tools map onto subjects:

* ``save_user_note``         -> ``engram.memory.note.save``        (:func:`save_note`)
* ``set_user_preference``    -> ``engram.memory.preference.set``   (:func:`set_preference`)
* ``get_user_preferences``   -> ``engram.memory.preference.get``   (:func:`get_preferences`)
* ``remove_user_preference`` -> ``engram.memory.preference.remove`` (:func:`remove_preference`)
* ``log_activity``           -> ``engram.memory.activity.log``     (:func:`log_activity`)
* ``add_favorite``           -> ``engram.memory.favorite.add``     (:func:`add_favorite`)
* plus listing and deleting notes, activities and favorites, and listing closed sessions.

Every request names its owner with ``scopes``; the memory group is the user's when ``user`` is
set, else the workspace's, else the session's (:func:`engram.schemas.memory.memory_group_for`). A
request naming none is answered ``status=error``, ``reason=bad_request: ...``. An unknown note
or a preference with no current value is ``not_found``. :func:`answer` never raises: a body that
does not parse is ``bad_request``, a store failure ``backend_error: <ExceptionType>`` (never the
content).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from pydantic import BaseModel, ValidationError

from engram.text.secrets import scrub_keyed_value, scrub_secrets
from engram.schemas import subjects
from engram.schemas.memory import (
    AddFavoriteRequest,
    DeleteActivityRequest,
    DeleteUserNoteRequest,
    GetUserPreferencesRequest,
    ListActivitiesRequest,
    ListFavoritesRequest,
    ListSessionsRequest,
    ListUserNotesRequest,
    LogActivityRequest,
    MemoryResponse,
    MemoryScopes,
    RemoveFavoriteRequest,
    RemoveUserPreferenceRequest,
    SaveUserNoteRequest,
    SessionRecord,
    SetUserPreferenceRequest,
    UserActivity,
    UserFavorite,
    UserNote,
    UserPreference,
    memory_group_for,
)
from engram.schemas.validation import error_locations

log = logging.getLogger("engram.sessions.memory")

NO_SCOPE = "bad_request: no scope: give scopes.user, scopes.workspace or scopes.session (whose memory this is)"


class Store(Protocol):
    """What these functions need of services/sessions/store.py's MemoryStore."""

    async def add_note(self, group_id: str, text: str, *, source: str, session_id: str | None = None) -> UserNote: ...
    async def notes(self, group_id: str, limit: int = 50) -> list[UserNote]: ...
    async def delete_note(self, group_id: str, note_uuid_: str) -> bool: ...
    async def set_preference(self, group_id: str, key: str, value: str, *, source: str,
                             session_id: str | None = None) -> UserPreference: ...
    async def remove_preference(self, group_id: str, key: str) -> UserPreference | None: ...
    async def preferences(self, group_id: str, *, include_history: bool = False) -> list[UserPreference]: ...
    async def last_sessions(self, group_id: str, n: int = 1) -> list[SessionRecord]: ...
    async def log_activity(self, group_id: str, text: str, *, kind: str, source: str, session_id: str | None = None,
                           occurred_at: datetime | None = None, activity_id: str | None = None) -> UserActivity: ...
    async def activities(self, group_id: str, limit: int = 50, *, kind: str | None = None) -> list[UserActivity]: ...
    async def delete_activity(self, group_id: str, activity_uuid_: str) -> bool: ...
    async def add_favorite(self, group_id: str, item: str, *, kind: str | None, source: str,
                           session_id: str | None = None) -> UserFavorite: ...
    async def favorites(self, group_id: str, limit: int = 100) -> list[UserFavorite]: ...
    async def remove_favorite(self, group_id: str, favorite_uuid_: str) -> bool: ...


class BadRequest(ValueError):
    """The request cannot be served as given (its reason starts with ``bad_request:``)."""


def group_of(scopes: MemoryScopes, prefix: str) -> str:
    group = memory_group_for(prefix, user=scopes.user, workspace=scopes.workspace, session=scopes.session)
    if group is None:
        raise BadRequest(NO_SCOPE)
    return group


async def save_note(store: Store, prefix: str, request: SaveUserNoteRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    # Scrubbed here, where every door (NATS, REST, MCP) arrives: an agent's note is stored text.
    text = scrub_secrets(request.text).text
    note = await store.add_note(group, text, source=request.source, session_id=request.session_id)
    return MemoryResponse(group_id=group, note=note)


async def list_notes(store: Store, prefix: str, request: ListUserNotesRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    return MemoryResponse(group_id=group, notes=await store.notes(group, request.limit))


def _deleted(found: bool, what: str, group: str) -> MemoryResponse:
    if not found:
        return MemoryResponse(status="not_found", reason=f"no {what} with this uuid in the memory group", group_id=group)
    return MemoryResponse(group_id=group)


async def delete_note(store: Store, prefix: str, request: DeleteUserNoteRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    return _deleted(await store.delete_note(group, request.uuid), "note", group)


async def set_preference(store: Store, prefix: str, request: SetUserPreferenceRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    # The value is judged with its key: ``aws_secret_access_key`` -> ``wJalr...`` has no other context.
    key = scrub_secrets(request.key).text
    value = scrub_keyed_value(request.key, request.value).text
    preference = await store.set_preference(group, key, value, source=request.source, session_id=request.session_id)
    return MemoryResponse(group_id=group, preference=preference)


async def get_preferences(store: Store, prefix: str, request: GetUserPreferencesRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    return MemoryResponse(group_id=group,
                          preferences=await store.preferences(group, include_history=request.include_history))


async def remove_preference(store: Store, prefix: str, request: RemoveUserPreferenceRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    ended = await store.remove_preference(group, scrub_secrets(request.key).text)  # keys are stored scrubbed
    if ended is None:
        return MemoryResponse(status="not_found", reason="no current value for this key", group_id=group)
    return MemoryResponse(group_id=group, preference=ended)


async def list_sessions(store: Store, prefix: str, request: ListSessionsRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    return MemoryResponse(group_id=group, sessions=await store.last_sessions(group, request.limit))


FUTURE_SKEW = timedelta(minutes=5)
"""How far ahead of this service's clock an activity's ``occurred_at`` may be (clocks differ a little)."""


async def log_activity(store: Store, prefix: str, request: LogActivityRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    if request.occurred_at is not None and request.occurred_at > datetime.now(timezone.utc) + FUTURE_SKEW:
        # a future entry would stay first in the user context and never be pruned as it should
        raise BadRequest("bad_request: occurred_at is in the future")
    activity = await store.log_activity(group, scrub_secrets(request.text).text, kind=request.kind,
                                        source=request.source, session_id=request.session_id,
                                        occurred_at=request.occurred_at, activity_id=request.activity_id)
    return MemoryResponse(group_id=group, activity=activity)


async def list_activities(store: Store, prefix: str, request: ListActivitiesRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    return MemoryResponse(group_id=group, activities=await store.activities(group, request.limit, kind=request.kind))


async def delete_activity(store: Store, prefix: str, request: DeleteActivityRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    return _deleted(await store.delete_activity(group, request.uuid), "activity", group)


async def add_favorite(store: Store, prefix: str, request: AddFavoriteRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    favorite = await store.add_favorite(group, scrub_secrets(request.item).text, kind=request.kind,
                                        source=request.source, session_id=request.session_id)
    return MemoryResponse(group_id=group, favorite=favorite)


async def list_favorites(store: Store, prefix: str, request: ListFavoritesRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    return MemoryResponse(group_id=group, favorites=await store.favorites(group, request.limit))


async def remove_favorite(store: Store, prefix: str, request: RemoveFavoriteRequest) -> MemoryResponse:
    group = group_of(request.scopes, prefix)
    return _deleted(await store.remove_favorite(group, request.uuid), "favorite", group)


@dataclass(frozen=True)
class Operation:
    op: str
    """Low-cardinality name for metrics (``engram_memory_requests_total{op}``)."""
    model: type[BaseModel]
    run: Callable[[Store, str, Any], Awaitable[MemoryResponse]]


OPERATIONS: dict[str, Operation] = {
    subjects.MEMORY_NOTE_SAVE: Operation("note_save", SaveUserNoteRequest, save_note),
    subjects.MEMORY_NOTES_LIST: Operation("notes_list", ListUserNotesRequest, list_notes),
    subjects.MEMORY_NOTE_DELETE: Operation("note_delete", DeleteUserNoteRequest, delete_note),
    subjects.MEMORY_PREFERENCE_SET: Operation("preference_set", SetUserPreferenceRequest, set_preference),
    subjects.MEMORY_PREFERENCE_GET: Operation("preference_get", GetUserPreferencesRequest, get_preferences),
    subjects.MEMORY_PREFERENCE_REMOVE: Operation("preference_remove", RemoveUserPreferenceRequest, remove_preference),
    subjects.MEMORY_SESSIONS_LIST: Operation("sessions_list", ListSessionsRequest, list_sessions),
    subjects.MEMORY_ACTIVITY_LOG: Operation("activity_log", LogActivityRequest, log_activity),
    subjects.MEMORY_ACTIVITIES_LIST: Operation("activities_list", ListActivitiesRequest, list_activities),
    subjects.MEMORY_ACTIVITY_DELETE: Operation("activity_delete", DeleteActivityRequest, delete_activity),
    subjects.MEMORY_FAVORITE_ADD: Operation("favorite_add", AddFavoriteRequest, add_favorite),
    subjects.MEMORY_FAVORITES_LIST: Operation("favorites_list", ListFavoritesRequest, list_favorites),
    subjects.MEMORY_FAVORITE_REMOVE: Operation("favorite_remove", RemoveFavoriteRequest, remove_favorite),
}


def bad_request_reason(exc: ValidationError) -> str:
    """Where the request is wrong, by field and error type only (the input is content)."""
    return "bad_request: " + error_locations(exc, 5, root="body")


async def answer(subject: str, body: bytes, store: Store, prefix: str) -> tuple[MemoryResponse, str]:
    """The reply to ``body`` on ``subject`` and its outcome (ok, not_found, bad_request, error)."""
    operation = OPERATIONS[subject]
    try:
        request = operation.model.model_validate_json(body)
    except ValidationError as exc:
        return MemoryResponse(status="error", reason=bad_request_reason(exc)), "bad_request"
    try:
        response = await operation.run(store, prefix, request)
    except BadRequest as exc:
        return MemoryResponse(status="error", reason=str(exc)), "bad_request"
    except Exception as exc:  # noqa: BLE001 - answered, never raised: the caller waits for a reply
        log.warning("memory %s failed: %s", operation.op, type(exc).__name__, exc_info=log.isEnabledFor(logging.DEBUG))
        return MemoryResponse(status="error", reason=f"backend_error: {type(exc).__name__}"), "error"
    return response, response.status
