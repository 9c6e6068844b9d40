"""Extractor replicas pull only when they have a free slot (engram.runtime.service.CapacityPuller), against
real NATS JetStream and FalkorDB: work spreads over replicas with every group's episodes in order,
a full replica leaves a partition's episode to an idle one, and stop() hands in-flight episodes
back (finished within the grace period or nacked for immediate redelivery, never left un-acked).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nats
import pytest
from prometheus_client import REGISTRY

from engram.models.rules_llm import RulesExtractorClient
from engram.runtime.service import ServiceApp
from engram.settings import EngramSettings
from engram.runtime.topology import Topology
from engram.schemas import Episode, subjects
from engram.services.extractor import app as ex_app
from engram.services.turn_detector.pairing import episode_id_for
from tests.services.turn_detector.helpers import wait_for


def partition_of(token: str, partitions: int) -> int:
    """nats-server's ``partition(n, ...)`` subject transform: FNV-1a 32 of the token, mod n."""
    h = 0x811C9DC5
    for b in token.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def group_on(partition: int, partitions: int, tag: str) -> str:
    salt = 0
    while partition_of(f"engram_session_{tag}{salt}", partitions) != partition:
        salt += 1
    return f"engram_session_{tag}{salt}"


def episode(group: str, k: int) -> Episode:
    turn = f"{group}:m{k}"
    return Episode(episode_id=episode_id_for(group, turn), group_id=group, scope="session", turn_id=turn,
                   session_id=group.removeprefix("engram_session_"), reference_time="2026-01-01T00:00:00Z",
                   content=f"user (Ada): Step {k}: Ada deployed service {group[-3:]} with Terraform.", messages=[])


async def publish(js: Any, ep: Episode) -> None:
    await js.publish(subjects.episode(ep.group_id), ep.model_dump_json().encode(),
                     headers={subjects.HDR_MSG_ID: ep.episode_id})


@dataclass
class Trace:
    """What the replicas did: who started which episode, and per-group order."""

    started: list[tuple[int, str, int]] = field(default_factory=list)  # (replica, group, k)
    running: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    finished: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    violations: list[str] = field(default_factory=list)
    gates: dict[str, asyncio.Event] = field(default_factory=dict)  # group -> opened when set

    def begin(self, replica: int, ep: Episode) -> int:
        k = int(ep.turn_id.rsplit(":m", 1)[1])
        done = self.finished[ep.group_id]
        if self.running[ep.group_id]:
            self.violations.append(f"{ep.group_id}: {k} started while {self.running[ep.group_id]} running")
        if k != len(done) and k not in done:
            self.violations.append(f"{ep.group_id}: {k} started after {done}")
        self.running[ep.group_id].add(k)
        self.started.append((replica, ep.group_id, k))
        return k

    def end(self, ep: Episode, k: int, ok: bool) -> None:
        self.running[ep.group_id].discard(k)
        if ok:
            self.finished[ep.group_id].append(k)

    def replica_of(self, group: str, k: int) -> list[int]:
        return [r for r, g, i in self.started if (g, i) == (group, k)]


def replica(settings: EngramSettings, i: int, trace: Trace, work_s: float = 0.0) -> ServiceApp:
    """An extractor whose ``_process`` is traced, takes ``work_s`` longer (a slow LLM) and, for
    gated groups, waits for the gate: while it waits it holds the replica's capacity."""
    app = ex_app.build(settings, llm=RulesExtractorClient())
    extractor = app.extractor  # type: ignore[attr-defined]
    real = extractor._process

    async def traced(ep: Episode) -> str:
        k = trace.begin(i, ep)
        ok = False
        try:
            if ep.group_id in trace.gates:
                await trace.gates[ep.group_id].wait()
            if work_s:
                await asyncio.sleep(work_s)
            out = await real(ep)
            ok = True
            return out
        finally:
            trace.end(ep, k, ok)

    extractor._process = traced
    return app


async def durables_settled(js: Any) -> dict[str, Any] | None:
    """Consumer infos of the extractor durables once nothing is pending or un-acked."""
    infos = {c.name: c for c in await js.consumers_info(subjects.STREAM_EPISODES) if c.name.startswith("extractor")}
    if infos and all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos.values()):
        return infos
    return None


def counter(name: str, **labels: str) -> float:
    """Sum of a counter's ``*_total`` samples whose labels include ``labels``."""
    return sum(s.value for m in REGISTRY.collect() if m.name == name for s in m.samples
               if s.name.endswith("_total") and labels.items() <= s.labels.items())


