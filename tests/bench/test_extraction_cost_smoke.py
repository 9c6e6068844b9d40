"""bench/extraction_cost.py --smoke (what CI runs of it): offline, and against an OpenAI-compatible
endpoint (a scripted server on loopback answering with the rules extractor) whose first answer is
cut by max_tokens: the table counts the truncated and retried call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import LOCOMO
from tests.engram.models.openai_fake import FakeOpenAI, running

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> str:
    if not LOCOMO.exists():
        pytest.skip(f"LoCoMo data not found at {LOCOMO}")
    env = {**os.environ, "GRAPHITI_TELEMETRY_ENABLED": "false", "COLUMNS": "200", "ENGRAM_LOCOMO": str(LOCOMO)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "extraction_cost.py"), "--smoke", *args],
                          capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "smoke: ok" in done.stdout
    return done.stdout


def row(out: str, variant: str) -> list[str]:
    line = next(line for line in out.splitlines() if variant in line and "│" in line)
    return [cell.strip() for cell in line.split("│")[1:-1]]


def test_smoke_offline() -> None:
    out = bench()
    for variant in ("upstream REST", "engram dual-pass", "engram single-pass"):
        cells = row(out, variant)
        assert float(cells[1]) > 0, cells  # calls/turn
        assert cells[6:10] == ["0", "0", "0", "0/4"], cells  # failed, retried, truncated, failed turns


def test_smoke_against_an_openai_compatible_endpoint() -> None:
    with running(FakeOpenAI()) as fake:
        fake.script = ["length"]  # the first answer is cut, the tighter retry succeeds
        out = bench("--llm-base-url", fake.base_url, "--llm-model", "fake", "--variants", "single")
    cells = row(out, "engram single-pass")
    assert float(cells[1]) > 0, cells
    assert cells[6:10] == ["0", "1", "1", "0/4"], cells  # failed, retried, truncated, failed turns
    assert "fake at http://127.0.0.1" in out
    assert "truncated answers by prompt: extract_nodes_and_edges.extract_message 1" in out
    assert {b["model"] for b in fake.requests} == {"fake"}
