"""Transcript readers (JSONL, LoCoMo) and a publisher that feeds them into engram's input.

Readers yield :class:`ChatMessage` and :class:`SessionClosed` events in conversation order.
Message ids are deterministic, so ingesting the same file twice publishes nothing new: the
server drops a repeated Nats-Msg-Id inside the duplicate window, and the turn-detector drops a
repeated message id after it. The Nats-Msg-Id is :func:`engram.schemas.subjects.message_dedupe_id` of
(session, scopes, message id, session epoch): the same file ingested into another workspace or
user is stored again, and one ingested again after its group was deleted is stored too.

A message larger than engram's cap (ENGRAM_TURN_MAX_MESSAGE_BYTES) or than the NATS server's
max_payload is named and left out like an invalid line; the rest of the file goes in
(engram/publishing/message_size.py).
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Literal

import nats.errors
import nats.js.errors
from dateutil import parser as dateparser
from tenacity import AsyncRetrying, retry_if_exception, stop_after_delay, wait_exponential

from engram import compat
from engram.publishing.message_size import oversize_reason, server_max_payload
from engram.runtime.stream_retention import is_stream_full
from engram_client import TRANSIENT_ERRORS
from engram.schemas import ChatMessage, ScopeKeys, SessionClosed, subjects
from engram.schemas.ids import message_dedupe_key, seen_holds

Event = ChatMessage | SessionClosed
Format = Literal["jsonl", "locomo"]

PUBLISH_RETRY_S = 300.0
"""How long one message's publish is retried while NATS is unreachable, restarting or has no
JetStream leader (the connection reconnects by itself meanwhile); then the ingest fails. A retry
is safe: the Nats-Msg-Id makes a publish that did land before its PubAck was lost a duplicate."""

TRANSIENT_PUBLISH_ERRORS = TRANSIENT_ERRORS  # the thin client's (engram_client): one list for both
"""Also transient once a publish has been stored: ``NoStreamResponseError`` (no stream takes the
subject), while ``engram topology`` re-creates ENGRAM_IN (engram/runtime/stream_migration.py). Before that
it means engram's streams were never made, and the ingest fails at once with that explained."""


class TranscriptError(ValueError):
    pass


def _utc(value: str | float | int | None, fallback: datetime) -> datetime:
    if value is None:
        return fallback
    if isinstance(value, (int, float)):
        return datetime.fromtimestamp(value, tz=timezone.utc)
    dt = dateparser.parse(value)
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class SkippedLine:
    """A transcript line that is not a valid message, left out of the import."""

    lineno: int
    reason: str


_SHOWN_FIELDS = ("session_id", "role", "timestamp", "message_id", "name")
"""Fields whose bad value a reason may quote (never the content: it is the user's text)."""


def line_problem(exc: Exception) -> str:
    """Why a JSONL line is not a message, in words (the field, what is wrong, the bad value)."""
    from pydantic import ValidationError

    if isinstance(exc, json.JSONDecodeError):
        return f"not valid JSON ({exc.msg} at column {exc.colno})"
    if isinstance(exc, KeyError):
        return f"missing field {exc.args[0]!r}"
    if isinstance(exc, ValidationError):
        problems = []
        for error in exc.errors()[:3]:
            field_name = ".".join(str(p) for p in error["loc"]) or "line"
            value = error.get("input")
            quoted = f" (got {value!r})" if field_name in _SHOWN_FIELDS and isinstance(value, str) and \
                len(value) <= 80 else ""
            problems.append(f"{field_name}: {error['msg']}{quoted}")
        return "; ".join(problems)
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, TranscriptError) else str(exc)


