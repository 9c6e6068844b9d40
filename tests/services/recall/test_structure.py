"""Recall's structure over plain ranking: the turn that follows a matched one, and facts left out
when the turn they came from is already in the answer, and turns left out when a fact of theirs
is (services/recall/lexical.py, merge.py)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from engram.schemas import Provenance, RecallItem
from engram.services.recall.lexical import Doc, EpisodeIndex
from engram.services.recall.merge import drop_covered_facts, drop_covered_turns
from engram.services.recall.search import shorten

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def turn(i: int, text: str, minutes: int) -> Doc:
    return Doc.of({"uuid": f"t{i}", "content": text, "valid_at": T0 + timedelta(minutes=minutes),
                   "created_at": T0 + timedelta(days=1, minutes=-minutes)})  # written in reverse order


def test_following_is_the_next_turn_in_time_not_in_write_order() -> None:
    index = EpisodeIndex.of([turn(2, "c", 2), turn(0, "a", 0), turn(1, "b", 1)])
    assert index.following("t0").uuid == "t1" and index.following("t1").uuid == "t2"
    assert index.following("t2") is None and index.following("nope") is None
    index.remove("t1")  # a delete re-links its neighbours
    assert index.following("t0").uuid == "t2"
    index.add(turn(3, "d", 3))
    assert index.following("t2").uuid == "t3"


def episode(uuid: str) -> RecallItem:
    return RecallItem(uuid=uuid, fact=f"turn {uuid}", kind="episode", group_id="g",
                      provenance=[Provenance(episode_id=uuid, message_ids=[f"{uuid}-m"])])


def fact(uuid: str, *episodes: str) -> RecallItem:
    return RecallItem(uuid=uuid, fact=f"fact {uuid}", group_id="g",
                      provenance=[Provenance(episode_id=e, message_ids=[f"{e}-m"]) for e in episodes])


def test_a_fact_is_dropped_only_when_every_source_turn_is_shown_above_it() -> None:
    items = [fact("f0", "e1"), episode("e1"), fact("f1", "e1"), fact("f2", "e1", "e2"), episode("e2"),
             fact("f3", "e1", "e2"), fact("f4"), fact("f5", "e9")]
    kept = [i.uuid for i in drop_covered_facts(items)]
    # f0 is above its turn; f2 needs e2 too, not yet shown; f4 has no provenance; f5's turn is not shown
    assert kept == ["f0", "e1", "f2", "e2", "f4", "f5"]


def test_a_turn_is_dropped_only_when_a_fact_from_it_is_shown_above_it() -> None:
    items = [episode("e0"), fact("f0", "e0"), fact("f1", "e1", "e2"), episode("e1"), fact("f2"), episode("e2"),
             episode("e3"), fact("f3", "e3")]
    kept = [i.uuid for i in drop_covered_turns(items)]
    # e0 is above its fact; e1 and e2 came from f1, shown above them; e3's fact is below it
    assert kept == ["e0", "f0", "f1", "f2", "e3", "f3"]
    assert [i.uuid for i in drop_covered_turns(drop_covered_facts(items))] == ["e0", "f1", "f2", "e3"]


def test_a_named_speaker_is_labelled_by_the_name_alone() -> None:
    turn_text = "user (Caroline): I went to the support group\nyesterday.\n\nassistant (Melanie): How was it?"
    assert shorten(turn_text) == "user (Caroline): I went to the support group yesterday. assistant (Melanie): How was it?"
    assert shorten(turn_text, speaker_names=True) == "Caroline: I went to the support group yesterday. Melanie: How was it?"
    # an unnamed speaker keeps its role; a label inside a line is text, not a speaker
    assert shorten("user: see user (x): here\n\nassistant: ok", speaker_names=True) == "user: see user (x): here assistant: ok"
    assert shorten("user (Caroline): " + "a" * 50, 30, speaker_names=True) == "Caroline: " + "a" * 19 + "…"
