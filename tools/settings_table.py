"""Write docs/settings.md: every ENGRAM_* setting in one table, generated from the code.

    python tools/settings_table.py            # rewrite docs/settings.md
    python tools/settings_table.py --check    # exit 1 when docs/settings.md is out of date

Settings live next to what they configure (pydantic-settings classes in engram/settings.py,
engram/models/factory.py and the service modules), so no hand-written list can stay complete.
This finds every ``BaseSettings`` subclass in engram/ and services/ by reading the source (an
``ast`` walk, so a new class is found without being registered anywhere), imports its module and
renders each field: the environment variable, its type and bounds, its default and its
description. tests/tools/test_settings_table.py fails when the file is out of date, when a setting has
no description, and when the docs name an ENGRAM_* variable that no setting reads.

It lives in tools/, not engram/, because it imports the service modules (engram/ must not).
"""

from __future__ import annotations

import argparse
import ast
import enum
import importlib
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel, SecretStr  # noqa: E402
from pydantic_core import PydanticUndefined  # noqa: E402
from pydantic_settings import BaseSettings  # noqa: E402

OUT = ROOT / "docs" / "settings.md"
PACKAGES = ("engram", "services")

# Defaults computed at run time: what they are in words (the computed value depends on the machine).
# A new default_factory must be added here (settings_rows raises until it is).
FACTORY_DEFAULTS: dict[tuple[str, str], str] = {
    ("EngramSettings", "data_dir"): "`$XDG_DATA_HOME/engram` (`~/.local/share/engram`)",
    ("ExtractionSettings", "project_dir"): "the working directory",
    ("ExtractionSettings", "global_dir"): "`~/.graphiti/templates`",
    ("ExtractionSettings", "builtin_dir"): "`engram/templates` of the installed package (the repository's `templates/`)",
    ("OntologySettings", "workspaces"): "`{}` (none)",
}


@dataclass(frozen=True)
class Row:
    env: str
    type: str
    default: str
    description: str
    defined_in: str


def _module_name(path: Path) -> str:
    """services/x/y.py is engram.services.x.y: the installed name, never a second one."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(("engram", *parts) if parts[0] in ("services", "schemas") else parts)


def settings_classes() -> list[type[BaseSettings]]:
    """Every BaseSettings subclass defined in engram/ and services/, in file order."""
    found: list[type[BaseSettings]] = []
    first = ROOT / "engram" / "settings.py"  # the process-wide settings lead the table
    # engram/services is a link to services/ (one import name): each file once, by its folder
    paths = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
             if path.relative_to(ROOT).parts[:2] not in (("engram", "services"), ("engram", "schemas"))]
    for path in sorted(paths, key=lambda p: p != first):
        tree = ast.parse(path.read_text(), filename=str(path))
        names = [node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                 and any(ast.unparse(base).endswith("BaseSettings") for base in node.bases)]
        if names:
            module = importlib.import_module(_module_name(path))
            found += [getattr(module, name) for name in names]
    return found


def _bounds(metadata: list[Any]) -> str:
    signs = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<", "min_length": "length ≥", "max_length": "length ≤",
             "pattern": "matches"}
    parts = []
    for item in metadata:
        for attr, sign in signs.items():
            value = getattr(item, attr, None)
            if value is not None:
                parts.append(f"{sign} `{value}`" if attr == "pattern" else f"{sign} {value:g}"
                             if isinstance(value, float) else f"{sign} {value}")
    return ", ".join(parts)


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        named = [type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or unset" if type(None) in args else "")
    if origin in (dict, list):
        return f"JSON {origin.__name__}[{', '.join(type_name(a) for a in args)}]"
    if annotation is SecretStr:
        return "str (secret)"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return "one of " + ", ".join(f"`{m.value}`" for m in annotation)
    return getattr(annotation, "__name__", str(annotation))


def default_text(cls: type[BaseModel], name: str, field: Any) -> str:
    if field.default_factory is not None:
        if field.default_factory in (dict, list):
            return f"`{field.default_factory()}`"
        key = (cls.__name__, name)
        if key not in FACTORY_DEFAULTS:
            raise ValueError(f"{cls.__name__}.{name}: add its computed default to FACTORY_DEFAULTS in {__file__}")
        return FACTORY_DEFAULTS[key]
    value = field.default
    if value is None or value is PydanticUndefined:
        return "unset"
    if isinstance(value, SecretStr):
        value = value.get_secret_value()
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, str) and value == "":
        return '`""`'
    return f"`{value:g}`" if isinstance(value, float) and value.is_integer() is False else f"`{value}`"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_rows(classes: list[type[BaseSettings]] | None = None) -> list[Row]:
    rows: list[Row] = []
    for cls in classes if classes is not None else settings_classes():
        config = cls.model_config
        prefix = config.get("env_prefix", "")
        delimiter = config.get("env_nested_delimiter")
        where = f"`{cls.__module__}.{cls.__name__}`"
        for name, field in cls.model_fields.items():
            annotation = field.annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseSettings):
                continue  # a settings class of its own (its own prefix): listed where it is defined
            if isinstance(annotation, type) and issubclass(annotation, BaseModel) and delimiter:
                nested_where = f"`{annotation.__module__}.{annotation.__name__}`"
                for sub_name, sub in annotation.model_fields.items():
                    rows.append(Row(
                        env=f"{prefix}{name}{delimiter}{sub_name}".upper(),
                        type=_cell(", ".join(filter(None, [type_name(sub.annotation), _bounds(sub.metadata)]))),
                        default=default_text(annotation, sub_name, sub),
                        description=_cell(sub.description or ""),
                        defined_in=nested_where,
                    ))
                continue
            bounds = _bounds(field.metadata)
            # a field read from one variable of its own name (validation_alias) is listed under it
            env = field.validation_alias if isinstance(field.validation_alias, str) else f"{prefix}{name}"
            rows.append(Row(
                env=env.upper(),
                type=_cell(type_name(annotation) + (f", {bounds}" if bounds else "")),
                default=default_text(cls, name, field),
                description=_cell(field.description or ""),
                defined_in=where,
            ))
    return rows


def render(rows: list[Row]) -> str:
    lines = [
        "# Settings",
        "",
        "Every engram setting is an environment variable (pydantic-settings); the same variables configure",
        "`engram up`, `engram serve NAME`, docker-compose and Kubernetes. This file is generated from the",
        "settings classes by `python tools/settings_table.py` (`make settings`): do not edit it by hand;",
        "`tests/tools/test_settings_table.py` fails when it is out of date. Unset means: no value (the",
        "description says what engram does then). JSON values (dicts) are given as JSON text.",
        "",
    ]
    by_class: dict[str, list[Row]] = {}
    for row in rows:
        by_class.setdefault(row.defined_in, []).append(row)
    for where, class_rows in by_class.items():
        lines += [f"## {where}", "", "| variable | type | default | what it does |", "|---|---|---|---|"]
        lines += [f"| `{r.env}` | {r.type} | {r.default} | {r.description} |" for r in class_rows]
        lines.append("")
    lines += [
        "Outside the settings classes: `ENGRAM_LOCOMO` (benchmarks and tests: the LoCoMo file, default",
        "`../shared/data/locomo/locomo7.json`) and graphiti's own `GRAPHITI_TELEMETRY_ENABLED` (engram's",
        "commands, images and manifests set it to `false`).",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when docs/settings.md is out of date")
    args = parser.parse_args(argv)
    text = render(settings_rows())
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python tools/settings_table.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
