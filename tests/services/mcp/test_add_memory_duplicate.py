"""add_memory's answer for something already stored (issue 23): ``stored: false`` comes with a
message saying it was already stored, not "stored durably". The tool's NATS side only
(services/mcp/tools.py over real NATS JetStream: the duplicate is JetStream's own dedupe); the MCP
transport is covered by test_mcp.py."""

from __future__ import annotations

from engram.runtime.service import make_broker
from engram.services.gateway.bus import Bus
from engram.services.mcp.settings import McpSettings
from engram.services.mcp.tools import EngramTools
from tests.services.gateway.test_gateway import settings_for


async def test_a_duplicate_add_memory_says_it_was_already_stored(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path)
    mcp = McpSettings()
    broker = make_broker(settings, service="mcp")
    bus = Bus(settings, broker, publish_timeout_s=mcp.publish_timeout_s)
    await bus.start()
    try:
        tools = EngramTools(bus, settings, mcp)
        for source, role in (("text", "user"), ("message", "user")):
            args = dict(name="stack", episode_body="Ada uses FastAPI.", group_id="g_dup", source=source,
                        source_description="", uuid=None, role=role, role_name="Ada")
            first = await tools.add_memory(**args)
            again = await tools.add_memory(**args)
            assert first["stored"] is True and first["duplicate"] is False, source
            assert "stored durably" in first["message"], source
            assert again["stored"] is False and again["duplicate"] is True, source
            assert "already stored" in again["message"] and "stored durably" not in again["message"], (source, again)
    finally:
        await broker.stop()
