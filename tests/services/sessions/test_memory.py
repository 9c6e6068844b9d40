"""Proactive memory over NATS request/reply (services/sessions/memory.py, requests.py) against real
NATS and FalkorDB: seed 004's save_user_note / set_user_preference / get_user_preferences /
remove_user_preference, note listing and deletion, sessions listing; a request naming no scope,
a body that does not parse and a graph that is down are answered (never raised, never echoed)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone

import nats
import pytest
from prometheus_client import REGISTRY

from engram.graph.drivers import GraphDrivers
from engram.runtime.service import ServiceApp, make_broker
from engram.settings import EngramSettings
from engram.schemas import subjects
from engram.schemas.memory import (
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
)
from engram.services.sessions import memory, requests
from engram.services.sessions.store import MemoryStore


@pytest.fixture
async def served(clean_nats, falkordb_server, tmp_path) -> AsyncIterator[tuple[nats.NATS, EngramSettings, MemoryStore]]:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path,
                              group_prefix=f"m{uuid.uuid4().hex[:8]}")
    graphs = GraphDrivers(settings)
    store = MemoryStore(graphs)
    broker = make_broker(settings, service="sessions")
    requests.subscribe(broker, store, settings)
    app = ServiceApp(name="sessions", broker=broker)
    await app.start()
    nc = await nats.connect(clean_nats)
    try:
        yield nc, settings, store
    finally:
        await nc.close()
        await app.stop()
        await graphs.close()


async def call(nc: nats.NATS, subject: str, request: object) -> MemoryResponse:
    body = request if isinstance(request, bytes) else request.model_dump_json().encode()  # type: ignore[attr-defined]
    reply = await nc.request(subject, body, timeout=10)
    return MemoryResponse.model_validate_json(reply.data)


def counted(op: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("engram_memory_requests_total", {"op": op, "outcome": outcome}) or 0.0


async def test_preferences_notes_and_sessions_round_trip(served) -> None:  # noqa: ANN001
    nc, settings, store = served
    ayse = MemoryScopes(user="ayse@example.org", session="chat-1")
    group = subjects.user_group(settings.group_prefix, "ayse@example.org")
    before = counted("preference_set", "ok")

    set_tr = await call(nc, subjects.MEMORY_PREFERENCE_SET, SetUserPreferenceRequest(scopes=ayse, key="language", value="Türkçe"))
    assert set_tr.status == "ok" and set_tr.group_id == group  # the user's group, not the session's
    assert set_tr.preference.key == "language" and set_tr.preference.value == "Türkçe" and set_tr.preference.current
    await call(nc, subjects.MEMORY_PREFERENCE_SET, SetUserPreferenceRequest(scopes=ayse, key="theme", value="dark"))
    await call(nc, subjects.MEMORY_PREFERENCE_SET, SetUserPreferenceRequest(scopes=ayse, key="language", value="English",
                                                                            source="extraction"))
    assert counted("preference_set", "ok") - before == 3

    got = await call(nc, subjects.MEMORY_PREFERENCE_GET, GetUserPreferencesRequest(scopes=ayse))
    assert {(p.key, p.value) for p in got.preferences} == {("language", "English"), ("theme", "dark")}
    history = await call(nc, subjects.MEMORY_PREFERENCE_GET, GetUserPreferencesRequest(scopes=ayse, include_history=True))
    assert [(p.value, p.current) for p in history.preferences if p.key == "language"] == [("English", True), ("Türkçe", False)]

    removed = await call(nc, subjects.MEMORY_PREFERENCE_REMOVE, RemoveUserPreferenceRequest(scopes=ayse, key="theme"))
    assert removed.status == "ok" and removed.preference.ended_by == "removed"
    again = await call(nc, subjects.MEMORY_PREFERENCE_REMOVE, RemoveUserPreferenceRequest(scopes=ayse, key="theme"))
    assert again.status == "not_found"
    got = await call(nc, subjects.MEMORY_PREFERENCE_GET, GetUserPreferencesRequest(scopes=ayse))
    assert [p.key for p in got.preferences] == ["language"]

    first = await call(nc, subjects.MEMORY_NOTE_SAVE, SaveUserNoteRequest(scopes=ayse, text="Django projesi üzerinde çalışıyor",
                                                                          session_id="chat-1"))
    second = await call(nc, subjects.MEMORY_NOTE_SAVE, SaveUserNoteRequest(scopes=ayse, text="Kedisinin adı Pamuk"))
    assert first.note.source == "conversation" and first.note.session_id == "chat-1"
    listed = await call(nc, subjects.MEMORY_NOTES_LIST, ListUserNotesRequest(scopes=ayse))
    assert [n.uuid for n in listed.notes] == [second.note.uuid, first.note.uuid]  # newest first
    deleted = await call(nc, subjects.MEMORY_NOTE_DELETE, DeleteUserNoteRequest(scopes=ayse, uuid=first.note.uuid))
    assert deleted.status == "ok"
    gone = await call(nc, subjects.MEMORY_NOTE_DELETE, DeleteUserNoteRequest(scopes=ayse, uuid=first.note.uuid))
    assert gone.status == "not_found"
    assert [n.text for n in (await call(nc, subjects.MEMORY_NOTES_LIST, ListUserNotesRequest(scopes=ayse))).notes] == [
        "Kedisinin adı Pamuk"]

    await store.save_session(group, SessionRecord(
        session_id="chat-1", segment=0, segment_id="chat-1-0-0", summary="Özet.", summary_source="llm",
        close_reason="idle", closed_at=datetime(2026, 3, 1, tzinfo=timezone.utc)))
    sessions = await call(nc, subjects.MEMORY_SESSIONS_LIST, ListSessionsRequest(scopes=ayse))
    assert [(s.session_id, s.summary) for s in sessions.sessions] == [("chat-1", "Özet.")]

    # a workspace-only request is the workspace's memory, a different group
    ws = await call(nc, subjects.MEMORY_PREFERENCE_GET, GetUserPreferencesRequest(scopes=MemoryScopes(workspace="/repo")))
    assert ws.group_id == subjects.workspace_group(settings.group_prefix, "/repo") and ws.preferences == []


async def test_no_scope_and_bad_bodies_are_answered_not_raised(served) -> None:  # noqa: ANN001
    nc, _, _ = served
    for subject in subjects.MEMORY_SUBJECTS:
        model = memory.OPERATIONS[subject].model
        fields = {"text": "x", "key": "k", "value": "v", "uuid": "u", "item": "i"}
        request = model.model_validate({"scopes": {}, **{k: v for k, v in fields.items() if k in model.model_fields}})
        answer = await call(nc, subject, request)
        assert answer.status == "error" and answer.reason == memory.NO_SCOPE, subject
    bad = await call(nc, subjects.MEMORY_NOTE_SAVE,
                     '{"scopes": {"user": "u"}, "text": "gizli not", "source": "elsewhere"}'.encode())
    assert bad.status == "error" and bad.reason == "bad_request: source: literal_error" and "gizli" not in bad.reason
    junk = await call(nc, subjects.MEMORY_PREFERENCE_SET, b"{")
    assert junk.status == "error" and junk.reason.startswith("bad_request: ")
    assert counted("note_save", "bad_request") >= 2


async def test_a_graph_that_is_down_is_a_backend_error(falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = EngramSettings(graph_url="falkor://127.0.0.1:1", data_dir=tmp_path)
    graphs = GraphDrivers(settings)
    try:
        body = SaveUserNoteRequest(scopes=MemoryScopes(user="u"), text="not").model_dump_json().encode()
        response, outcome = await memory.answer(subjects.MEMORY_NOTE_SAVE, body, MemoryStore(graphs), "engram")
        assert outcome == "error" and response.status == "error" and response.reason.startswith("backend_error: ")
    finally:
        await graphs.close()


async def test_the_sessions_service_serves_memory_and_context(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """services/sessions/app.py's build() wires requests.subscribe: `engram serve sessions` answers."""
    from engram.schemas.memory import ContextRequest, ContextResponse
    from engram.services.sessions import app as sessions_app

    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path,
                              group_prefix=f"a{uuid.uuid4().hex[:8]}")
    app = sessions_app.build(settings)
    await app.start()
    nc = await nats.connect(clean_nats)
    try:
        scopes = MemoryScopes(user="ayse")
        await call(nc, subjects.MEMORY_PREFERENCE_SET, SetUserPreferenceRequest(scopes=scopes, key="dil", value="Türkçe"))
        reply = await nc.request(subjects.CONTEXT, ContextRequest(scopes=scopes).model_dump_json().encode(), timeout=10)
        context = ContextResponse.model_validate_json(reply.data)
        assert [s.layer for s in context.sections] == ["user_context"] and "- dil: Türkçe" in context.prompt
    finally:
        await nc.close()
        await app.stop()


