"""``make bench`` (bench/run_all.py): every bench in bench/ is run by it and by CI's smoke tests, and
one run writes every bench's tables into one file with the command, date, commit and machine load."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bench.run_all import BENCHES
from tests.bench.test_bench_smoke import BENCHES as SMOKE_TESTED

ROOT = Path(__file__).resolve().parents[2]
# Benches whose smoke run has a test file of its own.
OWN_SMOKE_TEST = {
    "extraction_cost.py": ROOT / "tests" / "bench" / "test_extraction_cost_smoke.py",
    "embedders.py": ROOT / "tests" / "bench" / "test_embedders_smoke.py",
    "dedupe_threshold.py": ROOT / "tests" / "bench" / "test_dedupe_threshold.py",
    "node_dedupe_threshold.py": ROOT / "tests" / "bench" / "test_node_dedupe_threshold.py",
}


NOT_BENCHES = {
    "run_all.py": "the runner itself",
    "llm_simulator.py": "the misbehaving LLM server that bench/chaos.py and the LLM fault tests use",
    "reference_llm.py": "the LLM client answering from LoCoMo's observations (recall_quality.py --facts reference)",
    "local_llm.py": "serves a small GGUF model with xllamacpp for extraction_quality.py runs outside CI",
    "extraction_prompt_ab.py": "graphiti's vs engram's combined extraction prompt with a real model, outside CI",
}


def bench_scripts() -> set[str]:
    """Every runnable bench: bench/*.py but helpers (_*.py, __init__.py, NOT_BENCHES)."""
    return {p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_") and p.name not in NOT_BENCHES}


def test_every_bench_is_run_by_make_bench_and_smoke_tested() -> None:
    assert {script for script, _ in BENCHES} == bench_scripts()
    smoke_tested = {script for script, _, _ in SMOKE_TESTED} | {s for s, test in OWN_SMOKE_TEST.items() if test.exists()}
    assert smoke_tested == bench_scripts()


def test_make_bench_and_bench_smoke_go_through_the_runner() -> None:
    makefile = (ROOT / "Makefile").read_text()
    bench = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    smoke = makefile.split("\nbench-smoke:", 1)[1].split("\n\n", 1)[0]
    assert "bench/run_all.py" in bench and "--smoke" not in bench
    assert "bench/run_all.py --smoke" in smoke


def run_all(tmp_path: Path, *args: str, locomo: Path | None = None) -> tuple[subprocess.CompletedProcess[str], str]:
    out = tmp_path / "results.md"
    env = {**os.environ, "ENGRAM_LOCOMO": str(locomo or tmp_path / "no-locomo.json")}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "run_all.py"), *args, "--out", str(out)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    return done, out.read_text() if out.exists() else ""


def test_one_file_holds_every_table_with_command_date_and_load(tmp_path: Path) -> None:
    done, text = run_all(tmp_path, "--smoke", "--only", "summary_guard", "fact_changes.py")
    assert done.returncode == 0, done.stdout + done.stderr
    assert text.startswith("# Benchmark results\n")
    for field in ("- command: `python bench/run_all.py --smoke --only summary_guard fact_changes.py --out ",
                  "- date: 20", "- commit: ", " cores, Python 3.", f"- run: complete (a subset: 2 of the {len(BENCHES)} benches, --only); 0 failed;"):
        assert field in text, field
    assert "| summary_guard.py | `python bench/summary_guard.py --smoke` | 0 |" in text
    assert "## bench/summary_guard.py" in text and "## bench/fact_changes.py" in text
    # the benches' own tables, as they printed them
    assert "chosen threshold:" in text and "fact-change invalidation, rules model" in text
    assert text.count("smoke: ok") == 2
    assert "load before" in text


def test_a_failing_bench_is_recorded_and_fails_the_run_without_stopping_the_others(tmp_path: Path) -> None:
    # temporal_grounding needs LoCoMo: pointed at a missing file it exits 1; summary_guard still runs after it.
    done, text = run_all(tmp_path, "--smoke", "--only", "temporal_grounding", "summary_guard")
    assert done.returncode == 1
    assert "FAILED: temporal_grounding.py" in done.stdout
    assert "| temporal_grounding.py | `python bench/temporal_grounding.py --smoke` | 1 |" in text
    assert "LoCoMo data not found at" in text  # its stderr, kept in the file
    assert f"- run: complete (a subset: 2 of the {len(BENCHES)} benches, --only); 1 failed;" in text
    assert "chosen threshold:" in text


def test_unknown_bench_names_are_refused(tmp_path: Path) -> None:
    done, text = run_all(tmp_path, "--only", "no_such_bench")
    assert done.returncode != 0 and "unknown bench(es): no_such_bench" in done.stderr
    assert text == ""
