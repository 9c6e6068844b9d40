"""Arrows point down: services -> engram -> schemas.

Every import statement in engram/ and schemas/ (top level or inside a function, which is how an
upward import usually hides) is parsed with ``ast``; none may name ``services``, and schemas/
may not name ``engram`` either. A shared helper belongs in the lower layer (engram/ or schemas/).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
FORBIDDEN = {"engram": ("services",), "schemas": ("services", "engram")}


def _imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                found.append((node.lineno, node.args[0].value))
    return found


def upward_imports(package: str) -> list[str]:
    bad = []
    for path in sorted((REPO / package).rglob("*.py")):
        for lineno, module in _imported_modules(path):
            if module.split(".")[0] in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(REPO)}:{lineno} imports {module}")
    return bad


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_upward_imports(package: str) -> None:
    assert upward_imports(package) == []


def test_the_check_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from services.x import y\n    import importlib\n"
                      "    importlib.import_module('services.z')\n")
    assert [m for _, m in _imported_modules(source)] == ["services.x", "importlib", "services.z"]
