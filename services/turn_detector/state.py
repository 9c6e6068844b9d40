"""Session state: persisted in NATS KV at the points that matter, cached in memory in between.

The input stream is the log; KV holds a checkpoint. A session's state is written to KV (with a
revision check, so replicas never overwrite each other) when an event completes a turn, changes
the idle schedule, or closes/ticks the session. An event that only adds a message to an open
turn updates the in-memory cache and is acked: the message stays in the input stream, and a
replica that has no current cache for the session rebuilds it from the checkpoint plus the
session's messages after it (see ``TurnDetector._load``).

A cache is only trusted while the replica saw every delivery of the partition: with one message
in flight per partition, delivery (consumer) sequences are consecutive, so a gap means another
replica handled messages of this partition and every cached session of it is dropped.
"""

from __future__ import annotations

from collections import OrderedDict

import nats.js.errors
from nats.js.kv import KeyValue

from engram.services.turn_detector.pairing import SessionState


class StaleState(Exception):
    """The stored revision moved since the state was read."""


class SessionStore:
    def __init__(self, kv: KeyValue, cache_size: int = 10_000) -> None:
        self._kv = kv
        # session -> (partition, state, KV revision of the checkpoint it builds on). The pairing
        # functions never mutate their input, so the cached object is shared, not copied; a
        # caller that changes a state it got from here must keep() or persist() it afterwards.
        self._cache: OrderedDict[str, tuple[int, SessionState, int]] = OrderedDict()
        self._cache_size = cache_size
        self._last_delivery: dict[int, int] = {}

    # --- cache ---------------------------------------------------------------------------
    def observe_delivery(self, partition: int, delivery_seq: int | None) -> None:
        """Drop the partition's cache unless this delivery directly follows the previous one."""
        last = self._last_delivery.get(partition)
        if delivery_seq is None or last is None or delivery_seq != last + 1:
            self.forget_partition(partition)
        if delivery_seq is not None:
            self._last_delivery[partition] = delivery_seq

    def cached(self, session_id: str) -> tuple[SessionState, int] | None:
        hit = self._cache.get(session_id)
        if hit is None:
            return None
        self._cache.move_to_end(session_id)
        return hit[1], hit[2]

    def keep(self, partition: int, state: SessionState, revision: int) -> None:
        """Remember a state in memory only (its messages remain in the input stream)."""
        self._remember(partition, state.session_id, state, revision)

    def forget_partition(self, partition: int) -> None:
        for session in [s for s, (p, _, _) in self._cache.items() if p == partition]:
            del self._cache[session]

    def forget(self, session_id: str) -> None:
        self._cache.pop(session_id, None)

    # --- KV ------------------------------------------------------------------------------
    async def load(self, session_id: str) -> tuple[SessionState, int]:
        """The checkpoint in KV as (state, revision); revision 0 means none yet."""
        try:
            entry = await self._kv.get(session_id)
        except nats.js.errors.KeyNotFoundError:
            return SessionState(session_id=session_id), 0
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return SessionState(session_id=session_id), entry.revision or 0
        return SessionState.model_validate_json(entry.value), entry.revision or 0

    async def persist(self, partition: int, state: SessionState, revision: int) -> int:
        value = state.model_dump_json().encode()
        try:
            if revision == 0:
                new_rev = await self._kv.create(state.session_id, value)
            else:
                # nats-py 2.16's KeyValue.update returns the PubAck although annotated int.
                ack = await self._kv.update(state.session_id, value, last=revision)
                new_rev = int(getattr(ack, "seq", ack))
        except (nats.js.errors.KeyWrongLastSequenceError, nats.js.errors.APIError) as exc:
            if isinstance(exc, nats.js.errors.KeyWrongLastSequenceError) or getattr(exc, "err_code", None) in (
                10071,
                10164,
            ):
                self._cache.pop(state.session_id, None)
                raise StaleState(state.session_id) from exc
            raise
        self._remember(partition, state.session_id, state, new_rev)
        return new_rev

    def _remember(self, partition: int, session_id: str, state: SessionState, revision: int) -> None:
        self._cache[session_id] = (partition, state, revision)
        self._cache.move_to_end(session_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
