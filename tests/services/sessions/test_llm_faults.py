"""The session close stage under the LLM simulator's faults (bench/llm_simulator.py): the real
sessions service on real NATS + FalkorDB, engram's OpenAI-compatible client talking HTTP to the
simulator.

The close stage is best effort by design (seed 004, section 7): its two LLM calls (summary and
user facts) never block the close. So the outcomes differ from the extractor's: a transient fault
is retried inside the call (SDK retry, re-ask, tighter cap) and the segment closes with the
model's summary and facts; a fault that outlasts those retries closes the segment anyway, with the
fallback summary and no facts, counted in ``engram_sessions_close_steps_total{step,outcome}``.
Never lost (the record is stored once), never dead-lettered, never stuck (the consumer drains).
Persistent rate limits are left out here: they add graphiti's 15-70 s backoff and end in the same
``failed`` outcome as the 5xx case (the extractor's tests cover them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from bench.llm_simulator import (
    Fault,
    LLMSimulator,
    empty,
    hang,
    invalid_json,
    rate_limit,
    schema_violation,
    server_error,
    slow,
    truncated,
)
from engram.models.openai_compat import llm_stats
from engram.schemas import subjects
from engram.schemas.memory import FALLBACK_SUMMARY
from tests.services.sessions.helpers import ENGLISH, segment
from tests.services.sessions.test_app import service
from tests.services.turn_detector.helpers import read_all
from tests.support.llm import simulator_client


def steps(step: str, outcome: str) -> float:
    return REGISTRY.get_sample_value("engram_sessions_close_steps_total", {"step": step, "outcome": outcome}) or 0.0


def client(sim: LLMSimulator, timeout_s: float) -> Any:
    return simulator_client(sim, timeout_s=timeout_s, max_retries=1)


TRANSIENT: dict[str, list[Fault]] = {
    "rate_limit_429_retry_after": [rate_limit(retry_after_s=0.5)],
    "server_error_503": [server_error(503)],
    "hang_past_the_client_timeout": [hang(30.0)],
    "slow": [slow(1.0)],
    "invalid_json": [invalid_json()],
    "truncated_finish_reason_length": [truncated()],
    "schema_violating_json": [schema_violation()],
    "empty_answer": [empty()],
}


@pytest.mark.parametrize("mode", sorted(TRANSIENT))
async def test_a_transient_fault_still_gives_the_models_summary_and_facts(
    mode: str, sim: LLMSimulator, clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    llm = client(sim, timeout_s=2.0)
    async with service(clean_nats, falkordb_server.url, tmp_path, llm) as h:
        sim.schedule(*[Fault(f.kind, f.status, f.retry_after_s, f.seconds, "HybridSessionSummary") for f in TRANSIENT[mode]])
        sim.schedule(*[Fault(f.kind, f.status, f.retry_after_s, f.seconds, "UserFacts") for f in TRANSIENT[mode]])
        event = segment(f"sf-{mode.replace('_', '-')}", ENGLISH, user=f"u-{mode.replace('_', '-')}")
        await h.publish(event)
        record = await h.closed(event, timeout=60)
        assert sim.pending == 0, "the scheduled faults were not all served"
        assert record.summary_source == "llm" and "- TOPICS: " in record.summary
        assert await h.store.preferences(h.group(event)), "the facts step lost its answer"
        stats = llm_stats(llm)
        assert stats is not None and stats.calls == 2 and stats.failed == 0
        assert not await read_all(h.js, subjects.STREAM_DLQ, settle=0.1)


PERSISTENT: dict[str, tuple[Fault, str]] = {
    # fault on every request -> the facts step's outcome (the summary's is "fallback" for all)
    "server_error_503_forever": (server_error(503), "failed"),
    "hang_forever": (hang(3600.0), "failed"),
    "invalid_json_forever": (invalid_json(), "invalid"),
    "schema_violating_json_forever": (schema_violation(), "invalid"),
    "truncated_forever": (truncated(), "failed"),
}


@pytest.mark.parametrize("mode", sorted(PERSISTENT))
async def test_a_persistent_fault_closes_the_segment_with_the_fallback_and_counts_it(
    mode: str, sim: LLMSimulator, clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    fault, facts_outcome = PERSISTENT[mode]
    fallback_before, facts_before = steps("summary", "fallback"), steps("facts", facts_outcome)
    async with service(clean_nats, falkordb_server.url, tmp_path, client(sim, timeout_s=1.0)) as h:
        sim.default = fault
        event = segment(f"sp-{mode.replace('_', '-')}", ENGLISH, user=f"p-{mode.replace('_', '-')}")
        await h.publish(event)
        record = await h.closed(event, timeout=60)
        assert record.summary == FALLBACK_SUMMARY.format(reason="token limit")
        assert record.summary_source == "fallback"
        group = h.group(event)
        assert await h.store.preferences(group, include_history=True) == [] and await h.store.notes(group) == []
        assert [r.segment_id for r in await h.store.last_sessions(group, 50)] == [event.segment_id]  # once
        assert not await read_all(h.js, subjects.STREAM_DLQ, settle=0.1)
    assert steps("summary", "fallback") == fallback_before + 1
    assert steps("facts", facts_outcome) == facts_before + 1
