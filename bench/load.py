"""Load: N groups, each a long LoCoMo conversation, ingested at once (issue 16, item 5).

One nats-server and one FalkorDB (embedded, fsync on as `engram up` runs them), the turn-detector
and the extractor in this process (ENGRAM_EXTRACTOR_CONCURRENCY as configured, default 4), the
offline rules model as a zero-latency LLM and the hashing embedder: the graph is the bottleneck,
which is where 30 groups at once used to fail (redis-py's default pool raised "Too many
connections" 201 times in 24 minutes; engram/graph/drivers.py now waits on a bounded pool). Each group is
one user (``load-u<i>``) with its own copy of a conversation (LoCoMo's cycled, session ids made
unique), published concurrently, every session closed.

Reports turns/s and episodes/s to drained, p95 publish -> in graph (histogram_quantile over
engram_pipeline_freshness_seconds{stage="graph"}, as the Grafana panel computes it), connection
errors ("Too many connections", or any redis ConnectionError logged), retries (handler failures
answered with a delayed redelivery), dead letters. Goal: 0 errors at 30 groups.

    python bench/load.py [--groups 30] [--sessions 0 (all)] [--timeout 3600]
    python bench/load.py --smoke   # CI: 2 groups x 1 session; checks the table and 0 errors
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import nats  # noqa: E402
import nats.js.errors  # noqa: E402
from prometheus_client import REGISTRY  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._drain import wait_drained  # noqa: E402
from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from engram.stack.embedded import start_falkordb, start_nats  # noqa: E402
from engram.publishing.ingest import Event, publish_events, read_locomo  # noqa: E402
from engram.models.factory import EmbedderSettings  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.settings import EngramSettings, TurnDetectorSettings  # noqa: E402
from engram.schemas import ScopeKeys, subjects  # noqa: E402
from engram.services.extractor import app as ex_app  # noqa: E402
from engram.services.turn_detector import app as td_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCOMO = Path(os.environ.get("ENGRAM_LOCOMO", ROOT.parent / "shared" / "data" / "locomo" / "locomo7.json"))


class ErrorCounter(logging.Handler):
    """Counts WARNING+ records of this process by kind; never keeps their text."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.connection = 0
        self.retries = 0
        self.other = 0

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" {type(record.exc_info[1]).__name__} {record.exc_info[1]}"
        if "Too many connections" in text or "ConnectionError" in text or "No connection available" in text:
            self.connection += 1
        if text.startswith("retrying seq="):
            self.retries += 1
        elif "Too many connections" not in text:
            self.other += 1


def group_events(group: int, conversations: list[str], sessions: int | None) -> list[Event]:
    sample = conversations[group % len(conversations)]
    out = []
    for event in read_locomo(LOCOMO, ScopeKeys(user=f"load-u{group}"), [sample], max_sessions=sessions):
        update = {"session_id": f"g{group}-{event.session_id}"}
        if hasattr(event, "message_id"):
            update["message_id"] = f"g{group}-{event.message_id}"
        out.append(event.model_copy(update=update))
    return out


