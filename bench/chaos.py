"""Chaos replay: a LoCoMo conversation through the services `engram up` runs, with faults, compared
with the same replay without faults (issue 16, item 2).

Two runs on fresh data dirs, each: nats-server and FalkorDB (managed here, on fixed loopback
ports, so they can be restarted under the services' feet), `engram up` on them (all services, the
LLM served over HTTP by bench/llm_simulator.py answering with the offline rules model, the
hashing embedder), then the conversation published in order by engram.publishing.ingest.publish_events
(what `engram ingest` runs), paced like a live chat so that messages keep arriving during the
faults (``--pace-s``; by default the conversation is spread over the fault window). The second
run injects, at random moments while it works:

- ``--kills`` SIGKILLs of a random pipeline service (turn-detector, extractor, summary-gate,
  sessions: the stream consumers; `engram up`'s supervisor restarts them);
- ``--nats-restarts`` restarts of nats-server (the first SIGKILL, the next SIGTERM, then started
  again on the same port and store);
- one FalkorDB outage of ``--graph-outage-s`` seconds (SIGTERM, then started again on its data).

Then both runs wait until every consumer is drained and compare: episode ids, the turns (which
messages each episode holds), each group's entities and active facts as normalised (source,
relation, target) triples, Episodic nodes; lost = messages in no episode, duplicated = messages in
two episodes of one group or an Episodic node stored twice. Recovery = seconds from a fault (from
the restart, for the graph outage) until the pipeline moved again (a consumer of the killed
service, or the extractor after the graph outage, delivered; or nothing was pending) and every
service answered /healthz.

    python bench/chaos.py [--sample conv-26] [--sessions 0 (all)] [--kills 20] [--nats-restarts 2]
                          [--graph-outage-s 30] [--pace-s S] [--seed 7] [--write-docs]
    python bench/chaos.py --smoke   # CI: 1 session, 3 kills, 1 NATS restart, 3 s graph outage

``--write-docs`` rewrites the figures block of docs/reliability.md from this run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import nats  # noqa: E402
import nats.js.errors  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench import _drain  # noqa: E402
from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from bench.llm_simulator import LLMSimulator  # noqa: E402
from engram.stack.embedded import ManagedProcess, free_port, http_ok, start_falkordb, start_nats  # noqa: E402
from engram.publishing.ingest import publish_events, read_locomo  # noqa: E402
from engram.schemas import Episode, ScopeKeys, subjects  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LOCOMO = Path(os.environ.get("ENGRAM_LOCOMO", ROOT.parent / "shared" / "data" / "locomo" / "locomo7.json"))
DOCS = ROOT / "docs" / "reliability.md"
DOCS_BEGIN = "<!-- chaos:begin (bench/chaos.py --write-docs) -->"
DOCS_END = "<!-- chaos:end -->"

PIPELINE = ("turn-detector", "extractor", "summary-gate", "sessions")
"""The services a kill picks from: the stream consumers, whose crash could lose or double work."""

CONSUMERS_OF = {
    "turn-detector": (subjects.STREAM_IN, "turn_detector_"),
    "extractor": (subjects.STREAM_EPISODES, "extractor"),
    "summary-gate": (subjects.STREAM_DELTAS, "summary_gate"),
    "sessions": (subjects.STREAM_SESSIONS, "sessions"),
}
STREAMS = (subjects.STREAM_IN, subjects.STREAM_EPISODES, subjects.STREAM_DELTAS, subjects.STREAM_SESSIONS)


# --- one stack -----------------------------------------------------------------------------
@dataclass
class Stack:
    """nats-server + FalkorDB (restartable on the same ports) and `engram up` on them."""

    data: Path
    llm_url: str
    nats_port: int = field(default_factory=free_port)
    graph_port: int = field(default_factory=free_port)
    nats: ManagedProcess | None = None
    graph: ManagedProcess | None = None
    up: subprocess.Popen | None = None

    @property
    def nats_url(self) -> str:
        return f"nats://127.0.0.1:{self.nats_port}"

    @property
    def graph_url(self) -> str:
        return f"falkor://127.0.0.1:{self.graph_port}"

    def start_nats(self) -> None:
        self.nats = start_nats(self.data / "servers", port=self.nats_port)

    def start_graph(self) -> None:
        self.graph = start_falkordb(self.data / "servers", port=self.graph_port)

    def start(self) -> None:
        self.start_nats()
        self.start_graph()
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
        env.update(GRAPHITI_TELEMETRY_ENABLED="false", ENGRAM_NATS_URL=self.nats_url, ENGRAM_GRAPH_URL=self.graph_url,
                   ENGRAM_LLM_PROVIDER="openai", ENGRAM_LLM_BASE_URL=self.llm_url, ENGRAM_LLM_MODEL="sim",
                   ENGRAM_EMBEDDER_PROVIDER="hashing", ENGRAM_LOG_LEVEL="WARNING")
        log = open(self.data / "up.log", "wb")  # noqa: SIM115 - closed with the process
        self.up = subprocess.Popen([sys.executable, "-m", "engram.cli", "up", "--data-dir", str(self.data / "engram")],
                                   stdout=log, stderr=subprocess.STDOUT, env=env)
        deadline = time.monotonic() + 180
        while not self.runtime_file.exists():
            if self.up.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"engram up did not start; see {self.data / 'up.log'}")
            time.sleep(0.2)

    @property
    def runtime_file(self) -> Path:
        return self.data / "engram" / "engram-runtime.json"

    def services(self) -> dict[str, dict[str, Any]]:
        for _ in range(50):  # the supervisor replaces the file atomically; read it again if torn
            try:
                return json.loads(self.runtime_file.read_text())["services"]
            except (OSError, ValueError):
                time.sleep(0.05)
        raise RuntimeError("cannot read engram's runtime file")

    def all_healthy(self) -> bool:
        return all(http_ok(f"{s['url']}/healthz") for s in self.services().values())

    def stop(self) -> None:
        if self.up is not None and self.up.poll() is None:
            self.up.send_signal(signal.SIGTERM)
            try:
                self.up.wait(90)
            except subprocess.TimeoutExpired:
                self.up.kill()
        for proc in (self.graph, self.nats):
            if proc is not None:
                proc.stop()


# --- observing the pipeline ----------------------------------------------------------------
async def consumer_state(js) -> dict[tuple[str, str], tuple[int, int, int]]:  # noqa: ANN001
    return await _drain.consumer_state(js, STREAMS)


busy = _drain.busy


async def connect(stack: Stack):  # noqa: ANN201
    async def quiet(exc: Exception) -> None:  # the restarts are ours: no traceback per reconnect attempt
        pass

    return await nats.connect(stack.nats_url, reconnect_time_wait=0.2, max_reconnect_attempts=-1,
                              connect_timeout=2, allow_reconnect=True, error_cb=quiet)


async def wait_drained(js, expect_episodes: int | None, timeout: float) -> float:  # noqa: ANN001
    """Seconds until every consumer had nothing pending for 5 s in a row (and, when known, the
    episode stream holds ``expect_episodes``)."""
    return await _drain.wait_drained(js, STREAMS, timeout=timeout, expect_episodes=expect_episodes, quiet_s=5.0,
                                     tolerate_errors=True)


# --- faults --------------------------------------------------------------------------------
@dataclass
class Fault:
    kind: str  # kill | nats_restart | graph_outage
    target: str
    at_s: float = 0.0
    busy: bool = False
    recovery_s: float | None = None


async def recovered(stack: Stack, js, fault: Fault, before: dict, timeout: float = 180) -> float:  # noqa: ANN001
    """Seconds until every service is healthy again and the pipeline moved since ``before`` (a
    consumer of the affected service delivered further), or had nothing left to do."""
    started = time.monotonic()
    stream_prefix = {"kill": CONSUMERS_OF.get(fault.target), "graph_outage": CONSUMERS_OF["extractor"]}.get(fault.kind)
    while time.monotonic() - started < timeout:
        try:
            state = await consumer_state(js)
        except Exception:  # noqa: BLE001 - NATS still restarting
            await asyncio.sleep(0.1)
            continue
        relevant = {k: v for k, v in state.items()
                    if stream_prefix is None or (k[0] == stream_prefix[0] and k[1].startswith(stream_prefix[1]))}
        moved = any(v[0] > before.get(k, (0, 0, 0))[0] for k, v in relevant.items())
        idle = not any(v[1] or v[2] for v in relevant.values())
        if (moved or idle) and await asyncio.to_thread(stack.all_healthy):
            return time.monotonic() - started
        await asyncio.sleep(0.1)
    return float("nan")


async def inject(stack: Stack, fault: Fault, args: argparse.Namespace, js) -> None:  # noqa: ANN001
    before = await consumer_state(js)
    fault.busy = busy(before)
    if fault.kind == "kill":
        pid = stack.services()[fault.target]["pid"]
        os.kill(pid, signal.SIGKILL)
        # the supervisor notices within 0.5 s; recovery counts until its replacement works
        deadline = time.monotonic() + 60
        while stack.services()[fault.target]["pid"] == pid and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
    elif fault.kind == "nats_restart":
        assert stack.nats is not None
        stack.nats.popen.send_signal(signal.SIGKILL if fault.target == "SIGKILL" else signal.SIGTERM)
        stack.nats.popen.wait(30)
        await asyncio.to_thread(stack.start_nats)
    else:  # graph outage: recovery counts from the restart, until the extractor moves again
        assert stack.graph is not None
        stack.graph.stop()
        await asyncio.sleep(args.graph_outage_s)
        await asyncio.to_thread(stack.start_graph)
        before = await consumer_state(js)
    fault.recovery_s = await recovered(stack, js, fault, before)


def plan(args: argparse.Namespace, rng: random.Random) -> list[Fault]:
    faults = [Fault("kill", rng.choice(PIPELINE)) for _ in range(args.kills)]
    faults += [Fault("nats_restart", "SIGKILL" if i % 2 == 0 else "SIGTERM") for i in range(args.nats_restarts)]
    if args.graph_outage_s > 0:
        faults.append(Fault("graph_outage", f"{args.graph_outage_s:g} s"))
    rng.shuffle(faults)
    return faults


# --- what a run produced -------------------------------------------------------------------
@dataclass
class Outcome:
    episodes: dict[str, Episode]
    graph: dict[str, dict[str, collections.Counter]]
    dead_letters: int
    elapsed_s: float
    faults: list[Fault] = field(default_factory=list)
    publish_retries: int = 0


async def read_episodes(js) -> tuple[dict[str, Episode], int]:  # noqa: ANN001
    """Episode id -> episode, and how many stream messages there were (a duplicate would show)."""
    info = await js.stream_info(subjects.STREAM_EPISODES)
    out: dict[str, Episode] = {}
    total = 0
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(subjects.STREAM_EPISODES, seq)
        except nats.js.errors.NotFoundError:
            continue
        ep = Episode.model_validate_json(msg.data)
        out[ep.episode_id] = ep
        total += 1
    return out, total


def norm(text: Any) -> str:
    return " ".join(str(text or "").lower().split())


def read_graph(graph_url: str) -> dict[str, dict[str, collections.Counter]]:
    """group -> {"entities", "facts", "episodes"} multisets (names and normalised triples)."""
    from falkordb import FalkorDB

    host, port = graph_url.split("://", 1)[1].rsplit(":", 1)
    db = FalkorDB(host=host, port=int(port))
    out: dict[str, dict[str, collections.Counter]] = {}
    for name in db.list_graphs():
        g = db.select_graph(name)
        entities = collections.Counter(norm(r[0]) for r in g.query("MATCH (n:Entity) RETURN n.name").result_set)
        facts = collections.Counter(
            (norm(r[0]), norm(r[1]), norm(r[2])) for r in g.query(
                "MATCH (a:Entity)-[r:RELATES_TO]->(b:Entity) WHERE r.invalid_at IS NULL AND r.expired_at IS NULL "
                "RETURN a.name, r.name, b.name").result_set)
        episodes = collections.Counter(r[0] for r in g.query("MATCH (e:Episodic) RETURN e.name").result_set)
        if entities or facts or episodes:
            out[name] = {"entities": entities, "facts": facts, "episodes": episodes}
    return out


async def replay(stack: Stack, args: argparse.Namespace, faults: list[Fault], expect_episodes: int | None) -> Outcome:
    stack.start()
    nc = await connect(stack)
    js = nc.jetstream(timeout=2.0)
    events = list(read_locomo(LOCOMO, ScopeKeys(user="chaos"), [args.sample], max_sessions=args.sessions or None))

    async def paced():  # noqa: ANN202 - a live chat: messages keep arriving while the faults happen
        for event in events:
            yield event
            await asyncio.sleep(args.pace_s)

    started = time.monotonic()
    publisher = asyncio.create_task(publish_events(js, paced()))
    rng = random.Random(args.seed)
    try:
        for fault in faults:
            await asyncio.sleep(rng.uniform(*args.fault_gap_s))
            fault.at_s = time.monotonic() - started
            await inject(stack, fault, args, js)
            print(f"  {fault.at_s:6.1f}s {fault.kind} {fault.target}: recovered in {fault.recovery_s:.1f} s"
                  f"{'' if fault.busy else ' (pipeline was idle)'}", file=sys.stderr)
        report = await publisher
        await wait_drained(js, expect_episodes, args.timeout)
        elapsed = time.monotonic() - started
        episodes, total = await read_episodes(js)
        if total != len(episodes):
            print(f"  episode stream holds {total} messages for {len(episodes)} episode ids", file=sys.stderr)
        try:
            dead = (await js.stream_info(subjects.STREAM_DLQ)).state.messages
        except nats.js.errors.NotFoundError:
            dead = 0
        graph = await asyncio.to_thread(read_graph, stack.graph_url)
        return Outcome(episodes, graph, dead, elapsed, faults, report.retried)
    finally:
        publisher.cancel()
        await nc.close()
        await asyncio.to_thread(stack.stop)


# --- comparing -----------------------------------------------------------------------------
def turns_of(outcome: Outcome) -> dict[str, tuple[str, ...]]:
    return {ep.episode_id: tuple(m.message_id for m in ep.messages) for ep in outcome.episodes.values()}


def loss_and_duplicates(outcome: Outcome, message_ids: set[str]) -> tuple[int, int]:
    """(messages in no episode, messages in two episodes of one group + Episodic nodes stored twice)."""
    per_group: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for ep in outcome.episodes.values():
        per_group[ep.group_id].update(m.message_id for m in ep.messages)
    seen = set().union(*per_group.values()) if per_group else set()
    lost = len(message_ids - seen)
    doubled = sum(n - 1 for c in per_group.values() for n in c.values() if n > 1)
    doubled += sum(n - 1 for g in outcome.graph.values() for n in g["episodes"].values() if n > 1)
    return lost, doubled


def diff(a: collections.Counter, b: collections.Counter) -> int:
    return sum(((a - b) + (b - a)).values())


def compare(base: Outcome, chaos: Outcome) -> dict[str, int]:
    groups = set(base.graph) | set(chaos.graph)
    empty = {"entities": collections.Counter(), "facts": collections.Counter(), "episodes": collections.Counter()}
    out = {"episode ids": len(set(base.episodes) ^ set(chaos.episodes))}
    bt, ct = turns_of(base), turns_of(chaos)
    out["turns"] = sum(1 for k in set(bt) | set(ct) if bt.get(k) != ct.get(k))
    for part in ("entities", "facts", "episodes"):
        out[part] = sum(diff(base.graph.get(g, empty)[part], chaos.graph.get(g, empty)[part]) for g in groups)
    return out


def show_differences(base: Outcome, chaos: Outcome, limit: int = 5) -> None:
    bt, ct = turns_of(base), turns_of(chaos)
    for k in sorted(set(bt) ^ set(ct))[:limit]:
        print(f"  turn only in {'fault-free' if k in bt else 'chaos'}: {k} {bt.get(k) or ct.get(k)}", file=sys.stderr)
    empty = collections.Counter()
    for g in sorted(set(base.graph) | set(chaos.graph)):
        for part in ("entities", "facts"):
            b, c = base.graph.get(g, {}).get(part, empty), chaos.graph.get(g, {}).get(part, empty)
            for item in list((b - c).elements())[:limit]:
                print(f"  {g} {part} only fault-free: {item}", file=sys.stderr)
            for item in list((c - b).elements())[:limit]:
                print(f"  {g} {part} only chaos: {item}", file=sys.stderr)


# --- report --------------------------------------------------------------------------------
def recovery_rows(faults: list[Fault]) -> list[tuple[str, int, int, str, str]]:
    rows = []
    for kind in ("kill", "nats_restart", "graph_outage"):
        got = [f for f in faults if f.kind == kind]
        if not got:
            continue
        times = [f.recovery_s for f in got if f.recovery_s is not None and f.recovery_s == f.recovery_s]
        rows.append((kind, len(got), sum(f.busy for f in got),
                     f"{statistics.median(times):.1f}" if times else "-", f"{max(times):.1f}" if times else "-"))
    return rows


def markdown(args: argparse.Namespace, base: Outcome, chaos: Outcome, differences: dict[str, int],
             lost: int, doubled: int, messages: int) -> str:
    kills = collections.Counter(f.target for f in chaos.faults if f.kind == "kill")
    lines = [
        f"Last run: `python bench/chaos.py --sample {args.sample} --sessions {args.sessions} --kills {args.kills} "
        f"--pace-s {args.pace_s:.2f} "
        f"--nats-restarts {args.nats_restarts} --graph-outage-s {args.graph_outage_s:g} --seed {args.seed}` "
        f"on {time.strftime('%Y-%m-%d')}: {messages} messages, {len(base.episodes)} episodes.",
        "",
        "| fault | injected | while busy | recovery median (s) | max (s) |",
        "|---|---|---|---|---|",
        *[f"| {k} | {n} | {b} | {m} | {x} |" for k, n, b, m, x in recovery_rows(chaos.faults)],
        "",
        f"Kills by service: {', '.join(f'{k} {v}' for k, v in sorted(kills.items()))}. "
        f"Publishes retried through NATS restarts: {chaos.publish_retries}.",
        "",
        "| compared with the fault-free run | differences |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in differences.items()],
        f"| lost messages | {lost} |",
        f"| duplicated (messages, Episodic nodes) | {doubled} |",
        f"| dead letters (fault-free / chaos) | {base.dead_letters} / {chaos.dead_letters} |",
    ]
    return "\n".join(lines)


def write_docs(block: str) -> None:
    text = DOCS.read_text() if DOCS.exists() else "# Reliability\n"
    new = f"{DOCS_BEGIN}\n{block}\n{DOCS_END}"
    if DOCS_BEGIN in text and DOCS_END in text:
        head, rest = text.split(DOCS_BEGIN, 1)
        text = head + new + rest.split(DOCS_END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Chaos replay\n\n" + new + "\n"
    DOCS.write_text(text)


async def main(args: argparse.Namespace) -> int:
    require_locomo(LOCOMO)
    message_ids = {e.message_id for e in read_locomo(LOCOMO, ScopeKeys(), [args.sample],
                                                    max_sessions=args.sessions or None) if hasattr(e, "message_id")}
    if args.pace_s is None:
        # spread the conversation over the fault window, so every fault meets a working pipeline
        n_faults = args.kills + args.nats_restarts
        window = n_faults * (sum(args.fault_gap_s) / 2 + 2.0) + args.graph_outage_s
        args.pace_s = window / max(1, len(message_ids))
    with LLMSimulator() as sim, tempfile.TemporaryDirectory(prefix="engram-chaos-") as tmp:
        print("fault-free run ...", file=sys.stderr)
        base = await replay(Stack(Path(tmp) / "fault-free", sim.base_url), args, [], None)
        print(f"  {len(base.episodes)} episodes in {base.elapsed_s:.0f} s", file=sys.stderr)
        faults = plan(args, random.Random(args.seed))
        print(f"chaos run: {len(faults)} faults ...", file=sys.stderr)
        chaos = await replay(Stack(Path(tmp) / "chaos", sim.base_url), args, faults, len(base.episodes))
    differences = compare(base, chaos)
    lost, doubled = loss_and_duplicates(chaos, message_ids)
    base_lost, base_doubled = loss_and_duplicates(base, message_ids)
    if any(differences.values()):
        show_differences(base, chaos)

    table = Table(title=f"chaos replay: LoCoMo {args.sample}, {args.sessions or 'all'} sessions, "
                        f"{len(message_ids)} messages, one every {args.pace_s:.2f} s")
    for col in ("fault", "injected", "while busy", "recovery median (s)", "max (s)"):
        table.add_column(col, justify="left" if col == "fault" else "right")
    for row in recovery_rows(chaos.faults):
        table.add_row(*(str(x) for x in row))
    Console(width=140).print(table)
    cmp_table = Table(title="chaos run vs fault-free run")
    cmp_table.add_column("compared")
    cmp_table.add_column("fault-free", justify="right")
    cmp_table.add_column("chaos", justify="right")
    cmp_table.add_column("differences", justify="right")
    count = {"episode ids": lambda o: len(o.episodes), "turns": lambda o: len(o.episodes),
             "entities": lambda o: sum(sum(g["entities"].values()) for g in o.graph.values()),
             "facts": lambda o: sum(sum(g["facts"].values()) for g in o.graph.values()),
             "episodes": lambda o: sum(sum(g["episodes"].values()) for g in o.graph.values())}
    for k, v in differences.items():
        cmp_table.add_row(k if k != "episodes" else "Episodic nodes", str(count[k](base)), str(count[k](chaos)), str(v))
    cmp_table.add_row("lost messages", str(base_lost), str(lost), "")
    cmp_table.add_row("duplicated", str(base_doubled), str(doubled), "")
    cmp_table.add_row("dead letters", str(base.dead_letters), str(chaos.dead_letters), "")
    cmp_table.add_row("seconds to drained", f"{base.elapsed_s:.0f}", f"{chaos.elapsed_s:.0f}", "")
    Console(width=140).print(cmp_table)
    equal = not any(differences.values()) and lost == 0 and doubled == 0
    print(f"graphs equal to the fault-free run, 0 lost, 0 duplicated: {'YES' if equal else 'NO'}")
    if args.write_docs:
        write_docs(markdown(args, base, chaos, differences, lost, doubled, len(message_ids)))
        print(f"wrote the figures into {DOCS.relative_to(ROOT)}")
    if not args.smoke:
        return 0 if equal else 1
    check = Checks()
    check.that(len(base.episodes) > 0, "the fault-free run produced no episodes")
    check.that(len(chaos.faults) == args.kills + args.nats_restarts + (args.graph_outage_s > 0), "faults injected")
    check.that(all(f.recovery_s is not None and f.recovery_s == f.recovery_s for f in chaos.faults),
               "every fault recovered")
    check.that(equal, f"chaos run differs: {differences}, lost {lost}, duplicated {doubled}")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", default="conv-26")
    parser.add_argument("--sessions", type=int, default=0, help="sessions of the conversation; 0 = all")
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--nats-restarts", type=int, default=2)
    parser.add_argument("--graph-outage-s", type=float, default=30.0)
    parser.add_argument("--fault-gap-s", type=float, nargs=2, default=(1.0, 4.0),
                        help="random pause before each fault (min max seconds)")
    parser.add_argument("--pace-s", type=float, default=None,
                        help="seconds between published events (both runs); default: spread over the fault window")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=900.0, help="give up waiting for a drained pipeline after this")
    parser.add_argument("--write-docs", action="store_true", help="rewrite the figures in docs/reliability.md")
    args = parse(parser, {"sessions": 1, "kills": 3, "nats_restarts": 1, "graph_outage_s": 3.0,
                          "fault_gap_s": [0.5, 1.5], "timeout": 240.0})
    sys.exit(asyncio.run(main(args)))
