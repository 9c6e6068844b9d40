"""turn-detector against a real NATS JetStream: pairing, scopes, dedupe, idle flush, dead
letters, redelivery after failures at every step."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import subjects
from engram.services.turn_detector import app as td_app
from tests.services.turn_detector.helpers import close, episodes, msg, publish, read_all, scopes, wait_for


def make_settings(nats_url: str, tmp_path: Path, **turn) -> EngramSettings:  # noqa: ANN003
    return EngramSettings(
        nats_url=nats_url,
        data_dir=tmp_path,
        partitions=2,
        turn=TurnDetectorSettings(**{"idle_timeout_s": 120, "max_deliveries": 3, **turn}),
    )


@contextlib.asynccontextmanager
async def running(service, nats_url: str) -> AsyncIterator:  # noqa: ANN001
    """Start a service, yield a JetStream context of a separate client, stop both."""
    await service.start()
    nc = await nats.connect(nats_url)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()
        await service.stop()


@pytest.fixture
async def js(clean_nats: str) -> AsyncIterator:
    nc = await nats.connect(clean_nats)
    yield nc.jetstream()
    await nc.close()


@pytest.fixture
async def detector(clean_nats: str, tmp_path: Path) -> AsyncIterator[td_app.TurnDetector]:
    service = td_app.build(make_settings(clean_nats, tmp_path))
    await service.start()
    yield service.detector  # type: ignore[attr-defined]
    await service.stop()


async def _episodes_when(js, n: int, timeout: float = 15.0):  # noqa: ANN001, ANN202
    async def enough():  # noqa: ANN202
        eps = await episodes(js)
        return eps if len(eps) >= n else None

    return await wait_for(enough, timeout) or await episodes(js)


async def test_pairs_user_assistant_turns_and_flushes_on_close(detector, js) -> None:  # noqa: ANN001
    convo = [("u1", "user", "I moved the API to FastAPI"), ("a1", "assistant", "Noted, FastAPI it is."),
             ("u2", "user", "Also pin pydantic 2"), ("a2", "assistant", "Pinned pydantic==2.14.")]
    for i, (mid, role, text) in enumerate(convo):
        await publish(js, msg("s1", mid, role, text, i))
    await close(js, "s1")
    eps = await _episodes_when(js, 2)
    assert [e.turn_id for e in eps] == ["s1:u1", "s1:u2"]
    assert [e.completed_by for e in eps] == ["next_user", "session_closed"]
    assert eps[0].content == "user: I moved the API to FastAPI\n\nassistant: Noted, FastAPI it is."
    assert [m.message_id for m in eps[1].messages] == ["u2", "a2"]
    assert all(e.group_id == "engram_session_s1" and e.scope == "session" for e in eps)


async def test_assistant_first_runs_merge_and_every_scope_gets_an_episode(detector, js) -> None:  # noqa: ANN001
    sc = scopes(workspace="/repo/engram", user="ada@example.com")
    seq = [("a0", "assistant", "Welcome back."), ("u1", "user", "Fix the build"), ("u2", "user", "please"),
           ("a1", "assistant", "Looking"), ("t1", "tool", "exit code 0"), ("a2", "assistant", "Fixed.")]
    for i, (mid, role, text) in enumerate(seq):
        await publish(js, msg("s2", mid, role, text, i, scopes=sc))
    await close(js, "s2")
    eps = await _episodes_when(js, 6)
    assert len(eps) == 6  # 2 turns x 3 scopes
    by_scope = {}
    for e in eps:
        by_scope.setdefault(e.scope, []).append(e)
    assert set(by_scope) == {"session", "workspace", "user"}
    assert by_scope["workspace"][0].group_id == subjects.workspace_group("engram", "/repo/engram")
    assert "/repo" not in by_scope["workspace"][0].group_id
    first, second = by_scope["session"]
    assert [m.message_id for m in first.messages] == ["a0"]
    assert [m.message_id for m in second.messages] == ["u1", "u2", "a1", "t1", "a2"]
    assert second.content.startswith("user: Fix the build\nplease\n\nassistant: Looking\n\ntool: exit code 0")
    # the same turn has one episode id per group, stable across runs
    assert len({e.episode_id for e in eps}) == 6


async def test_duplicates_are_dropped_by_server_and_by_message_id(detector, js) -> None:  # noqa: ANN001
    await publish(js, msg("s3", "u1", "user", "hello", 0))
    await publish(js, msg("s3", "u1", "user", "hello", 0))  # same Nats-Msg-Id: dropped by the server
    await publish(js, msg("s3", "u1", "user", "hello", 0), msg_id="other-id")  # new id, same message_id
    await publish(js, msg("s3", "a1", "assistant", "hi", 1))
    await publish(js, msg("s3", "a1", "assistant", "hi", 1), msg_id="again")
    await close(js, "s3")
    eps = await _episodes_when(js, 1)
    await wait_for(lambda: _consumers_idle(js), 10)
    eps = await episodes(js)
    assert len(eps) == 1
    assert [m.message_id for m in eps[0].messages] == ["u1", "a1"]


async def _consumers_idle(js) -> bool:  # noqa: ANN001
    infos = await js.consumers_info(subjects.STREAM_IN)
    return all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos if c.config.durable_name)


async def test_out_of_order_timestamps_are_kept_in_arrival_order_and_flagged_late(detector, js) -> None:  # noqa: ANN001
    await publish(js, msg("s4", "u1", "user", "first", 10))
    await publish(js, msg("s4", "a1", "assistant", "reply", 11))
    await publish(js, msg("s4", "u2", "user", "second", 12))
    await publish(js, msg("s4", "a0", "assistant", "a late echo", 5))  # timestamp before turn 1 ended
    await close(js, "s4")
    eps = await _episodes_when(js, 2)
    assert [m.message_id for m in eps[1].messages] == ["u2", "a0"]
    assert eps[1].stats.late_messages == 1
    assert eps[0].stats.late_messages == 0


async def test_system_excluded_by_default_and_secrets_scrubbed(detector, js) -> None:  # noqa: ANN001
    key = "sk-proj-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    await publish(js, msg("s5", "sys", "system", "You are a helpful agent", 0))
    await publish(js, msg("s5", "u1", "user", f"use OPENAI_API_KEY={key} for the call", 1))
    await publish(js, msg("s5", "a1", "assistant", "ok", 2))
    await close(js, "s5")
    eps = await _episodes_when(js, 1)
    assert len(eps) == 1
    assert "helpful agent" not in eps[0].content
    assert key not in eps[0].content and "[REDACTED:" in eps[0].content
    assert eps[0].stats.secrets_scrubbed >= 1


async def test_idle_timeout_flushes_the_last_turn(clean_nats, tmp_path) -> None:  # noqa: ANN001
    service = td_app.build(make_settings(clean_nats, tmp_path, idle_timeout_s=1.0))
    async with running(service, clean_nats) as js:
        await publish(js, msg("s6", "u1", "user", "question", 0))
        await publish(js, msg("s6", "a1", "assistant", "answer", 1))
        eps = await _episodes_when(js, 1, timeout=20)
        assert len(eps) == 1 and eps[0].completed_by == "idle"
        assert [m.message_id for m in eps[0].messages] == ["u1", "a1"]


BAD_INPUTS = [
    ("malformed_json", b"{not json", "s7"),
    ("schema", json.dumps({"message_id": "m1", "session_id": "s7", "role": "robot", "content": "x",
                           "timestamp": "2026-01-01T00:00:00Z"}).encode(), "s7"),
    ("invalid_id", json.dumps({"message_id": "has space", "session_id": "s7", "role": "user", "content": "x",
                               "timestamp": "2026-01-01T00:00:00Z"}).encode(), "s7"),
    ("session_mismatch", json.dumps({"message_id": "m2", "session_id": "other", "role": "user", "content": "x",
                                     "timestamp": "2026-01-01T00:00:00Z"}).encode(), "s7"),
    ("unsupported_version", json.dumps({"schema_version": 99, "message_id": "m3"}).encode(), "s7"),
    ("oversize", b"{" + b" " * TurnDetectorSettings().max_message_bytes + b"}", "s7"),  # above the cap
]


async def test_bad_input_is_dead_lettered_with_reason_and_traffic_continues(detector, js) -> None:  # noqa: ANN001
    for i, (_, payload, session) in enumerate(BAD_INPUTS):
        await js.publish(subjects.in_message(session), payload, headers={"Nats-Msg-Id": f"bad{i}", "X-Trace": "t1"})
    await publish(js, msg("s7", "u1", "user", "still works", 0))
    await publish(js, msg("s7", "a1", "assistant", "yes", 1))
    await close(js, "s7")
    eps = await _episodes_when(js, 1)
    assert len(eps) == 1
    letters = await read_all(js, subjects.STREAM_DLQ)
    reasons = [m.headers[subjects.HDR_DLQ_REASON] for m in letters]
    assert reasons == [r for r, _, _ in BAD_INPUTS]
    first = letters[0]
    assert first.data == BAD_INPUTS[0][1]  # original bytes kept for replay
    assert first.headers["X-Trace"] == "t1"  # original headers kept
    assert first.headers[subjects.HDR_DLQ_SUBJECT] == "engram.in.message.s7"
    assert "not json" not in first.headers[subjects.HDR_DLQ_DETAIL]


@pytest.mark.parametrize("fail_at", ["publish_lost", "publish", "save", "ack"])
async def test_failure_at_any_step_loses_nothing_and_duplicates_nothing(clean_nats, tmp_path, fail_at) -> None:  # noqa: ANN001
    """Inject one failure at each step of the handler for the message that completes a turn."""
    service = td_app.build(make_settings(clean_nats, tmp_path))
    detector: td_app.TurnDetector = service.detector  # type: ignore[attr-defined]
    failed = {"n": 0}

    if fail_at.startswith("publish"):
        real = detector._publish_effects

        async def flaky(turns, schedule_for, closed=()):  # noqa: ANN001, ANN202
            if turns and not failed["n"]:
                failed["n"] += 1
                if fail_at == "publish":
                    await real(turns, schedule_for, closed)  # episodes reach the stream, then a failure
                # publish_lost: nothing reaches the stream while the state save succeeds
                raise ConnectionError("publish failed")
            return await real(turns, schedule_for, closed)

        detector._publish_effects = flaky  # type: ignore[method-assign]
    else:
        await_store = detector.start

        async def start_and_patch() -> None:
            await await_store()
            real_save = detector.store.persist

            async def flaky_save(partition, state, revision):  # noqa: ANN001, ANN202
                if state.turns_completed == 1 and not failed["n"]:
                    failed["n"] += 1
                    if fail_at == "save":
                        raise ConnectionError("crash before saving")
                    await real_save(partition, state, revision)
                    raise ConnectionError("crash after saving, before the ack")
                return await real_save(partition, state, revision)

            detector.store.persist = flaky_save  # type: ignore[method-assign]

        service.on_startup = [start_and_patch]
    async with running(service, clean_nats) as js:
        await publish(js, msg("s8", "u1", "user", "q1", 0))
        await publish(js, msg("s8", "a1", "assistant", "r1", 1))
        await publish(js, msg("s8", "u2", "user", "q2", 2))  # completes turn 1: the failure hits here
        await publish(js, msg("s8", "a2", "assistant", "r2", 3))
        await close(js, "s8")
        eps = await _episodes_when(js, 2)
        await wait_for(lambda: _consumers_idle(js), 10)
        eps = await episodes(js)
        assert failed["n"] == 1
        assert [e.turn_id for e in eps] == ["s8:u1", "s8:u2"]
        assert [[m.message_id for m in e.messages] for e in eps] == [["u1", "a1"], ["u2", "a2"]]


async def test_poison_message_is_dead_lettered_after_max_deliveries(clean_nats, tmp_path) -> None:  # noqa: ANN001
    service = td_app.build(make_settings(clean_nats, tmp_path, max_deliveries=2))
    detector: td_app.TurnDetector = service.detector  # type: ignore[attr-defined]
    real_apply = detector._apply

    async def boom(event, seq, partition, *, fresh):  # noqa: ANN001, ANN202
        if getattr(event, "message_id", None) == "poison":
            raise ValueError("bug")
        return await real_apply(event, seq, partition, fresh=fresh)

    detector._apply = boom  # type: ignore[method-assign]
    async with running(service, clean_nats) as js:
        await publish(js, msg("s9", "poison", "user", "x", 0))
        await publish(js, msg("s9", "u1", "user", "fine", 1))
        await publish(js, msg("s9", "a1", "assistant", "ok", 2))
        await close(js, "s9")
        eps = await _episodes_when(js, 1, timeout=20)
        assert [m.message_id for m in eps[0].messages] == ["u1", "a1"]
        letters = await read_all(js, subjects.STREAM_DLQ)
        assert [m.headers[subjects.HDR_DLQ_REASON] for m in letters] == ["processing_failed"]


async def test_two_replicas_keep_per_session_order_and_lose_nothing(clean_nats, tmp_path) -> None:  # noqa: ANN001
    """Two detector processes' worth of subscribers pull the same durables; sessions stay ordered."""
    replicas = [td_app.build(make_settings(clean_nats, tmp_path / str(i))) for i in range(2)]
    counts = [0, 0]
    for i, r in enumerate(replicas):
        real = r.detector._apply  # type: ignore[attr-defined]

        async def counted(event, seq, partition, *, fresh, _real=real, _i=i):  # noqa: ANN001, ANN202
            counts[_i] += 1
            return await _real(event, seq, partition, fresh=fresh)

        r.detector._apply = counted  # type: ignore[attr-defined]
        await r.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    sessions = [f"r{i}" for i in range(12)]
    try:
        for k in range(8):  # interleave sessions: u, a, u, a, ...
            for s in sessions:
                await publish(js, msg(s, f"{s}-m{k}", "user" if k % 2 == 0 else "assistant", f"t{k}", k))
        for s in sessions:
            await close(js, s)
        eps = await _episodes_when(js, 4 * len(sessions), timeout=30)
        await wait_for(lambda: _consumers_idle(js), 10)
        eps = await episodes(js)
        handled = [r.detector for r in replicas]  # type: ignore[attr-defined]
        assert len(eps) == 4 * len(sessions)
        for s in sessions:
            mine = [e for e in eps if e.session_id == s]
            assert [[m.message_id for m in e.messages] for e in mine] == [
                [f"{s}-m{k}", f"{s}-m{k + 1}"] for k in range(0, 8, 2)
            ]
        assert all(h.store is not None for h in handled)
        assert min(counts) > 0, f"both replicas should have handled events: {counts}"
    finally:
        await nc.close()
        for r in replicas:
            await r.stop()


