"""Strict per-group order over one shared durable: in-flight work bounded by the replicas' slots,
not by partitions.

Why: a durable per partition with ``max_ack_pending=1`` keeps a group's messages in order, but
it also caps the whole deployment at one message in flight per partition (4 by default, whatever
the replicas and their slots), and one slow or hung group stalls every group hashed to its
partition. NATS has no per-subject ack limit (nats-server#4273), and more partitions only make
collisions rarer (docs/architecture.md, "Group order": with 64 groups on 32 slots, 256
partitions still reach only ~67% of the slot bound in simulation).

How (one durable for the stage, any number of groups; :class:`GroupOrder`):

- The stream stays the group's queue: its messages are read in order with STREAM.MSG.GET
  ``next_by_subj`` (the first message of the group after a sequence).
- A record per group in the KV bucket ``engram_group_order`` (leader reads: no stale direct
  gets): ``done``, the last stream sequence of the group processed (or dead-lettered);
  ``attempts`` at the message after it; and a lease (``owner``, ``until``, ``trigger``). Every
  write is a compare-and-set on the record's revision.
- A delivery of the durable is a doorbell. Already done: acked. Group leased by a live owner:
  acked, the owner's chain reaches it (the owner looks again after it releases the lease, so a
  message that arrives while it lets go is not orphaned). Otherwise the replica takes the
  lease and works through the group's messages after ``done`` in order, one slot for the whole
  chain, holding the delivery that woke it (the *trigger*) unacknowledged until the chain ends.
- Crash at any point: the trigger is redelivered after the ack wait, the lease (as long as the
  ack wait, renewed with the trigger's progress reports) has lapsed, and another replica resumes
  from ``done``. A redelivered trigger whose lease still runs is nacked until the lease ends.
- Failure: ``attempts`` grows, the lease is released, and the trigger is nacked with the same
  exponential delay as every engram handler (``retry_at`` keeps other deliveries of the group
  from retrying it sooner); at ``max_attempts`` the message is dead-lettered and the chain goes
  on. Graph backend outages are retried without end (:func:`engram.runtime.service.failure_decision`).

A hung group holds its lease, nothing else: other groups' doorbells find their own groups free,
and once a message has taken longer than the stage's *patience* (``PATIENCE_FACTOR`` times the
median of the stage's recent messages, at least ``patience_min_s``; ``patience_default_s`` until
``PATIENCE_SAMPLES`` messages are timed) its chain hands its slot to other groups
(engram/runtime/slots.py) and finishes outside the count: a hung model call no longer runs every other
group on one slot fewer. The delivery counts of the durable no longer mean attempts (a doorbell may be
acked for a message processed later): ``attempts`` in the record does.

Exactly-once is not claimed: a message processed but not yet recorded as done when its replica
dies is processed again (the stages are idempotent: an episode already in the graph is found
and its deltas re-published, deltas carry message ids).
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import hashlib
import json
import logging
import os
import re
import socket
import time
import statistics
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from prometheus_client import Counter

from engram.runtime import slots
from engram.schemas import subjects

log = logging.getLogger(__name__)

DOORBELLS = Counter(
    "engram_group_order_deliveries_total",
    "Deliveries of a stage's shared durable, by what became of them: chain (started a group's chain), "
    "done (already processed: acked), owned (its group's chain is running elsewhere: acked), "
    "wait (a lapsing lease or a pending retry: nacked)",
    ["stage", "outcome"],
)
STALLED = Counter(
    "engram_group_order_stalled_total",
    "Messages whose processing outlasted the stage's patience (a hung model call): their chain "
    "handed its slot to other groups (engram/runtime/slots.py), or found none left to lend (lent=false)",
    ["stage", "lent"],
)
CHAINED = Counter(
    "engram_group_order_messages_total",
    "Messages a stage's group chains handled, by outcome (processed, dead_lettered, failed)",
    ["stage", "outcome"],
)

_KEY_SAFE = re.compile(r"^[A-Za-z0-9_=-]{1,200}$")


@dataclasses.dataclass
class StoredMessage:
    """A message of the stage's stream, as the chain reads it (or as the trigger was delivered)."""

    subject: str
    data: bytes
    headers: dict[str, str] | None
    seq: int


