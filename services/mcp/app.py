"""mcp service: engram's memory for Model Context Protocol hosts (the official ``mcp`` SDK, 2.x).

``engram serve mcp`` serves MCP over streamable HTTP at ``/mcp`` on ENGRAM_HTTP_PORT, next to
what every engram service serves (``/metrics``, ``/healthz``, ``/readyz``, ``/asyncapi``);
``engram serve mcp --transport stdio`` speaks MCP on stdin/stdout for a local agent host that
starts it (logs go to stderr). Like the gateway it never opens the graph: every tool is a NATS
publish (PubAck awaited) or request/reply (services/mcp/tools.py). Group ids are validated with
the gateway's types; HTTP needs ENGRAM_MCP_API_KEY when one is set, and without one it refuses
a non-loopback address (as the gateway does). Tool arguments and results are never logged.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timezone
import hmac
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from faststream.asgi import AsgiFastStream
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from prometheus_client import Counter, Histogram
from pydantic import AwareDatetime, BeforeValidator, Field

from engram.compat import route_unmatched_http
from engram.publishing.promote import WORKSPACE_ONLY_KINDS, Promotion, PromotionKind
from engram.runtime.service import ServiceApp, make_broker
from engram.settings import EngramSettings
from engram.schemas.memory import ACTIVITY_KIND_PATTERN, ContextBudgets, ContextRequest, LogActivityRequest, MemoryScopes
from engram.schemas.messages import MAX_EXTRACTION_INSTRUCTIONS_CHARS, MESSAGE_ID_PATTERN, TimeRange
from engram.schemas.subjects import SESSION_ID_PATTERN, TOKEN_PATTERN
from engram.services.gateway.bus import Bus
from engram.services.gateway.models import AddTripletRequest, FactFilters, GroupId, WriteGroupId
from engram.services.gateway.settings import is_loopback
from engram.services.mcp.settings import McpSettings
from engram.services.mcp.tools import EngramTools, ToolFailed

MCP_PATH = "/mcp"
INSTRUCTIONS = (
    "engram is a temporal memory of conversations. add_memory stores a chat message (source='message') or a "
    "whole text (source='text'/'json') durably and answers with the ids it will have; extraction turns it into "
    "entities and facts shortly after. search_memory_facts finds current facts; get_context builds the layered "
    "context for an answer; promote keeps a decision, lesson, preference or procedure for a workspace or user; "
    "save_user_note, set_user_preference, add_favorite and log_activity keep what you learn about and do for "
    "your user, shown in get_context's user context."
)

Uuid = Annotated[str, Field(min_length=1, max_length=256)]
GroupIds = Annotated[list[GroupId], BeforeValidator(lambda v: [v] if isinstance(v, str) else v),
                     Field(min_length=1, max_length=50, description="Groups to search (one group id alone is "
                                                                      "taken as a list of one, as Graphiti does).")]
UserKey = Annotated[str | None, Field(max_length=512, description="User key: the user's memory when given.")]
WorkspaceKey = Annotated[str | None, Field(max_length=512, description="Workspace key: used when no user.")]
SessionKey = Annotated[str | None, Field(pattern=SESSION_ID_PATTERN, description="Session id: used when neither.")]


def _scopes(user: str | None, workspace: str | None, session: str | None) -> MemoryScopes:
    if not (user or workspace or session):
        raise ToolError("give whose memory: user, workspace or session")
    return MemoryScopes(user=user, workspace=workspace, session=session)


TOOL_CALLS = Counter(
    "engram_mcp_tool_calls_total", "MCP tool calls that reached engram, by tool and outcome (ok, error).",
    ["tool", "outcome"],
)
TOOL_SECONDS = Histogram(
    "engram_mcp_tool_seconds", "MCP tool call latency, by tool.", ["tool"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


FlatTime = Annotated[datetime | None, Field(description="Graphiti's flat form of the ranges: ISO 8601, no zone "
                                                        "meaning UTC.")]


def _range(name: str, nested: TimeRange | None, after: datetime | None, before: datetime | None) -> TimeRange | None:
    """A fact time range from engram's ``{after, before}`` or Graphiti's ``<name>_after/_before``
    (naive times are UTC, as Graphiti reads them); both forms at once is a tool error."""
    if after is None and before is None:
        return nested
    if nested is not None:
        raise ToolError(f"give {name} or {name}_after/{name}_before, not both")
    utc = [t if t is None or t.tzinfo else t.replace(tzinfo=timezone.utc) for t in (after, before)]
    try:
        return TimeRange(after=utc[0], before=utc[1])
    except ValueError as exc:
        raise ToolError(f"{name}: {exc}") from exc


NOT_SUPPORTED = {
    # Why (docs/architecture.md, "Communities and sagas"): what they would cost against what engram
    # already gives an agent.
    "build_communities": (
        "not supported: engram does not build Graphiti's communities. A build clusters every entity of the "
        "group and summarises each cluster by merging its members' summaries pairwise, about one model call per "
        "entity, again on every build (110 entities for one LoCoMo conversation with the offline model, tens of "
        "thousands for a year of an agent's memory), while engram refreshes an entity's summary only when its "
        "facts change. Use search_nodes for entities and their summaries, search_memory_facts for what relates them."
    ),
    "summarize_saga": (
        "not supported: engram has no sagas. Its unit of a conversation is the session: each session is "
        "summarised once when it closes, and get_context returns the summaries of the user's last sessions "
        "(its session layer); get_episodes lists a group's turns."
    ),
}


async def _run(tool: str, call) -> Any:  # noqa: ANN001
    started = time.perf_counter()
    try:
        result = await call
    except ToolFailed as exc:
        TOOL_CALLS.labels(tool=tool, outcome="error").inc()
        raise ToolError(str(exc)) from exc
    finally:
        TOOL_SECONDS.labels(tool=tool).observe(time.perf_counter() - started)
    TOOL_CALLS.labels(tool=tool, outcome="ok").inc()
    return result


def create_mcp_server(tools: EngramTools) -> MCPServer:
    server = MCPServer("engram", instructions=INSTRUCTIONS, version="0.1.0", log_level="WARNING")

    @server.tool()
    async def add_memory(
        name: Annotated[str, Field(max_length=256, description="A name for the memory (kept as its label).")],
        episode_body: Annotated[str, Field(min_length=1, max_length=100_000, description="The message or the text.")],
        group_id: WriteGroupId,
        source: Literal["text", "json", "message"] = "text",
        source_description: Annotated[str, Field(max_length=512)] = "",
        uuid: Annotated[str | None, Field(pattern=MESSAGE_ID_PATTERN, max_length=200, description="Optional id: the same id again "
                                          "stores nothing new.")] = None,
        role: Literal["user", "assistant", "system"] = "user",
        role_name: Annotated[str | None, Field(max_length=256, description="Speaker name (source='message').")] = None,
        custom_extraction_instructions: Annotated[str | None, Field(
            max_length=MAX_EXTRACTION_INSTRUCTIONS_CHARS,
            description="Extra instructions for extracting entities and facts from this memory (Graphiti's "
            "argument); they replace engram's configured preprocessing prompt for its episode (a message: for "
            "the turn it opens).")] = None,
        saga: Annotated[str | None, Field(pattern=SESSION_ID_PATTERN, description="Graphiti's sequence of episodes: "
                                          "engram's session. A text or json episode is stored in session saga (shown in "
                                          "its source description); a message's saga is its session, group_id.")] = None,
        reference_time: Annotated[AwareDatetime | None, Field(
            description="When this was said or happened (ISO 8601 with a zone; Graphiti's argument): the episode's "
            "time, against which its relative dates are resolved and its facts become valid. Omitted: now.")] = None,
        excluded_entity_types: Annotated[list[Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9_]{0,63}$")]] | None,
                                         Field(max_length=50, description="Entity types not to extract from this "
                                               "memory (names of the deployment's ontology).")] = None,
        previous_episode_uuids: Annotated[list[Annotated[str, Field(max_length=256)]] | None, Field(
            max_length=50, description="Graphiti's argument, accepted and not used: engram reads the group's latest "
            "turns as context.")] = None,
        update_communities: Annotated[bool, Field(description="Graphiti's argument, accepted and not used: engram "
                                                  "builds no communities (see build_communities).")] = False,
        saga_previous_episode_uuid: Annotated[str | None, Field(max_length=256, description="Graphiti's argument, "
                                              "accepted and not used: a saga's order is its session's.")] = None,
    ) -> dict:
        """Store a memory in group_id. source='message': one chat message of session group_id (role says who
        wrote it); it joins a turn, which becomes an episode. 'text' or 'json': a whole episode. Answers only
        after the broker stored it durably, with the ids it will have."""
        return await _run("add_memory", tools.add_memory(name, episode_body, group_id, source, source_description, uuid, role,
                                           role_name, custom_extraction_instructions, reference_time, saga,
                                           excluded_entity_types))

    @server.tool()
    async def search_memory_facts(
        query: Annotated[str, Field(min_length=1, max_length=8000)], group_ids: GroupIds,
        max_facts: Annotated[int, Field(ge=1, le=200)] = 10,
        center_node_uuid: Annotated[str | None, Field(max_length=256, description="Accepted for Graphiti's "
                                                      "clients and ignored (as the gateway's /search does).")] = None,
        as_of: Annotated[AwareDatetime | None, Field(description="The facts as they were true at this time "
                                                     "(ISO 8601 with a zone; valid then, ended since or not). "
                                                     "Omitted: now.")] = None,
        valid_at: Annotated[TimeRange | None, Field(description="Only facts that became true within "
                                                    "{after, before} (either end open).")] = None,
        invalid_at: Annotated[TimeRange | None, Field(description="Only facts that ended within "
                                                      "{after, before}.")] = None,
        edge_types: Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]] | None,
                              Field(max_length=50, description="Only facts of these relation names, "
                                                               "e.g. [\"USES\"].")] = None,
        min_similarity: Annotated[float | None, Field(ge=-1.0, le=1.0, description="Relevance floor: a fact "
                                                      "sharing no word with the query needs at least this cosine "
                                                      "(-1: none). Omitted: the deployment's.")] = None,
        valid_at_after: FlatTime = None, valid_at_before: FlatTime = None,
        invalid_at_after: FlatTime = None, invalid_at_before: FlatTime = None,
    ) -> dict:
        """Facts (relations between entities) relevant to the query, best first: the current ones, or
        those true at as_of, narrowed by when they began or ended and by relation name. The ranges
        also come in Graphiti's flat form (valid_at_after, ..., invalid_at_before)."""
        filters = FactFilters(as_of=as_of, valid_at=_range("valid_at", valid_at, valid_at_after, valid_at_before),
                              invalid_at=_range("invalid_at", invalid_at, invalid_at_after, invalid_at_before),
                              edge_types=edge_types or [], min_similarity=min_similarity)
        return await _run("search_memory_facts", tools.search_memory_facts(query, group_ids, max_facts, filters))

    @server.tool()
    async def search_nodes(
        query: Annotated[str, Field(min_length=1, max_length=8000)], group_ids: GroupIds,
        max_nodes: Annotated[int, Field(ge=1, le=100)] = 10,
        entity_types: Annotated[list[Annotated[str, Field(max_length=128)]] | None, Field(
            max_length=50, description="Only entities of these types (labels: Entity, or the types of the "
            "deployment's ontology, ENGRAM_ONTOLOGY).")] = None,
        center_node_uuid: Annotated[str | None, Field(max_length=256, description="Accepted for Graphiti's "
                                                      "clients and ignored.")] = None,
    ) -> dict:
        """Entities (name, summary) around the facts relevant to the query, with those facts, best first."""
        return await _run("search_nodes", tools.search_nodes(query, group_ids, max_nodes, entity_types or None))

    @server.tool()
    async def get_episodes(
        group_id: GroupId | None = None,
        group_ids: Annotated[list[GroupId] | None, Field(max_length=50, description="Several groups (Graphiti's "
                                                         "form); each gives its latest max_episodes.")] = None,
        max_episodes: Annotated[int, Field(ge=1, le=1000)] = 10,
    ) -> dict:
        """The latest episodes (completed turns and added texts) of group_id or of each of group_ids, newest first."""
        groups = ([group_id] if group_id else []) + [g for g in group_ids or [] if g != group_id]
        if not groups:
            raise ToolError("give group_id or group_ids")
        episodes: list = []
        for group in groups:
            episodes += (await _run("get_episodes", tools.get_episodes(group, max_episodes)))["episodes"]
        return {"episodes": episodes}

    @server.tool()
    async def delete_episode(uuid: Uuid) -> dict:
        """Delete an episode, the facts only it supported, and entities left with nothing."""
        return await _run("delete_episode", tools.delete_episode(uuid))

    @server.tool()
    async def get_entity_edge(uuid: Uuid) -> dict:
        """One fact (entity edge) by uuid."""
        return await _run("get_entity_edge", tools.get_entity_edge(uuid))

    @server.tool()
    async def delete_entity_edge(uuid: Uuid) -> dict:
        """Delete one fact (entity edge) by uuid."""
        return await _run("delete_entity_edge", tools.delete_entity_edge(uuid))

    @server.tool()
    async def clear_graph(
        group_id: GroupId | None = None,
        group_ids: Annotated[list[GroupId] | None, Field(max_length=50, description="Several groups (Graphiti's "
                                                         "form); engram clears only groups it is given.")] = None,
    ) -> dict:
        """Delete everything of the named groups' graphs. Messages still in the pipeline are written after this."""
        groups = list(dict.fromkeys(([group_id] if group_id else []) + list(group_ids or [])))
        if not groups:  # Graphiti clears its default group; engram has none, so nothing is cleared unnamed
            raise ToolError("give group_id or group_ids: the groups to clear")
        cleared = [await _run("clear_graph", tools.clear_graph(group)) for group in groups]
        return cleared[0] if len(cleared) == 1 else {"message": f"Graph data cleared for {len(groups)} groups",
                                                     "group_ids": groups}

    @server.tool()
    async def add_triplet(
        source_node_name: Annotated[str, Field(min_length=1, max_length=256, description="The source entity, e.g. Ada.")],
        edge_name: Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z][A-Za-z0-9_ ]*$",
                                        description="The relation, e.g. USES or WORKS_FOR.")],
        fact: Annotated[str, Field(min_length=1, max_length=2000, description="The fact as a sentence.")],
        target_node_name: Annotated[str, Field(min_length=1, max_length=256, description="The target entity.")],
        group_id: WriteGroupId,
        source_node_uuid: Annotated[str | None, Field(max_length=256, description="Graphiti's argument, ignored: "
                                                      "engram resolves entities by name, as for extracted facts.")] = None,
        target_node_uuid: Annotated[str | None, Field(max_length=256, description="As source_node_uuid.")] = None,
        valid_at: Annotated[AwareDatetime | None, Field(description="Since when it holds; omitted: now.")] = None,
        invalid_at: Annotated[AwareDatetime | None, Field(description="Until when it held, if it ended.")] = None,
    ) -> dict:
        """Store a fact given whole (source -[edge_name]-> target) with no extraction pass: its entities
        resolved against the group's and the fact like an extracted one (a duplicate merges, a
        contradiction ends the older fact). Answers once stored durably; in the graph within seconds."""
        request = AddTripletRequest(group_id=group_id, source_node_name=source_node_name, edge_name=edge_name,
                                    fact=fact, target_node_name=target_node_name, valid_at=valid_at,
                                    invalid_at=invalid_at)
        return await _run("add_triplet", tools.add_triplet(request))

    @server.tool()
    async def get_episode_entities(
        episode_uuids: Annotated[list[Uuid], Field(min_length=1, max_length=50,
                                                   description="Episodes whose entities and facts to return.")],
    ) -> dict:
        """The entities (nodes) and facts (edges) that these episodes produced: provenance, whatever
        their groups."""
        return await _run("get_episode_entities", tools.get_episode_entities(episode_uuids))

    @server.tool()
    async def build_communities(
        group_ids: Annotated[list[GroupId] | None, Field(max_length=50, description="Graphiti's argument; "
                                                         "engram does not build communities.")] = None,
    ) -> dict:
        """Not supported by engram (Graphiti's community clustering); use search_nodes, whose entity
        summaries engram keeps current."""
        TOOL_CALLS.labels(tool="build_communities", outcome="error").inc()
        raise ToolError(NOT_SUPPORTED["build_communities"])

    @server.tool()
    async def summarize_saga(
        saga_name: Annotated[str, Field(max_length=256, description="Graphiti's argument; engram has no sagas.")],
        group_id: GroupId | None = None,
    ) -> dict:
        """Not supported by engram (Graphiti's saga summaries); a session is engram's saga: get_context
        returns the summaries of a user's last sessions."""
        TOOL_CALLS.labels(tool="summarize_saga", outcome="error").inc()
        raise ToolError(NOT_SUPPORTED["summarize_saga"])

    @server.tool()
    async def get_status() -> dict:
        """Whether engram answers: NATS connection and the graph (recall)."""
        return await _run("get_status", tools.get_status())

    @server.tool()
    async def get_context(
        query: Annotated[str | None, Field(max_length=8000, description="The current user message.")] = None,
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
        identity: Annotated[str | None, Field(max_length=100_000)] = None,
        skills: Annotated[str | None, Field(max_length=200_000)] = None,
        timeout_ms: Annotated[int, Field(ge=10, le=60_000)] = 1000,
    ) -> dict:
        """The layered context to inject before answering (identity, agent memory, user context, session
        summary, skills, recall), each section cut to its token budget."""
        request = ContextRequest(scopes=MemoryScopes(user=user, workspace=workspace, session=session), query=query,
                                 identity=identity, skills=skills, budgets=ContextBudgets(), timeout_ms=timeout_ms)
        return await _run("get_context", tools.get_context(request))

    @server.tool()
    async def promote(
        kind: PromotionKind, text: Annotated[str, Field(min_length=1, max_length=8000)],
        key: Annotated[str, Field(min_length=1, max_length=512, description="The workspace or user key.")],
        scope: Literal["workspace", "user"] = "workspace",
        rationale: Annotated[str | None, Field(max_length=4000)] = None,
        author: Annotated[str | None, Field(max_length=256)] = None,
    ) -> dict:
        """Keep a decision, lesson_learned, preference or procedure in the workspace or user memory, or a
        task_update (plan, status, blockers) or repo_state (branch, commit, dirty, key commands) in the workspace
        memory; promoting the same text twice stores it once."""
        if kind in WORKSPACE_ONLY_KINDS and scope != "workspace":
            raise ToolError(f"{kind} is about a workspace: use scope='workspace'")
        promotion = Promotion(kind=kind, text=text, scope=scope, key=key, rationale=rationale, author=author)
        return await _run("promote", tools.promote(promotion))

    @server.tool()
    async def save_user_note(
        text: Annotated[str, Field(min_length=1, max_length=4000)],
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
        session_id: SessionKey = None,
    ) -> dict:
        """Remember a note about the user (an equal note returns the stored one)."""
        return await _run("save_user_note", tools.save_user_note(_scopes(user, workspace, session), text, session_id))

    @server.tool()
    async def set_user_preference(
        key: Annotated[str, Field(min_length=1, max_length=128, description="e.g. language")],
        value: Annotated[str, Field(min_length=1, max_length=2000)],
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
        session_id: SessionKey = None,
    ) -> dict:
        """Set a preference: the latest value wins, the earlier one stays in the history."""
        return await _run("set_user_preference", tools.set_user_preference(_scopes(user, workspace, session), key, value, session_id))

    @server.tool()
    async def get_user_preferences(
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
        include_history: bool = False,
    ) -> dict:
        """The current preferences (with include_history also earlier and removed values)."""
        return await _run("get_user_preferences", tools.get_user_preferences(_scopes(user, workspace, session), include_history))

    @server.tool()
    async def remove_user_preference(
        key: Annotated[str, Field(min_length=1, max_length=128)],
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
    ) -> dict:
        """End a preference's current value (it stays in the history); returns the ended value."""
        return await _run("remove_user_preference", tools.remove_user_preference(_scopes(user, workspace, session), key))

    @server.tool()
    async def log_activity(
        text: Annotated[str, Field(min_length=1, max_length=2000, description="What was done, e.g. 'RAG search: Python tutorials'.")],
        kind: Annotated[str, Field(pattern=ACTIVITY_KIND_PATTERN, description="e.g. search, tool, visit (lowercase).")] = "activity",
        occurred_at: Annotated[AwareDatetime | None, Field(description="When it happened; now when unset.")] = None,
        activity_id: Annotated[str | None, Field(pattern=TOKEN_PATTERN,
                                                 description="Your id for the entry: a retried call with it logs once.")] = None,
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
        session_id: SessionKey = None,
    ) -> dict:
        """Log something done for the user in their activity log (shown, latest first, in get_context's
        user context)."""
        request = LogActivityRequest(scopes=_scopes(user, workspace, session), text=text, kind=kind,
                                     occurred_at=occurred_at, activity_id=activity_id, session_id=session_id)
        return await _run("log_activity", tools.log_activity(request))

    @server.tool()
    async def list_activities(
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 50,
        kind: Annotated[str | None, Field(pattern=ACTIVITY_KIND_PATTERN, description="Only this kind.")] = None,
    ) -> dict:
        """The user's activity log, newest first."""
        return await _run("list_activities", tools.list_activities(_scopes(user, workspace, session), limit, kind))

    @server.tool()
    async def remove_activity(
        uuid: Uuid, user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
    ) -> dict:
        """Delete one entry of the activity log."""
        return await _run("remove_activity", tools.remove_activity(_scopes(user, workspace, session), uuid))

    @server.tool()
    async def add_favorite(
        item: Annotated[str, Field(min_length=1, max_length=2000, description="The item: a title, a link, a name.")],
        kind: Annotated[str | None, Field(pattern=ACTIVITY_KIND_PATTERN, description="e.g. doc, recipe, repo.")] = None,
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
        session_id: SessionKey = None,
    ) -> dict:
        """Mark an item as the user's favorite (an equal item returns the stored one)."""
        return await _run("add_favorite", tools.add_favorite(_scopes(user, workspace, session), item, kind, session_id))

    @server.tool()
    async def list_favorites(
        user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
        limit: Annotated[int, Field(ge=1, le=1000)] = 100,
    ) -> dict:
        """The user's favorites, newest first."""
        return await _run("list_favorites", tools.list_favorites(_scopes(user, workspace, session), limit))

    @server.tool()
    async def remove_favorite(
        uuid: Uuid, user: UserKey = None, workspace: WorkspaceKey = None, session: SessionKey = None,
    ) -> dict:
        """Remove one favorite."""
        return await _run("remove_favorite", tools.remove_favorite(_scopes(user, workspace, session), uuid))

    return server


