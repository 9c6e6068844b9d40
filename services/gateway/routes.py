"""The Graphiti REST endpoints (upstream ``server/graph_service/routers``), served over engram.

Writes go into engram's input stream (the pipeline turns them into episodes and facts
asynchronously, like upstream's background queue); reads and deletes are answered by the
recall service over NATS (services/recall/admin.py). Every handler maps NATS failures onto HTTP:
503 (retry), 504 (timeout), 502 (unexpected reply); an unknown uuid is 404, never 500.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Annotated, TypeVar

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, Response, Security, status
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from pydantic import BaseModel

from engram.observability import tracing
from engram.publishing.message_size import first_oversize, oversize_reason
from engram.publishing.promote import Promotion, publish_episode, publish_promotion
from engram.publishing.triplets import publish_triplet
from engram.settings import EngramSettings
from engram.schemas import RecallItem, RecallResponse, subjects
from engram.schemas.messages import (
    GraphDeleteResponse,
    GraphEdgeRequest,
    GraphEdgeResponse,
    GraphEntityNodeRequest,
    GraphEntityNodeResponse,
    GraphEpisodeDeleteRequest,
    GraphEpisodesRequest,
    GraphEpisodesResponse,
    GraphGroupDeleteRequest,
    GraphGroupsRequest,
    GraphGroupsResponse,
)
from engram.services.gateway import idempotency, mapping
from engram.services.gateway.bus import Bus, BusError
from engram.services.gateway.explorer import add_explorer_routes
from engram.services.gateway.memory_routes import add_memory_routes
from engram.services.gateway.models import (
    GROUP_ID_PATTERN,
    MAX_GROUP_ID,
    AddEntityNodeRequest,
    AddEpisodeRequest,
    AddMessagesRequest,
    AddTripletRequest,
    EntityEdgeResult,
    EntityNodeResult,
    EpisodeAdded,
    EpisodeResult,
    GetMemoryRequest,
    GetMemoryResponse,
    HealthStatus,
    Result,
    SearchQuery,
    SearchResults,
    TripletResult,
)
from engram.services.gateway.settings import GatewaySettings

T = TypeVar("T")

DEGRADED_HEADER = "X-Engram-Recall-Degraded"
SEARCH_ALL_CONCURRENCY = 8
"""Recall requests in flight at once for a search over all groups."""

PathGroupId = Annotated[str, Path(pattern=GROUP_ID_PATTERN, min_length=1, max_length=MAX_GROUP_ID,
                                  description="Graph group id: ASCII letters, digits, '_' and '-'.")]
PathUuid = Annotated[str, Path(min_length=1, max_length=256)]
IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", min_length=1, max_length=idempotency.MAX_IDEMPOTENCY_KEY,
    description="Optional (IETF draft \"The Idempotency-Key HTTP Header Field\"): the same key with the same body "
    "stores nothing new, at any time; with another body within a day it is refused with 422.")]

api_key_header = APIKeyHeader(name="x-api-key", auto_error=False, description="The gateway's API key, if one is set.")
bearer = HTTPBearer(auto_error=False, description="The gateway's API key as a bearer token, if one is set.")


def _raise(exc: BusError) -> HTTPException:
    headers = {"Retry-After": "1"} if exc.status == 503 else None
    return HTTPException(exc.status, exc.detail, headers=headers)


def _admin_failed(reason: str | None) -> HTTPException:
    if reason and reason.startswith("invalid:"):
        return HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, reason.removeprefix("invalid:").strip())
    retry = bool(reason and reason.startswith("backend_error"))
    return HTTPException(503 if retry else 502, f"graph admin failed: {reason}",
                         headers={"Retry-After": "1"} if retry else None)


class PromoteResult(BaseModel):
    success: bool = True
    group_id: str
    episode_uuid: str


def health_router() -> APIRouter:
    router = APIRouter(tags=["health"])

    @router.get("/healthcheck", response_model=HealthStatus)
    async def healthcheck() -> HealthStatus:
        """Liveness, as upstream Graphiti answers it (no API key needed)."""
        return HealthStatus()

    return router


def graphiti_router(bus: Bus, settings: EngramSettings, gateway: GatewaySettings) -> APIRouter:
    expected_key = gateway.api_key.get_secret_value() if gateway.api_key else ""

    async def require_key(
        key: Annotated[str | None, Security(api_key_header)] = None,
        token: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)] = None,
    ) -> None:
        if not expected_key:
            return
        given = key or (token.credentials if token else "")
        if not given or not hmac.compare_digest(given.encode(), expected_key.encode()):
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "missing or wrong API key (x-api-key or Authorization: Bearer)",
                                headers={"WWW-Authenticate": "Bearer"})

    router = APIRouter(dependencies=[Depends(require_key)])
    recall_timeout_ms = gateway.recall_timeout_ms
    recall_wait_s = gateway.recall_timeout_ms / 1000 + 1.0  # recall answers (maybe degraded) within its timeout
    admin_wait_s = gateway.admin_timeout_s
    max_bytes = settings.turn.max_message_bytes

    # --- ingest --------------------------------------------------------------------------
    async def _request_id(request: AddMessagesRequest, key: str | None) -> str:
        """services/gateway/idempotency.py: what tells this request's uuid- and timestamp-less
        messages apart from equal ones of other requests ("" when none needs it and no key came)."""
        key = key.strip().strip('"') if key else None  # the draft sends it as a quoted sf-string
        if not key and not any(idempotency.missing_id(m) for m in request.messages):
            return ""
        body = [m.model_dump(mode="json") for m in request.messages]
        try:
            return await bus.request_id(request.group_id, idempotency.request_fingerprint("rest", request.group_id, body),
                                        key, gateway.retry_window_s)
        except idempotency.IdempotencyKeyReused as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT,
                                "this Idempotency-Key was already used with a different request body") from exc
        except BusError as exc:
            raise _raise(exc) from exc

    @router.post("/messages", status_code=status.HTTP_202_ACCEPTED, response_model=Result, tags=["ingest"],
                 responses={503: {"description": "The broker did not confirm every message: retry."}})
    async def add_messages(
        request: AddMessagesRequest,
        http: Request,  # for a traceparent header (not a documented parameter of the REST contract)
        idempotency_key: IdempotencyKey = None,
    ) -> Result:
        """Store messages durably in engram's input; turns become episodes and facts asynchronously.

        202 only after NATS JetStream acknowledged every message (in order). On 503 retry the
        same request: messages already stored are recognised by their id and not stored again.
        A message's id is its ``uuid``; else its content and ``timestamp``; else its content and
        the request: send an ``Idempotency-Key`` header to make retries explicit, otherwise an
        identical request within ENGRAM_GATEWAY_RETRY_WINDOW_S (60 s) is a retry and a later
        one is stored again. A W3C ``traceparent`` header makes the turns' traces part of the
        caller's trace.
        """
        request_id = await _request_id(request, idempotency_key)
        messages = mapping.chat_messages(request.group_id, request.messages, datetime.now(timezone.utc),
                                         idle_timeout_s=gateway.idle_timeout_s, request_id=request_id)
        too_big = first_oversize(messages, max_bytes, bus.max_payload())
        if too_big:  # the limit is named in the body (engram/publishing/message_size.py)
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, too_big)
        try:
            with tracing.attached(http.headers.get("traceparent")):  # the turn spans become children of the caller's span
                await bus.publish_messages(request.group_id, messages)
        except BusError as exc:
            raise _raise(exc) from exc
        return Result(message="Messages added to processing queue", success=True)

    async def _confirmed(what: str, publish: Callable[[], Awaitable[T]]) -> T:
        """``publish()``'s result once the broker confirmed it; a 503 (retry) when it did not or is
        not known to have (promotions, whole episodes, triplets: one translation for all)."""
        try:
            return await publish()
        except BusError as exc:
            raise _raise(exc) from exc
        except Exception as exc:  # noqa: BLE001 - not known to be stored
            raise HTTPException(status.HTTP_503_SERVICE_UNAVAILABLE,
                                f"the message broker did not confirm the {what} ({type(exc).__name__}); retry") from exc

    @router.post("/promote", status_code=status.HTTP_202_ACCEPTED, response_model=PromoteResult, tags=["ingest"],
                 responses={503: {"description": "The broker did not confirm the promotion: retry."}})
    async def promote(promotion: Promotion) -> PromoteResult:
        """Store a decision, lesson_learned, preference or procedure in the workspace or user scope,
        or a task_update or repo_state in the workspace scope (seed 003). It is extracted like a turn, with the canonical relation vocabulary; promoting
        the same text twice stores it once."""
        episode = await _confirmed("promotion", lambda: publish_promotion(bus.jetstream(), promotion, settings.group_prefix))
        return PromoteResult(group_id=episode.group_id, episode_uuid=episode.episode_id)

    @router.post("/episodes", status_code=status.HTTP_202_ACCEPTED, response_model=EpisodeAdded, tags=["ingest"],
                 responses={413: {"description": "Larger than a message may be."},
                            422: {"description": "source json with a body that is not JSON."},
                            503: {"description": "The broker did not confirm the episode: retry."}})
    async def add_episode(request: AddEpisodeRequest) -> EpisodeAdded:
        """Store a whole text or JSON episode (Graphiti's EpisodeType text / json): extracted like a
        turn within seconds, a long one in chunks (a JSON array between its elements). 202 once
        the broker stored it durably; the same episode again (same ``uuid``, else same name,
        source and body) is stored once."""
        try:
            episode = mapping.text_episode(
                request.group_id, request.name, request.episode_body, request.source, request.source_description,
                request.uuid, request.reference_time or datetime.now(timezone.utc),
                request.custom_extraction_instructions, saga=request.saga, door="rest",
                excluded_entity_types=request.excluded_entity_types)
        except ValueError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
        too_big = oversize_reason(episode, max_bytes, bus.max_payload())
        if too_big:
            raise HTTPException(status.HTTP_413_CONTENT_TOO_LARGE, too_big)
        stored = await _confirmed("episode", lambda: publish_episode(bus.jetstream(), episode))
        return EpisodeAdded(group_id=episode.group_id, episode_uuid=episode.episode_id, turn_id=episode.turn_id,
                            stored=stored)

    @router.post("/triplets", status_code=status.HTTP_202_ACCEPTED, response_model=TripletResult, tags=["ingest"],
                 responses={422: {"description": "An entity name of only stopwords or punctuation."},
                            503: {"description": "The broker did not confirm the triplet: retry."}})
    async def add_triplet(request: AddTripletRequest) -> TripletResult:
        """Store a fact given whole (source -[edge_name]-> target) with no extraction pass: its
        entities are resolved against the group's and the fact like an extracted one (a
        duplicate merges, a contradiction ends the older fact), in the group's order, within
        seconds. The same triplet twice is stored once (engram/publishing/triplets.py)."""
        try:
            episode = mapping.triplet_request_episode(request)
        except ValueError as exc:
            raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(exc)) from exc
        stored = await _confirmed("triplet", lambda: publish_triplet(bus.jetstream(), episode))
        return TripletResult(group_id=episode.group_id, episode_uuid=episode.episode_id, stored=stored)

    @router.post("/entity-node", status_code=status.HTTP_201_CREATED, response_model=EntityNodeResult,
                 tags=["ingest"], responses={422: {"description": "A name of only stopwords or punctuation."}})
    async def add_entity_node(request: AddEntityNodeRequest) -> EntityNodeResult:
        """Create an entity node with a name (and its name embedding) and a summary in ``group_id``,
        as upstream does; the same uuid again updates that node. Extraction resolves later
        mentions of the name onto it."""
        answer = await _admin(subjects.GRAPH_ENTITY_SAVE, GraphEntityNodeRequest(
            uuid=request.uuid, group_id=request.group_id, name=request.name, summary=request.summary,
        ), GraphEntityNodeResponse)
        if answer.node is None:
            raise HTTPException(status.HTTP_502_BAD_GATEWAY, "graph admin saved no node")
        return EntityNodeResult(**answer.node.model_dump())

    # --- retrieval -----------------------------------------------------------------------
    async def _recall_items(request, response: Response) -> list[RecallItem]:  # noqa: ANN001
        try:
            answer = await bus.ask(subjects.RECALL, request, RecallResponse, recall_wait_s)
        except BusError as exc:
            raise _raise(exc) from exc
        if answer.degraded:
            # Recall fails open: the facts it has (maybe none) with 200, and the reason in a header.
            response.headers[DEGRADED_HEADER] = (answer.reason or "degraded")[:200]
        return answer.items

    async def _recall(request, response: Response) -> list:  # noqa: ANN001
        return [mapping.fact_result(item) for item in await _recall_items(request, response)]

    async def _all_groups() -> list[str]:
        return (await _admin(subjects.GRAPH_GROUPS, GraphGroupsRequest(), GraphGroupsResponse)).group_ids

    @router.post("/search", response_model=SearchResults, tags=["retrieve"],
                 responses={400: {"description": "No group_ids, and more groups than ENGRAM_GATEWAY_SEARCH_ALL_MAX_GROUPS."}})
    async def search(query: SearchQuery, response: Response) -> SearchResults:
        """Current facts for ``query`` in the given groups (hybrid BM25 + vector search), best first;
        with ``as_of``, the facts true then; ``valid_at`` / ``invalid_at`` ranges and ``edge_types``
        narrow them. Without ``group_ids``, every group that holds a node, ranked together (as upstream)."""
        if query.group_ids:
            request = mapping.search_request(query.query, query.group_ids, query.max_facts, recall_timeout_ms, query)
            return SearchResults(facts=await _recall(request, response))
        groups = await _all_groups()
        if len(groups) > gateway.search_all_max_groups:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                f"a search without group_ids searches every group, and there are {len(groups)}, more than "
                f"{gateway.search_all_max_groups} (ENGRAM_GATEWAY_SEARCH_ALL_MAX_GROUPS): name the groups to "
                "search in group_ids (at most 50)",
            )
        # One recall request per group, so that every group's best facts compete on rank; one
        # request naming all groups would rank them by group order (recall's scope priority).
        limit = asyncio.Semaphore(SEARCH_ALL_CONCURRENCY)

        async def one(group: str) -> list[RecallItem]:
            async with limit:
                return await _recall_items(
                    mapping.search_request(query.query, [group], query.max_facts, recall_timeout_ms, query), response)

        per_group = await asyncio.gather(*(one(g) for g in groups))
        return SearchResults(facts=[mapping.fact_result(i) for i in mapping.ranked_across_groups(per_group, query.max_facts)])

    @router.post("/get-memory", response_model=GetMemoryResponse, tags=["retrieve"])
    async def get_memory(request: GetMemoryRequest, response: Response) -> GetMemoryResponse:
        """Facts relevant to the last few of ``messages`` in ``group_id``."""
        recall = mapping.memory_request(request.group_id, request.messages, request.max_facts, recall_timeout_ms)
        return GetMemoryResponse(facts=await _recall(recall, response))

    @router.get("/episodes/{group_id}", response_model=list[EpisodeResult], tags=["retrieve"])
    async def get_episodes(
        group_id: PathGroupId, last_n: Annotated[int, Query(ge=1, le=1000)] = 10
    ) -> list[EpisodeResult]:
        """The group's latest ``last_n`` episodes (completed turns), newest first."""
        answer = await _admin(subjects.GRAPH_EPISODES, GraphEpisodesRequest(group_id=group_id, last_n=last_n),
                              GraphEpisodesResponse)
        return [mapping.episode_result(e) for e in answer.episodes]

    @router.get("/entity-edge/{uuid}", response_model=EntityEdgeResult, tags=["retrieve"],
                responses={404: {"description": "No fact has this uuid."}})
    async def get_entity_edge(uuid: PathUuid) -> EntityEdgeResult:
        answer = await _admin(subjects.GRAPH_EDGE_GET, GraphEdgeRequest(uuid=uuid), GraphEdgeResponse)
        if answer.status == "not_found" or answer.edge is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"entity edge {uuid} not found")
        return mapping.edge_result(answer.edge)

    # --- deletes -------------------------------------------------------------------------
    @router.delete("/entity-edge/{uuid}", response_model=Result, tags=["delete"],
                   responses={404: {"description": "No fact has this uuid."}})
    async def delete_entity_edge(uuid: PathUuid) -> Result:
        await _delete(subjects.GRAPH_EDGE_DELETE, GraphEdgeRequest(uuid=uuid), f"entity edge {uuid}")
        return Result(message="Entity Edge deleted", success=True)

    @router.delete("/group/{group_id}", response_model=Result, tags=["delete"])
    async def delete_group(group_id: PathGroupId) -> Result:
        """Everything of the group's graph. Messages still in the pipeline (an open turn, a queued
        episode) are written after this; delete again once they have been processed."""
        await _delete(subjects.GRAPH_GROUP_DELETE, GraphGroupDeleteRequest(group_id=group_id), f"group {group_id}")
        return Result(message="Group deleted", success=True)

    @router.delete("/episode/{uuid}", response_model=Result, tags=["delete"],
                   responses={404: {"description": "No episode has this uuid."}})
    async def delete_episode(uuid: PathUuid) -> Result:
        """The episode, the facts only it supported, and the entities left with no mention and no fact."""
        await _delete(subjects.GRAPH_EPISODE_DELETE, GraphEpisodeDeleteRequest(uuid=uuid), f"episode {uuid}")
        return Result(message="Episode deleted", success=True)

    @router.post("/clear", response_model=Result, tags=["delete"])
    async def clear() -> Result:
        """Everything, as upstream's ``/clear``: every group that holds a node is deleted as
        ``DELETE /group/{group_id}`` deletes one. Messages still in the pipeline are written after
        this (see DELETE /group). The groups go concurrently and FalkorDB's append-only file is
        rewritten once, after the last (one rewrite per group took over 30 s for a few hundred
        groups: tests/fuzz)."""
        groups = await _all_groups()
        limit = asyncio.Semaphore(SEARCH_ALL_CONCURRENCY)

        async def drop(group: str, compact: bool) -> None:
            async with limit:
                await _delete(subjects.GRAPH_GROUP_DELETE, GraphGroupDeleteRequest(group_id=group, compact=compact),
                              f"group {group}")

        await asyncio.gather(*(drop(group, False) for group in groups[:-1]))
        if groups:
            await drop(groups[-1], True)
        return Result(message="Graph cleared", success=True)

    async def _admin(subject: str, request, model):  # noqa: ANN001, ANN202
        try:
            answer = await bus.ask(subject, request, model, admin_wait_s)
        except BusError as exc:
            raise _raise(exc) from exc
        if answer.status == "error":
            raise _admin_failed(answer.reason)
        return answer

    async def _delete(subject: str, request, what: str) -> GraphDeleteResponse:  # noqa: ANN001
        answer = await _admin(subject, request, GraphDeleteResponse)
        if answer.status == "not_found":
            raise HTTPException(status.HTTP_404_NOT_FOUND, f"{what} not found")
        return answer

    add_memory_routes(router, bus, gateway)  # POST /context, /memory/* (memory_routes.py)
    add_explorer_routes(router, bus, gateway)  # GET /groups, /entities/*, /facts/* (explorer.py)
    return router
