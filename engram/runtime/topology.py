"""JetStream streams, durable consumers and KV buckets engram needs, declared idempotently.

Every service calls :func:`ensure_topology` at start-up (and `engram up` once before starting
them), so a fresh external NATS works without a separate migration step. Existing streams and
consumers are *updated* to the declared config: NATS silently keeps an old consumer config
otherwise.

Partitioning: the input stream rewrites ``engram.in.<kind>.<session>`` on arrival to
``engram.in.<p>.<kind>.<session>`` with ``p = partition(N, session)`` (a stream subject
transform, no server config needed). One durable per partition, ``max_ack_pending=1``: the
messages of one session are handled strictly in order, sessions in different partitions run in
parallel, and any number of replicas can pull from the same durables. Changing N re-hashes
sessions: drain the input stream first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
from dataclasses import dataclass
from typing import Any, ClassVar

import nats.js.errors
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
    StreamSource,
    SubjectTransform,
)

from engram.runtime import group_order, stream_migration
from engram.settings import EngramSettings
from engram.schemas import subjects

log = logging.getLogger(__name__)

DAY = 24 * 3600.0
SESSION_STATE_HISTORY = 64
MSG_TTL_BUCKETS = {subjects.KV_GATEWAY_REQUESTS}


def _kv_stream_config(cfg: KeyValueConfig) -> StreamConfig:
    """The stream nats-py would create for ``cfg``, except that messages may be deleted: engram
    erases superseded and deleted session checkpoints byte by byte (STREAM.MSG.DELETE overwrites
    the stored message), which a standard KV bucket (deny_delete) refuses."""
    return StreamConfig(
        name=f"KV_{cfg.bucket}",
        description=cfg.description,
        subjects=[f"$KV.{cfg.bucket}.>"],
        # direct gets may be answered by a follower (stale); a bucket whose CAS decisions need
        # the latest value says direct=False (the group order's leases)
        allow_direct=cfg.direct is not False,
        allow_rollup_hdrs=True,
        deny_delete=False,
        deny_purge=False,
        discard=DiscardPolicy.NEW,
        duplicate_window=120.0,
        max_age=cfg.ttl,
        max_bytes=cfg.max_bytes,  # discard NEW: a full bucket refuses writes (the writer retries)
        max_msgs_per_subject=cfg.history,
        num_replicas=cfg.replicas,
        storage=cfg.storage,
        # per-message TTLs (Nats-TTL, nats-server 2.11+): the gateway's retry-window records
        allow_msg_ttl=True if cfg.bucket in MSG_TTL_BUCKETS else None,
    )


@dataclass(frozen=True)
class Topology:
    partitions: int
    duplicate_window_s: float
    ack_wait_s: float
    # Work streams (input, episodes, deltas, sessions) and dead letters have no max age: an
    # unprocessed message must never expire silently. Processed messages leave by the sweep of
    # engram/runtime/stream_retention.py after ENGRAM_PROCESSED_RETENTION_S; every stream is bounded by
    # max_bytes, and a full work stream refuses publishes (discard NEW) rather than drop anything.
    max_bytes: int = 2 * 1024**3
    # Schedules fire at most ENGRAM_SUMMARY_STALENESS_SLA_S ahead (far below this): the age bound
    # only removes fired ticks, which ENGRAM_IN and ENGRAM_DELTAS have already sourced.
    schedule_max_age_s: float = 30 * DAY
    summary_max_age_s: float = 7 * DAY
    session_state_ttl_s: float = 30 * DAY
    # False under a least-privilege NATS user (ENGRAM_NATS_TOPOLOGY_ON_START=false, engram/runtime/auth.py):
    # such a service may not create streams, so ensure_topology leaves that to the admin.
    manage: bool = True
    # Replicas of every stream and KV bucket (ENGRAM_STREAM_REPLICAS). Consumers are created
    # without num_replicas, so they inherit the stream's and follow it when it is scaled.
    replicas: int = 1

    @classmethod
    def from_settings(cls, settings: EngramSettings) -> "Topology":
        return cls(
            partitions=settings.partitions,
            duplicate_window_s=settings.duplicate_window_s,
            ack_wait_s=settings.ack_wait_s,
            manage=settings.nats_topology_on_start,
            replicas=settings.stream_replicas,
            max_bytes=settings.stream_max_bytes,
        )

    # --- streams ---------------------------------------------------------------------------
    def input_stream(self) -> StreamConfig:
        return StreamConfig(
            name=subjects.STREAM_IN,
            description="Chat messages and session events, partitioned by session.",
            subjects=["engram.in.*.*"],
            subject_transform=SubjectTransform(
                src="engram.in.*.*",
                dest=f"engram.in.{{{{partition({self.partitions},2)}}}}.{{{{wildcard(1)}}}}.{{{{wildcard(2)}}}}",
            ),
            # The idle ticks fired in ENGRAM_SCHED, into the session's partition (the same
            # partition function over the same session token as the transform above).
            sources=[self._fired_into(
                "engram.sched.fired.idle.*",
                f"engram.in.{{{{partition({self.partitions},1)}}}}.idle.{{{{wildcard(1)}}}}",
            )],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            **self._bounded(),
            duplicate_window=self.duplicate_window_s,
            num_replicas=self.replicas,
            # No message schedules here: nats-server forces allow_rollup_hdrs on with them, and
            # then any publisher's "Nats-Rollup: all" purges the stream. Without them the server
            # refuses both rollup and schedule headers ("rollup not permitted").
            allow_rollup_hdrs=False,
        )

    def _bounded(self) -> dict[str, Any]:
        """A work stream's limits: no age (nothing unprocessed expires), a size bound that refuses
        new messages when reached (publishers get an error; nothing stored is dropped)."""
        return {"max_age": 0, "max_bytes": self.max_bytes, "discard": DiscardPolicy.NEW}

    @staticmethod
    def _fired_into(src: str, dest: str) -> StreamSource:
        return StreamSource(name=subjects.STREAM_SCHED, subject_transforms=[SubjectTransform(src=src, dest=dest)])

    def schedule_stream(self) -> StreamConfig:
        return StreamConfig(
            name=subjects.STREAM_SCHED,
            description="Idle schedules of sessions and summary-refresh schedules of entities, and the ticks they "
            "fire, which ENGRAM_IN and ENGRAM_DELTAS source. Written only by the turn-detector and the summary-gate.",
            subjects=["engram.sched.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            # a staleness sweep is scheduled up to ENGRAM_SUMMARY_STALENESS_SLA_S ahead
            max_age=self.schedule_max_age_s,
            max_bytes=self.max_bytes,
            # nats-server refuses discard NEW with message schedules (10052). It holds one pending
            # schedule per session and entity (rolled up) and fired ticks: when full its oldest go,
            # fired ticks long sourced; EngramStreamNearlyFull fires at 80% first.
            discard=DiscardPolicy.OLD,
            duplicate_window=self.duplicate_window_s,
            num_replicas=self.replicas,
            allow_msg_schedules=True,
        )

    def _group_partitioned(self, kind: str) -> SubjectTransform:
        # engram.<kind>.<group> is stored as engram.<kind>.<p>.<group>: per-group order with one
        # durable per partition, as for the input stream.
        return SubjectTransform(
            src=f"engram.{kind}.*",
            dest=f"engram.{kind}.{{{{partition({self.partitions},1)}}}}.{{{{wildcard(1)}}}}",
        )

    def episode_stream(self) -> StreamConfig:
        return StreamConfig(
            name=subjects.STREAM_EPISODES,
            description="Completed turns per scope group, partitioned by group.",
            subjects=["engram.episode.*"],
            subject_transform=self._group_partitioned("episode"),
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            **self._bounded(),
            duplicate_window=self.duplicate_window_s,
            num_replicas=self.replicas,
        )

    def delta_stream(self) -> StreamConfig:
        return StreamConfig(
            name=subjects.STREAM_DELTAS,
            description="NodeDeltas per group (what each episode changed on each entity), partitioned by group; "
            "also the summary-gate's deferred-refresh ticks, sourced from ENGRAM_SCHED into the group's partition.",
            subjects=["engram.delta.*"],
            subject_transform=self._group_partitioned("delta"),
            sources=[self._fired_into(
                "engram.sched.fired.summary.*",
                f"engram.delta.{{{{partition({self.partitions},1)}}}}.{{{{wildcard(1)}}}}",
            )],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            **self._bounded(),
            duplicate_window=self.duplicate_window_s,
            num_replicas=self.replicas,
            allow_rollup_hdrs=False,  # see input_stream
        )

    def summary_stream(self) -> StreamConfig:
        return StreamConfig(
            name=subjects.STREAM_SUMMARY,
            description="Summary-gate decisions (SummaryEvent) and sampled skips for audit (SummaryAudit).",
            subjects=["engram.summary.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            max_age=self.summary_max_age_s,
            max_bytes=self.max_bytes,
            discard=DiscardPolicy.OLD,  # an audit trail of decisions already made: its oldest may go
            duplicate_window=self.duplicate_window_s,
            num_replicas=self.replicas,
        )

    def sessions_stream(self) -> StreamConfig:
        return StreamConfig(
            name=subjects.STREAM_SESSIONS,
            description="Closed session segments (SessionSegmentClosed) for the session close stage (seed 004).",
            subjects=["engram.session.closed.*"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            **self._bounded(),
            duplicate_window=self.duplicate_window_s,
            num_replicas=self.replicas,
        )

    def dlq_stream(self) -> StreamConfig:
        return StreamConfig(
            name=subjects.STREAM_DLQ,
            description="Dead letters of every stage, with the reason in headers.",
            subjects=["engram.dlq.*"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            **self._bounded(),  # a dead letter stays until replayed or discarded (engram dlq)
            duplicate_window=self.duplicate_window_s,
            num_replicas=self.replicas,
        )

    def streams(self) -> list[StreamConfig]:
        # ENGRAM_SCHED first: the input and delta streams source it
        return [self.schedule_stream(), self.input_stream(), self.episode_stream(), self.delta_stream(), self.summary_stream(),
                self.sessions_stream(), self.dlq_stream()]

    # --- consumers -------------------------------------------------------------------------
    @staticmethod
    def turn_detector_durable(partition: int) -> str:
        return f"turn_detector_p{partition}"

    @staticmethod
    def turn_detector_filter(partition: int) -> str:
        return f"engram.in.{partition}.>"

    @staticmethod
    def _one_at_a_time(durable: str, filter_subject: str, description: str, ack_wait: float) -> ConsumerConfig:
        """A partition durable: one message in flight (max_ack_pending=1), so a partition's
        messages are handled in order, also across replicas and retries. Dead-lettering is done by
        the handler (it sees num_delivered): the server must never drop a message after max_deliver."""
        return ConsumerConfig(
            durable_name=durable,
            description=description,
            filter_subject=filter_subject,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=ack_wait,
            max_ack_pending=1,
            max_deliver=-1,
        )

    def turn_detector_consumer(self, partition: int) -> ConsumerConfig:
        # per-session order
        return self._one_at_a_time(self.turn_detector_durable(partition), self.turn_detector_filter(partition),
                                   f"turn-detector, input partition {partition}", self.ack_wait_s)

    EXTRACTOR_DURABLE = "extractor"
    EXTRACTOR_FILTER = "engram.episode.*.*"
    LEGACY_EXTRACTOR_DURABLE = re.compile(r"extractor_p\d+")
    """The per-partition durables of engram before per-group order (migrated once, at start-up)."""
    SHARED_MAX_ACK_PENDING = 10_000
    """A shared durable's unacknowledged deliveries: one trigger per running group chain, plus
    the ones waiting for a lapsing lease or a retry; far above any deployment's slots."""

    def extractor_consumer(self) -> ConsumerConfig:
        """One durable for every replica and group: graphiti needs a group's episodes in order,
        and engram/runtime/group_order.py keeps it per group (a lease and a done-sequence per group), so
        the deployment's in-flight extractions are bounded by the replicas' slots, not by
        partitions. LLM calls are slow: the chain reports progress while it works."""
        return self._shared(self.EXTRACTOR_DURABLE, self.EXTRACTOR_FILTER, "extractor")

    def _shared(self, durable: str, filter_subject: str, stage: str) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=durable,
            description=f"{stage}: doorbell of the per-group chains (engram/runtime/group_order.py)",
            filter_subject=filter_subject,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_ack_pending=self.SHARED_MAX_ACK_PENDING,
            max_deliver=-1,
        )

    SUMMARY_GATE_DURABLE = "summary_gate"
    SUMMARY_GATE_FILTER = "engram.delta.*.*"
    LEGACY_SUMMARY_GATE_DURABLE = re.compile(r"summary_gate_p\d+")

    GROUP_ORDERED: ClassVar[dict[str, tuple[str, re.Pattern[str]]]] = {
        EXTRACTOR_DURABLE: ("extractor", LEGACY_EXTRACTOR_DURABLE),
        SUMMARY_GATE_DURABLE: ("summary_gate", LEGACY_SUMMARY_GATE_DURABLE),
    }
    """The shared durables kept in per-group order (engram/runtime/group_order.py): their stage (the
    record keys' prefix) and the per-partition durables of an older engram they replace."""

    def summary_gate_consumer(self) -> ConsumerConfig:
        """As the extractor's: a node's gate state must see its group's deltas and ticks in
        order (engram/runtime/group_order.py keeps it per group); a refresh is an LLM call."""
        return self._shared(self.SUMMARY_GATE_DURABLE, self.SUMMARY_GATE_FILTER, "summary-gate")

    SESSIONS_DURABLE = "sessions"

    def sessions_consumer(self) -> ConsumerConfig:
        """The session close stage: segments close independently (a segment's idempotency is the
        stored record's lease, see services/sessions); two LLM calls per close. Replicas pull only
        into free slots (ENGRAM_SESSIONS_CONCURRENCY each), so closes in flight are the replicas'
        slots; max_ack_pending is never the bound."""
        return ConsumerConfig(
            durable_name=self.SESSIONS_DURABLE,
            description="sessions: close stage of session segments",
            filter_subject="engram.session.closed.*",
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_ack_pending=self.SHARED_MAX_ACK_PENDING,
            max_deliver=-1,
        )

    def consumers(self) -> list[tuple[str, ConsumerConfig]]:
        return [
            *((subjects.STREAM_IN, self.turn_detector_consumer(p)) for p in range(self.partitions)),
            (subjects.STREAM_EPISODES, self.extractor_consumer()),
            (subjects.STREAM_DELTAS, self.summary_gate_consumer()),
            (subjects.STREAM_SESSIONS, self.sessions_consumer()),
        ]

    # --- key-value -------------------------------------------------------------------------
    def kv_buckets(self) -> list[KeyValueConfig]:
        """Every bucket bounded when made (an existing bucket keeps its bound): by its own bound,
        else by ``max_bytes``."""
        return [cfg if cfg.max_bytes and cfg.max_bytes > 0 else dataclasses.replace(cfg, max_bytes=self.max_bytes)
                for cfg in self._kv_buckets()]

    def _kv_buckets(self) -> list[KeyValueConfig]:
        return [
            KeyValueConfig(
                bucket=subjects.KV_TURN_SESSIONS,
                description="turn-detector session state: open turn, last sequence, recent ids.",
                # Superseded checkpoints stay (up to 64) until the turn-detector erases them
                # (services/turn_detector/retention.py): a KV replacement at history 1 removes
                # the old value without overwriting its bytes on disk.
                history=SESSION_STATE_HISTORY,
                ttl=self.session_state_ttl_s,
                storage=StorageType.FILE,
                replicas=self.replicas,
            ),
            KeyValueConfig(
                bucket=subjects.KV_GATEWAY_REQUESTS,
                description="gateway/MCP: recent request hashes and Idempotency-Key fingerprints "
                "(services/gateway/idempotency.py).",
                history=1,
                ttl=DAY,  # an Idempotency-Key's record; retry-window records carry their own TTL
                storage=StorageType.FILE,
                replicas=self.replicas,
            ),
            KeyValueConfig(
                bucket=subjects.KV_SESSION_EPOCHS,
                description="session -> epoch of its last erasure by a delete (engram/runtime/epochs.py).",
                history=1,
                ttl=max(DAY, 4 * self.duplicate_window_s),
                storage=StorageType.FILE,
                replicas=self.replicas,
            ),
            KeyValueConfig(
                bucket=subjects.KV_LLM_LIMITS,
                description="LLM rate limit shared by every replica: requests/tokens budget and 429 pause per "
                "(server, model) (engram/models/rate_limit.py).",
                history=1,
                ttl=DAY,  # a budget untouched for a day is a fresh budget anyway
                # in memory: seconds of budget, rewritten on every LLM request; lost on a server
                # restart it costs one burst, while FILE would fsync each write (sync_interval: always)
                storage=StorageType.MEMORY,
                max_bytes=1024 * 1024,  # one small key per (server, model); memory is the server's to spare
                replicas=self.replicas,
            ),
            KeyValueConfig(
                bucket=subjects.KV_GROUP_ORDER,
                description="per-group order of the extractor and summary-gate: last sequence done, attempts, lease "
                "(engram/runtime/group_order.py).",
                history=1,
                storage=StorageType.FILE,  # a lost record would run a group's processed messages again
                direct=False,  # leases are decided on the latest record, never a follower's copy
                replicas=self.replicas,
            ),
        ]


