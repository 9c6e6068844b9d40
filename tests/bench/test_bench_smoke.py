"""Every bench's ``--smoke`` (what CI runs of it, so no refactor breaks a bench unseen): the bench
runs at its smallest sizes in a subprocess with this venv's python, prints its table and ends
with ``smoke: ok`` after its own sanity checks (bench/_smoke.py). LoCoMo-dependent benches read
ENGRAM_LOCOMO and are skipped where the data is missing; the others get a path that does not
exist, which shows they do not need it. bench/extraction_cost.py has its own test
(test_extraction_cost_smoke.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench._smoke import Checks, parse
from tests.conftest import LOCOMO

ROOT = Path(__file__).resolve().parents[2]

# script, needs LoCoMo, a piece of its table's title (the table was printed)
BENCHES = [
    ("turn_detector.py", False, "turn-detector throughput: 300 messages"),
    ("extraction_embeddings.py", True, "embedding per turn, offline extractor: hashing, LoCoMo conv-26, 6 turns"),
    ("pipeline_overhead.py", True, "end-to-end turns/s, LoCoMo conv-26, 1 sessions"),
    ("scale_out.py", True, "extractor scale-out: 4 groups x 2 LoCoMo turns"),
    ("short_turn_calls.py", False, "short turns through the OpenAI path: "),
    ("dedupe_batch_quality.py", False, "edge dedupe judged alone vs 4 per call, rules model (offline), 8 labelled"),
    ("partition_collisions.py", False, "share of the slot bound, 16 groups x 2 equal turns"),
    ("summary_gate.py", True, "drift_threshold sweep"),
    ("summary_guard.py", False, "chosen threshold:"),
    ("recall_quality.py", True, "LoCoMo evidence recall (%), 1 conversation(s) (conv-26), 2 sessions"),
    ("extraction_quality.py", True, "extraction quality vs LoCoMo observations: offline rules model; 6 turns"),
    ("recall.py", True, "recall latency (ms), 10 queries per path"),
    ("restatement_threshold.py", False, "hashing: held-out pairs at threshold"),
    ("fact_changes.py", False, "fact-change invalidation, rules model"),
    ("knowledge_updates.py", False, "knowledge updates: is the current value first?"),
    ("temporal_grounding.py", True, "tuning split (conv-26): "),
    ("sessions.py", True, "LLM cost per closed segment (offline rules model)"),
    ("load.py", True, "load: 2 groups at once"),
    ("chaos.py", True, "chaos run vs fault-free run"),
]
TIMEOUT_S = {"chaos.py": 480}
"""Two `engram up` stacks, one with faults: the slowest smoke."""


@pytest.mark.parametrize(("script", "needs_locomo", "title"), BENCHES, ids=[b[0] for b in BENCHES])
def test_bench_smoke(script: str, needs_locomo: bool, title: str, tmp_path: Path) -> None:
    if needs_locomo and not LOCOMO.exists():
        pytest.skip(f"LoCoMo data not found at {LOCOMO}")
    locomo = LOCOMO if needs_locomo else tmp_path / "no-locomo.json"
    env = {**os.environ, "GRAPHITI_TELEMETRY_ENABLED": "false", "COLUMNS": "200", "ENGRAM_LOCOMO": str(locomo)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke"],
                          capture_output=True, text=True, timeout=TIMEOUT_S.get(script, 180), env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().splitlines()[-1] == "smoke: ok", done.stdout[-3000:]
    assert title in done.stdout, done.stdout[-3000:]


@pytest.mark.parametrize("script", [b[0] for b in BENCHES if b[1]])
def test_locomo_benches_read_engram_locomo(script: str, tmp_path: Path) -> None:
    missing = tmp_path / "elsewhere" / "locomo7.json"
    env = {**os.environ, "GRAPHITI_TELEMETRY_ENABLED": "false", "ENGRAM_LOCOMO": str(missing)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / script), "--smoke"],
                          capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"LoCoMo data not found at {missing}" in done.stderr, done.stderr[-2000:]


def test_smoke_checks_fail_on_missing_numbers_and_failed_rows(capsys: pytest.CaptureFixture[str]) -> None:
    check = Checks()
    check.number("p95", float("nan"))
    check.number("msg/s", 0.0, positive=True)
    check.number("ratio", "n/a")
    check.that(False, "2 order violations")
    check.number("fine", 1.5, positive=True)
    assert check.verdict() == 1
    out = capsys.readouterr().out
    assert out.startswith("smoke: FAILED (p95: nan; msg/s: 0.0 (expected > 0); ratio: 'n/a' is not a number; "
                          "2 order violations)")
    assert Checks().verdict() == 0
    assert capsys.readouterr().out == "smoke: ok\n"


def test_smoke_sizes_are_defaults_that_the_command_line_overrides() -> None:
    import argparse

    def parser() -> argparse.ArgumentParser:
        p = argparse.ArgumentParser()
        p.add_argument("--rounds", type=int, default=3)
        p.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
        return p

    sizes = {"rounds": 1, "sizes": [100]}
    assert vars(parse(parser(), sizes, [])) == {"rounds": 3, "sizes": [1000, 10000], "smoke": False}
    assert vars(parse(parser(), sizes, ["--smoke"])) == {"rounds": 1, "sizes": [100], "smoke": True}
    assert vars(parse(parser(), sizes, ["--smoke", "--rounds", "2"])) == {"rounds": 2, "sizes": [100], "smoke": True}
