"""graphiti's side of engram's tracing (engram/observability/tracing.py): a graphiti ``Tracer`` whose spans carry
no content, and engram's own ``engram.llm.call`` span around each LLM call. Separate from
engram/observability/tracing.py because it imports graphiti-core, which services without a graph model (the
turn-detector, the gateway) need not load."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from contextlib import contextmanager
from typing import Any

from graphiti_core.tracer import NoOpTracer, Tracer, TracerSpan
from opentelemetry import trace

from engram.observability.tracing import otel_tracer, safe_attributes


class _ContentSafeSpan(TracerSpan):
    def __init__(self, span: Any) -> None:
        self._span = span

    def add_attributes(self, attributes: dict[str, Any]) -> None:
        self._span.set_attributes(safe_attributes(attributes))

    def set_status(self, status: str, description: str | None = None) -> None:
        # graphiti passes str(exception) as the description: the status alone
        if status == "error":
            self._span.set_status(trace.StatusCode.ERROR)
        elif status == "ok":
            self._span.set_status(trace.StatusCode.OK)

    def record_exception(self, exception: Exception) -> None:
        # the type only: the message and traceback may quote the prompt or the answer
        self._span.set_attribute("exception.type", type(exception).__name__)


class ContentSafeTracer(Tracer):
    """A graphiti Tracer on an OpenTelemetry tracer that strips whatever could carry content.

    Not graphiti's own OpenTelemetryTracer: besides passing exception text on, its ``start_span``
    catches an exception raised *inside* the span and yields again, which turns every exception of
    the traced code into ``RuntimeError: generator didn't stop after throw()`` (graphiti-core
    0.31.1), and the extractor's retry and dead-letter decisions depend on exception types."""

    def __init__(self, otel: Any, span_prefix: str = "graphiti") -> None:
        self.otel = otel  # also used for engram's own spans (llm_span)
        self.span_prefix = span_prefix

    @contextmanager
    def start_span(self, name: str) -> Generator[TracerSpan, None, None]:
        with self.otel.start_as_current_span(f"{self.span_prefix}.{name}", record_exception=False,
                                             set_status_on_exception=False) as span_:
            safe = _ContentSafeSpan(span_)
            try:
                yield safe
            except BaseException as exc:
                safe.record_exception(exc)  # type: ignore[arg-type]
                safe.set_status("error")
                raise


def graphiti_tracer(service: str) -> Tracer:
    """A content-safe graphiti tracer on ``service``'s provider; NoOpTracer when tracing is off."""
    tracer = otel_tracer(service)
    if tracer is None:
        return NoOpTracer()
    return ContentSafeTracer(tracer)


@contextmanager
def llm_span(tracer: Tracer, attributes: Mapping[str, Any]) -> Generator[Any, None, None]:
    """An ``engram.llm.call`` span (current, so graphiti's llm.generate nests in it) on the
    OpenTelemetry tracer behind a :class:`ContentSafeTracer`; yields None when tracing is off.
    Only :func:`safe_attributes` of ``attributes`` are set."""
    otel = getattr(tracer, "otel", None)
    if otel is None:
        yield None
        return
    with otel.start_as_current_span("engram.llm.call", kind=trace.SpanKind.CLIENT,
                                    attributes=safe_attributes(attributes), record_exception=False,
                                    set_status_on_exception=False) as span_:
        yield span_
