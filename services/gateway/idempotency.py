"""Which POST /messages (or MCP add_memory call) is a retry of an earlier one (issue 23 item 2).

A message's id is what makes JetStream and the turn-detector store it once:
- a client ``uuid`` is the id: create-with-uuid, idempotent forever;
- else a client timestamp: content + timestamp make the id (services/gateway/mapping.py), also
  forever -- an equal message with the same timestamp is the same message;
- else only the *request* tells an equal message apart from a new one ("yes" said twice):
  - with an ``Idempotency-Key`` header (IETF draft "The Idempotency-Key HTTP Header Field"), the
    key is part of the ids: the same key with the same body is the same messages, at any time.
    The body's fingerprint is kept under the key for a day (``KEY_TTL_S``), so the same key with
    another body is refused (422, as the draft suggests) for that long; after it, the key is
    just part of the new messages' ids.
  - without one, the first arrival of an identical request (group + body) is recorded in the
    ``engram_gateway_requests`` KV bucket with a per-message TTL of the retry window: a request
    found there is a retry and reuses the recorded nonce (so its ids); after the window the same
    body gets a new nonce, new ids, and is stored.

Why a KV record and not a time bucket folded into the ids: a retry that crosses a bucket edge
would get new ids and be stored twice, at any window length. The record is shared by every
gateway replica and survives restarts (it is in NATS); ``create`` is atomic, so two replicas
taking the same request at once agree on one nonce.

Pure functions (fingerprints, key names) plus :class:`RecentRequests`, a thin wrapper over the
KV bucket. Nothing here logs content: keys are hashes.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from engram.schemas import subjects

KEY_TTL_S = 24 * 3600.0
"""How long an Idempotency-Key's body fingerprint is kept (the bucket's max age)."""

MAX_IDEMPOTENCY_KEY = 255
"""Longest Idempotency-Key accepted (the draft sets no limit; a bound keeps requests small)."""


class IdempotencyKeyReused(Exception):
    """The Idempotency-Key came before with a different request body."""


def _digest(*parts: Any) -> str:
    text = json.dumps(parts, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def request_fingerprint(kind: str, group_id: str, body: Any) -> str:
    """The identity of a request: ``kind`` (which door: "rest", "mcp-message", "mcp-episode"),
    the group and the parsed body (JSON-able), so whitespace or key order do not matter."""
    return _digest(kind, group_id, body)


def missing_id(message: Any) -> bool:
    """A message whose id depends on the request: no uuid and no timestamp."""
    return not getattr(message, "uuid", None) and getattr(message, "timestamp", None) is None


class RecentRequests:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> "RecentRequests":
        return cls(await js.key_value(subjects.KV_GATEWAY_REQUESTS))

    async def request_id(self, group_id: str, fingerprint: str, idempotency_key: str | None, window_s: float) -> str:
        """The id the request's uuid- and timestamp-less messages fold into theirs (see the
        module docstring). Raises IdempotencyKeyReused, or NATS errors (the caller answers 503)."""
        if idempotency_key:
            key_hash = _digest(group_id, idempotency_key)
            name = f"k.{key_hash[:48]}"
            if not await self._create(name, fingerprint.encode(), None):
                entry = await self._get(name)
                if entry is not None and entry != fingerprint:
                    raise IdempotencyKeyReused(group_id)
            return f"key:{key_hash}"
        name = f"r.{fingerprint[:48]}"
        for _ in range(3):  # the record may expire between a failed create and the read
            nonce = f"{time.time_ns():x}"
            if await self._create(name, nonce.encode(), max(1, round(window_s))):
                return f"req:{nonce}"
            found = await self._get(name)
            if found is not None:
                return f"req:{found}"
        raise RuntimeError("the request record kept changing")

    async def _create(self, name: str, value: bytes, ttl: int | None) -> bool:
        try:
            await self._kv.create(name, value, msg_ttl=ttl)
        except nats.js.errors.KeyWrongLastSequenceError:
            return False
        return True

    async def _get(self, name: str) -> str | None:
        try:
            entry = await self._kv.get(name)
        except nats.js.errors.KeyNotFoundError:
            return None
        if entry.value is None or entry.operation in ("DEL", "PURGE"):
            return None
        return entry.value.decode()
