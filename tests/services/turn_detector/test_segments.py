"""Session segments (seed 004, issue 13 item 1): rotation at a token limit, explicit and idle
closes, the transcript a closed segment carries -- pure rules first, then through real NATS."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import nats
import pytest

from engram.settings import EngramSettings, SessionSettings, TurnDetectorSettings
from engram.schemas import SessionSegmentClosed, subjects
from engram.services.turn_detector import app as td_app
from engram.services.turn_detector.pairing import (
    SegmentPolicy,
    SessionState,
    TurnPart,
    apply_close,
    apply_idle,
    apply_message,
    plan_idle,
    segment_id_for,
)
from tests.services.turn_detector.helpers import T0, close, episodes, msg, publish, read_all, scopes, wait_for


def feed(state: SessionState, events: list[tuple[str, str, int]], policy: SegmentPolicy, start: int = 0):  # noqa: ANN201
    """Apply (message id, role, tokens) events; return the state, completed turns and closed segments."""
    done, closed = [], []
    for i, (mid, role, tokens) in enumerate(events, start):
        m = msg(state.session_id, mid, role, f"text {mid}", i)
        part = TurnPart(message_id=mid, role=role, timestamp=m.timestamp, text=m.content)
        tr = apply_message(state, m, part, now=float(i), tokens=tokens, segments=policy)
        state = tr.state
        done += tr.completed
        closed += tr.closed
    return state, done, closed


def conversation(turns: int, tokens: int = 40) -> list[tuple[str, str, int]]:
    return [e for t in range(turns) for e in ((f"u{t}", "user", tokens), (f"a{t}", "assistant", tokens))]


def test_rotates_at_the_token_limit_on_a_turn_boundary_and_loses_no_message() -> None:
    policy = SegmentPolicy(token_limit=200)
    state, done, closed = feed(SessionState(session_id="s"), conversation(6), policy)
    state, flushed, ended = (lambda t: (t.state, t.completed, t.closed))(apply_close(state, now=99.0))
    closed += ended
    # 80 tokens per turn: the segment reaches 240 >= 200 after turn 3; the next user message rotates.
    assert [c.reason for c in closed] == ["token_limit", "explicit"]
    assert [c.segment for c in closed] == [0, 1]
    assert [c.token_count for c in closed] == [240, 240]
    first, second = ([line.message_id for line in c.transcript] for c in closed)
    assert first == ["u0", "a0", "u1", "a1", "u2", "a2"]
    assert second == ["u3", "a3", "u4", "a4", "u5", "a5"]
    # No turn straddles the boundary: every turn's messages sit in one segment.
    for turn in done + flushed:
        ids = {p.message_id for p in turn.parts}
        assert ids <= set(first) or ids <= set(second)
    assert closed[0].closed_at == T0 + timedelta(seconds=5)  # the segment's last message, not the wall clock
    assert state.segment.index == 2 and state.segment.messages == 0


def test_the_publisher_sees_no_change_across_a_rotation() -> None:
    policy = SegmentPolicy(token_limit=100)
    state, done, closed = feed(SessionState(session_id="s"), conversation(4), policy)
    assert len(closed) == 1
    # Turn ids and their session are what they would be without segments.
    assert [t.turn_id for t in done] == ["s:u0", "s:u1", "s:u2"]
    assert all(t.session_id == "s" for t in done)


def test_a_turn_longer_than_the_limit_rotates_at_its_end_not_inside_it() -> None:
    policy = SegmentPolicy(token_limit=100)
    events = [("u0", "user", 30), ("a0", "assistant", 500), ("a0b", "assistant", 500), ("u1", "user", 10)]
    state, done, closed = feed(SessionState(session_id="s"), events, policy)
    assert len(closed) == 1 and closed[0].message_count == 3 and closed[0].token_count == 1030
    assert [line.message_id for line in closed[0].transcript] == ["u0", "a0", "a0b"]


def test_closed_session_id_sending_again_starts_new_segment() -> None:
    """Seed 004, 7: 'a closed session_id was sent -> a new session is created' (the bug fix)."""
    policy = SegmentPolicy()
    state, _, _ = feed(SessionState(session_id="s"), conversation(1), policy)
    first = apply_close(state, now=10.0)
    assert [c.reason for c in first.closed] == ["explicit"] and first.closed[0].segment == 0
    state, _, _ = feed(first.state, [("u9", "user", 5), ("a9", "assistant", 5)], policy, start=20)
    second = apply_close(state, now=30.0)
    assert second.closed[0].segment == 1
    assert [line.message_id for line in second.closed[0].transcript] == ["u9", "a9"]
    assert first.closed[0].segment_id != second.closed[0].segment_id


def test_a_close_with_nothing_new_closes_nothing() -> None:
    state, _, _ = feed(SessionState(session_id="s"), conversation(1), SegmentPolicy())
    once = apply_close(state, now=1.0)
    again = apply_close(once.state, now=2.0)
    assert len(once.closed) == 1 and again.closed == [] and again.outcome == "noop"
    assert apply_close(SessionState(session_id="empty"), now=1.0).closed == []


def test_idle_flushes_the_turn_first_then_closes_the_segment() -> None:
    policy = SegmentPolicy(idle_close_s=600)
    state, _, _ = feed(SessionState(session_id="s"), conversation(1), policy)  # last activity at now=1
    plan_idle(state, 120, policy.idle_close_s)
    assert state.idle_scheduled_for == 121
    turn_idle = apply_idle(state, now=121.0, idle_timeout_s=120, idle_close_s=policy.idle_close_s)
    assert len(turn_idle.completed) == 1 and turn_idle.closed == []
    plan_idle(turn_idle.state, 120, policy.idle_close_s)
    assert turn_idle.state.idle_scheduled_for == 601  # the segment's idle close is planned next
    early = apply_idle(turn_idle.state, now=300.0, idle_timeout_s=120, idle_close_s=policy.idle_close_s)
    assert early.closed == []
    late = apply_idle(turn_idle.state, now=601.0, idle_timeout_s=120, idle_close_s=policy.idle_close_s)
    assert [c.reason for c in late.closed] == ["idle"] and late.closed[0].message_count == 2
    plan_idle(late.state, 120, policy.idle_close_s)
    assert late.state.idle_scheduled_for is None  # nothing left to wait for


def test_the_transcript_is_the_tail_bounded_by_messages_and_tokens() -> None:
    by_count = feed(SessionState(session_id="s"), conversation(10, tokens=1), SegmentPolicy(transcript_messages=5))[0]
    ended = apply_close(by_count, now=50.0).closed[0]
    assert [line.message_id for line in ended.transcript] == ["a7", "u8", "a8", "u9", "a9"]
    assert ended.transcript_dropped == 15 and ended.message_count == 20
    by_tokens = feed(SessionState(session_id="s"), conversation(10, tokens=100),
                     SegmentPolicy(transcript_tokens=350))[0]
    ended = apply_close(by_tokens, now=50.0).closed[0]
    assert [line.message_id for line in ended.transcript] == ["a8", "u9", "a9"]
    assert ended.transcript_dropped == 17 and ended.token_count == 2000


def test_segment_ids_are_deterministic_and_distinct() -> None:
    assert segment_id_for("s", 0, 1) == segment_id_for("s", 0, 1)
    ids = {segment_id_for(s, e, n) for s in ("s", "s-e1", "t") for e in (0, 1) for n in (0, 1, 2)}
    assert len(ids) == 18
    assert all(subjects.is_valid_token(i) for i in ids)


def test_the_segment_keeps_the_scopes_its_messages_named() -> None:
    state = SessionState(session_id="s")
    m = msg("s", "u1", "user", "hi", 0, scopes=scopes(user="ada@example.com", workspace="/repo"))
    part = TurnPart(message_id="u1", role="user", timestamp=m.timestamp, text="hi")
    state = apply_message(state, m, part, now=0.0, tokens=1).state
    ended = apply_close(state, now=1.0).closed[0]
    assert ended.scopes.user == "ada@example.com" and ended.scopes.workspace == "/repo"


# --- through a real NATS JetStream ----------------------------------------------------------

def make_settings(nats_url: str, tmp_path: Path, token_limit: int) -> EngramSettings:
    return EngramSettings(nats_url=nats_url, data_dir=tmp_path, partitions=2,
                          turn=TurnDetectorSettings(idle_timeout_s=120, max_deliveries=3),
                          session=SessionSettings(token_limit=token_limit))


async def closed_segments(js) -> list[SessionSegmentClosed]:  # noqa: ANN001
    return [SessionSegmentClosed.model_validate_json(m.data) for m in await read_all(js, subjects.STREAM_SESSIONS)]


async def test_segments_are_published_once_with_the_cl100k_count(clean_nats: str, tmp_path: Path) -> None:
    service = td_app.build(make_settings(clean_nats, tmp_path, token_limit=100))
    await service.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        text = "The billing service runs on Postgres 15 in the eu-west region."  # 15 cl100k tokens
        for i in range(9):
            role = "user" if i % 2 == 0 else "assistant"
            await publish(js, msg("s1", f"m{i}", role, text, i, scopes=scopes(user="ada")))
        await publish(js, msg("s1", "m3", "assistant", text, 3, scopes=scopes(user="ada")), msg_id="again-m3")
        await close(js, "s1")

        async def two():  # noqa: ANN202
            found = await closed_segments(js)
            return found if len(found) >= 2 else None

        found = await wait_for(two, 15) or await closed_segments(js)
        assert [c.reason for c in found] == ["token_limit", "explicit"]
        # 8 messages of 15 tokens reach 100; the 9th (a user message, a turn boundary) starts the
        # next segment. The re-published m3 (another Nats-Msg-Id) is a duplicate: no tokens.
        assert [c.token_count for c in found] == [120, 15]
        assert [c.message_count for c in found] == [8, 1]
        assert [len(c.transcript) for c in found] == [8, 1]
        eps = await episodes(js)
        in_segments = [line.message_id for c in found for line in c.transcript]
        in_turns = [m.message_id for e in eps for m in e.messages if e.scope == "session"]
        assert sorted(in_segments) == sorted(in_turns) == sorted(set(in_turns))  # none lost, none twice
        # A redelivered close (same Nats-Msg-Id) publishes nothing new.
        await close(js, "s1")
        assert len(await closed_segments(js)) == 2
    finally:
        await nc.close()
        await service.stop()


@pytest.mark.parametrize("limit", [30_000])
async def test_a_long_session_rotates_at_the_default_limit(clean_nats: str, tmp_path: Path, limit: int) -> None:
    """Past 30,000 tokens (the default): two segments; the second starts with the message after
    the boundary and the first holds every message before it."""
    service = td_app.build(make_settings(clean_nats, tmp_path, token_limit=limit))
    await service.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        paragraph = " ".join(f"word{i}" for i in range(400))  # 800 cl100k tokens
        n = 0
        for turn in range(24):
            await publish(js, msg("long", f"u{turn}", "user", paragraph, n))
            await publish(js, msg("long", f"a{turn}", "assistant", paragraph, n + 1))
            n += 2
        await close(js, "long")

        async def two():  # noqa: ANN202
            found = await closed_segments(js)
            return found if len(found) >= 2 else None

        found = await wait_for(two, 20) or await closed_segments(js)
        assert [c.reason for c in found] == ["token_limit", "explicit"]
        # 19 turns of 1,600 tokens pass 30,000: u19 starts the second segment.
        assert [c.token_count for c in found] == [30_400, 8_000]
        assert [c.message_count for c in found] == [38, 10]
        # Each transcript is the segment's 2,000-token tail (ENGRAM_SESSION_TRANSCRIPT_TOKENS): 2 of 38
        # messages, then 2 of 10.
        assert [[line.message_id for line in c.transcript] for c in found] == [["u18", "a18"], ["u23", "a23"]]
        assert [c.transcript_dropped for c in found] == [36, 8]
    finally:
        await nc.close()
        await service.stop()


@pytest.mark.parametrize("fail_at", ["publish", "publish_lost"])
async def test_a_failure_while_publishing_a_close_loses_nothing_and_duplicates_nothing(
        clean_nats: str, tmp_path: Path, fail_at: str) -> None:
    """The state (with the closed segment in its outbox) is saved before the publish: a failure
    after it -- with or without the event reaching the stream -- is redelivered, the outbox is
    published again, and the server drops a second copy by its Nats-Msg-Id (the segment id)."""
    service = td_app.build(make_settings(clean_nats, tmp_path, token_limit=100))
    detector: td_app.TurnDetector = service.detector  # type: ignore[attr-defined]
    real = detector._publish_effects
    failed = {"n": 0}

    async def flaky(turns, schedule_for, closed=()):  # noqa: ANN001, ANN202
        if closed and not failed["n"]:
            failed["n"] += 1
            if fail_at == "publish":
                await real(turns, schedule_for, closed)
            raise ConnectionError("publish failed")
        return await real(turns, schedule_for, closed)

    detector._publish_effects = flaky  # type: ignore[method-assign]
    await service.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        await publish(js, msg("s2", "u0", "user", "hello there", 0))
        await publish(js, msg("s2", "a0", "assistant", "hi", 1))
        await close(js, "s2")

        async def one():  # noqa: ANN202
            found = await closed_segments(js)
            return found or None

        found = await wait_for(one, 15) or []
        assert failed["n"] == 1
        await publish(js, msg("s2", "u1", "user", "still there?", 2))  # the partition moves on
        await wait_for(lambda: _eps_at_least(js, 1), 10)
        found = await closed_segments(js)
        assert [(c.segment, c.reason, c.message_count) for c in found] == [(0, "explicit", 2)]
    finally:
        await nc.close()
        await service.stop()


async def _eps_at_least(js, n: int):  # noqa: ANN001, ANN202
    eps = await episodes(js)
    return eps if len(eps) >= n else None
