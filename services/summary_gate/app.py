"""summary-gate service: a thin FastStream app around gate.py (decisions), store.py (graph state)
and summarize.py (grounded, batched refreshes).

Per message on ``engram.delta.<group>`` (strictly in order per group, like the extractor: one
shared durable whose deliveries wake a group's chain, engram/runtime/group_order.py; any number of groups
at once up to ``ENGRAM_SUMMARY_GATE_CONCURRENCY`` per replica):

* a NodeDelta: load the node's active facts and gate state, decide (gate.decide), then
  - refresh: summarise the node -- together with every other node of the group whose deferred
    refresh is due, up to ``batch_size`` per LLM call -- embed the summaries, store summary and
    state in one statement;
  - defer: schedule a flush tick (NATS message schedule on ``engram.sched.summary.<group>.<node>``
    in ENGRAM_SCHED, fired there and sourced by ENGRAM_DELTAS into the group's partition, in order);
  - skip: store the state; a deterministic sample goes to ``engram.summary.audit.<group>``; a
    skip that leaves the summary behind its facts arms the staleness sweep: a ``staleness``
    SummaryTick scheduled on the same subject ``staleness_sla_s`` of wall time later;
* a SummaryTick: flush the node's deferred refresh unless a newer deferral or a refresh made the
  tick stale; a ``staleness`` tick refreshes (reason ``staleness_sweep``) a node whose summary
  still lacks the skipped change (gate.decide_sweep).
Every decision is a SummaryEvent on ``engram.summary.<group>`` and a Prometheus counter.

Crash safety: events and the tick are published (with deterministic Nats-Msg-Ids) BEFORE the
state is stored, and the state records the delta as applied. A crash before the store means a
redelivery decides the same way from the same state and re-publishes into the dedupe window; a
crash after it finds the delta applied and only acks. A refresh may then be paid twice; a
decision is never lost or counted twice in the stream.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any, Literal

from faststream.nats import NatsBroker
from graphiti_core.embedder.client import EmbedderClient
from graphiti_core.llm_client.client import LLMClient
from nats.js import JetStreamContext
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from engram.runtime import dlq
from engram.observability import graphiti_tracing
from engram.graph.drivers import GraphDrivers
from engram.runtime.stream_retention import StreamKeeper
from engram.observability.pipeline_metrics import BacklogMonitor, observe_freshness
from engram.models.accounting import AccountingLLMClient
from engram.models.factory import EmbedderSettings, LLMSettings, build_embedder, build_llm
from engram.runtime.group_order import GroupOrder, StoredMessage
from engram.runtime.service import (
    CapacityPuller,
    ServiceApp,
    failure_decision,
    jetstream,
    make_broker,
    start_pulling,
    subscribe_partitions_with_capacity,
)
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import NodeDelta, SummaryAudit, SummaryEvent, SummaryTick, subjects
from engram.schemas.validation import error_locations
from engram.services.summary_gate import store
from engram.services.summary_gate.gate import Decision, GateSettings, after_refresh, decide, decide_tick, sampled_for_audit
from engram.services.summary_gate.guard import default_threshold, embedder_kind
from engram.services.summary_gate.summarize import facts_summary, refresh_summaries

STAGE = "summary_gate"
log = logging.getLogger("engram.summary_gate")

REFRESHED = Counter("engram_summary_refreshed_total", "Summaries refreshed, by reason.", ["reason"])
SKIPPED = Counter("engram_summary_skipped_total", "Summary refreshes skipped, by reason.", ["reason"])
COMPOSED = Counter(
    "engram_summary_composed_total",
    "Refreshes answered without an LLM call (the node's few active facts are its summary), by reason.",
    ["reason"],
)
DEFERRED = Counter("engram_summary_deferred_total", "Summary refreshes deferred (node in a burst).")
MESSAGES = Counter("engram_summary_gate_messages_total", "Messages handled, by kind and outcome.", ["kind", "outcome"])
LLM_SECONDS = Histogram(
    "engram_summary_llm_seconds", "Latency of one summary refresh LLM call (a batch of nodes).",
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
BATCH_NODES = Histogram(
    "engram_summary_batch_nodes", "Nodes refreshed by one LLM call.", buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32, 64)
)


def _message_type(data: bytes) -> str | None:
    """The top-level ``type`` of a JSON object (SummaryTick has one, NodeDelta none); malformed
    JSON gives None and fails validation as a NodeDelta, with its reason."""
    try:
        value = json.loads(data)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json goes (hostile input)
        return None
    return value.get("type") if isinstance(value, dict) else None


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class SummaryGate:
    def __init__(
        self,
        settings: EngramSettings,
        broker: NatsBroker,
        llm: LLMClient | None = None,
        embedder: EmbedderClient | None = None,
        clock: Callable[[], datetime] = utc_now,
        gate: GateSettings | None = None,
    ) -> None:
        self.settings = settings
        self.broker = broker
        self.llm = AccountingLLMClient(llm or build_llm(LLMSettings(), nats=lambda: broker.connection), stage=STAGE)
        self.llm.set_tracer(graphiti_tracing.graphiti_tracer("summary-gate"))  # LLM spans, no content (engram/observability/graphiti_tracing.py)
        self.embedder = embedder or build_embedder(EmbedderSettings())
        # the drift threshold is per embedder too (gate.DRIFT_THRESHOLDS, bench/summary_gate.py)
        self.gate = (gate or GateSettings()).for_embedder(embedder_kind(self.embedder))
        # the summary guard's similarity threshold is per embedder (guard.py, bench/summary_guard.py)
        self.guard_threshold = (
            self.gate.guard_threshold if self.gate.guard_threshold is not None else default_threshold(self.embedder)
        )
        self.graph = GraphDrivers(settings)
        self.clock = clock
        self.js: JetStreamContext | None = None
        self.max_deliveries = settings.turn.max_deliveries
        # processed messages leave after ENGRAM_PROCESSED_RETENTION_S; the stream's fill is reported
        self.keeper = StreamKeeper([subjects.STREAM_DELTAS], settings.processed_retention_s)
        self.backlog = BacklogMonitor(STAGE, subjects.STREAM_DELTAS, [Topology.SUMMARY_GATE_DURABLE])
        self.order = GroupOrder(
            stage=STAGE, stream=subjects.STREAM_DELTAS, group_filter=lambda group: f"engram.delta.*.{group}",
            process=self._process_stored, dead_letter=self._dead_letter_failed, lease_s=settings.ack_wait_s,
            decide=lambda exc, attempt: failure_decision(exc, attempt, max_deliveries=self.max_deliveries, logger=log),
        )
        self.puller: CapacityPuller | None = None  # set by build()
        self.stop_grace_s = 15.0  # in-flight chains get this long at stop, then are nacked

    async def start(self) -> None:
        self.graph.validate()
        await self.broker.connect()
        self.js = jetstream(self.broker)
        topology = Topology.from_settings(self.settings)
        await ensure_topology(self.js, topology)
        await self.order.start(self.js)
        self.backlog.start(self.js)
        self.keeper.start(self.js)
        retention = topology.schedule_stream().max_age or 0.0
        if self.gate.staleness_sla_s >= retention:
            # the sweep's schedule is a message in ENGRAM_SCHED: it would age out before firing
            log.warning("ENGRAM_SUMMARY_STALENESS_SLA_S (%.0f s) is not below the schedule stream's retention (%.0f s): "
                        "staleness sweeps would expire unfired", self.gate.staleness_sla_s, retention)

    async def stop(self) -> None:
        await self.backlog.stop()
        await self.keeper.stop()
        if self.puller is not None:  # before the graph closes: chains in flight still use it
            await self.puller.stop(self.stop_grace_s)
        await self.graph.close()

    # --- handler -----------------------------------------------------------------------------
    async def handle(self, msg: Any) -> None:
        """``msg`` is the NatsMessage (see engram.runtime.service.message_itself): a doorbell of the group
        order, which acks it or runs the group's chain through :meth:`_process_stored`."""
        await self.order.deliver(msg.raw_message)

    async def _process_stored(self, stored: StoredMessage) -> None:
        """One delta or tick of a group's chain; raises on a failure worth retrying (bad input is
        dead-lettered here and returns)."""
        kind = "delta"
        try:
            kind = "tick" if _message_type(stored.data) == "summary_tick" else "delta"
            event = (SummaryTick if kind == "tick" else NodeDelta).model_validate_json(stored.data)
        except ValidationError as exc:
            await self._dead_letter(stored, "schema", error_locations(exc, 10))
            MESSAGES.labels(kind=kind, outcome="dead_lettered").inc()
            return
        if event.group_id != dlq.subject_token(stored.subject):
            # the subject's group chose the chain (the group's order): a body naming another
            # group would be applied outside that group's order, into a group it was not sent to
            await self._dead_letter(stored, "group_mismatch", "group_id in body differs from the subject's group token")
            MESSAGES.labels(kind=kind, outcome="dead_lettered").inc()
            return
        outcome = await (self.on_tick(event) if isinstance(event, SummaryTick) else self.on_delta(event))
        MESSAGES.labels(kind=kind, outcome=outcome).inc()

    async def _dead_letter_failed(self, stored: StoredMessage, reason: str, detail: str) -> None:
        await self._dead_letter(stored, reason, detail)
        kind = "tick" if _message_type(stored.data) == "summary_tick" else "delta"
        MESSAGES.labels(kind=kind, outcome="dead_lettered").inc()

    # --- decisions ---------------------------------------------------------------------------
    async def on_delta(self, delta: NodeDelta) -> str:
        driver = await self.graph.driver(delta.group_id)
        node = await self._load(driver, delta.group_id, delta.node_uuid)
        if node is None:
            return "node_missing"  # deleted since (group or episode delete): nothing to summarise
        now = self.clock()
        decision = decide(delta, node.facts, node.meta, now, self.gate)
        if decision.action == "duplicate":
            return "duplicate"
        if decision.action == "refresh":
            await self._refresh(driver, delta.group_id, node, decision, delta.episode_id, delta.episode_time, now)
            observe_freshness("summary", delta.first_published_at)
        elif decision.action == "defer":
            assert decision.meta.pending is not None
            await self._schedule_tick(delta.group_id, node.uuid, decision.meta.pending.token,
                                      decision.meta.pending.flush_after, "flush")
            await self._publish_event(delta.group_id, node, decision, delta.episode_id, "deferred", now)
            await store.save_meta(driver, delta.group_id, node.uuid, decision.meta)
            DEFERRED.inc()
        else:
            if sampled_for_audit(node.uuid, delta.episode_id, self.gate.audit_sample_rate):
                await self._publish_audit(delta, node, decision, now)
            if decision.arm_sweep:
                assert decision.meta.stale is not None
                await self._schedule_tick(delta.group_id, node.uuid, decision.meta.stale.token,
                                          decision.meta.stale.sweep_at, "staleness")
            await self._skip(driver, delta.group_id, node, decision, delta.episode_id, now)
            observe_freshness("summary", delta.first_published_at)
        return decision.action

    async def on_tick(self, tick: SummaryTick) -> str:
        driver = await self.graph.driver(tick.group_id)
        node = await self._load(driver, tick.group_id, tick.node_uuid)
        if node is None:
            return "node_missing"
        decision = decide_tick(tick, node.facts, node.meta)
        if decision.action == "stale_tick":
            return "stale_tick"
        now = self.clock()
        if decision.action == "skip":  # the burst (or the skipped change) left the facts as the summary has them
            # (a sweep's token is the episode_id of a skip that already has a "skipped" event: its own id)
            await self._skip(driver, tick.group_id, node, decision, tick.token, now,
                             msg_key="sweep" if tick.kind == "staleness" else "")
            return "skipped"
        if tick.kind == "staleness":
            # current to the newest episode the gate has seen for the node (no episode brought this tick)
            seen = node.meta.recent_episode_times
            current_to = max(seen) if seen else (node.meta.last_summary_ts or now)
            await self._refresh(driver, tick.group_id, node, decision, tick.token, current_to, now)
            return "swept"
        assert node.meta.pending is not None
        await self._refresh(driver, tick.group_id, node, decision, tick.token, node.meta.pending.last_episode_time, now)
        return "flushed"

    async def _skip(self, driver: Any, group_id: str, node: store.NodeView, decision: Decision, episode_id: str,
                    now: datetime, msg_key: str = "") -> None:
        await self._publish_event(group_id, node, decision, episode_id, "skipped", now, msg_key=msg_key)
        await store.save_meta(driver, group_id, node.uuid, decision.meta)
        SKIPPED.labels(reason=decision.reason).inc()

    async def _load(self, driver: Any, group_id: str, node_uuid: str) -> store.NodeView | None:
        return await store.load_node(
            driver, group_id, node_uuid, max_facts=self.gate.max_facts_in_prompt, episodes=self.gate.episode_window
        )

    async def _refresh(
        self, driver: Any, group_id: str, node: store.NodeView, decision: Decision, episode_id: str,
        current_to: datetime, now: datetime,
    ) -> None:
        """Refresh ``node`` and, in the same LLM call, every other node of the group that is due."""
        batch: list[tuple[store.NodeView, Decision, str, datetime]] = [(node, decision, episode_id, current_to)]
        for uuid in await store.due_nodes(driver, group_id, now, limit=self.gate.batch_size - 1, exclude=node.uuid):
            other = await self._load(driver, group_id, uuid)
            if other is None or other.meta.pending is None:
                continue
            tick = SummaryTick(group_id=group_id, node_uuid=uuid, token=other.meta.pending.token,
                               scheduled_for=other.meta.pending.flush_after)
            mate = decide_tick(tick, other.facts, other.meta)
            if mate.action == "skip":
                await self._skip(driver, group_id, other, mate, other.meta.pending.token, now)
            else:
                batch.append((other, mate, other.meta.pending.token, other.meta.pending.last_episode_time))
        # A node with at most compose_max_facts active facts: its summary is those facts, no LLM
        # needed (bench/summary_gate.py: most first summaries on LoCoMo are of one-fact entities).
        composed = {i for i, b in enumerate(batch) if len(b[0].facts) <= self.gate.compose_max_facts}
        asked = [b[0] for i, b in enumerate(batch) if i not in composed]
        answers: list[str] = []
        if asked:
            started = time.perf_counter()
            answers = await refresh_summaries(
                self.llm, asked, max_facts=self.gate.max_facts_in_prompt, max_chars=self.gate.max_summary_chars,
                embedder=self.embedder, guard_threshold=self.guard_threshold,
            )
            LLM_SECONDS.observe(time.perf_counter() - started)
            BATCH_NODES.observe(len(asked))
        remaining = iter(answers)
        summaries = [
            facts_summary(b[0], self.gate.max_facts_in_prompt, self.gate.max_summary_chars) if i in composed
            else next(remaining)
            for i, b in enumerate(batch)
        ]
        vectors = await self.embedder.create_batch(summaries)
        for i, ((view, dec, ep_id, to), summary, vector) in enumerate(zip(batch, summaries, vectors)):
            meta = after_refresh(dec.meta, list(vector), to)
            await self._publish_event(group_id, view, dec, ep_id, "refreshed", now,
                                      batch_size=0 if i in composed else len(asked))
            await store.save_summary(driver, group_id, view.uuid, summary, meta)
            REFRESHED.labels(reason=dec.reason).inc()
            if i in composed:
                COMPOSED.labels(reason=dec.reason).inc()

    # --- publishing --------------------------------------------------------------------------
    async def _publish_event(
        self, group_id: str, node: store.NodeView, decision: Decision, episode_id: str, verdict: str,
        now: datetime, batch_size: int | None = None, msg_key: str = "",
    ) -> None:
        event = SummaryEvent(
            group_id=group_id, node_uuid=node.uuid, node_name=node.name, episode_id=episode_id,
            decision=verdict,  # type: ignore[arg-type]
            reason=decision.reason or "unchanged_hash", drift=decision.drift, active_facts=len(node.facts),
            batch_size=batch_size, decided_at=now,
        )
        await self._publish(subjects.summary(group_id), event.model_dump_json().encode(),
                            f"summary:{node.uuid}:{episode_id}:{verdict}{':' + msg_key if msg_key else ''}")

    async def _publish_audit(self, delta: NodeDelta, node: store.NodeView, decision: Decision, now: datetime) -> None:
        audit = SummaryAudit(
            group_id=delta.group_id, node_uuid=node.uuid, node_name=node.name, episode_id=delta.episode_id,
            reason=decision.reason or "unchanged_hash", drift=decision.drift,
            active_facts=[f.fact for f in node.facts], kept_summary=node.summary, decided_at=now,
        )
        await self._publish(subjects.summary_audit(delta.group_id), audit.model_dump_json().encode(),
                            f"audit:{node.uuid}:{delta.episode_id}")

    async def _publish(self, subject: str, payload: bytes, msg_id: str) -> None:
        await self.broker.publish(
            payload, subject, headers={subjects.HDR_MSG_ID: msg_id, "content-type": "application/json"},
            stream=subjects.STREAM_SUMMARY,
        )

    async def _schedule_tick(
        self, group_id: str, node_uuid: str, token: str, due: datetime, kind: Literal["flush", "staleness"],
    ) -> None:
        """A server-side timer: fires the SummaryTick into the group's delta subject (in order).
        A newer schedule on the same subject replaces the older one (a deferral's flush replaces
        an armed sweep: see gate.py for why that is safe)."""
        assert self.js is not None
        fire_at = datetime.fromtimestamp(int(due.timestamp()) + 1, tz=timezone.utc)  # whole seconds
        tick = SummaryTick(group_id=group_id, node_uuid=node_uuid, token=token, scheduled_for=fire_at, kind=kind)
        await self.js.publish(
            subjects.sched_summary(group_id, node_uuid),
            tick.model_dump_json().encode(),
            headers={
                "Nats-Schedule": f"@at {fire_at.strftime('%Y-%m-%dT%H:%M:%SZ')}",
                # fires in ENGRAM_SCHED, which ENGRAM_DELTAS sources into the group's partition
                "Nats-Schedule-Target": subjects.sched_summary_fired(group_id),
                subjects.HDR_MSG_ID: f"{'tick' if kind == 'flush' else 'sweep'}:{node_uuid}:{token}",
            },
            stream=subjects.STREAM_SCHED,
        )

    async def _dead_letter(self, stored: StoredMessage, reason: str, detail: str) -> None:
        assert self.js is not None
        await dlq.dead_letter(
            self.js, stage=STAGE, reason=reason, detail=detail, subject=stored.subject, payload=stored.data,
            headers=stored.headers, source_id=f"{subjects.STREAM_DELTAS}:{stored.seq}",
        )


def build(
    settings: EngramSettings | None = None,
    llm: LLMClient | None = None,
    *,
    clock: Callable[[], datetime] = utc_now,
    gate: GateSettings | None = None,
) -> ServiceApp:
    settings = settings or EngramSettings()
    broker = make_broker(settings, service="summary-gate")
    service = SummaryGate(settings, broker, llm, clock=clock, gate=gate)
    topology = Topology.from_settings(settings)
    service.puller = subscribe_partitions_with_capacity(
        broker, subjects.STREAM_DELTAS, [topology.summary_gate_consumer()], service.handle, title="summary-gate",
        capacity=settings.summary_gate_concurrency, wake_subject=subjects.DELTA.format(group="*"), idle_max_s=0.2,
    )
    app = ServiceApp(name="summary-gate", broker=broker, on_startup=[service.start],
                     after_startup=[start_pulling(broker, service.puller)], on_shutdown=[service.stop])
    app.summary_gate = service  # type: ignore[attr-defined]
    return app

