"""`pip install .` installs a wheel, not the source tree: it must carry templates/ and examples/, and
engram must find them inside the installed package (issue 23: a wheel without templates/ turned the
default extraction preprocessing off without a word, and `engram demo` had no example to ingest).

The fast part: build the wheel from a copy of the sources, compare its package data with the
repository's directories, unpack it and run the extractor's template start-up and the demo's
example reading from it, with no source checkout importable. The whole thing (a fresh venv on
Python 3.12 installing this wheel, `engram up`, one turn, recall, `engram demo`, the default
template in the extractor's start-up log) is tests/smoke_install.sh, which CI runs (.ci/run).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLED = ("templates", "examples")
SOURCES = ("pyproject.toml", "README.md", "engram", "engram_client", "schemas", "services", *BUNDLED)


def _files(directory: Path) -> dict[str, bytes]:
    """Every file under a directory, by path relative to it (what the wheel must carry)."""
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel `pip install .` builds, from a copy of the sources (links kept as links, no stale
    build/ directory of the checkout). No build isolation: the test venv's setuptools, no download."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, src / name)
    out = tmp / "dist"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                            "--wheel-dir", str(out), str(src)], capture_output=True, text=True, timeout=300)
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-3000:]
    [whl] = out.glob("engram-*.whl")
    return whl


def test_wheel_carries_templates_and_examples(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        for directory in BUNDLED:
            expected = _files(ROOT / directory)
            assert expected, f"{directory}/ is empty in the repository"
            for relative, content in expected.items():
                member = f"engram/{directory}/{relative}"
                assert member in names, f"{member} is missing from {wheel.name}"
                assert archive.read(member) == content, f"{member} differs from {directory}/{relative}"
    assert "engram/templates/default-session-turn.md" in names and "engram/examples/coding-session.jsonl" in names
    # package data of engram, never top-level directories in site-packages
    assert not {n for n in names if n.split("/", 1)[0] in BUNDLED}


# Runs in a child interpreter with only the unpacked wheel importable for engram, schemas and
# services: the test venv's editable install puts a source checkout on sys.path, which is removed.
_INSTALLED = r"""
import json, sys
from pathlib import Path

site = Path(sys.argv[1])
checkout = lambda p: any((Path(p) / pkg).exists() for pkg in ("engram", "schemas", "services"))
sys.path[:] = [str(site)] + [p for p in sys.path if p and not checkout(p)]

from engram.cli import demo
from engram.publishing.ingest import read_jsonl
from engram.schemas import ScopeKeys
from engram.services.extractor.preprocessing import DEFAULT_TEMPLATE, ExtractionSettings, resolve_template, validate_at_startup

settings = ExtractionSettings()
text = validate_at_startup(settings)
_, template = resolve_template(DEFAULT_TEMPLATE, settings)
events = list(read_jsonl(demo.EXAMPLE, ScopeKeys(workspace="examples/engram", user="demo-user")))
modules = {name: module.__file__ for name, module in sys.modules.items()
           if name.split(".")[0] in ("engram", "schemas", "services") and getattr(module, "__file__", None)}
print(json.dumps({"preprocessing": text, "template": str(template), "example": str(demo.EXAMPLE),
                  "events": len(events), "modules": modules}))
"""


def test_installed_wheel_finds_its_templates_and_examples(wheel: Path, tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)  # a pure-Python wheel's install is exactly its files under site-packages
    work, home = tmp_path / "work", tmp_path / "home"
    work.mkdir()
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_") and k != "PYTHONPATH"}
    env.update(HOME=str(home), GRAPHITI_TELEMETRY_ENABLED="false")
    child = subprocess.run([sys.executable, "-c", _INSTALLED, str(site)], cwd=work, env=env, capture_output=True,
                           text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-3000:]
    got = json.loads(child.stdout.splitlines()[-1])
    outside = {name: path for name, path in got["modules"].items() if not Path(path).is_relative_to(site)}
    assert got["modules"] and not outside, f"imported from outside the unpacked wheel: {outside}"
    default = site / "engram" / "templates" / "default-session-turn.md"
    assert Path(got["template"]) == default
    assert got["preprocessing"] == default.read_text(encoding="utf-8").strip()
    assert Path(got["example"]) == site / "engram" / "examples" / "coding-session.jsonl"
    lines = (ROOT / "examples" / "coding-session.jsonl").read_text(encoding="utf-8").splitlines()
    assert got["events"] >= sum(1 for line in lines if line.strip())  # every message (plus session closes)