@pytest.fixture
async def js(clean_nats: str) -> Any:
    nc = await nats.connect(clean_nats)
    yield nc.jetstream()
    await nc.close()


def make_settings(clean_nats: str, falkordb_server: Any, tmp_path: Path, partitions: int) -> EngramSettings:
    return EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path,
                          partitions=partitions, extractor_concurrency=1)


async def test_two_replicas_share_the_work_and_keep_each_groups_order(clean_nats, falkordb_server, tmp_path, js) -> None:  # noqa: ANN001
    partitions, groups, per_group = 4, 8, 3
    settings = make_settings(clean_nats, falkordb_server, tmp_path, partitions)
    trace = Trace()
    apps = [replica(settings, i, trace, work_s=0.15) for i in range(2)]
    metrics = ("engram_faststream_received_processed_messages", {"app_name": "extractor", "handler": "engram.episode"}), \
              ("engram_extractor_episodes", {"outcome": "extracted"})
    before = [counter(name, **labels) for name, labels in metrics]
    for app in apps:
        await app.start()
    try:
        names = [group_on(g % partitions, partitions, f"sp{g}_") for g in range(groups)]  # 2 groups per partition
        for k in range(per_group):
            for name in names:
                await publish(js, episode(name, k))
        async def all_done() -> dict[str, Any] | None:
            return await durables_settled(js) if sum(map(len, trace.finished.values())) >= groups * per_group else None

        infos = await wait_for(all_done, 60)
        assert infos, f"only {sum(map(len, trace.finished.values()))} of {groups * per_group} episodes finished"
        assert trace.violations == []
        assert all(trace.finished[name] == list(range(per_group)) for name in names), dict(trace.finished)
        assert len(trace.started) == groups * per_group, "an episode was processed twice"
        assert sum(c.num_redelivered for c in infos.values()) == 0
        shares = [sum(1 for r, _, _ in trace.started if r == i) for i in range(2)]
        assert min(shares) >= groups * per_group // 4, f"work not spread over the replicas: {shares}"
        # Messages still run through FastStream's subscriber (middlewares, engram_faststream_* metrics).
        assert [counter(name, **labels) - b for (name, labels), b in zip(metrics, before, strict=True)] == \
            [groups * per_group] * 2
    finally:
        for app in apps:
            await app.stop()


async def test_a_full_replica_leaves_a_partitions_episode_to_an_idle_one(clean_nats, falkordb_server, tmp_path, js) -> None:  # noqa: ANN001
    """Replica 0 starts first: with capacity-blind pulls its fetches are first in every
    partition's queue, so it would take the next episodes while full and sit on them."""
    partitions = 4
    settings = make_settings(clean_nats, falkordb_server, tmp_path, partitions)
    trace = Trace()
    apps = [replica(settings, i, trace) for i in range(2)]
    blocker = group_on(0, partitions, "full")
    trace.gates[blocker] = asyncio.Event()
    for app in apps:
        await app.start()
    try:
        await publish(js, episode(blocker, 0))
        assert await wait_for(lambda: _true(trace.replica_of(blocker, 0)), 10), "the blocking episode never started"
        full = trace.replica_of(blocker, 0)[0]
        idle = 1 - full
        puller = apps[full].extractor.puller  # type: ignore[attr-defined]
        probes = puller.probes
        for p in range(1, partitions):
            group = group_on(p, partitions, f"free{p}_")
            await publish(js, episode(group, 0))
            assert await wait_for(lambda g=group: _true(trace.finished.get(g)), 10), \
                f"partition {p}'s episode did not finish while replica {full} was full (taken by {trace.replica_of(group, 0)})"
            assert trace.replica_of(group, 0) == [idle]
        assert puller.probes == probes, "a full replica must not even ask for messages"
        trace.gates[blocker].set()
        assert await wait_for(lambda: durables_settled(js), 20)
        assert trace.violations == []
    finally:
        for gate in trace.gates.values():
            gate.set()
        for app in apps:
            await app.stop()


