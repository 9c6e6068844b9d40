"""The MCP server as `engram up` runs it: its own least-privilege NATS user (engram/runtime/auth.py) and
inbox prefix, the other services as subprocesses. An MCP client over streamable HTTP adds a whole
episode (a publish into ENGRAM_EPISODES, which only the mcp user among the request-side users
may do), finds its fact and clears the group, and the NATS server logs no permission violation."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.engram.cli.test_cli_up import Up
from tests.services.gateway.test_gateway import ADA
from tests.services.mcp.test_mcp import call
from tests.services.turn_detector.helpers import wait_for


@pytest.mark.slow
async def test_mcp_under_engram_up_with_least_privilege(tmp_path: Path) -> None:
    up = Up(tmp_path / "engram")
    try:
        rt = up.runtime
        assert rt["nats_auth"], "engram up runs its services as their own NATS users by default"
        url = rt["services"]["mcp"]["url"] + "/mcp"
        client = httpx2.AsyncClient(timeout=60)
        async with client, streamable_http_client(url, http_client=client) as (read, write), \
                ClientSession(read, write) as session:
            await session.initialize()
            assert (await call(session, "get_status"))["status"] == "ok"
            added = await call(session, "add_memory", name="stack", episode_body=f"user (Ada): {ADA}", group_id="mcp-up")
            assert added["stored"] is True

            async def written() -> list[dict] | None:
                episodes = (await call(session, "get_episodes", group_id="mcp-up"))["episodes"]
                return episodes if episodes and all(e["entity_edges"] for e in episodes) else None

            assert [e["uuid"] for e in await wait_for(written, 90, interval=0.5)] == [added["episode_id"]]
            found = await call(session, "search_memory_facts", query="FastAPI pydantic", group_ids=["mcp-up"])
            assert any("FastAPI" in f["fact"] for f in found["facts"])
            await call(session, "clear_graph", group_id="mcp-up")
        # an MCP host's stdio server with no engram setting at all finds the running stack (the README's
        # host config under `engram up`: engram/stack/last_stack.py)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
        env["XDG_DATA_HOME"] = str(tmp_path / "xdg-data")  # nothing on the default data dir
        engram = shutil.which("engram", path=str(Path(sys.executable).parent))
        params = StdioServerParameters(command=engram, args=["serve", "mcp", "--transport", "stdio"], env=env)
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            assert (await call(session, "get_status"))["status"] == "ok"
        violations = [line for line in (tmp_path / "engram" / "logs" / "nats.log").read_text().splitlines()
                      if "Violation" in line]
        assert not violations, violations
    finally:
        assert up.stop() == 0, up.log_tail()
