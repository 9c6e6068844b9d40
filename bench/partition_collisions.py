"""Benchmark (simulation): why more partitions do not give per-group order at the slots' rate.

The alternative to engram/runtime/group_order.py that needs no new code is more partitions: hash groups
onto L partition durables with ``max_ack_pending=1`` each and let replicas pull from all of them.
Groups that hash onto the same partition then run one after the other, whatever the free slots.
This bench schedules that exactly (no NATS, no LLM: a discrete-event simulation with the same
hash nats-server's ``partition()`` uses, FNV-1a 32 of the group id mod L) and reports the share
of the slot bound each partition count reaches, next to per-group order (one chain per group,
what engram does): ``G`` groups with ``K`` turns each, published turn by turn, ``S`` slots, every
turn the same length. Group ids are random per seed; medians and the 10th percentile over seeds.

The same machine's NATS costs of many partitions are in docs/architecture.md ("Extraction in
flight"): 256 durables take 0.66 s to create and one CONSUMER.LIST of them is 144 KB.

    python bench/partition_collisions.py [--groups 64] [--turns 4] [--slots 8 16 32]
                                         [--partitions 4 16 64 256 1024] [--seeds 200]
    python bench/partition_collisions.py --smoke
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._smoke import Checks, parse  # noqa: E402
from bench.scale_out import nats_partition  # noqa: E402


def share_of_bound(groups: list[str], turns: int, slots: int, partitions: int | None) -> float:
    """Greedy list scheduling of equal turns; a lane (a partition, or a group when
    ``partitions`` is None) runs one turn at a time. Returns bound / makespan."""
    lanes: dict[object, list[str]] = {}
    for _ in range(turns):  # published turn by turn, round-robin over groups
        for g in groups:
            lanes.setdefault(g if partitions is None else nats_partition(g, partitions), []).append(g)
    order = list(lanes)  # the order lanes were first seen (a puller's rotating sweep)
    busy: set[object] = set()
    events: list[tuple[float, int, object]] = []
    clock, free, done, tick = 0.0, slots, 0, 0
    total = len(groups) * turns
    while done < total:
        for lane in order:
            if free == 0:
                break
            if lanes[lane] and lane not in busy:
                lanes[lane].pop(0)
                busy.add(lane)
                free -= 1
                tick += 1
                heapq.heappush(events, (clock + 1.0, tick, lane))
        clock, _, lane = heapq.heappop(events)
        busy.discard(lane)
        free += 1
        done += 1
    return (total / slots) / clock


def main(args: argparse.Namespace) -> int:
    rows = [*(str(p) for p in args.partitions), "per group"]
    print(f"share of the slot bound, {args.groups} groups x {args.turns} equal turns, "
          f"median (p10) of {args.seeds} random group-id sets")
    table = Table()
    table.add_column("partitions", justify="right")
    for s in args.slots:
        table.add_column(f"{s} slots", justify="right")
    results: dict[tuple[str, int], list[float]] = {}
    for row in rows:
        cells = []
        for s in args.slots:
            shares = []
            for seed in range(args.seeds):
                rng = random.Random(seed)
                groups = [f"engram_session_{rng.getrandbits(64):016x}" for _ in range(args.groups)]
                shares.append(share_of_bound(groups, args.turns, s, None if row == "per group" else int(row)))
            results[(row, s)] = shares
            p10 = sorted(shares)[len(shares) // 10]
            cells.append(f"{statistics.median(shares):.0%} ({p10:.0%})")
        table.add_row(row, *cells)
    Console(width=160).print(table)
    if not args.smoke:
        return 0
    check = Checks()
    for (row, s), shares in results.items():
        check.that(all(0 < x <= 1.0 + 1e-9 for x in shares), f"{row} partitions, {s} slots: shares in (0, 1]")
    for s in args.slots:
        check.that(statistics.median(results[("per group", s)]) >= max(statistics.median(results[(str(p), s)])
                                                                        for p in args.partitions),
                   f"{s} slots: per-group order at least as good as any partition count")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=64)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--slots", type=int, nargs="+", default=[8, 16, 32])
    parser.add_argument("--partitions", type=int, nargs="+", default=[4, 16, 64, 256, 1024])
    parser.add_argument("--seeds", type=int, default=200)
    sys.exit(main(parse(parser, {"groups": 16, "turns": 2, "slots": [4, 8], "partitions": [4, 64], "seeds": 5})))
