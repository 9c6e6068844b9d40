"""Benchmark: messages/s through the turn-detector vs a pass-through FastStream consumer.

Both consume the same pre-filled ENGRAM_IN stream of an embedded nats-server, with the same
consumer shape (one durable per partition, one message in flight, pull batch 1, explicit ack):
All three use engram's broker set-up (engram.runtime.service.make_broker: Prometheus middleware etc.):
- ack-only: receive and ack (the floor of what any JetStream stage costs);
- pass-through: receive, publish to an output stream awaiting the PubAck, ack;
- turn-detector: the real service (parse, scrub, filter, pair, KV compare-and-set, episodes).
Rounds alternate between the variants so machine noise hits all of them alike; the table
reports medians and the ratio turn-detector / pass-through (target >= 0.8x).

    python bench/turn_detector.py [--messages 3000] [--sessions 60] [--rounds 3] [--partitions 4]
    python bench/turn_detector.py --smoke   # CI: 300 messages, 10 sessions, 1 round; checks the table, not the speed
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import nats  # noqa: E402
import nats.js.errors  # noqa: E402
from nats.js.api import StreamConfig  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._smoke import Checks, parse  # noqa: E402
from engram.stack.embedded import start_nats  # noqa: E402
from engram.runtime.service import make_broker, subscribe_partitions  # noqa: E402
from engram.settings import EngramSettings, TurnDetectorSettings  # noqa: E402
from engram.runtime.topology import Topology, ensure_topology  # noqa: E402
from engram.schemas import ChatMessage, subjects  # noqa: E402
from engram.services.turn_detector import app as td_app  # noqa: E402

TEXTS = [
    "I changed the retry policy in worker.py to use exponential backoff, can you check it?",
    "Looks right. I also set max_retries=5 in config/settings.toml and ran the tests: 48 passed.",
    "The deploy failed with ConnectionRefusedError on port 5432, any idea?",
    "Postgres was not up yet; I added a health check to docker-compose.yml and it deploys now.",
]


def conversation(n_messages: int, n_sessions: int) -> list[ChatMessage]:
    t0 = datetime(2026, 1, 1, tzinfo=timezone.utc)
    out = []
    for i in range(n_messages):
        session = f"bench-{i % n_sessions}"
        k = i // n_sessions
        out.append(ChatMessage(message_id=f"{session}-m{k}", session_id=session,
                               role="user" if k % 2 == 0 else "assistant", content=TEXTS[k % 4],
                               timestamp=t0 + timedelta(seconds=k)))
    return out


async def fill(nats_url: str, settings: EngramSettings, messages: list[ChatMessage]) -> None:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await ensure_topology(js, Topology.from_settings(settings))
    await js.add_stream(StreamConfig(name="BENCH_OUT", subjects=["bench.out.>"]))
    pending = []
    for m in messages:
        pending.append(js.publish_async(subjects.in_message(m.session_id), m.model_dump_json().encode(),
                                        headers={subjects.HDR_MSG_ID: m.message_id}))
        if len(pending) >= 500:
            await asyncio.gather(*pending)
            pending = []
    await asyncio.gather(*pending)
    await js.publish_async_completed()
    await nc.close()


async def reset(js, durables: list[str]) -> None:  # noqa: ANN001
    for d in durables:
        try:
            await js.delete_consumer(subjects.STREAM_IN, d)
        except nats.js.errors.NotFoundError:
            pass
    try:
        await js.delete_key_value(subjects.KV_TURN_SESSIONS)
    except nats.js.errors.NotFoundError:
        pass
    # Deleted, not purged: a purge keeps the stream's Nats-Msg-Id dedupe window, so the next
    # round's episodes (same ids) would only be acknowledged as duplicates, not stored. The
    # turn-detector's start (ensure_topology) creates the stream again.
    try:
        await js.delete_stream(subjects.STREAM_EPISODES)
    except nats.js.errors.NotFoundError:
        pass
    await js.purge_stream("BENCH_OUT")


async def wait_drained(js, durables: list[str], total: int) -> None:  # noqa: ANN001
    while True:
        acked = 0
        for d in durables:
            try:
                ci = await js.consumer_info(subjects.STREAM_IN, d)
            except nats.js.errors.NotFoundError:
                break
            if ci.num_pending or ci.num_ack_pending:
                break
            acked += 1
        else:
            if acked == len(durables):
                return
        await asyncio.sleep(0.01)


async def stream_count(js, stream: str) -> int:  # noqa: ANN001
    try:
        return (await js.stream_info(stream)).state.messages
    except nats.js.errors.NotFoundError:
        return 0


async def run_passthrough(settings: EngramSettings, forward: bool, total: int) -> tuple[float, int, float]:
    """Messages/s, how many messages reached the output stream, and this process's CPU
    microseconds per message."""
    # The same broker set-up as the service (engram.runtime.service.make_broker: Prometheus middleware,
    # collapsed subject labels), so the comparison isolates what the turn-detector itself does.
    nats_url = settings.resolved_nats_url()
    topology = Topology.from_settings(settings)
    broker = make_broker(settings, service="bench-passthrough")
    durables = [f"passthrough_p{p}" for p in range(topology.partitions)]
    configs = []
    for p, durable in enumerate(durables):
        cfg = topology.turn_detector_consumer(p)
        cfg.durable_name = durable
        configs.append(cfg)

    async def handle(msg: Any) -> None:  # the NatsMessage, as the services receive it
        if forward:
            raw = msg.raw_message
            await broker.publish(raw.data, "bench.out." + raw.subject.rsplit(".", 1)[-1], stream="BENCH_OUT")
        await msg.ack()

    # exactly the services' subscription shape (engram.runtime.service.subscribe_partitions)
    subscribe_partitions(broker, subjects.STREAM_IN, configs, handle, title="passthrough")
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await reset(js, durables)
    await broker.connect()
    started, cpu = time.perf_counter(), time.process_time()
    await broker.start()
    await wait_drained(js, durables, total)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await broker.stop()
    forwarded = await stream_count(js, "BENCH_OUT")
    await reset(js, durables)
    await nc.close()
    return total / elapsed, forwarded, 1e6 * cpu / total


async def run_detector(nats_url: str, settings: EngramSettings, total: int) -> tuple[float, int, int, float]:
    """Messages/s, episodes published, dead letters (the DLQ stream's count after the run), and
    this process's CPU microseconds per message."""
    topology = Topology.from_settings(settings)
    durables = [topology.turn_detector_durable(p) for p in range(settings.partitions)]
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    await reset(js, durables)
    service = td_app.build(settings)
    for hook in service.on_startup:
        await hook()
    started, cpu = time.perf_counter(), time.process_time()
    await service.broker.start()
    await wait_drained(js, durables, total)
    elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
    await service.stop()
    episodes = await stream_count(js, subjects.STREAM_EPISODES)
    dead = await stream_count(js, subjects.STREAM_DLQ)
    await reset(js, durables)
    await nc.close()
    return total / elapsed, episodes, dead, 1e6 * cpu / total


async def main(args: argparse.Namespace) -> int:
    logging.getLogger("faststream").setLevel(logging.ERROR)
    logging.getLogger("faststream.access.nats").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_nats(Path(tmp))
        try:
            settings = EngramSettings(nats_url=server.url, data_dir=Path(tmp), partitions=args.partitions,
                                      turn=TurnDetectorSettings(idle_timeout_s=3600))
            messages = conversation(args.messages, args.sessions)
            await fill(server.url, settings, messages)
            results: dict[str, list[float]] = {"ack-only": [], "pass-through": [], "turn-detector": []}
            cpu_us: dict[str, list[float]] = {k: [] for k in results}
            forwarded, episodes, dead = [], [], []
            for r in range(args.rounds):
                rate, _, cpu = await run_passthrough(settings, False, len(messages))
                results["ack-only"].append(rate)
                cpu_us["ack-only"].append(cpu)
                rate, out, cpu = await run_passthrough(settings, True, len(messages))
                results["pass-through"].append(rate)
                cpu_us["pass-through"].append(cpu)
                forwarded.append(out)
                rate, eps, dlq, cpu = await run_detector(server.url, settings, len(messages))
                results["turn-detector"].append(rate)
                cpu_us["turn-detector"].append(cpu)
                episodes.append(eps)
                dead.append(dlq)
                print(f"round {r + 1}/{args.rounds}: " + ", ".join(f"{k} {v[-1]:.0f} msg/s" for k, v in results.items()),
                      file=sys.stderr)
        finally:
            server.stop()
    med = {k: statistics.median(v) for k, v in results.items()}
    table = Table(title=f"turn-detector throughput: {args.messages} messages, {args.sessions} sessions, "
                        f"{args.partitions} partitions, median of {args.rounds} alternating rounds")
    for col in ("consumer", "median msg/s", "min", "max", "ratio vs pass-through", "Python CPU us/msg", "CPU ratio"):
        table.add_column(col, justify="right" if col != "consumer" else "left")
    cpu_med = {k: statistics.median(v) for k, v in cpu_us.items()}
    for k, v in results.items():
        table.add_row(k, f"{med[k]:.0f}", f"{min(v):.0f}", f"{max(v):.0f}", f"{med[k] / med['pass-through']:.2f}x",
                      f"{cpu_med[k]:.0f}", f"{cpu_med[k] / cpu_med['pass-through']:.2f}x")
    Console(width=140).print(table)
    # The consumers are CPU-bound in this one Python process (its CPU per message times the rate
    # is ~1 core): the throughput ratio follows the CPU ratio.
    ratio = med["turn-detector"] / med["pass-through"]
    print(f"turn-detector / pass-through = {ratio:.2f}x (target >= 0.80x): {'MET' if ratio >= 0.8 else 'NOT MET'}")
    print(f"per round: pass-through forwarded {forwarded} of {len(messages)} messages; turn-detector published "
          f"{episodes} episodes; dead letters in the DLQ after each round {dead}")
    if not args.smoke:
        return 0
    check = Checks()
    for k, v in results.items():
        check.that(len(v) == args.rounds, f"{k}: {len(v)} of {args.rounds} rounds")
        for x in v:
            check.number(f"{k} msg/s", x, positive=True)
        for x in cpu_us[k]:
            check.number(f"{k} CPU us/msg", x, positive=True)
    check.that(all(n == len(messages) for n in forwarded), f"pass-through forwarded {forwarded} of {len(messages)}")
    # a user message closes its session's previous turn; the last turn of each session stays open
    # (idle timeout 1 h), so every round must publish exactly this many episodes
    users: dict[str, int] = {}
    for m in messages:
        users[m.session_id] = users.get(m.session_id, 0) + (m.role == "user")
    expected = sum(max(0, n - 1) for n in users.values())
    check.that(all(n == expected for n in episodes), f"turn-detector published {episodes} episodes, {expected} expected")
    check.that(not any(dead), f"turn-detector dead letters {dead}")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--sessions", type=int, default=60)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=4)
    args = parse(parser, {"messages": 300, "sessions": 10, "rounds": 1})
    sys.exit(asyncio.run(main(args)))
