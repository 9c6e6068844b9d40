"""Preprocessing prompts: template hierarchy, value forms, start-up validation, placement by
mode (before graphiti's instructions or in its custom-instructions section) and per-episode
overrides. Pure: temporary directories only, no broker or graph."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from graphiti_core.llm_client.config import ModelSize
from graphiti_core.prompts.models import Message
from pydantic import ValidationError

from engram.models.rules_llm import RulesExtractorClient

from engram.schemas import ExtractionOverride
from engram.services.extractor.preprocessing import (
    DEFAULT_TEMPLATE,
    ExtractionSettings,
    EXTRACTION_PROMPTS,
    EpisodeInstructions,
    OverrideError,
    PrependingLLMClient,
    TemplateError,
    instructions_for_episode,
    is_template_name,
    place_instructions,
    resolve_preprocessing,
    resolve_template,
    validate_at_startup,
    with_prefix,
)

REPO = Path(__file__).resolve().parents[3]
LOGGER = "engram.extractor"


@pytest.fixture(autouse=True)
def _no_extraction_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep a developer's ENGRAM_EXTRACTION_* variables out of the tests."""
    import os

    for key in list(os.environ):
        if key.upper().startswith("ENGRAM_EXTRACTION_"):
            monkeypatch.delenv(key)


class Dirs:
    def __init__(self, root: Path) -> None:
        self.project = root / "project"
        self.project_templates = self.project / ".graphiti" / "templates"
        self.global_ = root / "home" / ".graphiti" / "templates"
        self.builtin = root / "builtin"
        for d in (self.project_templates, self.global_, self.builtin):
            d.mkdir(parents=True)

    def settings(self, **kw: object) -> ExtractionSettings:
        return ExtractionSettings(project_dir=self.project, global_dir=self.global_, builtin_dir=self.builtin, **kw)


@pytest.fixture
def dirs(tmp_path: Path) -> Dirs:
    return Dirs(tmp_path)


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


# --------------------------------------------------------------------------- hierarchy


def test_project_beats_global_beats_builtin(dirs: Dirs) -> None:
    s = dirs.settings()
    p = write(dirs.project_templates, "t.md", "from project\n")
    g = write(dirs.global_, "t.md", "from global\n")
    b = write(dirs.builtin, "t.md", "from builtin\n")

    assert resolve_template("t.md", s) == ("from project", p)
    p.unlink()
    assert resolve_template("t.md", s) == ("from global", g)
    g.unlink()
    assert resolve_template("t.md", s) == ("from builtin", b)
    b.unlink()
    assert resolve_template("t.md", s) is None


def test_project_beats_builtin_without_global(dirs: Dirs) -> None:
    p = write(dirs.project_templates, "t.md", "project")
    write(dirs.builtin, "t.md", "builtin")
    assert resolve_template("t.md", dirs.settings()) == ("project", p)


def test_directory_with_template_name_is_not_a_template(dirs: Dirs) -> None:
    (dirs.project_templates / "t.md").mkdir()
    g = write(dirs.global_, "t.md", "global")
    assert resolve_template("t.md", dirs.settings()) == ("global", g)


def test_broken_higher_level_does_not_fall_through(dirs: Dirs) -> None:
    """An empty project template is an error, not a reason to use the built-in one."""
    p = write(dirs.project_templates, "t.md", "  \n\t\n")
    write(dirs.builtin, "t.md", "builtin")
    with pytest.raises(TemplateError) as err:
        resolve_template("t.md", dirs.settings())
    assert str(p) in str(err.value)


def test_undecodable_template_names_the_file(dirs: Dirs) -> None:
    path = dirs.global_ / "bin.md"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(TemplateError, match="bin.md"):
        resolve_template("bin.md", dirs.settings())


@pytest.mark.parametrize(
    "name", ["../t.md", "..", "sub/t.md", "sub\\t.md", "/etc/passwd", "a..md", "", " t.md", "t\0.md"]
)
def test_unsafe_names_are_rejected(dirs: Dirs, name: str) -> None:
    with pytest.raises(TemplateError, match="unsafe template name"):
        resolve_template(name, dirs.settings())


def test_traversal_is_rejected_even_when_the_target_exists(dirs: Dirs) -> None:
    # project/.graphiti/templates/../secret.md exists, so only the name check stops it.
    write(dirs.project / ".graphiti", "secret.md", "secret")
    with pytest.raises(TemplateError):
        resolve_preprocessing("../secret.md", dirs.settings())
    with pytest.raises(TemplateError):
        validate_at_startup(dirs.settings(preprocessing_prompt="../secret.md"))


