"""`engram ingest` of the same session again after JetStream's duplicate window (issue 23 item 2):
the README says "Ingesting a file again is safe". With the window passed, the server stores every
message again; the turn-detector must recognise them (a session longer than the 64 ids it used to
remember re-opened turns and closed a second segment: a duplicate session summary), and the
report must still say "already present", not "published". The window is shortened to 1 s
(ENGRAM_DUPLICATE_WINDOW_S) instead of waiting 10 minutes."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import nats

from engram.publishing.ingest import publish_events
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import ChatMessage, ScopeKeys, SessionClosed, subjects
from engram.services.turn_detector import app as td_app
from tests.services.turn_detector.helpers import T0, episodes, read_all, wait_for

MESSAGES = 100


def transcript() -> list[ChatMessage | SessionClosed]:
    events: list[ChatMessage | SessionClosed] = [
        ChatMessage(message_id=f"m{i}", session_id="long-chat", role="user" if i % 2 == 0 else "assistant",
                    content=f"line {i} of a long conversation", timestamp=T0 + timedelta(seconds=i),
                    scopes=ScopeKeys(workspace="w1"))
        for i in range(MESSAGES)
    ]
    events.append(SessionClosed(session_id="long-chat", closed_at=T0 + timedelta(seconds=MESSAGES)))
    return events


async def _idle(js) -> bool:  # noqa: ANN001
    infos = await js.consumers_info(subjects.STREAM_IN)
    return all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos if c.config.durable_name)


async def test_ingesting_a_long_session_again_after_the_window_stores_nothing(clean_nats: str, tmp_path: Path) -> None:
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=2, duplicate_window_s=1,
                              turn=TurnDetectorSettings(idle_timeout_s=120))
    detector = td_app.build(settings)
    await detector.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        assert (await js.stream_info(subjects.STREAM_IN)).config.duplicate_window == 1
        first = await publish_events(js, transcript())
        assert (first.messages, first.duplicates, first.closes) == (MESSAGES, 0, 1)
        turns = MESSAGES // 2 * 2  # a session and a workspace episode per turn

        async def all_episodes():  # noqa: ANN202
            eps = await episodes(js)
            return eps if len(eps) >= turns else None

        assert len(await wait_for(all_episodes, 30) or []) == turns
        assert await wait_for(lambda: _idle(js), 15)
        await asyncio.sleep(1.5)  # the server has forgotten every Nats-Msg-Id

        again = await publish_events(js, transcript())
        assert (again.messages, again.duplicates) == (0, MESSAGES), "published N, already present M must stay truthful"
        assert await wait_for(lambda: _idle(js), 30)
        await asyncio.sleep(1.5)  # and the episode stream's window too: a re-sent episode would be stored
        assert len(await episodes(js)) == turns
        closes = await read_all(js, subjects.STREAM_SESSIONS, "engram.session.closed.*")
        assert len(closes) == 1, "a second segment close: a second session summary and its LLM calls"
    finally:
        await nc.close()
        await detector.stop()
