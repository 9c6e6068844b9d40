"""OpenTelemetry tracing: one turn is one trace, and spans never carry message content.

Off unless ``ENGRAM_OTEL_ENDPOINT`` is set (OTLP/HTTP). Then each service (and ``engram ingest``,
the gateway) has one TracerProvider named ``engram-<service>``:

* publishers start a span per turn and put its W3C ``traceparent`` into the NATS headers of the
  turn's messages (:class:`TurnSpans`: ``engram ingest``, the gateway);
* FastStream's NATS telemetry middleware continues the trace on consume and injects it again on
  every ``broker.publish`` made while handling the message (engram/runtime/service.py ``make_broker``);
* the turn-detector keeps the trace context of a turn's first message in the session state and
  publishes the turn's Episodes under it (:func:`attached`), so the extractor, the summary-gate
  and (for a close) the sessions service continue the turn's trace even when another event
  completed the turn;
* graphiti gets a real tracer (engram/observability/graphiti_tracing.py: ``graphiti_tracer``), so its own spans
  (``graphiti.llm.generate``, search phases) appear, through ``ContentSafeTracer``: graphiti puts
  exception text in span status and events, and an LLM or validation error can quote the
  conversation;
* engram's AccountingLLMClient adds one ``engram.llm.call`` span per LLM call with prompt name,
  model and token counts (engram/models/accounting.py).

This module does not import graphiti-core (1.7 s of imports): the turn-detector, the gateway and
the CLI use it, and a restarted service is back sooner without it.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_PROVIDERS: dict[str, Any] = {}


def _exporter(endpoint: str) -> Any:
    """The span exporter for ``endpoint`` (tests replace this function to collect spans in memory)."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = endpoint.rstrip("/")
    if not endpoint.endswith("/v1/traces"):
        endpoint += "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint)


def provider_for(otel_endpoint: str | None, service: str) -> Any | None:
    """The TracerProvider of ``service`` (one per service name in a process), or None when
    tracing is off (no endpoint)."""
    if not otel_endpoint:
        return None
    if service in _PROVIDERS:
        return _PROVIDERS[service]
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"engram-{service}"}))
    provider.add_span_processor(BatchSpanProcessor(_exporter(otel_endpoint)))
    _PROVIDERS[service] = provider
    return provider


def otel_tracer(service: str) -> Any | None:
    """The OpenTelemetry tracer of ``service`` when its provider exists (see :func:`provider_for`)."""
    provider = _PROVIDERS.get(service)
    return provider.get_tracer(f"engram.{service}") if provider is not None else None


def shutdown(service: str | None = None) -> None:
    """Export buffered spans and stop the exporter of ``service`` (default: every one)."""
    for name in [service] if service is not None else list(_PROVIDERS):
        provider = _PROVIDERS.pop(name, None)
        if provider is not None:
            provider.shutdown()


# --- propagation -----------------------------------------------------------------------------
def current_traceparent() -> str | None:
    """The W3C traceparent of the current span, or None when none is recording."""
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def attached(traceparent: str | None) -> Generator[None, None, None]:
    """Run the block with ``traceparent`` as the current trace context (a no-op for None)."""
    if not traceparent:
        yield
        return
    token = otel_context.attach(_PROPAGATOR.extract({"traceparent": traceparent}))
    try:
        yield
    finally:
        otel_context.detach(token)


# --- span attributes ---------------------------------------------------------------------------
SAFE_STRING_ATTRIBUTES = frozenset({
    "llm.provider", "model.size", "prompt.name", "llm.model", "llm.client", "engram.stage", "exception.type",
})
"""String-valued graphiti/engram span attributes known to hold no content. Any other string
attribute is dropped (numbers and booleans are kept: counts, sizes, flags)."""


def safe_attributes(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """Numbers and booleans, and strings only under :data:`SAFE_STRING_ATTRIBUTES`."""
    return {
        k: v for k, v in attributes.items()
        if v is not None and (isinstance(v, (bool, int, float)) or (isinstance(v, str) and k in SAFE_STRING_ATTRIBUTES))
    }


def start_turn_span(service: str, name: str, attributes: Mapping[str, Any] | None = None) -> Any | None:
    """A started (not current) span for a publisher's turn, or None when tracing is off. The caller
    ends it; its :func:`traceparent_of` goes into the turn's message headers."""
    tracer = otel_tracer(service)
    if tracer is None:
        return None
    return tracer.start_span(name, kind=trace.SpanKind.PRODUCER, attributes=safe_attributes(attributes or {}))


def traceparent_of(span_: Any | None) -> str | None:
    if span_ is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span_))
    return carrier.get("traceparent")


class TurnSpans:
    """A publisher's trace per turn: one span per (session, turn), following the turn-detector's
    rule that a user message after an assistant or tool message starts a new turn. Each message's
    headers get its turn's traceparent (:meth:`headers_for`); a session close joins the session's
    last turn. Spans end at :meth:`end` (or when the session's next turn starts). A no-op when
    tracing is off for ``service``. Only the session count and roles are recorded, no content."""

    def __init__(self, service: str, name: str) -> None:
        self.service = service
        self.name = name
        self._open: dict[str, tuple[Any, bool]] = {}  # session -> (span, has assistant side)

    def headers_for(self, session_id: str, role: str | None, headers: dict[str, str]) -> dict[str, str]:
        """``headers`` with the traceparent of the turn this event belongs to (role None: a close)."""
        if otel_tracer(self.service) is None:
            return headers
        span_, answered = self._open.get(session_id, (None, False))
        if span_ is None or (role == "user" and answered):
            if span_ is not None:
                span_.end()
            span_, answered = start_turn_span(self.service, self.name), False
        if role in ("assistant", "tool"):
            answered = True
        self._open[session_id] = (span_, answered)
        parent = traceparent_of(span_)
        if parent:
            headers["traceparent"] = parent
        return headers

    def end(self) -> None:
        for span_, _ in self._open.values():
            if span_ is not None:
                span_.end()
        self._open.clear()
