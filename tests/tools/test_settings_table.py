"""docs/settings.md is the one table of every ENGRAM_* setting, generated from the settings classes
by tools/settings_table.py: it must be current, complete (every BaseSettings class in engram/ and
services/), described (no setting without a description), and the docs must not name a variable
that no setting reads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import pytest
from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram.schemas import subjects
from tools import settings_table
from tools.settings_table import render, settings_classes, settings_rows

ROOT = Path(__file__).resolve().parents[2]


def test_docs_settings_md_is_current() -> None:
    assert (ROOT / "docs" / "settings.md").read_text() == render(settings_rows()), (
        "docs/settings.md is out of date: run python tools/settings_table.py"
    )
    assert settings_table.main(["--check"]) == 0


def test_every_settings_class_is_found() -> None:
    found = {f"{cls.__module__}.{cls.__name__}" for cls in settings_classes()}
    assert found >= {
        "engram.settings.EngramSettings", "engram.settings.TurnDetectorSettings",
        "engram.models.factory.LLMSettings", "engram.models.factory.EmbedderSettings",
        "engram.services.recall.app.RecallSettings", "engram.services.gateway.settings.GatewaySettings",
        "engram.services.summary_gate.gate.GateSettings", "engram.services.extractor.preprocessing.ExtractionSettings",
    }
    # and nothing but settings classes
    assert all(issubclass(cls, BaseSettings) for cls in settings_classes())


def test_every_setting_has_a_description() -> None:
    undescribed = [row.env for row in settings_rows() if not row.description]
    assert undescribed == []


def test_docs_name_only_variables_that_exist() -> None:
    known = {row.env for row in settings_rows()}
    streams = {subjects.STREAM_IN, subjects.STREAM_EPISODES, subjects.STREAM_DLQ, subjects.STREAM_DELTAS,
               subjects.STREAM_SUMMARY, subjects.STREAM_SESSIONS, subjects.STREAM_SCHED}
    outside = {"ENGRAM_LOCOMO"}  # the benches' and tests' LoCoMo file, not a setting
    # the fuzz and isolation tests' sizes (tests/fuzz, tests/services/test_isolation.py), not settings
    outside |= {"ENGRAM_FUZZ_EXAMPLES", "ENGRAM_FUZZ_REPORT", "ENGRAM_ISOLATION_EXAMPLES"}
    # docker compose's own variables (.env): the address ports are published on, and the NATS
    # users' passwords the nats container and the services read (engram/runtime/auth.py)
    from engram.runtime.auth import compose_secrets

    outside |= {"ENGRAM_BIND", *compose_secrets()}
    files = [ROOT / "README.md", ROOT / "docker-compose.yml", *(ROOT / "docs").glob("*.md"),
             *(p for p in (ROOT / "deploy").rglob("*") if p.is_file() and p.suffix in {".md", ".yaml", ".yml", "",
                                                                                          ".json"})]
    unknown = set()
    for path in files:
        for name in re.findall(r"ENGRAM_[A-Z0-9_]*[A-Z0-9]_?", path.read_text()):
            is_prefix = name.endswith("_") and any(env.startswith(name) for env in known)
            if name not in known and name not in streams and name not in outside and not is_prefix:
                unknown.add(f"{path.relative_to(ROOT)}: {name}")
    assert sorted(unknown) == []


def test_readme_points_at_the_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "docs/settings.md" in readme


class _Nested(BaseModel):
    size: int = Field(3, ge=1, description="A nested size.")


class _Example(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_EXAMPLE_", env_nested_delimiter="__")

    mode: Literal["a", "b"] = Field("a", description="The mode.")
    limit: float | None = Field(None, gt=0, le=2.5, description="A limit | with a bar.")
    key: SecretStr = Field(SecretStr(""), description="A key.")
    flag: bool = Field(True, description="A flag.")
    caps: dict[str, int] = Field(default_factory=dict, description="Caps.")
    nested: _Nested = Field(default_factory=_Nested, description="Nested.")


def test_rows_carry_name_type_bounds_default_and_description() -> None:
    rows = {row.env: row for row in settings_rows([_Example])}
    assert list(rows) == ["ENGRAM_EXAMPLE_MODE", "ENGRAM_EXAMPLE_LIMIT", "ENGRAM_EXAMPLE_KEY", "ENGRAM_EXAMPLE_FLAG",
                          "ENGRAM_EXAMPLE_CAPS", "ENGRAM_EXAMPLE_NESTED__SIZE"]
    assert (rows["ENGRAM_EXAMPLE_MODE"].type, rows["ENGRAM_EXAMPLE_MODE"].default) == ("one of `a`, `b`", "`a`")
    limit = rows["ENGRAM_EXAMPLE_LIMIT"]
    assert (limit.type, limit.default, limit.description) == ("float or unset, > 0, ≤ 2.5", "unset",
                                                              "A limit \\| with a bar.")
    assert (rows["ENGRAM_EXAMPLE_KEY"].type, rows["ENGRAM_EXAMPLE_KEY"].default) == ("str (secret)", '`""`')
    assert rows["ENGRAM_EXAMPLE_FLAG"].default == "`true`"
    assert (rows["ENGRAM_EXAMPLE_CAPS"].type, rows["ENGRAM_EXAMPLE_CAPS"].default) == ("JSON dict[str, int]", "`{}`")
    nested = rows["ENGRAM_EXAMPLE_NESTED__SIZE"]
    assert (nested.type, nested.default, nested.description) == ("int, ≥ 1", "`3`", "A nested size.")


def test_a_computed_default_must_be_described() -> None:
    class _Computed(BaseSettings):
        model_config = SettingsConfigDict(env_prefix="ENGRAM_COMPUTED_")
        where: Path = Field(default_factory=Path.cwd, description="Somewhere.")

    with pytest.raises(ValueError, match="FACTORY_DEFAULTS"):
        settings_rows([_Computed])
