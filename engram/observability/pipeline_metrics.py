"""Freshness and backlog, measured by the services themselves (no external exporter needed).

* ``engram_pipeline_freshness_seconds{stage}``: seconds from a turn's earliest message being
  stored in ENGRAM_IN (its JetStream time, carried as ``Episode.first_published_at`` and
  ``NodeDelta.first_published_at``) to ``stage="graph"`` (the extractor saved the episode) and
  ``stage="summary"`` (the summary-gate decided, refreshed or skipped, on a delta of it; deferred
  decisions are measured when they are not deferred any more only through the tick, which
  carries no publish time, so they are not in the histogram). Wall clocks of the NATS server and
  the service are compared: clock skew between machines shows up here.
* ``engram_stage_backlog_messages{stage,partition}``: messages waiting for a stage, read every
  ``interval_s`` from JetStream consumer info of its partition durables (``num_pending`` +
  ``num_ack_pending``). Partitions are bounded (ENGRAM_PARTITIONS <= 256): a low-cardinality label.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

from prometheus_client import Gauge, Histogram

from engram.tasks import Periodic

log = logging.getLogger(__name__)

FRESHNESS_SECONDS = Histogram(
    "engram_pipeline_freshness_seconds",
    "Seconds from a turn's first message stored in ENGRAM_IN to its episode in the graph (stage=graph) "
    "and to a summary decision on it (stage=summary).",
    ["stage"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600),
)
BACKLOG_MESSAGES = Gauge(
    "engram_stage_backlog_messages",
    "Messages waiting for a stage (JetStream num_pending + num_ack_pending of its partition durables).",
    ["stage", "partition"],
)


def observe_freshness(stage: str, first_published_at: datetime | None, now: datetime | None = None) -> float | None:
    """Record ``now - first_published_at`` under ``stage`` (nothing when the time is unknown)."""
    if first_published_at is None:
        return None
    seconds = max(0.0, ((now or datetime.now(timezone.utc)) - first_published_at).total_seconds())
    FRESHNESS_SECONDS.labels(stage=stage).observe(seconds)
    return seconds


class BacklogMonitor(Periodic):
    """Every ``interval_s``, sets ``engram_stage_backlog_messages{stage,partition}`` from the
    consumer info of ``durables`` (partition = index in the list) on ``stream``.

    Every replica of a stage reports the same numbers (they read the same durables): aggregate
    with ``max by (stage, partition)``, not ``sum``."""

    def __init__(self, stage: str, stream: str, durables: Sequence[str], *, interval_s: float = 15.0) -> None:
        self.stage = stage
        self.stream = stream
        self.durables = list(durables)
        self.interval_s = interval_s
        self.name = f"{stage} backlog monitor"

    async def poll_once(self, js: Any) -> dict[int, int]:
        """Read every durable once; returns {partition: backlog} of those that answered."""
        backlog: dict[int, int] = {}
        for p, durable in enumerate(self.durables):
            try:
                info = await js.consumer_info(self.stream, durable)
            except Exception as exc:  # noqa: BLE001 - not created yet, NATS restarting: next round
                log.debug("backlog: no consumer info for %s (%s)", durable, type(exc).__name__)
                continue
            backlog[p] = int(info.num_pending or 0) + int(info.num_ack_pending or 0)
            BACKLOG_MESSAGES.labels(stage=self.stage, partition=str(p)).set(backlog[p])
        return backlog

    tick = poll_once  # every interval_s, as a Periodic
