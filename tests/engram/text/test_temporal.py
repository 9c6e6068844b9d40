"""Temporal grounding (engram/text/temporal.py): relative time expressions resolved against the day
they were said, on the labelled corpus tests/engram/text/data/relative_dates.json (positives and
decoys), and ground()'s contract: inline labels, idempotent, text unchanged otherwise."""

from __future__ import annotations

import json
from datetime import date, datetime, timezone
from pathlib import Path

import pytest

from engram.models.rules_llm.dates import fact_timestamps
from engram.text.temporal import find_relative, ground, mentions_date, strip_grounding

CORPUS = json.loads((Path(__file__).parent / "data" / "relative_dates.json").read_text(encoding="utf-8"))["cases"]
POSITIVES = [c for c in CORPUS if c["date"] is not None]
DECOYS = [c for c in CORPUS if c["date"] is None]


def _said(case: dict) -> datetime:
    # mid-afternoon UTC: the day must not depend on the time of day
    return datetime.fromisoformat(case["said"]).replace(hour=15, tzinfo=timezone.utc)


def test_corpus_is_large_enough_and_has_decoys() -> None:
    assert len(POSITIVES) >= 30 and len(DECOYS) >= 10


@pytest.mark.parametrize("case", POSITIVES, ids=[c["text"] for c in POSITIVES])
def test_relative_expression_resolves_to_its_date(case: dict) -> None:
    hits = find_relative(case["text"], _said(case))
    assert [(case["text"][h.start : h.end], h.value.isoformat(), h.label()) for h in hits] == [
        (case["expression"], case["date"], case["label"])
    ]


@pytest.mark.parametrize("case", POSITIVES, ids=[c["text"] for c in POSITIVES])
def test_ground_writes_the_label_after_the_expression_once(case: dict) -> None:
    grounded = ground(case["text"], _said(case))
    assert f"{case['expression']} ({case['label']})" in grounded
    assert grounded.replace(f" ({case['label']})", "", 1) == case["text"]
    assert ground(grounded, _said(case)) == grounded
    assert strip_grounding(grounded) == case["text"]
    assert mentions_date(grounded) and not mentions_date(case["text"])


def _expected_valid_at(case: dict) -> str:
    """The resolved day; for a future one the time it was said, as graphiti's timestamp
    prompts ask ("a future-tense plan ... set valid_at to the episode timestamp")."""
    if case["date"] > case["said"]:
        return _said(case).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{case['date']}T00:00:00Z"


@pytest.mark.parametrize("case", POSITIVES, ids=[c["text"] for c in POSITIVES])
def test_fact_valid_at_is_the_resolved_date(case: dict) -> None:
    """The rules model's fact timestamps (graphiti's edge and timestamp prompts) use the same
    resolution: the date said, not the day it was said on -- from the raw fact and from the
    grounded one the rules model stores."""
    expected = (_expected_valid_at(case), None)
    assert fact_timestamps(case["text"], _said(case)) == expected
    assert fact_timestamps(ground(case["text"], _said(case)), _said(case)) == expected


def test_corpus_has_past_and_future_cases() -> None:
    assert sum(c["date"] > c["said"] for c in POSITIVES) >= 10
    assert sum(c["date"] < c["said"] for c in POSITIVES) >= 20


@pytest.mark.parametrize("case", DECOYS, ids=[c["text"] for c in DECOYS])
def test_decoys_are_left_alone(case: dict) -> None:
    assert find_relative(case["text"], _said(case)) == []
    assert ground(case["text"], _said(case)) == case["text"]
    assert strip_grounding(case["text"]) == case["text"]
    assert fact_timestamps(case["text"], _said(case)) == (None, None)


def test_ground_without_reference_or_text_is_identity() -> None:
    assert ground("I went there last Friday", None) == "I went there last Friday"
    assert ground("", datetime(2023, 5, 12, tzinfo=timezone.utc)) == ""


def test_ground_several_expressions_in_one_turn() -> None:
    text = "user (Calvin): I had a car incident last Friday.\n\nassistant: Oh no! Two weeks ago you got the car."
    assert ground(text, date(2023, 5, 12)) == (
        "user (Calvin): I had a car incident last Friday (2023-05-05).\n\n"
        "assistant: Oh no! Two weeks ago (2023-04-28) you got the car."
    )


def test_the_reference_day_is_taken_in_utc() -> None:
    late_in_tokyo = datetime.fromisoformat("2023-05-13T01:00:00+09:00")  # 2023-05-12 16:00 UTC
    assert ground("I called her yesterday", late_in_tokyo) == "I called her yesterday (2023-05-11)"


def test_ground_keeps_text_that_already_holds_a_parenthesis_after_the_expression() -> None:
    text = "I saw it last Friday (the 5th) at noon"
    assert ground(text, date(2023, 5, 12)) == text


def test_mentions_date_on_absolute_forms() -> None:
    for text in ("on 2023-05-05", "on 8 May 2023", "on May 8, 2023", "in May 2023", "back in 2019", "summer 2022",
                 "last year (2022)"):
        assert mentions_date(text), text
    for text in ("I may go", "I have 2000 stamps", "room 2023", "last Friday", "version 3.11"):
        assert not mentions_date(text), text


def test_strip_grounding_keeps_parentheses_people_wrote() -> None:
    for text in ("I was born in Paris (France) last year.", "We met in 2019 (2019-06-01, a Saturday).",
                 "The release (2023-05-05) was late."):
        assert strip_grounding(text) == text
    turn = "user (Calvin): I had a car incident last Friday.\n\nassistant: Two weeks ago you got the car?"
    assert strip_grounding(ground(turn, date(2023, 5, 12))) == turn
