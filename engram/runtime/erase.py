"""Erasing stored messages from JetStream so their bytes leave the disk.

Checked against nats-server 2.15 (the binary engram ships): a purge -- filtered or not -- and a
KV replacement remove messages from the index but leave their bytes in the stream's block files
until the whole block is dropped; ``STREAM.MSG.DELETE`` without ``no_erase`` overwrites the
stored message, so a deleted secret is gone from disk. Every deletion engram makes for privacy
(processed raw input, superseded session checkpoints, a deleted group or episode) therefore
goes through :func:`erase_where`: walk the subject's messages with direct gets and erase each
one that matches. One request per message: fine for deletes and for the background retention
sweep; nothing on a hot path waits on it.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import RawStreamMsg
from prometheus_client import Counter

log = logging.getLogger("engram.erase")

ERASED = Counter(
    "engram_erased_messages_total",
    "Stored messages erased from JetStream (overwritten on disk), by why: retention, delete.",
    ["why"],
)

Predicate = Callable[[RawStreamMsg], bool | Awaitable[bool]]


@dataclass
class EraseStats:
    seen: int = 0
    erased: int = 0


async def erase_where(
    js: JetStreamContext,
    stream: str,
    subject: str,
    predicate: Predicate | None = None,
    *,
    below_seq: int | None = None,
    start_seq: int = 1,
    why: str = "delete",
) -> EraseStats:
    """Erase the messages of ``stream`` on ``subject`` (wildcards allowed) for which
    ``predicate`` holds (all when None), from ``start_seq`` up to but excluding ``below_seq``."""
    stats = EraseStats()
    seq = max(1, start_seq)
    while below_seq is None or seq < below_seq:
        try:
            msg = await js.get_msg(stream, seq=seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            break
        if msg.seq is None or (below_seq is not None and msg.seq >= below_seq):
            break
        stats.seen += 1
        keep = False
        if predicate is not None:
            verdict = predicate(msg)
            if not isinstance(verdict, bool):
                verdict = await verdict
            keep = not verdict
        if not keep:
            try:
                await js.delete_msg(stream, msg.seq)
                stats.erased += 1
                ERASED.labels(why=why).inc()
            except nats.js.errors.NotFoundError:
                pass  # already gone (another replica, a limit)
            except nats.js.errors.APIError as exc:
                if getattr(exc, "err_code", None) == 10057:  # stream refuses deletes (old KV bucket)
                    log.warning("%s refuses message deletes; cannot erase", stream)
                    break
                raise
        seq = msg.seq + 1
    return stats