async def ensure_topology(js: JetStreamContext, topology: Topology, *, migrate: bool = False) -> None:
    """Create or update every stream, consumer and KV bucket (safe to call concurrently).

    A changed replica count (ENGRAM_STREAM_REPLICAS) is applied to existing streams and KV
    buckets with STREAM.UPDATE: NATS (2.10+, clustered) scales a stream in place, moving its data
    to the new peer set, and consumers that inherit the stream's replicas follow it.

    ``migrate``: re-create the ENGRAM_IN and ENGRAM_DELTAS of an older engram, which still allow
    message schedules (engram/runtime/stream_migration.py). Only the admin step does it (`engram up`
    before it starts the services, `engram topology`): services starting side by side must not
    delete a stream under each other, so for them such a stream is a LegacyStreamError."""
    if not topology.manage:  # the admin (engram up, `engram topology`) declares it
        return
    first_seqs: dict[str, int] = {}
    legacy = await stream_migration.legacy_streams(js)
    if legacy and not migrate:
        raise stream_migration.LegacyStreamError(
            f"{', '.join(cfg.name or '' for _, cfg in legacy)} made by an older engram still allow message schedules "
            "(and so rollup headers: any publisher could purge them); run `engram topology` (or `engram up`) once to "
            "re-create them")
    if legacy:
        first_seqs = await stream_migration.migrate(js, legacy, topology.schedule_stream())
    await _ensure_kv(js, topology)
    for cfg in topology.streams():
        try:
            info = await js.stream_info(cfg.name or "")
            existing, held = info.config, info.state.bytes
        except nats.js.errors.NotFoundError:
            existing, held = None, 0
        if existing is None:
            if cfg.name == subjects.STREAM_IN:
                cfg.first_seq = await stream_migration.first_sequence(js, first_seqs.get(cfg.name, 0))
            elif cfg.name in first_seqs:
                cfg.first_seq = first_seqs[cfg.name]
        else:
            cfg.first_seq = existing.first_seq  # a creation-time setting: kept as it was
            if cfg.max_bytes and cfg.max_bytes > 0 and held > cfg.max_bytes:
                # with a bound below what it holds, the stream would refuse every new message at once
                log.warning("stream %s holds %d bytes, more than ENGRAM_STREAM_MAX_BYTES=%d: its bound stays %s "
                            "until it holds less", cfg.name, held, cfg.max_bytes, existing.max_bytes)
                cfg.max_bytes = existing.max_bytes
        try:
            await _stream_call(js.add_stream, cfg)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != 10058:  # stream name already in use with a different configuration
                raise
            await _stream_call(js.update_stream, cfg)
    for stream, ccfg in topology.consumers():
        legacy: list[str] = []
        if ccfg.durable_name in Topology.GROUP_ORDERED:
            legacy = await _shared_durable_start(js, stream, ccfg, *Topology.GROUP_ORDERED[ccfg.durable_name])
        # CONSUMER.CREATE with an existing durable updates it (compatible fields), so a changed
        # ack_wait or max_ack_pending takes effect on restart instead of being ignored.
        await js.add_consumer(stream, ccfg)
        for durable in legacy:
            try:
                await js.delete_consumer(stream, durable)
            except nats.js.errors.NotFoundError:
                pass


