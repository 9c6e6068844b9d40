"""engram's own MCP tools (the session layer) over streamable HTTP, against the sessions service's
request side and recall on real NATS + FalkorDB: preferences and notes round trip, get_context
serves them as the user_context layer, promote stores its episode durably (deterministic id),
and a missing scope or an unknown key is a tool error."""

from __future__ import annotations

import uuid

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from engram.publishing.promote import Promotion, promotion_episode
from engram.settings import EngramSettings
from engram.schemas import Episode, subjects
from engram.services.mcp.settings import McpSettings
from tests.services.gateway.test_memory_routes import sessions_side
from tests.services.mcp.test_mcp import call, fails, serve_mcp
from tests.services.turn_detector.helpers import read_all


async def test_memory_tools_over_mcp(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    import nats

    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path,
                              group_prefix=f"g{uuid.uuid4().hex[:8]}")
    user = "ayse@example.org"
    async with sessions_side(settings), serve_mcp(settings, McpSettings()) as base:
        client = httpx2.AsyncClient(timeout=60)
        async with client, streamable_http_client(f"{base}/mcp", http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            assert "user, workspace or session" in await fails(session, "get_user_preferences")

            first = await call(session, "set_user_preference", key="language", value="Türkçe", user=user)
            assert first["key"] == "language" and first["value"] == "Türkçe" and first["current"]
            await call(session, "set_user_preference", key="language", value="English", user=user)
            current = (await call(session, "get_user_preferences", user=user))["preferences"]
            assert [(p["key"], p["value"]) for p in current] == [("language", "English")]
            history = (await call(session, "get_user_preferences", user=user, include_history=True))["preferences"]
            assert [p["value"] for p in history] == ["English", "Türkçe"]
            ended = await call(session, "remove_user_preference", key="language", user=user)
            assert ended["ended_by"] == "removed"
            assert "not found" in await fails(session, "remove_user_preference", key="language", user=user)

            note = await call(session, "save_user_note", text="Kedisinin adı Pamuk", user=user)
            assert note["text"] == "Kedisinin adı Pamuk" and note["uuid"]
            context = await call(session, "get_context", user=user, query="kedi", timeout_ms=5000)
            layers = {s["layer"]: s for s in context["sections"]}
            assert "Kedisinin adı Pamuk" in layers["user_context"]["text"], context

            promoted = await call(session, "promote", kind="decision", text="We deploy with Docker.", key="team-a")
            expected = promotion_episode(Promotion(kind="decision", text="We deploy with Docker.", key="team-a"),
                                         settings.group_prefix)
            assert promoted["episode_id"] == expected.episode_id and promoted["group_id"] == expected.group_id
            again = await call(session, "promote", kind="decision", text="We deploy with Docker.", key="team-a")
            assert again["episode_id"] == promoted["episode_id"]

    nc = await nats.connect(clean_nats)
    try:
        stored = [Episode.model_validate_json(m.data) for m in await read_all(nc.jetstream(), subjects.STREAM_EPISODES)]
    finally:
        await nc.close()
    assert [e.episode_id for e in stored] == [expected.episode_id], "stored once, before promote answered"


async def test_activity_and_favorite_tools_over_mcp(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path,
                              group_prefix=f"g{uuid.uuid4().hex[:8]}")
    user = "ada@example.org"
    async with sessions_side(settings), serve_mcp(settings, McpSettings()) as base:
        client = httpx2.AsyncClient(timeout=60)
        async with client, streamable_http_client(f"{base}/mcp", http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            assert "user, workspace or session" in await fails(session, "log_activity", text="x")
            entry = await call(session, "log_activity", text="RAG search: Python tutorials", kind="search",
                               activity_id="call-1", user=user)
            assert entry["kind"] == "search" and entry["uuid"]
            assert (await call(session, "log_activity", text="RAG search: Python tutorials", kind="search",
                               activity_id="call-1", user=user)) == entry  # a retried tool call logs once
            assert [a["uuid"] for a in (await call(session, "list_activities", user=user))["activities"]] == [entry["uuid"]]

            favorite = await call(session, "add_favorite", item="Fluent Python", kind="book", user=user)
            assert [f["item"] for f in (await call(session, "list_favorites", user=user))["favorites"]] == ["Fluent Python"]

            context = await call(session, "get_context", user=user, timeout_ms=5000)
            text = {s["layer"]: s for s in context["sections"]}["user_context"]["text"]
            assert "- Fluent Python (book)" in text and "search: RAG search: Python tutorials" in text

            await call(session, "remove_activity", uuid=entry["uuid"], user=user)
            await call(session, "remove_favorite", uuid=favorite["uuid"], user=user)
            assert "not found" in await fails(session, "remove_favorite", uuid=favorite["uuid"], user=user)
            assert (await call(session, "list_activities", user=user))["activities"] == []
            assert (await call(session, "list_favorites", user=user))["favorites"] == []
