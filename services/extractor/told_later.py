"""A change told later, dated earlier, still ends the fact it contradicts (issue 24, item 4).

Told "Maya lives in Lisbon" on 2 March and, a week later, "Maya moved to Porto last month", the
Porto fact is dated 1 February (engram/text/temporal.py grounds "last month") and the Lisbon fact 2
March (the day it was said: it names no date). graphiti's date rule for contradicted facts
(``_apply_temporal_invalidation``) then reads the Lisbon fact as the newer one and ends the
*Porto* fact, the current value, as of 2 March, leaving Lisbon current. That rule is right for a
history ingested out of order (a January episode ingested after a March one), wrong here: the
Lisbon fact was already in force when the switch was told.

The rule here, around graphiti's: a contradicted fact that starts after the new fact but no later
than the new fact's episode was told (its reference time) is ended by the new fact, as of that
reference time (when it is known to hold no more; the new fact keeps its own start). Every other
candidate goes to graphiti's rule unchanged, as does every call made while no episode's
reference time is set (graphiti's own ``add_episode``). The extractor sets it around
``resolve_extracted_edges`` (services/extractor/pipeline.py, :func:`telling`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from graphiti_core.utils.datetime_utils import ensure_utc, utc_now

from engram import compat

TOLD_AT: ContextVar[datetime | None] = ContextVar("engram_told_at", default=None)
"""The reference time of the episode being resolved (None: no engram extraction in progress)."""


@contextlib.contextmanager
def telling(reference_time: datetime) -> Iterator[None]:
    """Resolve edges as told at ``reference_time`` (for the rule in this module)."""
    token = TOLD_AT.set(ensure_utc(reference_time))
    try:
        yield
    finally:
        TOLD_AT.reset(token)


def ended_by_later_telling(resolved_edge: Any, candidates: list[Any], told_at: datetime) -> list[Any]:
    """The contradicted candidates that started after ``resolved_edge`` but by ``told_at``, still
    open: the ones graphiti's rule would wrongly keep (pure)."""
    start = ensure_utc(resolved_edge.valid_at)
    if start is None or resolved_edge.invalid_at is not None or resolved_edge.expired_at is not None:
        return []
    return [c for c in candidates
            if c.invalid_at is None and c.valid_at is not None and start < ensure_utc(c.valid_at) <= told_at]


def wrap(graphiti_rule: compat.TemporalInvalidation) -> compat.TemporalInvalidation:
    def apply_temporal_invalidation(resolved_edge: Any, candidates: list[Any]) -> list[Any]:
        told_at = TOLD_AT.get()
        ended = ended_by_later_telling(resolved_edge, candidates, told_at) if told_at is not None else []
        if not ended:
            return graphiti_rule(resolved_edge, candidates)
        now = utc_now()
        for edge in ended:
            edge.invalid_at = told_at
            edge.expired_at = edge.expired_at or now
        rest = [c for c in candidates if all(c is not e for e in ended)]
        return ended + graphiti_rule(resolved_edge, rest)

    return apply_temporal_invalidation


def install() -> None:
    """Put :func:`wrap` around graphiti's rule (idempotent; engram/compat.py)."""
    compat.wrap_temporal_invalidation(wrap)


install()
