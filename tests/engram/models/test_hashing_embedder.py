"""The hashing embedder: deterministic, normalised, lexical similarity ordering."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from engram.models.hashing_embedder import HashingEmbedder, hash_embed


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


async def test_deterministic_and_normalised() -> None:
    e = HashingEmbedder(dim=128)
    v1 = await e.create("Pin pydantic to 2.14 in pyproject.toml")
    v2 = await e.create(["Pin pydantic to 2.14 in pyproject.toml"])
    assert v1 == v2 and len(v1) == 128
    assert math.isclose(math.sqrt(sum(x * x for x in v1)), 1.0, rel_tol=1e-9)
    assert await e.create_batch(["a b", "Pin pydantic to 2.14 in pyproject.toml"]) == [hash_embed("a b", 128), v1]


async def test_lexical_neighbours_are_closer_than_unrelated_text() -> None:
    e = HashingEmbedder(dim=256)
    q = await e.create("Caroline went to the LGBTQ support group")
    near = await e.create("Caroline attended an LGBTQ support group meeting")
    far = await e.create("Melanie painted a sunrise over the lake")
    assert cos(q, near) > cos(q, far) + 0.2


@given(st.text(max_size=200))
def test_total_and_bounded(text: str) -> None:
    v = hash_embed(text, 64)
    assert len(v) == 64
    assert all(-1.0 <= x <= 1.0 for x in v)
