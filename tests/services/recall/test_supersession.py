"""Knowledge updates in recall (issue 24, item 4): a past turn whose every fact was superseded is
marked and never outranks the turn that superseded it. Pure stages first, then the trial's own
pair end to end (real turn-detector, extractor with the offline rules model, recall; real NATS
and FalkorDB)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from engram.schemas import RecallItem, RecallRequest, RecallScopes, subjects
from engram.services.recall.merge import render_line
from engram.services.recall.supersession import StoredFact, Supersession, reorder, superseded_turns
from tests.services.recall.test_fact_changes import MONDAY, THURSDAY, USER, _say
from tests.services.recall.test_service import ask, stack

NOW = datetime(2026, 4, 1, tzinfo=timezone.utc)


def turn(uuid: str, text: str = "") -> RecallItem:
    return RecallItem(uuid=uuid, fact=text or uuid, kind="episode", group_id="g", valid_at=MONDAY)


def test_a_turn_is_superseded_only_when_every_fact_of_it_ended() -> None:
    facts = [
        StoredFact("f1", ("old",), THURSDAY, THURSDAY),          # ended
        StoredFact("f2", ("mixed",), THURSDAY, THURSDAY),        # ended ...
        StoredFact("f3", ("mixed",), None, None),                # ... but this one holds
        StoredFact("f4", ("future",), NOW + timedelta(days=9), None),  # ends later: holds now
    ]
    assert superseded_turns(["old", "mixed", "future", "no-facts"], facts, NOW) == {"old": THURSDAY}


def test_the_superseding_turn_comes_first_and_the_old_one_is_marked() -> None:
    old, other, new = turn("old", "uses Postgres"), turn("other"), turn("new", "switched to SQLite")
    found = {"old": Supersession(THURSDAY, [new])}
    # the search ranked the old turn first and did not find the new one at all
    ordered = reorder([old, other], found)
    assert [i.uuid for i in ordered] == ["new", "old", "other"]
    assert ordered[1].invalid_at == THURSDAY and "superseded 2026-03-05" in render_line(ordered[1])
    assert "superseded" not in render_line(ordered[0])
    # found lower down, the new turn is pulled up, never listed twice
    assert [i.uuid for i in reorder([old, other, new], found)] == ["new", "old", "other"]
    # a chain: old -> newer -> newest
    newer, newest = turn("newer"), turn("newest")
    chain = {"old": Supersession(THURSDAY, [newer]), "newer": Supersession(NOW, [newest])}
    assert [i.uuid for i in reorder([old], chain)] == ["newest", "newer", "old"]


async def test_the_trial_pair_recall_puts_the_switch_before_the_superseded_turn(
    clean_nats, falkordb_server, tmp_path  # noqa: ANN001
) -> None:
    """The trial: "are we still on Postgres for billing?" listed the Postgres turn first, unmarked."""
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        await _say(nc, "monday", MONDAY, "The billing service uses Postgres 15.", "Noted.")
        await _say(nc, "thursday", THURSDAY, "We switched the billing service to SQLite.", "Noted.")
        await _say(nc, "friday", THURSDAY + timedelta(days=1), "Thanks, that's all for today.", "Bye!")

        response = await ask(nc, RecallRequest(query="are we still on Postgres for billing?",
                                               scopes=RecallScopes(user=USER.user), timeout_ms=10_000))
        assert not response.degraded, response.reason
        turns = [i for i in response.items if i.kind == "episode"]
        postgres = next(i for i, t in enumerate(turns) if "Postgres" in t.fact)
        sqlite = next(i for i, t in enumerate(turns) if "SQLite" in t.fact)
        assert sqlite < postgres, [t.fact for t in turns]
        assert turns[postgres].invalid_at == THURSDAY
        assert "superseded" in response.prompt_section.split("Postgres")[1].split("\n")[0], response.prompt_section
        assert group_of(settings) == turns[postgres].group_id


def group_of(settings) -> str:  # noqa: ANN001
    return subjects.user_group(settings.group_prefix, USER.user)
