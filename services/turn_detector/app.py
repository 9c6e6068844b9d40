"""turn-detector service: a thin FastStream app around pairing.py.

Per input event (strictly in order per session, see engram/runtime/topology.py):
1. parse; a bad payload goes to ``engram.dlq.turn_detector`` with its reason, then is acked;
2. load the session state (KV); an event at or below the state's last stream sequence was
   already applied before a crash or redelivery: ack and stop;
3. apply the event (pure), publish the Episodes of completed turns (PubAck awaited, Nats-Msg-Id
   = episode id, so a re-publish after a crash is dropped by the server), publish an idle
   schedule when the session has an open turn and none is pending;
4. save the state with compare-and-set, then ack.
A crash between any two steps repeats only idempotent work. A failure is retried with a delayed
nack; after ``max_deliveries`` the event is dead-lettered with reason ``processing_failed``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from datetime import datetime, timezone
from typing import Any

from faststream.nats import NatsBroker
import nats.js.errors
from nats.js import JetStreamContext
from pydantic import TypeAdapter, ValidationError

from engram.runtime import dlq
from engram.observability import tracing
from engram.runtime.epochs import SessionEpochs
from engram.runtime.stream_retention import StreamKeeper
from engram.observability.pipeline_metrics import BacklogMonitor
from engram.text.secrets import scrub_secrets
from engram.runtime.service import ServiceApp, jetstream, make_broker, message_itself, subscribe_partitions
from engram.settings import EngramSettings
from engram.text.tokens import token_counter
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import ChatMessage, Episode, SessionClosed, SessionIdle, SessionSegmentClosed, subjects
from engram.schemas.validation import error_locations
from engram.services.turn_detector import metrics
from engram.services.turn_detector.intake import Rejected, parse_event, prepare_part
from engram.services.turn_detector.noise import NoiseSettings
from engram.services.turn_detector.pairing import (
    CompletedTurn,
    SegmentPolicy,
    SessionState,
    Transition,
    apply_close,
    apply_idle,
    apply_message,
    episodes_for,
    idle_timeout_for,
    plan_idle,
)
from engram.services.turn_detector.retention import InputEraser
from engram.services.turn_detector.state import SessionStore, StaleState

STAGE = "turn_detector"
_SESSION_IDS = TypeAdapter(list[str])
Event = ChatMessage | SessionClosed | SessionIdle


def _partition_of(subject: str) -> int | None:
    tokens = subject.split(".")
    return int(tokens[2]) if len(tokens) == 5 and tokens[2].isdigit() else None
log = logging.getLogger("engram.turn_detector")

# The JetStream time of the input message being handled (set per handler task): a turn keeps
# its earliest one for the freshness histograms (Episode.first_published_at).
_PUBLISHED_AT: contextvars.ContextVar[datetime | None] = contextvars.ContextVar("published_at", default=None)


class TurnDetector:
    """Handles one input event at a time per partition; holds no state a replica cannot rebuild."""

    def __init__(self, settings: EngramSettings, broker: NatsBroker) -> None:
        self.settings = settings
        self.turn = settings.turn
        self.broker = broker
        # the text cap follows the byte cap: a message accepted is kept whole (noise.py rule 5)
        self.noise = NoiseSettings(max_chars=max(64, self.turn.max_message_bytes))
        sessions = settings.session
        self.segments = SegmentPolicy(
            token_limit=sessions.token_limit, idle_close_s=sessions.idle_close_s,
            transcript_messages=sessions.transcript_messages, transcript_tokens=sessions.transcript_tokens,
        )
        self.count_tokens = token_counter()
        self.store: SessionStore | None = None
        self.epochs: SessionEpochs | None = None
        self.eraser: InputEraser | None = None
        self.js: JetStreamContext | None = None
        self.clock = time.time  # replaced in tests
        # processed messages leave after ENGRAM_PROCESSED_RETENTION_S; the stream's fill is reported
        # (and, as the first stage, the fill of the streams no stage sweeps)
        self.keeper = StreamKeeper([subjects.STREAM_IN], settings.processed_retention_s,
                                   watch=(subjects.STREAM_DLQ, subjects.STREAM_SCHED, subjects.STREAM_SUMMARY))
        self.backlog = BacklogMonitor(STAGE, subjects.STREAM_IN, [
            Topology.turn_detector_durable(p) for p in range(settings.partitions)])

    async def start(self) -> None:
        """Connect, declare the topology and open the KV store before any subscriber starts."""
        await self.broker.connect()
        self.js = jetstream(self.broker)
        await ensure_topology(self.js, Topology.from_settings(self.settings))
        self.store = SessionStore(await self.js.key_value(subjects.KV_TURN_SESSIONS))
        self.epochs = await SessionEpochs.open(self.js)
        self.eraser = InputEraser(self.js, self.turn.input_retention_s)
        self.eraser.start()
        self.backlog.start(self.js)
        self.keeper.start(self.js)

    async def stop(self) -> None:
        await self.backlog.stop()
        await self.keeper.stop()
        if self.eraser is not None:
            await self.eraser.stop()

    def forget_sessions(self, session_ids: list[str]) -> None:
        """Drop cached states of sessions a delete just erased (their KV checkpoints are gone)."""
        if self.store is not None:
            for session_id in session_ids:
                self.store.forget(session_id)

    async def handle(self, msg: Any) -> None:
        """``msg`` is the NatsMessage (see engram.runtime.service.message_itself)."""
        started = time.perf_counter()
        raw = msg.raw_message
        meta = raw.metadata
        _PUBLISHED_AT.set(meta.timestamp)
        try:
            outcome = await self._handle(raw.subject, raw.data, raw.headers, meta.sequence.stream, meta.sequence.consumer)
        except Exception as exc:  # noqa: BLE001 - every failure is retried, then dead-lettered
            if meta.num_delivered >= self.turn.max_deliveries and await self._skip(raw.subject, raw.data, meta.sequence.stream):
                log.error("giving up on seq=%s after %s deliveries: %s", meta.sequence.stream, meta.num_delivered, type(exc).__name__)
                await self._dead_letter(raw, "processing_failed", f"{type(exc).__name__} after {meta.num_delivered} deliveries")
                metrics.MESSAGES.labels(outcome="dead_lettered").inc()
                await msg.ack()
            else:
                log.warning("retrying seq=%s (delivery %s): %s", meta.sequence.stream, meta.num_delivered, type(exc).__name__, exc_info=log.isEnabledFor(logging.DEBUG))
                metrics.RETRIES.inc()
                await msg.nack(delay=min(30.0, 0.5 * 2 ** (meta.num_delivered - 1)))
            return
        metrics.MESSAGES.labels(outcome=outcome).inc()
        await msg.ack()
        metrics.HANDLE_SECONDS.observe(time.perf_counter() - started)

    async def _handle(
        self, subject: str, data: bytes, headers: dict[str, str] | None, seq: int, delivery_seq: int | None = None
    ) -> str:
        assert self.store is not None
        partition = _partition_of(subject)
        if partition is not None:
            self.store.observe_delivery(partition, delivery_seq)
        event = parse_event(subject, data, max_bytes=self.turn.max_message_bytes)
        if isinstance(event, Rejected):
            await self._dead_letter_raw(subject, data, headers, seq, event.reason, event.detail)
            return "dead_lettered"
        assert partition is not None  # parse_event accepted the subject shape
        for attempt in range(5):
            try:
                return await self._apply(event, seq, partition, fresh=attempt > 0)
            except StaleState:
                continue  # another replica checkpointed this session since we read it: reload
        raise RuntimeError("session state kept changing under us")

    async def _skip(self, subject: str, data: bytes, seq: int) -> bool:
        """Checkpoint the session past ``seq`` without applying it, so a message about to be
        dead-lettered is never replayed into a turn from the stream. False if that fails too
        (the message is then retried instead of dead-lettered: nothing is dropped silently)."""
        assert self.store is not None
        partition = _partition_of(subject)
        event = parse_event(subject, data, max_bytes=self.turn.max_message_bytes)
        if isinstance(event, Rejected) or partition is None:
            return True
        try:
            hit = self.store.cached(event.session_id)
            state, revision = hit if hit is not None else await self._load(event.session_id, partition, seq)
            state = state.model_copy(deep=True)  # the cached object is shared: change a copy
            if state.last_seq < seq:
                state.last_seq = seq
                state.outbox = []
                state.closed_outbox = []
                await self.store.persist(partition, state, revision)
        except Exception:  # noqa: BLE001
            log.exception("cannot checkpoint past seq=%s; will retry instead of dead-lettering", seq)
            self.store.forget(event.session_id)
            return False
        return True

    def _transition(self, state: SessionState, event: Event, *, count: bool = True,
                    published_at: datetime | None = None, trace_parent: str | None = None) -> tuple[Transition, int]:
        """Apply one event (pure pairing plus the message's scrub/filter), with metrics; also the
        number of secrets the event's texts held (the raw input holding them is erased at once).
        ``published_at``/``trace_parent``: the message's JetStream time and trace context
        (default: those of the message being handled).

        The event's time is its JetStream time, not the clock: whether a turn was idle is decided
        by the gaps between messages on the stream, so a crash, a restart or a backlog (the event
        handled minutes after it arrived) pairs the same turns (bench/chaos.py compares)."""
        published_at = published_at or _PUBLISHED_AT.get()
        now = published_at.timestamp() if published_at is not None else self.clock()
        secrets = 0
        if isinstance(event, ChatMessage):
            prepared = prepare_part(event, self.noise)
            secrets = sum(prepared.secrets.values())
            result = apply_message(
                state,
                prepared.message,
                prepared.part,
                now=now,
                include_system=self.turn.include_system,
                recent_ids_kept=self.turn.recent_ids_kept,
                tokens=self.count_tokens,
                segments=self.segments,
                published_at=published_at,
                trace_parent=trace_parent or tracing.current_traceparent(),
                idle_timeout_s=idle_timeout_for(state, self.turn.idle_timeout_s),
            )
            if count and result.outcome in ("accepted", "late"):
                for kind, n in prepared.secrets.items():
                    metrics.SECRETS.labels(kind=kind).inc(n)
                for kind in prepared.part.reductions:
                    metrics.REDUCTIONS.labels(kind=kind).inc()
        elif isinstance(event, SessionClosed):
            result = apply_close(state, now=now, closed_at=event.closed_at)
            # its reason is never stored, but its raw input is: erase it at once if it holds a secret
            secrets = sum(scrub_secrets(event.reason).counts.values()) if event.reason else 0
        else:
            result = apply_idle(state, now=now, idle_timeout_s=idle_timeout_for(state, self.turn.idle_timeout_s),
                                idle_close_s=self.segments.idle_close_s)
        plan_idle(result.state, idle_timeout_for(result.state, self.turn.idle_timeout_s), self.segments.idle_close_s)
        if count:
            for ended in result.closed:
                metrics.SEGMENTS_CLOSED.labels(reason=ended.reason).inc()
        return result, secrets

    async def _load(self, session_id: str, partition: int, seq: int) -> tuple[SessionState, int]:
        """Checkpoint from KV, then the session's events after it that were applied in memory
        only (by this or another replica) and are still in the input stream, up to ``seq``."""
        assert self.store is not None and self.js is not None
        state, revision = await self.store.load(session_id)
        if revision == 0 and self.epochs is not None:
            # A session started afresh: after a delete erased it, its epoch makes every turn id
            # (and so episode id) new, so re-posted content is not dropped as a duplicate.
            state.epoch = await self.epochs.get(session_id)
        session_subjects = f"engram.in.{partition}.*.{session_id}"
        next_seq = state.last_seq + 1
        while True:
            try:
                stored = await self.js.get_msg(subjects.STREAM_IN, seq=next_seq, subject=session_subjects, next=True)
            except nats.js.errors.NotFoundError:
                break
            if stored.seq is None or stored.seq >= seq:
                break
            event = parse_event(stored.subject or "", stored.data or b"", max_bytes=self.turn.max_message_bytes)
            if not isinstance(event, Rejected):
                result, _ = self._transition(state, event, count=False, published_at=stored.time,
                                             trace_parent=(stored.headers or {}).get("traceparent"))
                state = result.state
                state.last_seq = stored.seq
                state.outbox = list(result.completed)
                state.closed_outbox = list(result.closed)
                # Events that complete a turn or close a segment are checkpointed, so this is not
                # expected; if it happens the publish is idempotent anyway.
                await self._publish_effects(result.completed, None, result.closed)
            next_seq = stored.seq + 1
        return state, revision

    async def _apply(self, event: Event, seq: int, partition: int, *, fresh: bool) -> str:
        assert self.store is not None
        hit = None if fresh else self.store.cached(event.session_id)
        state, revision = hit if hit is not None else await self._load(event.session_id, partition, seq)
        if seq <= state.last_seq:
            # Applied before a crash or a failed ack. If it was checkpointed, its publishes may
            # not all have landed: repeat them (idempotent) and ack.
            if seq == state.last_seq:
                await self._publish_effects(state.outbox, state if state.idle_scheduled_for else None,
                                            state.closed_outbox)
            return "redelivered"
        result, secrets = self._transition(state, event)
        new = result.state
        schedule = new.idle_scheduled_for not in (None, state.idle_scheduled_for)
        new.last_seq = seq
        new.outbox = list(result.completed)
        new.closed_outbox = list(result.closed)
        # A message that held a secret is checkpointed at once (its scrubbed form is in the
        # checkpoint), so its raw input, the only copy of the secret, can be erased now instead of
        # waiting for the turn to complete and the retention delay to pass.
        if result.completed or result.closed or schedule or secrets or not isinstance(event, ChatMessage):
            # Checkpoint first, publish second. The compare-and-set proves the state we computed
            # from was the latest; publishing first could put a turn built from a stale state
            # on the stream under the right episode id, and the server would then drop the
            # correct one as a duplicate. After a crash between the two, the redelivery branch
            # above re-publishes the outbox.
            new_revision = await self.store.persist(partition, new, revision)
            await self._publish_effects(result.completed, new if schedule else None, result.closed)
            if self.eraser is not None:
                self.eraser.checkpointed(event.session_id, seq, new_revision, at_once=bool(secrets))
            for turn in result.completed:
                metrics.TURNS.labels(completed_by=turn.completed_by).inc()
        else:
            # Only a message added to an open turn: it stays in the input stream, so memory is
            # enough until the next checkpoint (see state.py).
            self.store.keep(partition, new, revision)
        return result.outcome

    async def _publish_effects(self, turns: list[CompletedTurn], schedule_for: SessionState | None,
                               closed: list[SessionSegmentClosed] = ()) -> None:  # type: ignore[assignment]
        """Episodes of completed turns (Nats-Msg-Id = episode id), closed segments (Nats-Msg-Id =
        segment id) and the idle schedule."""
        publishes = [
            self._publish_episode(ep, turn.trace_parent)
            for turn in turns
            for ep in episodes_for(turn, prefix=self.settings.group_prefix, max_chars=self.turn.max_turn_chars)
        ]
        publishes += [self._publish_segment_closed(ended) for ended in closed]
        if schedule_for is not None:
            publishes.append(self._schedule_idle(schedule_for))
        if len(publishes) <= 1:
            # The common case (one episode, or nothing): no task per publish (profiled: gather
            # wraps each coroutine in a task, a visible share of the handler's CPU).
            for publish in publishes:
                await publish
            return
        outcomes = await asyncio.gather(*publishes, return_exceptions=True)
        for failure in outcomes:
            if isinstance(failure, BaseException):
                raise failure

    async def _publish_episode(self, ep: Episode, trace_parent: str | None = None) -> None:
        # Straight to JetStream, not through broker.publish: FastStream's publish path (its
        # Prometheus and telemetry middlewares) was a fifth of the handler's CPU (py-spy,
        # bench/turn_detector.py), and the service already counts episodes itself. The turn's
        # trace context travels as the W3C header, so the extractor continues the turn's trace.
        headers = {subjects.HDR_MSG_ID: ep.episode_id, "content-type": "application/json"}
        traceparent = trace_parent or tracing.current_traceparent()
        if traceparent:
            headers["traceparent"] = traceparent
        assert self.js is not None
        await self.js.publish(subjects.episode(ep.group_id), ep.model_dump_json().encode(), headers=headers,
                              stream=subjects.STREAM_EPISODES)
        metrics.EPISODES.labels(scope=ep.scope).inc()

    async def _publish_segment_closed(self, ended: SessionSegmentClosed) -> None:
        await self.broker.publish(
            ended.model_dump_json().encode(),
            subjects.session_closed(ended.session_id),
            headers={subjects.HDR_MSG_ID: ended.segment_id, "content-type": "application/json"},
            stream=subjects.STREAM_SESSIONS,
        )

    async def _schedule_idle(self, state: SessionState) -> None:
        """Publish the session's idle schedule (a newer one on the same subject replaces it).

        Only when the planned fire time changed: one publish per idle period, not per message.
        A tick that fires while the session was active since is answered by apply_idle with a
        later fire time, published here again.
        """
        assert self.js is not None and state.idle_scheduled_for is not None
        # Whole seconds in the future (a repeat after a crash may find the planned time passed).
        fire_epoch = max(int(state.idle_scheduled_for) + 1, int(self.clock()) + 1)
        fire_at = datetime.fromtimestamp(fire_epoch, tz=timezone.utc)
        tick = SessionIdle(session_id=state.session_id, scheduled_for=fire_at)
        await self.js.publish(
            subjects.sched_idle(state.session_id),
            tick.model_dump_json().encode(),
            headers={
                "Nats-Schedule": f"@at {fire_at.strftime('%Y-%m-%dT%H:%M:%SZ')}",
                # fires in ENGRAM_SCHED, which ENGRAM_IN sources into the session's partition
                "Nats-Schedule-Target": subjects.sched_idle_fired(state.session_id),
            },
            stream=subjects.STREAM_SCHED,
        )

    async def _dead_letter(self, raw: Any, reason: str, detail: str) -> None:
        await self._dead_letter_raw(raw.subject, raw.data, raw.headers, raw.metadata.sequence.stream, reason, detail)

    async def _dead_letter_raw(
        self, subject: str, data: bytes, headers: dict[str, str] | None, seq: int, reason: str, detail: str
    ) -> None:
        assert self.js is not None
        log.warning("dead-lettering seq=%s reason=%s", seq, reason)
        await dlq.dead_letter(
            self.js,
            stage=STAGE,
            reason=reason,
            detail=detail,
            subject=subject,
            payload=data,
            headers=headers,
            source_id=f"{subjects.STREAM_IN}:{seq}",
        )


def build(settings: EngramSettings | None = None) -> ServiceApp:
    settings = settings or EngramSettings()
    broker = make_broker(settings, service="turn-detector")
    detector = TurnDetector(settings, broker)
    topology = Topology.from_settings(settings)
    consumers = [topology.turn_detector_consumer(p) for p in range(settings.partitions)]
    subscribe_partitions(broker, subjects.STREAM_IN, consumers, detector.handle, title="turn-detector")

    @broker.subscriber(subjects.CTL_FORGET_SESSIONS, decoder=message_itself)
    async def forget(msg: Any) -> None:  # core NATS: every replica hears it
        # parsed here, not by FastStream: its validation error would be logged with the body
        try:
            session_ids = _SESSION_IDS.validate_json(msg.body)
        except ValidationError as exc:
            log.warning("ignored a malformed forget-sessions message: %s",
                        error_locations(exc, 5))
            return
        detector.forget_sessions(session_ids)

    app = ServiceApp(name="turn-detector", broker=broker, on_startup=[detector.start], on_shutdown=[detector.stop])
    app.detector = detector  # type: ignore[attr-defined]
    return app
