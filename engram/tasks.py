"""Stopping background tasks for sure."""

from __future__ import annotations

import asyncio


async def cancel_and_wait(task: asyncio.Task, *, retry_s: float = 0.5) -> None:
    """Cancel ``task`` and wait until it has ended, cancelling again while it runs on.

    One ``cancel()`` is not enough on Python 3.11: ``asyncio.wait_for`` (inside nats-py's requests)
    drops a cancellation that arrives as its inner future completes, so a polling loop carried on
    and ``await task`` never returned (a service's stop() hung: tests/engram/test_tasks.py)."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=retry_s)
    if not task.cancelled():
        task.exception()  # a loop that failed before the stop: marked retrieved (its owner logged it)
