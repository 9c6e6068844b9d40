"""Preprocessing prompts: extra guidance handed to graphiti's entity/fact extraction.

graphiti-core's ``add_episode(custom_extraction_instructions=...)`` injects free text into its
extraction prompts. Engram uses it to tell the single extraction pass what matters in a chat
turn (intent, decisions, errors and fixes ...) and what to reduce to an outcome, so no separate
summarisation pass over the turn is needed.

``preprocessing_prompt`` (setting ``ENGRAM_EXTRACTION_PREPROCESSING_PROMPT`` or an Episode's
own ``extraction`` override) takes one of these forms:

* ``None``, ``False`` or ``""`` -- no preprocessing (plain graphiti behaviour);
* ``True`` -- the default template, ``default-session-turn.md``;
* a file name ending in ``.md`` with no whitespace -- a template looked up by name in, first
  match wins:

  1. project  ``<project_dir>/.graphiti/templates/<name>``
  2. global   ``<global_dir>/<name>`` (``~/.graphiti/templates`` by default)
  3. built-in ``<builtin_dir>/<name>`` (the repository's ``templates/`` directory, shipped in
     the wheel as ``engram/templates``: engram/bundled.py)

  The configured template (the setting) found nowhere is a :class:`TemplateError` at start-up:
  a missing template never turns preprocessing off quietly (a wheel that shipped without its
  templates did exactly that). An Episode's override naming a template found nowhere logs a
  warning and means no preprocessing for that episode. A template that is found but empty or
  longer than ``max_template_chars`` is a :class:`TemplateError`;
* any other text -- the prompt itself (inline), stripped.

``preprocessing_mode`` places the text in graphiti's extraction prompts (those that take
``custom_extraction_instructions``: extract_nodes.*, extract_edges.edge and the combined
extract_nodes_and_edges.extract_message):

* ``append`` (default) -- graphiti's own place: ``custom_extraction_instructions``, which graphiti
  puts after its instructions (the combined prompt: a ``<CUSTOM INSTRUCTIONS>`` section, with the
  rule that they win over graphiti's own when they conflict). What engram always did.
* ``prepend`` -- before graphiti's instructions: the text opens the prompt's user message, inside
  ``<PREPROCESSING INSTRUCTIONS>`` tags, and graphiti's instructions follow (and so refine it);
  graphiti's custom-instructions section stays empty.

graphiti has no argument for the second place, so :class:`PrependingLLMClient` puts it there on
the way to the model. Everything else here is pure apart from reading template files and logging.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from graphiti_core.llm_client.config import ModelSize
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram.bundled import TEMPLATES_DIR
from engram.models.delegating import DelegatingLLMClient
from engram.text.secrets import scrub_secrets
from engram.schemas import ExtractionOverride
from engram.services.extractor.chunking import ChunkingSettings
from engram.services.extractor.extraction_prompt import KNOWN_FACTS

log = logging.getLogger("engram.extractor")

Mode = Literal["prepend", "append"]
DEFAULT_TEMPLATE = "default-session-turn.md"
TEMPLATE_SUFFIX = ".md"
BUILTIN_TEMPLATES_DIR = TEMPLATES_DIR

# Environment variables are always strings, so without this an env value of "false" would
# become an inline prompt reading "false" rather than switching preprocessing off.
_ENV_WORDS: dict[str, bool | None] = {"true": True, "false": False, "none": None, "null": None}


class ExtractionSettings(BaseSettings):
    """Preprocessing configuration of the extractor, from ENGRAM_EXTRACTION_* variables."""

    model_config = SettingsConfigDict(env_prefix="ENGRAM_EXTRACTION_", env_nested_delimiter="__", extra="ignore")

    preprocessing_prompt: str | bool | None = Field(
        DEFAULT_TEMPLATE,
        description="None/False: off; True: the default template; '<name>.md': a template; other text: inline.",
    )
    preprocessing_mode: Mode = Field(
        "append", description="Where the preprocessing text goes in graphiti's extraction prompts: 'append' in "
        "graphiti's custom-instructions section after its instructions (they win on conflict); 'prepend' at the "
        "start of the prompt, before graphiti's instructions (services/extractor/preprocessing.py).",
    )
    max_template_chars: int = Field(8000, gt=0, description="Longer templates or inline prompts are rejected.")
    project_dir: Path = Field(default_factory=Path.cwd, description="Holds the project's ./.graphiti/templates/.")
    global_dir: Path = Field(
        default_factory=lambda: Path.home() / ".graphiti" / "templates",
        description="The user's templates, looked up after the project's.",
    )
    builtin_dir: Path = Field(
        default_factory=lambda: BUILTIN_TEMPLATES_DIR,
        description="engram's own templates (shipped in the package), looked up last.",
    )
    # Cost per turn measured by bench/extraction_cost.py on LoCoMo conv-26 (3 sessions): window 0:
    # 0.29x upstream tokens, 2: 0.30x, 4: 0.32x, 10: 0.34x. A turn already holds both sides of the
    # exchange, so 2 keeps "it"/"that" resolvable across turns at little cost. Its effect on
    # quality needs a real LLM to measure (the rules extractor does not read previous episodes).
    previous_window: int = Field(2, ge=0, le=20, description="Previous episodes shown to extraction.")
    known_facts: int = Field(
        KNOWN_FACTS, ge=0, le=50,
        description="The group's facts in force (those sharing the most words with the turn) shown to the extraction "
        "call, which says which of them each new fact restates or replaces: graphiti's dedupe question about them then "
        "needs no call. 0: none (services/extractor/pipeline.py known_facts_for).",
    )
    chunking_enabled: bool = Field(True, description="Chunk large entity-dense episodes (seed 002).")
    restatement_similarity: float | None = Field(
        None, ge=0.0, le=1.0,
        description="Fact-embedding cosine at or above which an invalidating fact counts as a restatement of the "
        "fact it invalidates (the invalidation is then rejected). None: the value measured for the configured "
        "embedder (services/extractor/restatement.py DEFAULT_SIMILARITY; none for openai).",
    )
    chunking: ChunkingSettings = Field(
        default_factory=ChunkingSettings,
        description="e.g. ENGRAM_EXTRACTION_CHUNKING__CHUNK_TOKEN_SIZE=3000 (see services/extractor/chunking.py).",
    )

    @field_validator("preprocessing_prompt", mode="before")
    @classmethod
    def _env_words(cls, value: object) -> object:
        if isinstance(value, str) and value.strip().lower() in _ENV_WORDS:
            return _ENV_WORDS[value.strip().lower()]
        return value


class TemplateError(ValueError):
    """A preprocessing template or inline prompt that must not be used (unsafe, empty, too long)."""


def template_dirs(settings: ExtractionSettings) -> list[Path]:
    """The template directories in lookup order: project, global, built-in."""
    return [settings.project_dir / ".graphiti" / "templates", settings.global_dir, settings.builtin_dir]


def _check_name(name: str) -> None:
    # A template name is a bare file name: anything that could walk out of the template
    # directories (separators, "..", NUL) is refused rather than normalised.
    separators = {"/", "\\", os.sep, os.altsep or "/"}
    if not name or name != name.strip() or "\0" in name or ".." in name or any(s in name for s in separators):
        raise TemplateError(f"unsafe template name {name!r}: expected a bare file name such as {DEFAULT_TEMPLATE!r}")


def _check_size(text: str, what: str, settings: ExtractionSettings) -> str:
    text = text.strip()
    if not text:
        raise TemplateError(f"{what} is empty")
    if len(text) > settings.max_template_chars:
        limit = settings.max_template_chars
        raise TemplateError(f"{what} has {len(text)} characters, more than max_template_chars={limit}")
    return text


def resolve_template(name: str, settings: ExtractionSettings) -> tuple[str, Path] | None:
    """Text (stripped) and path of template ``name``, first match of project > global > built-in.

    None when no directory has it. A template that exists but is unreadable, empty or oversized
    raises :class:`TemplateError` instead of falling through: a broken override should be fixed,
    not silently replaced by a lower level.
    """
    _check_name(name)
    for directory in template_dirs(settings):
        path = directory / name
        if not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TemplateError(f"template {path} cannot be read: {exc}") from exc
        return _check_size(text, f"template {path}", settings), path
    return None


def is_template_name(value: str) -> bool:
    """Whether ``value`` names a template rather than being an inline prompt.

    Whitespace excludes it: an inline prompt may well end in a file name ("... see README.md").
    """
    value = value.strip()
    return value.lower().endswith(TEMPLATE_SUFFIX) and not any(c.isspace() for c in value)


def resolve_preprocessing(value: str | bool | None, settings: ExtractionSettings) -> str | None:
    """Preprocessing text for a ``preprocessing_prompt`` value, or None for no preprocessing.

    Raises :class:`TemplateError` for an unsafe template name, an empty or oversized template
    and an oversized inline prompt. A template found nowhere only logs a warning.
    """
    if value is None or value is False:
        return None
    name = DEFAULT_TEMPLATE if value is True else value.strip()
    if not name:
        return None
    if not is_template_name(name):
        return _check_size(name, "inline preprocessing prompt", settings)
    found = resolve_template(name, settings)
    if found is None:
        log.warning(
            "preprocessing template %r not found in %s; extracting without preprocessing",
            name,
            ", ".join(str(d) for d in template_dirs(settings)),
        )
        return None
    text, path = found
    log.debug("preprocessing template %r loaded from %s", name, path)
    return text


def validate_at_startup(settings: ExtractionSettings) -> str | None:
    """Resolve the configured prompt once, when the service starts, and log what is in use.

    A :class:`TemplateError` propagates so a misconfigured service fails at start-up instead of
    on every episode; that includes a configured template found in none of the directories
    (for the default template that means a broken install). The returned text is the
    ``configured`` argument of :func:`instructions_for_episode`.
    """
    value = settings.preprocessing_prompt
    name = DEFAULT_TEMPLATE if value is True else value.strip() if isinstance(value, str) else ""
    if name and is_template_name(name):
        found = resolve_template(name, settings)
        if found is None:
            raise TemplateError(
                f"preprocessing template {name!r} not found in "
                f"{', '.join(str(d) for d in template_dirs(settings))}: put it in one of them, or set "
                "ENGRAM_EXTRACTION_PREPROCESSING_PROMPT=false to extract without preprocessing"
            )
        text, path = found
        log.info("extraction preprocessing: template %s from %s, %d characters, mode %s",
                 name, path, len(text), settings.preprocessing_mode)
        return text
    text = resolve_preprocessing(value, settings)
    if text is None:
        log.info("extraction preprocessing: off")
    else:
        log.info("extraction preprocessing: inline prompt, %d characters, mode %s", len(text), settings.preprocessing_mode)
    return text


PREFIX_OPEN = "<PREPROCESSING INSTRUCTIONS>"
PREFIX_CLOSE = "</PREPROCESSING INSTRUCTIONS>"
EXTRACTION_PROMPTS = frozenset({
    "extract_nodes.extract_message", "extract_nodes.extract_text", "extract_nodes.extract_json",
    "extract_edges.edge", "extract_nodes_and_edges.extract_message",
})
"""graphiti's prompts that take ``custom_extraction_instructions``: the ones a prefix goes into."""


