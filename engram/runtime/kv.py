"""A KV bucket's keys and current values, every one of them.

Why not nats-py's ``KeyValue.keys()`` / ``watchall()``: their watcher may report "no more
initial values" before it has delivered them (seen as a missed turn-detector checkpoint in
tests/engram/runtime/test_topology.py, 1 run in 3, and as short counts in `engram status` on a
loaded server), and the callers here must see every entry: a stream migration that misses a
checkpoint restarts ENGRAM_IN below it, and a group's erasure that misses a session leaves that
session's raw input behind. Instead an ephemeral pull consumer over the last message of every
key: its ``num_pending`` before the first fetch is exactly the number of keys, so the read knows
when it has seen them all, at any bucket size.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats.errors
import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

_REMOVED = ("DEL", "PURGE")
FETCH_BATCH = 500
FETCH_TIMEOUT_S = 10.0


async def _nothing() -> AsyncIterator[tuple[str, bytes]]:
    return
    yield  # an async generator that yields nothing


@asynccontextmanager
async def last_values(js: JetStreamContext, bucket: str) -> AsyncIterator[tuple[int, AsyncIterator[tuple[str, bytes]]]]:
    """``(keys, entries)``: how many keys ``bucket`` has (a deleted key's marker counts), known
    before anything is read, and an iterator of (key, value) over those holding a value (deleted,
    purged and empty ones left out). ``(0, nothing)`` when the bucket does not exist."""
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    try:
        await js.stream_info(stream)
    except nats.js.errors.NotFoundError:
        yield 0, _nothing()
        return
    psub = await js.pull_subscribe(
        f"{prefix}>", stream=stream,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT, ack_policy=AckPolicy.NONE,
                              inactive_threshold=30.0, mem_storage=True),
    )
    try:
        expected = (await psub.consumer_info()).num_pending

        async def entries() -> AsyncIterator[tuple[str, bytes]]:
            seen = 0
            while seen < expected:
                try:
                    batch = await psub.fetch(min(FETCH_BATCH, expected - seen), timeout=FETCH_TIMEOUT_S)
                except nats.errors.TimeoutError:
                    if (await psub.consumer_info()).num_pending == 0:
                        return  # keys purged since the count: nothing more to read
                    raise
                for msg in batch:
                    seen += 1
                    if not msg.data or (msg.headers or {}).get("KV-Operation") in _REMOVED:
                        continue
                    yield msg.subject[len(prefix):], msg.data

        yield expected, entries()
    finally:
        await psub.unsubscribe()


async def current_entries(js: JetStreamContext, bucket: str) -> AsyncIterator[tuple[str, bytes]]:
    """(key, value) of every key of ``bucket`` that holds a value now (:func:`last_values`)."""
    async with last_values(js, bucket) as (_keys, entries):
        async for entry in entries:
            yield entry