async def test_activities_and_favorites_round_trip_and_reach_the_user_context(served) -> None:  # noqa: ANN001
    """Seed 004's log_activity and add_favorite (and their list/remove) over NATS, stored in the
    memory group, scrubbed, and shown in the context's user_context layer."""
    nc, settings, _ = served
    ada = MemoryScopes(user="ada@example.org", session="chat-7")
    group = subjects.user_group(settings.group_prefix, "ada@example.org")
    t0 = datetime.now(timezone.utc) - timedelta(hours=1)
    before = counted("activity_log", "ok")

    logged = await call(nc, subjects.MEMORY_ACTIVITY_LOG, LogActivityRequest(
        scopes=ada, text="RAG search: Python tutorials", kind="search", occurred_at=t0, activity_id="req-1"))
    assert logged.status == "ok" and logged.group_id == group and logged.activity.kind == "search"
    retried = await call(nc, subjects.MEMORY_ACTIVITY_LOG, LogActivityRequest(
        scopes=ada, text="RAG search: Python tutorials", kind="search", activity_id="req-1"))
    assert retried.activity == logged.activity  # a retried request (same activity_id) is logged once
    secret = await call(nc, subjects.MEMORY_ACTIVITY_LOG, LogActivityRequest(
        scopes=ada, text="rotated key AKIAIOSFODNN7EXAMPLE for the S3 export", kind="tool",
        occurred_at=t0 + timedelta(minutes=5)))
    assert "AKIAIOSFODNN7EXAMPLE" not in secret.activity.text and "S3 export" in secret.activity.text
    assert counted("activity_log", "ok") - before == 3

    listed = await call(nc, subjects.MEMORY_ACTIVITIES_LIST, ListActivitiesRequest(scopes=ada))
    assert [a.kind for a in listed.activities] == ["tool", "search"]  # newest first
    only = await call(nc, subjects.MEMORY_ACTIVITIES_LIST, ListActivitiesRequest(scopes=ada, kind="search"))
    assert [a.uuid for a in only.activities] == [logged.activity.uuid]

    fav = await call(nc, subjects.MEMORY_FAVORITE_ADD, AddFavoriteRequest(scopes=ada, item="Fluent Python, 2nd ed.", kind="book"))
    same = await call(nc, subjects.MEMORY_FAVORITE_ADD, AddFavoriteRequest(scopes=ada, item="fluent python 2nd ed", kind="book"))
    assert fav.status == "ok" and same.favorite == fav.favorite
    await call(nc, subjects.MEMORY_FAVORITE_ADD, AddFavoriteRequest(scopes=ada, item="https://docs.djangoproject.com"))
    favorites = (await call(nc, subjects.MEMORY_FAVORITES_LIST, ListFavoritesRequest(scopes=ada))).favorites
    assert [f.item for f in favorites] == ["https://docs.djangoproject.com", "Fluent Python, 2nd ed."]

    reply = await nc.request(subjects.CONTEXT, ContextRequest(scopes=ada).model_dump_json().encode(), timeout=15)
    section = {s.layer: s for s in ContextResponse.model_validate_json(reply.data).sections}["user_context"]
    assert section.source == f"group {group}: 0 preferences, 0 notes, 2 favorites, 2 activities"
    assert "Favorites:\n- https://docs.djangoproject.com\n- Fluent Python, 2nd ed. (book)" in section.text
    assert f"Recent activity:\n- {(t0 + timedelta(minutes=5)).date().isoformat()} tool: rotated key" in section.text
    assert f"- {t0.date().isoformat()} search: RAG search: Python tutorials" in section.text

    # Remove one of each; unknown uuids and another user's memory are not_found.
    assert (await call(nc, subjects.MEMORY_FAVORITE_REMOVE, RemoveFavoriteRequest(scopes=ada, uuid=fav.favorite.uuid))).status == "ok"
    assert (await call(nc, subjects.MEMORY_FAVORITE_REMOVE, RemoveFavoriteRequest(scopes=ada, uuid=fav.favorite.uuid))).status == "not_found"
    bob = MemoryScopes(user="bob@example.org")
    gone = await call(nc, subjects.MEMORY_ACTIVITY_DELETE, DeleteActivityRequest(scopes=bob, uuid=logged.activity.uuid))
    assert gone.status == "not_found"
    assert (await call(nc, subjects.MEMORY_ACTIVITY_DELETE, DeleteActivityRequest(scopes=ada, uuid=logged.activity.uuid))).status == "ok"
    assert [a.kind for a in (await call(nc, subjects.MEMORY_ACTIVITIES_LIST, ListActivitiesRequest(scopes=ada))).activities] == ["tool"]

    # A request naming no scope, or a kind that is not a lowercase word, is a bad request.
    bad = await call(nc, subjects.MEMORY_ACTIVITY_LOG, b'{"scopes": {}, "text": "x"}')
    assert bad.status == "error" and bad.reason.startswith("bad_request")
    bad_kind = await call(nc, subjects.MEMORY_ACTIVITY_LOG, b'{"scopes": {"user": "u"}, "text": "x", "kind": "Not A Kind"}')
    assert bad_kind.status == "error" and "kind" in bad_kind.reason
    future = await call(nc, subjects.MEMORY_ACTIVITY_LOG, LogActivityRequest(
        scopes=ada, text="x", occurred_at=datetime.now(timezone.utc) + timedelta(days=2)))
    assert future.status == "error" and future.reason == "bad_request: occurred_at is in the future"
