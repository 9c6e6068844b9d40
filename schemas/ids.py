"""Deterministic ids that several parts must compute alike.

An episode's id is a name-based UUID (v5) of its group and turn: the turn-detector names every
episode it emits with it, and ``engram promote`` names a promoted note the same way, so a
replayed turn or a repeated promotion lands on the same graph episode (idempotent writes).
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .messages import ChatMessage

EPISODE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://engram.dev/episode")


def episode_id_for(group_id: str, turn_id: str) -> str:
    """The episode id of turn ``turn_id`` in group ``group_id`` (a UUID string, stable across runs)."""
    return str(uuid.uuid5(EPISODE_NAMESPACE, f"{group_id}/{turn_id}"))


def message_dedupe_key(message: "ChatMessage") -> str:
    """What makes a chat message a duplicate within its session: its id *and* the scopes it was
    sent to, as in the input Nats-Msg-Id (engram.schemas.subjects.message_dedupe_id). The same transcript
    ingested into a second workspace is new there; a re-send to the same scopes is not."""
    scopes = message.scopes.model_dump(exclude_none=True)
    if scopes == {"session": True}:
        return message.message_id
    encoded = message.scopes.model_dump_json(exclude_none=True)
    return f"{message.message_id}|{hashlib.sha256(encoded.encode()).hexdigest()[:12]}"


SEEN_DIGEST_CHARS = 12
"""72 bits of SHA-256, base64url: a session of n messages mistakes a new message for one it has
with probability about n^2 / 2^73 (1e-14 at 20,000 messages)."""


def seen_digest(key: str) -> str:
    """One entry of a turn-detector checkpoint's ``seen`` field (each followed by ','): the digest
    of a :func:`message_dedupe_key`. ``engram ingest`` reads checkpoints to tell which messages the
    turn-detector already took."""
    return base64.urlsafe_b64encode(hashlib.sha256(key.encode("utf-8")).digest()[:9]).decode()


def seen_holds(seen: str, key: str) -> bool:
    """Whether a checkpoint's ``seen`` field lists ``key``. Digests hold no ',', so a match of
    one is always one whole entry (no match across two)."""
    return seen_digest(key) in seen
