"""Dead letters: publish with the reason, list, and replay into the original subject.

A dead letter keeps the original message and headers with secrets scrubbed (the turn-detector's
scrubber: a dead letter is stored for 30 days and must not keep what the pipeline would never
store), plus Engram-Dlq-* headers; replay works from the scrubbed text. Its Nats-Msg-Id
is derived from the source stream sequence, so a redelivered poison message is dead-lettered
once. Replay re-publishes the body with a fresh Nats-Msg-Id (the original id is still inside the
input stream's duplicate window and would be dropped), then deletes the dead letter.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any
from datetime import datetime, timezone

from nats.aio.client import Client
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from prometheus_client import Counter

from engram import compat
from engram.text.secrets import scrub_json, scrub_secrets
from engram.schemas import subjects

DLQ_MESSAGES = Counter(
    "engram_dlq_messages_total",
    "Messages sent to a dead-letter subject, by stage and reason.",
    ["stage", "reason"],
)
STAGES = ("turn_detector", "extractor", "summary_gate", "sessions")
"""The stages that dead-letter (each service's ``STAGE``, the last token of ``engram.dlq.<stage>``):
what `engram dlq list/replay --stage` accepts."""
HDR_ORIGINAL_MSG_ID = "Engram-Original-Msg-Id"
HDR_TRUNCATED = "Engram-Dlq-Truncated"
"""Set when the dead letter keeps only the head of a payload too large to store with its headers:
the original length in bytes."""


def subject_token(subject: str) -> str:
    """The last token of a subject: the session or group an ``engram.<kind>.[<p>.]<token>``
    message was published for. Stages dead-letter a message whose body names another one."""
    return subject.rsplit(".", 1)[-1]


def publish_subject_of(stored_subject: str) -> str:
    """Undo the partition transforms: engram.in.<p>.<kind>.<s> -> engram.in.<kind>.<s> and
    engram.<episode|delta>.<p>.<group> -> engram.<episode|delta>.<group>."""
    tokens = stored_subject.split(".")
    if len(tokens) == 5 and tokens[:2] == ["engram", "in"] and tokens[2].isdigit():
        return ".".join(tokens[:2] + tokens[3:])
    if len(tokens) == 4 and tokens[0] == "engram" and tokens[1] in ("episode", "delta") and tokens[2].isdigit():
        return ".".join([tokens[0], tokens[1], tokens[3]])
    return stored_subject


async def dead_letter(
    js: JetStreamContext,
    *,
    stage: str,
    reason: str,
    detail: str,
    subject: str,
    payload: bytes,
    headers: dict[str, str] | None,
    source_id: str,
) -> None:
    """Publish one dead letter and wait for the PubAck (the caller acks the source after)."""
    payload = scrub_payload(payload)
    out = {k: scrub_secrets(v).text for k, v in (headers or {}).items() if not _is_transport_header(k)}
    if subjects.HDR_MSG_ID in out:
        out[HDR_ORIGINAL_MSG_ID] = out.pop(subjects.HDR_MSG_ID)
    out.update(
        {
            subjects.HDR_DLQ_STAGE: stage,
            subjects.HDR_DLQ_REASON: reason,
            subjects.HDR_DLQ_DETAIL: detail[:1000],
            subjects.HDR_DLQ_SUBJECT: publish_subject_of(subject),
            subjects.HDR_DLQ_TIME: datetime.now(timezone.utc).isoformat(),
            subjects.HDR_MSG_ID: f"dlq:{stage}:{source_id}",
        }
    )
    # Payload and headers together must fit NATS's max_payload, or the server refuses the publish
    # and closes the connection: the source would never be acked. A message published near that
    # limit (or grown by the scrub's U+FFFD replacements) keeps its head and says how long it was.
    # (the headers nats-py adds, Nats-Expected-Stream and Engram-Dlq-Truncated: within the margin)
    room = _max_payload(js) - _header_bytes(out) - 256
    if len(payload) > room:
        out[HDR_TRUNCATED] = str(len(payload))
        payload = payload[: max(0, room)]
    await js.publish(subjects.dlq(stage), payload, headers=out, stream=subjects.STREAM_DLQ)
    DLQ_MESSAGES.labels(stage=stage, reason=reason).inc()


def _max_payload(js: JetStreamContext) -> int:
    return int(compat.jetstream_connection(js).max_payload)  # the server's limit, from its INFO


def _header_bytes(headers: dict[str, str]) -> int:
    """Size of the NATS header block (``NATS/1.0\\r\\n``, ``key: value\\r\\n`` each, ``\\r\\n``)."""
    return 12 + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in headers.items())


def scrub_payload(payload: bytes) -> bytes:
    """Secrets scrubbed from a payload: JSON string values one by one (the document stays valid
    JSON, so a scrubbed dead letter still replays), anything else as text."""
    text = payload.decode("utf-8", errors="replace")
    try:
        document = json.loads(text)
        scrubbed, counts = scrub_json(document)
    except (ValueError, RecursionError):
        # not JSON, or nested deeper than the parser or the walk goes (hostile input): as text
        return scrub_secrets(text).text.encode("utf-8")
    return json.dumps(scrubbed, ensure_ascii=False).encode("utf-8") if counts else payload


def _is_transport_header(name: str) -> bool:
    """Headers that describe one publish (our DLQ bookkeeping, and every ``Nats-`` directive to
    the server: expected stream or sequence, schedules, rollups, TTLs) and must not travel with a
    dead letter or its replay. A publisher's forged ``Nats-Rollup`` was stored with its message
    and then made the DLQ stream refuse the dead letter, so the message was never acked and held
    its partition (tests/fuzz). ``Nats-Msg-Id`` is kept apart: it becomes Engram-Original-Msg-Id."""
    lower = name.lower()
    return lower.startswith("engram-dlq-") or (lower.startswith("nats-") and lower != subjects.HDR_MSG_ID.lower())


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    stage: str
    reason: str
    detail: str
    subject: str
    time: str
    size: int
    headers: dict[str, str]
    payload: bytes


async def list_dead_letters(js: JetStreamContext, stage: str | None = None, limit: int = 1000) -> list[DeadLetter]:
    """Read dead letters without consuming them (an ephemeral, ack-none ordered read)."""
    filt = subjects.dlq(stage) if stage else "engram.dlq.*"
    info = await js.stream_info(subjects.STREAM_DLQ)
    if info.state.messages == 0:
        return []
    sub = await js.subscribe(
        filt,
        stream=subjects.STREAM_DLQ,
        ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
    )
    out: list[DeadLetter] = []
    try:
        while len(out) < limit:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except (asyncio.TimeoutError, TimeoutError):
                break
            h = msg.headers or {}
            out.append(
                DeadLetter(
                    seq=msg.metadata.sequence.stream,
                    stage=h.get(subjects.HDR_DLQ_STAGE, "?"),
                    reason=h.get(subjects.HDR_DLQ_REASON, "?"),
                    detail=h.get(subjects.HDR_DLQ_DETAIL, ""),
                    subject=h.get(subjects.HDR_DLQ_SUBJECT, "?"),
                    time=h.get(subjects.HDR_DLQ_TIME, ""),
                    size=len(msg.data),
                    headers=dict(h),
                    payload=msg.data,
                )
            )
            if msg.metadata.num_pending == 0:
                break
    finally:
        await sub.unsubscribe()
    return out


async def replay_dead_letters(nc: Client, stage: str | None = None) -> int:
    """Re-publish dead letters to their original subjects; returns how many were replayed."""
    js = nc.jetstream()
    replayed = 0
    for dl in await list_dead_letters(js, stage):
        headers = {k: v for k, v in dl.headers.items() if not _is_transport_header(k)}
        headers.pop(HDR_ORIGINAL_MSG_ID, None)
        headers[subjects.HDR_MSG_ID] = f"replay:{dl.seq}"
        await js.publish(dl.subject, dl.payload, headers=headers)
        await js.delete_msg(subjects.STREAM_DLQ, dl.seq)
        replayed += 1
    return replayed
