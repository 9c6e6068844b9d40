"""Recall at a time and by time or relation (issue 26, item 1; services/recall/time_window.py):
the window's rules alone, then "what did we use for billing in September?" end to end (real
turn-detector, extractor with the offline rules model, recall; real NATS and FalkorDB)."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from pydantic import ValidationError

from engram.schemas import RecallRequest, RecallScopes, TimeRange, subjects
from engram.services.recall.time_window import TimeWindow
from tests.services.recall.test_fact_changes import USER, _say, group_facts
from tests.services.recall.test_service import ask, stack

SEPT_1 = datetime(2026, 9, 1, 10, tzinfo=timezone.utc)
SEPT_15 = datetime(2026, 9, 15, tzinfo=timezone.utc)
OCT_1 = datetime(2026, 10, 1, 10, tzinfo=timezone.utc)
OCT_2 = datetime(2026, 10, 2, 10, tzinfo=timezone.utc)


def window(**fields) -> TimeWindow:  # noqa: ANN003
    found = TimeWindow.of(RecallRequest(query="q", **fields))
    assert found is not None
    return found


def test_a_request_without_time_or_relation_takes_the_usual_path() -> None:
    assert TimeWindow.of(RecallRequest(query="q")) is None


def test_as_of_keeps_what_was_valid_then_ended_since_or_not() -> None:
    at = window(as_of=SEPT_15)
    assert at.keeps_fact("USES", SEPT_1, OCT_1, OCT_1)  # true then, ended (and expired) since
    assert at.keeps_fact("USES", SEPT_1, None, None)  # true then, still true
    assert not at.keeps_fact("USES", OCT_1, None, None)  # not yet true
    assert not at.keeps_fact("USES", SEPT_1, SEPT_1, SEPT_1)  # ended by then
    assert not at.keeps_fact("USES", None, None, None)  # no start: not known to hold then
    assert at.keeps_turn(SEPT_1) and not at.keeps_turn(OCT_1)


def test_ranges_and_relations() -> None:
    began = window(valid_at=TimeRange(after=SEPT_15))
    assert began.keeps_fact("USES", OCT_1, None, None) and not began.keeps_fact("USES", SEPT_1, None, None)
    assert not began.keeps_fact("USES", OCT_1, OCT_2, OCT_2)  # no time asked of the end: current facts only
    ended = window(invalid_at=TimeRange(after=SEPT_15, before=OCT_2))
    assert ended.keeps_fact("USES", SEPT_1, OCT_1, OCT_1)
    assert not ended.keeps_fact("USES", SEPT_1, None, None)  # still true: no end within the range
    typed = window(edge_types=["using", "works for"])  # a synonym counts as its canonical name; case, separators
    assert typed.keeps_fact("USES", SEPT_1, None, None) and typed.keeps_fact("WORKS_FOR", SEPT_1, None, None)
    assert not typed.keeps_fact("PREFERS", SEPT_1, None, None)


def test_search_filters_follow_the_window() -> None:
    now = window(edge_types=["WORKS_AT"]).search_filters()
    assert now.expired_at is not None and now.invalid_at is None  # current facts only
    at = window(as_of=SEPT_15).search_filters()
    assert at.expired_at is None  # ended since counts
    assert [[f.comparison_operator.value for f in group] for group in at.invalid_at] == [["IS NULL"], [">"]]
    assert [f.comparison_operator.value for f in at.valid_at[0]] == ["<="]


def test_a_range_that_ends_before_it_starts_is_refused() -> None:
    with pytest.raises(ValidationError, match="before is earlier than after"):
        RecallRequest(query="q", valid_at=TimeRange(after=OCT_1, before=SEPT_1))


async def test_what_did_we_use_for_billing_in_september(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """Postgres in September, SQLite since October 1: asked as of September 15, recall answers
    Postgres, and never the switch said after it; asked now, the Postgres fact is not current."""
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        await _say(nc, "sept", SEPT_1, "The billing service uses Postgres 15.", "Noted.")
        await _say(nc, "oct", OCT_1, "We switched the billing service to SQLite.", "Noted.")
        rows = await group_facts(settings, subjects.user_group(settings.group_prefix, USER.user))
        assert any("Postgres" in r["fact"] and r["invalid_at"] is not None for r in rows), rows  # the graph knows

        question = "What did we use for billing in September?"
        then = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(user=USER.user), as_of=SEPT_15,
                                           timeout_ms=10_000))
        assert not then.degraded, then.reason
        assert not any("SQLite" in i.fact for i in then.items), then.prompt_section  # said after September 15
        assert "Postgres" in then.prompt_section and "superseded" not in then.prompt_section
        facts = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(user=USER.user), as_of=SEPT_15,
                                            include_episodes=False, timeout_ms=10_000))
        assert [i.fact for i in facts.items] and all("Postgres" in i.fact for i in facts.items), facts.items
        assert "until 2026-10-01" in facts.prompt_section  # true then, and when it ended

        facts_only = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(user=USER.user),
                                                 include_episodes=False, timeout_ms=10_000))
        assert not any("Postgres" in i.fact for i in facts_only.items), [i.fact for i in facts_only.items]

        ended = await ask(nc, RecallRequest(query="billing service database", scopes=RecallScopes(user=USER.user),
                                            invalid_at=TimeRange(after=SEPT_15), include_episodes=False,
                                            timeout_ms=10_000))
        assert [i.fact for i in ended.items] and all("Postgres" in i.fact for i in ended.items), ended.items


async def test_a_question_naming_a_day_reads_what_was_said_that_day_first(clean_nats, falkordb_server,  # noqa: ANN001
                                                                          tmp_path) -> None:
    """Billing talked about on 1 September and again, in more of the question's words, on 1
    October: asked what was said about it on 1 September, recall puts that day's items first
    (ENGRAM_RECALL_PERIOD_LIFT; checked to fail with it 0)."""
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        await _say(nc, "sept", SEPT_1, "Billing exports run nightly.", "Noted.")
        await _say(nc, "oct", OCT_1, "The billing service team said the billing service invoices changed.", "Noted.")
        question = "What did we say about the billing service on 1 September 2026?"
        answer = await ask(nc, RecallRequest(query=question, scopes=RecallScopes(user=USER.user), timeout_ms=10_000))
        assert not answer.degraded, answer.reason
        assert answer.items and answer.items[0].valid_at is not None, answer.items
        assert answer.items[0].valid_at.date() == SEPT_1.date(), [(i.fact, i.valid_at) for i in answer.items]
        assert any(i.valid_at and i.valid_at.date() == OCT_1.date() for i in answer.items)  # moved down, not out