@dataclasses.dataclass
class GroupRecord:
    """What the deployment knows of one group's progress in one stage (JSON in the KV bucket)."""

    done: int = 0
    attempts: int = 0
    owner: str | None = None
    until: float = 0.0
    trigger: int | None = None
    retry_at: float = 0.0

    def leased(self, now: float) -> bool:
        return self.owner is not None and self.until > now

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> GroupRecord:
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in json.loads(raw).items() if k in fields})


def record_key(stage: str, group: str) -> str:
    """The group's key: its token when KV allows it, else a hash (group tokens are subject tokens)."""
    if _KEY_SAFE.match(group):
        return f"{stage}.g.{group}"
    return f"{stage}.h.{hashlib.sha256(group.encode()).hexdigest()[:40]}"


def floor_key(stage: str, partition: str) -> str:
    """Where a migration from partition durables left the ack floor of ``partition``."""
    return f"{stage}.floor.{partition}"


@dataclasses.dataclass(frozen=True)
class Decision:
    """What to do with a message whose processing failed: retry after ``delay_s``, or dead-letter."""

    retry: bool
    delay_s: float = 0.0
    reason: str = ""
    detail: str = ""


Process = Callable[[StoredMessage], Awaitable[None]]
DeadLetter = Callable[[StoredMessage, str, str], Awaitable[None]]
Decide = Callable[[BaseException, int], Decision]


PATIENCE_FACTOR = 4.0
"""A message is stalled once it took this many times the stage's recent median: a model call's
latency varies by ~2x between turns (long and short turns, bench/extraction_cost.py), so 4x is
well outside the ordinary and still a small part of a 60 s hang."""
PATIENCE_SAMPLES = 8  # messages timed before the median is trusted


class LeaseLost(RuntimeError):
    """Another replica took the group (this one's lease lapsed): stop the chain."""


