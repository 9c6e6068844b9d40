"""The deployment-wide LLM rate limit (engram/models/rate_limit.py, issue 25 item 2).

(a) the GCRA arithmetic and the HTTP details, pure; (b) three "replicas" (three limiters or three
LLM clients, each on its own NATS connection) against one limit: the combined rate stays within
it, where three unshared limiters would pass three times as much; (c) a 429 seen by one replica
makes the others wait for its Retry-After; (d) NATS stopped or frozen: the limit falls back to the
process, the call is still made. Real nats-servers from the pip binary, the LLM simulator over HTTP.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from email.utils import format_datetime
from datetime import datetime, timezone
from pathlib import Path

import nats
import pytest
from graphiti_core.prompts.models import Message
from nats.js.api import StorageType
from prometheus_client import REGISTRY

from bench.llm_simulator import CHAT, LLMSimulator, rate_limit
from engram.stack.embedded import start_nats
from engram.models import rate_limit as rl
from engram.models.factory import LLMSettings, build_llm, rate_limiter
from engram.models.openai_compat import make_sdk_client
from engram.models.rate_limit import Limit, Limits, SharedRateLimiter, State, admit, adjust, reserve
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import subjects


# ---------------------------------------------------------------- (a) arithmetic, pure
def test_a_bucket_passes_its_burst_at_once_then_the_rate() -> None:
    limit = Limit(60, period_s=60, burst=3)  # 1 a second, 3 at once
    tat, goes = 0.0, []
    for _ in range(6):  # six requests arriving together at t=100
        tat, wait = reserve(tat, 100.0, 1, limit)
        goes.append(100.0 + wait)
    assert goes == pytest.approx([100, 100, 100, 101, 102, 103])


def test_over_any_window_at_most_burst_plus_rate_times_window_pass() -> None:
    limit = Limit(20, period_s=2, burst=2)  # 10 a second
    tat, goes = 0.0, []
    for _ in range(200):  # everything arrives at once: the worst case
        tat, wait = reserve(tat, 0.0, 1, limit)
        goes.append(wait)
    for start in (0.0, 0.35, 5.0):
        for width in (0.5, 1.0, 3.0):
            passed = sum(1 for t in goes if start <= t < start + width)
            assert passed <= limit.capacity + width * 10 + 1e-9


def test_the_default_burst_is_a_tenth_of_the_limit() -> None:
    assert Limit(600).capacity == 60 and Limit(5).capacity == 1  # at least one request
    assert Limit(600).interval_s == pytest.approx(0.1)


def test_a_request_larger_than_the_burst_goes_when_the_debt_is_paid() -> None:
    limit = Limit(1000, period_s=60)  # 100 tokens at once
    tat, wait = reserve(0.0, 10.0, 500, limit)  # more than the burst, empty bucket: goes now
    assert wait == 0 and tat == pytest.approx(10.0 + 30.0)
    _, wait = reserve(tat, 10.0, 500, limit)  # the next one waits for the first to be paid off
    assert wait == pytest.approx(30.0)


def test_corrections_give_back_or_charge_but_never_save_up_the_past() -> None:
    limit = Limit(60, period_s=60)  # one unit = 1 s
    assert adjust(110.0, 100.0, -4, limit) == pytest.approx(106.0)
    assert adjust(110.0, 100.0, -40, limit) == pytest.approx(100.0)  # not below now
    assert adjust(90.0, 100.0, 5, limit) == pytest.approx(105.0)  # charged from now


def test_admit_takes_the_tighter_axis_and_waits_out_a_pause() -> None:
    limits = Limits(Limit(60, burst=1), Limit(600, burst=10))  # 1 request/s; 10 tokens/s
    state, wait, axis = admit(State(), 0.0, 50, limits)
    assert wait == 0 and axis == "retry_after"  # nothing to wait for (no wait is observed)
    state, wait, axis = admit(state, 0.0, 5, limits)
    assert axis == "tokens" and wait == pytest.approx(4.5)  # 55 tokens reserved, 10 may be owed
    state, wait, axis = admit(State(paused_until=7.0), 2.0, 0, limits)
    assert axis == "retry_after" and wait == pytest.approx(5.0)
    assert state.requests_tat == pytest.approx(8.0)  # reserved after the pause, not before
    unlimited, wait, _ = admit(State(), 0.0, 1000, Limits())
    assert unlimited == State() and wait == 0  # no limit: nothing to write


def test_state_round_trips_and_unreadable_state_is_fresh() -> None:
    state = State(1.5, 2.5, 3.5)
    assert State.decode(state.encode()) == state
    assert State.decode(b"not json") == State() == State.decode(None) == State.decode(b"[1]")


def test_tokens_of_a_request_are_its_prompt_schema_and_output_cap() -> None:
    count = rl.token_counter()
    body = (b'{"model": "m", "max_tokens": 1000, "messages": [{"role": "system", "content": "Answer."},'
            b' {"role": "user", "content": [{"type": "text", "text": "Which framework?"}]}],'
            b' "response_format": {"type": "json_object"}}')
    expected = count("Answer.\nWhich framework?") + 2 * rl.MESSAGE_OVERHEAD_TOKENS + count('{"type": "json_object"}')
    assert rl.request_tokens(body, count) == expected + 1000
    assert rl.request_tokens(b"x" * 40, count) == 10  # not a chat request: characters / 4
    assert rl.usage_tokens(b'{"usage": {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19}}') == 19
    assert rl.usage_tokens(b'{"usage": {"prompt_tokens": 12, "completion_tokens": 7}}') == 19
    assert rl.usage_tokens(b'{"choices": []}') is None and rl.usage_tokens(b"oops") is None


def test_retry_after_in_milliseconds_seconds_or_a_date_capped() -> None:
    assert rl.retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == pytest.approx(1.5)
    assert rl.retry_after_s({"retry-after": "2"}) == 2.0
    now = time.time()
    date = format_datetime(datetime.fromtimestamp(now + 30, timezone.utc), usegmt=True)
    assert rl.retry_after_s({"retry-after": date}, now=now) == pytest.approx(30, abs=1.5)
    assert rl.retry_after_s({}) == rl.DEFAULT_PAUSE_S
    assert rl.retry_after_s({"retry-after": "86400"}) == rl.MAX_PAUSE_S
    assert rl.retry_after_s({"retry-after": "-3"}) == 0.0


def test_one_budget_per_server_and_model() -> None:
    key = rl.limit_key("http://llm:8000/v1", "qwen")
    assert key == rl.limit_key("http://llm:8000/v1", "qwen") != rl.limit_key("http://llm:8000/v1", "other")
    assert key.startswith("llm_") and key.replace("_", "").isalnum()  # a valid KV key


async def test_without_nats_the_limit_is_this_process() -> None:
    limiter = SharedRateLimiter(Limits(Limit(20, period_s=2, burst=1)), key="k")  # one per 0.1 s
    started = time.monotonic()
    for _ in range(4):
        await limiter.acquire()
    assert time.monotonic() - started >= 0.28


# ---------------------------------------------------------------- real NATS
@pytest.fixture
async def limits_bucket(clean_nats: str) -> AsyncIterator[str]:
    """The topology (with the engram_llm_limits bucket) on the shared test nats-server."""
    nc = await nats.connect(clean_nats)
    await ensure_topology(nc.jetstream(), Topology(partitions=1, duplicate_window_s=60, ack_wait_s=30))
    await nc.close()
    yield clean_nats


@pytest.fixture
async def replicas(limits_bucket: str) -> AsyncIterator[list[nats.NATS]]:
    """Three connections: one per replica, as three pods would have."""
    conns = [await nats.connect(limits_bucket) for _ in range(3)]
    yield conns
    for nc in conns:
        await nc.close()


@pytest.fixture
def quiet_sim() -> Iterator[LLMSimulator]:
    """The simulator answering ``{}`` (no rules model work per request: the test times the limit)."""

    async def answer(body: dict) -> str:
        return "{}"

    with LLMSimulator(answer=answer) as sim:
        yield sim


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def fallbacks() -> float:
    return sum(sample("engram_llm_rate_limit_fallbacks_total", reason=r)
               for r in ("no_connection", "timeout", "contention", "nats_error"))


def messages() -> list[Message]:
    return [Message(role="system", content="Answer in JSON."), Message(role="user", content="Anything new?")]


def settings(sim: LLMSimulator, **kw: object) -> LLMSettings:
    base = {"provider": "openai", "base_url": sim.base_url, "model": "sim", "requests_per_second": 1000,
            "max_retries": 2, "timeout_s": 10.0}
    return LLMSettings(**{**base, **kw})  # type: ignore[arg-type]


async def test_the_bucket_is_declared_with_the_topology(limits_bucket: str) -> None:
    nc = await nats.connect(limits_bucket)
    try:
        info = await nc.jetstream().stream_info(f"KV_{subjects.KV_LLM_LIMITS}")
        assert info.config.storage == StorageType.MEMORY and info.config.max_msgs_per_subject == 1
    finally:
        await nc.close()


async def run_until(deadline_s: float, workers: list) -> None:  # noqa: ANN001 - coroutine factories
    """Run ``workers`` (each looping forever) for ``deadline_s``, then cancel them (requests still
    waiting for their reserved slot are dropped: only what went within the window counts)."""
    tasks = [asyncio.create_task(w()) for w in workers]
    await asyncio.sleep(deadline_s)
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_b_three_replicas_share_one_limit(replicas: list[nats.NATS]) -> None:
    """Three limiters, each on its own connection, 4 callers each, one limit of 10/s (burst 2)."""
    limit = Limits(Limit(20, period_s=2.0, burst=2))
    limiters = [SharedRateLimiter(limit, key="shared-test", nats=lambda nc=nc: nc) for nc in replicas]
    went: list[tuple[float, int]] = []
    fallbacks_before = fallbacks()

    def worker(i: int):  # noqa: ANN202
        async def loop() -> None:
            while True:
                await limiters[i].acquire()
                went.append((time.monotonic(), i))  # the counted call
        return loop

    started = time.monotonic()
    window = 3.0
    await run_until(window, [worker(i) for i in range(3) for _ in range(4)])
    inside = [(t, i) for t, i in went if t - started < window]
    # 2 at once + 10/s x 3 s = 32 (+1 for a slot on the window's edge); unshared: ~3 x 32
    assert len(inside) <= 2 + 10 * window + 1, len(inside)
    assert len(inside) >= 20, len(inside)  # and it did flow
    for lo in (0.0, 0.5, 1.0, 1.5, 2.0):  # any one second: burst + 10
        assert sum(1 for t, _ in inside if lo <= t - started < lo + 1.0) <= 2 + 10 + 1
    assert {i for _, i in inside} == {0, 1, 2}  # every replica got its share of the one budget
    assert fallbacks() == fallbacks_before  # all of it went through the shared state


async def test_b_three_llm_clients_hold_the_limit_against_the_simulator(
        replicas: list[nats.NATS], quiet_sim: LLMSimulator) -> None:
    """The product path: three build_llm clients (ENGRAM_LLM_REQUESTS_PER_MINUTE=60: one a second,
    6 at once), 3 callers each, real HTTP to the simulator; what the simulator served is counted."""
    clients = [build_llm(settings(quiet_sim, requests_per_minute=60), nats=lambda nc=nc: nc) for nc in replicas]

    def worker(llm):  # noqa: ANN001, ANN202
        async def loop() -> None:
            while True:
                await llm.generate_response(messages())
        return loop

    started = time.monotonic()
    window = 4.0
    await run_until(window, [worker(c) for c in clients for _ in range(3)])
    served = [s.at for s in quiet_sim.served if s.path == CHAT and s.at - started < window]
    # 6 at once + 1/s x 4 s = 10 (+1 on the edge); three unshared limits would pass ~30
    assert 7 <= len(served) <= 6 + 4 + 1, len(served)
    assert sum(1 for t in served if t - started < 1.0) <= 6 + 1 + 1


async def test_b_tokens_are_reserved_then_corrected_to_the_reported_usage(
        limits_bucket: str, quiet_sim: LLMSimulator) -> None:
    nc = await nats.connect(limits_bucket)
    try:
        limiter = rate_limiter(settings(quiet_sim, tokens_per_minute=600_000), nats=lambda: nc)  # 0.1 ms a token
        sdk = make_sdk_client(api_key="k", base_url=quiet_sim.base_url, timeout_s=10, max_retries=0,
                              rate_limit=limiter)
        before = time.time()
        reply = await sdk.chat.completions.create(model="sim", max_tokens=4000,
                                                  messages=[{"role": "user", "content": "hello"}])
        await limiter.aclose()  # the correction runs in the background
        kv = await nc.jetstream().key_value(subjects.KV_LLM_LIMITS)
        state = State.decode((await kv.get(limiter.key)).value)
        used = reply.usage.total_tokens
        # the reservation (>= 4,000 tokens = 0.4 s) was given back down to the usage (a few tokens)
        assert state.tokens_tat - before == pytest.approx(used * 60 / 600_000, abs=0.05)
        assert state.tokens_tat - before < 4000 * 60 / 600_000 / 2
    finally:
        await nc.close()


# ---------------------------------------------------------------- (c) 429 pauses everyone
async def test_c_a_429_seen_by_one_replica_pauses_the_others(
        replicas: list[nats.NATS], quiet_sim: LLMSimulator) -> None:
    clients = [build_llm(settings(quiet_sim), nats=lambda nc=nc: nc) for nc in replicas]
    waits_before = sample("engram_llm_rate_limit_wait_seconds_count", axis="retry_after")
    limited_before = sample("engram_llm_rate_limited_total")
    quiet_sim.schedule(rate_limit(retry_after_s=1.5))
    first = asyncio.create_task(clients[0].generate_response(messages()))  # gets the 429, the SDK retries
    kv = await replicas[1].jetstream().key_value(subjects.KV_LLM_LIMITS)
    key = rl.limit_key(quiet_sim.base_url, "sim")
    deadline = time.monotonic() + 5
    while True:  # the pause is in the shared state
        try:
            if State.decode((await kv.get(key)).value).paused_until > time.time():
                break
        except nats.js.errors.KeyNotFoundError:
            pass
        assert time.monotonic() < deadline, "no pause written"
        await asyncio.sleep(0.02)
    (refused,) = [s for s in quiet_sim.served if s.status == 429]
    await asyncio.gather(first, clients[1].generate_response(messages()), clients[2].generate_response(messages()))
    later = [s for s in quiet_sim.served if s.at > refused.at]
    assert len(later) == 3 and all(s.status == 200 for s in later)  # one 429 only: the others waited
    assert min(s.at for s in later) - refused.at >= 1.5 - 0.1  # nobody went before Retry-After
    assert sample("engram_llm_rate_limited_total") == limited_before + 1
    assert sample("engram_llm_rate_limit_wait_seconds_count", axis="retry_after") >= waits_before + 2


# ---------------------------------------------------------------- (d) NATS gone
@pytest.fixture
def own_nats(tmp_path: Path) -> Iterator:  # noqa: ANN201
    """A nats-server of this test alone: it is stopped or frozen mid-test."""
    proc = start_nats(tmp_path)
    yield proc
    if proc.alive():
        os.kill(proc.pid, signal.SIGCONT)
    proc.stop()


async def connected_with_bucket(url: str) -> nats.NATS:
    nc = await nats.connect(url, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    await ensure_topology(nc.jetstream(), Topology(partitions=1, duplicate_window_s=60, ack_wait_s=30))
    return nc


async def test_d_nats_stopped_falls_back_to_the_process_and_the_call_is_made(
        own_nats, quiet_sim: LLMSimulator, caplog: pytest.LogCaptureFixture) -> None:  # noqa: ANN001
    nc = await connected_with_bucket(own_nats.url)
    llm = build_llm(settings(quiet_sim, requests_per_minute=600), nats=lambda: nc)
    await llm.generate_response(messages())  # shared: the key exists now
    kv = await nc.jetstream().key_value(subjects.KV_LLM_LIMITS)
    assert (await kv.get(rl.limit_key(quiet_sim.base_url, "sim"))).value
    before = fallbacks()
    own_nats.stop()
    caplog.set_level(logging.WARNING, logger="engram.llm.rate_limit")
    started = time.monotonic()
    for _ in range(3):
        await llm.generate_response(messages())
    # the first call may wait out KV_TIMEOUT_S (the client has not noticed yet), the next ones not at all
    assert time.monotonic() - started < rl.KV_TIMEOUT_S + 1.5
    assert quiet_sim.count(path=CHAT) == 4  # every call made
    assert fallbacks() == before + 3  # each counted
    warnings = [r for r in caplog.records if r.name == "engram.llm.rate_limit"]
    assert len(warnings) == 1 and "limiting in this process only" in warnings[0].getMessage()  # once
    await asyncio.wait_for(nc.close(), 5)


async def test_d_a_frozen_nats_costs_at_most_the_timeout(own_nats, quiet_sim: LLMSimulator) -> None:  # noqa: ANN001
    nc = await connected_with_bucket(own_nats.url)
    limiter = SharedRateLimiter(Limits.per_minute(requests=600), key="frozen", nats=lambda: nc, kv_timeout_s=0.5)
    sdk = make_sdk_client(api_key="k", base_url=quiet_sim.base_url, timeout_s=10, max_retries=0, rate_limit=limiter)
    await sdk.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}])
    before = sample("engram_llm_rate_limit_fallbacks_total", reason="timeout")
    os.kill(own_nats.pid, signal.SIGSTOP)  # connection open, no answers: a hung server
    try:
        started = time.monotonic()
        await sdk.chat.completions.create(model="sim", messages=[{"role": "user", "content": "hi"}])
        assert time.monotonic() - started < 2.0
        assert quiet_sim.count(path=CHAT) == 2
        assert sample("engram_llm_rate_limit_fallbacks_total", reason="timeout") == before + 1
    finally:
        os.kill(own_nats.pid, signal.SIGCONT)
    await asyncio.wait_for(nc.close(), 5)


async def test_d_no_bucket_or_no_connection_yet_is_a_fallback_too(nats_url: str) -> None:
    def not_connected() -> nats.NATS:
        raise RuntimeError("the broker has not connected yet")

    limiter = SharedRateLimiter(Limits.per_minute(requests=600), key="k", nats=not_connected)
    await asyncio.wait_for(limiter.acquire(), 1)
    nc = await nats.connect(nats_url)
    try:
        js = nc.jetstream()
        try:
            await js.delete_stream(f"KV_{subjects.KV_LLM_LIMITS}")
        except nats.js.errors.NotFoundError:
            pass
        limiter = SharedRateLimiter(Limits.per_minute(requests=600), key="k", nats=lambda: nc)
        before = sample("engram_llm_rate_limit_fallbacks_total", reason="nats_error")
        ticket = await asyncio.wait_for(limiter.acquire(), 3)
        assert not ticket.shared
        assert sample("engram_llm_rate_limit_fallbacks_total", reason="nats_error") == before + 1
    finally:
        await nc.close()
