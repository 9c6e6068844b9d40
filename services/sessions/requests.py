"""The sessions service's request/reply side: proactive memory (``engram.memory.*``) and the
context builder (``engram.context``), as FastStream subscribers around memory.py and context.py.

Replicas share a queue group per side, so each request is answered once. Handlers never raise:
a body that does not parse is answered ``status=error``, ``reason=bad_request: ...`` (field and
error type only), a store failure ``backend_error: <ExceptionType>``. The context builder serves
what it has: a layer whose source fails or times out is left out and the answer is ``degraded``.
Neither requests' content nor the context's text ever reaches a log or a metric label.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from faststream.nats import NatsBroker
from prometheus_client import Counter, Histogram
from pydantic import ValidationError

from engram.runtime.service import message_itself
from engram.settings import ContextSettings, EngramSettings
from engram.text.tokens import token_counter
from engram.schemas import RecallRequest, RecallResponse, subjects
from engram.schemas.memory import ContextRequest, ContextResponse, MemoryResponse
from engram.services.sessions import memory
from engram.services.sessions.context import StoredSources, build_context

log = logging.getLogger("engram.sessions.requests")
MEMORY_QUEUE = "sessions-memory"
CONTEXT_QUEUE = "sessions-context"

MEMORY_REQUESTS = Counter(
    "engram_memory_requests_total",
    "Proactive memory requests (engram.memory.*), by operation and outcome (ok, not_found, bad_request, error).",
    ["op", "outcome"],
)
CONTEXT_REQUESTS = Counter(
    "engram_context_requests_total",
    "Context builder requests (engram.context), by outcome (ok, degraded, bad_request, error).", ["outcome"],
)
CONTEXT_SECONDS = Histogram(
    "engram_context_seconds", "Context builder latency (all layers, recall included).",
    buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10),
)
CONTEXT_LAYER_TOKENS = Histogram(
    "engram_context_layer_tokens", "cl100k tokens of each context section served (tags included), by layer.",
    ["layer"], buckets=(0, 50, 100, 250, 500, 750, 1000, 1500, 2000, 4000, 8000),
)

for _op in memory.OPERATIONS.values():  # every series exists from the start (rate() needs a zero)
    MEMORY_REQUESTS.labels(op=_op.op, outcome="ok")
for _outcome in ("ok", "degraded", "bad_request", "error"):
    CONTEXT_REQUESTS.labels(outcome=_outcome)


def recall_asker(broker: NatsBroker):  # noqa: ANN201 - an AskRecall
    async def ask(request: RecallRequest, timeout_s: float) -> RecallResponse:
        reply = await broker.connection.request(subjects.RECALL, request.model_dump_json().encode(), timeout=timeout_s)
        return RecallResponse.model_validate_json(reply.data)

    return ask


class ContextService:
    """``engram.context``: parse, build (context.py), record the metrics."""

    def __init__(self, sources: Any, defaults: ContextSettings | None = None) -> None:
        self.sources = sources
        self.defaults = defaults or ContextSettings()
        self.count = token_counter()

    async def handle(self, body: bytes) -> ContextResponse:
        started = time.perf_counter()
        try:
            request = ContextRequest.model_validate_json(body)
        except ValidationError as exc:
            return self._done(ContextResponse(status="error", reason=memory.bad_request_reason(exc)), "bad_request",
                              started)
        try:
            response = await build_context(request, defaults=self.defaults, sources=self.sources, count=self.count)
        except Exception as exc:  # noqa: BLE001 - answered, never raised
            log.warning("context failed: %s", type(exc).__name__, exc_info=log.isEnabledFor(logging.DEBUG))
            return self._done(ContextResponse(status="error", reason=f"backend_error: {type(exc).__name__}"), "error",
                              started)
        if response.degraded:
            # which layers, never what they hold
            log.info("context degraded: %s", response.reason)
        return self._done(response, "degraded" if response.degraded else "ok", started)

    def _done(self, response: ContextResponse, outcome: str, started: float) -> ContextResponse:
        took = time.perf_counter() - started
        CONTEXT_SECONDS.observe(took)
        CONTEXT_REQUESTS.labels(outcome=outcome).inc()
        for section in response.sections:
            CONTEXT_LAYER_TOKENS.labels(layer=section.layer).observe(section.tokens)
        return response.model_copy(update={"took_ms": round(took * 1000, 2)})


def subscribe(broker: NatsBroker, store: Any, settings: EngramSettings,
              defaults: ContextSettings | None = None) -> ContextService:
    """Serve every ``engram.memory.*`` subject and ``engram.context`` on ``broker`` over ``store``
    (services/sessions/store.py's MemoryStore); returns the context side (tests swap its sources)."""
    prefix = settings.group_prefix

    def serve_memory(subject: str) -> None:
        op = memory.OPERATIONS[subject].op

        @broker.subscriber(subject, queue=MEMORY_QUEUE, title=f"memory-{op}", decoder=message_itself)
        async def on_memory(msg: Any) -> MemoryResponse:
            response, outcome = await memory.answer(subject, msg.body, store, prefix)
            MEMORY_REQUESTS.labels(op=op, outcome=outcome).inc()
            return response

    for subject in subjects.MEMORY_SUBJECTS:
        serve_memory(subject)

    context = ContextService(StoredSources(store, prefix, recall_asker(broker), settings.session.context_summaries),
                             defaults)

    @broker.subscriber(subjects.CONTEXT, queue=CONTEXT_QUEUE, title="context", decoder=message_itself)
    async def on_context(msg: Any) -> ContextResponse:
        return await context.handle(msg.body)

    return context