class GroupOrder:
    """Per-group order for one stage over its shared durable (see the module docstring).

    ``process(message)`` handles one message and raises on a failure worth a retry (bad input
    is its own business: it dead-letters and returns); ``decide(exc, attempt)`` turns a failure
    into a retry delay or a dead letter; ``dead_letter(message, reason, detail)`` writes one.
    ``group_filter(group)`` is the stream subject filter of one group's messages.
    """

    def __init__(
        self,
        *,
        stage: str,
        stream: str,
        group_filter: Callable[[str], str],
        process: Process,
        dead_letter: DeadLetter,
        decide: Decide,
        lease_s: float,
        bucket: str = subjects.KV_GROUP_ORDER,
        owner: str | None = None,
        patience_min_s: float = 5.0,
        patience_default_s: float = 30.0,
    ) -> None:
        self.stage = stage
        self.stream = stream
        self.group_filter = group_filter
        self.process = process
        self.dead_letter = dead_letter
        self.decide = decide
        self.lease_s = lease_s
        self.bucket = bucket
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._js: Any = None
        self._kv: Any = None
        self._floors: dict[str, int] = {}
        self.patience_min_s = patience_min_s
        self.patience_default_s = patience_default_s
        self._took: deque[float] = deque(maxlen=64)  # the last messages' processing times (s)

    def patience_s(self) -> float:
        """How long a message may take before its chain counts as stalled (module docstring)."""
        if len(self._took) < PATIENCE_SAMPLES:
            return self.patience_default_s
        return max(self.patience_min_s, PATIENCE_FACTOR * statistics.median(self._took))

    async def _process_watched(self, message: StoredMessage) -> None:
        """``process(message)``; past the patience, this chain's slot goes to other groups."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        # a task copies this task's context: it sees the slot the puller set (engram/runtime/slots.py)
        watchdog = asyncio.create_task(self._watch(started), name=f"{self.stage} patience")
        try:
            await self.process(message)
        finally:
            watchdog.cancel()
        self._took.append(loop.time() - started)  # successes only: a failure's time says nothing

    async def _watch(self, started: float) -> None:
        """Wait out the patience, re-read every second: right after a start the stage has no
        timings yet (patience_default_s), and once other messages finish it knows better."""
        loop = asyncio.get_running_loop()
        while (left := self.patience_s() - (loop.time() - started)) > 0:
            await asyncio.sleep(min(left, 1.0))
        self._stalled()

    def _stalled(self) -> None:
        slot = slots.CURRENT.get()
        if slot is None or not slot.held:
            return  # a chain started outside a slot, or whose slot went on at an earlier stall
        lent = slot.lend()
        STALLED.labels(self.stage, "true" if lent else "false").inc()
        log.info("%s: a message outlasted %.1f s: %s", self.stage, self.patience_s(),
                 "its slot went to other groups" if lent else "no slot to hand on")

    async def start(self, js: Any) -> None:
        self._js = js
        self._kv = await js.key_value(self.bucket)

    # --- the record ----------------------------------------------------------------------
    async def read(self, group: str, subject: str) -> tuple[GroupRecord, int | None]:
        """The group's record and its revision (None: no record yet; ``done`` then starts at the
        floor a migration left for the subject's partition)."""
        try:
            entry = await self._kv.get(record_key(self.stage, group))
        except nats.js.errors.KeyNotFoundError:
            return GroupRecord(done=await self._floor(subject)), None
        if entry.value is None:  # deleted (an erased group): starts afresh
            return GroupRecord(done=await self._floor(subject)), entry.revision
        return GroupRecord.decode(entry.value), entry.revision

    async def _floor(self, subject: str) -> int:
        parts = subject.split(".")
        partition = parts[-2] if len(parts) >= 4 else ""
        if not partition.isdigit():
            return 0
        if partition not in self._floors:
            try:
                entry = await self._kv.get(floor_key(self.stage, partition))
                self._floors[partition] = int(entry.value or b"0")
            except nats.js.errors.KeyNotFoundError:
                self._floors[partition] = 0  # no migration: every message of the group counts
        return self._floors[partition]

    async def _write(self, group: str, record: GroupRecord, revision: int | None) -> int | None:
        """Compare-and-set; the new revision, or None when another writer came first."""
        key = record_key(self.stage, group)
        try:
            if revision is None:
                return await self._kv.create(key, record.encode())
            return await self._kv.update(key, record.encode(), last=revision)
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.BadRequestError):
            return None

    # --- a delivery ----------------------------------------------------------------------
    async def deliver(self, msg: Any) -> None:
        """Handle one delivery of the shared durable (a nats-py ``Msg``); acks or nacks it."""
        group = msg.subject.rsplit(".", 1)[-1]
        seq = msg.metadata.sequence.stream
        for _ in range(8):  # compare-and-set races with other replicas
            record, revision = await self.read(group, msg.subject)
            now = time.time()
            carrier = record.trigger == seq  # the record names this message as the group's wake-up
            if seq <= record.done and not carrier:
                DOORBELLS.labels(self.stage, "done").inc()
                await _ack(msg)
                return
            if record.leased(now):
                if carrier:  # its owner stalled or died: wait for the lease to lapse
                    DOORBELLS.labels(self.stage, "wait").inc()
                    await msg.nak(delay=record.until - now + 0.5)
                else:
                    DOORBELLS.labels(self.stage, "owned").inc()
                    await _ack(msg)
                return
            if record.retry_at > now and record.trigger is not None and not carrier:
                # a failed message waits for its retry; its carrier comes back then and brings this one
                DOORBELLS.labels(self.stage, "owned").inc()
                await _ack(msg)
                return
            claimed = self._claimed(record, trigger=seq)
            new_revision = await self._write(group, claimed, revision)
            if new_revision is None:
                continue
            DOORBELLS.labels(self.stage, "chain").inc()
            await self._chain(group, msg, claimed, new_revision)
            return
        # Contended for 8 rounds: let the server bring it back shortly.
        await msg.nak(delay=1.0)

    async def _chain(self, group: str, msg: Any, record: GroupRecord, revision: int) -> None:
        """Work through ``group``'s messages after ``record.done`` while holding its lease."""
        state = _Lease(record, revision)
        beat = asyncio.create_task(self._renew(group, msg, state), name=f"{self.stage} lease")
        found: StoredMessage | None = None  # read by the look after letting go
        try:
            while True:
                nxt = found or await self._next(group, state.record.done, msg)
                found = None
                if nxt is None:
                    released = dataclasses.replace(state.record, owner=None, until=0.0, trigger=None, retry_at=0.0)
                    async with state.lock:
                        rev = await self._write(group, released, state.revision)
                        if rev is None:
                            raise LeaseLost(group)
                        state.record, state.revision = released, rev
                    # A message that arrived while letting go had its doorbell acked: look again.
                    found = await self._next(group, released.done, msg)
                    if found is None:
                        break
                    async with state.lock:
                        claimed = self._claimed(released, trigger=msg.metadata.sequence.stream)
                        rev = await self._write(group, claimed, state.revision)
                        if rev is None:
                            break  # another replica took it: its chain carries the group
                        state.record, state.revision = claimed, rev
                    continue
                try:
                    await self._process_watched(nxt)
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - retried or dead-lettered by the decision
                    attempt = state.record.attempts + 1
                    decision = self.decide(exc, attempt)
                    if decision.retry:
                        CHAINED.labels(self.stage, "failed").inc()
                        failed = dataclasses.replace(state.record, attempts=attempt, owner=None, until=0.0,
                                                     trigger=msg.metadata.sequence.stream,
                                                     retry_at=time.time() + decision.delay_s)
                        async with state.lock:
                            if await self._write(group, failed, state.revision) is None:
                                raise LeaseLost(group) from exc
                        await msg.nak(delay=decision.delay_s)
                        return
                    await self.dead_letter(nxt, decision.reason, decision.detail)
                    CHAINED.labels(self.stage, "dead_lettered").inc()
                else:
                    CHAINED.labels(self.stage, "processed").inc()
                async with state.lock:
                    advanced = dataclasses.replace(state.record, done=nxt.seq, attempts=0, retry_at=0.0)
                    rev = await self._write(group, advanced, state.revision)
                    if rev is None:
                        raise LeaseLost(group)
                    state.record, state.revision = advanced, rev
            await _ack(msg)
        except LeaseLost:
            # Our lease lapsed and another replica resumed the group from its record: what we did
            # since is idempotent work it may repeat. The trigger is done with.
            log.warning("%s: lease on a group lapsed and was taken over", self.stage)
            await _ack(msg)
        except (asyncio.CancelledError, Exception):
            # Stopping, or NATS failed under the chain: hand the group back at once (the caller
            # nacks the trigger, which then finds the group free instead of waiting out the lease).
            await asyncio.shield(self._release_quietly(group, state))
            raise
        finally:
            beat.cancel()

    def _claimed(self, record: GroupRecord, *, trigger: int) -> GroupRecord:
        """``record`` leased to this replica for ``lease_s`` from now, woken by ``trigger``."""
        return dataclasses.replace(record, owner=self.owner, until=time.time() + self.lease_s, trigger=trigger)

    async def _release_quietly(self, group: str, state: _Lease) -> None:
        try:
            async with state.lock:
                released = dataclasses.replace(state.record, owner=None, until=0.0)
                await self._write(group, released, state.revision)
        except Exception:  # noqa: BLE001 - the lease lapses by itself
            log.debug("releasing a group lease failed", exc_info=True)

    async def _renew(self, group: str, msg: Any, state: _Lease) -> None:
        """Every lease/3: report progress on the trigger and extend the lease."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await msg.in_progress()
            except Exception:  # noqa: BLE001 - connection down: the next beat decides
                log.debug("in_progress failed", exc_info=True)
            try:
                async with state.lock:
                    if state.record.owner != self.owner:
                        continue
                    renewed = dataclasses.replace(state.record, until=time.time() + self.lease_s)
                    rev = await self._write(group, renewed, state.revision)
                    if rev is not None:
                        state.record, state.revision = renewed, rev
            except Exception:  # noqa: BLE001 - NATS away: the next beat tries again
                log.debug("lease renewal failed", exc_info=True)

    async def _next(self, group: str, after: int, trigger: Any) -> StoredMessage | None:
        """The group's first message after sequence ``after`` (the trigger itself without a read)."""
        if trigger.metadata.sequence.stream == after + 1:
            return StoredMessage(trigger.subject, trigger.data, trigger.headers, after + 1)
        try:
            raw = await self._js.get_msg(self.stream, seq=after + 1, subject=self.group_filter(group), next=True)
        except nats.js.errors.NotFoundError:
            return None
        return StoredMessage(raw.subject or "", raw.data or b"", stored_headers(raw.hdrs), raw.seq or 0)


