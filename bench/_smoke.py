"""``--smoke``, shared by the benches: CI's quick run of a bench (tests/bench/test_bench_smoke.py).

A smoke run is the bench itself at the smallest sizes that still take every code path and print
the same tables; it ends with ``smoke: ok`` (exit 0) or ``smoke: FAILED (...)`` (exit 1) after
sanity checks on the results: numbers present (finite), no failed rows (dead letters, order
violations, missing rows). It checks that the bench works, never how fast: timings at these
sizes on a shared CI machine say nothing.
"""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any


def parse(parser: argparse.ArgumentParser, smoke: dict[str, Any], argv: list[str] | None = None) -> argparse.Namespace:
    """Add ``--smoke`` to ``parser`` and parse; with ``--smoke`` the sizes in ``smoke`` become the
    defaults (options given on the command line still win)."""
    sizes = ", ".join(f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
                      for k, v in smoke.items())
    parser.add_argument("--smoke", action="store_true",
                        help=f"CI's quick run ({sizes}); ends with 'smoke: ok' after checking the output")
    known, _ = parser.parse_known_args(argv)
    if known.smoke:
        parser.set_defaults(**smoke)
    return parser.parse_args(argv)


def require_locomo(path: Path) -> None:
    """Stop with a clear message (not a traceback) when the LoCoMo file is missing."""
    if not path.exists():
        raise SystemExit(f"LoCoMo data not found at {path}: set ENGRAM_LOCOMO to locomo7.json")


def locomo_path() -> Path:
    """Where the benches read LoCoMo: ENGRAM_LOCOMO, else ../shared/data/locomo/locomo7.json (as tests/conftest.py)."""
    return Path(os.environ.get("ENGRAM_LOCOMO",
                               Path(__file__).resolve().parents[2] / "shared" / "data" / "locomo" / "locomo7.json"))


class Checks:
    """Problems found in a smoke run's results; ``verdict()`` prints the last line and gives the exit code."""

    def __init__(self) -> None:
        self.problems: list[str] = []

    def that(self, ok: bool, problem: str) -> None:
        if not ok:
            self.problems.append(problem)

    def number(self, label: str, value: Any, positive: bool = False) -> None:
        """``value`` is a finite number (and > 0 with ``positive``)."""
        try:
            x = float(value)
        except (TypeError, ValueError):
            self.problems.append(f"{label}: {value!r} is not a number")
            return
        if not math.isfinite(x):
            self.problems.append(f"{label}: {x}")
        elif positive and x <= 0:
            self.problems.append(f"{label}: {x} (expected > 0)")

    def verdict(self) -> int:
        if self.problems:
            print(f"smoke: FAILED ({'; '.join(self.problems)})")
            return 1
        print("smoke: ok")
        return 0
