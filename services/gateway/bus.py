"""The gateway's only way to the rest of engram: NATS (JetStream publishes, request/reply).

``publish_messages`` stores chat messages in the ENGRAM_IN stream one at a time, in order,
awaiting each PubAck: the HTTP answer is 202 only when the server acknowledged every message
(stored, or recognised as a duplicate of one it already stored). ``ask`` is NATS request/reply
to the recall service (``engram.recall`` and the ``engram.graph.*`` admin subjects).
Failures become :class:`BusError` with the HTTP status the route should answer; message content
is never logged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any, TypeVar

import nats.errors
from faststream.nats import NatsBroker
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from engram.runtime.epochs import SessionEpochs
from engram.publishing.message_size import server_max_payload
from engram.observability.tracing import TurnSpans
from engram.runtime.service import jetstream
from engram.settings import EngramSettings
from engram.runtime.stream_retention import is_stream_full
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import ChatMessage, subjects
from engram.services.gateway.idempotency import IdempotencyKeyReused, RecentRequests
from engram.services.gateway.mapping import dedupe_header

log = logging.getLogger("engram.gateway")

MESSAGES = Counter(
    "engram_gateway_messages_total",
    "Messages POSTed to the gateway, by outcome: stored, duplicate (already stored: deduplicated), failed.",
    ["outcome"],
)
REQUESTS_OUT = Counter(
    "engram_gateway_nats_requests_total", "Request/reply calls to engram services, by subject and outcome.",
    ["subject", "outcome"],
)

Resp = TypeVar("Resp", bound=BaseModel)


class BusError(Exception):
    """A NATS call failed; ``status`` is the HTTP status to answer (503 retry, 504 timeout, 502)."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail


@dataclass
class PublishReport:
    stored: int = 0
    duplicates: int = 0


