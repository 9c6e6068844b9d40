"""Small text helpers: the entity-name guard, crude stems."""

from __future__ import annotations


import pytest

from engram.models.rules_llm import is_safe_entity_name
from engram.models.rules_llm.text import _content_stems, _stem


@pytest.mark.parametrize(
    ("name", "safe"),
    [
        ("Is", False), ("It", False), ("This", False), ("The", False), ("I", False), ("We", False),
        ("IT", False), ("it's", False), ("I'm", False), ("It Is", False), ("  the ", False), ("x", False),
        ("...", False), ("a" * 81, False), ("Caroline", True), ("src/app.py", True), ("The Beatles", True),
        ("pydantic==2.14", True), ("Is It Real", True),
    ],
)
def test_is_safe_entity_name(name: str, safe: bool) -> None:
    assert is_safe_entity_name(name) is safe


def test_a_doubled_consonant_before_ing_or_ed_meets_its_base() -> None:
    # "quit swimming" must meet "swims"; "falling"/"adding" keep the double of "falls"/"adds"
    for inflected, base in [("swimming", "swims"), ("stopped", "stops"), ("planned", "plans"), ("running", "runs"),
                            ("falling", "falls"), ("adding", "adds"), ("passed", "passes")]:
        assert _stem(inflected) == _stem(base), (inflected, base)


def test_irregular_negative_contractions_leave_no_stray_stem() -> None:
    assert _content_stems("The backup won't upload to Backblaze any more.") == ["backup", "upload", "backblaz"]
    assert _content_stems("Mo can’t play golf.") == _content_stems("Mo plays golf.")
