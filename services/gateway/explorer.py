"""The memory explorer (issue 15): a static page served by the gateway, and the JSON routes it
needs beyond the Graphiti ones, answered over NATS like every other route.

* ``GET /explorer`` (+ ``/explorer/explorer.js``, ``/explorer/explorer.css``): the page, served
  without the API key (it holds no data); it asks for the key and sends it as ``x-api-key`` on
  every data call. A strict Content-Security-Policy (scripts and styles from the gateway only,
  no inline script) backs up the page's rule of rendering data only as text.
* ``GET /groups``                 every group that holds a node (``engram.graph.groups``)
* ``GET /entities/{group_id}``    the newest entities with their summaries (``engram.graph.entities``)
* ``GET /facts/{group_id}``       the facts of the group's latest episodes, current and invalidated,
  each invalidated one with the fact and episode that invalidated it (``engram.graph.episodes``
  then ``engram.graph.edge.get`` per fact: recall has no "facts of a group" request, so the
  listing is bounded by ``last_n`` episodes and :data:`MAX_FACTS`)
* ``GET /summary-log/{group_id}`` the summary-gate's latest decisions and sampled skip audits:
  they exist only as messages in the ENGRAM_SUMMARY stream (no service answers a request for
  them), so the gateway reads that stream itself through short-lived ephemeral consumers
  (its NATS user may create, pull and delete consumers on ENGRAM_SUMMARY and no other stream)

The page uses the existing routes for the rest: ``/episodes/{group_id}``, ``POST /search``
(the query in the body, never in the URL), the deletes and ``/memory/*``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timezone
from importlib import resources
from typing import Annotated

import nats.errors
from fastapi import APIRouter, HTTPException, Path, Query, Response, status
from fastapi.responses import RedirectResponse
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import BaseModel, Field, ValidationError

from engram.graph.facts import infer_invalidated_by
from engram.schemas import subjects
from engram.schemas.messages import (
    GraphEdgeRequest,
    GraphEdgeResponse,
    GraphEntitiesRequest,
    GraphEntitiesResponse,
    GraphEpisode,
    GraphEpisodesRequest,
    GraphEpisodesResponse,
    GraphFact,
    GraphGroupsRequest,
    GraphGroupsResponse,
    SummaryAudit,
    SummaryEvent,
)
from engram.services.gateway import mapping
from engram.services.gateway.bus import Bus, BusError
from engram.services.gateway.models import GROUP_ID_PATTERN, MAX_GROUP_ID, EntityEdgeResult, EntityNodeSummary
from engram.services.gateway.settings import GatewaySettings

MAX_FACTS = 500
"""Most facts ``GET /facts/{group_id}`` fetches (one NATS request each)."""
FETCH_CONCURRENCY = 8
"""``engram.graph.edge.get`` requests in flight at once."""
SUMMARY_SCAN_MAX = 20_000
"""Most ENGRAM_SUMMARY messages read to find a group's newest decisions (or audits): the newest
of the stream's messages."""