# --------------------------------------------------------------------------- value forms


def test_template_value_resolves_through_hierarchy(dirs: Dirs) -> None:
    write(dirs.global_, "mine.md", "  global guidance  \n")
    assert resolve_preprocessing("mine.md", dirs.settings()) == "global guidance"
    assert resolve_preprocessing(" mine.md\n", dirs.settings()) == "global guidance"


def test_missing_template_returns_none_and_warns(dirs: Dirs, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert resolve_preprocessing("nowhere.md", dirs.settings()) is None
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "nowhere.md" in warnings[0].getMessage()
    assert str(dirs.builtin) in warnings[0].getMessage()


def test_resolve_template_miss_is_silent(dirs: Dirs, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        assert resolve_template("nowhere.md", dirs.settings()) is None
    assert caplog.records == []


@pytest.mark.parametrize("value", ["gone.md", True])
def test_missing_configured_template_fails_startup(dirs: Dirs, value: str | bool) -> None:
    """A configured template found nowhere stops the extractor with what to do; it used to log a
    warning and extract without preprocessing, which is how a wheel without its templates/
    quietly lost the default template (issue 23)."""
    name = "gone.md" if value == "gone.md" else DEFAULT_TEMPLATE
    with pytest.raises(TemplateError, match="not found") as err:
        validate_at_startup(dirs.settings(preprocessing_prompt=value))
    message = str(err.value)
    assert name in message and str(dirs.builtin) in message and "ENGRAM_EXTRACTION_PREPROCESSING_PROMPT=false" in message


def test_startup_logs_which_template_is_in_use(dirs: Dirs, caplog: pytest.LogCaptureFixture) -> None:
    path = write(dirs.builtin, DEFAULT_TEMPLATE, "builtin default")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert validate_at_startup(dirs.settings()) == "builtin default"
    [line] = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert f"template {DEFAULT_TEMPLATE} from {path}," in line and "mode append" in line


def test_inline_prompt_is_used_stripped(dirs: Dirs) -> None:
    assert resolve_preprocessing("  Focus on error patterns.\n", dirs.settings()) == "Focus on error patterns."


def test_inline_prompt_mentioning_a_markdown_file_stays_inline(dirs: Dirs, caplog: pytest.LogCaptureFixture) -> None:
    prompt = "Track every change to CHANGELOG.md"
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert resolve_preprocessing(prompt, dirs.settings()) == prompt
    assert caplog.records == []


@pytest.mark.parametrize(
    ("value", "expected"),
    [("t.md", True), ("T.MD", True), ("a-b_c.v2.md", True), ("see README.md", False), ("t.txt", False), ("md", False)],
)
def test_is_template_name(value: str, expected: bool) -> None:
    assert is_template_name(value) is expected


@pytest.mark.parametrize("value", [None, False, "", "   \n"])
def test_disabled_values(dirs: Dirs, value: str | bool | None) -> None:
    write(dirs.builtin, DEFAULT_TEMPLATE, "default")  # present, yet must not be used
    assert resolve_preprocessing(value, dirs.settings()) is None
    assert validate_at_startup(dirs.settings(preprocessing_prompt=value)) is None


def test_true_means_default_template(dirs: Dirs) -> None:
    write(dirs.builtin, DEFAULT_TEMPLATE, "builtin default")
    assert resolve_preprocessing(True, dirs.settings()) == "builtin default"
    write(dirs.project_templates, DEFAULT_TEMPLATE, "project default")
    assert resolve_preprocessing(True, dirs.settings()) == "project default"


# --------------------------------------------------------------------------- start-up validation


def test_startup_returns_resolved_text(dirs: Dirs) -> None:
    write(dirs.project_templates, "t.md", "\nproject guidance\n")
    assert validate_at_startup(dirs.settings(preprocessing_prompt="t.md")) == "project guidance"


@pytest.mark.parametrize("text", ["", "   ", "\n\n\t\n"])
def test_empty_template_fails_startup(dirs: Dirs, text: str) -> None:
    path = write(dirs.builtin, "empty.md", text)
    with pytest.raises(TemplateError, match="empty") as err:
        validate_at_startup(dirs.settings(preprocessing_prompt="empty.md"))
    assert str(path) in str(err.value)


def test_oversized_template_fails_startup(dirs: Dirs) -> None:
    path = write(dirs.global_, "big.md", "x" * 101)
    with pytest.raises(TemplateError, match="max_template_chars=100") as err:
        validate_at_startup(dirs.settings(preprocessing_prompt="big.md", max_template_chars=100))
    assert str(path) in str(err.value)


def test_template_at_the_limit_is_accepted(dirs: Dirs) -> None:
    # Surrounding whitespace is not counted: the stripped text is what reaches the LLM.
    write(dirs.global_, "edge.md", "\n" + "x" * 100 + "\n\n")
    assert validate_at_startup(dirs.settings(preprocessing_prompt="edge.md", max_template_chars=100)) == "x" * 100


def test_oversized_inline_prompt_fails_startup(dirs: Dirs) -> None:
    assert validate_at_startup(dirs.settings(preprocessing_prompt="y" * 50, max_template_chars=50)) == "y" * 50
    with pytest.raises(TemplateError, match="inline"):
        validate_at_startup(dirs.settings(preprocessing_prompt="y" * 51, max_template_chars=50))


def test_default_true_with_empty_default_fails_startup(dirs: Dirs) -> None:
    write(dirs.global_, DEFAULT_TEMPLATE, " ")
    with pytest.raises(TemplateError, match=DEFAULT_TEMPLATE):
        validate_at_startup(dirs.settings(preprocessing_prompt=True))


# --------------------------------------------------------------------------- settings


def test_settings_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    s = ExtractionSettings()
    assert s.preprocessing_prompt == "default-session-turn.md" == DEFAULT_TEMPLATE
    assert s.preprocessing_mode == "append"  # graphiti's own place: what engram always did
    assert s.max_template_chars == 8000
    assert s.project_dir == tmp_path
    assert s.global_dir == tmp_path / "home" / ".graphiti" / "templates"
    assert s.builtin_dir == (REPO / "engram" / "templates").resolve() == REPO / "templates"


@pytest.mark.parametrize(
    ("env", "expected"),
    [("false", False), ("FALSE", False), ("true", True), ("null", None), ("none", None), ("mine.md", "mine.md"),
     ("Focus on errors.", "Focus on errors.")],
)
def test_settings_prompt_from_env(monkeypatch: pytest.MonkeyPatch, env: str, expected: object) -> None:
    monkeypatch.setenv("ENGRAM_EXTRACTION_PREPROCESSING_PROMPT", env)
    assert ExtractionSettings().preprocessing_prompt == expected


def test_settings_other_fields_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_EXTRACTION_PREPROCESSING_MODE", "prepend")
    monkeypatch.setenv("ENGRAM_EXTRACTION_MAX_TEMPLATE_CHARS", "123")
    monkeypatch.setenv("ENGRAM_EXTRACTION_PROJECT_DIR", str(tmp_path / "p"))
    monkeypatch.setenv("ENGRAM_EXTRACTION_GLOBAL_DIR", str(tmp_path / "g"))
    monkeypatch.setenv("ENGRAM_EXTRACTION_BUILTIN_DIR", str(tmp_path / "b"))
    s = ExtractionSettings()
    assert (s.preprocessing_mode, s.max_template_chars) == ("prepend", 123)
    assert (s.project_dir, s.global_dir, s.builtin_dir) == (tmp_path / "p", tmp_path / "g", tmp_path / "b")


@pytest.mark.parametrize(("field", "value"), [("PREPROCESSING_MODE", "sideways"), ("MAX_TEMPLATE_CHARS", "0")])
def test_settings_reject_bad_values(monkeypatch: pytest.MonkeyPatch, field: str, value: str) -> None:
    monkeypatch.setenv(f"ENGRAM_EXTRACTION_{field}", value)
    with pytest.raises(ValidationError):
        ExtractionSettings()


# --------------------------------------------------------------------------- placement


def test_prepend_places_text_before_graphitis_instructions() -> None:
    assert place_instructions("  PRE\n", "prepend") == EpisodeInstructions(before_graphiti="PRE")


def test_append_places_text_in_graphitis_custom_instructions() -> None:
    assert place_instructions("PRE", "append") == EpisodeInstructions(graphiti_custom="PRE")


@pytest.mark.parametrize("mode", ["prepend", "append"])
@pytest.mark.parametrize("pre", [None, "", "  \n"])
def test_no_text_places_nothing(mode: str, pre: str | None) -> None:
    assert place_instructions(pre, mode) == EpisodeInstructions()  # type: ignore[arg-type]


def test_place_rejects_unknown_mode() -> None:
    with pytest.raises(ValueError, match="sideways"):
        place_instructions("PRE", "sideways")  # type: ignore[arg-type]


_part = st.text(min_size=1).map(str.strip).filter(bool)


@given(pre=_part)
def test_each_mode_uses_exactly_one_place(pre: str) -> None:
    prepended, appended = place_instructions(pre, "prepend"), place_instructions(pre, "append")
    assert (prepended.before_graphiti, prepended.graphiti_custom) == (pre, "")
    assert (appended.before_graphiti, appended.graphiti_custom) == ("", pre)


# --------------------------------------------------------------------------- per-episode override


def test_no_override_uses_configured_prompt_and_mode(dirs: Dirs) -> None:
    assert instructions_for_episode(None, "CONFIGURED", dirs.settings(preprocessing_mode="append")) == \
        EpisodeInstructions(graphiti_custom="CONFIGURED")
    assert instructions_for_episode(None, "CONFIGURED", dirs.settings(preprocessing_mode="prepend")) == \
        EpisodeInstructions(before_graphiti="CONFIGURED")
    assert instructions_for_episode(None, None, dirs.settings()) == EpisodeInstructions()


def test_override_inline_prompt_replaces_configured(dirs: Dirs) -> None:
    override = ExtractionOverride(preprocessing_prompt="Only decisions, please.")
    out = instructions_for_episode(override, "CONFIGURED", dirs.settings())
    assert out == EpisodeInstructions(graphiti_custom="Only decisions, please.")


def test_override_inline_prompt_is_secret_scrubbed(dirs: Dirs) -> None:
    key = "sk-" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6"
    override = ExtractionOverride(preprocessing_prompt=f"Ignore the key {key} in tool output.")
    out = instructions_for_episode(override, None, dirs.settings()).graphiti_custom
    assert key not in out and out.startswith("Ignore the key ")


def test_override_template_resolves_through_hierarchy(dirs: Dirs) -> None:
    write(dirs.project_templates, "lessons.md", "lesson guidance")
    write(dirs.builtin, "lessons.md", "builtin lesson guidance")
    override = ExtractionOverride(preprocessing_prompt="lessons.md")
    assert instructions_for_episode(override, "CONFIGURED", dirs.settings()).graphiti_custom == "lesson guidance"


def test_override_true_uses_default_template(dirs: Dirs) -> None:
    write(dirs.builtin, DEFAULT_TEMPLATE, "default guidance")
    override = ExtractionOverride(preprocessing_prompt=True)
    assert instructions_for_episode(override, None, dirs.settings()).graphiti_custom == "default guidance"


def test_override_false_disables_preprocessing(dirs: Dirs) -> None:
    override = ExtractionOverride(preprocessing_prompt=False)
    assert instructions_for_episode(override, "CONFIGURED", dirs.settings()) == EpisodeInstructions()


def test_override_none_prompt_keeps_configured(dirs: Dirs) -> None:
    override = ExtractionOverride(preprocessing_prompt=None)
    assert instructions_for_episode(override, "CONFIGURED", dirs.settings()).graphiti_custom == "CONFIGURED"


def test_override_mode_replaces_configured_mode(dirs: Dirs) -> None:
    s = dirs.settings(preprocessing_mode="prepend")
    append = ExtractionOverride(preprocessing_mode="append")
    assert instructions_for_episode(append, "CONFIGURED", s) == EpisodeInstructions(graphiti_custom="CONFIGURED")
    both = ExtractionOverride(preprocessing_prompt="OWN", preprocessing_mode="append")
    assert instructions_for_episode(both, "CONFIGURED", s) == EpisodeInstructions(graphiti_custom="OWN")


def test_override_without_mode_keeps_configured_mode(dirs: Dirs) -> None:
    s = dirs.settings(preprocessing_mode="prepend")
    override = ExtractionOverride(preprocessing_prompt="OWN")
    assert override.preprocessing_mode is None
    assert instructions_for_episode(override, "CONFIGURED", s) == EpisodeInstructions(before_graphiti="OWN")


def test_override_with_unsafe_template_is_an_override_error_that_does_not_quote_it(dirs: Dirs) -> None:
    override = ExtractionOverride(preprocessing_prompt="../../etc/x.md")
    with pytest.raises(OverrideError) as raised:
        instructions_for_episode(override, "CONFIGURED", dirs.settings())
    assert "etc" not in str(raised.value)
    assert raised.value.dead_letter_reason == "extraction_override"  # dead-lettered at once, not retried


def test_override_longer_than_the_limit_is_an_override_error(dirs: Dirs) -> None:
    override = ExtractionOverride(preprocessing_prompt="y" * 60)
    with pytest.raises(OverrideError, match="max_template_chars=50"):
        instructions_for_episode(override, None, dirs.settings(max_template_chars=50))


def test_override_missing_template_means_no_preprocessing_and_logs_no_name(
    dirs: Dirs, caplog: pytest.LogCaptureFixture,
) -> None:
    override = ExtractionOverride(preprocessing_prompt="absent.md")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert instructions_for_episode(override, "CONFIGURED", dirs.settings()) == EpisodeInstructions()
    assert caplog.records and not any("absent" in r.getMessage() for r in caplog.records)


# --------------------------------------------------------------------------- prompt prefix


def _prompt(system: str, user: str) -> list[Message]:
    return [Message(role="system", content=system), Message(role="user", content=user)]


def test_prefix_opens_the_user_message_and_leaves_the_input_alone() -> None:
    messages = _prompt("SYS", "graphiti's instructions")
    out = with_prefix(messages, "PRE")
    assert out[0] is messages[0]
    assert out[1].content == "<PREPROCESSING INSTRUCTIONS>\nPRE\n</PREPROCESSING INSTRUCTIONS>\n\ngraphiti's instructions"
    assert messages[1].content == "graphiti's instructions"


async def test_prepending_client_changes_extraction_prompts_only() -> None:
    seen: list[tuple[str | None, str]] = []

    class Inner(RulesExtractorClient):
        async def generate_response(self, messages, response_model=None, max_tokens=None,  # noqa: ANN001
                                    model_size=ModelSize.medium, group_id=None, prompt_name=None, **kw):  # noqa: ANN001, ANN003
            seen.append((prompt_name, messages[1].content))
            return {}

    client = PrependingLLMClient(Inner(), "PRE")
    await client.generate_response(_prompt("S", "U"), prompt_name="extract_nodes_and_edges.extract_message")
    await client.generate_response(_prompt("S", "U"), prompt_name="dedupe_nodes.nodes")
    assert seen[0][1].startswith("<PREPROCESSING INSTRUCTIONS>\nPRE\n") and seen[0][1].endswith("U")
    assert seen[1] == ("dedupe_nodes.nodes", "U")
    assert EXTRACTION_PROMPTS >= {"extract_nodes.extract_text", "extract_edges.edge"}


# --------------------------------------------------------------------------- the real built-in template


def test_builtin_default_template(tmp_path: Path) -> None:
    # Empty project and global levels, the repository's templates/ as built-in.
    s = ExtractionSettings(project_dir=tmp_path, global_dir=tmp_path / "none")
    found = resolve_template(DEFAULT_TEMPLATE, s)
    assert found is not None
    text, path = found
    assert path.resolve() == REPO / "templates" / DEFAULT_TEMPLATE  # through the engram/templates link
    assert text.strip() and len(text) <= 2500 <= s.max_template_chars
    for hint in ("File", "Tool", "Error", "Decision", "Concept"):
        assert f"**{hint}**" in text, hint
    assert validate_at_startup(s) == text
    assert instructions_for_episode(None, validate_at_startup(s), s) == EpisodeInstructions(graphiti_custom=text)


def test_chunking_settings_come_from_nested_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_EXTRACTION_CHUNKING__CHUNK_TOKEN_SIZE", "2000")
    monkeypatch.setenv("ENGRAM_EXTRACTION_CHUNKING__MAX_NODES_PER_CHUNK", "8")
    settings = ExtractionSettings()
    assert settings.chunking_enabled
    assert (settings.chunking.chunk_token_size, settings.chunking.max_nodes_per_chunk) == (2000, 8)
    assert settings.chunking.chunk_overlap_tokens == 200  # seed default kept
    monkeypatch.setenv("ENGRAM_EXTRACTION_CHUNKING__CHUNK_OVERLAP_TOKENS", "5000")
    with pytest.raises(ValueError, match="overlap"):
        ExtractionSettings()


def test_previous_window_is_a_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ExtractionSettings().previous_window == 2
    monkeypatch.setenv("ENGRAM_EXTRACTION_PREVIOUS_WINDOW", "5")
    assert ExtractionSettings().previous_window == 5
    monkeypatch.setenv("ENGRAM_EXTRACTION_PREVIOUS_WINDOW", "-1")
    with pytest.raises(ValueError):
        ExtractionSettings()