def read_jsonl(
    path: Path, scopes: ScopeKeys, close_sessions: bool = True, skipped: list[SkippedLine] | None = None,
    max_bytes: int | None = None, linenos: dict[tuple[str, str], int] | None = None,
) -> Iterator[Event]:
    """One message per line: {session_id, role, content, timestamp, message_id?, name?, metadata?}.

    A line that is not a valid message, or whose message is larger than ``max_bytes`` (as JSON;
    engram/publishing/message_size.py), raises :class:`TranscriptError`, or, when a ``skipped`` list is
    given, is recorded there (line number and reason) and left out; the other lines are read as
    if it were not there (message ids derive from line numbers, so they do not shift).
    ``linenos``, when given, maps each message's (session id, message id) to its line number.
    """
    last_time: dict[str, datetime] = {}
    now = datetime.now(timezone.utc)
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                message = _jsonl_message(json.loads(line), lineno, path, scopes, now)
                too_big = oversize_reason(message, max_bytes) if max_bytes else None
                if too_big:
                    raise TranscriptError(too_big)
            except (KeyError, ValueError, TypeError, OverflowError) as exc:
                if skipped is None:
                    raise TranscriptError(f"{path}:{lineno}: {line_problem(exc)}") from exc
                skipped.append(SkippedLine(lineno, line_problem(exc)))
                continue
            last_time[message.session_id] = message.timestamp
            if linenos is not None:
                linenos[(message.session_id, message.message_id)] = lineno
            yield message
    if close_sessions:
        for session, ts in last_time.items():
            yield SessionClosed(session_id=session, closed_at=ts, reason="end of transcript")


def _jsonl_message(row: object, lineno: int, path: Path, scopes: ScopeKeys, now: datetime) -> ChatMessage:
    if not isinstance(row, dict):
        raise TranscriptError(f"not a JSON object (a {type(row).__name__})")
    session = str(row["session_id"])
    try:
        ts = _utc(row.get("timestamp"), now)
    except (ValueError, OverflowError, TypeError) as exc:
        raise TranscriptError(f"timestamp: not a date and time ({exc})") from exc
    # Without an id the line's position and text identify the message; the time
    # only when the file gives one (``now`` would make every re-ingest new).
    stamp = ts.isoformat() if row.get("timestamp") is not None else ""
    message_id = str(row.get("message_id") or hashlib.sha256(
        f"{session}|{lineno}|{row['role']}|{stamp}|{row['content']}".encode()
    ).hexdigest()[:32])
    return ChatMessage(
        message_id=message_id,
        session_id=session,
        role=row["role"],
        content=row["content"],
        timestamp=ts,
        scopes=scopes,
        name=row.get("name"),
        source_description=row.get("source_description") or f"jsonl:{path.name}",
        metadata=row.get("metadata") or {},
    )


_SESSION_KEY = re.compile(r"^session_(\d+)$")


@dataclass
class LocomoSession:
    sample_id: str
    number: int
    started: datetime
    turns: list[dict] = field(default_factory=list)

    @property
    def session_id(self) -> str:
        return f"{self.sample_id}-s{self.number}"


def locomo_sessions(conversation: dict, sample_id: str) -> list[LocomoSession]:
    conv = conversation["conversation"]
    out = []
    for key, turns in conv.items():
        m = _SESSION_KEY.match(key)
        if not m or not isinstance(turns, list):
            continue
        n = int(m.group(1))
        started = _utc(conv.get(f"session_{n}_date_time"), datetime(2023, 1, 1, tzinfo=timezone.utc))
        out.append(LocomoSession(sample_id, n, started, turns))
    return sorted(out, key=lambda s: s.number)


def locomo_text(turn: dict) -> str:
    text = turn.get("text", "")
    if turn.get("blip_caption"):
        text += f" [shares a photo: {turn['blip_caption']}]"
    return text


def read_locomo(
    path: Path, scopes: ScopeKeys, samples: Iterable[str] = (), max_sessions: int | None = None
) -> Iterator[Event]:
    """LoCoMo JSON: speaker_a plays 'user', speaker_b 'assistant'; one session_N = one chat session.

    Message ids are ``<sample_id>:<dia_id>`` (dia ids repeat across conversations), so every
    recalled fact can be traced back to the dataset's evidence ids.
    """
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, dict):
        data = [data]
    wanted = set(samples)
    for conversation in data:
        sample_id = conversation.get("sample_id", "conv")
        if wanted and sample_id not in wanted:
            continue
        conv = conversation["conversation"]
        roles = {conv["speaker_a"]: "user", conv["speaker_b"]: "assistant"}
        for session in locomo_sessions(conversation, sample_id)[:max_sessions]:
            ts = session.started
            for turn in session.turns:
                ts = ts + timedelta(seconds=1)  # keep order; the dataset only dates sessions
                yield ChatMessage(
                    message_id=f"{sample_id}:{turn['dia_id']}",
                    session_id=session.session_id,
                    role=roles.get(turn["speaker"], "user"),  # type: ignore[arg-type]
                    content=locomo_text(turn),
                    timestamp=ts,
                    scopes=scopes,
                    name=turn["speaker"],
                    source_description=f"locomo {sample_id} session {session.number}",
                    metadata={"dia_id": turn["dia_id"]},
                )
            yield SessionClosed(session_id=session.session_id, closed_at=ts, reason="end of LoCoMo session")


