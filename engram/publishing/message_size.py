"""How big one chat message may be, checked the same way by every publisher (``engram ingest``,
the REST gateway, the MCP server) and by the turn-detector.

Two limits apply to a message's JSON (``ChatMessage.model_dump_json()``, UTF-8):

* ``ENGRAM_TURN_MAX_MESSAGE_BYTES`` (default 2 MiB, engram/settings.py): engram's
  hard cap. Publishers refuse a larger message with a reason naming the limit (ingest skips the
  line, exit 3; the gateway answers 413; MCP's add_memory fails); the turn-detector dead-letters
  one a raw publisher sent anyway (``oversize``).
* the NATS server's ``max_payload`` (what the connection reports): engram's own servers allow
  :data:`ENGRAM_NATS_MAX_PAYLOAD` (8 MiB: engram/stack/embedded.py, deploy/nats/nats.conf, the k8s
  NATS config); nats-server's default is 1 MiB. A message that fits the cap but not the server
  is refused the same way, naming the server's limit, instead of failing the publish.

Why one message travels whole rather than in parts: after the input stream it is held whole in
the turn-detector's checkpoint (NATS KV) and in the turn's Episode, which are NATS messages too,
so parts would have to be carried through every hop. 8 MiB is nats-server's largest recommended
max_payload; the 2 MiB cap leaves room in one checkpoint for a completed turn of a message and its
reply plus the next turn's first message (3 x 2 MiB). A message within the cap reaches the graph
whole: the turn-detector's noise filter cuts only beyond ``max_chars`` characters, and a
message's characters never outnumber its JSON bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel

from engram.schemas import ChatMessage

ENGRAM_NATS_MAX_PAYLOAD = 8 * 1024 * 1024
HEADER_ROOM = 4096
"""Bytes kept free for a publish's headers (Nats-Msg-Id, content-type, traceparent), which count
against max_payload too."""


def message_bytes(message: BaseModel) -> int:
    """The size of ``message`` (a ChatMessage, or an Episode MCP's add_memory publishes whole) as
    published: its JSON, UTF-8."""
    return len(message.model_dump_json().encode())


def oversize_reason(message: BaseModel, max_bytes: int, server_max_payload: int | None = None) -> str | None:
    """Why ``message`` is too big to store, naming the limit; None when it fits. Never quotes the
    content. ``server_max_payload``: the connected NATS server's max_payload, when known."""
    size = message_bytes(message)
    if size > max_bytes:
        return f"message is {size} bytes, above engram's limit of {max_bytes} bytes (ENGRAM_TURN_MAX_MESSAGE_BYTES)"
    if server_max_payload and size + HEADER_ROOM > server_max_payload:
        return (f"message is {size} bytes, too big for this NATS server's max_payload of {server_max_payload} bytes "
                f"(engram's own NATS configuration sets max_payload: {ENGRAM_NATS_MAX_PAYLOAD})")
    return None


def first_oversize(messages: Sequence[ChatMessage], max_bytes: int, server_max_payload: int | None = None) -> str | None:
    """The reason the first too-big message of a request is refused ("message 2: ..."), or None."""
    for i, message in enumerate(messages):
        reason = oversize_reason(message, max_bytes, server_max_payload)
        if reason:
            return f"message {i + 1}: {reason}" if len(messages) > 1 else reason
    return None


def server_max_payload(nc: object) -> int | None:
    """The max_payload a nats-py connection's server announced (None before it connected)."""
    value = getattr(nc, "max_payload", None)
    return int(value) if value else None
