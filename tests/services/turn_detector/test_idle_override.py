"""A publisher's own idle timeout (ChatMessage.idle_timeout_s), issue 10 item 8: the REST gateway
sends no session close, and a client that posts a user+assistant pair (or ends on a user
message) must see its episode in seconds, not after the service's 120 s idle flush."""

from __future__ import annotations

import time

from engram.schemas import ChatMessage
from engram.services.turn_detector import app as td_app
from engram.services.turn_detector.pairing import (
    SessionState,
    TurnPart,
    apply_idle,
    apply_message,
    idle_timeout_for,
    plan_idle,
)
from tests.services.turn_detector.helpers import msg, publish
from tests.services.turn_detector.test_service import _episodes_when, make_settings, running

DEFAULT = 120.0


def step(state: SessionState, m: ChatMessage, now: float) -> SessionState:
    part = TurnPart(message_id=m.message_id, role=m.role, timestamp=m.timestamp, text=m.content)
    new = apply_message(state, m, part, now=now).state
    plan_idle(new, idle_timeout_for(new, DEFAULT))
    return new


def test_the_latest_message_sets_the_sessions_idle_timeout() -> None:
    state = step(SessionState(session_id="s"), msg("s", "u1", "user", "q", 0, idle_timeout_s=5), now=100)
    assert state.idle_timeout_s == 5 and state.idle_scheduled_for == 105
    state = step(state, msg("s", "a1", "assistant", "a", 1, idle_timeout_s=5), now=102)
    assert state.idle_scheduled_for == 105  # kept: apply_idle reschedules when it fires early
    early = apply_idle(state, now=105, idle_timeout_s=idle_timeout_for(state, DEFAULT))
    assert early.completed == [] and early.state.idle_scheduled_for == 107
    done = apply_idle(early.state, now=107, idle_timeout_s=idle_timeout_for(early.state, DEFAULT))
    assert [p.message_id for p in done.completed[0].parts] == ["u1", "a1"]
    assert done.completed[0].completed_by == "idle"


def test_without_an_override_nothing_changes() -> None:
    state = step(SessionState(session_id="s"), msg("s", "u1", "user", "q", 0), now=100)
    assert state.idle_timeout_s is None and state.idle_scheduled_for == 100 + DEFAULT
    state = step(state, msg("s", "a1", "assistant", "a", 1), now=110)
    assert state.idle_scheduled_for == 100 + DEFAULT  # one schedule per idle period, not per message
    assert apply_idle(state, now=150, idle_timeout_s=idle_timeout_for(state, DEFAULT)).completed == []


def test_a_shorter_override_brings_a_pending_schedule_forward() -> None:
    state = step(SessionState(session_id="s"), msg("s", "u1", "user", "q", 0), now=100)
    assert state.idle_scheduled_for == 220
    state = step(state, msg("s", "a1", "assistant", "a", 1, idle_timeout_s=10), now=101)
    assert state.idle_scheduled_for == 111


async def test_a_message_with_a_short_idle_timeout_completes_in_seconds(clean_nats, tmp_path) -> None:  # noqa: ANN001
    """The service's idle timeout is 120 s; messages that carry 1 s are flushed within a few."""
    service = td_app.build(make_settings(clean_nats, tmp_path, idle_timeout_s=DEFAULT))
    async with running(service, clean_nats) as js:
        started = time.monotonic()
        await publish(js, msg("fast", "u1", "user", "question", 0, idle_timeout_s=1))
        await publish(js, msg("fast", "a1", "assistant", "answer", 1, idle_timeout_s=1))
        await publish(js, msg("fast", "u2", "user", "a last question, never answered", 2, idle_timeout_s=1))
        eps = await _episodes_when(js, 2, timeout=20)
        took = time.monotonic() - started
        assert [[m.message_id for m in e.messages] for e in eps] == [["u1", "a1"], ["u2"]]
        assert eps[1].completed_by == "idle"
        assert took < 10, f"the idle flush took {took:.1f} s"
