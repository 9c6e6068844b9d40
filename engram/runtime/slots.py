"""A worker's slot, handed on while its work waits on a stalled call.

Why (issue 25, item 1): a replica starts work only into one of its ``capacity`` slots (the
model's parallel calls: engram/runtime/service.py's :class:`~engram.runtime.service.CapacityPuller`). A group
whose model call hangs (a provider stuck on one request, SDK retries, a 60 s timeout) kept its
slot all that time, so every other group ran on one slot fewer: with 8 slots, +4.6 s on the
other groups' freshness p95 in bench/scale_out.py's hung-group run, though that group delays no
other group's order. The stalled work does not use the slot (it waits on the network), so it
hands the slot on: another group starts in it, and the stalled work finishes outside the count.

Bounded: a puller lends at most ``capacity`` slots at once (in flight at most twice the slots),
so a provider that stalls every call (an outage) does not turn into unbounded concurrency; the
deployment's shared rate limit (engram/models/rate_limit.py) still meters every call.

The slot travels in a context variable: the puller sets it for the task that runs the work, and
the work (engram/runtime/group_order.py's watchdog) lends it through :data:`CURRENT` without knowing
the puller.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable


class Slot:
    """One slot held by a piece of work; :meth:`lend` gives it back early (once)."""

    def __init__(self, lend: Callable[[], bool]) -> None:
        self._lend = lend
        self.held = True

    def lend(self) -> bool:
        """Hand the slot to other work now; False when it was already handed on or the owner
        lends no more (its bound is reached)."""
        if not self.held or not self._lend():
            return False
        self.held = False
        return True


CURRENT: contextvars.ContextVar[Slot | None] = contextvars.ContextVar("engram_slot", default=None)