def read_transcript(
    path: Path, fmt: Format, scopes: ScopeKeys, samples: Iterable[str] = (), skipped: list[SkippedLine] | None = None,
    max_bytes: int | None = None, linenos: dict[tuple[str, str], int] | None = None,
) -> list[Event]:
    """Every event of a transcript file. JSONL lines that are not messages, or hold one larger
    than ``max_bytes``, go to ``skipped`` when it is given (else :class:`TranscriptError`); a
    LoCoMo file is one JSON document, read whole or refused with :class:`TranscriptError`."""
    if fmt == "jsonl":
        try:
            return list(read_jsonl(path, scopes, skipped=skipped, max_bytes=max_bytes, linenos=linenos))
        except UnicodeDecodeError as exc:
            raise TranscriptError(f"{path}: not UTF-8 text (byte {exc.start}): a JSONL transcript is UTF-8") from exc
    try:
        return list(read_locomo(path, scopes, samples))
    except (KeyError, ValueError, TypeError, AttributeError) as exc:
        raise TranscriptError(f"{path}: not a LoCoMo file ({line_problem(exc)})") from exc


def subject_and_id(event: Event, epoch: int = 0, after: str = "") -> tuple[str, str]:
    """The subject and Nats-Msg-Id to publish ``event`` with (see engram.schemas.subjects); ``after`` is
    the id of the session's previous message (a close is a duplicate only after the same one)."""
    if isinstance(event, ChatMessage):
        return subjects.in_message(event.session_id), subjects.message_dedupe_id(
            event.session_id, event.scopes, event.message_id, epoch)
    return subjects.in_close(event.session_id), subjects.close_dedupe_id(
        event.session_id, event.closed_at.isoformat(), epoch, after)


@dataclass
class IngestReport:
    messages: int = 0
    """Messages stored now (not counting ones the server already had)."""
    sessions: int = 0
    closes: int = 0
    duplicates: int = 0
    """Messages engram already had: the server's (re-sent within its duplicate window) or the
    turn-detector's (its session checkpoint lists them, at any time after)."""
    retried: int = 0
    """Events whose publish failed transiently (NATS unreachable or restarting) and was retried."""
    too_big: int = 0
    """Messages left out because they exceed the NATS server's max_payload (see ``publish_events``)."""


async def _each(events: Iterable[Event] | AsyncIterable[Event]) -> AsyncIterator[Event]:
    if isinstance(events, AsyncIterable):  # e.g. a live or paced source (bench/chaos.py)
        async for event in events:
            yield event
    else:
        for event in events:
            yield event


async def publish_events(js, events: Iterable[Event] | AsyncIterable[Event], progress=None,  # noqa: ANN001
                         retry_s: float = PUBLISH_RETRY_S,
                         too_big: Callable[[ChatMessage, str], None] | None = None) -> IngestReport:
    """Publish in order, awaiting each PubAck (so per-session order and durability hold); a
    publish that fails transiently (NATS restarting, no JetStream leader yet) is retried for up
    to ``retry_s`` before the next message goes out, so order holds across an outage too.
    A message larger than the server's max_payload (a NATS not configured as engram's: 1 MB by
    default) is handed to ``too_big`` with the reason and left out, the rest goes on; without
    ``too_big`` it stops the publishing with a :class:`TranscriptError` naming the limit.
    With tracing on (ENGRAM_OTEL_ENDPOINT), each turn's messages carry one trace (engram/observability/tracing.py)."""
    from engram.observability.tracing import TurnSpans

    turns = TurnSpans("ingest", "engram.ingest.turn")
    try:
        return await _publish_events(js, events, progress, turns, retry_s, too_big)
    finally:
        turns.end()