def require_api_key(app: Any, expected: str) -> Any:
    """ASGI wrapper: the MCP endpoint answers 401 without ``x-api-key`` or ``Authorization: Bearer``
    equal to ``expected`` (the gateway's convention)."""
    expected_b = expected.encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or ())
            given = headers.get(b"x-api-key", b"")
            auth = headers.get(b"authorization", b"")
            if not given and auth[:7].lower() == b"bearer ":
                given = auth[7:].strip()
            if not given or not hmac.compare_digest(given, expected_b):
                body = json.dumps({"detail": "missing or wrong API key (x-api-key or Authorization: Bearer)"}).encode()
                await send({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]})
                await send({"type": "http.response.body", "body": body})
                return
        await app(scope, receive, send)

    return guarded


def refuse_open_exposure(http_host: str, mcp: McpSettings) -> None:
    if mcp.api_key is None and not mcp.allow_no_auth and not is_loopback(http_host):
        raise RuntimeError(
            f"the MCP server would serve without an API key on {http_host}: set ENGRAM_MCP_API_KEY, bind "
            "ENGRAM_HTTP_HOST=127.0.0.1, or set ENGRAM_MCP_ALLOW_NO_AUTH=true to serve it open on purpose"
        )


@dataclass
class McpService(ServiceApp):
    """A ServiceApp whose unmatched HTTP requests go to the MCP streamable HTTP app (as the gateway's go
    to its REST app); the MCP session manager runs inside the service's lifespan."""

    server: MCPServer | None = None
    http_host: str = "127.0.0.1"
    api_key: str = ""
    _http: Any = None

    def __post_init__(self) -> None:
        assert self.server is not None
        self._http = self.server.streamable_http_app(streamable_http_path=MCP_PATH, host=self.http_host)

    def asgi(self) -> AsgiFastStream:
        app = super().asgi()
        service_lifespan = app.lifespan_context
        sessions = self.server.session_manager

        # The session manager's task group must live in the lifespan's own task: FastStream runs
        # on_startup hooks in a task that ends once they return.
        @contextlib.asynccontextmanager
        async def lifespan(**options: Any) -> AsyncIterator[None]:
            async with service_lifespan(**options), sessions.run():
                yield

        app.lifespan_context = lifespan
        route_unmatched_http(app, require_api_key(self._http, self.api_key) if self.api_key else self._http)
        return app


