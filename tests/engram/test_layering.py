"""Where a concern lives, and which way imports point.

One import name, ``engram``, with the layers as its sub-packages. Arrows point down:

    engram.cli                        the command line (`engram serve` runs a service)
    engram.stack                      the local stack `engram up` runs (services as processes)
    engram.services                   the services (the repository's services/ folder)
    engram.publishing                 writing in from outside: ingest, promote, triplets
    engram.runtime, engram.graph,     the NATS runtime; graph drivers and ontology;
    engram.models                     LLM clients and embedders
    engram.text, engram.observability text handling; tracing and pipeline metrics
    engram.settings, .compat, .tasks, .bundled   the basics every layer may use
    engram.schemas                    the contract (the repository's schemas/ folder): imports
                                      nothing of engram, only itself, by relative imports

Every import statement (top level or inside a function, which is how an upward import usually
hides, and ``importlib.import_module("...")`` with a literal) is parsed with ``ast``. The
repository's ``schemas`` and ``services`` folders are only ever imported as ``engram.schemas`` and
``engram.services``: a second name for the same files would load the contract twice (two
``ChatMessage`` classes in one process).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENGRAM = REPO / "engram"

BASICS = {"settings", "compat", "tasks", "bundled"}
"""engram's top-level modules: any layer may import them; they import no layer."""

MAY_IMPORT: dict[str, set[str]] = {
    "schemas": set(),
    "text": set(),
    "observability": set(),
    "models": {"schemas", "text", "observability"},
    "graph": {"schemas", "text", "observability", "models"},
    "runtime": {"schemas", "text", "observability"},
    "publishing": {"schemas", "text", "observability", "runtime"},
    "services": {"schemas", "text", "observability", "models", "graph", "runtime", "publishing"},
    "stack": {"schemas", "text", "observability", "runtime"},
    "cli": {"schemas", "text", "observability", "models", "graph", "runtime", "publishing", "stack", "services"},
}
"""The layers of engram each layer may import (besides itself and BASICS)."""

SOURCE_DIRS = ("engram", "schemas", "services", "engram_client", "tests", "bench", "tools", "clients")


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            if node.module == "engram":  # `from engram import tracing` names a module too
                found += [(node.lineno, f"engram.{alias.name}") for alias in node.names]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def _layer_of(path: Path) -> str | None:
    """The layer a file of the engram package belongs to (None: a basic top-level module)."""
    parts = path.relative_to(REPO).parts
    if parts[0] in ("schemas", "services"):
        return parts[0]
    if parts[0] == "engram" and len(parts) > 2:
        return parts[1]
    return None


def _engram_files() -> list[Path]:
    files = [p for p in ENGRAM.rglob("*.py") if p.relative_to(ENGRAM).parts[0] not in ("schemas", "services")]
    return sorted(files + list((REPO / "schemas").rglob("*.py")) + list((REPO / "services").rglob("*.py")))


def layer_violations() -> list[str]:
    bad = []
    for path in _engram_files():
        layer = _layer_of(path)
        for lineno, module in _imported_modules(path):
            parts = module.split(".")
            if parts[0] != "engram" or len(parts) < 2:
                continue
            target = parts[1]
            where = f"{path.relative_to(REPO)}:{lineno} imports {module}"
            if layer is None:
                if target not in BASICS:
                    bad.append(f"{where} (a basic module imports no layer)")
            elif layer == "schemas":
                bad.append(f"{where} (the contract imports nothing of engram; itself relatively)")
            elif target != layer and target not in BASICS and target not in MAY_IMPORT[layer]:
                bad.append(where)
    return bad


def test_imports_point_down() -> None:
    assert layer_violations() == []


def test_every_layer_is_named_in_the_rule() -> None:
    packages = {p.name for p in ENGRAM.iterdir() if (p / "__init__.py").is_file()}
    modules = {p.stem for p in ENGRAM.glob("*.py")} - {"__init__"}
    assert packages == set(MAY_IMPORT)
    assert modules == BASICS


def test_schemas_and_services_have_one_import_name() -> None:
    bad = []
    for folder in SOURCE_DIRS:
        for path in sorted((REPO / folder).rglob("*.py")):
            if path.relative_to(REPO).parts[:2] in (("engram", "schemas"), ("engram", "services")):
                continue  # the same files as schemas/ and services/
            for lineno, module in _imported_modules(path):
                if module.split(".")[0] in ("schemas", "services"):
                    bad.append(f"{path.relative_to(REPO)}:{lineno} imports {module}")
    assert bad == []


def _schema_imports(path: Path) -> set[str]:
    """The contract modules one contract module imports, TYPE_CHECKING blocks included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found & {p.stem for p in (REPO / "schemas").glob("*.py")}


def test_the_contract_has_no_import_circle() -> None:
    graph = {p.stem: _schema_imports(p) - {p.stem} for p in (REPO / "schemas").glob("*.py")}
    done: set[str] = set()

    def visit(module: str, path: tuple[str, ...]) -> None:
        assert module not in path, f"import circle: {' -> '.join(path + (module,))}"
        if module in done:
            return
        for child in sorted(graph[module]):
            visit(child, path + (module,))
        done.add(module)

    for module in sorted(graph):
        visit(module, ())


def test_the_checks_see_what_they_must(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from services.x import y\n    import importlib\n"
                      "    importlib.import_module('services.z')\n    from engram import tracing\n")
    assert sorted(m for _, m in _imported_modules(source)) == [
        "engram", "engram.tracing", "importlib", "services.x", "services.z"]
    assert _layer_of(REPO / "engram" / "text" / "temporal.py") == "text"
    assert _layer_of(REPO / "engram" / "settings.py") is None
    assert _layer_of(REPO / "services" / "recall" / "app.py") == "services"


def test_tests_mirror_the_layers() -> None:
    """tests/engram/<layer>/ holds the tests of engram/<layer>/: a newcomer finds both in one step."""
    test_dirs = {p.name for p in (REPO / "tests" / "engram").iterdir() if (p / "__init__.py").is_file()}
    assert test_dirs <= set(MAY_IMPORT), test_dirs - set(MAY_IMPORT)
    assert not [p.name for p in (REPO / "tests" / "engram").glob("test_*.py")
                if p.stem.removeprefix("test_") in {m for layer in MAY_IMPORT for m in _modules_of(layer)}]


def _modules_of(layer: str) -> set[str]:
    return {p.stem for p in (ENGRAM / layer).glob("*.py")} - {"__init__", "__main__"} if (ENGRAM / layer).is_dir() else set()
