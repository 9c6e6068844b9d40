"""engram's memory as MCP tools: what each tool does over NATS, with no MCP or HTTP in it.

Names and argument shapes follow Graphiti's MCP server (``mcp_server/graphiti_mcp_server.py``:
add_memory, search_memory_facts, search_nodes, get_episodes, delete_episode, delete_entity_edge,
get_entity_edge, clear_graph, get_status) plus engram's own session layer (get_context, promote,
the note and preference tools). Everything goes through :class:`engram.services.gateway.bus.Bus`, the
gateway's NATS client: durable publishes with the PubAck awaited, request/reply to recall
(``engram.recall``, ``engram.graph.*``) and the sessions service (``engram.memory.*``,
``engram.context``). A failure is a :class:`ToolFailed` with a plain reason, never content.
"""

from __future__ import annotations

from datetime import datetime, timezone
from collections.abc import Awaitable, Callable
from typing import Any, Literal

from pydantic import BaseModel

from engram.publishing.message_size import oversize_reason
from engram.publishing.promote import Promotion, publish_episode, publish_promotion
from engram.settings import EngramSettings
from engram.schemas import RecallResponse, subjects
from engram.schemas.ids import episode_id_for
from engram.publishing.triplets import publish_triplet
from engram.schemas.memory import (
    AddFavoriteRequest,
    ContextRequest,
    ContextResponse,
    DeleteActivityRequest,
    GetUserPreferencesRequest,
    ListActivitiesRequest,
    ListFavoritesRequest,
    LogActivityRequest,
    MemoryResponse,
    MemoryScopes,
    RemoveFavoriteRequest,
    RemoveUserPreferenceRequest,
    SaveUserNoteRequest,
    SetUserPreferenceRequest,
)
from engram.schemas.messages import (
    GraphDeleteResponse,
    GraphEdgeRequest,
    GraphEdgeResponse,
    GraphEntitiesRequest,
    GraphEntitiesResponse,
    GraphEpisodeDeleteRequest,
    GraphEpisodeEntitiesRequest,
    GraphEpisodeEntitiesResponse,
    GraphEpisodesRequest,
    GraphEpisodesResponse,
    GraphGroupDeleteRequest,
    GraphGroupsRequest,
    GraphGroupsResponse,
)
from engram.services.gateway import mapping
from engram.services.gateway.bus import Bus, BusError
from engram.services.gateway.idempotency import request_fingerprint
from engram.services.gateway.models import AddTripletRequest, FactFilters, Message
from engram.services.mcp.settings import McpSettings

EPISODE_SESSION_PREFIX = "mcp"
"""Turn ids of whole episodes added over MCP: ``mcp:<uuid or hash>`` (services/gateway/mapping.text_episode)."""
"""Turn ids of whole episodes added with add_memory(source='text'|'json') start with this."""


