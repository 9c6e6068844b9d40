"""Session epochs: what lets content posted again after a delete be stored.

JetStream keeps its duplicate-detection map for ``duplicate_window`` even after the messages are
purged or erased (checked against nats-server 2.15: filtered purge, full purge and
``STREAM.MSG.DELETE`` all leave it). Every deterministic id engram derives for a session --
the input ``Nats-Msg-Id`` (:func:`engram.schemas.subjects.message_dedupe_id`), turn ids and so episode
ids -- would therefore make a re-post within 10 minutes of a delete a "duplicate" of the
deleted copy, and it would be dropped silently.

Deleting a group (or an episode) therefore bumps the epoch of each session it erased: a
millisecond timestamp in the ``engram_session_epochs`` KV bucket. engram's publishers (the
gateway, ``engram ingest``) put the epoch into the Nats-Msg-Id, and the turn-detector puts it
into the turn ids of a session it starts afresh, so every id after a delete is new. The bucket's
TTL only has to outlive the duplicate window; an expired epoch reads as 0 again, which is safe
because by then the server has forgotten the old ids too.
"""

from __future__ import annotations

import time

from nats.js import JetStreamContext
from nats.js.kv import KeyValue

from engram_client import read_epoch
from engram.schemas import subjects


class SessionEpochs:
    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv

    @classmethod
    async def open(cls, js: JetStreamContext) -> "SessionEpochs":
        return cls(await js.key_value(subjects.KV_SESSION_EPOCHS))

    async def get(self, session_id: str) -> int:
        return await read_epoch(self._kv, session_id)  # the thin client reads it the same way

    async def bump(self, session_id: str) -> int:
        """A new epoch, strictly above the stored one (monotonic even if clocks step back)."""
        epoch = max(int(time.time() * 1000), await self.get(session_id) + 1)
        await self._kv.put(session_id, str(epoch).encode())
        return epoch
