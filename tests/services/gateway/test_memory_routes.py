"""The gateway's session routes (services/gateway/memory_routes.py) over a real socket, with the
sessions service's request side and recall on real NATS + FalkorDB: notes and preferences
round trip, POST /context returns the layered context within its budgets, errors follow the
gateway's conventions (400 no scope, 404 unknown, 401 without the key, 503 when no sessions
service answers) and content is never echoed in a validation error."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator

import pytest
from pydantic import SecretStr

from engram.graph.drivers import GraphDrivers
from engram.runtime.service import ServiceApp, make_broker
from engram.settings import EngramSettings
from engram.text.tokens import token_counter
from engram.schemas import subjects
from engram.services.gateway.settings import GatewaySettings
from engram.services.recall import app as rc_app
from engram.services.sessions import requests
from engram.services.sessions.store import MemoryStore
from tests.services.gateway.test_gateway import serve_gateway


@contextlib.asynccontextmanager
async def sessions_side(settings: EngramSettings, with_recall: bool = True) -> AsyncIterator[None]:
    graphs = GraphDrivers(settings)
    broker = make_broker(settings, service="sessions")
    requests.subscribe(broker, MemoryStore(graphs), settings)
    apps = [rc_app.build(settings)] if with_recall else []
    apps.append(ServiceApp(name="sessions", broker=broker))
    for app in apps:
        await app.start()
    try:
        yield
    finally:
        for app in reversed(apps):
            await app.stop()
        await graphs.close()


@pytest.fixture
def settings(clean_nats, falkordb_server, tmp_path) -> EngramSettings:  # noqa: ANN001
    return EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path,
                          group_prefix=f"g{uuid.uuid4().hex[:8]}")


async def test_notes_preferences_and_context_over_http(settings: EngramSettings) -> None:
    user = {"user": "ayse@example.org"}
    async with sessions_side(settings), serve_gateway(settings) as http:
        r = await http.get("/memory/preferences")
        assert r.status_code == 400 and "user, workspace or session" in r.json()["detail"]

        r = await http.put("/memory/preferences/language", params=user, json={"value": "Türkçe"})
        assert r.status_code == 200, r.text
        assert r.json()["key"] == "language" and r.json()["value"] == "Türkçe" and r.json()["current"]
        await http.put("/memory/preferences/language", params=user, json={"value": "English", "source": "extraction"})
        await http.put("/memory/preferences/theme", params=user, json={"value": "dark"})
        current = (await http.get("/memory/preferences", params=user)).json()
        assert {(p["key"], p["value"]) for p in current} == {("language", "English"), ("theme", "dark")}
        history = (await http.get("/memory/preferences", params={**user, "include_history": "true"})).json()
        assert [p["value"] for p in history if p["key"] == "language"] == ["English", "Türkçe"]
        r = await http.delete("/memory/preferences/theme", params=user)
        assert r.status_code == 200 and r.json()["ended_by"] == "removed"
        assert (await http.delete("/memory/preferences/theme", params=user)).status_code == 404

        r = await http.post("/memory/notes", params=user, json={"text": "Django projesi üzerinde çalışıyor"})
        assert r.status_code == 201, r.text
        note = r.json()
        await http.post("/memory/notes", params=user, json={"text": "Kedisinin adı Pamuk", "session_id": "chat-1"})
        notes = (await http.get("/memory/notes", params=user)).json()
        assert [n["text"] for n in notes] == ["Kedisinin adı Pamuk", "Django projesi üzerinde çalışıyor"]
        assert (await http.delete(f"/memory/notes/{note['uuid']}", params=user)).json()["success"]
        assert (await http.delete(f"/memory/notes/{note['uuid']}", params=user)).status_code == 404
        assert (await http.get("/memory/sessions", params=user)).json() == []

        r = await http.post("/context", json={
            "scopes": user, "identity": "Sen yardımsever bir asistansın.", "query": "kedi",
            "budgets": {"user_context": 80}, "timeout_ms": 5000})
        assert r.status_code == 200, r.text
        body = r.json()
        assert not body["degraded"] and "X-Engram-Context-Degraded" not in r.headers
        layers = {s["layer"]: s for s in body["sections"]}
        assert list(layers) == ["identity", "user_context"]
        assert "- language: English" in layers["user_context"]["text"]
        count = token_counter()
        assert all(count(s["text"]) == s["tokens"] <= s["budget"] for s in body["sections"])
        assert layers["user_context"]["budget"] == 80

        # validation errors never echo content back
        secret = "çok gizli " * 500
        r = await http.post("/memory/notes", params=user, json={"text": secret})
        assert r.status_code == 422 and "gizli" not in r.text
        r = await http.post("/context", json={"query": secret * 2})
        assert r.status_code == 422 and "gizli" not in r.text


async def test_api_key_and_no_sessions_service(settings: EngramSettings) -> None:
    gateway = GatewaySettings(api_key=SecretStr("k3y"))
    async with serve_gateway(settings, gateway) as http:
        assert (await http.post("/context", json={})).status_code == 401
        assert (await http.get("/memory/notes", params={"user": "u"})).status_code == 401
        r = await http.post("/context", json={"identity": "x"}, headers={"x-api-key": "k3y"})
        assert r.status_code == 503 and "sessions service" in r.json()["detail"] and r.headers["Retry-After"] == "1"
        r = await http.put("/memory/preferences/language", params={"user": "u"}, json={"value": "tr"},
                           headers={"Authorization": "Bearer k3y"})
        assert r.status_code == 503 and subjects.MEMORY_PREFERENCE_SET in r.json()["detail"]


async def test_a_degraded_context_is_served_with_a_header(settings: EngramSettings) -> None:
    async with sessions_side(settings, with_recall=False), serve_gateway(settings) as http:
        r = await http.post("/context", json={"scopes": {"user": "u"}, "identity": "Asistan.", "query": "kedi",
                                              "timeout_ms": 2000})
        assert r.status_code == 200, r.text
        assert r.json()["degraded"] and [s["layer"] for s in r.json()["sections"]] == ["identity"]
        assert r.headers["X-Engram-Context-Degraded"] == "degraded: recall: NoRespondersError"


async def test_activities_and_favorites_over_http(settings: EngramSettings) -> None:
    user = {"user": "ada@example.org"}
    async with sessions_side(settings, with_recall=False), serve_gateway(settings) as http:
        assert (await http.get("/memory/activities")).status_code == 400  # whose memory: no scope
        r = await http.post("/memory/activities", params=user, json={
            "text": "RAG search: Python tutorials", "kind": "search", "activity_id": "req-1",
            "occurred_at": "2026-11-20T10:00:00Z"})
        assert r.status_code == 201, r.text
        entry = r.json()
        assert entry["kind"] == "search" and entry["occurred_at"].startswith("2026-11-20T10:00:00")
        again = await http.post("/memory/activities", params=user, json={
            "text": "RAG search: Python tutorials", "kind": "search", "activity_id": "req-1"})
        assert again.json() == entry  # a retried request is logged once
        await http.post("/memory/activities", params=user, json={"text": "opened the Django docs", "kind": "visit"})
        listed = (await http.get("/memory/activities", params=user)).json()
        assert [a["kind"] for a in listed] == ["visit", "search"]
        assert [a["uuid"] for a in (await http.get("/memory/activities", params={**user, "kind": "search"})).json()] == [
            entry["uuid"]]
        r = await http.post("/memory/activities", params=user, json={"text": "Zq private words", "kind": "Bad Kind"})
        assert r.status_code == 422 and "kind" in r.text and "Zq private" not in r.text  # content never echoed
        assert (await http.delete(f"/memory/activities/{entry['uuid']}", params=user)).json()["success"]
        assert (await http.delete(f"/memory/activities/{entry['uuid']}", params=user)).status_code == 404

        r = await http.post("/memory/favorites", params=user, json={"item": "Fluent Python", "kind": "book"})
        assert r.status_code == 201, r.text
        favorite = r.json()
        assert (await http.post("/memory/favorites", params=user, json={"item": "fluent python", "kind": "book"})).json() == favorite
        assert [f["item"] for f in (await http.get("/memory/favorites", params=user)).json()] == ["Fluent Python"]
        assert (await http.delete(f"/memory/favorites/{favorite['uuid']}", params=user)).json()["success"]
        assert (await http.delete(f"/memory/favorites/{favorite['uuid']}", params=user)).status_code == 404
        assert (await http.get("/memory/favorites", params=user)).json() == []
