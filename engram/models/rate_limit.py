"""One LLM rate limit for the whole deployment (issue 25, item 2).

Providers meter requests and tokens per minute for an API key, not per process: an in-process
limiter per replica lets N replicas spend N times the quota. Here every HTTP request of the
OpenAI SDK client goes through :class:`SharedRateLimiter` (httpx event hooks, so SDK retries
count too, as the provider counts them), whose state lives in one key of the NATS KV bucket
``engram_llm_limits`` that every replica of every service calling the same model shares:

- **GCRA per axis** (requests, tokens): the state is a "theoretical arrival time" (TAT) per
  axis, the moment all budget reserved so far is paid off at the limit's rate. A request
  reserves 1 request and its estimated tokens, moves the TATs forward and sleeps until the debt
  fits the burst (:func:`reserve`). One read and one compare-and-set write on the key's
  revision per request; on a conflict (another replica wrote first) it reads again.
- **Tokens are estimated, then corrected**: prompt tokens counted with engram's cl100k counter
  plus the request's ``max_tokens`` (providers admit a request on that same worst case), then
  the difference to the ``usage`` the response reports is given back (or charged).
- **A 429 pauses every replica**: its ``Retry-After`` (or ``retry-after-ms``) becomes a
  ``paused_until`` time in the same key, which every replica's next request waits for.
- **Fail safe**: when NATS is unreachable, slow (> ``KV_TIMEOUT_S``), has no bucket or the
  key stays contended, the same arithmetic runs on in-process state (this replica alone, so
  N replicas may reach N x the limit until NATS is back). Logged once per outage, counted per
  request in ``engram_llm_rate_limit_fallbacks_total{reason}``; the request is never dropped
  and never waits on NATS for longer than the timeout.

Times are wall-clock (``time.time``), compared across machines: NTP-synced clocks (ms apart)
are fine; a replica whose clock is seconds off spends or waits that much. Metrics:
``engram_llm_rate_limit_wait_seconds{axis}`` (requests|tokens|retry_after: which one set the
wait; waits > 0 only), ``engram_llm_rate_limited_total`` (429 answers),
``engram_llm_rate_limit_fallbacks_total{reason}``. Nothing of a request's content is logged.
"""

from __future__ import annotations

import asyncio
import email.utils
import hashlib
import json
import logging
import random
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import nats.js.errors
from aiolimiter import AsyncLimiter
from prometheus_client import Counter, Histogram

from engram.text.tokens import CountTokens, token_counter
from engram.schemas import subjects

log = logging.getLogger("engram.llm.rate_limit")

PERIOD_S = 60.0
"""Providers' limits are per minute (RPM, TPM)."""
BURST_FRACTION = 0.1
"""Budget that may go at once: 10% of a minute's. Providers enforce per-minute limits over
shorter slices too (OpenAI: "60,000 requests/minute may be enforced as 1,000 requests/second"),
so a full minute's burst at once would be refused; over any minute at most 1.1 x the limit passes."""
KV_TIMEOUT_S = 2.0
"""Longest a request waits on NATS for its reservation before using the local limit."""
SHARED_RETRY_S = 10.0
"""After a failure, requests use the local limit for this long before asking NATS again (so an
outage does not cost every request the timeout)."""
CAS_ATTEMPTS = 100
"""Compare-and-set rounds before a request gives up on the shared state (each round one replica
wins; the timeout above bounds the time anyway)."""
DEFAULT_PAUSE_S = 1.0
"""A 429 without Retry-After: every replica pauses this long."""
MAX_PAUSE_S = 120.0
"""Longest Retry-After honoured (the OpenAI SDK's own ceiling): a bogus header cannot stop the deployment."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Chat framing per message (role, separators), as OpenAI's cookbook counts it."""

WAIT_SECONDS = Histogram(
    "engram_llm_rate_limit_wait_seconds",
    "Time an LLM request waited for the rate limit, by the axis that set the wait (requests|tokens|retry_after).",
    ["axis"],
    buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)
