"""engram.tasks.cancel_and_wait: a background loop that swallows a cancellation (as asyncio.wait_for
inside nats-py can on Python 3.11) is still stopped; a service's stop() used to hang on it."""

from __future__ import annotations

import asyncio

from engram.tasks import cancel_and_wait


async def test_a_loop_that_swallows_one_cancellation_is_still_stopped() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                if swallowed < 2:  # what a lost cancellation looks like to the loop
                    swallowed += 1
                    continue
                raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, retry_s=0.05), 5)
    assert task.done() and swallowed == 2


async def test_a_task_that_already_failed_is_collected_quietly() -> None:
    async def broken() -> None:
        raise RuntimeError("boom")

    task = asyncio.create_task(broken())
    await asyncio.sleep(0.01)
    await cancel_and_wait(task)
    assert task.done()
