"""Re-ingesting a session after the server's duplicate window (issue 23 item 2): the turn-detector
recognises every message it already has, at any session length, so no turn, episode or segment
close (and so no second session summary) comes of it.

A re-ingest after the window looks to the turn-detector exactly like the same messages published
with new Nats-Msg-Ids (the server no longer remembers the old ones), which is how the test sends
them: waiting out a real window would take minutes."""

from __future__ import annotations

from pathlib import Path

import nats

from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import SessionClosed, subjects
from engram.services.turn_detector import app as td_app
from engram.services.turn_detector.pairing import SessionState
from tests.services.turn_detector.helpers import T0, episodes, msg, publish, read_all, wait_for

MESSAGES = 100  # more than the 64 ids the detector used to remember per session


async def _idle(js) -> bool:  # noqa: ANN001
    infos = await js.consumers_info(subjects.STREAM_IN)
    return all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos if c.config.durable_name)


async def _ingest(js, session: str, run: str) -> None:  # noqa: ANN001
    for i in range(MESSAGES):
        role = "user" if i % 2 == 0 else "assistant"
        await publish(js, msg(session, f"m{i}", role, f"message number {i} of a long chat", i), msg_id=f"{run}-{i}")
    await publish(js, SessionClosed(session_id=session, closed_at=T0), msg_id=f"{run}-close")


async def test_a_long_session_ingested_again_after_the_window_adds_nothing(clean_nats: str, tmp_path: Path) -> None:
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(idle_timeout_s=120))
    service = td_app.build(settings)
    await service.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        await _ingest(js, "long", "first")

        async def all_turns():  # noqa: ANN202
            eps = await episodes(js)
            return eps if len(eps) >= MESSAGES // 2 else None

        first = await wait_for(all_turns, 30) or await episodes(js)
        assert len(first) == MESSAGES // 2
        assert await wait_for(lambda: _idle(js), 15)
        closes = await read_all(js, subjects.STREAM_SESSIONS, "engram.session.closed.*")
        assert len(closes) == 1

        await _ingest(js, "long", "second")  # new Nats-Msg-Ids: what the detector sees after the window
        assert await wait_for(lambda: _idle(js), 30)
        again = await episodes(js)
        assert len(again) == MESSAGES // 2, f"{len(again) - len(first)} new episodes from a re-ingest"
        assert sorted(e.turn_id for e in again) == sorted(e.turn_id for e in first)
        closes = await read_all(js, subjects.STREAM_SESSIONS, "engram.session.closed.*")
        assert len(closes) == 1, "a re-ingest closed a second segment (a second session summary)"
        # the checkpoint agrees (the episodes above could also be dropped by the episode stream's
        # own duplicate window, which has not passed here)
        state = SessionState.model_validate_json((await (await js.key_value(subjects.KV_TURN_SESSIONS)).get("long")).value)
        assert (state.turns_completed, state.segment.index) == (MESSAGES // 2, 1)

        # ... and the session still takes new messages, and still recognises them later
        await publish(js, msg("long", "new-u", "user", "one more question", MESSAGES))
        await publish(js, msg("long", "new-a", "assistant", "one more answer", MESSAGES + 1))
        await publish(js, SessionClosed(session_id="long", closed_at=T0), msg_id="third-close")

        async def one_more():  # noqa: ANN202
            eps = await episodes(js)
            return eps if len(eps) > MESSAGES // 2 else None

        assert len(await wait_for(one_more, 15) or []) == MESSAGES // 2 + 1
    finally:
        await nc.close()
        await service.stop()