def freshness_buckets() -> dict[float, float]:
    """Cumulative bucket counts of engram_pipeline_freshness_seconds{stage="graph"} now."""
    out: dict[float, float] = {}
    for metric in REGISTRY.collect():
        if metric.name != "engram_pipeline_freshness_seconds":
            continue
        for sample in metric.samples:
            if sample.name.endswith("_bucket") and sample.labels.get("stage") == "graph":
                out[float(sample.labels["le"])] = sample.value
    return out


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """Prometheus' histogram_quantile over the increase between two snapshots (linear in a bucket)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    if not counts or counts[-1] <= 0:
        return None
    rank = q * counts[-1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in zip(bounds, counts):
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / max(count - lower_count, 1e-9)
        lower_bound, lower_count = bound, count
    return None


async def main(args: argparse.Namespace) -> int:
    require_locomo(LOCOMO)
    logging.getLogger("faststream").setLevel(logging.ERROR)
    logging.getLogger("faststream.access.nats").setLevel(logging.ERROR)
    errors = ErrorCounter()
    logging.getLogger().addHandler(errors)
    conversations = [c["sample_id"] for c in json.loads(LOCOMO.read_text())]
    per_group = [group_events(g, conversations, args.sessions or None) for g in range(args.groups)]
    messages = sum(1 for events in per_group for e in events if hasattr(e, "message_id"))
    with tempfile.TemporaryDirectory(prefix="engram-load-") as tmp:
        nats_server, falkordb = start_nats(Path(tmp)), start_falkordb(Path(tmp))
        try:
            settings = EngramSettings(nats_url=nats_server.url, graph_url=falkordb.url, data_dir=Path(tmp),
                                      turn=TurnDetectorSettings(idle_timeout_s=3600))
            detector = td_app.build(settings)
            extractor = ex_app.build(settings, llm=RulesExtractorClient(),
                                     embedder_settings=EmbedderSettings(provider="hashing"))
            await detector.start()
            await extractor.start()
            nc = await nats.connect(nats_server.url)
            js = nc.jetstream()
            before = freshness_buckets()
            started = time.monotonic()
            reports = await asyncio.gather(*(publish_events(js, events) for events in per_group))
            published_s = time.monotonic() - started
            # one episode per turn and scope (session + user): the turn-detector's count after close
            expect = None
            while expect is None or (await js.stream_info(subjects.STREAM_EPISODES)).state.messages < expect:
                await asyncio.sleep(0.5)
                infos = await js.consumers_info(subjects.STREAM_IN)
                if all(not c.num_pending and not c.num_ack_pending for c in infos):
                    expect = (await js.stream_info(subjects.STREAM_EPISODES)).state.messages
                if time.monotonic() - started > args.timeout:
                    raise RuntimeError("turn-detector not drained")
            await wait_drained(js, (subjects.STREAM_IN, subjects.STREAM_EPISODES), expect_episodes=expect,
                               timeout=args.timeout - (time.monotonic() - started))
            elapsed = time.monotonic() - started
            episodes = expect
            try:
                dead = (await js.stream_info(subjects.STREAM_DLQ)).state.messages
            except nats.js.errors.NotFoundError:
                dead = 0
            p95 = histogram_quantile(0.95, before, freshness_buckets())
            p50 = histogram_quantile(0.50, before, freshness_buckets())
            await nc.close()
            await extractor.stop()
            await detector.stop()
        finally:
            falkordb.stop()
            nats_server.stop()
    turns = episodes // 2  # session and user scope
    table = Table(title=f"load: {args.groups} groups at once, {messages} messages, {turns} turns, {episodes} episodes "
                        f"(rules model, hashing embedder, extractor concurrency {settings.extractor_concurrency}, "
                        f"graph pool {settings.graph_max_connections})")
    for col in ("turns/s", "episodes/s", "seconds to drained", "publish -> graph p50 (s)", "p95 (s)",
                "connection errors", "retries", "other warnings", "dead letters"):
        table.add_column(col, justify="right")
    table.add_row(f"{turns / elapsed:.1f}", f"{episodes / elapsed:.1f}", f"{elapsed:.0f}",
                  f"{p50:.1f}" if p50 is not None else "-", f"{p95:.1f}" if p95 is not None else "-",
                  str(errors.connection), str(errors.retries), str(errors.other), str(dead))
    Console(width=200).print(table)
    print(f"published {sum(r.messages for r in reports)} messages in {published_s:.1f} s; "
          f"goal 0 connection errors: {'MET' if errors.connection == 0 else 'NOT MET'}")
    if not args.smoke:
        return 0
    check = Checks()
    check.that(episodes > 0 and episodes % 2 == 0, f"{episodes} episodes (two scopes per turn)")
    check.that(errors.connection == 0, f"{errors.connection} connection errors")
    check.that(dead == 0, f"{dead} dead letters")
    check.that(p95 is not None, "no freshness observed")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=0, help="sessions per conversation; 0 = all")
    parser.add_argument("--timeout", type=float, default=3600.0)
    args = parse(parser, {"groups": 2, "sessions": 1, "timeout": 150.0})
    sys.exit(asyncio.run(main(args)))