class ToolFailed(Exception):
    """A tool could not do what it was asked; the message is shown to the model (no content in it)."""


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class EngramTools:
    def __init__(self, bus: Bus, settings: EngramSettings, mcp: McpSettings) -> None:
        self.bus = bus
        self.settings = settings
        self.mcp = mcp

    # --- plumbing ---------------------------------------------------------------------------
    async def _ask(self, subject: str, request: BaseModel, model: type, timeout_s: float | None = None) -> Any:
        try:
            return await self.bus.ask(subject, request, model, timeout_s or self.mcp.admin_timeout_s)
        except BusError as exc:
            raise ToolFailed(exc.detail) from exc

    async def _admin(self, subject: str, request: BaseModel, model: type, what: str = "") -> Any:
        answer = await self._ask(subject, request, model)
        if answer.status == "not_found":
            raise ToolFailed(f"{what} not found")
        if answer.status == "error":
            raise ToolFailed(f"engram could not do it: {answer.reason}")
        return answer

    async def _recall(self, query: str, group_ids: list[str], max_facts: int,
                      filters: FactFilters | None = None) -> RecallResponse:
        request = mapping.search_request(query, group_ids, max_facts, self.mcp.recall_timeout_ms, filters)
        return await self._ask(subjects.RECALL, request, RecallResponse, self.mcp.recall_timeout_ms / 1000 + 1.0)

    @staticmethod
    async def _confirmed(what: str, publish: Callable[[], Awaitable[Any]]) -> Any:
        """``publish()``'s result; a tool error when the broker did not confirm ``what``."""
        try:
            return await publish()
        except BusError as exc:
            raise ToolFailed(exc.detail) from exc
        except Exception as exc:  # noqa: BLE001 - not known to be stored
            raise ToolFailed(f"the message broker did not confirm the {what} ({type(exc).__name__}); retry") from exc

    async def _request_id(self, group_id: str, uuid: str | None, call: list) -> str:
        """Without a uuid, an identical add_memory call within ENGRAM_MCP_RETRY_WINDOW_S is a retry
        (the same ids); a later one is a new memory (services/gateway/idempotency.py)."""
        if uuid:
            return ""
        try:
            return await self.bus.request_id(group_id, request_fingerprint("mcp", group_id, call), None,
                                             self.mcp.retry_window_s)
        except BusError as exc:
            raise ToolFailed(exc.detail) from exc

    # --- Graphiti's tools -------------------------------------------------------------------
    async def add_memory(self, name: str, episode_body: str, group_id: str, source: str, source_description: str,
                         uuid: str | None, role: Literal["user", "assistant", "system"], role_name: str | None,
                         custom_extraction_instructions: str | None = None,
                         reference_time: datetime | None = None, saga: str | None = None,
                         excluded_entity_types: list[str] | None = None) -> dict:
        at = reference_time or _utc_now()  # when it was said (Graphiti's reference_time): the episode's valid_at
        request_id = await self._request_id(group_id, uuid, [name, episode_body, source, source_description, role,
                                                             role_name, custom_extraction_instructions,
                                                             reference_time.isoformat() if reference_time else None,
                                                             saga, excluded_entity_types])
        if source == "message":
            if saga and saga != group_id:
                raise ToolFailed("a message's saga is its chat session, which is group_id: give saga=group_id or none")
            message = Message(content=episode_body, uuid=uuid, name=name, role_type=role, role=role_name,
                              source_description=source_description,
                              custom_extraction_instructions=custom_extraction_instructions)
            (chat,) = mapping.chat_messages(group_id, [message], at, idle_timeout_s=self.mcp.idle_timeout_s,
                                            request_id=request_id)
            if excluded_entity_types:  # the turn this message opens is extracted without them
                chat = chat.model_copy(update={"extraction": mapping.extraction_override(
                    custom_extraction_instructions, excluded_entity_types)})
            too_big = oversize_reason(chat, self.settings.turn.max_message_bytes, self.bus.max_payload())
            if too_big:  # names the limit (engram/publishing/message_size.py)
                raise ToolFailed(f"not stored: {too_big}")
            try:
                report = await self.bus.publish_messages(group_id, [chat])
                epoch = await self.bus.epochs.get(group_id) if self.bus.epochs is not None else 0
            except BusError as exc:
                raise ToolFailed(exc.detail) from exc
            # services/turn_detector/pairing.py turn_id_for: session id (+ epoch after a delete) + first message id
            turn_id = f"{group_id}@{epoch}:{chat.message_id}" if epoch else f"{group_id}:{chat.message_id}"
            return {
                "message": ("Message stored durably; it becomes part of a turn, then an episode and facts"
                            if report.stored else "Message already stored (same message id); nothing new was added"),
                "stored": bool(report.stored), "duplicate": bool(report.duplicates),
                "group_id": group_id, "message_id": chat.message_id,
                "turn_id": turn_id, "episode_id": episode_id_for(group_id, turn_id),
                "ids_note": "turn_id and episode_id hold when this message opens a turn (a user message after a "
                            "completed turn); an assistant reply joins the open turn, whose ids its first message gave",
            }
        try:
            episode = mapping.text_episode(group_id, name, episode_body, source, source_description, uuid, at,
                                           custom_extraction_instructions, request_id, saga, door=EPISODE_SESSION_PREFIX,
                                           excluded_entity_types=excluded_entity_types)
        except ValueError as exc:  # a json episode that is not JSON
            raise ToolFailed(str(exc)) from exc
        too_big = oversize_reason(episode, self.settings.turn.max_message_bytes, self.bus.max_payload())
        if too_big:
            raise ToolFailed(f"not stored: {too_big}")
        stored = await self._confirmed("episode", lambda: publish_episode(self.bus.jetstream(), episode,
                                                                        self.mcp.publish_timeout_s))
        return {"message": ("Episode stored durably; extraction writes its entities and facts" if stored
                            else "Episode already stored (same episode id); nothing new was added"),
                "stored": stored, "duplicate": not stored, "group_id": group_id,
                "turn_id": episode.turn_id, "episode_id": episode.episode_id}

    async def search_memory_facts(self, query: str, group_ids: list[str], max_facts: int,
                                  filters: FactFilters | None = None) -> dict:
        answer = await self._recall(query, group_ids, max_facts, filters)
        facts = [mapping.fact_result(i).model_dump(mode="json") | {"group_id": i.group_id} for i in answer.items]
        out: dict = {"message": "Facts retrieved successfully" if facts else "No relevant facts found", "facts": facts}
        if answer.degraded:
            out["degraded"] = answer.reason or "degraded"
        return out

    async def search_nodes(self, query: str, group_ids: list[str], max_nodes: int,
                           entity_types: list[str] | None = None) -> dict:
        """Entities around the facts recall finds for ``query``: each fact's two endpoints, ranked by
        their best fact, with their names, labels, summaries and attributes (``engram.graph.entities``)
        and those facts; with ``entity_types``, only entities with one of those labels. Recall
        searches facts, not entity names: an entity with no fact is not found here."""
        answer = await self._recall(query, group_ids, max(max_nodes * 2, 10))
        ranked: dict[str, dict] = {}
        for item in answer.items:
            request = GraphEdgeRequest(uuid=item.uuid, group_id=item.group_id)  # one graph read, not one per group
            edge = (await self._ask(subjects.GRAPH_EDGE_GET, request, GraphEdgeResponse)).edge
            if edge is None:
                continue
            for node_uuid in (edge.source_node_uuid, edge.target_node_uuid):
                ranked.setdefault(node_uuid, {"group_id": edge.group_id, "facts": []})["facts"].append(edge.fact)
        # a type filter reads every candidate's labels, then keeps the best max_nodes of that type
        chosen = list(ranked.items())[:max_nodes] if not entity_types else list(ranked.items())
        by_group: dict[str, list[str]] = {}
        for node_uuid, found in chosen:
            by_group.setdefault(found["group_id"], []).append(node_uuid)
        entities: dict[str, dict] = {}
        for group_id, uuids in by_group.items():
            reply = await self._admin(subjects.GRAPH_ENTITIES, GraphEntitiesRequest(group_id=group_id, uuids=uuids),
                                      GraphEntitiesResponse)
            entities.update({e.uuid: e.model_dump(mode="json") for e in reply.entities
                             if not entity_types or set(e.labels) & set(entity_types)})
        nodes = [entities[u] | {"facts": found["facts"]} for u, found in chosen if u in entities][:max_nodes]
        return {"message": "Nodes retrieved successfully" if nodes else "No relevant nodes found", "nodes": nodes}

    async def get_episodes(self, group_id: str, max_episodes: int) -> dict:
        answer = await self._admin(subjects.GRAPH_EPISODES, GraphEpisodesRequest(group_id=group_id, last_n=max_episodes),
                                   GraphEpisodesResponse)
        return {"episodes": [mapping.episode_result(e).model_dump(mode="json") for e in answer.episodes]}

    async def delete_episode(self, uuid: str) -> dict:
        await self._admin(subjects.GRAPH_EPISODE_DELETE, GraphEpisodeDeleteRequest(uuid=uuid), GraphDeleteResponse,
                          f"episode {uuid}")
        return {"message": f"Episode {uuid} deleted successfully"}

    async def add_triplet(self, request: AddTripletRequest) -> dict:
        """Graphiti's add_triplet through engram/publishing/triplets.py (the gateway's POST /triplets too)."""
        try:
            episode = mapping.triplet_request_episode(request)
        except ValueError as exc:
            raise ToolFailed(str(exc)) from exc
        stored = await self._confirmed("triplet", lambda: publish_triplet(self.bus.jetstream(), episode,
                                                                        self.mcp.publish_timeout_s))
        return {"message": (f"Triplet '{request.source_node_name} -[{request.edge_name}]-> "
                            f"{request.target_node_name}' stored durably; it is resolved into the graph like an "
                            "extracted fact" if stored else "Triplet already stored; nothing new was added"),
                "stored": stored, "duplicate": not stored, "group_id": episode.group_id,
                "episode_id": episode.episode_id}

    async def get_episode_entities(self, episode_uuids: list[str]) -> dict:
        answer = await self._admin(subjects.GRAPH_EPISODE_ENTITIES, GraphEpisodeEntitiesRequest(uuids=episode_uuids),
                                   GraphEpisodeEntitiesResponse, f"episode(s) {', '.join(episode_uuids)}")
        out: dict = {
            "message": f"Retrieved provenance for {len(episode_uuids) - len(answer.not_found)} episode(s)",
            "nodes": [{"uuid": e.uuid, "name": e.name, "labels": e.labels, "group_id": e.group_id,
                       "summary": e.summary, "created_at": e.created_at.isoformat() if e.created_at else None}
                      for e in answer.entities],
            "edges": [mapping.edge_result(f).model_dump(mode="json") for f in answer.facts],
        }
        if answer.not_found:
            out["not_found"] = answer.not_found
        return out

    async def get_entity_edge(self, uuid: str) -> dict:
        answer = await self._admin(subjects.GRAPH_EDGE_GET, GraphEdgeRequest(uuid=uuid), GraphEdgeResponse,
                                   f"entity edge {uuid}")
        if answer.edge is None:
            raise ToolFailed(f"entity edge {uuid} not found")
        return mapping.edge_result(answer.edge).model_dump(mode="json")

    async def delete_entity_edge(self, uuid: str) -> dict:
        await self._admin(subjects.GRAPH_EDGE_DELETE, GraphEdgeRequest(uuid=uuid), GraphDeleteResponse,
                          f"entity edge {uuid}")
        return {"message": f"Entity edge {uuid} deleted successfully"}

    async def clear_graph(self, group_id: str) -> dict:
        await self._admin(subjects.GRAPH_GROUP_DELETE, GraphGroupDeleteRequest(group_id=group_id), GraphDeleteResponse,
                          f"group {group_id}")
        return {"message": f"Graph data cleared for group {group_id}"}

    async def get_status(self) -> dict:
        """NATS connected, and recall (graph) and sessions answering."""
        status: dict[str, Any] = {"nats": "connected"}
        try:
            self.bus.jetstream()
        except BusError as exc:
            return {"status": "error", "message": exc.detail, "nats": "disconnected"}
        try:
            groups = await self._admin(subjects.GRAPH_GROUPS, GraphGroupsRequest(), GraphGroupsResponse)
            status["graph"] = f"ok ({len(groups.group_ids)} groups)"
        except ToolFailed as exc:
            status["graph"] = f"error: {exc}"
        ok = status["graph"].startswith("ok")
        return {"status": "ok" if ok else "error",
                "message": "engram is reachable over NATS" if ok else "engram's graph is not answering", **status}

    # --- engram's own ------------------------------------------------------------------------
    async def get_context(self, request: ContextRequest) -> dict:
        answer = await self._ask(subjects.CONTEXT, request, ContextResponse, request.timeout_ms / 1000 + 1.0)
        if answer.status == "error":
            raise ToolFailed(f"engram could not build the context: {answer.reason}")
        return answer.model_dump(mode="json")

    async def promote(self, promotion: Promotion) -> dict:
        episode = await self._confirmed("promotion", lambda: publish_promotion(self.bus.jetstream(), promotion,
                                                                               self.settings.group_prefix))
        return {"message": "Promotion stored durably", "group_id": episode.group_id, "episode_id": episode.episode_id}

    async def _memory(self, subject: str, request: BaseModel, what: str = "") -> MemoryResponse:
        answer = await self._ask(subject, request, MemoryResponse)
        if answer.status == "not_found":
            raise ToolFailed(f"{what} not found")
        if answer.status == "error":
            raise ToolFailed(f"the sessions service failed: {answer.reason}")
        return answer

    async def save_user_note(self, scopes: MemoryScopes, text: str, session_id: str | None) -> dict:
        answer = await self._memory(subjects.MEMORY_NOTE_SAVE, SaveUserNoteRequest(
            scopes=scopes, text=text, session_id=session_id))
        return answer.note.model_dump(mode="json") if answer.note else {}

    async def set_user_preference(self, scopes: MemoryScopes, key: str, value: str, session_id: str | None) -> dict:
        answer = await self._memory(subjects.MEMORY_PREFERENCE_SET, SetUserPreferenceRequest(
            scopes=scopes, key=key, value=value, session_id=session_id))
        return answer.preference.model_dump(mode="json") if answer.preference else {}

    async def get_user_preferences(self, scopes: MemoryScopes, include_history: bool) -> dict:
        answer = await self._memory(subjects.MEMORY_PREFERENCE_GET,
                                    GetUserPreferencesRequest(scopes=scopes, include_history=include_history))
        return {"preferences": [p.model_dump(mode="json") for p in answer.preferences]}

    async def log_activity(self, request: LogActivityRequest) -> dict:
        answer = await self._memory(subjects.MEMORY_ACTIVITY_LOG, request)
        return answer.activity.model_dump(mode="json") if answer.activity else {}

    async def list_activities(self, scopes: MemoryScopes, limit: int, kind: str | None) -> dict:
        answer = await self._memory(subjects.MEMORY_ACTIVITIES_LIST, ListActivitiesRequest(scopes=scopes, limit=limit, kind=kind))
        return {"activities": [a.model_dump(mode="json") for a in answer.activities]}

    async def remove_activity(self, scopes: MemoryScopes, uuid: str) -> dict:
        await self._memory(subjects.MEMORY_ACTIVITY_DELETE, DeleteActivityRequest(scopes=scopes, uuid=uuid), "activity")
        return {"message": "Activity deleted"}

    async def add_favorite(self, scopes: MemoryScopes, item: str, kind: str | None, session_id: str | None) -> dict:
        answer = await self._memory(subjects.MEMORY_FAVORITE_ADD, AddFavoriteRequest(
            scopes=scopes, item=item, kind=kind, session_id=session_id))
        return answer.favorite.model_dump(mode="json") if answer.favorite else {}

    async def list_favorites(self, scopes: MemoryScopes, limit: int) -> dict:
        answer = await self._memory(subjects.MEMORY_FAVORITES_LIST, ListFavoritesRequest(scopes=scopes, limit=limit))
        return {"favorites": [f.model_dump(mode="json") for f in answer.favorites]}

    async def remove_favorite(self, scopes: MemoryScopes, uuid: str) -> dict:
        await self._memory(subjects.MEMORY_FAVORITE_REMOVE, RemoveFavoriteRequest(scopes=scopes, uuid=uuid), "favorite")
        return {"message": "Favorite removed"}

    async def remove_user_preference(self, scopes: MemoryScopes, key: str) -> dict:
        answer = await self._memory(subjects.MEMORY_PREFERENCE_REMOVE, RemoveUserPreferenceRequest(scopes=scopes, key=key),
                                    "preference")  # not the key: it is user text, and the MCP SDK logs tool errors
        return answer.preference.model_dump(mode="json") if answer.preference else {}
