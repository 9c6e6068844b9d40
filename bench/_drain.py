"""Waiting until the pipeline has handled everything: one helper for the benches.

"Drained" = every durable consumer of the given streams has nothing pending and nothing
unacknowledged (optionally only durables whose name starts with ``durable_prefix``), for
``quiet_s`` in a row, and the episode stream holds at least ``expect_episodes`` messages. NATS
errors while it restarts (the chaos bench restarts it) are waited out when ``tolerate_errors``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import nats.js.errors

from engram.schemas import subjects


async def consumer_state(js, streams: Iterable[str]) -> dict[tuple[str, str], tuple[int, int, int]]:  # noqa: ANN001
    """(stream, durable) -> (delivered stream seq, pending, ack pending)."""
    out = {}
    for stream in streams:
        try:
            for c in await js.consumers_info(stream):
                if c.config.durable_name:
                    out[(stream, c.name)] = (c.delivered.stream_seq or 0, c.num_pending or 0, c.num_ack_pending or 0)
        except nats.js.errors.NotFoundError:
            pass
    return out


def busy(state: dict, durable_prefix: str = "") -> bool:
    return any(pending or ack_pending for (_, name), (_, pending, ack_pending) in state.items()
               if name.startswith(durable_prefix))


async def wait_drained(js, streams: Iterable[str], *, timeout: float, expect_episodes: int | None = None,  # noqa: ANN001
                       quiet_s: float = 0.0, poll_s: float = 0.5, durable_prefix: str = "",
                       tolerate_errors: bool = False) -> float:
    """Seconds until drained (see the module docstring); RuntimeError after ``timeout``."""
    streams = tuple(streams)
    started = time.monotonic()
    quiet_since = None
    while time.monotonic() - started < timeout:
        try:
            state = await consumer_state(js, streams)
            episodes = (await js.stream_info(subjects.STREAM_EPISODES)).state.messages
        except Exception:  # noqa: BLE001 - NATS restarting
            if not tolerate_errors:
                raise
            await asyncio.sleep(poll_s)
            continue
        if not busy(state, durable_prefix) and (expect_episodes is None or episodes >= expect_episodes):
            quiet_since = quiet_since or time.monotonic()
            if time.monotonic() - quiet_since >= quiet_s:
                return time.monotonic() - started
        else:
            quiet_since = None
        await asyncio.sleep(poll_s)
    raise RuntimeError(f"pipeline not drained after {timeout:.0f} s: {await consumer_state(js, streams)}")
