"""sessions service: a thin FastStream app around close.py (the close stage's steps), store.py
(the memory group's graph) and, on its request/reply side, requests.py (proactive memory and the
context builder).

Per SessionSegmentClosed on ``engram.session.closed.<session>`` (durable ``sessions`` of
``ENGRAM_SESSIONS``):

1. parse; a bad payload is dead-lettered (``engram.dlq.sessions``, reason ``schema``) and acked;
2. the memory group: the user's when the segment named a user, else the workspace's, else the
   session's (:func:`engram.schemas.memory.memory_group_for`);
3. claim the segment (:meth:`MemoryStore.claim_session`, one MERGE): ``closed`` -> ack, no LLM
   call (a redelivery, a re-publish); ``busy`` (another worker claimed it less than a lease ago)
   -> nack with a short delay, the redelivery then finds it closed. So two concurrent deliveries
   of one segment make exactly one summary call (stricter than seed 004, where both ran);
4. the previous summaries of the group (``ENGRAM_SESSION_PREVIOUS_SUMMARIES``, newest first),
   once the same session's previous segment is closed (while a live worker closes it, this one
   is nacked with a short delay: ``engram_sessions_previous_segment_waits_total``),
   then summary and facts concurrently (close.py; each step catches its own failures);
5. preferences (``source=extraction``; the latest value wins, see store.py) and notes (deduped),
   then the session record, which marks the segment closed. A crash before the record leaves the
   claim to run out; the redelivery runs the steps again and stores the same facts (idempotent).

The session always closes: a failed summary gives the fallback text, failed or invalid facts
give none, an empty or tool-only transcript makes no LLM call (``EMPTY_SUMMARY``). Only a graph
that cannot be written fails the message: retried with a growing delay, then dead-lettered
(``processing_failed``). The lease is the consumer's ack wait: a live worker keeps its message
in progress and renews its claim every third of it, so a claim older than that belongs to a
dead worker and is taken over.

Metrics: ``engram_sessions_closed_total{reason}``, ``engram_sessions_close_steps_total{step,
outcome}``, ``engram_sessions_close_seconds``, ``engram_sessions_close_messages_total{outcome}``;
LLM calls and tokens under ``engram_llm_*{stage="sessions"}`` (AccountingLLMClient).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from faststream.nats import NatsBroker
from graphiti_core.llm_client.client import LLMClient
from nats.js import JetStreamContext
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from engram.runtime import dlq
from engram.observability import graphiti_tracing
from engram.graph.drivers import GraphDrivers
from engram.runtime.stream_retention import StreamKeeper
from engram.observability.pipeline_metrics import BacklogMonitor
from engram.models.accounting import AccountingLLMClient
from engram.models.factory import LLMSettings, build_llm
from engram.runtime.service import (
    CapacityPuller,
    ServiceApp,
    jetstream,
    keep_alive,
    make_broker,
    retry_or_dead_letter,
    start_pulling,
    subscribe_partitions_with_capacity,
)
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import subjects
from engram.schemas.memory import CloseReason, SessionSegmentClosed, memory_group_for
from engram.schemas.validation import error_locations
from engram.services.sessions import requests
from engram.services.sessions.close import ClosedSegment, FactsOutcome, SummaryOutcome, close_segment
from engram.services.sessions.store import MemoryStore

STAGE = "sessions"
log = logging.getLogger("engram.sessions")

CLOSED = Counter("engram_sessions_closed_total", "Session segments closed (record written), by close reason.", ["reason"])
STEPS = Counter(
    "engram_sessions_close_steps_total",
    "Outcomes of the close stage's steps: summary ok|fallback|skipped, facts ok|empty|failed|invalid|skipped.",
    ["step", "outcome"],
)
UNGROUNDED = Counter(
    "engram_sessions_facts_ungrounded_total",
    "Extracted preferences and notes dropped because the user's own messages do not say them (close.grounded_facts).",
)
PREVIOUS_WAITS = Counter(
    "engram_sessions_previous_segment_waits_total",
    "Times a segment's close waited (nack with a short delay) for the same session's previous segment, being "
    "closed by a live worker, so that its summary chains that one.",
)
MESSAGES = Counter(
    "engram_sessions_close_messages_total",
    "SessionSegmentClosed messages handled, by outcome (closed, duplicate, busy, dead_lettered).", ["outcome"],
)
CLOSE_SECONDS = Histogram(
    "engram_sessions_close_seconds", "Time to close one segment (claim to record, LLM calls included).",
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
for _reason in typing.get_args(CloseReason):  # every series exists from the start (rate() needs a zero)
    CLOSED.labels(reason=_reason)
for _outcome in typing.get_args(SummaryOutcome):
    STEPS.labels(step="summary", outcome=_outcome)
for _outcome in typing.get_args(FactsOutcome):
    STEPS.labels(step="facts", outcome=_outcome)
for _outcome in ("closed", "duplicate", "busy", "dead_lettered"):
    MESSAGES.labels(outcome=_outcome)


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Busy:
    """Another worker holds the segment's claim: try again after ``delay_s``."""

    delay_s: float