RATE_LIMITED = Counter("engram_llm_rate_limited_total", "HTTP 429 answers from the LLM server (each pauses every replica).")
FALLBACKS = Counter(
    "engram_llm_rate_limit_fallbacks_total",
    "LLM requests limited in this process only because the shared state in NATS KV could not be used, by reason "
    "(no_connection|timeout|contention|nats_error).",
    ["reason"],
)


# ---------------------------------------------------------------- arithmetic (pure)
@dataclass(frozen=True)
class Limit:
    """``amount`` units per ``period_s``; up to ``burst`` units at once (default ``BURST_FRACTION``
    of ``amount``, at least 1)."""

    amount: float
    period_s: float = PERIOD_S
    burst: float | None = None

    def __post_init__(self) -> None:
        if self.amount <= 0 or self.period_s <= 0:
            raise ValueError("a limit needs amount > 0 and period_s > 0 (no limit: no Limit)")

    @property
    def interval_s(self) -> float:
        """Seconds of budget one unit costs."""
        return self.period_s / self.amount

    @property
    def capacity(self) -> float:
        return self.burst if self.burst is not None else max(1.0, self.amount * BURST_FRACTION)


def reserve(tat: float, now: float, units: float, limit: Limit) -> tuple[float, float]:
    """GCRA: reserve ``units`` at ``now`` on an axis whose theoretical arrival time is ``tat``.

    Returns the new TAT and the seconds to wait before the request may go: it goes once the debt
    it leaves (new TAT - then) is at most ``capacity`` units' worth. A request larger than the
    capacity (one big prompt under a small token limit) goes when the debt is paid off, else it
    could never go. The reservation is made now and waited for afterwards, so waiting requests
    queue in order and never need a second write."""
    new_tat = max(tat, now) + units * limit.interval_s
    allowed = max(limit.capacity, units) * limit.interval_s
    return new_tat, max(0.0, new_tat - allowed - now)


def adjust(tat: float, now: float, units: float, limit: Limit) -> float:
    """TAT after charging ``units`` more, or giving back ``-units`` (a request used fewer tokens
    than it reserved). Never below ``now``: budget not spent in the past is not saved up."""
    if units >= 0:
        return max(tat, now) + units * limit.interval_s
    return max(now, tat + units * limit.interval_s)


@dataclass(frozen=True)
class Limits:
    requests: Limit | None = None
    tokens: Limit | None = None

    @classmethod
    def per_minute(cls, requests: float = 0, tokens: float = 0) -> Limits:
        """0 = no limit on that axis."""
        return cls(Limit(requests) if requests > 0 else None, Limit(tokens) if tokens > 0 else None)


@dataclass(frozen=True)
class State:
    """What the KV key holds: one TAT per axis and the end of a provider-ordered pause."""

    requests_tat: float = 0.0
    tokens_tat: float = 0.0
    paused_until: float = 0.0

    def encode(self) -> bytes:
        return json.dumps({"requests_tat": self.requests_tat, "tokens_tat": self.tokens_tat,
                           "paused_until": self.paused_until}).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> State:
        """A value that is missing or unreadable (another version wrote it) reads as a fresh state."""
        try:
            data = json.loads(raw or b"{}")
            return cls(float(data.get("requests_tat", 0.0)), float(data.get("tokens_tat", 0.0)),
                       float(data.get("paused_until", 0.0)))
        except (ValueError, TypeError, AttributeError):
            return cls()