async def test_stale_replica_cache_never_publishes_a_wrong_turn(clean_nats, tmp_path) -> None:  # noqa: ANN001
    """Replica A caches a session, replica B applies the next message, then A completes the turn
    from its stale cache: the compare-and-set save must force a reload before anything is
    published, so the episode holds every message."""
    a, b = (td_app.build(make_settings(clean_nats, tmp_path / n)).detector for n in ("a", "b"))  # type: ignore[attr-defined]
    await a.start()
    await b.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        stored_subject: list[str] = []

        def raw(m):  # noqa: ANN001, ANN202
            return stored_subject[0], m.model_dump_json().encode(), None

        # stream seqs 1..3 and the partition's delivery seqs 1..3, split between the replicas
        for m in (msg("st", "u1", "user", "q", 0), msg("st", "a1", "assistant", "r", 1), msg("st", "u2", "user", "q2", 2)):
            await publish(js, m)
        stored_subject.append((await read_all(js, subjects.STREAM_IN))[0].subject)  # engram.in.<p>.message.st
        assert await a._handle(*raw(msg("st", "u1", "user", "q", 0)), 1, 1) == "accepted"
        assert await b._handle(*raw(msg("st", "a1", "assistant", "r", 1)), 2, 2) == "accepted"
        assert await a._handle(*raw(msg("st", "u2", "user", "q2", 2)), 3, 3) == "accepted"  # A's cache lacks a1
        eps = await episodes(js)
        assert [[m.message_id for m in e.messages] for e in eps] == [["u1", "a1"]]
    finally:
        await nc.close()
        await a.broker.stop()
        await b.broker.stop()
