"""gateway service: the Graphiti REST contract over HTTP (FastAPI), backed by engram over NATS.

``engram serve gateway`` serves, on ENGRAM_HTTP_PORT, the Graphiti endpoints (routes.py),
``/openapi.json`` and ``/docs``, plus what every engram service serves (``/metrics``,
``/healthz``, ``/readyz``, ``/asyncapi``), and the memory explorer page at ``/explorer``
(explorer.py). The gateway never opens the graph: messages are published into the ENGRAM_IN stream (202 only after JetStream acknowledged each one), searches go
to the recall service on ``engram.recall``, episode listing and deletes to its ``engram.graph.*``
admin subjects. The broker's one subscriber serves ``engram.triplet.add`` (a fact given whole, for
agents that speak NATS: :func:`serve_triplets`); otherwise it is the NATS connection.

Logs never carry message content or queries; access logs are off under ``engram serve``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from faststream.asgi import AsgiFastStream
from prometheus_client import Counter, Histogram

from pydantic import ValidationError

from engram.compat import route_unmatched_http
from engram.runtime.service import ServiceApp, make_broker, message_itself
from engram.publishing.triplets import publish_triplet
from engram.schemas import subjects
from engram.schemas.messages import TripletAddRequest, TripletAddResponse
from engram.schemas.validation import error_locations
from engram.services.gateway import mapping
from engram.settings import EngramSettings
from engram.services.gateway.bus import Bus
from engram.services.gateway.explorer import explorer_page_router
from engram.services.gateway.models import GROUP_ID_HELP
from engram.services.gateway.routes import graphiti_router, health_router
from engram.services.gateway.settings import GatewaySettings, refuse_open_exposure

VERSION = "0.1.0"

HTTP_REQUESTS = Counter(
    "engram_gateway_http_requests_total", "HTTP requests to the gateway's REST API, by route template, method and status.",
    ["route", "method", "status"],
)
HTTP_SECONDS = Histogram(
    "engram_gateway_http_request_seconds", "REST request latency by route template.", ["route"],
    buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


CONTENT_FIELDS = frozenset({"text", "value", "query", "identity", "skills"})
"""Body fields of the session routes that hold content (memory_routes.py): never echoed back."""


def _readable(errors: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """FastAPI's validation errors, with a plain-words message for a bad group id, and without
    echoing message content back (``input`` of errors inside ``messages`` or a content field)."""
    out = []
    for error in errors:
        error = dict(error)
        loc = [str(p) for p in error.get("loc", ())]
        if error.get("type") == "string_pattern_mismatch" and any(p in ("group_id", "group_ids") for p in loc):
            error["msg"] = GROUP_ID_HELP
        if "messages" in loc or CONTENT_FIELDS.intersection(loc):
            error.pop("input", None)
        out.append(error)
    return out


def create_rest_app(bus: Bus, settings: EngramSettings, gateway: GatewaySettings) -> FastAPI:
    app = FastAPI(
        title="engram gateway (Graphiti REST API)",
        version=VERSION,
        description="Graphiti's REST contract served by engram: POST /messages is stored durably in NATS "
        "JetStream before it is acknowledged, and processed into the knowledge graph asynchronously.",
    )
    app.include_router(health_router())
    app.include_router(graphiti_router(bus, settings, gateway))
    # the memory explorer's static page (no data, no key), told whether the API wants one
    app.include_router(explorer_page_router(api_key_required=gateway.api_key is not None))

    @app.exception_handler(RequestValidationError)
    async def validation_failed(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse(status_code=422, content={"detail": jsonable_encoder(_readable(list(exc.errors())))})

    @app.middleware("http")
    async def metrics(request: Request, call_next):  # noqa: ANN001, ANN202
        started = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", None) or "unmatched"
        HTTP_REQUESTS.labels(route=route, method=request.method, status=str(response.status_code)).inc()
        HTTP_SECONDS.labels(route=route).observe(time.perf_counter() - started)
        return response

    return app


@dataclass
class GatewayService(ServiceApp):
    """A ServiceApp whose HTTP side also serves the REST API.

    The service side (FastStream's ASGI app) answers its exact paths (/metrics, /healthz,
    /readyz, /asyncapi) and owns the lifespan (broker connect, topology); every other HTTP
    request, which FastStream would answer with 404, goes to the FastAPI app instead.
    """

    rest: FastAPI | None = None

    def asgi(self) -> AsgiFastStream:
        app = super().asgi()
        rest = self.rest
        assert rest is not None
        route_unmatched_http(app, rest)  # FastStream has no fallback option (engram/compat.py)
        return app


TRIPLET_REQUESTS = Counter(
    "engram_gateway_triplet_requests_total",
    "Triplets requested on engram.triplet.add, by outcome (stored, duplicate, bad_request, error).", ["outcome"],
)
for _outcome in ("stored", "duplicate", "bad_request", "error"):
    TRIPLET_REQUESTS.labels(outcome=_outcome)


async def add_triplet(body: bytes, bus: Bus) -> tuple[TripletAddResponse, str]:
    """The answer to a TripletAddRequest and its outcome: stored as POST /triplets stores it
    (engram/publishing/triplets.py), never raised; a bad request says where, never the content."""
    try:
        request = TripletAddRequest.model_validate_json(body)
        episode = mapping.triplet_fact_episode(request.group_id, request.triplet,
                                               fields=("triplet.source", "triplet.target"))
    except ValidationError as exc:
        return TripletAddResponse(status="error", reason="bad_request: " + error_locations(exc, 5, root="body")), \
            "bad_request"
    except ValueError as exc:  # an entity name the graph cannot store (names the field, not the text)
        return TripletAddResponse(status="error", reason=f"bad_request: {exc}"), "bad_request"
    try:
        stored = await publish_triplet(bus.jetstream(), episode)
    except Exception as exc:  # noqa: BLE001 - answered: the requester retries
        return TripletAddResponse(status="error", reason=f"backend_error: {type(exc).__name__}"), "error"
    return (TripletAddResponse(group_id=episode.group_id, episode_id=episode.episode_id, stored=stored),
            "stored" if stored else "duplicate")


def serve_triplets(broker: Any, bus: Bus) -> None:
    @broker.subscriber(subjects.TRIPLET_ADD, queue="gateway-triplets", title="triplet-add", decoder=message_itself)
    async def on_triplet(msg: Any) -> TripletAddResponse:
        response, outcome = await add_triplet(msg.body, bus)
        TRIPLET_REQUESTS.labels(outcome=outcome).inc()
        return response


def build(settings: EngramSettings | None = None, gateway: GatewaySettings | None = None) -> GatewayService:
    settings = settings or EngramSettings()
    gateway = gateway or GatewaySettings()
    refuse_open_exposure(settings.http_host, gateway)  # no key on a reachable address: refuse to start
    broker = make_broker(settings, service="gateway")
    bus = Bus(settings, broker, publish_timeout_s=gateway.publish_timeout_s)
    rest = create_rest_app(bus, settings, gateway)
    serve_triplets(broker, bus)
    service = GatewayService(name="gateway", broker=broker, on_startup=[bus.start], rest=rest)
    service.bus = bus  # type: ignore[attr-defined]
    return service
