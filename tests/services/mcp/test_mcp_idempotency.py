"""MCP add_memory without uuid (issue 23 item 2): an identical call within the retry window
(ENGRAM_MCP_RETRY_WINDOW_S, 1 s here) is a retry and stores nothing new; the same words later are
a new memory (they used to be dropped as a duplicate forever). A uuid stays idempotent forever.
The tools over real NATS JetStream, without the MCP transport (test_mcp.py covers that)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from engram.runtime.service import make_broker
from engram.settings import EngramSettings
from engram.services.gateway.bus import Bus
from engram.services.mcp.settings import McpSettings
from engram.services.mcp.tools import EngramTools

WINDOW_S = 1.0


async def test_add_memory_retry_window_and_uuid(clean_nats: str, tmp_path: Path) -> None:
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=2)
    broker = make_broker(settings, service="mcp")
    bus = Bus(settings, broker, publish_timeout_s=5)
    await bus.start()
    tools = EngramTools(bus, settings, McpSettings(retry_window_s=WINDOW_S))

    async def add(source: str, uuid: str | None = None) -> dict:
        return await tools.add_memory("", "yes", "g_mcp", source, "", uuid, "user", None)

    try:
        for source, id_field in (("message", "message_id"), ("text", "episode_id")):
            first = await add(source)
            retry = await add(source)
            assert (first["stored"], retry["stored"]) == (True, False), source
            assert retry[id_field] == first[id_field]
            await asyncio.sleep(WINDOW_S + 1.5)  # past the window (whole-second TTL)
            later = await add(source)
            assert later["stored"] is True and later[id_field] != first[id_field], f"{source}: said again later"

        with_uuid = await add("message", uuid="m-1")
        await asyncio.sleep(WINDOW_S + 1.5)
        again = await add("message", uuid="m-1")
        assert (with_uuid["stored"], again["stored"]) == (True, False)
        assert again["message_id"] == with_uuid["message_id"] == "m-1"
    finally:
        await broker.stop()
