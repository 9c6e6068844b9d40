"""engram ingest rides out a NATS restart: every event lands exactly once, in order (issue 16)."""

from __future__ import annotations

import asyncio
import signal
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nats

from engram.stack.embedded import free_port, start_nats
from engram.publishing.ingest import publish_events
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import ChatMessage, subjects


def conversation(n: int) -> list[ChatMessage]:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    return [ChatMessage(message_id=f"m{i}", session_id="s-outage", role="user" if i % 2 == 0 else "assistant",
                        content=f"message number {i}", timestamp=t0 + timedelta(seconds=i)) for i in range(n)]


async def test_publish_events_retries_through_a_nats_restart(tmp_path: Path) -> None:
    port = free_port()
    server = start_nats(tmp_path, port=port)
    settings = EngramSettings(nats_url=server.url, data_dir=tmp_path, partitions=1)
    nc = await nats.connect(server.url, reconnect_time_wait=0.2, max_reconnect_attempts=-1)
    js = nc.jetstream(timeout=1.0)
    await ensure_topology(js, Topology.from_settings(settings))
    events = conversation(400)
    published = 0

    def progress() -> None:
        nonlocal published
        published += 1

    task = asyncio.create_task(publish_events(js, events, progress, retry_s=60))
    try:
        while published < 100:
            await asyncio.sleep(0.01)
        server.popen.send_signal(signal.SIGKILL)  # acknowledged messages are fsynced: none lost
        server.popen.wait()
        await asyncio.sleep(1.5)  # publishes fail meanwhile
        assert not task.done()
        server = start_nats(tmp_path, port=port)
        report = await asyncio.wait_for(task, 90)
        assert report.retried >= 1
        info = await js.stream_info(subjects.STREAM_IN)
        assert info.state.messages == len(events)  # none lost, none twice
        got = [ChatMessage.model_validate_json((await js.get_msg(subjects.STREAM_IN, seq)).data).message_id
               for seq in range(info.state.first_seq, info.state.last_seq + 1)]
        assert got == [e.message_id for e in events]  # in order
    finally:
        task.cancel()
        await nc.close()
        server.stop()