async def _publish_events(js, events: Iterable[Event] | AsyncIterable[Event], progress, turns,  # noqa: ANN001
                          retry_s: float, too_big: Callable[[ChatMessage, str], None] | None) -> IngestReport:
    report = IngestReport()
    sessions: set[str] = set()
    epochs = await _epochs(js)
    try:
        max_payload = server_max_payload(compat.jetstream_connection(js))
    except RuntimeError:  # a nats-py without the private hook: the server's limit is not known
        max_payload = None
    session_epoch: dict[str, int] = {}
    last_id: dict[str, str] = {}

    def transient(exc: BaseException) -> bool:
        stored_any = report.messages or report.duplicates or report.closes
        return isinstance(exc, TRANSIENT_PUBLISH_ERRORS) or (
            bool(stored_any) and isinstance(exc, nats.js.errors.NoStreamResponseError))

    known = await _KnownMessages.open(js)
    async for event in _each(events):
        if isinstance(event, ChatMessage) and max_payload:
            reason = oversize_reason(event, sys.maxsize, max_payload)  # engram's cap: checked when read
            if reason:
                if too_big is None:
                    raise TranscriptError(f"session {event.session_id} message {event.message_id}: {reason}")
                too_big(event, reason)
                report.too_big += 1
                if progress is not None:
                    progress()
                continue
        if event.session_id not in session_epoch:
            session_epoch[event.session_id] = await epochs.get(event.session_id) if epochs else 0
        subject, msg_id = subject_and_id(event, session_epoch[event.session_id], last_id.get(event.session_id, ""))
        if isinstance(event, ChatMessage):
            last_id[event.session_id] = msg_id
        # Asked before publishing: after it, the turn-detector may take the message and checkpoint
        # it before the question, and a first-time message would count as already present.
        known_before = isinstance(event, ChatMessage) and await known.has(event)
        payload = event.model_dump_json().encode()
        headers = turns.headers_for(event.session_id, event.role if isinstance(event, ChatMessage) else None,
                                    {subjects.HDR_MSG_ID: msg_id, "content-type": "application/json"})
        try:
            async for attempt in AsyncRetrying(retry=retry_if_exception(transient),
                                               wait=wait_exponential(multiplier=0.2, max=5.0),
                                               stop=stop_after_delay(retry_s), reraise=True):
                with attempt:
                    ack = await js.publish(subject, payload, headers=headers)
        except nats.js.errors.APIError as exc:
            if not is_stream_full(exc):
                raise
            # retried for retry_s like an outage (the pipeline may catch up), then said plainly
            raise TranscriptError(
                f"engram's input stream is full (ENGRAM_STREAM_MAX_BYTES) after {report.messages} new message(s) of "
                "this run: the pipeline is behind or stopped. Nothing stored was dropped; run the same ingest again "
                "later (stored messages are recognised)") from exc
        retried = attempt.retry_state.attempt_number > 1
        if retried:
            report.retried += 1
        # A duplicate ack after a retry is most likely this run's own earlier attempt, which landed
        # before its PubAck was lost: counted as published, not "already present".
        duplicate = ack.duplicate and not retried
        if isinstance(event, ChatMessage):
            sessions.add(event.session_id)
            if duplicate or known_before:
                report.duplicates += 1
            else:
                report.messages += 1
        elif not duplicate:
            report.closes += 1
        if progress is not None:
            progress()
    report.sessions = len(sessions)
    return report


class _KnownMessages:
    """Messages the turn-detector already took, by its session checkpoints (SessionState.seen):
    after the server's duplicate window a re-sent message is stored in the stream again, and the
    turn-detector drops it, so "already present" counts it. Read once per session; the last few
    messages of an open turn may be only in the detector's memory and count as published."""

    def __init__(self, kv) -> None:  # noqa: ANN001
        self._kv = kv
        self._states: dict = {}

    @classmethod
    async def open(cls, js) -> "_KnownMessages":  # noqa: ANN001
        try:
            return cls(await js.key_value(subjects.KV_TURN_SESSIONS))
        except Exception:  # noqa: BLE001 - no bucket yet, or a publisher not allowed to read it
            return cls(None)

    async def has(self, message: ChatMessage) -> bool:
        if self._kv is None:
            return False
        if message.session_id not in self._states:
            try:
                entry = await self._kv.get(message.session_id)
                seen = json.loads(entry.value).get("seen", "") if entry.value else ""
            except Exception:  # noqa: BLE001 - no checkpoint (a new session), or unreadable: count as published
                seen = ""
            self._states[message.session_id] = seen if isinstance(seen, str) else ""
        return seen_holds(self._states[message.session_id], message_dedupe_key(message))


async def _epochs(js):  # noqa: ANN001, ANN202
    from engram.runtime.epochs import SessionEpochs

    try:
        return await SessionEpochs.open(js)
    except Exception:  # noqa: BLE001 - a NATS without engram's buckets yet: nothing was ever deleted
        return None
