"""Publishing and reading helpers for turn-detector tests against a real JetStream."""

from __future__ import annotations

import asyncio
import time
from datetime import datetime, timedelta, timezone

from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from engram.schemas import ChatMessage, Episode, ScopeKeys, SessionClosed, subjects

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def msg(session: str, mid: str, role: str, content: str, i: int = 0, **kw) -> ChatMessage:  # noqa: ANN003
    return ChatMessage(
        message_id=mid, session_id=session, role=role, content=content, timestamp=T0 + timedelta(seconds=i), **kw
    )


async def publish(js: JetStreamContext, event: ChatMessage | SessionClosed, msg_id: str | None = None) -> None:
    if isinstance(event, ChatMessage):
        subject, default_id = subjects.in_message(event.session_id), event.message_id
    else:
        subject, default_id = subjects.in_close(event.session_id), f"close:{event.session_id}"
    await js.publish(subject, event.model_dump_json().encode(), headers={subjects.HDR_MSG_ID: msg_id or default_id})


async def close(js: JetStreamContext, session: str) -> None:
    await publish(js, SessionClosed(session_id=session, closed_at=T0))


async def read_all(js: JetStreamContext, stream: str, filter_subject: str = ">", settle: float = 0.3) -> list:
    """Every message currently in ``stream`` matching the filter (ordered, no acks)."""
    try:
        info = await js.stream_info(stream)
    except Exception:  # noqa: BLE001
        return []
    if info.state.messages == 0:
        return []
    sub = await js.subscribe(
        filter_subject, stream=stream, ordered_consumer=True,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
    )
    out = []
    try:
        while True:
            try:
                out.append(await sub.next_msg(timeout=settle))
            except (asyncio.TimeoutError, TimeoutError):
                break
    finally:
        await sub.unsubscribe()
    return out


async def episodes(js: JetStreamContext) -> list[Episode]:
    return [Episode.model_validate_json(m.data) for m in await read_all(js, subjects.STREAM_EPISODES)]


async def wait_for(predicate, timeout: float = 15.0, interval: float = 0.1):  # noqa: ANN001, ANN201
    """Poll an async predicate until it returns a truthy value (returned) or time runs out."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(interval)
    return last


def scopes(workspace: str | None = None, user: str | None = None) -> ScopeKeys:
    return ScopeKeys(workspace=workspace, user=user)