@dataclass(frozen=True)
class EpisodeInstructions:
    """Where one episode's preprocessing text goes: at most one of the two is non-empty."""

    before_graphiti: str = ""
    """``prepend``: opens the user message of each extraction prompt (:class:`PrependingLLMClient`)."""
    graphiti_custom: str = ""
    """``append``: graphiti's ``custom_extraction_instructions``."""


def place_instructions(preprocessing: str | None, mode: Mode) -> EpisodeInstructions:
    """The preprocessing text placed by ``mode``; no text places nothing."""
    if mode not in ("prepend", "append"):
        raise ValueError(f"unknown preprocessing_mode {mode!r}: expected 'prepend' or 'append'")
    text = (preprocessing or "").strip()
    if mode == "prepend":
        return EpisodeInstructions(before_graphiti=text)
    return EpisodeInstructions(graphiti_custom=text)


class OverrideError(TemplateError):
    """An Episode's own ``extraction`` override that cannot be used. Redelivery cannot fix it: the
    episode is dead-lettered at once (engram/runtime/service.py); the message never quotes the override."""

    dead_letter_reason = "extraction_override"


def _override_text(value: str | bool, settings: ExtractionSettings) -> str | None:
    # User text: scrubbed before it reaches a prompt (the turn-detector scrubbed it already for chat
    # messages; raw Episode publishers may not have), and no error or log line quotes it.
    if isinstance(value, str):
        value = scrub_secrets(value).text
        if is_template_name(value):
            try:
                found = resolve_template(value.strip(), settings)
            except TemplateError:
                raise OverrideError("the episode's extraction override names an unusable template "
                                    "(unsafe name, or an empty, unreadable or oversized file)") from None
            if found is None:
                log.warning("the episode's extraction template was not found; extracting without preprocessing")
                return None
            return found[0]
    try:
        return resolve_preprocessing(value, settings)
    except TemplateError:
        raise OverrideError(f"the episode's extraction override is empty or longer than max_template_chars="
                            f"{settings.max_template_chars}") from None