class SessionCloser:
    def __init__(
        self,
        settings: EngramSettings,
        broker: NatsBroker,
        llm: LLMClient | None = None,
        *,
        clock: Callable[[], datetime] = utc_now,
        busy_retry_s: float = 5.0,
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.llm = AccountingLLMClient(llm or build_llm(LLMSettings(), nats=lambda: broker.connection), stage=STAGE)
        self.llm.set_tracer(graphiti_tracing.graphiti_tracer("sessions"))  # LLM spans, no content (engram/observability/graphiti_tracing.py)
        self.graphs = GraphDrivers(settings)
        self.store = MemoryStore(self.graphs, activities_kept=settings.session.activities_kept)
        self.clock = clock
        self.lease_s = float(Topology.from_settings(settings).sessions_consumer().ack_wait)
        self.busy_retry_s = busy_retry_s
        self.js: JetStreamContext | None = None
        self.max_deliveries = settings.turn.max_deliveries
        # processed messages leave after ENGRAM_PROCESSED_RETENTION_S; the stream's fill is reported
        self.keeper = StreamKeeper([subjects.STREAM_SESSIONS], settings.processed_retention_s)
        # closed segments waiting (one durable: partition "0"), engram/observability/pipeline_metrics.py
        self.backlog = BacklogMonitor(STAGE, subjects.STREAM_SESSIONS, [Topology.SESSIONS_DURABLE])
        self.puller: CapacityPuller | None = None  # set by build(): closes in flight = replicas x slots
        self.stop_grace_s = 15.0  # closes in flight get this long at stop, then are nacked

    async def start(self) -> None:
        self.graphs.validate()
        await self.broker.connect()
        self.js = jetstream(self.broker)
        await ensure_topology(self.js, Topology.from_settings(self.settings))
        self.backlog.start(self.js)
        self.keeper.start(self.js)

    async def stop(self) -> None:
        await self.backlog.stop()
        await self.keeper.stop()
        if self.puller is not None:  # before the graphs close: closes in flight still use them
            await self.puller.stop(self.stop_grace_s)
        await self.graphs.close()

    # --- handler -----------------------------------------------------------------------------
    async def handle(self, msg: Any) -> None:
        """``msg`` is the NatsMessage (see engram.runtime.service.message_itself)."""
        raw = msg.raw_message
        try:
            event = SessionSegmentClosed.model_validate_json(raw.data)
        except ValidationError as exc:
            detail = error_locations(exc, 10)
            await self._dead_letter(raw, "schema", detail)
            MESSAGES.labels(outcome="dead_lettered").inc()
            await msg.ack()
            return
        if event.session_id != dlq.subject_token(raw.subject):
            await self._dead_letter(raw, "session_mismatch", "session_id in body differs from the subject's session token")
            MESSAGES.labels(outcome="dead_lettered").inc()
            await msg.ack()
            return
        heartbeat = keep_alive(msg, self.settings.ack_wait_s)
        try:
            outcome = await self.close(event, first_delivery=(raw.metadata.num_delivered or 1) <= 1)
        except Exception as exc:  # noqa: BLE001 - retried, then dead-lettered
            if await retry_or_dead_letter(
                msg, exc, max_deliveries=self.max_deliveries, logger=log,
                dead_letter=lambda reason, detail: self._dead_letter(raw, reason, detail),
            ):
                MESSAGES.labels(outcome="dead_lettered").inc()
            return
        finally:
            heartbeat.cancel()
        if isinstance(outcome, Busy):
            MESSAGES.labels(outcome="busy").inc()
            await msg.nack(delay=outcome.delay_s)
            return
        MESSAGES.labels(outcome=outcome).inc()
        await msg.ack()


    async def _renew(self, group: str, segment_id: str, token: str) -> None:
        """Keep the claim younger than the lease while this worker closes the segment."""
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                await self.store.renew_claim(group, segment_id, token)
            except Exception as exc:  # noqa: BLE001 - the next round tries again; the close goes on
                log.warning("could not renew a session claim (%s)", type(exc).__name__)

    def group_of(self, event: SessionSegmentClosed) -> str:
        group = memory_group_for(self.settings.group_prefix, user=event.scopes.user,
                                 workspace=event.scopes.workspace, session=event.session_id)
        assert group is not None  # the session is always given
        return group

    async def close(self, event: SessionSegmentClosed, *, first_delivery: bool = False) -> str | Busy:
        """Close one segment: ``closed``, ``duplicate`` (closed before) or :class:`Busy`."""
        group = self.group_of(event)
        now = self.clock()
        if event.segment > 0 and self.settings.session.previous_summaries > 0:
            # Segments close concurrently (replicas x slots), but a segment's summary chains the
            # earlier ones. The previous segment of the same session is published first: while a
            # live worker closes it, this one waits (bounded by that close's lease); with no
            # record of it yet, a first delivery waits once (two slots may have pulled both at
            # once and it is about to be claimed). A previous segment that failed, was released,
            # or belongs to another group is not waited for.
            previous = await self.store.segment_state(group, session_id=event.session_id, segment=event.segment - 1,
                                                      lease_s=self.lease_s, now=now)
            if previous == "closing" or (previous is None and first_delivery):
                PREVIOUS_WAITS.inc()
                return Busy(max(0.5, min(self.busy_retry_s, 2.0)))
        claim = await self.store.claim_session(group, session_id=event.session_id, segment=event.segment,
                                               segment_id=event.segment_id, lease_s=self.lease_s, now=now)
        if claim.outcome == "closed":
            return "duplicate"
        if claim.outcome == "busy":
            held = (now - claim.claimed_at).total_seconds() if claim.claimed_at else 0.0
            return Busy(max(0.5, min(self.busy_retry_s, self.lease_s - held)))
        started = time.perf_counter()
        renewing = asyncio.create_task(self._renew(group, event.segment_id, claim.token))
        try:
            closed = await self._close_claimed(group, event, claim.token)
        except BaseException:
            with contextlib.suppress(Exception):  # let the retry claim it at once
                await self.store.release_session(group, event.segment_id, claim.token)
            raise
        finally:
            renewing.cancel()
        CLOSE_SECONDS.observe(time.perf_counter() - started)
        STEPS.labels(step="summary", outcome=closed.summary.outcome).inc()
        STEPS.labels(step="facts", outcome=closed.facts.outcome).inc()
        UNGROUNDED.inc(closed.facts.ungrounded)
        return "closed"

    async def _close_claimed(self, group: str, event: SessionSegmentClosed, token: str) -> ClosedSegment:
        session = self.settings.session
        previous: list[str] = []
        if session.previous_summaries > 0 and any(t.role in ("user", "assistant") and t.text.strip()
                                                  for t in event.transcript):
            # the fixed fallback and empty texts say nothing about the user: left out
            previous = [r.summary for r in await self.store.last_sessions(group, session.previous_summaries)
                        if r.summary_source in ("llm", "rules")]
        closed = await close_segment(self.llm, event, previous, summary_max_tokens=session.summary_max_tokens,
                                     facts_max_tokens=session.facts_max_tokens)
        # facts first, the record last: the record is what marks the segment closed
        for pref in closed.facts.facts.preferences:
            await self.store.set_preference(group, pref.key, pref.value, source="extraction",
                                            session_id=event.session_id, at=event.closed_at)
        for note in closed.facts.facts.notes:
            await self.store.add_note(group, note, source="extraction", session_id=event.session_id,
                                      at=event.closed_at)
        if await self.store.save_session(group, closed.record, token=token):
            CLOSED.labels(reason=event.reason).inc()
        else:  # our lease ran out and another worker closed it meanwhile: its record stands
            log.warning("segment %s was closed by another worker meanwhile; keeping its record", event.segment)
        return closed

    async def _dead_letter(self, raw: Any, reason: str, detail: str) -> None:
        assert self.js is not None
        await dlq.dead_letter(
            self.js, stage=STAGE, reason=reason, detail=detail, subject=raw.subject, payload=raw.data,
            headers=raw.headers, source_id=f"{subjects.STREAM_SESSIONS}:{raw.metadata.sequence.stream}",
        )


def build(
    settings: EngramSettings | None = None,
    llm: LLMClient | None = None,
    *,
    clock: Callable[[], datetime] = utc_now,
    busy_retry_s: float = 5.0,
) -> ServiceApp:
    settings = settings or EngramSettings()
    broker = make_broker(settings, service="sessions")
    service = SessionCloser(settings, broker, llm, clock=clock, busy_retry_s=busy_retry_s)
    topology = Topology.from_settings(settings)
    service.puller = subscribe_partitions_with_capacity(
        broker, subjects.STREAM_SESSIONS, [topology.sessions_consumer()], service.handle, title="sessions close",
        capacity=settings.sessions_concurrency, wake_subject=subjects.SESSION_CLOSED.format(session="*"), idle_max_s=0.5,
    )
    context = requests.subscribe(broker, service.store, settings)
    app = ServiceApp(name="sessions", broker=broker, on_startup=[service.start],
                     after_startup=[start_pulling(broker, service.puller)], on_shutdown=[service.stop])
    app.sessions = service  # type: ignore[attr-defined]
    app.context = context  # type: ignore[attr-defined]
    return app