def _parts(settings: EngramSettings | None, mcp: McpSettings | None) -> tuple[EngramSettings, McpSettings, Any, Bus, MCPServer]:
    settings = settings or EngramSettings()
    mcp = mcp or McpSettings()
    broker = make_broker(settings, service="mcp")
    bus = Bus(settings, broker, publish_timeout_s=mcp.publish_timeout_s)
    return settings, mcp, broker, bus, create_mcp_server(EngramTools(bus, settings, mcp))


def build(settings: EngramSettings | None = None, mcp: McpSettings | None = None) -> McpService:
    """The HTTP service (``engram serve mcp``)."""
    settings, mcp, broker, bus, server = _parts(settings, mcp)
    refuse_open_exposure(settings.http_host, mcp)
    service = McpService(name="mcp", broker=broker, on_startup=[bus.start], server=server,
                         http_host=settings.http_host,
                         api_key=mcp.api_key.get_secret_value() if mcp.api_key else "")
    service.bus = bus  # type: ignore[attr-defined]
    return service


async def run_stdio(settings: EngramSettings | None = None, mcp: McpSettings | None = None) -> None:
    """``engram serve mcp --transport stdio``: MCP on stdin/stdout until the host closes stdin."""
    settings, mcp, broker, bus, server = _parts(settings, mcp)
    await bus.start()
    try:
        await server.run_stdio_async()
    finally:
        await broker.stop()
