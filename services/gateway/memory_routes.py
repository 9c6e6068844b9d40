"""The session layer over HTTP (seed 004): user memory and the agent's context, answered by the
sessions service over NATS request/reply (services/sessions/requests.py).

* ``POST /context``                      ContextRequest -> ContextResponse (``engram.context``)
* ``POST /memory/notes``                 save_user_note          (``engram.memory.note.save``)
* ``GET /memory/notes``                  the notes, newest first  (``engram.memory.notes.list``)
* ``DELETE /memory/notes/{uuid}``        (``engram.memory.note.delete``)
* ``PUT /memory/preferences/{key}``      set_user_preference     (``engram.memory.preference.set``)
* ``GET /memory/preferences``            get_user_preferences    (``engram.memory.preference.get``)
* ``DELETE /memory/preferences/{key}``   remove_user_preference  (``engram.memory.preference.remove``)
* ``GET /memory/sessions``               closed session segments, newest first
* ``POST /memory/activities``            log_activity            (``engram.memory.activity.log``)
* ``GET /memory/activities``             the activity log, newest first (``engram.memory.activities.list``)
* ``DELETE /memory/activities/{uuid}``   (``engram.memory.activity.delete``)
* ``POST /memory/favorites``             add_favorite            (``engram.memory.favorite.add``)
* ``GET /memory/favorites``              the favorites, newest first (``engram.memory.favorites.list``)
* ``DELETE /memory/favorites/{uuid}``    (``engram.memory.favorite.remove``)

Whose memory: the ``user``, ``workspace`` or ``session`` query parameter (the user's when given,
else the workspace's, else the session's); none is a 400. Content travels in bodies only: the
URL holds scope keys, a note's uuid and a preference's key. Errors as the other routes: 503
(retry), 504 (timeout), 502 (unexpected reply), 404 for an unknown note or preference.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response, status
from pydantic import BaseModel

from engram.schemas import subjects
from engram.schemas.memory import (
    ACTIVITY_KIND_PATTERN,
    AddFavoriteRequest,
    ContextRequest,
    ContextResponse,
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
)
from engram.schemas.subjects import SESSION_ID_PATTERN
from engram.services.gateway.bus import Bus, BusError
from engram.services.gateway.models import ActivityBody, FavoriteBody, NoteBody, PreferenceBody, Result
from engram.services.gateway.settings import GatewaySettings

CONTEXT_DEGRADED_HEADER = "X-Engram-Context-Degraded"
NO_SCOPE = "give whose memory: the user, workspace or session query parameter"


def memory_scopes(
    user: Annotated[str | None, Query(max_length=512, description="User key (the memory group when given).")] = None,
    workspace: Annotated[str | None, Query(max_length=512, description="Workspace key (used when no user).")] = None,
    session: Annotated[str | None, Query(pattern=SESSION_ID_PATTERN, description="Session id (used when neither).")] = None,
) -> MemoryScopes:
    if not (user or workspace or session):
        raise HTTPException(status.HTTP_400_BAD_REQUEST, NO_SCOPE)
    return MemoryScopes(user=user, workspace=workspace, session=session)


Scopes = Annotated[MemoryScopes, Depends(memory_scopes)]
PathKey = Annotated[str, Path(min_length=1, max_length=128, description="The preference's key, e.g. language.")]
PathNoteUuid = Annotated[str, Path(min_length=1, max_length=256)]
"""A note's, an activity's or a favorite's uuid."""


def _raise(exc: BusError) -> HTTPException:
    return HTTPException(exc.status, exc.detail, headers={"Retry-After": "1"} if exc.status == 503 else None)


def _failed(reason: str | None) -> HTTPException:
    if reason and reason.startswith("bad_request"):
        return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, reason)
    retry = bool(reason and reason.startswith("backend_error"))
    return HTTPException(503 if retry else 502, f"sessions service failed: {reason}",
                         headers={"Retry-After": "1"} if retry else None)


