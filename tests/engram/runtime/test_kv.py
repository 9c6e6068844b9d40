"""engram.runtime.kv against a real NATS server: every current entry, none removed, no bucket."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import nats
import pytest

from engram.runtime.kv import current_entries


@pytest.fixture
async def js(clean_nats: str) -> AsyncIterator[Any]:
    nc = await nats.connect(clean_nats)
    yield nc.jetstream()
    await nc.close()


async def entries(js: Any, bucket: str) -> dict[str, bytes]:
    return {key: value async for key, value in current_entries(js, bucket)}


async def test_every_current_entry_and_none_removed(js: Any) -> None:
    kv = await js.create_key_value(bucket="engram_test_entries", history=5)
    for i in range(40):
        await kv.put(f"s{i}", f"v{i}".encode())
    await kv.put("s3", b"newer")  # the latest revision counts
    await kv.delete("s5")
    await kv.purge("s7")
    got = await entries(js, "engram_test_entries")
    expected = {f"s{i}": f"v{i}".encode() for i in range(40) if i not in (5, 7)} | {"s3": b"newer"}
    assert got == expected
    # read again right after: the same, every time (nats-py's watcher could stop short)
    for _ in range(5):
        assert await entries(js, "engram_test_entries") == expected


async def test_a_missing_bucket_has_no_entries(js: Any) -> None:
    assert await entries(js, "engram_no_such_bucket") == {}


async def test_more_keys_than_a_fetch_and_the_count_is_known_first(js: Any) -> None:
    from engram.runtime.kv import FETCH_BATCH, last_values

    kv = await js.create_key_value(bucket="engram_test_many", history=1)
    n = FETCH_BATCH * 2 + 37
    await asyncio.gather(*(kv.put(f"k{i}", b"x") for i in range(n)))
    await kv.delete("k0")
    async with last_values(js, "engram_test_many") as (keys, found):
        assert keys == n  # the deleted key's marker counts
        assert {k async for k, _ in found} == {f"k{i}" for i in range(1, n)}