async def _shared_durable_start(js: JetStreamContext, stream: str, ccfg: ConsumerConfig, stage: str,
                                legacy: re.Pattern[str]) -> list[str]:
    """Where a stage's shared durable starts, set on ``ccfg``: as it was when it exists (a
    creation-time setting), else after the partition durables of an older engram, whose ack
    floors are left for the per-group records (engram/runtime/group_order.py). Returns the old durables,
    deleted by the caller once the shared one exists."""
    try:
        info = await js.consumer_info(stream, ccfg.durable_name or "")
        ccfg.deliver_policy, ccfg.opt_start_seq = info.config.deliver_policy, info.config.opt_start_seq
        return []
    except nats.js.errors.NotFoundError:
        pass
    old = [c for c in await js.consumers_info(stream) if legacy.fullmatch(c.name or "")]
    start = await group_order.record_partition_floors(js, stage=stage, old=old)
    if start is not None:
        ccfg.deliver_policy, ccfg.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, start
    return [c.name for c in old]


async def _ensure_kv(js: JetStreamContext, topology: Topology) -> None:
    for cfg in topology.kv_buckets():
        try:
            await js.key_value(cfg.bucket)
        except nats.js.errors.BucketNotFoundError:
            try:
                await _stream_call(js.add_stream, _kv_stream_config(cfg))
            except nats.js.errors.BadRequestError as exc:
                if exc.err_code != 10058:  # created concurrently by another service
                    raise
            continue
        info = await js.stream_info(f"KV_{cfg.bucket}")
        if info.config.num_replicas != cfg.replicas:
            # Only the replica count is changed: the rest of an existing bucket's config stays
            # as it is (deny_delete of an old bucket cannot be lifted, see below).
            log.info("KV bucket %s: replicas %s -> %s", cfg.bucket, info.config.num_replicas, cfg.replicas)
            info.config.num_replicas = cfg.replicas
            await _stream_call(js.update_stream, info.config)
        if info.config.deny_delete:
            # A bucket made before engram erased checkpoints: NATS cannot lift deny_delete on an
            # existing stream. It works, but superseded values are not erased from disk.
            log.warning("KV bucket %s refuses deletes (made by an older engram): recreate it to erase old "
                        "session checkpoints from disk", cfg.bucket)


