"""Session state in NATS KV, with a revision-checked write so replicas never overwrite each other.

Replicas keep a small cache of (state, revision). With one in-flight message per partition a
session is only ever handled by one replica at a time, but which replica changes over time; a
stale cache shows up as a failed compare-and-set, after which the caller reloads and re-applies.
"""

from __future__ import annotations

from collections import OrderedDict

import nats.js.errors
from nats.js.kv import KeyValue

from services.turn_detector.pairing import SessionState


class StaleState(Exception):
    """The stored revision moved since the state was read."""


class SessionStore:
    def __init__(self, kv: KeyValue, cache_size: int = 10_000) -> None:
        self._kv = kv
        # Cached as the stored JSON: parsing it is cheaper than deep-copying a model, and each
        # caller gets its own object to change.
        self._cache: OrderedDict[str, tuple[bytes, int]] = OrderedDict()
        self._cache_size = cache_size

    async def load(self, session_id: str, *, fresh: bool = False) -> tuple[SessionState, int]:
        """Return (state, revision); revision 0 means the key does not exist yet."""
        if not fresh and session_id in self._cache:
            self._cache.move_to_end(session_id)
            raw, rev = self._cache[session_id]
            return SessionState.model_validate_json(raw), rev
        try:
            entry = await self._kv.get(session_id)
        except nats.js.errors.KeyNotFoundError:
            return SessionState(session_id=session_id), 0
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return SessionState(session_id=session_id), entry.revision or 0
        self._remember(session_id, entry.value, entry.revision or 0)
        return SessionState.model_validate_json(entry.value), entry.revision or 0

    async def save(self, state: SessionState, revision: int) -> int:
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
        self._remember(state.session_id, value, new_rev)
        return new_rev

    def forget(self, session_id: str) -> None:
        self._cache.pop(session_id, None)

    def _remember(self, session_id: str, raw: bytes, revision: int) -> None:
        self._cache[session_id] = (raw, revision)
        self._cache.move_to_end(session_id)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
