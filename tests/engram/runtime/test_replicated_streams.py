"""Replicated streams (ENGRAM_STREAM_REPLICAS) against a real 3-node NATS cluster on loopback:
three nats-server processes (the pip-installed binary) with cluster routes and their own
JetStream store directories.

- the replica count is applied to every stream, KV bucket and (inherited) consumer, and a
  changed count is applied to existing ones at start-up (an update, not ignored);
- one node is SIGKILLed while the real turn-detector ingests: every published message still
  becomes part of exactly one turn (no loss, no duplicate), nothing is dead-lettered.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nats
import nats.errors
import nats.js.errors
import pytest

from engram.stack.embedded import free_port, nats_server_binary, spawn
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import ChatMessage, SessionClosed, subjects
from engram.services.turn_detector import app as td_app
from tests.services.turn_detector.helpers import T0, episodes, read_all, wait_for

NODES = 3


@dataclass
class Node:
    name: str
    popen: Any
    url: str
    monitor: str

    def jsz(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.monitor}/jsz", timeout=1) as resp:
            return json.loads(resp.read())


def _start_cluster(root: Path) -> list[Node]:
    cluster_ports = [free_port() for _ in range(NODES)]
    procs = []
    for i in range(NODES):
        d = root / f"n{i}"
        d.mkdir(parents=True)
        routes = ",".join(f"nats://127.0.0.1:{p}" for j, p in enumerate(cluster_ports) if j != i)
        argv = [nats_server_binary(), "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "-js", "-sd", str(d / "store"),
                "--ports_file_dir", str(d), "--server_name", f"n{i}", "--cluster_name", "engram",
                "--cluster", f"nats://127.0.0.1:{cluster_ports[i]}", "--routes", routes]
        procs.append((d, spawn(f"n{i}", argv, d / "nats.log")))
    nodes: list[Node] = []
    deadline = time.monotonic() + 20
    for i, (d, popen) in enumerate(procs):
        ports_file = d / f"nats-server_{popen.pid}.ports"
        while not ports_file.exists():
            assert popen.poll() is None, (d / "nats.log").read_text()
            assert time.monotonic() < deadline, "nats-server wrote no ports file"
            time.sleep(0.05)
        time.sleep(0.05)  # written whole, but be safe against a partial read
        ports = json.loads(ports_file.read_text())
        nodes.append(Node(f"n{i}", popen, ports["nats"][0], ports["monitoring"][0]))
    # JetStream is usable once every node knows the same meta leader and sees all peers current.
    while time.monotonic() < deadline:
        try:
            metas = [n.jsz().get("meta_cluster", {}) for n in nodes]
        except OSError:
            metas = []
        leaders = {m.get("leader") for m in metas}
        if metas and len(leaders) == 1 and None not in leaders:
            on_leader = metas[[n.name for n in nodes].index(leaders.pop())]
            peers = on_leader.get("replicas") or []
            if len(peers) == NODES - 1 and all(p.get("current") for p in peers):
                return nodes
        time.sleep(0.1)
    raise AssertionError(f"no JetStream meta leader: {[n.jsz().get('meta_cluster') for n in nodes]}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[list[Node]]:
    nodes = _start_cluster(tmp_path / "cluster")
    yield nodes
    for n in nodes:
        if n.popen.poll() is None:
            n.popen.send_signal(signal.SIGTERM)
    for n in nodes:
        try:
            n.popen.wait(15)
        except Exception:  # noqa: BLE001
            n.popen.kill()


@pytest.fixture
async def js(cluster: list[Node]) -> AsyncIterator[Any]:
    nc = await nats.connect([n.url for n in cluster], max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    yield nc.jetstream(timeout=5)
    await nc.close()


async def _retry(call: Any, timeout: float = 30.0) -> Any:
    """A JetStream API call, retried while the cluster elects leaders (no responders, timeouts)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call()
        except (nats.errors.TimeoutError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError,
                nats.errors.ConnectionReconnectingError, nats.js.errors.ServerError,
                nats.js.errors.NoStreamResponseError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


async def _replicas(js: Any, topology: Topology) -> dict[str, int]:
    """stream/consumer name -> number of peers (leader + replicas) the cluster reports."""
    def peers(info: Any) -> int:  # no cluster info while an asset moves to its new peer set
        return 1 + len(info.cluster.replicas or []) if info.cluster and info.cluster.leader else 0

    out = {}
    for cfg in topology.streams():
        out[cfg.name] = peers(await js.stream_info(cfg.name))
    for kv in topology.kv_buckets():
        out[f"KV_{kv.bucket}"] = peers(await js.stream_info(f"KV_{kv.bucket}"))
    for stream, ccfg in topology.consumers():
        out[ccfg.durable_name] = peers(await js.consumer_info(stream, ccfg.durable_name))
    return out


def test_topology_gives_every_stream_and_bucket_the_configured_replicas() -> None:
    topology = Topology.from_settings(EngramSettings(stream_replicas=3, nats_url="nats://x:4222"))
    assert {s.name: s.num_replicas for s in topology.streams()} == {s.name: 3 for s in topology.streams()}
    assert [kv.replicas for kv in topology.kv_buckets()] == [3] * len(topology.kv_buckets())
    # Consumers inherit (num_replicas unset): they follow the stream when it is scaled.
    assert all(not c.num_replicas for _, c in topology.consumers())
    assert Topology.from_settings(EngramSettings(nats_url="nats://x:4222")).replicas == 1


async def test_a_changed_replica_count_is_applied_to_existing_streams(js: Any) -> None:
    one = Topology(partitions=2, duplicate_window_s=60, ack_wait_s=30, replicas=1)
    await _retry(lambda: ensure_topology(js, one))
    assert set((await _replicas(js, one)).values()) == {1}
    kv = await js.key_value(subjects.KV_TURN_SESSIONS)
    await kv.put("s1", b"kept")
    await js.publish(subjects.in_message("s1"), b"{}", headers={subjects.HDR_MSG_ID: "m1"})

    three = Topology(partitions=2, duplicate_window_s=60, ack_wait_s=30, replicas=3)
    await _retry(lambda: ensure_topology(js, three))  # what every service does at start-up

    async def all_three() -> dict[str, int] | None:
        got = await _replicas(js, three)
        return got if set(got.values()) == {3} else None

    assert await wait_for(all_three, 20), await _replicas(js, three)
    assert {s.config.name: s.config.num_replicas for s in await js.streams_info()} == \
        {name: 3 for name in [s.name for s in three.streams()] + [f"KV_{b.bucket}" for b in three.kv_buckets()]}
    assert (await kv.get("s1")).value == b"kept", "scaling kept the data"
    assert (await js.stream_info(subjects.STREAM_IN)).state.messages == 1

    await _retry(lambda: ensure_topology(js, one))  # scaling down is an update too
    assert await wait_for(lambda: _all(js, one, 1), 20), await _replicas(js, one)


async def _all(js: Any, topology: Topology, n: int) -> bool:
    return set((await _replicas(js, topology)).values()) == {n}


async def test_more_replicas_than_nodes_is_refused_with_the_setting_named(js: Any) -> None:
    with pytest.raises(RuntimeError, match="ENGRAM_STREAM_REPLICAS"):
        await ensure_topology(js, Topology(partitions=1, duplicate_window_s=60, ack_wait_s=30, replicas=5))


SESSIONS = 12
PAIRS = 8  # user/assistant pairs per session: one turn each


def _chat(session: int, pair: int, role: str) -> ChatMessage:
    i = 2 * pair + (role == "assistant")
    return ChatMessage(message_id=f"m{session}-{i}", session_id=f"s{session}", role=role,
                       content=f"{role} line {i} of session {session}", timestamp=T0.replace(second=i))


async def _publish_until_acked(js: Any, subject: str, data: bytes, msg_id: str) -> None:
    """At-least-once publishing, as a client of a cluster must: retry until a PubAck; the
    Nats-Msg-Id makes a retry of a message that was stored after all a duplicate the server drops."""
    await _retry(lambda: js.publish(subject, data, headers={subjects.HDR_MSG_ID: msg_id}, timeout=2), timeout=60)


async def _ingest_killing_a_node(cluster: list[Node], js: Any, sessions: int, pairs: int) -> list[str]:
    """Publish ``sessions`` x ``pairs`` user/assistant pairs (then a close per session), SIGKILL
    the input stream's leader node after half the messages; the published message ids."""
    published: list[str] = []
    killed: list[Node] = []
    half = sessions * pairs

    async def kill_in_leader() -> Node:
        # The leader of the input stream: the node whose loss costs the most (stream writes,
        # and its consumers' leaders are usually there too).
        leader = (await js.stream_info(subjects.STREAM_IN)).cluster.leader
        node = next(n for n in cluster if n.name == leader)
        done_before = len(await episodes(js))
        assert done_before < sessions * pairs, "ingest finished before the kill: not mid-ingest"
        os.kill(node.popen.pid, signal.SIGKILL)
        node.popen.wait(5)
        return node

    for pair in range(pairs):
        for role in ("user", "assistant"):
            for s in range(sessions):
                m = _chat(s, pair, role)
                await _publish_until_acked(js, subjects.in_message(m.session_id), m.model_dump_json().encode(),
                                           m.message_id)
                published.append(m.message_id)
                if len(published) == half:
                    killed.append(await kill_in_leader())
    for s in range(sessions):
        await _publish_until_acked(js, subjects.in_close(f"s{s}"),
                                   SessionClosed(session_id=f"s{s}", closed_at=T0).model_dump_json().encode(),
                                   f"close:s{s}")
    assert len(killed) == 1 and killed[0].popen.returncode == -signal.SIGKILL
    return published


async def _all_turns(js: Any, n: int) -> list:
    async def enough() -> list | None:
        eps = await _retry(lambda: episodes(js))
        return eps if len(eps) >= n else None

    return await wait_for(enough, 90, interval=0.5) or await episodes(js)


def _assert_each_message_in_one_turn(eps: list, published: list[str], sessions: int, pairs: int) -> None:
    in_turns = Counter(m.message_id for e in eps for m in e.messages)
    lost = set(published) - set(in_turns)
    twice = {mid: n for mid, n in in_turns.items() if n > 1}
    assert not lost, f"{len(lost)} of {len(published)} published messages are in no turn: {sorted(lost)[:10]}"
    assert not twice, f"messages in more than one turn: {twice}"
    assert len(eps) == len({e.episode_id for e in eps}) == sessions * pairs, "duplicate or missing episodes"
    assert sorted(e.turn_id for e in eps) == sorted(f"s{s}:m{s}-{2 * p}" for s in range(sessions) for p in range(pairs))


def _cluster_settings(cluster: list[Node], tmp_path: Path, **kw: Any) -> EngramSettings:
    return EngramSettings(
        nats_url=",".join(n.url for n in cluster), data_dir=tmp_path, partitions=4, stream_replicas=3,
        # A lost ack (the consumer leader died with it) is redelivered after ack_wait: keep it short.
        ack_wait_s=5,
        turn=TurnDetectorSettings(idle_timeout_s=600),
        **kw,
    )


async def test_a_node_killed_mid_ingest_loses_no_message(cluster: list[Node], js: Any, tmp_path: Path) -> None:
    settings = _cluster_settings(cluster, tmp_path)
    service = td_app.build(settings)
    await service.start()
    try:
        assert set((await _replicas(js, Topology.from_settings(settings))).values()) == {3}
        published = await asyncio.wait_for(_ingest_killing_a_node(cluster, js, SESSIONS, PAIRS), 120)
        eps = await _all_turns(js, SESSIONS * PAIRS)
        _assert_each_message_in_one_turn(eps, published, SESSIONS, PAIRS)
        assert await read_all(js, subjects.STREAM_DLQ) == [], "nothing is dead-lettered"
        # Every session's closed segment too (ENGRAM_SESSIONS, also R3), once each.
        segments = [json.loads(m.data)["session_id"] for m in await read_all(js, subjects.STREAM_SESSIONS)]
        assert sorted(segments) == sorted(f"s{s}" for s in range(SESSIONS))
    finally:
        await service.stop()


async def test_through_the_extractor_every_turn_is_in_the_graph_once(
    cluster: list[Node], js: Any, tmp_path: Path, falkordb_server: Any,
) -> None:
    """The same kill with the extractor running too (rules model, real FalkorDB): every turn's
    episode is stored in its group's graph exactly once."""
    from falkordb import FalkorDB

    from engram.models.rules_llm import RulesExtractorClient
    from engram.services.extractor import app as ex_app

    sessions, pairs = 6, 4
    settings = _cluster_settings(cluster, tmp_path, graph_url=falkordb_server.url)
    detector, extractor = td_app.build(settings), ex_app.build(settings, llm=RulesExtractorClient())
    await detector.start()
    await extractor.start()
    try:
        published = await asyncio.wait_for(_ingest_killing_a_node(cluster, js, sessions, pairs), 120)
        eps = await _all_turns(js, sessions * pairs)
        _assert_each_message_in_one_turn(eps, published, sessions, pairs)
        host, port = falkordb_server.url.removeprefix("falkor://").split(":")
        db = FalkorDB(host=host, port=int(port))

        async def stored() -> Counter | None:
            found: Counter = Counter()
            for group in {e.group_id for e in eps}:
                if group in db.list_graphs():
                    rows = db.select_graph(group).ro_query("MATCH (e:Episodic) RETURN e.uuid").result_set
                    found.update(r[0] for r in rows)
            return found if sum(found.values()) >= len(eps) else None

        found = await wait_for(stored, 120, interval=1.0) or Counter()
        assert set(found) == {e.episode_id for e in eps}, f"{len(set(found))} of {len(eps)} episodes in the graph"
        assert set(found.values()) == {1}, "an episode stored twice"
        assert await read_all(js, subjects.STREAM_DLQ) == [], "nothing is dead-lettered"
    finally:
        await extractor.stop()
        await detector.stop()
