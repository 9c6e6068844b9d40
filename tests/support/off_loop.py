"""Prove, without timing, that a blocking method runs off the event loop while the loop runs.

The method is wrapped so that it waits for an event only a task on the loop can set. Called on
the loop thread it would wait for ever (here: fail after ``timeout`` s); in a worker thread it
goes on to the real method. Timing-based checks (tick gaps against the call's length) flaked on
CI's shared cores.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


async def run_proving_off_loop(
    monkeypatch: pytest.MonkeyPatch,
    owner: type,
    method: str,
    call: Callable[[], Awaitable[T]],
    timeout: float = 30.0,
) -> T:
    """Await ``call()`` with ``owner.method`` wrapped; return its result, fail if it blocked the loop."""
    loop_thread = threading.get_ident()
    loop_ran = threading.Event()
    threads: list[int] = []
    real = getattr(owner, method)

    def once_the_loop_has_run(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        if not loop_ran.wait(timeout=timeout):
            raise AssertionError(f"the event loop did not run while {owner.__name__}.{method} ran")
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, method, once_the_loop_has_run)

    async def set_from_the_loop() -> None:
        while not threads:  # set only once the method has started
            await asyncio.sleep(0.001)
        loop_ran.set()

    setter = asyncio.create_task(set_from_the_loop())
    try:
        result = await call()
    finally:
        setter.cancel()
    assert threads and all(t != loop_thread for t in threads), "ran on the event loop's thread"
    return result