def add_memory_routes(router: APIRouter, bus: Bus, gateway: GatewaySettings) -> None:
    """Add the routes to ``router`` (the Graphiti router: same API key, same error conventions)."""
    wait_s = gateway.admin_timeout_s

    async def ask(subject: str, request: BaseModel, what: str = "") -> MemoryResponse:
        try:
            answer = await bus.ask(subject, request, MemoryResponse, wait_s)
        except BusError as exc:
            raise _raise(exc) from exc
        if answer.status == "not_found":
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{what} not found")
        if answer.status == "error":
            raise _failed(answer.reason)
        return answer

    @router.post("/context", response_model=ContextResponse, tags=["sessions"],
                 responses={503: {"description": "No sessions service answered: retry."}})
    async def context(request: ContextRequest, response: Response) -> ContextResponse:
        """The prompt sections an agent injects (identity, agent_memory, user_context,
        session_summary, skills, recall as ``<graphiti_memory>``), each cut to its cl100k budget.
        A layer whose source failed is left out: 200 with ``degraded`` and the layers in the
        ``X-Engram-Context-Degraded`` header."""
        try:
            answer = await bus.ask(subjects.CONTEXT, request, ContextResponse, request.timeout_ms / 1000 + 1.0)
        except BusError as exc:
            raise _raise(exc) from exc
        if answer.status == "error":
            raise _failed(answer.reason)
        if answer.degraded:
            response.headers[CONTEXT_DEGRADED_HEADER] = (answer.reason or "degraded")[:200]
        return answer

    @router.post("/memory/notes", status_code=status.HTTP_201_CREATED, response_model=UserNote, tags=["sessions"])
    async def save_note(body: NoteBody, scopes: Scopes) -> UserNote:
        """Remember a note about the user; a note equal to a stored one (case, spacing and
        punctuation aside) returns the stored one."""
        answer = await ask(subjects.MEMORY_NOTE_SAVE, SaveUserNoteRequest(
            scopes=scopes, text=body.text, source=body.source, session_id=body.session_id))
        if answer.note is None:
            raise HTTPException(status.HTTP_502_BAD_GATEWAY, "the sessions service saved no note")
        return answer.note

    @router.get("/memory/notes", response_model=list[UserNote], tags=["sessions"])
    async def list_notes(scopes: Scopes, limit: Annotated[int, Query(ge=1, le=1000)] = 50) -> list[UserNote]:
        """The notes, newest first."""
        return (await ask(subjects.MEMORY_NOTES_LIST, ListUserNotesRequest(scopes=scopes, limit=limit))).notes

    @router.delete("/memory/notes/{uuid}", response_model=Result, tags=["sessions"],
                   responses={404: {"description": "No note with this uuid in the memory group."}})
    async def delete_note(uuid: PathNoteUuid, scopes: Scopes) -> Result:
        await ask(subjects.MEMORY_NOTE_DELETE, DeleteUserNoteRequest(scopes=scopes, uuid=uuid), f"note {uuid}")
        return Result(message="Note deleted", success=True)

    @router.put("/memory/preferences/{key}", response_model=UserPreference, tags=["sessions"])
    async def set_preference(key: PathKey, body: PreferenceBody, scopes: Scopes) -> UserPreference:
        """Set a preference: the latest value wins, the earlier one stays in the history."""
        answer = await ask(subjects.MEMORY_PREFERENCE_SET, SetUserPreferenceRequest(
            scopes=scopes, key=key, value=body.value, source=body.source, session_id=body.session_id))
        if answer.preference is None:
            raise HTTPException(status.HTTP_502_BAD_GATEWAY, "the sessions service saved no preference")
        return answer.preference

    @router.get("/memory/preferences", response_model=list[UserPreference], tags=["sessions"])
    async def get_preferences(scopes: Scopes, include_history: bool = False) -> list[UserPreference]:
        """The current preferences; with ``include_history`` also the earlier and removed values."""
        request = GetUserPreferencesRequest(scopes=scopes, include_history=include_history)
        return (await ask(subjects.MEMORY_PREFERENCE_GET, request)).preferences

    @router.delete("/memory/preferences/{key}", response_model=UserPreference, tags=["sessions"],
                   responses={404: {"description": "The key has no current value."}})
    async def remove_preference(key: PathKey, scopes: Scopes) -> UserPreference:
        """End the key's current value (it stays in the history); returns the ended value."""
        answer = await ask(subjects.MEMORY_PREFERENCE_REMOVE, RemoveUserPreferenceRequest(scopes=scopes, key=key),
                           f"preference {key}")
        if answer.preference is None:
            raise HTTPException(status.HTTP_502_BAD_GATEWAY, "the sessions service ended no preference")
        return answer.preference

    @router.get("/memory/sessions", response_model=list[SessionRecord], tags=["sessions"])
    async def list_sessions(scopes: Scopes, limit: Annotated[int, Query(ge=1, le=1000)] = 20) -> list[SessionRecord]:
        """Closed session segments with their summaries, newest first."""
        return (await ask(subjects.MEMORY_SESSIONS_LIST, ListSessionsRequest(scopes=scopes, limit=limit))).sessions

    @router.post("/memory/activities", status_code=status.HTTP_201_CREATED, response_model=UserActivity,
                 tags=["sessions"])
    async def log_activity(body: ActivityBody, scopes: Scopes) -> UserActivity:
        """Log what the agent did for the user (the oldest entries past ENGRAM_SESSION_ACTIVITIES_KEPT
        are deleted); an entry with a logged ``activity_id`` returns the logged one."""
        answer = await ask(subjects.MEMORY_ACTIVITY_LOG, LogActivityRequest(
            scopes=scopes, text=body.text, kind=body.kind, occurred_at=body.occurred_at,
            activity_id=body.activity_id, source=body.source, session_id=body.session_id))
        if answer.activity is None:
            raise HTTPException(status.HTTP_502_BAD_GATEWAY, "the sessions service logged no activity")
        return answer.activity

    @router.get("/memory/activities", response_model=list[UserActivity], tags=["sessions"])
    async def list_activities(
        scopes: Scopes, limit: Annotated[int, Query(ge=1, le=1000)] = 50,
        kind: Annotated[str | None, Query(pattern=ACTIVITY_KIND_PATTERN, description="Only this kind.")] = None,
    ) -> list[UserActivity]:
        """The activity log, newest first."""
        request = ListActivitiesRequest(scopes=scopes, limit=limit, kind=kind)
        return (await ask(subjects.MEMORY_ACTIVITIES_LIST, request)).activities

    @router.delete("/memory/activities/{uuid}", response_model=Result, tags=["sessions"],
                   responses={404: {"description": "No activity with this uuid in the memory group."}})
    async def delete_activity(uuid: PathNoteUuid, scopes: Scopes) -> Result:
        await ask(subjects.MEMORY_ACTIVITY_DELETE, DeleteActivityRequest(scopes=scopes, uuid=uuid), f"activity {uuid}")
        return Result(message="Activity deleted", success=True)

    @router.post("/memory/favorites", status_code=status.HTTP_201_CREATED, response_model=UserFavorite,
                 tags=["sessions"])
    async def add_favorite(body: FavoriteBody, scopes: Scopes) -> UserFavorite:
        """Mark an item as the user's favorite; an equal one (same kind) returns the stored one."""
        answer = await ask(subjects.MEMORY_FAVORITE_ADD, AddFavoriteRequest(
            scopes=scopes, item=body.item, kind=body.kind, source=body.source, session_id=body.session_id))
        if answer.favorite is None:
            raise HTTPException(status.HTTP_502_BAD_GATEWAY, "the sessions service stored no favorite")
        return answer.favorite

    @router.get("/memory/favorites", response_model=list[UserFavorite], tags=["sessions"])
    async def list_favorites(scopes: Scopes, limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> list[UserFavorite]:
        """The favorites, newest first."""
        return (await ask(subjects.MEMORY_FAVORITES_LIST, ListFavoritesRequest(scopes=scopes, limit=limit))).favorites

    @router.delete("/memory/favorites/{uuid}", response_model=Result, tags=["sessions"],
                   responses={404: {"description": "No favorite with this uuid in the memory group."}})
    async def remove_favorite(uuid: PathNoteUuid, scopes: Scopes) -> Result:
        await ask(subjects.MEMORY_FAVORITE_REMOVE, RemoveFavoriteRequest(scopes=scopes, uuid=uuid), f"favorite {uuid}")
        return Result(message="Favorite removed", success=True)