def stored_headers(encoded: str | None) -> dict[str, str] | None:
    """The headers of a STREAM.MSG.GET answer, as a delivery has them (``Name: Value`` lines).
    nats-py's own get_msg parses them as an email, which turns a non-ASCII value into an
    ``email.header.Header`` object; a delivery's parser decodes bytes (invalid UTF-8 replaced)."""
    if not encoded:
        return None
    block = base64.b64decode(encoded)
    out: dict[str, str] = {}
    for line in block.split(b"\r\n")[1:]:  # the first line is NATS/1.0
        name, sep, value = line.partition(b":")
        if sep and name.strip():
            out[name.strip().decode(errors="replace")] = value.strip().decode(errors="replace")
    return out or None


class _Lease:
    """The chain's view of its record, shared with the renewal task (one writer at a time)."""

    def __init__(self, record: GroupRecord, revision: int) -> None:
        self.record = record
        self.revision = revision
        self.lock = asyncio.Lock()


async def _ack(msg: Any) -> None:
    try:
        await msg.ack()
    except nats.errors.MsgAlreadyAckdError:
        pass


async def record_partition_floors(js: Any, *, stage: str, old: list[Any],
                                  bucket: str = subjects.KV_GROUP_ORDER) -> int | None:
    """Leave the ack floor of each old partition durable (``old``: their ConsumerInfo) in the
    bucket (first write wins: a re-run after a crash keeps the floors of the first): a group
    without a record starts after its old partition's floor. Returns the first sequence the
    shared durable must start at (None: no old durable, start at the beginning). The caller
    deletes the old durables once the shared one exists.

    Safe only while no older engram consumes the old durables (``engram up`` and the deploy's
    topology step run before the services): a floor taken while a partition moves on only
    makes that partition's processed messages run again (idempotent), never skips one."""
    if not old:
        return None
    kv = await js.key_value(bucket)
    floors: list[int] = []
    for info in old:
        partition = info.name.rsplit("_p", 1)[-1]
        floor = info.ack_floor.stream_seq if info.ack_floor and info.ack_floor.stream_seq else 0
        try:
            await kv.create(floor_key(stage, partition), str(floor).encode())
        except nats.js.errors.KeyWrongLastSequenceError:
            floor = int((await kv.get(floor_key(stage, partition))).value or b"0")
        floors.append(floor)
    log.info("%s: %d partition durables replaced by one shared durable (per-group order in %s)",
             stage, len(floors), bucket)
    return min(floors) + 1
