"""Per-group order over one shared durable (engram/runtime/group_order.py), against real NATS JetStream:
in flight = the replicas' slots whatever the partitions, a group's messages strictly in order and
never two at once, a hung group holds only its own slot, failures retry in order and end in the
dead-letter queue, a dead replica's group is resumed after its lease, and the partition durables
of an older engram migrate without running processed messages again."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from typing import Any

import nats
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from engram.runtime.group_order import GroupOrder, StoredMessage, floor_key
from engram.runtime.service import CapacityPuller, failure_decision
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import subjects
from tests.services.turn_detector.helpers import wait_for

log = logging.getLogger(__name__)


class Work:
    """What the replicas did: per group the indices started and finished, concurrency seen."""

    def __init__(self) -> None:
        self.started: dict[str, list[int]] = defaultdict(list)
        self.finished: dict[str, list[int]] = defaultdict(list)
        self.running: dict[str, int] = defaultdict(int)
        self.in_flight = 0
        self.max_in_flight = 0
        self.violations: list[str] = []
        self.gates: dict[tuple[str, int], asyncio.Event] = {}
        self.failures: dict[tuple[str, int], int] = {}  # (group, index) -> failures left
        self.dead: list[tuple[str, int, str]] = []
        self.delay_s = 0.0

    async def process(self, message: StoredMessage) -> None:
        group, index = message.subject.rsplit(".", 1)[-1], int(message.data)
        if self.running[group]:
            self.violations.append(f"{group}: {index} started while another ran")
        if self.finished[group] and index <= self.finished[group][-1]:
            self.violations.append(f"{group}: {index} after {self.finished[group][-1]}")
        self.running[group] += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.started[group].append(index)
        try:
            if (group, index) in self.gates:
                await self.gates[(group, index)].wait()
            await asyncio.sleep(self.delay_s)
            if self.failures.get((group, index), 0) > 0:
                self.failures[(group, index)] -= 1
                raise RuntimeError("boom")
            self.finished[group].append(index)
        finally:
            self.running[group] -= 1
            self.in_flight -= 1

    async def dead_letter(self, message: StoredMessage, reason: str, detail: str) -> None:
        self.dead.append((message.subject.rsplit(".", 1)[-1], int(message.data), reason))


class Replica:
    def __init__(self, work: Work, slots: int, lease_s: float, max_attempts: int = 3, patience_s: float = 30.0) -> None:
        self.order = GroupOrder(
            stage="extractor", stream=subjects.STREAM_EPISODES, group_filter=lambda g: f"engram.episode.*.{g}",
            process=work.process, dead_letter=work.dead_letter, lease_s=lease_s,
            patience_default_s=patience_s, patience_min_s=patience_s,
            decide=lambda exc, attempt: failure_decision(exc, attempt, max_deliveries=max_attempts, logger=log,
                                                         base_delay_s=0.2),
        )
        self.puller = CapacityPuller(subjects.STREAM_EPISODES, [Topology.EXTRACTOR_DURABLE],
                                     lambda _p, msg: self.order.deliver(msg), capacity=slots,
                                     wake_subject=subjects.EPISODE.format(group="*"), idle_max_s=0.1)
        self.nc: Any = None

    async def start(self, url: str) -> Replica:
        self.nc = await nats.connect(url)
        await self.order.start(self.nc.jetstream())
        await self.puller.start(self.nc)
        return self

    async def stop(self) -> None:
        await self.puller.stop(grace_s=1.0)
        await self.nc.close()


async def _topology(url: str, partitions: int, ack_wait_s: float) -> Any:
    nc = await nats.connect(url)
    js = nc.jetstream()
    await ensure_topology(js, Topology.from_settings(EngramSettings(partitions=partitions, ack_wait_s=ack_wait_s)))
    return nc, js


async def _publish(js: Any, group: str, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        await js.publish(subjects.episode(group), str(i).encode(), stream=subjects.STREAM_EPISODES)


async def _settled(js: Any) -> bool:
    info = await js.consumer_info(subjects.STREAM_EPISODES, Topology.EXTRACTOR_DURABLE)
    return info.num_pending == 0 and info.num_ack_pending == 0


async def test_in_flight_is_the_replicas_slots_not_the_partitions(clean_nats: str) -> None:
    nc, js = await _topology(clean_nats, partitions=2, ack_wait_s=5)
    work = Work()
    work.delay_s = 0.4
    replicas = [await Replica(work, slots=4, lease_s=5).start(clean_nats) for _ in range(2)]
    try:
        groups = [f"g{i}" for i in range(12)]
        for g in groups:
            await _publish(js, g, 3)
        assert await wait_for(lambda: _all_done(work, groups, 3), 30), dict(work.finished)
        # 2 partitions used to mean 2 in flight; 2 replicas x 4 slots run 8 groups at once
        assert work.max_in_flight == 8
        assert work.violations == []
        assert all(work.started[g] == [0, 1, 2] for g in groups), "a message ran twice"
        assert await wait_for(lambda: _settled(js), 10)
    finally:
        for r in replicas:
            await r.stop()
        await nc.close()


async def test_a_hung_group_holds_only_its_own_slot(clean_nats: str) -> None:
    nc, js = await _topology(clean_nats, partitions=1, ack_wait_s=5)  # every group on one partition
    work = Work()
    work.gates[("hung", 0)] = asyncio.Event()
    replica = await Replica(work, slots=2, lease_s=5).start(clean_nats)
    try:
        await _publish(js, "hung", 3)
        others = [f"o{i}" for i in range(6)]
        for g in others:
            await _publish(js, g, 2)
        assert await wait_for(lambda: _all_done(work, others, 2), 20), dict(work.finished)
        assert work.started["hung"] == [0], "the hung group's later messages must wait for its first"
        work.gates[("hung", 0)].set()
        assert await wait_for(lambda: _all_done(work, ["hung"], 3), 20)
        assert work.finished["hung"] == [0, 1, 2]
        assert work.violations == []
    finally:
        for gate in work.gates.values():
            gate.set()
        await replica.stop()
        await nc.close()


async def test_a_stalled_group_hands_its_slot_to_the_others(clean_nats: str) -> None:
    """One slot, one group hung in its first message: past the patience its chain lends the slot,
    the other groups run in it, and the hung group keeps its order when it comes back."""
    nc, js = await _topology(clean_nats, partitions=2, ack_wait_s=5)
    work = Work()
    work.gates[("hung", 0)] = asyncio.Event()
    replica = await Replica(work, slots=1, lease_s=5, patience_s=0.3).start(clean_nats)
    try:
        await _publish(js, "hung", 3)
        assert await wait_for(lambda: _true(work.started["hung"] == [0]), 10)
        others = [f"o{i}" for i in range(4)]
        for g in others:
            await _publish(js, g, 2)
        assert await wait_for(lambda: _all_done(work, others, 2), 20), dict(work.finished)
        assert work.started["hung"] == [0], "the hung group's later messages must wait for its first"
        assert replica.puller.lent == 1 and work.max_in_flight == 2  # lent once: hung + one other
        work.gates[("hung", 0)].set()
        assert await wait_for(lambda: _all_done(work, ["hung"], 3), 20)
        assert work.finished["hung"] == [0, 1, 2] and work.violations == []
        assert await wait_for(lambda: _settled(js), 10)
        assert replica.puller._free == 1 and replica.puller._lent == 0  # the slot came back once
    finally:
        for gate in work.gates.values():
            gate.set()
        await replica.stop()
        await nc.close()


async def test_stalled_work_borrows_at_most_the_slots_count(clean_nats: str) -> None:
    """Every group hung (a provider outage): one slot lent, then no more; in flight stays at 2x."""
    nc, js = await _topology(clean_nats, partitions=2, ack_wait_s=5)
    work = Work()
    groups = [f"h{i}" for i in range(4)]
    for g in groups:
        work.gates[(g, 0)] = asyncio.Event()
    replica = await Replica(work, slots=1, lease_s=5, patience_s=0.2).start(clean_nats)
    try:
        for g in groups:
            await _publish(js, g, 1)
        assert await wait_for(lambda: _true(work.in_flight == 2), 10)
        await asyncio.sleep(1.0)  # well past two patiences: nothing else may start
        assert work.in_flight == 2 and replica.puller.lent == 1
        for gate in work.gates.values():
            gate.set()
        assert await wait_for(lambda: _all_done(work, groups, 1), 20)
        assert work.max_in_flight == 2 and work.violations == []
    finally:
        for gate in work.gates.values():
            gate.set()
        await replica.stop()
        await nc.close()


async def test_failures_retry_in_order_then_dead_letter_and_the_group_goes_on(clean_nats: str) -> None:
    nc, js = await _topology(clean_nats, partitions=2, ack_wait_s=5)
    work = Work()
    work.failures[("flaky", 0)] = 2  # fails twice, then works (attempt 3 of 3)
    work.failures[("poison", 0)] = 99
    replicas = [await Replica(work, slots=2, lease_s=5).start(clean_nats) for _ in range(2)]
    try:
        await _publish(js, "flaky", 2)
        await _publish(js, "poison", 2)
        assert await wait_for(lambda: _true(len(work.finished["flaky"]) == 2 and work.finished["poison"] == [1]), 30), (
            dict(work.started), work.dead)
        assert work.started["flaky"] == [0, 0, 0, 1], "retries of the head come before the next message"
        assert work.started["poison"] == [0, 0, 0, 1]
        assert work.dead == [("poison", 0, "processing_failed")]
        assert work.violations == []
        assert await wait_for(lambda: _settled(js), 10)
    finally:
        for r in replicas:
            await r.stop()
        await nc.close()


async def test_a_dead_replicas_group_is_resumed_after_its_lease(clean_nats: str) -> None:
    nc, js = await _topology(clean_nats, partitions=1, ack_wait_s=1.5)
    work = Work()
    work.gates[("g", 1)] = asyncio.Event()  # the first replica hangs on message 1, then dies
    first = await Replica(work, slots=1, lease_s=1.5).start(clean_nats)
    second = None
    try:
        await _publish(js, "g", 3)
        assert await wait_for(lambda: _true(work.started["g"] == [0, 1]), 10)
        await first.nc.close()  # no ack, no lease renewal, no release: a kill as NATS sees it
        second = await Replica(work, slots=1, lease_s=1.5).start(clean_nats)
        del work.gates[("g", 1)]
        work.running["g"] = 0  # the dead replica's task never ends; the group is free in NATS
        started = time.monotonic()
        assert await wait_for(lambda: _true(work.finished["g"] == [0, 1, 2]), 20), dict(work.started)
        assert time.monotonic() - started < 10
        assert work.started["g"] == [0, 1, 1, 2], "resumed at the message the dead replica held"
    finally:
        if second is not None:
            await second.stop()
        first.puller._stopping = True  # its connection is closed; nothing left to hand back
        for task in list(first.puller._tasks):
            task.cancel()
        await nc.close()


async def test_partition_durables_of_an_older_engram_migrate_without_rerunning_work(clean_nats: str) -> None:
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    topology = Topology.from_settings(EngramSettings(partitions=2, ack_wait_s=5))
    await ensure_topology(js, topology)
    await js.delete_consumer(subjects.STREAM_EPISODES, Topology.EXTRACTOR_DURABLE)
    for p in range(2):  # the durables engram made before the group order
        await js.add_consumer(subjects.STREAM_EPISODES, ConsumerConfig(
            durable_name=f"extractor_p{p}", filter_subject=f"engram.episode.{p}.*", deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.EXPLICIT, max_ack_pending=1, max_deliver=-1))
    groups = ["a", "b", "c", "d"]
    for g in groups:
        await _publish(js, g, 2)
    # the old extractor processed the first message of each partition (and only that)
    processed: list[str] = []
    for p in range(2):
        sub = await js.pull_subscribe_bind(f"extractor_p{p}", stream=subjects.STREAM_EPISODES)
        [msg] = await sub.fetch(1, timeout=2)
        processed.append(f"{msg.subject.rsplit('.', 1)[-1]}:{int(msg.data)}")
        await msg.ack_sync()
        await sub.unsubscribe()
    await ensure_topology(js, topology)  # the upgrade
    names = {c.name for c in await js.consumers_info(subjects.STREAM_EPISODES)}
    assert names == {Topology.EXTRACTOR_DURABLE}
    kv = await js.key_value(subjects.KV_GROUP_ORDER)
    assert {int((await kv.get(floor_key("extractor", str(p)))).value) for p in range(2)} <= {1, 2, 3, 4, 5}
    await ensure_topology(js, topology)  # again: nothing changes
    work = Work()
    replica = await Replica(work, slots=2, lease_s=5).start(clean_nats)
    try:
        assert await wait_for(lambda: _settled(js), 20)
        await asyncio.sleep(0.3)
        ran = {f"{g}:{i}" for g, idx in work.started.items() for i in idx}
        expected = {f"{g}:{i}" for g in groups for i in range(2)} - set(processed)
        assert ran == expected, (ran, processed)
        assert work.violations == []
    finally:
        await replica.stop()
        await nc.close()


async def _all_done(work: Work, groups: list[str], count: int) -> bool:
    return all(len(work.finished[g]) == count for g in groups)


async def _true(value: Any) -> Any:
    return value


@pytest.fixture(autouse=True)
def _quiet_retries(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger=__name__)


def test_stored_headers_are_decoded_as_a_delivery_decodes_them() -> None:
    """nats-py's get_msg parses headers as an email: a non-ASCII value became an email Header
    object and the dead-letter path (which scrubs header values as text) failed on it."""
    import base64

    from engram.runtime.group_order import stored_headers

    block = "NATS/1.0\r\nNats-Msg-Id: x1\r\nX-Note: héllo wörld\r\nBad:\xff\r\n\r\n".encode("latin-1")
    block = block.replace("héllo wörld".encode("latin-1"), "héllo wörld".encode())
    headers = stored_headers(base64.b64encode(block).decode())
    assert headers == {"Nats-Msg-Id": "x1", "X-Note": "héllo wörld", "Bad": "\ufffd"}
    assert all(isinstance(v, str) for v in headers.values())
    assert stored_headers(None) is None
