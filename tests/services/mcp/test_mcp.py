"""The MCP server driven by the SDK's own client, against real NATS JetStream and FalkorDB with the
pipeline in-process (turn-detector -> extractor with the rules LLM, recall with graph admin):
over streamable HTTP (the service's ASGI app under uvicorn on a real socket, API key set) and
over stdio (``engram serve mcp --transport stdio`` as a subprocess)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import httpx2
import nats
import pytest
from falkordb import FalkorDB
from prometheus_client import REGISTRY
from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from bench._serve import serve_asgi
from engram.stack.embedded import free_port
from engram.schemas import Episode, subjects
from engram.schemas.ids import episode_id_for
from engram.services.mcp import app as mcp_app
from engram.services.mcp.settings import McpSettings
from tests.services.gateway.test_gateway import ADA, pipeline, settings_for
from tests.services.turn_detector.helpers import read_all, wait_for

KEY = "mcp-test-key"
ADD_OK = (("outcome", "ok"), ("tool", "add_memory"))
EDGE_ERROR = (("outcome", "error"), ("tool", "get_entity_edge"))
TOOLS = {"add_memory", "search_memory_facts", "search_nodes", "get_episodes", "delete_episode", "delete_entity_edge",
         "get_entity_edge", "clear_graph", "get_status", "get_context", "promote", "save_user_note",
         "set_user_preference", "get_user_preferences", "remove_user_preference", "build_communities",
         "summarize_saga", "get_episode_entities", "add_triplet", "log_activity", "list_activities",
         "remove_activity", "add_favorite", "list_favorites", "remove_favorite"}


@contextlib.asynccontextmanager
async def serve_mcp(settings, mcp: McpSettings) -> AsyncIterator[str]:  # noqa: ANN001
    """`engram serve mcp` in-process; yields the base URL."""
    async with serve_asgi(mcp_app.build(settings, mcp).asgi()) as url:
        yield url


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, (tool, result.content)
    if result.structured_content is not None:
        return result.structured_content
    return json.loads(result.content[0].text)


async def _episodes_of(session: ClientSession, group: str) -> list[dict] | None:
    return (await call(session, "get_episodes", group_id=group))["episodes"] or None


async def fails(session: ClientSession, tool: str, **arguments: Any) -> str:
    result = await session.call_tool(tool, arguments)
    assert result.is_error, (tool, result)
    return " ".join(getattr(c, "text", "") for c in result.content)


@pytest.mark.slow
async def test_mcp_over_http_adds_finds_and_deletes_a_memory(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    group = f"mcp-{os.getpid()}-{free_port()}"
    # the counters are the process's: other tests in the same run call the tools too
    before = {labels: REGISTRY.get_sample_value("engram_mcp_tool_calls_total", dict(labels)) or 0.0
              for labels in (ADD_OK, EDGE_ERROR)}
    async with pipeline(settings), serve_mcp(settings, McpSettings(api_key=KEY, idle_timeout_s=1)) as base:
        async with httpx.AsyncClient(base_url=base) as raw:
            # the API key guards /mcp (both header forms), not the service's health endpoints
            ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
            accept = {"accept": "application/json, text/event-stream"}
            assert (await raw.post("/mcp", json=ping, headers=accept)).status_code == 401
            assert (await raw.post("/mcp", json=ping, headers={**accept, "x-api-key": "wrong"})).status_code == 401
            assert (await raw.post("/mcp", json=ping, headers={**accept, "authorization": "Bearer wrong"})).status_code == 401
            assert (await raw.get("/healthz")).status_code == 200

        client = httpx2.AsyncClient(headers={"x-api-key": KEY}, timeout=60)
        async with client, streamable_http_client(f"{base}/mcp", http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            assert TOOLS <= {t.name for t in (await session.list_tools()).tools}
            assert (await call(session, "get_status"))["status"] == "ok"

            # group ids as the gateway validates them
            assert "group_id" in (await fails(session, "add_memory", name="x", episode_body="x", group_id="no spaces!"))
            await fails(session, "search_memory_facts", query="x", group_ids=["a/b"])
            await fails(session, "get_episodes", group_id="x" * 201)
            await fails(session, "get_episodes", group_ids=["ok", "not ok"])
            assert "group_id or group_ids" in await fails(session, "get_episodes")
            # Graphiti's community and saga tools answer plainly why not (issue 26, item 8)
            assert "not supported" in await fails(session, "build_communities", group_ids=[group])
            assert "get_context" in await fails(session, "summarize_saga", saga_name="sprint-1")

            # a whole episode: answered after the durable publish, with its episode id
            added = await call(session, "add_memory", name="stack", episode_body=f"user (Ada): {ADA}", group_id=group)
            assert added["stored"] is True and added["episode_id"]
            again = await call(session, "add_memory", name="stack", episode_body=f"user (Ada): {ADA}", group_id=group)
            assert again["duplicate"] is True and again["episode_id"] == added["episode_id"]

            async def episode_written() -> list[dict] | None:
                episodes = (await call(session, "get_episodes", group_id=group))["episodes"]
                return episodes if episodes and all(e["entity_edges"] for e in episodes) else None

            episodes = await wait_for(episode_written, 90, interval=0.25)
            assert [e["uuid"] for e in episodes] == [added["episode_id"]], "the graph episode has the announced id"
            # provenance (Graphiti's get_episode_entities): what the episode wrote, whatever its group
            made = await call(session, "get_episode_entities", episode_uuids=[added["episode_id"], "no-such-episode"])
            assert {e["uuid"] for e in made["edges"]} == set(episodes[0]["entity_edges"]), made
            assert made["nodes"] and all(n["group_id"] == group and n["name"] for n in made["nodes"])
            assert made["not_found"] == ["no-such-episode"]
            assert "not found" in await fails(session, "get_episode_entities", episode_uuids=["no-such-episode"])
            both = await call(session, "get_episodes", group_ids=[group, "mcp-empty-group"])  # Graphiti's form
            assert [e["uuid"] for e in both["episodes"]] == [added["episode_id"]]

            # a fact given whole (Graphiti's add_triplet): no extraction pass, the same provenance tool
            triplet = await call(session, "add_triplet", source_node_name="Ada", edge_name="USES",
                                 fact="Ada uses Emacs for Python.", target_node_name="Emacs", group_id=f"{group}-t")

            async def triplet_written() -> dict | None:
                result = await session.call_tool("get_episode_entities", {"episode_uuids": [triplet["episode_id"]]})
                if result.is_error:  # not in the graph yet
                    return None
                made = result.structured_content or json.loads(result.content[0].text)
                return made if made["edges"] else None

            made = await wait_for(triplet_written, 60, interval=0.25)
            assert [e["fact"] for e in made["edges"]] == ["Ada uses Emacs for Python."]
            assert sorted(n["name"] for n in made["nodes"]) == ["Ada", "Emacs"]
            assert "source_node_name" in await fails(session, "add_triplet", source_node_name="it", edge_name="USES",
                                                     fact="x", target_node_name="Emacs", group_id=f"{group}-t")

            # reference_time (Graphiti's argument): when it was said, the episode's time
            dated = await call(session, "add_memory", name="old", episode_body="user (Ada): We used Flask in 2024.",
                               group_id=f"{group}-dated", reference_time="2024-05-01T10:00:00Z")
            dated_episodes = await wait_for(
                lambda: _episodes_of(session, f"{group}-dated"), 90, interval=0.25)
            assert [e["uuid"] for e in dated_episodes] == [dated["episode_id"]]
            assert dated_episodes[0]["valid_at"].startswith("2024-05-01T10:00:00"), dated_episodes

            found = await call(session, "search_memory_facts", query="FastAPI pydantic", group_ids=[group], max_facts=5)
            assert any("FastAPI" in f["fact"] for f in found["facts"]), found
            # as of a time before it was said, none of it held yet (Graphiti's time filters, issue 26)
            back_then = await call(session, "search_memory_facts", query="FastAPI pydantic", group_ids=[group],
                                   as_of="2001-01-01T00:00:00Z")
            assert back_then["facts"] == [], back_then
            # Graphiti's own forms: flat ranges (a naive time is UTC), one group id alone, node types
            flat = await call(session, "search_memory_facts", query="FastAPI pydantic", group_ids=group,
                              valid_at_after="2001-01-01T00:00:00")
            assert any("FastAPI" in f["fact"] for f in flat["facts"]), flat
            assert (await call(session, "search_memory_facts", query="FastAPI pydantic", group_ids=[group],
                               valid_at_before="2001-01-01T00:00:00Z"))["facts"] == []
            assert "not both" in await fails(session, "search_memory_facts", query="x", group_ids=[group],
                                             valid_at={"after": "2001-01-01T00:00:00Z"},
                                             valid_at_after="2001-01-01T00:00:00Z")
            assert (await call(session, "search_nodes", query="FastAPI", group_ids=[group],
                               entity_types=["Preference"]))["nodes"] == []
            since = await call(session, "search_memory_facts", query="FastAPI pydantic", group_ids=[group], max_facts=5,
                               valid_at={"after": "2001-01-01T00:00:00Z"})
            assert any("FastAPI" in f["fact"] for f in since["facts"]), since
            fact = found["facts"][0]
            assert (await call(session, "get_entity_edge", uuid=fact["uuid"]))["fact"] == fact["fact"]
            nodes = (await call(session, "search_nodes", query="FastAPI", group_ids=[group]))["nodes"]
            assert nodes and all(n["facts"] and n["uuid"] and n["group_id"] == group for n in nodes)
            # named by the graph (engram.graph.entities): each is an endpoint of the facts it comes with
            assert all(n["name"] and any(n["name"].lower() in f.lower() for f in n["facts"]) for n in nodes), nodes
            assert all("summary" in n for n in nodes)
            # entity types are labels: every entity is an Entity; one typed by an ontology (engram/graph/ontology.py)
            # is found by its type, with its attributes
            assert {n["uuid"] for n in (await call(session, "search_nodes", query="FastAPI", group_ids=[group],
                                                   entity_types=["Entity"]))["nodes"]} == {n["uuid"] for n in nodes}
            host, port = falkordb_server.url.split("://", 1)[1].rsplit(":", 1)
            FalkorDB(host=host, port=int(port)).select_graph(group).query(
                "MATCH (n:Entity {uuid: $u}) SET n:Tool, n.language = 'Python'", {"u": nodes[0]["uuid"]})
            tools = (await call(session, "search_nodes", query="FastAPI", group_ids=[group], entity_types=["Tool"]))["nodes"]
            assert [(n["uuid"], n["attributes"]) for n in tools] == [(nodes[0]["uuid"], {"language": "Python"})]

            assert "deleted" in (await call(session, "delete_entity_edge", uuid=fact["uuid"]))["message"]
            assert "not found" in await fails(session, "get_entity_edge", uuid=fact["uuid"])
            after = await call(session, "search_memory_facts", query="FastAPI pydantic", group_ids=[group], max_facts=5)
            assert fact["uuid"] not in {f["uuid"] for f in after["facts"]}

            await call(session, "delete_episode", uuid=added["episode_id"])
            assert (await call(session, "get_episodes", group_id=group))["episodes"] == []
            assert "not found" in await fails(session, "delete_episode", uuid=added["episode_id"])

            # a chat message: its message, turn and episode ids are the ones engram gives it
            msg = await call(session, "add_memory", name="", episode_body="We deploy FastAPI with Docker.",
                             group_id=group, source="message", role_name="Ada")
            assert msg["stored"] is True and msg["turn_id"] == f"{group}:{msg['message_id']}"
            assert msg["episode_id"] == episode_id_for(group, msg["turn_id"])
            episodes = await wait_for(episode_written, 90, interval=0.25)
            assert [e["uuid"] for e in episodes] == [msg["episode_id"]]
            assert episodes[0]["message_ids"] == [msg["message_id"]]

            assert "group_id or group_ids" in await fails(session, "clear_graph")
            cleared = await call(session, "clear_graph", group_ids=[group, f"{group}-t"])  # Graphiti's form
            assert cleared["group_ids"] == [group, f"{group}-t"], cleared
            assert (await call(session, "get_episodes", group_id=group))["episodes"] == []

        async with httpx.AsyncClient(base_url=base) as raw:  # tool metrics, by tool and outcome (no ids)
            metrics = (await raw.get("/metrics")).text
        assert 'engram_mcp_tool_calls_total{outcome="ok",tool="add_memory"}' in metrics
        assert 'engram_mcp_tool_calls_total{outcome="error",tool="get_entity_edge"}' in metrics
        after = {labels: REGISTRY.get_sample_value("engram_mcp_tool_calls_total", dict(labels)) for labels in before}
        assert after[ADD_OK] - before[ADD_OK] == 4.0 and after[EDGE_ERROR] - before[EDGE_ERROR] == 1.0, (before, after)
        assert group not in metrics


@pytest.mark.slow
async def test_mcp_over_stdio(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    engram = shutil.which("engram", path=str(Path(sys.executable).parent))
    assert engram, "the engram console script is installed in the venv"
    env = {**os.environ, "ENGRAM_NATS_URL": clean_nats, "ENGRAM_DATA_DIR": str(tmp_path),
           "GRAPHITI_TELEMETRY_ENABLED": "false"}
    params = StdioServerParameters(command=engram, args=["serve", "mcp", "--transport", "stdio"], env=env)
    group = f"mcp-stdio-{os.getpid()}"
    async with pipeline(settings):
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert TOOLS <= {t.name for t in (await session.list_tools()).tools}
            assert (await call(session, "get_status"))["status"] == "ok"
            await fails(session, "clear_graph", group_id="bad.group")
            added = await call(session, "add_memory", name="stack", episode_body=f"user (Ada): {ADA}", group_id=group,
                               saga="design-notes")
            assert added["stored"] is True
            assert "saga is its chat session" in await fails(session, "add_memory", name="", episode_body="hi",
                                                             group_id=group, source="message", saga="other")
            # stored before the answer: the episode is in ENGRAM_EPISODES under the announced id (the
            # extraction itself is the HTTP test's; here it would only add a wait on a loaded machine)
            nc = await nats.connect(clean_nats)
            try:
                stored = [Episode.model_validate_json(m.data)
                          for m in await read_all(nc.jetstream(), subjects.STREAM_EPISODES)]
            finally:
                await nc.close()
            assert [(e.episode_id, e.group_id) for e in stored] == [(added["episode_id"], group)]
            # Graphiti's saga is engram's session: the episode is stored in it, and says so
            assert stored[0].session_id == "design-notes" and "saga design-notes" in stored[0].source_description
            # request/reply from the subprocess: recall and graph admin answer
            assert "facts" in await call(session, "search_memory_facts", query="FastAPI pydantic", group_ids=[group])
            assert "episodes" in await call(session, "get_episodes", group_id=group)
            assert "cleared" in (await call(session, "clear_graph", group_id=group))["message"]


def test_http_without_a_key_serves_loopback_only(tmp_path) -> None:  # noqa: ANN001
    from engram.settings import EngramSettings

    def settings(host: str) -> EngramSettings:
        return EngramSettings(nats_url="nats://127.0.0.1:1", http_host=host, data_dir=tmp_path)

    with pytest.raises(RuntimeError, match="ENGRAM_MCP_API_KEY"):
        mcp_app.build(settings("0.0.0.0"), McpSettings())
    assert mcp_app.build(settings("0.0.0.0"), McpSettings(api_key=KEY)).api_key == KEY
    assert mcp_app.build(settings("0.0.0.0"), McpSettings(allow_no_auth=True)).api_key == ""
    assert mcp_app.build(settings("127.0.0.1"), McpSettings()).api_key == ""


# Graphiti's MCP server (getzep/graphiti mcp_server/src/graphiti_mcp_server.py, read 2026-11-28): each
# tool and its arguments. engram's tools/list must have all of them (extra tools and arguments allowed).
GRAPHITI_TOOLS = {
    "add_memory": {"name", "episode_body", "group_id", "source", "source_description", "uuid", "reference_time",
                   "excluded_entity_types", "custom_extraction_instructions", "previous_episode_uuids",
                   "update_communities", "saga", "saga_previous_episode_uuid"},
    "search_nodes": {"query", "group_ids", "max_nodes", "entity_types", "center_node_uuid"},
    "search_memory_facts": {"query", "group_ids", "max_facts", "center_node_uuid", "edge_types", "valid_at_after",
                            "valid_at_before", "invalid_at_after", "invalid_at_before"},
    "delete_entity_edge": {"uuid"}, "delete_episode": {"uuid"}, "get_entity_edge": {"uuid"},
    "get_episodes": {"group_ids", "max_episodes"}, "summarize_saga": {"saga_name", "group_id"},
    "build_communities": {"group_ids"},
    "add_triplet": {"source_node_name", "edge_name", "fact", "target_node_name", "group_id", "source_node_uuid",
                    "target_node_uuid"},
    "get_episode_entities": {"episode_uuids"}, "clear_graph": {"group_ids"}, "get_status": set(),
}


async def test_every_graphiti_mcp_tool_with_its_arguments(tmp_path) -> None:  # noqa: ANN001
    from engram.settings import EngramSettings

    settings = EngramSettings(nats_url="nats://127.0.0.1:1", data_dir=tmp_path)  # listing tools connects to nothing
    *_, server = mcp_app._parts(settings, McpSettings())
    ours = {t.name: set((t.input_schema or {}).get("properties", {})) for t in await server.list_tools()}
    missing = {tool: sorted(args - ours.get(tool, set())) for tool, args in GRAPHITI_TOOLS.items()
               if tool not in ours or args - ours[tool]}
    assert not missing, missing
