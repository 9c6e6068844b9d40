"""BatchingEmbedder (engram/models/embedding_cache.py) over the real HashingEmbedder, counted by
the bench's CountingEmbedder (every call and text that reaches the model)."""

from __future__ import annotations

import asyncio

import pytest
from graphiti_core.embedder.client import EmbedderClient

from bench.extraction_embeddings import CountingEmbedder
from engram.models.embedding_cache import BatchingEmbedder
from engram.models.hashing_embedder import HashingEmbedder, hash_embed


def wrapped(max_entries: int = 4096) -> tuple[BatchingEmbedder, CountingEmbedder]:
    counting = CountingEmbedder(HashingEmbedder(64))
    return BatchingEmbedder(counting, max_entries=max_entries), counting


async def test_vectors_are_the_inner_embedders_exactly() -> None:
    embedder, _ = wrapped()
    assert await embedder.create(["Alice works at Microsoft."]) == hash_embed("Alice works at Microsoft.", 64)
    assert await embedder.create("Alice") == hash_embed("Alice", 64)
    assert await embedder.create_batch(["a b", "c d", "a b"]) == [hash_embed(t, 64) for t in ("a b", "c d", "a b")]
    assert await embedder.create_batch([]) == []


async def test_each_text_is_embedded_once() -> None:
    embedder, counting = wrapped()
    await embedder.create_batch(["Alice", "Bob", "Alice"])
    await embedder.create(["Bob"])
    await embedder.create_batch(["Alice", "Bob"])
    assert (counting.calls, counting.texts) == (1, 2)
    await embedder.create_batch(["Alice", "Carol"])  # only the new text is sent
    assert (counting.calls, counting.texts) == (2, 3)
    assert (embedder.calls, embedder.texts) == (2, 3)


async def test_a_returned_vector_is_a_copy() -> None:
    embedder, _ = wrapped()
    first = await embedder.create(["Alice"])
    first[0] = 99.0
    assert await embedder.create(["Alice"]) == hash_embed("Alice", 64)


async def test_concurrent_misses_make_one_call() -> None:
    """graphiti gathers the resolved and the invalidated facts' embeddings: one call for both."""
    embedder, counting = wrapped()
    a, b, c = await asyncio.gather(embedder.create_batch(["fact 1", "fact 2"]), embedder.create_batch(["fact 3"]),
                                   embedder.create(["fact 1"]))
    assert (counting.calls, counting.texts) == (1, 3)
    assert a == [hash_embed("fact 1", 64), hash_embed("fact 2", 64)] and b == [hash_embed("fact 3", 64)]
    assert c == hash_embed("fact 1", 64)


async def test_prefetch_makes_later_requests_free() -> None:
    embedder, counting = wrapped()
    await embedder.prefetch(["the turn", "Alice", "", "Alice works at Microsoft.", "Alice"])
    assert (counting.calls, counting.texts) == (1, 3)  # the empty text is not embedded
    await embedder.create_batch(["Alice"])
    await embedder.create_batch(["Alice works at Microsoft."])
    await embedder.create(["the turn"])
    assert counting.calls == 1


async def test_the_least_recently_used_vector_goes_first() -> None:
    embedder, counting = wrapped(max_entries=2)
    await embedder.create_batch(["a", "b"])
    await embedder.create(["a"])  # a is now the most recent
    await embedder.create(["c"])  # evicts b
    assert counting.texts == 3
    await embedder.create(["a"])
    assert counting.texts == 3
    await embedder.create(["b"])
    assert counting.texts == 4
    with pytest.raises(ValueError, match="max_entries"):
        BatchingEmbedder(HashingEmbedder(64), max_entries=0)


class Failing(EmbedderClient):
    """A real embedder that is down for its first ``failures`` calls."""

    def __init__(self, failures: int) -> None:
        self.inner, self.failures, self.calls = HashingEmbedder(64), failures, 0

    async def create(self, input_data):  # noqa: ANN001, ANN201
        return (await self.create_batch([input_data[0]]))[0]

    async def create_batch(self, input_data_list):  # noqa: ANN001, ANN201
        self.calls += 1
        await asyncio.sleep(0)
        if self.calls <= self.failures:
            raise ConnectionError("embedder down")
        return await self.inner.create_batch(input_data_list)


async def test_a_failure_reaches_every_waiter_and_is_not_cached() -> None:
    embedder = BatchingEmbedder(Failing(failures=1))
    results = await asyncio.gather(embedder.create(["a"]), embedder.create_batch(["a", "b"]), return_exceptions=True)
    assert [type(r) for r in results] == [ConnectionError, ConnectionError]
    assert await embedder.create_batch(["a", "b"]) == [hash_embed("a", 64), hash_embed("b", 64)]


async def test_a_failed_prefetch_is_left_to_the_callers() -> None:
    embedder = BatchingEmbedder(Failing(failures=1))
    await embedder.prefetch(["a"])  # logged, not raised
    assert await embedder.create(["a"]) == hash_embed("a", 64)


async def test_a_cancelled_caller_does_not_cancel_the_batch_others_wait_for() -> None:
    embedder = BatchingEmbedder(Failing(failures=0))
    first = asyncio.ensure_future(embedder.create(["a"]))
    second = asyncio.ensure_future(embedder.create(["a"]))
    await asyncio.sleep(0)  # both are waiting for the one batch
    first.cancel()
    assert await second == hash_embed("a", 64)
    assert first.cancelled()


async def test_token_ids_go_to_the_inner_embedder_as_they_are() -> None:
    embedder, counting = wrapped()
    assert await embedder.create([1, 2, 3]) == await HashingEmbedder(64).create([1, 2, 3])
    assert counting.calls == 1


def test_around_keeps_a_shared_cache() -> None:
    shared = BatchingEmbedder(HashingEmbedder(64))
    assert BatchingEmbedder.around(shared) is shared
    fresh = BatchingEmbedder.around(HashingEmbedder(64))
    assert isinstance(fresh, BatchingEmbedder) and fresh is not shared