# Replica counts the server cannot place: "replicas > 1 not supported in non-clustered mode",
# "insufficient resources", "no suitable peers for placement".
_REPLICA_ERRORS = {10074, 10023, 10005}


# "error creating store for stream": the server could not set up the stream's files, as when a
# stream of the same name was deleted a moment ago and its directory is still being removed.
_STORE_BUSY = 10049
STORE_BUSY_RETRIES = (0.1, 0.25, 0.5, 1.0, 2.0)


async def _stream_call(call: Any, cfg: StreamConfig) -> Any:
    """STREAM.CREATE/UPDATE, with the cause spelled out when the replica count does not fit the
    server: a single nats-server takes only 1, a cluster at most its (JetStream) node count.
    A transient store error (``_STORE_BUSY``) is retried a few times before it is raised."""
    for delay in (*STORE_BUSY_RETRIES, None):
        try:
            return await call(cfg)
        except nats.js.errors.APIError as exc:
            if exc.err_code == _STORE_BUSY and delay is not None:
                log.info("stream %s: the server's store is not ready (%s); retrying in %.2fs",
                         cfg.name, exc.description, delay)
                await asyncio.sleep(delay)
                continue
            if exc.err_code in _REPLICA_ERRORS and (cfg.num_replicas or 1) > 1:
                raise RuntimeError(
                    f"stream {cfg.name}: NATS cannot place {cfg.num_replicas} replicas ({exc.description}); "
                    "ENGRAM_STREAM_REPLICAS must be 1 for a single nats-server and at most the cluster's node count"
                ) from exc
            raise
    raise AssertionError("unreachable: the last attempt returns or raises")
