"""Raw input retention: erase what a checkpoint already covers.

The input stream is the turn-detector's log, but only until a checkpoint in KV covers an event:
after that, nothing reads the raw message again (replay starts after the checkpoint's
``last_seq``; a redelivery of an event at or below it only re-publishes the checkpoint's
outbox). Raw chat messages hold exactly what the scrubber removes from turns, so they should
not sit on disk for the stream's 7-day max age. After each checkpoint (once its publishes are
acknowledged) the session is queued here; ``input_retention_s`` later its input messages up to
the checkpoint and the KV revisions superseded by it are erased (:mod:`engram.runtime.erase`).

Limits (stated, not hidden): the queue is in memory. If the detector dies before a due erase,
the next checkpoint of the session erases everything below it (the walk starts at the
beginning of the stream when no cursor is known); a session that never checkpoints again keeps
its processed input until the stream's max age.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from nats.js import JetStreamContext

from engram.runtime.erase import erase_where
from engram.tasks import cancel_and_wait
from engram.schemas import subjects

log = logging.getLogger("engram.turn_detector.retention")

KV_STREAM = f"KV_{subjects.KV_TURN_SESSIONS}"


@dataclass
class _Due:
    at: float
    upto_seq: int
    kv_revision: int


class InputEraser:
    def __init__(self, js: JetStreamContext, retention_s: float, *, max_pending: int = 10_000,
                 clock=time.monotonic) -> None:  # noqa: ANN001
        self.js = js
        self.retention_s = retention_s
        self.max_pending = max_pending
        self.clock = clock
        self._due: OrderedDict[str, _Due] = OrderedDict()
        # session -> input sequence erased up to (exclusive): the next walk starts there.
        self._cursor: OrderedDict[str, int] = OrderedDict()
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def checkpointed(self, session_id: str, upto_seq: int, kv_revision: int, *, at_once: bool = False) -> None:
        """The session's checkpoint at ``kv_revision`` covers its input up to ``upto_seq``.
        ``at_once``: that input held a secret (scrubbed in the checkpoint): erase it now, whatever
        the retention, so a secret rests on disk only while its message waits to be processed."""
        previous = self._due.pop(session_id, None)
        at = previous.at if previous else self.clock() + self.retention_s  # the oldest data decides
        if at_once:
            at = min(at, self.clock())
        self._due[session_id] = _Due(at, max(upto_seq, previous.upto_seq if previous else 0), kv_revision)
        if at_once:
            self._due.move_to_end(session_id, last=False)  # erase_due stops at the first entry not due
        if self.retention_s == 0 or at_once or len(self._due) > self.max_pending:
            self._wake.set()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="input-eraser")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self) -> None:
        period = min(max(self.retention_s / 4, 0.05), 5.0)
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=period)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.erase_due()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - retried at the next period
                log.warning("erasing processed input failed: %s", type(exc).__name__)

    async def erase_due(self, *, everything: bool = False) -> int:
        """Erase the sessions whose retention passed (all queued with ``everything``)."""
        now = self.clock()
        erased = 0
        while self._due:
            session_id, due = next(iter(self._due.items()))
            if not everything and due.at > now and len(self._due) <= self.max_pending:
                break
            del self._due[session_id]
            erased += await self.erase_session(session_id, due.upto_seq, due.kv_revision)
        return erased

    async def erase_session(self, session_id: str, upto_seq: int, kv_revision: int) -> int:
        start = self._cursor.pop(session_id, 1)
        stats = await erase_where(self.js, subjects.STREAM_IN, f"engram.in.*.*.{session_id}",
                                  start_seq=start, below_seq=upto_seq + 1, why="retention")
        self._cursor[session_id] = max(start, upto_seq + 1)
        while len(self._cursor) > self.max_pending:
            self._cursor.popitem(last=False)
        kv = await erase_where(self.js, KV_STREAM, f"$KV.{subjects.KV_TURN_SESSIONS}.{session_id}",
                               below_seq=kv_revision, why="retention")
        return stats.erased + kv.erased