class Bus:
    def __init__(self, settings: EngramSettings, broker: NatsBroker, *, publish_timeout_s: float) -> None:
        self.settings = settings
        self.broker = broker
        self.publish_timeout_s = publish_timeout_s
        self.epochs: SessionEpochs | None = None
        self.requests: RecentRequests | None = None

    async def start(self) -> None:
        """Connect and declare the topology, as every service does: the gateway may be the first
        engram process a fresh NATS sees, and its publishes need the input stream."""
        await self.broker.connect()
        js = jetstream(self.broker)
        await ensure_topology(js, Topology.from_settings(self.settings))
        self.epochs = await SessionEpochs.open(js)
        self.requests = await RecentRequests.open(js)

    async def request_id(self, group_id: str, fingerprint: str, idempotency_key: str | None, window_s: float) -> str:
        """:meth:`RecentRequests.request_id` (IdempotencyKeyReused passes through; a NATS failure
        is BusError 503: without the record a retry could be stored twice)."""
        if self.requests is None:
            raise BusError(503, "not connected to NATS")
        try:
            return await self.requests.request_id(group_id, fingerprint, idempotency_key, window_s)
        except IdempotencyKeyReused:
            raise
        except Exception as exc:  # noqa: BLE001 - NATS down, timeout, ...
            raise BusError(503, f"cannot check for a retried request ({_why(exc)}); retry") from exc

    def _client(self) -> Any:
        try:
            return self.broker.connection
        except Exception as exc:  # noqa: BLE001 - faststream's IncorrectState before connect/after stop
            raise BusError(503, "not connected to NATS") from exc

    def max_payload(self) -> int | None:
        """The connected NATS server's max_payload (None when not connected: the publish says so)."""
        try:
            return server_max_payload(self._client())
        except BusError:
            return None

    def jetstream(self) -> Any:
        """The JetStream context (BusError 503 when not connected)."""
        return self._client().jetstream()

    async def publish_messages(self, group_id: str, messages: list[ChatMessage]) -> PublishReport:
        """Store ``messages`` in order; raise BusError(503) at the first one the server did not
        acknowledge (the ones before it are stored: a retry deduplicates them)."""
        js = self._client().jetstream()  # connected, or BusError(503)
        report = PublishReport()
        subject = subjects.in_message(group_id)
        try:
            epoch = await self.epochs.get(group_id) if self.epochs is not None else 0
        except Exception as exc:  # noqa: BLE001 - without the epoch a re-post after a delete could be dropped
            raise BusError(503, f"cannot read the session epoch ({_why(exc)}); retry") from exc
        turns = TurnSpans("gateway", "engram.gateway.turn")  # one trace per turn (engram/observability/tracing.py)
        try:
            return await self._publish_all(js, subject, epoch, messages, report, turns)
        finally:
            turns.end()

    async def _publish_all(self, js: Any, subject: str, epoch: int, messages: list[ChatMessage],
                           report: PublishReport, turns: TurnSpans) -> PublishReport:
        for i, message in enumerate(messages):
            try:
                ack = await js.publish(
                    subject, message.model_dump_json().encode(), timeout=self.publish_timeout_s,
                    stream=subjects.STREAM_IN,
                    headers=turns.headers_for(message.session_id, message.role, {
                        subjects.HDR_MSG_ID: dedupe_header(message, epoch), "content-type": "application/json"}),
                )
            except Exception as exc:  # noqa: BLE001 - whatever it was, the message is not known to be stored
                MESSAGES.labels(outcome="failed").inc(len(messages) - i)
                log.warning("publish failed after %d of %d messages: %s", i, len(messages), type(exc).__name__)
                raise BusError(
                    503,
                    f"the message broker did not confirm message {i + 1} of {len(messages)} ({_why(exc)}); "
                    f"{i} were stored before it. Retry the request: stored messages are deduplicated.",
                ) from exc
            if ack.duplicate:
                report.duplicates += 1
                MESSAGES.labels(outcome="duplicate").inc()
            else:
                report.stored += 1
                MESSAGES.labels(outcome="stored").inc()
        return report

    async def ask(self, subject: str, request: BaseModel, response_model: type[Resp], timeout_s: float) -> Resp:
        nc = self._client()
        label = subject.removeprefix("engram.")
        try:
            reply = await nc.request(subject, request.model_dump_json().encode(), timeout=timeout_s)
        except nats.errors.NoRespondersError as exc:
            REQUESTS_OUT.labels(subject=label, outcome="no_responders").inc()
            raise BusError(503, f"no engram service answers {subject} (is the {_service_of(subject)} service running?)") from exc
        except (nats.errors.TimeoutError, asyncio.TimeoutError) as exc:
            REQUESTS_OUT.labels(subject=label, outcome="timeout").inc()
            raise BusError(504, f"{subject} did not answer within {timeout_s:g} s") from exc
        except Exception as exc:  # noqa: BLE001 - connection closed, draining, ...
            REQUESTS_OUT.labels(subject=label, outcome="error").inc()
            raise BusError(503, f"NATS request on {subject} failed ({_why(exc)})") from exc
        try:
            response = response_model.model_validate_json(reply.data)
        except ValidationError as exc:
            REQUESTS_OUT.labels(subject=label, outcome="bad_reply").inc()
            raise BusError(502, f"unexpected reply on {subject} (schema mismatch between gateway and recall?)") from exc
        REQUESTS_OUT.labels(subject=label, outcome="ok").inc()
        return response


def _service_of(subject: str) -> str:
    """The service that answers ``subject``: sessions for user memory and the context, else recall."""
    return "sessions" if subject == subjects.CONTEXT or subject.startswith("engram.memory.") else "recall"


def _why(exc: BaseException) -> str:
    if isinstance(exc, nats.errors.NoRespondersError):
        return "no stream takes engram.in.message.* (ENGRAM_IN missing?)"
    if isinstance(exc, (nats.errors.TimeoutError, asyncio.TimeoutError)):
        return "timed out waiting for the acknowledgement"
    if is_stream_full(exc):
        return ("engram's input stream is full (ENGRAM_STREAM_MAX_BYTES): the pipeline is behind or stopped; "
                "nothing stored was dropped")
    return type(exc).__name__
