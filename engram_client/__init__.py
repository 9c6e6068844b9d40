"""engram's thin client for agents that publish chat messages (issue 26, item 7).

Why: an agent that only publishes turns had to install all of engram (~490 MB: graphiti, the
graph drivers, the local models' runtime) to get ``ChatMessage`` and the dedupe id. The
``engram-client`` distribution (clients/python/, built by tools/build_client.py) holds this
module and ``schemas`` (engram's only contract) and needs pydantic and nats-py alone; engram's
own wheel carries the same module, so code written against it runs in either.

What it does, as engram's own publishers do (engram/publishing/ingest.py):

* the subject of the session (``engram.in.message.<session>``, ``engram.in.close.<session>``);
* the ``Nats-Msg-Id`` of :func:`engram.schemas.subjects.message_dedupe_id`, with the session's epoch
  read from the ``engram_session_epochs`` bucket (after a delete, a re-sent message is stored
  again instead of being dropped as a duplicate of the deleted copy);
* waits for each PubAck, so a message is stored durably (or known to be a duplicate) when the
  call returns, and per-session order holds when calls are awaited in order;
* retries a publish that fails transiently (NATS restarting, no JetStream leader yet) for up to
  ``retry_s``, then raises;
* the W3C ``traceparent`` of the current OpenTelemetry span when opentelemetry is installed
  (optional: engram's services then continue the agent's trace), nothing otherwise.

    from engram_client import Publisher
    publisher = await Publisher.connect("nats://engram-publisher:PASSWORD@127.0.0.1:4222")
    stored = await publisher.message(ChatMessage(...))   # False: already stored (a retry)
    await publisher.close_session("s1")
    await publisher.aclose()
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timezone
from typing import Any

import nats
import nats.errors
import nats.js.errors

from .schemas import ChatMessage, SessionClosed, subjects

__all__ = ["Publisher", "TRANSIENT_ERRORS", "read_epoch"]

TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.OutboundBufferLimitError,
    nats.errors.StaleConnectionError,
    nats.js.errors.ServiceUnavailableError,
)
"""Publish failures worth a retry: the server or the stream's leader is (re)starting (engram
ingest retries the same ones: engram/publishing/ingest.py)."""


async def read_epoch(kv: Any, session_id: str) -> int:
    """A session's epoch in the ``engram_session_epochs`` bucket ``kv`` (engram/runtime/epochs.py writes
    them): 0 when none, deleted, or not a number."""
    try:
        entry = await kv.get(session_id)
    except nats.js.errors.KeyNotFoundError:
        return 0
    if entry.value is None or entry.operation in ("DEL", "PURGE"):
        return 0
    try:
        return int(entry.value.decode())
    except ValueError:
        return 0


def _trace_headers() -> dict[str, str]:
    """The current span's ``traceparent`` (and ``tracestate``) when opentelemetry is installed."""
    try:
        from opentelemetry import propagate
    except ImportError:
        return {}
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return carrier


class Publisher:
    """Publishes an agent's chat messages and session ends to engram (module docstring)."""

    def __init__(self, nc: Any, *, retry_s: float = 30.0, owns_connection: bool = False) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.retry_s = retry_s
        self._owns = owns_connection
        self._epochs: Any = None

    @classmethod
    async def connect(cls, url: str, *, retry_s: float = 30.0, **options: Any) -> Publisher:
        """A publisher on its own connection to ``url`` (closed by :meth:`aclose`)."""
        return cls(await nats.connect(url, **options), retry_s=retry_s, owns_connection=True)

    async def aclose(self) -> None:
        if self._owns:
            await self.nc.close()

    async def epoch(self, session_id: str) -> int:
        """The session's epoch (0 unless a delete erased it): part of its messages' dedupe ids."""
        if self._epochs is None:
            try:
                self._epochs = await self.js.key_value(subjects.KV_SESSION_EPOCHS)
            except nats.js.errors.BucketNotFoundError:
                return 0  # engram not started yet, or never deleted anything
        return await read_epoch(self._epochs, session_id)

    async def message(self, message: ChatMessage) -> bool:
        """Store ``message`` durably; True when stored, False when engram already had it."""
        headers = {"Nats-Msg-Id": subjects.message_dedupe_id(message.session_id, message.scopes, message.message_id,
                                                             await self.epoch(message.session_id)),
                   **_trace_headers()}
        ack = await self._publish(subjects.in_message(message.session_id), message.model_dump_json().encode(), headers)
        return not ack.duplicate

    async def close_session(self, session_id: str, reason: str | None = None) -> None:
        """The chat ended: engram flushes the session's open turn now instead of after its idle timeout."""
        closed = SessionClosed(session_id=session_id, closed_at=datetime.now(timezone.utc), reason=reason)
        await self._publish(subjects.in_close(session_id), closed.model_dump_json().encode(), _trace_headers())

    async def _publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> Any:
        deadline = time.monotonic() + self.retry_s
        delay = 0.1
        while True:
            try:
                return await self.js.publish(subject, payload, stream=subjects.STREAM_IN, headers=headers)
            except TRANSIENT_ERRORS:
                if time.monotonic() + delay > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
