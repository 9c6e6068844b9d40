"""Verbs -> relations: the relation the nearest verb phrase gives, passives marked."""

from __future__ import annotations

import pytest

from engram.models.rules_llm import VERB_RELATIONS
from engram.models.rules_llm.relations import _find_verbs


@pytest.mark.parametrize(
    ("text", "relations"),
    [
        ("She moved to Austin and works at Google.", [("LIVES_IN", False), ("WORKS_AT", False)]),
        ("The crash was caused by a null pointer.", [("CAUSES", True)]),
        ("We decided to use httpx instead.", [("DECIDED", False), ("USES", False)]),
        ("Nothing here at all.", []),
        # an activity and its end; "go"/"stop" only before a gerund
        ("Mo plays golf on Fridays.", [("DOES", False)]),
        ("Ben goes climbing on Saturdays.", [("DOES", False)]),
        ("Lena quit swimming and Raj gave up the violin.", [("QUIT", False), ("QUIT", False)]),
        ("Jo stopped running.", [("QUIT", False), ("RUNS", False)]),
        ("I stopped the server and went home.", []),
    ],
)
def test_find_verbs(text: str, relations: list[tuple[str, bool]]) -> None:
    hits = _find_verbs(text)
    assert [(h.relation, h.passive) for h in hits] == relations
    assert [h.start for h in hits] == sorted(h.start for h in hits)
    assert all(text[h.start:h.end].strip() for h in hits)


def test_relations_are_screaming_snake_case() -> None:
    assert all(rel == rel.upper() and " " not in rel for _, rel, _ in VERB_RELATIONS)
