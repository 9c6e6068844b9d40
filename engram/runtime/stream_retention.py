"""Keeping engram's streams bounded without dropping anything unprocessed.

The work streams (input, episodes, deltas, closed sessions) and the dead letters have no max age
(engram/runtime/topology.py): an age bound would drop a message no consumer has processed yet, silently,
after a long outage. Instead:

* :func:`sweep_processed` removes the messages *every* durable consumer of a stream has
  acknowledged and that are older than ``ENGRAM_PROCESSED_RETENTION_S`` (kept that long for replay
  and audit). A message some consumer has not acknowledged stays, however old.
* every stream is bounded by ``ENGRAM_STREAM_MAX_BYTES``; a full work stream refuses new messages
  (discard NEW: the publisher gets an error, :func:`is_stream_full`), and
  ``engram_stream_fill_ratio{stream}`` lets EngramStreamNearlyFull fire at 80% before that.

:class:`StreamKeeper` runs both on a timer in each service, for the streams it consumes. Several
replicas sweeping the same stream is harmless: a purge below a sequence is idempotent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

import nats.js.errors
from nats.js.api import AckPolicy
from prometheus_client import Counter, Gauge

from engram.tasks import Periodic

log = logging.getLogger("engram.stream_retention")

FILL_RATIO = Gauge("engram_stream_fill_ratio", "Bytes an engram stream holds over its size bound (0-1).", ["stream"])
PURGED = Counter("engram_stream_purged_messages_total",
                 "Processed messages removed from a stream after ENGRAM_PROCESSED_RETENTION_S.", ["stream"])
# nats-server's answers to a publish into a stream at its bound with discard NEW
STREAM_FULL_CODES = {10077, 10047, 10028}  # maximum messages / bytes exceeded, insufficient resources


def is_stream_full(exc: BaseException) -> bool:
    """``exc`` (from a JetStream publish) says the stream is at its size bound."""
    code = getattr(exc, "err_code", None)
    description = (getattr(exc, "description", None) or "").lower()
    return code in STREAM_FULL_CODES or "maximum bytes" in description or "maximum messages" in description


async def processed_floor(js: Any, stream: str, info: Any = None) -> int | None:
    """The lowest stream sequence some durable consumer of ``stream`` has not acknowledged (every
    message below it is processed by all of them); None when the stream has no durable consumer
    with explicit acks (nothing says what is processed: keep everything). ``info``: the stream's
    info when the caller has it already."""
    info = info or await js.stream_info(stream)
    last = int(info.state.last_seq or 0)
    floors: list[int] = []
    for consumer in await js.consumers_info(stream):
        config = consumer.config
        if not config.durable_name or config.ack_policy != AckPolicy.EXPLICIT:
            continue  # an ordered reader (the demo, an explorer) holds nothing back
        if not (consumer.num_pending or 0) and not (consumer.num_ack_pending or 0):
            floors.append(last + 1)  # everything its filter matches is acknowledged
        else:
            floors.append(int(consumer.ack_floor.stream_seq if consumer.ack_floor else 0) + 1)
    return min(floors) if floors else None


async def first_seq_at_or_after(js: Any, stream: str, low: int, high: int, cutoff: float) -> int:
    """The first sequence in [low, high) whose message was stored at ``cutoff`` (epoch seconds)
    or later, ``high`` when none: a binary search over "the first message at or after seq"
    (stream times grow with sequences; deleted sequences are skipped by the lookup)."""
    while low < high:
        mid = (low + high) // 2
        try:
            msg = await js.get_msg(stream, seq=mid, subject=">", next=True)
        except nats.js.errors.NotFoundError:
            return high  # nothing stored at or after mid
        stored = msg.time.timestamp() if getattr(msg, "time", None) else time.time()
        if stored >= cutoff or (msg.seq or mid) >= high:
            high = mid
        else:
            low = (msg.seq or mid) + 1
    return low


async def sweep_processed(js: Any, stream: str, retention_s: float, now: float | None = None,
                          info: Any = None) -> int:
    """Remove the messages of ``stream`` every durable consumer has processed and that were stored
    more than ``retention_s`` ago; returns how many went. ``info``: as for :func:`processed_floor`."""
    info = info or await js.stream_info(stream)
    floor = await processed_floor(js, stream, info)
    if floor is None:
        return 0
    first, before = int(info.state.first_seq or 0), int(info.state.messages or 0)
    if not before or floor <= first:
        return 0
    upto = await first_seq_at_or_after(js, stream, first, floor, (now or time.time()) - retention_s)
    if upto <= first:
        return 0
    await js.purge_stream(stream, seq=upto)  # every message below upto
    gone = before - int((await js.stream_info(stream)).state.messages or 0)
    if gone > 0:
        PURGED.labels(stream=stream).inc(gone)
        log.info("stream %s: %d processed message(s) older than %.0f s removed", stream, gone, retention_s)
    return max(gone, 0)


def report_fill(stream: str, info: Any) -> float | None:
    """Set ``engram_stream_fill_ratio{stream}`` from the stream's ``info``; returns it (None
    without a size bound)."""
    bound = info.config.max_bytes or 0
    if bound <= 0:
        return None
    ratio = min(1.0, int(info.state.bytes or 0) / bound)
    FILL_RATIO.labels(stream=stream).set(ratio)
    return ratio


class StreamKeeper(Periodic):
    """Every ``interval_s``: reports the fill of ``sweep`` and ``watch`` streams, and removes the
    processed messages of ``sweep`` older than ``retention_s``."""

    name = "stream keeper"

    def __init__(self, sweep: Sequence[str], retention_s: float, *, watch: Sequence[str] = (),
                 interval_s: float = 300.0, clock: Callable[[], float] = time.time) -> None:
        self.sweep = list(sweep)
        self.watch = list(watch)
        self.retention_s = retention_s
        self.interval_s = interval_s
        self.clock = clock

    async def run_once(self, js: Any) -> dict[str, int]:
        purged: dict[str, int] = {}
        for stream in [*self.sweep, *self.watch]:
            try:
                info = await js.stream_info(stream)
                if stream in self.sweep:
                    purged[stream] = await sweep_processed(js, stream, self.retention_s, self.clock(), info)
                    if purged[stream]:
                        info = await js.stream_info(stream)  # the fill after the sweep
                report_fill(stream, info)
            except Exception as exc:  # noqa: BLE001 - NATS restarting, stream not made yet: next round
                log.debug("stream keeper: %s skipped (%s)", stream, type(exc).__name__)
        return purged

    tick = run_once  # every interval_s, as a Periodic
