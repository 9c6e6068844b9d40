"""The small runtime every service shares: broker, middlewares, HTTP side (/metrics, health).

A service module exposes ``build(settings) -> ServiceApp``; ``engram serve NAME`` runs it with
uvicorn, and tests start the same object in-process.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from faststream.asgi import AsgiFastStream, AsgiResponse, get, make_ping_asgi
from faststream import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.opentelemetry import NatsTelemetryMiddleware
from faststream.nats.prometheus.provider import NatsMetricsSettingsProvider
from faststream.prometheus.middleware import PrometheusMiddleware
from prometheus_client import REGISTRY, make_asgi_app

from engram.settings import EngramSettings

log = logging.getLogger(__name__)


def collapse_subject(subject: str) -> str:
    """Subject -> low-cardinality label: drop partition numbers and session/group tokens.

    engram.in.3.message.s1 -> engram.in.message; engram.episode.g1 -> engram.episode.
    """
    tokens = subject.split(".")
    if tokens[:2] == ["engram", "sched"] and len(tokens) >= 3:
        return f"engram.sched.{tokens[2]}"  # engram.sched.<kind>.<session|group>[.<node>]
    if tokens[:2] == ["engram", "in"] and len(tokens) == 5:
        return f"engram.in.{tokens[3]}"
    if tokens and tokens[0] == "engram" and len(tokens) == 4 and tokens[2].isdigit():
        return f"engram.{tokens[1]}"  # engram.episode.<p>.<group>
    if tokens and tokens[0] == "engram" and len(tokens) >= 3:
        return ".".join(tokens[:-1])
    if tokens and tokens[0] == "_INBOX":
        return "_INBOX"
    return subject if len(tokens) <= 2 else ".".join(tokens[:2]) + ".*"


class _CollapsedSubjectProvider(NatsMetricsSettingsProvider):
    __slots__ = ()

    def get_consume_attrs_from_message(self, msg: Any) -> Any:
        attrs = super().get_consume_attrs_from_message(msg)
        attrs["destination_name"] = collapse_subject(attrs["destination_name"])
        return attrs

    def get_publish_destination_name_from_cmd(self, cmd: Any) -> str:
        return collapse_subject(cmd.destination)


def _provider_factory(msg: Any) -> _CollapsedSubjectProvider:
    return _CollapsedSubjectProvider()


async def message_itself(message: Any) -> Any:
    """FastStream decoder that hands the handler the NatsMessage itself.

    Handlers need the raw bytes (to dead-letter them unchanged), the JetStream metadata and
    manual acks. Asking for ``NatsMessage`` through FastStream's context injection runs a sync
    resolver in a worker thread for every message (measured: ~2 thread hops per message), so
    the handler takes one untyped argument and this decoder supplies the message.
    """
    return message


def subscribe_partitions(
    broker: NatsBroker,
    stream: str,
    consumers: Sequence[Any],
    handler: Callable[[Any], Awaitable[None]],
    *,
    title: str,
) -> None:
    """One pull subscriber per partition durable (``consumers``: nats ConsumerConfig objects
    with durable_name and filter_subject), one message at a time, manual acks, and the handler
    receiving the NatsMessage itself (see :func:`message_itself`)."""
    js_stream = JStream(name=stream, declare=False)
    for p, config in enumerate(consumers):
        broker.subscriber(
            config.filter_subject,
            stream=js_stream,
            durable=config.durable_name,
            config=config,
            pull_sub=PullSub(batch_size=1, timeout=5.0),
            ack_policy=AckPolicy.MANUAL,
            decoder=message_itself,
            title=f"{title} partition {p}",
        )(handler)


async def retry_or_dead_letter(
    msg: Any,
    exc: BaseException,
    *,
    max_deliveries: int,
    dead_letter: Callable[[str, str], Awaitable[None]],
    logger: logging.Logger,
    base_delay_s: float = 1.0,
    max_delay_s: float = 60.0,
) -> bool:
    """The shared failure tail of a handler: nack with an exponential delay (a plain nak would
    redeliver in a hot loop), or, at ``max_deliveries``, dead-letter with reason
    ``processing_failed`` and ack. Returns True when the message was dead-lettered.
    Only the exception type is logged: messages may carry user content."""
    meta = msg.raw_message.metadata
    seq, delivered = meta.sequence.stream, meta.num_delivered
    if delivered >= max_deliveries:
        logger.error("giving up on seq=%s after %s deliveries: %s", seq, delivered, type(exc).__name__)
        await dead_letter("processing_failed", f"{type(exc).__name__} after {delivered} deliveries")
        await msg.ack()
        return True
    logger.warning("retrying seq=%s (delivery %s): %s", seq, delivered, type(exc).__name__,
                   exc_info=logger.isEnabledFor(logging.DEBUG))
    await msg.nack(delay=min(max_delay_s, base_delay_s * 2 ** (delivered - 1)))
    return False


def make_broker(settings: EngramSettings, *, service: str) -> NatsBroker:
    middlewares: list[Any] = [
        PrometheusMiddleware(
            settings_provider_factory=_provider_factory,
            registry=REGISTRY,
            app_name=service,
            metrics_prefix="engram_faststream",
        )
    ]
    tracer_provider = _tracer_provider(settings, service)
    if tracer_provider is not None:
        middlewares.insert(0, NatsTelemetryMiddleware(tracer_provider=tracer_provider, include_messages_counters=False))
    return NatsBroker(
        settings.resolved_nats_url(),
        middlewares=middlewares,
        name=f"engram-{service}",
        max_reconnect_attempts=-1,
        log_level=logging.DEBUG,
        **settings.nats_options(),
    )


_TRACER_PROVIDERS: list[Any] = []


async def flush_tracing() -> None:
    """Export buffered spans and stop exporters (called when a service stops)."""
    while _TRACER_PROVIDERS:
        _TRACER_PROVIDERS.pop().shutdown()


def _tracer_provider(settings: EngramSettings, service: str) -> Any | None:
    """OTLP/HTTP tracing when ENGRAM_OTEL_ENDPOINT is set; off (no provider) otherwise."""
    if not settings.otel_endpoint:
        return None
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": f"engram-{service}"}))
    endpoint = settings.otel_endpoint.rstrip("/")
    if not endpoint.endswith("/v1/traces"):
        endpoint += "/v1/traces"
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _TRACER_PROVIDERS.append(provider)
    return provider


@dataclass
class ServiceApp:
    """A service: its broker, ASGI app and lifecycle hooks."""

    name: str
    broker: NatsBroker
    on_startup: Sequence[Callable[[], Awaitable[None]]] = ()
    after_startup: Sequence[Callable[[], Awaitable[None]]] = ()
    on_shutdown: Sequence[Callable[[], Awaitable[None]]] = ()
    extra_routes: Sequence[tuple[str, Any]] = field(default_factory=tuple)

    async def start(self) -> None:
        """Start in-process (tests, benchmarks): hooks, then the broker's subscribers."""
        for hook in self.on_startup:
            await hook()
        await self.broker.start()
        for hook in self.after_startup:
            await hook()

    async def stop(self) -> None:
        for hook in self.on_shutdown:
            await hook()
        await self.broker.stop()
        await flush_tracing()

    def asgi(self) -> AsgiFastStream:
        @get(include_in_schema=False)
        async def live(scope: Any) -> AsgiResponse:
            return AsgiResponse(b'{"status":"ok"}', 200, headers={"content-type": "application/json"})

        return AsgiFastStream(
            self.broker,
            asgi_routes=[
                ("/metrics", make_asgi_app(REGISTRY)),
                ("/healthz", live),
                ("/readyz", make_ping_asgi(self.broker, timeout=2.0)),
                *self.extra_routes,
            ],
            on_startup=list(self.on_startup),
            after_startup=list(self.after_startup),
            on_shutdown=list(self.on_shutdown),
            after_shutdown=[flush_tracing],
            asyncapi_path="/asyncapi",
        )


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
    )
    # FastStream logs every message at INFO with its subject (which holds session ids): keep it quiet.
    logging.getLogger("faststream").setLevel(max(logging.WARNING, logging.getLevelName(level.upper())))
