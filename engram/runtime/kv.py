"""A KV bucket's current entries, read from its stream key by key.

Why not nats-py's ``KeyValue.keys()`` / ``watchall()``: their watcher may report "no more
initial values" before it has delivered them (seen as a missed turn-detector checkpoint in
tests/engram/runtime/test_topology.py, 1 run in 3), and the callers here must see every entry:
a stream migration that misses a checkpoint restarts ENGRAM_IN below it, and a group's erasure
that misses a session leaves that session's raw input behind.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import nats.js.errors
from nats.js import JetStreamContext

_REMOVED = ("DEL", "PURGE")


async def current_entries(js: JetStreamContext, bucket: str) -> AsyncIterator[tuple[str, bytes]]:
    """(key, value) of every key of ``bucket`` that holds a value now (deleted and purged keys
    left out); nothing when the bucket does not exist. One request for the key list and one per
    key: for the rare whole-bucket reads (migration, erasure), not for a hot path."""
    stream = f"KV_{bucket}"
    prefix = f"$KV.{bucket}."
    try:
        info = await js.stream_info(stream, subjects_filter=f"{prefix}>")
    except nats.js.errors.NotFoundError:
        return
    for subject in sorted(info.state.subjects or {}):
        try:
            msg = await js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError:
            continue  # removed since the listing
        if (msg.headers or {}).get("KV-Operation") in _REMOVED:
            continue
        yield subject[len(prefix):], msg.data or b""