async def test_stop_nacks_an_episode_still_in_flight_after_the_grace_period(clean_nats, falkordb_server, tmp_path, js) -> None:  # noqa: ANN001
    partitions = 2
    settings = make_settings(clean_nats, falkordb_server, tmp_path, partitions)
    trace = Trace()
    group = group_on(0, partitions, "stop")
    trace.gates[group] = asyncio.Event()  # replica 0 never finishes it
    first = replica(settings, 0, trace)
    first.extractor.stop_grace_s = 0.5  # type: ignore[attr-defined]
    await first.start()
    second = None
    try:
        await publish(js, episode(group, 0))
        await publish(js, episode(group, 1))
        assert await wait_for(lambda: _true(trace.replica_of(group, 0)), 10)
        started = time.monotonic()
        await first.stop()
        assert time.monotonic() - started < 5, "stop() must not wait for the episode beyond its grace period"
        assert trace.finished[group] == []
    finally:
        trace.gates[group].set()
    try:
        # ack_wait is 30 s: only a nack lets another replica have the episode within the test.
        second = replica(settings, 1, trace)
        await second.start()
        infos = await wait_for(lambda: durables_settled(js), 20)
        assert infos, "the episode left in flight by stop() was not redelivered (not nacked?)"
        info = infos[Topology.EXTRACTOR_DURABLE]
        assert info.num_redelivered <= 1
        assert trace.finished[group] == [0, 1]
        assert trace.replica_of(group, 0) == [0, 1], "episode 0: started on the stopped replica, finished on the other"
        assert trace.replica_of(group, 1) == [1]
        assert trace.violations == []
    finally:
        if second is not None:
            await second.stop()


async def test_stop_lets_an_episode_in_flight_finish_within_the_grace_period(clean_nats, falkordb_server, tmp_path, js) -> None:  # noqa: ANN001
    settings = make_settings(clean_nats, falkordb_server, tmp_path, 2)
    trace = Trace()
    group = group_on(1, 2, "grace")
    trace.gates[group] = asyncio.Event()
    app = replica(settings, 0, trace)
    app.extractor.stop_grace_s = 10  # type: ignore[attr-defined]
    await app.start()
    try:
        await publish(js, episode(group, 0))
        assert await wait_for(lambda: _true(trace.replica_of(group, 0)), 10)
        stopping = asyncio.create_task(app.stop())
        await asyncio.sleep(0.3)
        assert not stopping.done(), "stop() returned with an episode in flight"
        trace.gates[group].set()
        await asyncio.wait_for(stopping, 10)
    finally:
        trace.gates[group].set()
    infos = await durables_settled(js)
    assert infos, "the episode finished during stop() but was not acked"
    assert trace.finished[group] == [0]
    assert sum(c.num_redelivered for c in infos.values()) == 0


async def test_a_delivery_nobody_waits_for_any_more_is_still_handled(clean_nats, falkordb_server, tmp_path, js) -> None:  # noqa: ANN001
    """The answer to a pull request the puller gave up on (reply timeout, reconnect) holds its
    partition's ack slot: it must be processed, not dropped until ack_wait."""
    partitions = 2
    settings = make_settings(clean_nats, falkordb_server, tmp_path, partitions)
    trace = Trace()
    blocker, late = group_on(0, partitions, "lateblock"), group_on(1, partitions, "late")
    trace.gates[blocker] = asyncio.Event()
    app = replica(settings, 0, trace)
    await app.start()
    nc = await nats.connect(clean_nats)
    try:
        puller = app.extractor.puller  # type: ignore[attr-defined]
        await publish(js, episode(blocker, 0))  # the replica is full now: it sends no pull request
        assert await wait_for(lambda: _true(trace.replica_of(blocker, 0)), 10)
        # A pull request answered on the replica's inbox that the puller does not wait for: the
        # only request on the shared durable, so the server hands the next episode to it.
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{subjects.STREAM_EPISODES}.{Topology.EXTRACTOR_DURABLE}",
                         json.dumps({"batch": 1, "expires": 10_000_000_000}).encode(), reply=f"{puller._inbox}.0.late")
        await nc.flush()
        await publish(js, episode(late, 0))
        assert await wait_for(lambda: _true(puller.unsolicited), 10), "the late delivery never reached the replica"
        trace.gates[blocker].set()  # the late episode waited for the replica's capacity (extractor_concurrency=1)
        assert await wait_for(lambda: durables_settled(js) if trace.finished.get(late) else _true(False), 20)
        assert trace.finished[late] == [0] and trace.finished[blocker] == [0]
        assert puller.unsolicited == 1
    finally:
        trace.gates[blocker].set()
        await nc.close()
        await app.stop()


async def _true(value: Any) -> bool:
    return bool(value)
