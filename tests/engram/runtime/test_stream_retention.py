"""Issue 25, item 4: nothing unprocessed expires silently, and a full stream refuses with a clear
error and loses nothing. Real nats-server; engram's own topology with a small size bound."""

from __future__ import annotations

import time

import nats
import nats.js.errors
import pytest
from nats.js.api import ConsumerConfig

from engram.runtime.stream_retention import (
    FILL_RATIO,
    StreamKeeper,
    is_stream_full,
    processed_floor,
    sweep_processed,
)
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import subjects
from engram.services.gateway.bus import _why

SMALL = 64 * 1024


def small_topology() -> Topology:
    return Topology(partitions=2, duplicate_window_s=60.0, ack_wait_s=30.0, max_bytes=SMALL)


async def _fill(js, subject: str, body: bytes, limit: int = 10_000) -> tuple[int, Exception]:  # noqa: ANN001
    """Publish until the stream refuses; returns (stored, the refusal)."""
    for stored in range(limit):
        try:
            await js.publish(subject, body, headers={subjects.HDR_MSG_ID: f"fill-{subject}-{stored}"})
        except nats.js.errors.APIError as exc:
            return stored, exc
    raise AssertionError(f"{subject}: {limit} messages stored, never refused")


async def _process(js, stream: str, durable: str, n: int) -> int:  # noqa: ANN001
    """Acknowledge up to ``n`` messages of ``durable``, as its stage would after processing them."""
    sub = await js.pull_subscribe_bind(durable, stream)
    done = 0
    while done < n:
        try:
            msgs = await sub.fetch(min(100, n - done), timeout=1)
        except nats.errors.TimeoutError:
            break
        for msg in msgs:
            await msg.ack_sync()
            done += 1
    await sub.unsubscribe()
    return done


def test_work_streams_have_no_age_and_refuse_when_full_and_the_audit_stream_drops_its_oldest() -> None:
    t = small_topology()
    for cfg in (t.input_stream(), t.episode_stream(), t.delta_stream(), t.sessions_stream(), t.dlq_stream()):
        assert not cfg.max_age, cfg.name  # an unprocessed message never expires
        assert cfg.max_bytes == SMALL and cfg.discard.value == "new", cfg.name
    assert t.summary_stream().max_bytes == SMALL and t.summary_stream().discard.value == "old"
    assert t.schedule_stream().max_bytes == SMALL  # schedules refuse discard NEW (nats-server 10052)


