"""engram/runtime/topology.py and engram/runtime/stream_migration.py against a real nats-server.

The streams publishers write to (ENGRAM_IN, and ENGRAM_DELTAS) allow no message schedules, so the
server refuses rollup headers there; schedules live in ENGRAM_SCHED and their ticks are sourced
into the right partition. Streams of an older engram, which still allow schedules, are re-created
by the admin step without losing an unprocessed message or a pending schedule."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import string
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest
from nats.js.api import StreamConfig

from engram.runtime import stream_migration
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import subjects

PARTITIONS = 4


@pytest.fixture
async def js(clean_nats: str) -> AsyncIterator[Any]:
    nc = await nats.connect(clean_nats)
    yield nc.jetstream()
    await nc.close()


def topology() -> Topology:
    return Topology(partitions=PARTITIONS, duplicate_window_s=120.0, ack_wait_s=30.0)


def at(seconds: float) -> str:
    return "@at " + (datetime.now(timezone.utc) + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


async def stored(js: Any, stream: str, subject: str = ">") -> list[Any]:
    out: list[Any] = []
    seq = 1
    while True:
        try:
            msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            return out
        out.append(msg)
        seq = msg.seq + 1


async def wait_until(check: Any, timeout: float = 15.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = await check()
        if value or asyncio.get_running_loop().time() > deadline:
            return value
        await asyncio.sleep(0.1)


# --- the hole this closes -------------------------------------------------------------------
@pytest.mark.parametrize(("stream", "subject"), [
    (subjects.STREAM_IN, "engram.in.message.s1"),
    (subjects.STREAM_DELTAS, "engram.delta.g1"),
])
async def test_streams_publishers_write_to_refuse_rollup_and_schedule_headers(js: Any, stream: str, subject: str) -> None:
    await ensure_topology(js, topology())
    kept = await js.publish(subject, b"{}")
    for headers in ({"Nats-Rollup": "all"}, {"Nats-Rollup": "sub"},
                    {"Nats-Schedule": at(1), "Nats-Schedule-Target": subject}):
        with pytest.raises(nats.js.errors.Error):
            await js.publish(subject, b"x", headers=headers)
    assert (await js.get_msg(stream, kept.seq)).data == b"{}"
    info = (await js.stream_info(stream)).config
    assert not info.allow_rollup_hdrs and not info.allow_msg_schedules


async def test_ticks_fire_into_the_partition_of_their_session_and_group(js: Any) -> None:
    """The source's transform hashes the same token with the same function as the stream's own
    transform: a session's idle tick is in its messages' partition (else another durable would
    handle it, out of the session's order), a group's summary tick in its deltas' partition."""
    await ensure_topology(js, topology())
    rng = random.Random(7)
    tokens = ["".join(rng.choices(string.ascii_letters + string.digits + "_-", k=rng.randint(1, 60))) for _ in range(40)]
    for token in tokens:
        await js.publish(subjects.in_message(token), b"{}")
        await js.publish(subjects.delta(token), b"{}")
        await js.publish(subjects.sched_idle(token), token.encode(), stream=subjects.STREAM_SCHED,
                         headers={"Nats-Schedule": at(-5), "Nats-Schedule-Target": subjects.sched_idle_fired(token)})
        await js.publish(subjects.sched_summary(token, "n1"), token.encode(), stream=subjects.STREAM_SCHED,
                         headers={"Nats-Schedule": at(-5), "Nats-Schedule-Target": subjects.sched_summary_fired(token)})

    async def all_ticks() -> bool:
        ins = await js.stream_info(subjects.STREAM_IN)
        deltas = await js.stream_info(subjects.STREAM_DELTAS)
        return ins.state.messages == 2 * len(tokens) and deltas.state.messages == 2 * len(tokens)

    assert await wait_until(all_ticks)
    for stream, prefix in ((subjects.STREAM_IN, "engram.in."), (subjects.STREAM_DELTAS, "engram.delta.")):
        partitions: dict[str, set[str]] = {}
        kinds: dict[str, set[str]] = {}
        for msg in await stored(js, stream):
            parts = msg.subject.removeprefix(prefix).split(".")
            partitions.setdefault(parts[-1], set()).add(parts[0])
            kinds.setdefault(parts[-1], set()).add(parts[1] if len(parts) == 3 else "delta")
        assert set(partitions) == set(tokens)
        assert all(len(p) == 1 for p in partitions.values()), {t: p for t, p in partitions.items() if len(p) > 1}
        if stream == subjects.STREAM_IN:
            assert all(k == {"message", "idle"} for k in kinds.values())
    assert len({msg.subject.split(".")[2] for msg in await stored(js, subjects.STREAM_IN)}) > 1


# --- streams of an older engram ---------------------------------------------------------------
# what an older engram gave its streams: an age bound, no size bound (and schedules refuse discard NEW)
OLD_LIMITS = {"max_age": 7 * 24 * 3600.0, "max_bytes": None, "discard": None}


def legacy_input(t: Topology) -> StreamConfig:
    """ENGRAM_IN as engram made it before ENGRAM_SCHED: schedules in the stream itself."""
    return dataclasses.replace(t.input_stream(), subjects=["engram.in.*.*", "engram.sched.idle.*"], sources=None,
                               allow_msg_schedules=True, allow_rollup_hdrs=None, **OLD_LIMITS)


def legacy_deltas(t: Topology) -> StreamConfig:
    return dataclasses.replace(t.delta_stream(), subjects=["engram.delta.*", "engram.sched.summary.*.*"],
                               sources=None, allow_msg_schedules=True, allow_rollup_hdrs=None, **OLD_LIMITS)


async def make_legacy(js: Any, t: Topology) -> None:
    await js.add_stream(legacy_input(t))
    await js.add_stream(legacy_deltas(t))
    for stream, ccfg in t.consumers():
        if stream in (subjects.STREAM_IN, subjects.STREAM_DELTAS):
            await js.add_consumer(stream, ccfg)


async def drain(js: Any, t: Topology) -> int:
    """Handle (ack) everything the legacy durables have, as the old services would have."""
    acked = 0
    for stream, ccfg in t.consumers():
        if stream not in (subjects.STREAM_IN, subjects.STREAM_DELTAS):
            continue
        sub = await js.pull_subscribe_bind(ccfg.durable_name, stream=stream)
        while (await js.consumer_info(stream, ccfg.durable_name)).num_pending:
            for msg in await sub.fetch(1, timeout=5):
                await msg.ack_sync()
                acked += 1
        await sub.unsubscribe()
    return acked


async def test_an_older_engrams_streams_are_recreated_keeping_pending_schedules_and_sequences(js: Any) -> None:
    t = topology()
    await make_legacy(js, t)
    for i in range(5):
        await js.publish(subjects.in_message(f"s{i}"), b"{}")
    await js.publish(subjects.delta("g1"), b"{}")
    # pending schedules, with the targets an older engram gave them
    await js.publish(subjects.sched_idle("s1"), b'{"tick": "soon"}', stream=subjects.STREAM_IN,
                     headers={"Nats-Schedule": at(3), "Nats-Schedule-Target": subjects.in_idle("s1")})
    await js.publish(subjects.sched_idle("s2"), b'{"tick": "later"}', stream=subjects.STREAM_IN,
                     headers={"Nats-Schedule": at(3600), "Nats-Schedule-Target": subjects.in_idle("s2")})
    await js.publish(subjects.sched_summary("g1", "n1"), b'{"tick": "summary"}', stream=subjects.STREAM_DELTAS,
                     headers={"Nats-Schedule": at(3), "Nats-Schedule-Target": subjects.delta("g1")})
    old_last = (await js.stream_info(subjects.STREAM_IN)).state.last_seq
    # a turn-detector checkpoint further on than the stream (its session's messages aged out)
    kv = await js.create_key_value(bucket=subjects.KV_TURN_SESSIONS, history=64)
    await kv.put("s9", json.dumps({"session_id": "s9", "last_seq": old_last + 40}).encode())
    assert await drain(js, t) == 6

    with pytest.raises(stream_migration.LegacyStreamError, match="engram topology"):
        await ensure_topology(js, t)  # a service: never deletes a stream
    await ensure_topology(js, t, migrate=True)

    for name in (subjects.STREAM_IN, subjects.STREAM_DELTAS):
        cfg = (await js.stream_info(name)).config
        assert not cfg.allow_msg_schedules and not cfg.allow_rollup_hdrs
        assert {c.config.durable_name for c in await js.consumers_info(name)}  # recreated
    state = (await js.stream_info(subjects.STREAM_IN)).state
    assert state.messages == 0 and state.first_seq == old_last + 41
    moved = {m.subject: m for m in await stored(js, subjects.STREAM_SCHED)}
    assert set(moved) == {subjects.sched_idle("s1"), subjects.sched_idle("s2"), subjects.sched_summary("g1", "n1")}
    assert moved[subjects.sched_idle("s2")].headers["Nats-Schedule-Target"] == subjects.sched_idle_fired("s2")

    async def fired() -> list[Any]:
        ins = await stored(js, subjects.STREAM_IN, "engram.in.*.idle.*")
        deltas = await stored(js, subjects.STREAM_DELTAS)
        return ins + deltas if ins and deltas else []

    ticks = await wait_until(fired)
    assert sorted(m.data for m in ticks) == [b'{"tick": "soon"}', b'{"tick": "summary"}']
    assert ticks[0].seq > old_last + 40  # above every checkpoint: the detector handles it
    # a second run finds nothing to migrate and changes nothing
    await ensure_topology(js, t, migrate=True)
    assert (await js.stream_info(subjects.STREAM_IN)).state.first_seq == old_last + 41


async def test_an_older_engrams_stream_with_unprocessed_messages_is_left_as_it_is(js: Any) -> None:
    t = topology()
    await make_legacy(js, t)
    await js.publish(subjects.in_message("s1"), b"{}")
    with pytest.raises(stream_migration.LegacyStreamError, match=r"turn_detector_p\d: 1 pending"):
        await ensure_topology(js, t, migrate=True)
    info = await js.stream_info(subjects.STREAM_IN)
    assert info.config.subjects == legacy_input(t).subjects and info.state.messages == 1
    await drain(js, t)
    await ensure_topology(js, t, migrate=True)
    assert not (await js.stream_info(subjects.STREAM_IN)).config.allow_msg_schedules


async def test_a_migration_cut_short_is_finished_by_the_next_run(js: Any) -> None:
    """Killed after the old stream lost its subjects (publishers refused, schedules not copied yet),
    or after it was deleted: the next run finishes, and the new stream starts above every
    checkpoint."""
    t = topology()
    await make_legacy(js, t)
    await js.publish(subjects.in_message("s1"), b"{}")
    await js.publish(subjects.sched_idle("s1"), b"{}", stream=subjects.STREAM_IN,
                     headers={"Nats-Schedule": at(3600), "Nats-Schedule-Target": subjects.in_idle("s1")})
    await drain(js, t)
    kv = await js.create_key_value(bucket=subjects.KV_TURN_SESSIONS, history=64)
    await kv.put("s1", json.dumps({"session_id": "s1", "last_seq": 1}).encode())
    await js.update_stream(dataclasses.replace(legacy_input(t), subjects=[]))  # step 2 done, then killed
    with pytest.raises(nats.js.errors.NoStreamResponseError):
        await js.publish(subjects.in_message("s1"), b"{}", timeout=1)  # publishers wait (and retry)
    await ensure_topology(js, t, migrate=True)
    assert [m.subject for m in await stored(js, subjects.STREAM_SCHED)] == [subjects.sched_idle("s1")]

    await js.delete_stream(subjects.STREAM_IN)  # as if killed between delete and create
    await ensure_topology(js, t)
    assert (await js.stream_info(subjects.STREAM_IN)).state.first_seq == 2
    ack = await js.publish(subjects.in_message("s1"), b"{}")
    assert ack.seq == 2


async def test_a_transient_store_error_on_stream_create_is_retried(monkeypatch) -> None:  # noqa: ANN001
    """NATS answers 'error creating store for stream' (10049) when a stream of the same name was
    deleted a moment before; the create is retried instead of failing the service's start."""
    from nats.js.api import StreamConfig

    from engram.runtime import topology as topo

    monkeypatch.setattr(topo, "STORE_BUSY_RETRIES", (0.0, 0.0))
    calls: list[str] = []

    async def flaky(cfg: StreamConfig) -> str:
        calls.append(cfg.name)
        if len(calls) < 3:
            raise nats.js.errors.ServerError(code=500, err_code=10049, description="error creating store for stream")
        return "created"

    assert await topo._stream_call(flaky, StreamConfig(name="S")) == "created"
    assert calls == ["S", "S", "S"]

    async def always_busy(cfg: StreamConfig) -> str:
        calls.append(cfg.name)
        raise nats.js.errors.ServerError(code=500, err_code=10049, description="error creating store for stream")

    calls.clear()
    with pytest.raises(nats.js.errors.ServerError):
        await topo._stream_call(always_busy, StreamConfig(name="S"))
    assert len(calls) == 3  # two retries, then the error is raised

    async def other_error(cfg: StreamConfig) -> str:
        calls.append(cfg.name)
        raise nats.js.errors.BadRequestError(code=400, err_code=10058, description="stream name already in use")

    calls.clear()
    with pytest.raises(nats.js.errors.BadRequestError):
        await topo._stream_call(other_error, StreamConfig(name="S"))
    assert calls == ["S"]  # no retry for an error that is not transient