PAGE_FILES = {
    "explorer.js": "text/javascript; charset=utf-8",
    "explorer.css": "text/css; charset=utf-8",
    # Cytoscape.js 3.35.0 (MIT, cytoscape.LICENSE.txt), the npm package's dist/cytoscape.min.js as
    # published (sha256 71fa9ebe...cd94): it draws an entity's neighbourhood, served from here (no CDN)
    "cytoscape.min.js": "text/javascript; charset=utf-8",
    "cytoscape.LICENSE.txt": "text/plain; charset=utf-8",
}
PAGE_HEADERS = {
    # Data is rendered with textContent only; the policy is the second line of defence: no inline
    # or foreign script, no framing, data calls only to the gateway itself.
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
                               "img-src 'self'; form-action 'none'; base-uri 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

PathGroupId = Annotated[str, Path(pattern=GROUP_ID_PATTERN, min_length=1, max_length=MAX_GROUP_ID,
                                  description="Graph group id: ASCII letters, digits, '_' and '-'.")]


class GroupsResult(BaseModel):
    group_ids: list[str]
    names: dict[str, str] = Field(default_factory=dict, description="Group id -> its scope and key, e.g. "
                                  "'workspace acme' (groups extracted since engram recorded names).")


class ExplorerFact(EntityEdgeResult):
    invalidated_by: str | None = Field(
        None, description="uuid of the fact that invalidated this one, when the invalidating episode names one.")
    invalidated_in: str | None = Field(None, description="uuid of the episode that invalidated this fact.")


class SummaryLog(BaseModel):
    decisions: list[SummaryEvent] = Field(description="The summary-gate's latest decisions on the group's entities, newest first.")
    audits: list[SummaryAudit] = Field(description="The latest sampled skips (the facts and the summary kept), newest first.")
    scanned: int = Field(description="Messages read from ENGRAM_SUMMARY to find them.")


async def newest_messages(js, stream: str, subject: str, limit: int, scan_max: int = SUMMARY_SCAN_MAX) -> tuple[list[bytes], int]:  # noqa: ANN001
    """The newest ``limit`` message bodies on ``subject`` in ``stream``, newest first, and how many
    were read. JetStream reads forwards only: an ephemeral pull consumer filtered to the subject
    (in memory, no acks) is read to its end (at most ``scan_max`` messages, the newest of them)
    keeping the last ``limit``, then deleted."""
    name = f"explorer_{uuid.uuid4().hex}"
    config = ConsumerConfig(name=name, filter_subject=subject, deliver_policy=DeliverPolicy.ALL,
                            ack_policy=AckPolicy.NONE, mem_storage=True, inactive_threshold=30.0)
    info = await js.add_consumer(stream, config=config)
    try:
        total = info.num_pending
        if total > scan_max:  # start so that only the newest scan_max are read
            await js.delete_consumer(stream, name)
            last = (await js.stream_info(stream)).state.last_seq  # the subject's newest are among the last scan_max
            config.deliver_policy, config.opt_start_seq = DeliverPolicy.BY_START_SEQUENCE, max(1, last - scan_max + 1)
            info = await js.add_consumer(stream, config=config)
            total = min(info.num_pending, scan_max)
        kept: deque[bytes] = deque(maxlen=limit)
        read = 0
        if total:
            sub = await js.pull_subscribe_bind(name, stream=stream)
            try:
                while read < total:
                    try:
                        batch = await sub.fetch(min(500, total - read), timeout=5)
                    except nats.errors.TimeoutError:
                        break
                    for msg in batch:
                        kept.append(msg.data)
                    read += len(batch)
            finally:
                await sub.unsubscribe()
        return list(reversed(kept)), read
    finally:
        with contextlib.suppress(Exception):  # the server drops it after inactive_threshold anyway
            await js.delete_consumer(stream, name)


_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def facts_with_invalidators(episodes: Sequence[GraphEpisode], facts: Sequence[GraphFact]) -> list[ExplorerFact]:
    """``facts`` with what invalidated them. An episode's ``entity_edges`` lists the facts it wrote
    and the ones it invalidated; its own facts carry its uuid in ``episodes``, the invalidated
    ones do not (how the extractor rebuilds deltas from the graph, services/extractor/pipeline.py
    ``stored_extraction``). The oldest such episode is the one that invalidated the fact."""
    by_uuid = {f.uuid: f for f in facts}
    found: dict[str, tuple[str | None, str]] = {}
    for episode in sorted(episodes, key=lambda e: e.valid_at or e.created_at or _EPOCH):
        own = [f for f in facts if episode.uuid in f.episodes]
        for uuid in episode.entity_edges:
            fact = by_uuid.get(uuid)
            if fact is None or uuid in found or episode.uuid in fact.episodes:
                continue
            if fact.expired_at is None and fact.invalid_at is None:
                continue  # listed but still current: touched, not invalidated
            found[uuid] = (infer_invalidated_by(fact, own), episode.uuid)
    out = []
    for fact in facts:
        by, episode_uuid = found.get(fact.uuid, (None, None))
        out.append(ExplorerFact(**mapping.edge_result(fact).model_dump(), invalidated_by=by, invalidated_in=episode_uuid))
    return out


def _parsed(model: type[BaseModel], bodies: Sequence[bytes]) -> list:
    """The bodies that are valid ``model`` instances (one written by another schema version is left out)."""
    out = []
    for body in bodies:
        try:
            out.append(model.model_validate_json(body))
        except ValidationError:
            continue
    return out


def _fail(exc: BusError) -> HTTPException:
    return HTTPException(exc.status, exc.detail, headers={"Retry-After": "1"} if exc.status == 503 else None)


def add_explorer_routes(router: APIRouter, bus: Bus, gateway: GatewaySettings) -> None:
    """The explorer's JSON routes, on ``router`` (the Graphiti router: same API key, same errors)."""
    wait_s = gateway.admin_timeout_s

    async def ask(subject: str, request: BaseModel, model):  # noqa: ANN001, ANN202
        try:
            answer = await bus.ask(subject, request, model, wait_s)
        except BusError as exc:
            raise _fail(exc) from exc
        if answer.status == "error":
            reason = answer.reason or ""
            retry = reason.startswith("backend_error")
            raise HTTPException(503 if retry else 502, f"graph admin failed: {reason}",
                                headers={"Retry-After": "1"} if retry else None)
        return answer

    @router.get("/groups", response_model=GroupsResult, tags=["explorer"])
    async def groups() -> GroupsResult:
        """Every group that holds a node."""
        answer = await ask(subjects.GRAPH_GROUPS, GraphGroupsRequest(with_names=True), GraphGroupsResponse)
        return GroupsResult(group_ids=answer.group_ids, names=answer.names)

    @router.get("/entities/{group_id}", response_model=list[EntityNodeSummary], tags=["explorer"])
    async def entities(group_id: PathGroupId, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                       ) -> list[EntityNodeSummary]:
        """The group's newest ``limit`` entities with their summaries."""
        answer = await ask(subjects.GRAPH_ENTITIES, GraphEntitiesRequest(group_id=group_id, limit=limit),
                           GraphEntitiesResponse)
        return [EntityNodeSummary(**e.model_dump(include=set(EntityNodeSummary.model_fields))) for e in answer.entities]

    @router.get("/facts/{group_id}", response_model=list[ExplorerFact], tags=["explorer"])
    async def facts(group_id: PathGroupId, last_n: Annotated[int, Query(ge=1, le=1000)] = 50) -> list[ExplorerFact]:
        """The facts written or invalidated by the group's latest ``last_n`` episodes (at most
        500), newest episode first, with validity dates and, for an invalidated fact, the fact
        and episode that invalidated it."""
        episodes = (await ask(subjects.GRAPH_EPISODES, GraphEpisodesRequest(group_id=group_id, last_n=last_n),
                              GraphEpisodesResponse)).episodes
        uuids = list(dict.fromkeys(u for e in episodes for u in e.entity_edges))[:MAX_FACTS]
        limit = asyncio.Semaphore(FETCH_CONCURRENCY)

        async def one(uuid: str) -> GraphFact | None:
            async with limit:
                answer = await ask(subjects.GRAPH_EDGE_GET, GraphEdgeRequest(uuid=uuid, group_id=group_id),
                                   GraphEdgeResponse)
            return answer.edge if answer.status == "ok" else None  # deleted since the episode listed it

        fetched = [f for f in await asyncio.gather(*(one(u) for u in uuids)) if f is not None and f.group_id == group_id]
        return facts_with_invalidators(episodes, fetched)

    @router.get("/summary-log/{group_id}", response_model=SummaryLog, tags=["explorer"])
    async def summary_log(group_id: PathGroupId, limit: Annotated[int, Query(ge=1, le=500)] = 50) -> SummaryLog:
        """The summary-gate's latest decisions (refreshed, skipped, deferred, with reason and
        drift) and sampled skip audits of the group, newest first, read from the ENGRAM_SUMMARY
        stream (the newest 20,000 messages of each kind at most)."""
        try:
            js = bus.jetstream()
            events, n_events = await newest_messages(js, subjects.STREAM_SUMMARY, subjects.summary(group_id), limit)
            audits, n_audits = await newest_messages(js, subjects.STREAM_SUMMARY, subjects.summary_audit(group_id), limit)
        except BusError as exc:
            raise _fail(exc) from exc
        except Exception as exc:  # noqa: BLE001 - stream missing, no rights, timeout: retry later
            raise HTTPException(503, f"cannot read the summary-gate's log from ENGRAM_SUMMARY ({type(exc).__name__})",
                                headers={"Retry-After": "1"}) from exc
        return SummaryLog(decisions=_parsed(SummaryEvent, events), audits=_parsed(SummaryAudit, audits),
                          scanned=n_events + n_audits)


def _page_file(name: str) -> bytes:
    return resources.files("engram.services.gateway").joinpath("explorer", name).read_bytes()


def explorer_page_router(api_key_required: bool = True) -> APIRouter:
    """The page's static files (no API key: they hold no data). Read once, at start-up.
    ``auth.json`` tells the page whether the gateway wants a key (no secret, no data): without one
    (`engram up` on loopback) the page connects at once and says so."""
    html = _page_file("explorer.html")
    assets = {name: (_page_file(name), media) for name, media in PAGE_FILES.items()}
    assets["auth.json"] = (json.dumps({"api_key_required": api_key_required}).encode(), "application/json")
    router = APIRouter(include_in_schema=False)

    @router.get("/explorer")
    async def page() -> Response:
        return Response(html, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    @router.get("/explorer/")
    async def page_slash() -> RedirectResponse:
        return RedirectResponse("/explorer", status_code=status.HTTP_308_PERMANENT_REDIRECT)

    @router.get("/explorer/{name}")
    async def asset(name: str) -> Response:
        if name not in assets:
            raise HTTPException(status.HTTP_404_NOT_FOUND, "no such file")
        body, media = assets[name]
        return Response(body, media_type=media, headers=PAGE_HEADERS)

    return router
