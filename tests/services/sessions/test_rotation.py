"""Issue 13's first 'done when' across both stages, on real NATS + FalkorDB: a publisher session
driven past 30,000 cl100k tokens through the real turn-detector rotates into two segments; the
sessions service closes each into a hybrid summary in the user's group and stores the
preferences the user stated, with no message lost or duplicated across the boundary."""

from __future__ import annotations

from pathlib import Path

import nats

from engram.settings import EngramSettings, SessionSettings, TurnDetectorSettings
from engram.schemas import ScopeKeys, SessionSegmentClosed, subjects
from engram.services.sessions import app as sessions_app
from engram.services.turn_detector import app as td_app
from tests.services.sessions.helpers import CountingLLM
from tests.services.turn_detector.helpers import close, msg, publish, read_all, wait_for

USER = "rotation-user@example.com"


def filler(turn: int, role: str) -> str:
    """About 800 cl100k tokens of plain prose."""
    sentence = (f"In step {turn} the {role} moved the orders table of the billing service to the new "
                f"Postgres cluster and checked the replication lag.")
    return " ".join([sentence] * 34)


async def test_a_session_past_30000_tokens_closes_two_summarised_segments_with_preferences(
        clean_nats: str, falkordb_server, tmp_path: Path) -> None:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(idle_timeout_s=120, max_deliveries=3),
                              session=SessionSettings(token_limit=30_000))
    llm = CountingLLM()
    detector, sessions = td_app.build(settings), sessions_app.build(settings, llm=llm)
    await detector.start()
    await sessions.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    store = sessions.sessions.store
    group = subjects.user_group(settings.group_prefix, USER)
    try:
        sent = []
        for turn in range(24):
            # the transcript a segment carries is its tail (ENGRAM_SESSION_TRANSCRIPT_*): every user
            # message states the preferences, the last turns (only in the second segment) one more
            user_text = "My favourite color is blue. Please answer in Turkish. " + filler(turn, "user")
            if turn >= 20:
                user_text = "Call me Sam. I'm a data engineer at Acme. " + user_text
            for role, text in (("user", user_text), ("assistant", filler(turn, "assistant"))):
                mid = f"{role[0]}{turn}"
                await publish(js, msg("rot", mid, role, text, len(sent), scopes=ScopeKeys(user=USER)))
                sent.append(mid)
        await close(js, "rot")

        async def both_closed():  # noqa: ANN202
            records = await store.last_sessions(group, 10)
            return records if len(records) == 2 else None

        records = await wait_for(both_closed, 60)
        assert records, "the two segments were not closed"
        second, first = records
        assert [(r.segment, r.close_reason) for r in (first, second)] == [(0, "token_limit"), (1, "explicit")]
        assert first.token_count >= 30_000 and first.session_id == second.session_id == "rot"
        # every message is in exactly one segment
        assert first.message_count + second.message_count == len(sent)
        events = [SessionSegmentClosed.model_validate_json(m.data) for m in await read_all(js, subjects.STREAM_SESSIONS)]
        tails = [[line.message_id for line in e.transcript] for e in events]
        assert len(events) == 2 and not set(tails[0]) & set(tails[1])
        assert sent.index(tails[1][0]) > sent.index(tails[0][-1])
        # one hybrid summary per segment, the user's preferences from both
        for record in (first, second):
            assert record.summary_source == "rules" and "- TOPICS: " in record.summary, record.summary
        prefs = {(p.key, p.value): p for p in await store.preferences(group)}
        assert {("favorite_color", "blue"), ("language", "Turkish"), ("preferred_name", "Sam")} <= set(prefs)
        assert prefs[("favorite_color", "blue")].source == "extraction"
        assert "The user is a data engineer at Acme." in [n.text for n in await store.notes(group)]
        assert llm.by_prompt == {"sessions.summary": 2, "sessions.facts": 2}
        # the second summary had the first one as context
        assert first.summary.split("\n")[0][:40] in [t for name, t in llm.prompts if name == "sessions.summary"][1]
    finally:
        await nc.close()
        await sessions.stop()
        await detector.stop()
