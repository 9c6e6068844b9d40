"""Pairing depends on the input stream only, not on when the detector got to a message (issue 16
item 2: a replay with services killed once paired one turn differently). Idle is decided by the
gap between events' JetStream times; a message that comes an idle timeout after the last event
first completes the open turn, as the idle tick would have."""

from __future__ import annotations

import asyncio

import nats

from engram.schemas import ChatMessage, SessionClosed, subjects
from engram.services.turn_detector import app as td_app
from engram.services.turn_detector.pairing import (
    SegmentPolicy,
    SessionState,
    TurnPart,
    apply_message,
)
from tests.services.turn_detector.helpers import T0, msg, publish
from tests.services.turn_detector.test_service import _episodes_when, make_settings, running

IDLE = 120.0


def part(m: ChatMessage) -> TurnPart:
    return TurnPart(message_id=m.message_id, role=m.role, timestamp=m.timestamp, text=m.content)


def feed(events: list[tuple[ChatMessage, float]], segments: SegmentPolicy = SegmentPolicy()) -> tuple[list, list]:
    state, turns, closed = SessionState(session_id="s"), [], []
    for m, at in events:
        tr = apply_message(state, m, part(m), now=at, idle_timeout_s=IDLE, segments=segments)
        state, turns, closed = tr.state, turns + tr.completed, closed + tr.closed
    return [[p.message_id for p in t.parts] for t in turns] + [[p.message_id for p in state.open_turn.parts]], closed


def test_a_message_after_an_idle_gap_completes_the_open_turn_first() -> None:
    u1, a1 = msg("s", "u1", "user", "question", 0), msg("s", "a1", "assistant", "late answer", 1)
    assert feed([(u1, 1000.0), (a1, 1000.0 + IDLE + 5)])[0] == [["u1"], ["a1"]]
    assert feed([(u1, 1000.0), (a1, 1000.0 + IDLE - 5)])[0] == [["u1", "a1"]]


def test_a_message_after_the_idle_close_gap_starts_a_new_segment() -> None:
    u1, a1, u2 = (msg("s", "u1", "user", "q", 0), msg("s", "a1", "assistant", "a", 1),
                  msg("s", "u2", "user", "back after lunch", 2))
    policy = SegmentPolicy(idle_close_s=1800)
    turns, closed = feed([(u1, 0.0), (a1, 1.0), (u2, 1.0 + 1800)], policy)
    assert turns == [["u1", "a1"], ["u2"]]
    assert [c.reason for c in closed] == ["idle"] and closed[0].message_count == 2


async def test_a_detector_down_across_an_idle_gap_pairs_as_one_that_was_up(clean_nats, tmp_path) -> None:  # noqa: ANN001
    """The publisher sends a user message, then the answer after the idle timeout (2 s). A detector
    that was running flushes the question alone at the timeout; one that was down and handles both
    late (a crash, a backlog) must pair the same turns."""
    settings = make_settings(clean_nats, tmp_path, idle_timeout_s=2)
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        # the detector's topology first, then the detector down while the conversation arrives
        service = td_app.build(settings)
        await service.start()
        await service.stop()
        await publish(js, msg("down", "u1", "user", "where is the config?", 0))
        await asyncio.sleep(3.0)  # longer than the idle timeout, no detector running
        await publish(js, msg("down", "a1", "assistant", "in config/settings.toml", 1))
        await js.publish(subjects.in_close("down"), SessionClosed(session_id="down", closed_at=T0).model_dump_json().encode(),
                         headers={subjects.HDR_MSG_ID: "close:down"})
        async with running(td_app.build(settings), clean_nats) as js2:
            eps = await _episodes_when(js2, 2, timeout=20)
        assert [[m.message_id for m in e.messages] for e in eps] == [["u1"], ["a1"]]
        assert eps[0].completed_by == "idle"
    finally:
        await nc.close()
