"""`engram status`: health of each part, stream/consumer backlog, and pipeline counts."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
import urllib.parse
import urllib.request
from typing import Any

import nats
import nats.js.errors
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from engram.stack.embedded import http_ok, redacted_url, redis_ping
from engram.runtime.kv import last_values
from engram.runtime.nats_client import quick_connect_options, server_version
from engram.settings import EngramSettings
from engram.schemas import subjects

MAX_SESSIONS_SCANNED = 20_000


def summary_counters(metrics_url: str) -> dict[str, Any]:
    """engram_summary_* counters scraped from a summary-gate's /metrics:
    {"refreshed": {reason: n}, "skipped": {reason: n}, "deferred": n}; {} when unreachable."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(metrics_url, timeout=2) as resp:  # noqa: S310 - loopback URL from the runtime file
            text = resp.read().decode()
    except (OSError, http.client.HTTPException):
        return {}
    out: dict[str, Any] = {"refreshed": {}, "skipped": {}, "composed": {}, "deferred": 0.0, "llm_calls": 0.0,
                           "deltas": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "engram_summary_refreshed_total":
                out["refreshed"][sample.labels["reason"]] = sample.value
            elif sample.name == "engram_summary_skipped_total":
                out["skipped"][sample.labels["reason"]] = sample.value
            elif sample.name == "engram_summary_composed_total":
                out["composed"][sample.labels["reason"]] = sample.value
            elif sample.name == "engram_summary_deferred_total":
                out["deferred"] = sample.value
            elif sample.name == "engram_llm_calls_total" and sample.labels.get("stage") == "summary_gate":
                out["llm_calls"] += sample.value
            elif sample.name == "engram_summary_gate_messages_total" and sample.labels.get("kind") == "delta" \
                    and sample.labels.get("outcome") in ("refresh", "skip", "defer"):
                out["deltas"] += sample.value
    return out


def summary_gate_table(summary: dict[str, Any]) -> Any:
    """A rich Table of the summary-gate's decisions by reason (from :func:`summary_counters`);
    print :func:`summary_caption` under it (a caption would wrap at the table's narrow width)."""
    from rich.table import Table

    table = Table(title="summary-gate decisions (since the service started)")
    for col in ("decision", "reason", "n"):
        table.add_column(col, justify="right" if col == "n" else "left")
    for reason, n in sorted(summary.get("refreshed", {}).items()):
        table.add_row("refreshed", reason, str(int(n)))
    for reason, n in sorted(summary.get("composed", {}).items()):
        table.add_row("  composed, no model call", reason, str(int(n)))
    for reason, n in sorted(summary.get("skipped", {}).items()):
        table.add_row("skipped", reason, str(int(n)))
    table.add_row("deferred", "burst", str(int(summary.get("deferred", 0))))
    return table


def summary_caption(summary: dict[str, Any], model: str | None = None) -> str | None:
    """What the gate saved, in words: refresh-always (graphiti's behaviour) calls the summary
    model once per delta; the gate calls it ``llm_calls`` times. The counter is named for LLMs,
    but counts calls to whatever model summarises, the offline rules model included."""
    deltas, calls = int(summary.get("deltas", 0)), int(summary.get("llm_calls", 0))
    if not deltas:
        return None
    text = (f"{deltas} deltas, {calls} summary-model {'call' if calls == 1 else 'calls'}: "
            f"{100 * (1 - calls / deltas):.0f}% fewer than one call per delta")
    return text + (f" (summary model: {model})" if model else "")


def _graph_ping(url: str) -> tuple[bool, str]:
    parsed = urllib.parse.urlparse(url)
    return redis_ping(parsed.hostname or "127.0.0.1", parsed.port or 6379, parsed.password)


async def count_filtered(js, stream: str, filter_subject: str) -> int:  # noqa: ANN001
    """Messages in ``stream`` matching ``filter_subject`` (an ephemeral consumer's num_pending)."""
    info = await js.add_consumer(
        stream,
        ConsumerConfig(
            filter_subject=filter_subject,
            deliver_policy=DeliverPolicy.ALL,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=5.0,
            mem_storage=True,
        ),
    )
    try:
        return info.num_pending
    finally:
        await js.delete_consumer(stream, info.name)


COUNT_MEANINGS: dict[str, str] = {
    "messages": "chat messages still in ENGRAM_IN: raw input is erased ENGRAM_PROCESSED_RETENTION_S after its turn "
                "is stored (0 after a while is normal)",
    "session_closes": "session close events still in ENGRAM_IN (erased like messages)",
    "episodes": "episodes in ENGRAM_EPISODES: one per turn and scope (session, workspace, user), promotions, "
                "text episodes and triplets",
    "node_deltas": "entity changes sent to the summary-gate (ENGRAM_DELTAS): one per entity an episode touched",
    "summary_decisions": "the summary-gate's refresh/skip decisions kept in ENGRAM_SUMMARY",
    "summary_audits": "sampled skip audits kept in ENGRAM_SUMMARY",
    "dead_letters": "messages set aside with a reason (engram dlq list)",
    "sessions": "publisher sessions the turn-detector has seen",
    "turns": "turns completed (user message + replies), over all sessions",
    "open_turns": "turns still waiting for their reply or idle timeout",
}
"""What each of `engram status`'s counts counts (its table prints them next to the numbers)."""


async def _turn_totals(js) -> dict[str, int]:  # noqa: ANN001
    """Sum per-session counters from the turn-detector's KV checkpoints.

    Every key, through engram.runtime.kv.last_values (not KeyValue.keys(), whose end-of-listing
    detection can return early on a loaded server).
    """
    totals = {"sessions": 0, "turns": 0, "open_turns": 0}
    async with last_values(js, subjects.KV_TURN_SESSIONS) as (expected, entries):
        totals["sessions"] = expected
        if expected > MAX_SESSIONS_SCANNED:
            totals["turns"] = totals["open_turns"] = -1  # too many sessions to sum on demand
            return totals
        async for _session, value in entries:
            state = json.loads(value)
            totals["turns"] += int(state.get("turns_completed", 0))
            totals["open_turns"] += 1 if state.get("open_turn") else 0
    return totals


async def collect_status(settings: EngramSettings) -> dict[str, Any]:
    started = time.perf_counter()
    runtime = settings._runtime  # noqa: SLF001 - the file `engram up` wrote, if any
    status: dict[str, Any] = {"parts": {}, "streams": {}, "counts": {}, "services": {}}
    try:
        nats_url = settings.resolved_nats_url()
    except RuntimeError as exc:
        status["parts"]["nats"] = {"ok": False, "detail": str(exc)}
        status["ok"] = False
        return status
    try:
        nc = await nats.connect(nats_url, **quick_connect_options(), **settings.nats_options())
    except Exception as exc:  # noqa: BLE001
        status["parts"]["nats"] = {"ok": False, "url": nats_url, "detail": type(exc).__name__}
        status["ok"] = False
        return status
    try:
        js = nc.jetstream()
        account = await js.account_info()
        status["parts"]["nats"] = {
            "ok": True,
            "url": nats_url,
            "server_version": server_version(nc),
            "jetstream_streams": account.streams,
        }
        streams = (subjects.STREAM_IN, subjects.STREAM_EPISODES, subjects.STREAM_DELTAS, subjects.STREAM_SUMMARY,
                   subjects.STREAM_DLQ)
        for stream in streams:
            try:
                info = await js.stream_info(stream)
            except nats.js.errors.NotFoundError:
                status["streams"][stream] = None
                continue
            entry: dict[str, Any] = {"messages": info.state.messages, "bytes": info.state.bytes, "consumers": {}}
            for ci in await js.consumers_info(stream):
                if not ci.config.durable_name:
                    continue
                entry["consumers"][ci.name] = {
                    "pending": ci.num_pending,
                    "ack_pending": ci.num_ack_pending,
                    "redelivered": ci.num_redelivered,
                    "waiting": ci.num_waiting,
                }
            status["streams"][stream] = entry
        counts: dict[str, Any] = {}
        if status["streams"].get(subjects.STREAM_IN):
            counts["messages"] = await count_filtered(js, subjects.STREAM_IN, "engram.in.*.message.*")
            counts["session_closes"] = await count_filtered(js, subjects.STREAM_IN, "engram.in.*.close.*")
        counts["episodes"] = (status["streams"].get(subjects.STREAM_EPISODES) or {}).get("messages", 0)
        counts["node_deltas"] = (status["streams"].get(subjects.STREAM_DELTAS) or {}).get("messages", 0)
        if status["streams"].get(subjects.STREAM_SUMMARY):
            counts["summary_decisions"] = await count_filtered(js, subjects.STREAM_SUMMARY, "engram.summary.*")
            counts["summary_audits"] = await count_filtered(js, subjects.STREAM_SUMMARY, "engram.summary.audit.*")
        counts["dead_letters"] = (status["streams"].get(subjects.STREAM_DLQ) or {}).get("messages", 0)
        counts.update(await _turn_totals(js))
        status["counts"] = counts
    finally:
        await nc.close()

    graph_url = settings.resolved_graph_url()
    if graph_url:
        ok, detail = await asyncio.to_thread(_graph_ping, graph_url)
        status["parts"]["falkordb"] = {"ok": ok, "url": redacted_url(graph_url), "detail": detail}
    for name, svc in (runtime.get("services") or {}).items():
        ok = await asyncio.to_thread(http_ok, f"{svc['url']}/healthz")
        status["services"][name] = {"ok": ok, "url": svc["url"], "metrics": f"{svc['url']}/metrics",
                                    "restarts": svc.get("restarts", 0)}
    gate = (runtime.get("services") or {}).get("summary-gate")
    if gate and status["services"].get("summary-gate", {}).get("ok"):
        status["summary_gate"] = await asyncio.to_thread(summary_counters, f"{gate['url']}/metrics")
    status["ok"] = all(p.get("ok") for p in status["parts"].values()) and all(
        s["ok"] for s in status["services"].values()
    )
    status["took_ms"] = round((time.perf_counter() - started) * 1000, 1)
    return status
