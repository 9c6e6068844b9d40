"""Small text helpers: the entity-name guard."""

from __future__ import annotations


import pytest

from engram.models.rules_llm import is_safe_entity_name


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
