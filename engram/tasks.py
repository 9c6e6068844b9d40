"""Stopping background tasks for sure."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("engram.tasks")


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


class Periodic:
    """A background round every ``interval_s`` from :meth:`start` to :meth:`stop`: the subclass's
    ``tick(js)``. A round that fails is logged (debug: what these loops do is never worth taking
    a service down) and the next one runs; :meth:`stop` ends the loop for sure (:func:`cancel_and_wait`)."""

    name = "periodic task"
    interval_s: float
    _task: asyncio.Task[None] | None = None

    async def tick(self, js: Any) -> Any:
        raise NotImplementedError

    def start(self, js: Any) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(js), name=self.name)

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    async def _run(self, js: Any) -> None:
        while True:
            try:
                await self.tick(js)
            except Exception:  # noqa: BLE001 - the next round tries again
                log.debug("%s: round failed", self.name, exc_info=True)
            await asyncio.sleep(self.interval_s)