def admit(state: State, now: float, tokens: float, limits: Limits) -> tuple[State, float, str]:
    """Reserve one request and ``tokens`` tokens: the new state, the seconds to wait and the axis
    that set the wait (``retry_after`` while paused). Reservations start after a pause ends, so
    the requests queued behind a 429 go out at the limit's pace instead of all at once."""
    start = max(now, state.paused_until)
    waits = {"retry_after": start - now}
    requests_tat, tokens_tat = state.requests_tat, state.tokens_tat
    if limits.requests is not None:
        requests_tat, wait = reserve(requests_tat, start, 1, limits.requests)
        waits["requests"] = start - now + wait
    if limits.tokens is not None and tokens > 0:
        tokens_tat, wait = reserve(tokens_tat, start, tokens, limits.tokens)
        waits["tokens"] = start - now + wait
    axis = max(waits, key=lambda k: waits[k])
    return replace(state, requests_tat=requests_tat, tokens_tat=tokens_tat), waits[axis], axis


def settled(state: State, now: float, extra_tokens: float, limits: Limits) -> State:
    """``state`` with the token estimate corrected by ``extra_tokens`` (negative: given back)."""
    if limits.tokens is None or extra_tokens == 0:
        return state
    return replace(state, tokens_tat=adjust(state.tokens_tat, now, extra_tokens, limits.tokens))


def paused(state: State, until: float) -> State:
    return state if until <= state.paused_until else replace(state, paused_until=until)


# ---------------------------------------------------------------- HTTP details (pure)
def request_tokens(body: bytes, count: CountTokens) -> int:
    """Tokens a chat request may spend: its messages (plus the JSON schema of ``response_format``,
    which providers count as input) and its ``max_tokens``. A body that is not a JSON chat request
    is estimated from its length (characters / 4)."""
    try:
        payload = json.loads(body)
        messages = payload["messages"]
    except (ValueError, TypeError, KeyError):
        return len(body) // 4
    texts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list):  # content parts: count the text ones
            texts += [str(p.get("text", "")) for p in content if isinstance(p, dict)]
        elif content:
            texts.append(str(content))
    tokens = count("\n".join(texts)) + MESSAGE_OVERHEAD_TOKENS * len(messages)
    if payload.get("response_format"):
        tokens += count(json.dumps(payload["response_format"]))
    output = payload.get("max_completion_tokens") or payload.get("max_tokens") or 0
    return tokens + (int(output) if isinstance(output, int | float) else 0)


def usage_tokens(body: bytes) -> int | None:
    """``usage.total_tokens`` of a chat completion (prompt + completion), if the server reported it."""
    try:
        usage = json.loads(body).get("usage") or {}
        total = usage.get("total_tokens")
        if total is None and "prompt_tokens" in usage:
            total = usage["prompt_tokens"] + usage.get("completion_tokens", 0)
        return int(total) if total is not None else None
    except (ValueError, TypeError, AttributeError):
        return None


def retry_after_s(headers: Mapping[str, str], now: float | None = None) -> float:
    """Seconds a 429 asks to wait: ``retry-after-ms``, else ``retry-after`` (seconds or an HTTP
    date), else :data:`DEFAULT_PAUSE_S`; at most :data:`MAX_PAUSE_S`."""
    seconds: float | None = None
    for header, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(header)
        if value is None:
            continue
        try:
            seconds = float(value) / divisor
            break
        except ValueError:
            try:
                seconds = email.utils.parsedate_to_datetime(value).timestamp() - (now or time.time())
                break
            except (TypeError, ValueError):
                continue
    if seconds is None or seconds != seconds:  # missing, unreadable or NaN
        seconds = DEFAULT_PAUSE_S
    return min(max(seconds, 0.0), MAX_PAUSE_S)


def limit_key(base_url: str | None, model: str) -> str:
    """The KV key of one budget: one per (server, model), as providers meter per key and model;
    every service calling that model shares it (graphiti's small-model calls are counted in it too)."""
    digest = hashlib.sha256(f"{base_url or 'https://api.openai.com/v1'}|{model}".encode()).hexdigest()
    return f"llm_{digest[:24]}"


# ---------------------------------------------------------------- the limiter
NatsSource = Callable[[], Any]
"""Returns the connected nats-py client to use (a service passes ``lambda: broker.connection``:
the connection exists only after the broker connected, and carries the service's NATS user)."""


