"""Message size limits at the REST gateway and MCP's add_memory (issue 23, item 5): a message
between NATS's default 1 MB max_payload and engram's cap (ENGRAM_TURN_MAX_MESSAGE_BYTES, 2 MiB) is
stored whole; one above the cap is refused with 413 (MCP: a tool error) naming the limit, and
nothing of it is stored. Real NATS (engram's embedded configuration), real gateway over HTTP."""

from __future__ import annotations

import json

import nats
import pytest

from engram.settings import TurnDetectorSettings
from engram.schemas import subjects
from engram.services.gateway.bus import Bus
from engram.services.mcp.settings import McpSettings
from engram.services.mcp.tools import EngramTools, ToolFailed
from engram.runtime.service import make_broker
from tests.services.gateway.test_gateway import serve_gateway, settings_for
from tests.services.turn_detector.helpers import read_all

CAP = TurnDetectorSettings().max_message_bytes


async def _contents(nats_url: str) -> list[str]:
    nc = await nats.connect(nats_url)
    try:
        msgs = await read_all(nc.jetstream(), subjects.STREAM_IN, "engram.in.*.message.*")
    finally:
        await nc.close()
    return [json.loads(m.data)["content"] for m in msgs]


async def test_gateway_stores_a_1_5mb_message_and_answers_413_above_the_cap(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    big = "x" * 1_500_000 + "MIDDLE" + "y" * 10
    async with serve_gateway(settings) as http:
        r = await http.post("/messages", json={"group_id": "g_size", "messages": [
            {"role_type": "user", "role": "Ada", "content": big}]})
        assert r.status_code == 202, r.text
        r = await http.post("/messages", json={"group_id": "g_size", "messages": [
            {"role_type": "user", "role": "Ada", "content": "short"},
            {"role_type": "assistant", "content": "z" * (CAP + 1)}]})
        assert r.status_code == 413, r.text
        detail = r.json()["detail"]
        assert detail.startswith("message 2: ") and f"limit of {CAP} bytes (ENGRAM_TURN_MAX_MESSAGE_BYTES)" in detail
        assert "zzz" not in r.text
    assert await _contents(clean_nats) == [big]  # whole; nothing of the refused request


async def test_mcp_add_memory_names_the_limit(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    mcp = McpSettings()
    bus = Bus(settings, make_broker(settings, service="mcp"), publish_timeout_s=mcp.publish_timeout_s)
    await bus.start()
    try:
        tools = EngramTools(bus, settings, mcp)
        for source in ("message", "text"):
            with pytest.raises(ToolFailed, match=rf"not stored: .*limit of {CAP} bytes \(ENGRAM_TURN_MAX_MESSAGE_BYTES\)"):
                await tools.add_memory("n", "w" * (CAP + 1), "g_mcp_size", source, "", None, "user", None)
        stored = await tools.add_memory("n", "v" * 1_500_000, "g_mcp_size", "message", "", None, "user", None)
        assert stored["stored"] is True
    finally:
        await bus.broker.stop()
    assert [len(c) for c in await _contents(clean_nats)] == [1_500_000]
