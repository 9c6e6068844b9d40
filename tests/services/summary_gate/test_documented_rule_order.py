"""docs/architecture.md lists the summary gate's rules in the order `gate.decide` checks them (the
doc once put `staleness` after the burst rules while the code checks it before the hash)."""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from pathlib import Path

from engram.services.summary_gate import gate

ROOT = Path(__file__).resolve().parents[3]
REASONS = {"new_entity", "polarity", "staleness", "unchanged_hash", "burst", "drift", "low_drift"}


def first_occurrences(names: list[str]) -> list[str]:
    return list(dict.fromkeys(n for n in names if n in REASONS))


def test_architecture_lists_the_rules_in_code_order() -> None:
    tree = ast.parse(textwrap.dedent(inspect.getsource(gate.decide)))
    # the reason literals in source order (ast.walk alone is breadth-first)
    literals = sorted((node.lineno, node.col_offset, node.value) for node in ast.walk(tree)
                      if isinstance(node, ast.Constant) and isinstance(node.value, str))
    in_code = first_occurrences([value for _, _, value in literals])
    doc = (ROOT / "docs" / "architecture.md").read_text()
    paragraph = doc.split("The rules are pure functions in `gate.py`", 1)[1].split("\n\n", 1)[0]
    in_doc = first_occurrences(re.findall(r"`([a-z_]+)`", paragraph))
    assert in_code == ["new_entity", "polarity", "staleness", "unchanged_hash", "burst", "drift", "low_drift"]
    assert in_doc == in_code