class _NoConnection(Exception):
    pass


class _Contention(Exception):
    pass


@dataclass(frozen=True)
class Ticket:
    """What a request reserved, to correct it afterwards."""

    tokens: int
    shared: bool


class SharedRateLimiter:
    """Deployment-wide requests/tokens per minute and 429 pauses, kept in NATS KV (see the module
    docstring). ``nats`` None: in-process only (benches, tests, no NATS at hand). ``per_process_rps``:
    the old ``ENGRAM_LLM_REQUESTS_PER_SECOND`` ceiling, in this process only, as before."""

    def __init__(self, limits: Limits, *, key: str, nats: NatsSource | None = None,
                 per_process_rps: float | None = None, bucket: str = subjects.KV_LLM_LIMITS,
                 clock: Callable[[], float] = time.time, kv_timeout_s: float = KV_TIMEOUT_S,
                 count: CountTokens | None = None) -> None:
        self.limits = limits
        self.key = key
        self.bucket = bucket
        self._nats = nats
        self._clock = clock
        self._kv_timeout_s = kv_timeout_s
        self._count = count
        self._per_process = AsyncLimiter(1, 1.0 / per_process_rps) if per_process_rps else None
        self._local = State()  # no NATS, or NATS failing
        self._kv: Any = None
        self._shared_again_at = 0.0  # monotonic; before it, the local state is used
        self._degraded = False  # logged once per outage
        self._down_reason = "nats_error"
        self._tickets: weakref.WeakKeyDictionary[Any, Ticket] = weakref.WeakKeyDictionary()
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------ API
    async def acquire(self, tokens: int = 0) -> Ticket:
        """Wait until one request of ``tokens`` tokens may go (tokens are ignored without a token limit)."""
        if self._per_process is not None:
            await self._per_process.acquire()
        tokens = tokens if self.limits.tokens is not None else 0

        def update(state: State, now: float) -> tuple[State, tuple[float, str]]:
            new, wait, axis = admit(state, now, tokens, self.limits)
            return new, (wait, axis)

        result = await self._shared(update)
        shared = result is not None
        wait, axis = result if result is not None else self._apply_local(update)
        if wait > 0:
            WAIT_SECONDS.labels(axis=axis).observe(wait)
            await asyncio.sleep(wait)
        return Ticket(tokens, shared)

    async def settle(self, ticket: Ticket, used_tokens: int) -> None:
        """Correct a ticket's token estimate with what the request really used."""
        extra = used_tokens - ticket.tokens if ticket.tokens else 0
        if extra == 0 or self.limits.tokens is None:
            return
        update = lambda state, now: (settled(state, now, extra, self.limits), True)  # noqa: E731
        if not ticket.shared or await self._shared(update, fallback=False) is None:
            self._apply_local(update)  # where it was reserved (or NATS failed since: then here)

    async def pause(self, seconds: float) -> None:
        """A 429: no replica sends before ``seconds`` from now. Also in this process at once, so
        its own retry waits even if the shared write fails."""
        until = self._clock() + seconds
        update = lambda state, now: (paused(state, until), True)  # noqa: E731
        self._apply_local(update)
        await self._shared(update, fallback=False)

    def http_hooks(self, count: CountTokens | None = None) -> dict[str, list[Callable[[Any], Any]]]:
        """httpx event hooks for the OpenAI SDK's HTTP client: every request waits for the limit."""
        if count is not None:
            self._count = count
        return {"request": [self.on_request], "response": [self.on_response]}

    async def on_request(self, request: Any) -> None:
        tokens = 0
        if self.limits.tokens is not None:
            try:
                body = request.content
            except Exception:  # noqa: BLE001 - a streamed body: count nothing, still limit the request
                body = b""
            tokens = request_tokens(body, self._count or token_counter())
        self._tickets[request] = await self.acquire(tokens)

    async def on_response(self, response: Any) -> None:
        ticket = self._tickets.pop(response.request, None)
        if response.status_code == 429:
            RATE_LIMITED.inc()
            await self.pause(retry_after_s(response.headers))
            return  # the reservation stays spent: providers count refused requests too
        if ticket is None or not ticket.tokens or not 200 <= response.status_code < 300:
            return
        await response.aread()  # cached: the SDK reads the same bytes
        used = usage_tokens(response.content)
        if used is not None:
            # in the background: the answer is not held back by a KV round trip
            task = asyncio.get_running_loop().create_task(self.settle(ticket, used))
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------ state
    def _apply_local(self, update: Callable[[State, float], tuple[State, Any]]) -> Any:
        self._local, result = update(self._local, self._clock())
        return result

    async def _shared(self, update: Callable[[State, float], tuple[State, Any]], *, fallback: bool = True) -> Any:
        """``update``'s result (never None) after applying it to the KV state with compare-and-set,
        or None when the shared state cannot be used now (then the caller uses the local state).
        ``fallback``: count it in engram_llm_rate_limit_fallbacks_total (a request's reservation)."""
        if self._nats is None:
            return None
        if time.monotonic() < self._shared_again_at:  # failed a moment ago: not yet again
            if fallback:
                FALLBACKS.labels(reason=self._down_reason).inc()
            return None
        try:
            result = await asyncio.wait_for(self._compare_and_set(update), self._kv_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure: limit locally, never lose the request
            reason = ("timeout" if isinstance(exc, TimeoutError) else "contention" if isinstance(exc, _Contention)
                      else "no_connection" if isinstance(exc, _NoConnection) else "nats_error")
            if not isinstance(exc, _Contention):
                self._down_reason = reason
                self._kv = None  # bind again next time (the connection may be a new one)
                self._shared_again_at = time.monotonic() + SHARED_RETRY_S
            if fallback:
                FALLBACKS.labels(reason=reason).inc()
            if not self._degraded:
                self._degraded = True
                log.warning("LLM rate limit: NATS KV bucket %s unusable (%s: %s); limiting in this process only "
                            "until it is back", self.bucket, reason, type(exc).__name__)
            return None
        if self._degraded:
            self._degraded = False
            log.info("LLM rate limit: shared through NATS KV bucket %s again", self.bucket)
        return result[1]

    async def _compare_and_set(self, update: Callable[[State, float], tuple[State, Any]]) -> tuple[State, Any]:
        kv = await self._bucket()
        for attempt in range(CAS_ATTEMPTS):
            try:
                entry = await kv.get(self.key)
                state, revision = State.decode(entry.value), entry.revision
            except (nats.js.errors.KeyNotFoundError, nats.js.errors.KeyDeletedError):
                state, revision = State(), None
            new, result = update(state, self._clock())
            if new == state:
                return new, result  # nothing to write (no limit set, no pause to add)
            try:
                if revision is None:
                    await kv.create(self.key, new.encode())
                else:
                    await kv.update(self.key, new.encode(), last=revision)
                return new, result
            except nats.js.errors.KeyWrongLastSequenceError:
                # another replica wrote first: read its state and reserve after it
                await asyncio.sleep(random.uniform(0, min(0.02, 0.002 * (attempt + 1))))
        raise _Contention()

    async def _bucket(self) -> Any:
        try:
            nc = self._nats() if self._nats is not None else None
        except Exception as exc:  # noqa: BLE001 - e.g. the broker has not connected yet
            raise _NoConnection() from exc
        if nc is None or not getattr(nc, "is_connected", False):
            raise _NoConnection()  # reconnecting: requests would only time out
        if self._kv is None:
            self._kv = await nc.jetstream().key_value(self.bucket)  # one STREAM.INFO, then cached
        return self._kv

    async def aclose(self) -> None:
        """Wait for pending corrections (tests; services just stop)."""
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