def instructions_for_episode(
    override: ExtractionOverride | None,
    configured: str | None,
    settings: ExtractionSettings,
) -> EpisodeInstructions:
    """Extraction instructions for one Episode, placed by the preprocessing mode.

    ``configured`` is the text :func:`validate_at_startup` resolved. An Episode's ``extraction``
    override replaces it: ``preprocessing_prompt`` None keeps the configured text, False turns
    preprocessing off for this episode, any other value is resolved like the setting (an unusable
    one raises :class:`OverrideError`). The override's ``preprocessing_mode``, when given, replaces
    ENGRAM_EXTRACTION_PREPROCESSING_MODE.
    """
    preprocessing = configured
    mode: Mode = settings.preprocessing_mode
    if override is not None:
        if override.preprocessing_prompt is not None:
            preprocessing = _override_text(override.preprocessing_prompt, settings)
        if override.preprocessing_mode is not None:
            mode = override.preprocessing_mode
    return place_instructions(preprocessing, mode)


def with_prefix(messages: list[Any], prefix: str) -> list[Any]:
    """``messages`` with ``prefix`` (in its tags) opening the first user message; the rest unchanged.

    The input list and its messages are left as they are: graphiti may reuse them (retries).
    """
    out = list(messages)
    for i, message in enumerate(out):
        if getattr(message, "role", None) == "user":
            block = f"{PREFIX_OPEN}\n{prefix}\n{PREFIX_CLOSE}\n\n"
            out[i] = message.model_copy(update={"content": block + message.content})
            break
    return out


class PrependingLLMClient(DelegatingLLMClient):
    """``prepend`` mode: puts one episode's preprocessing text before graphiti's instructions in
    each extraction prompt (:data:`EXTRACTION_PROMPTS`); every other prompt passes unchanged.

    Made per episode around the extractor's shared client, so concurrent episodes never see each
    other's text.
    """

    def __init__(self, inner: Any, prefix: str) -> None:
        super().__init__(inner)
        self.prefix = prefix

    async def generate_response(  # type: ignore[override]
        self,
        messages: list[Any],
        response_model: Any = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        group_id: str | None = None,
        prompt_name: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        if prompt_name in EXTRACTION_PROMPTS:
            messages = with_prefix(messages, self.prefix)
        return await super().generate_response(
            messages, response_model, max_tokens, model_size, group_id, prompt_name, **kwargs
        )
