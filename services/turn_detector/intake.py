"""Intake: raw NATS payload -> validated event, or the reason it must be dead-lettered.

Pure functions; the service decides what to do with a :class:`Rejected`. Reasons are a small
fixed vocabulary because they become Prometheus label values.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Literal

from pydantic import ValidationError

from engram.text.secrets import scrub_json, scrub_secrets
from engram.schemas import ChatMessage, SessionClosed, SessionIdle
from engram.schemas.validation import error_locations
from engram.services.turn_detector.noise import NoiseSettings, filter_noise, reduce_tool_output
from engram.services.turn_detector.pairing import TurnPart

RejectReason = Literal[
    "malformed_json", "schema", "unsupported_version", "oversize", "invalid_id", "session_mismatch", "unknown_subject"
]
EventKind = Literal["message", "close", "idle"]
KNOWN_VERSIONS = {1}


@dataclass(frozen=True)
class Rejected:
    reason: RejectReason
    detail: str  # describes the problem without echoing message content


Event = ChatMessage | SessionClosed | SessionIdle
_MODELS: dict[str, type[Event]] = {"message": ChatMessage, "close": SessionClosed, "idle": SessionIdle}


def parse_subject(subject: str) -> tuple[EventKind, str] | Rejected:
    """``engram.in.<partition>.<kind>.<session>`` -> (kind, session)."""
    tokens = subject.split(".")
    if len(tokens) != 5 or tokens[:2] != ["engram", "in"] or tokens[3] not in _MODELS:
        return Rejected("unknown_subject", f"unexpected subject shape ({len(tokens)} tokens)")
    return tokens[3], tokens[4]  # type: ignore[return-value]


def _validation_detail(exc: ValidationError) -> str:
    # Field locations and error types only: pydantic's messages may quote the input value.
    return error_locations(exc, 10)


def parse_event(subject: str, payload: bytes, *, max_bytes: int) -> Event | Rejected:
    parsed = parse_subject(subject)
    if isinstance(parsed, Rejected):
        return parsed
    kind, session = parsed
    if len(payload) > max_bytes:
        return Rejected("oversize", f"{len(payload)} bytes > limit {max_bytes}")
    try:
        # Fast path: pydantic parses and validates JSON in one pass. Anything it rejects is
        # classified below by the slower, more precise route.
        event = _MODELS[kind].model_validate_json(payload)
    except ValidationError:
        try:
            return _classify_rejection(kind, payload)
        except Exception as exc:  # noqa: BLE001 - a reason is due whatever the payload holds
            # (the handler would raise it again on every delivery, and the partition would wait)
            return Rejected("schema", f"unclassifiable payload ({type(exc).__name__})")
    if event.session_id != session:
        return Rejected("session_mismatch", "session_id in body differs from the subject's session token")
    return event


def _classify_rejection(kind: str, payload: bytes) -> Rejected:
    try:
        data = json.loads(payload)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Rejected("malformed_json", f"{type(exc).__name__} at position {getattr(exc, 'pos', '?')}")
    except RecursionError:  # nested deeper than json goes: the handler would raise it on every delivery
        return Rejected("malformed_json", "JSON nested too deeply")
    if not isinstance(data, dict):
        return Rejected("schema", f"top-level JSON {type(data).__name__}, expected object")
    version = data.get("schema_version", 1)
    if type(version) is not int or version not in KNOWN_VERSIONS:  # {} or [] would not even hash
        shown = version if type(version) is int else f"of type {type(version).__name__}"  # never the value
        return Rejected("unsupported_version", f"schema_version {shown} not in {sorted(KNOWN_VERSIONS)}")
    try:
        _MODELS[kind].model_validate(data)
    except ValidationError as exc:
        ids = {"message_id", "session_id"}
        if any(e["loc"] and e["loc"][0] in ids and e["type"] == "string_pattern_mismatch" for e in exc.errors()):
            return Rejected("invalid_id", _validation_detail(exc))
        return Rejected("schema", _validation_detail(exc))
    return Rejected("schema", "rejected by the JSON parser but not by the model")  # pragma: no cover


@dataclass(frozen=True)
class PreparedPart:
    part: TurnPart
    secrets: Counter[str]
    message: ChatMessage  # the message with its other stored texts scrubbed (name, source, metadata)


def prepare_part(message: ChatMessage, noise: NoiseSettings) -> PreparedPart:
    """Scrub secrets, then reduce noise (in that order, so truncation cannot cut a secret in
    half and hide it from the scrubber). The speaker's name (it goes into the prompt), the
    source description, the metadata and an extraction override are scrubbed too: every text of a
    message that engram keeps or prompts, whatever door the message came through (and each secret
    found counts, so the raw input holding it is erased at once)."""
    scrubbed = scrub_secrets(message.content)
    secrets = Counter(scrubbed.counts)
    extras: dict[str, object] = {}
    for field in ("name", "source_description"):
        value = getattr(message, field)
        if value:
            result = scrub_secrets(value)
            if result.counts:
                secrets.update(result.counts)
                extras[field] = result.text
    override = message.extraction
    if override is not None and isinstance(override.preprocessing_prompt, str):
        result = scrub_secrets(override.preprocessing_prompt)
        if result.counts:
            secrets.update(result.counts)
            extras["extraction"] = override.model_copy(update={"preprocessing_prompt": result.text})
    if message.metadata:
        metadata, counts = scrub_json(message.metadata)
        if counts:
            secrets.update(counts)
            extras["metadata"] = metadata
    if extras:
        message = message.model_copy(update=extras)
    if message.role == "tool":
        filtered = reduce_tool_output(scrubbed.text, noise)
    else:
        filtered = filter_noise(scrubbed.text, role=message.role, settings=noise)
    # Every field comes from an already validated ChatMessage: construct without re-validating.
    part = TurnPart.model_construct(
        message_id=message.message_id,
        role=message.role,
        name=message.name,
        timestamp=message.timestamp,
        text=filtered.text,
        secrets_scrubbed=sum(secrets.values()),
        reductions=list(filtered.reductions),
        late=False,
    )
    return PreparedPart(part, secrets, message)