async def test_a_full_input_stream_refuses_with_a_clear_error_and_loses_nothing(clean_nats: str) -> None:
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    t = small_topology()
    await ensure_topology(js, t)
    body = b"x" * 2000
    stored, refusal = await _fill(js, "engram.in.message.s1", body)
    assert stored > 10 and is_stream_full(refusal)
    assert "input stream is full" in _why(refusal)  # what the gateway's 503 says
    info = await js.stream_info(subjects.STREAM_IN)
    assert info.state.messages == stored  # every accepted message is there, nothing dropped for room
    keeper = StreamKeeper([subjects.STREAM_IN], retention_s=0.0)
    await keeper.run_once(js)
    assert FILL_RATIO.labels(stream=subjects.STREAM_IN)._value.get() > 0.9

    # The unprocessed messages stay however old they are: the sweep removes nothing yet.
    assert await sweep_processed(js, subjects.STREAM_IN, retention_s=0.0, now=time.time() + 365 * 86400) == 0
    assert (await js.stream_info(subjects.STREAM_IN)).state.messages == stored

    # The stage processes half: only what it acknowledged (and is past the retention) goes.
    p = int((await js.get_msg(subjects.STREAM_IN, seq=1)).subject.split(".")[2])
    durable = Topology.turn_detector_durable(p)
    half = await _process(js, subjects.STREAM_IN, durable, stored // 2)
    assert half == stored // 2
    assert await processed_floor(js, subjects.STREAM_IN) == half + 1
    assert await sweep_processed(js, subjects.STREAM_IN, retention_s=3600.0) == 0  # processed, but recent
    assert await sweep_processed(js, subjects.STREAM_IN, retention_s=0.0, now=time.time() + 1) == half
    left = await js.stream_info(subjects.STREAM_IN)
    assert left.state.messages == stored - half and left.state.first_seq == half + 1
    # ... and the stream takes messages again
    ack = await js.publish("engram.in.message.s1", body, headers={subjects.HDR_MSG_ID: "after-sweep"})
    assert ack.seq == stored + 1
    await nc.close()


async def test_the_sweep_waits_for_every_durable_consumer(clean_nats: str) -> None:
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    await ensure_topology(js, small_topology())
    for i in range(6):
        await js.publish("engram.session.closed.s1", b"{}", headers={subjects.HDR_MSG_ID: f"c{i}"})
    # a second durable reader of the same stream (a tool, another stage) that is behind
    await js.add_consumer(subjects.STREAM_SESSIONS, ConsumerConfig(durable_name="audit", ack_policy="explicit"))
    assert await _process(js, subjects.STREAM_SESSIONS, Topology.SESSIONS_DURABLE, 6) == 6
    assert await _process(js, subjects.STREAM_SESSIONS, "audit", 2) == 2
    later = time.time() + 10
    assert await sweep_processed(js, subjects.STREAM_SESSIONS, 0.0, now=later) == 2  # what both processed
    assert await _process(js, subjects.STREAM_SESSIONS, "audit", 10) == 4
    assert await sweep_processed(js, subjects.STREAM_SESSIONS, 0.0, now=later) == 4
    # a stream without any durable consumer keeps everything (the dead letters: until replayed)
    await js.publish("engram.dlq.extractor", b"{}", headers={subjects.HDR_MSG_ID: "d1"})
    assert await processed_floor(js, subjects.STREAM_DLQ) is None
    assert await sweep_processed(js, subjects.STREAM_DLQ, 0.0, now=later) == 0
    await nc.close()


async def test_an_existing_stream_holding_more_than_the_new_bound_keeps_its_messages_and_its_bound(clean_nats: str) -> None:
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    await ensure_topology(js, Topology(partitions=2, duplicate_window_s=60.0, ack_wait_s=30.0))  # 2 GiB
    for i in range(60):
        await js.publish("engram.episode.g1", b"y" * 2000, headers={subjects.HDR_MSG_ID: f"e{i}"})
    # 120 KB held > 64 KiB: with that bound the stream would refuse every new message at once
    await ensure_topology(js, small_topology())
    info = await js.stream_info(subjects.STREAM_EPISODES)
    assert info.state.messages == 60 and info.config.max_bytes > SMALL and not info.config.max_age
    await nc.close()


@pytest.mark.parametrize("code", [10077, 10047])
def test_stream_full_is_recognised_by_code(code: int) -> None:
    assert is_stream_full(nats.js.errors.ServiceUnavailableError(code=503, err_code=code, description="x"))
    assert not is_stream_full(nats.js.errors.ServiceUnavailableError(code=503, err_code=10008, description="x"))


async def test_engram_ingest_into_a_full_input_stream_stops_saying_so(clean_nats: str) -> None:
    from datetime import datetime, timezone

    from engram.publishing.ingest import TranscriptError, publish_events
    from engram.schemas import ChatMessage

    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    await ensure_topology(js, small_topology())
    stored, _ = await _fill(js, "engram.in.message.s0", b"z" * 2000)
    message = ChatMessage(message_id="m1", session_id="s1", role="user", content="We switched billing to SQLite.",
                          timestamp=datetime.now(timezone.utc))
    with pytest.raises(TranscriptError, match="input stream is full"):
        await publish_events(js, [message], retry_s=0.5)
    assert (await js.stream_info(subjects.STREAM_IN)).state.messages == stored  # nothing dropped for it
    await nc.close()
