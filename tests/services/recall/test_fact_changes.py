"""Facts that change (issue 11, item 6), end to end through the real turn-detector, extractor
(offline rules model) and recall over real NATS and FalkorDB.

Told "the billing service uses Postgres 15" and, three days later in another conversation, "we
switched the billing service to SQLite": the Postgres fact must be invalidated (``invalid_at`` =
when the switch was said, ``expired_at`` set), and recall must give the SQLite fact as the
current one, never the Postgres fact as if it still held.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import nats

from engram.graph.drivers import GraphDrivers, as_utc, query_rows
from engram.schemas import ChatMessage, RecallRequest, RecallScopes, ScopeKeys, subjects
from engram.services.recall.merge import render_line
from tests.services.recall.test_service import _idle, ask, stack
from tests.services.turn_detector.helpers import close, publish, wait_for

MONDAY = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
THURSDAY = MONDAY + timedelta(days=3)
USER = ScopeKeys(user="ada@example.org")


async def _say(nc: nats.NATS, session: str, at: datetime, user_text: str, reply: str) -> None:
    js = nc.jetstream()
    for i, (role, text) in enumerate([("user", user_text), ("assistant", reply)]):
        await publish(js, ChatMessage(message_id=f"{session}-m{i}", session_id=session, role=role, content=text,
                                      timestamp=at + timedelta(seconds=i), name="Ada" if role == "user" else None,
                                      scopes=USER))
    await close(js, session)
    assert await wait_for(lambda: _idle(js, subjects.STREAM_IN), 30)
    assert await wait_for(lambda: _idle(js, subjects.STREAM_EPISODES), 60)


async def group_facts(settings, group: str) -> list[dict]:  # noqa: ANN001
    """Every fact of ``group``: its text, valid_at, invalid_at and expired_at."""
    graph = GraphDrivers(settings)
    try:
        return await query_rows(
            await graph.driver(group),
            "MATCH (:Entity)-[e:RELATES_TO]->(:Entity) WHERE e.group_id = $g "
            "RETURN e.fact AS fact, e.valid_at AS valid_at, e.invalid_at AS invalid_at, e.expired_at AS expired_at",
            g=group,
        )
    finally:
        await graph.close()


async def test_a_switch_invalidates_the_old_fact_and_recall_puts_the_new_one_first(
    clean_nats, falkordb_server, tmp_path  # noqa: ANN001
) -> None:
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        await _say(nc, "monday", MONDAY, "The billing service uses Postgres 15.", "Noted.")
        await _say(nc, "thursday", THURSDAY, "We switched the billing service to SQLite.", "Noted.")

        rows = await group_facts(settings, subjects.user_group(settings.group_prefix, USER.user))
        postgres = [r for r in rows if "Postgres" in r["fact"]]
        sqlite = [r for r in rows if "SQLite" in r["fact"]]
        assert postgres and sqlite, rows
        # ended when the switch was said (the later fact's valid_at), expired when it was learnt
        assert all(as_utc(r["invalid_at"]) == THURSDAY and r["expired_at"] is not None for r in postgres), rows
        assert all(r["invalid_at"] is None for r in sqlite), rows

        question = "Which database does the billing service use?"
        facts_only = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(user=USER.user),
                                                  include_episodes=False, timeout_ms=10_000))
        assert not facts_only.degraded, facts_only.reason
        assert facts_only.items and "SQLite" in facts_only.items[0].fact, [i.fact for i in facts_only.items]
        # with past turns too, the Postgres fact is never given as current: absent (recall skips
        # expired facts) or marked superseded; the turn that said it stays, dated
        response = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(user=USER.user), timeout_ms=10_000))
        assert not response.degraded, response.reason
        for item in facts_only.items + response.items:
            if item.kind == "fact" and "Postgres" in item.fact:
                assert "superseded" in render_line(item), [i.fact for i in response.items]
        assert any(i.kind == "episode" and "Postgres" in i.fact for i in response.items), response.prompt_section


async def test_a_switch_extracted_before_the_older_fact_still_ends_it(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """Turns of two sessions reach the extractor in the order the sessions closed, not the order
    they were said (engram demo's two billing sessions, ingested together, did so at random):
    the Postgres turn extracted after the switch is stored already ended, at the switch's date,
    and recall marks it superseded."""
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        await _say(nc, "thursday", THURSDAY, "We switched the billing service to SQLite.", "Noted.")
        await _say(nc, "monday", MONDAY, "The billing service uses Postgres 15.", "Noted.")

        rows = await group_facts(settings, subjects.user_group(settings.group_prefix, USER.user))
        postgres = [r for r in rows if "Postgres" in r["fact"]]
        sqlite = [r for r in rows if "SQLite" in r["fact"]]
        assert postgres and sqlite, rows
        assert all(as_utc(r["invalid_at"]) == THURSDAY and r["expired_at"] is not None for r in postgres), rows
        assert all(r["invalid_at"] is None for r in sqlite), rows

        response = await ask(nc, RecallRequest(query="are we still on Postgres for billing?",
                                               scopes=RecallScopes(user=USER.user), timeout_ms=10_000))
        assert not response.degraded, response.reason
        line = next(line for line in response.prompt_section.splitlines() if "Postgres" in line)
        assert "superseded" in line, response.prompt_section
