"""Freshness and backlog measured by the services themselves (issue 14 item 2), against real
NATS JetStream and FalkorDB with the whole pipeline in-process (rules LLM)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import nats
from prometheus_client import REGISTRY, generate_latest

from engram.observability.pipeline_metrics import BacklogMonitor
from engram.settings import EngramSettings
from engram.runtime.topology import Topology
from engram.schemas import Episode, subjects
from engram.services.turn_detector import app as td_app
from tests.services.summary_gate.helpers import new_session, pipeline
from tests.services.turn_detector.helpers import msg, publish, read_all


def _count(stage: str) -> float:
    return REGISTRY.get_sample_value("engram_pipeline_freshness_seconds_count", {"stage": stage}) or 0.0


def _sum(stage: str) -> float:
    return REGISTRY.get_sample_value("engram_pipeline_freshness_seconds_sum", {"stage": stage}) or 0.0


async def test_freshness_histogram_counts_one_turn_to_graph_and_summary(
    clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    before = {stage: (_count(stage), _sum(stage)) for stage in ("graph", "summary")}
    started = time.time()
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as p:
        session = new_session("fresh")
        await p.say(session, "Alice works at Acme in Berlin.", reply="Noted.")
        await p.close(session)
        await p.settle(60)
        stored = await read_all(p.js, subjects.STREAM_IN, f"engram.in.*.message.{session}")
        episodes = [Episode.model_validate_json(m.data) for m in await read_all(p.js, subjects.STREAM_EPISODES)]
    elapsed = time.time() - started

    # the turn's earliest stored message time travels in the Episode
    mine = [e for e in episodes if e.session_id == session]
    assert mine and all(e.first_published_at is not None for e in mine)
    first_stored = min(m.metadata.timestamp for m in stored)
    assert abs((mine[0].first_published_at - first_stored).total_seconds()) < 0.001

    graph_n = _count("graph") - before["graph"][0]
    summary_n = _count("summary") - before["summary"][0]
    assert graph_n == len(mine), (graph_n, len(mine))  # one per episode saved
    assert summary_n >= 1  # at least one summary decision on the turn's entities
    graph_avg = (_sum("graph") - before["graph"][1]) / graph_n
    assert 0 < graph_avg <= elapsed
    text = generate_latest(REGISTRY).decode()  # what /metrics serves
    assert 'engram_pipeline_freshness_seconds_bucket{le="1.0",stage="graph"}' in text
    assert 'engram_pipeline_freshness_seconds_count{stage="summary"}' in text


async def test_backlog_gauge_reflects_pending_messages(clean_nats: str, tmp_path: Path) -> None:
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=2)
    service = td_app.build(settings)
    detector: td_app.TurnDetector = service.detector  # type: ignore[attr-defined]
    await detector.start()  # topology and KV, no subscriber yet: messages stay pending
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    try:
        session = new_session("backlog")
        for i in range(3):
            await publish(js, msg(session, f"u{i}", "user", "hello", i))
        stored = await read_all(js, subjects.STREAM_IN, f"engram.in.*.message.{session}")
        partition = int(stored[0].subject.split(".")[2])  # the stream's subject transform put it there
        monitor = BacklogMonitor("turn_detector", subjects.STREAM_IN,
                                 [Topology.turn_detector_durable(p) for p in range(2)])
        backlog = await monitor.poll_once(js)
        assert backlog[partition] == 3 and backlog[1 - partition] == 0
        assert REGISTRY.get_sample_value("engram_stage_backlog_messages",
                                         {"stage": "turn_detector", "partition": str(partition)}) == 3

        await service.broker.start()  # now the detector consumes them
        deadline = time.monotonic() + 15
        while (await monitor.poll_once(js))[partition] and time.monotonic() < deadline:
            await _sleep(0.1)
        assert REGISTRY.get_sample_value("engram_stage_backlog_messages",
                                         {"stage": "turn_detector", "partition": str(partition)}) == 0
        # the service's own monitor polls the same durables
        assert (await detector.backlog.poll_once(js))[partition] == 0
    finally:
        await nc.close()
        await service.stop()


async def _sleep(seconds: float) -> None:
    import asyncio

    await asyncio.sleep(seconds)
