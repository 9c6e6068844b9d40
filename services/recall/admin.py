"""Graph admin over NATS request/reply, served by the recall service (the gateway's graph side).

Services talk only through NATS, so the HTTP gateway reads and deletes graph data by asking here:

* ``engram.graph.episodes``        GraphEpisodesRequest -> GraphEpisodesResponse (newest first)
* ``engram.graph.edge.get``        GraphEdgeRequest -> GraphEdgeResponse (``not_found`` if unknown)
* ``engram.graph.edge.delete``     GraphEdgeRequest -> GraphDeleteResponse
* ``engram.graph.episode.delete``  GraphEpisodeDeleteRequest -> GraphDeleteResponse
* ``engram.graph.group.delete``    GraphGroupDeleteRequest -> GraphDeleteResponse
* ``engram.graph.groups``          GraphGroupsRequest -> GraphGroupsResponse (groups holding a node)
* ``engram.graph.entity.save``     GraphEntityNodeRequest -> GraphEntityNodeResponse (graphiti's
  ``POST /entity-node``: an entity with a name, its name embedding and a summary)
* ``engram.graph.entities``        GraphEntitiesRequest -> GraphEntitiesResponse (entities with their
  summaries, by uuid or newest first; the MCP server's search_nodes)

No orphans: deleting an episode deletes its MENTIONS edges, the facts (RELATES_TO) whose
``episodes`` list becomes empty (the others only lose the episode's uuid), and then every entity
among the ones it touched that is left with no MENTIONS and no RELATES_TO. Deleting a fact does
the same for its two endpoints. Only entities the deletion touched are candidates: a group-wide
sweep could delete an entity the extractor has just written and is about to connect.

FalkorDB keeps one graph per group, and an edge or episode uuid names no group, so lookups by
uuid search every graph GRAPH.LIST returns. Graphs are read with GRAPH.RO_QUERY and only after
GRAPH.LIST showed them: a plain query on a missing key would create an empty graph. Deleting a
group empties its graph (DETACH DELETE in batches) and keeps the graph with its indices: other
processes (extractor, summary-gate, recall) cache a driver per group with its indices marked
built, and a later write to a re-created graph would have no fulltext indices (FalkorDB then
answers with silently empty results) and no vector index. It is not GRAPH.DELETE and a rebuild
of the indices on a fresh graph of the same name, as it was: with that, a FalkorDB 4.16.3 server
crashed about once in five full test runs ("illegal decrRefCount" in RediSearch's index free, in
FalkorDB's indexer thread, ~0.5 s after the compaction below; FalkorDB issue #2126 shows the same
free crashing under index builds concurrent with GRAPH.DELETE). Emptying frees no graph and builds
no index but the facts' vector index, renewed (on the empty graph) because deleted vectors stay in
it. On Neo4j (one shared database) everything is selected by its ``group_id`` property.

Handlers never raise: a request that does not parse, or a backend failure, is answered with
``status="error"`` and a reason (the exception type only: never content, never the query).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from faststream.nats import NatsBroker
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from engram.compat import take_index_build
from engram.graph.drivers import (
    VECTOR_INDEXES,
    GraphDrivers,
    as_utc,
    query_rows,
    vector_index_options,
)
from engram.text.secrets import scrub_secrets
from engram.runtime.service import jetstream, message_itself
from engram.schemas import subjects
from engram.schemas.messages import (
    GraphDeleteResponse,
    GraphEdgeRequest,
    GraphEdgeResponse,
    GraphEpisode,
    GraphEpisodeDeleteRequest,
    GraphEpisodeEntitiesRequest,
    GraphEpisodeEntitiesResponse,
    GraphEpisodesRequest,
    GraphEpisodesResponse,
    GraphFact,
    GraphEntity,
    GraphEntityNodeRequest,
    GraphEntitiesRequest,
    GraphEntitiesResponse,
    GraphEntityNodeResponse,
    GraphGroupDeleteRequest,
    GraphGroupsRequest,
    GraphGroupsResponse,
)
from engram.schemas.validation import error_locations
from engram.services.extractor.pipeline import (
    INPUT_TOKENS_PROPERTY,
    LLM_CALLS_PROPERTY,
    MESSAGE_IDS_PROPERTY,
    OUTPUT_TOKENS_PROPERTY,
    STAGE_MS_PROPERTY,
    safe_entity_name,
    stored_extraction_cost,
)
from engram.services.recall import purge

log = logging.getLogger("engram.recall.admin")
QUEUE_GROUP = "graph-admin"
SCAN_CONCURRENCY = 16
"""FalkorDB graphs searched at once for a uuid."""
CONNECT_TIMEOUT_S = 5.0
QUERY_TIMEOUT_S = 60.0
REWRITE_ATTEMPTS = 5
"""BGREWRITEAOF tries when concurrent deletes' rewrites keep starting first."""

ADMIN_REQUESTS = Counter(
    "engram_graph_admin_requests_total", "Graph admin requests, by operation and status (ok, not_found, error).",
    ["op", "status"],
)

EPISODE_FIELDS = (
    "e.uuid AS uuid, e.name AS name, e.group_id AS group_id, e.content AS content, e.source AS source, "
    "e.source_description AS source_description, e.created_at AS created_at, e.valid_at AS valid_at, "
    f"e.entity_edges AS entity_edges, e.{MESSAGE_IDS_PROPERTY} AS message_ids, "
    f"e.{LLM_CALLS_PROPERTY} AS llm_calls, e.{INPUT_TOKENS_PROPERTY} AS input_tokens, "
    f"e.{OUTPUT_TOKENS_PROPERTY} AS output_tokens, e.{STAGE_MS_PROPERTY} AS stage_ms"
)
EDGE_FIELDS = (
    "r.uuid AS uuid, r.name AS name, r.fact AS fact, r.group_id AS group_id, a.uuid AS source_node_uuid, "
    "b.uuid AS target_node_uuid, r.episodes AS episodes, r.valid_at AS valid_at, r.invalid_at AS invalid_at, "
    "r.created_at AS created_at, r.expired_at AS expired_at"
)
Q_EPISODES = (
    f"MATCH (e:Episodic) WHERE e.group_id = $group_id RETURN {EPISODE_FIELDS} "
    "ORDER BY coalesce(e.valid_at, e.created_at) DESC, e.created_at DESC LIMIT $last_n"
)
ENTITY_FIELDS = (
    "n.uuid AS uuid, n.name AS name, n.group_id AS group_id, labels(n) AS labels, n.created_at AS created_at, "
    "n.summary AS summary, "
    # a typed entity's attributes are its other properties (engram/graph/ontology.py); an untyped one has
    # none, so its properties (with its name vector) are not read
    "CASE WHEN size(labels(n)) > 1 THEN properties(n) ELSE NULL END AS props"
)
_NODE_PROPERTIES = frozenset({"uuid", "name", "group_id", "labels", "created_at", "summary", "name_embedding"})


def _entity(row: dict[str, Any], group_id: str) -> GraphEntity:
    """An ENTITY_FIELDS row as a GraphEntity."""
    return GraphEntity(uuid=row["uuid"], name=row.get("name") or "", group_id=row.get("group_id") or group_id,
                       labels=_strings(row.get("labels")), created_at=as_utc(row.get("created_at")),
                       summary=row.get("summary") or "", attributes=entity_attributes(row.get("props")))


def entity_attributes(props: Any) -> dict[str, Any]:
    """A typed entity's attributes: its properties but graphiti's own and vectors."""
    if not isinstance(props, dict):
        return {}
    return {k: v for k, v in props.items() if k not in _NODE_PROPERTIES and not k.endswith("_embedding")}
Q_GROUP_NAME = "MATCH (g:EngramGroup {group_id: $group_id}) RETURN g.scope AS scope, g.key AS key LIMIT 1"
Q_ENTITIES_BY_UUID = f"MATCH (n:Entity) WHERE n.group_id = $group_id AND n.uuid IN $uuids RETURN {ENTITY_FIELDS}"
Q_ENTITIES_NEWEST = (
    f"MATCH (n:Entity) WHERE n.group_id = $group_id RETURN {ENTITY_FIELDS} ORDER BY n.created_at DESC LIMIT $limit"
)
Q_EDGE = f"MATCH (a:Entity)-[r:RELATES_TO {{uuid: $uuid}}]->(b:Entity) RETURN {EDGE_FIELDS} LIMIT 1"
Q_EDGE_IN_GROUP = (
    f"MATCH (a:Entity)-[r:RELATES_TO {{uuid: $uuid}}]->(b:Entity) WHERE r.group_id = $group_id "
    f"RETURN {EDGE_FIELDS} LIMIT 1"
)
Q_EPISODE_GROUP = (
    "MATCH (e:Episodic {uuid: $uuid}) RETURN e.group_id AS group_id, "
    f"e.{MESSAGE_IDS_PROPERTY} AS message_ids LIMIT 1"
)
Q_ENTITIES_OF_EPISODE = (
    f"MATCH (e:Episodic {{uuid: $uuid}})-[:MENTIONS]->(n:Entity) WHERE e.group_id = $group_id RETURN {ENTITY_FIELDS}"
)
Q_EDGES_OF_EPISODE = (
    "MATCH (e:Episodic {uuid: $uuid}) WHERE e.group_id = $group_id WITH e.entity_edges AS ids "
    f"MATCH (a:Entity)-[r:RELATES_TO]->(b:Entity) WHERE r.group_id = $group_id AND r.uuid IN ids RETURN {EDGE_FIELDS}"
)
Q_MENTIONED = (
    "MATCH (e:Episodic {uuid: $uuid})-[:MENTIONS]->(n:Entity) WHERE e.group_id = $group_id RETURN n.uuid AS uuid"
)
Q_FACTS_OF_EPISODE = (
    "MATCH (a:Entity)-[r:RELATES_TO]->(b:Entity) WHERE r.group_id = $group_id AND $uuid IN r.episodes "
    "RETURN r.uuid AS uuid, a.uuid AS source, b.uuid AS target, [x IN r.episodes WHERE x <> $uuid] AS rest"
)
Q_DELETE_FACTS = (
    "MATCH (:Entity)-[r:RELATES_TO]->(:Entity) WHERE r.group_id = $group_id AND r.uuid IN $uuids "
    "DELETE r RETURN count(r) AS n"
)
Q_DROP_EPISODE_FROM_FACTS = (
    "MATCH (:Entity)-[r:RELATES_TO]->(:Entity) WHERE r.group_id = $group_id AND r.uuid IN $uuids "
    "SET r.episodes = [x IN r.episodes WHERE x <> $uuid] RETURN count(r) AS n"
)
Q_DROP_FACTS_FROM_EPISODES = (
    "MATCH (e:Episodic) WHERE e.group_id = $group_id AND any(x IN e.entity_edges WHERE x IN $uuids) "
    "SET e.entity_edges = [x IN e.entity_edges WHERE NOT x IN $uuids] RETURN count(e) AS n"
)
Q_DELETE_EPISODE = "MATCH (e:Episodic {uuid: $uuid}) WHERE e.group_id = $group_id DETACH DELETE e RETURN count(e) AS n"
# Orphans among the candidates. Mentions by the episode being deleted do not count, so this
# runs before the episode itself is deleted and a retry after a failure finds the same orphans.
# (Read, then delete: FalkorDB 4.16 rejects a pattern comprehension feeding a DETACH DELETE.)
Q_ORPHANS = (
    "MATCH (n:Entity) WHERE n.group_id = $group_id AND n.uuid IN $uuids "
    "RETURN n.uuid AS uuid, size([(m:Episodic)-[:MENTIONS]->(n) WHERE m.uuid <> $episode | m]) AS mentions, "
    "size([(n)-[r:RELATES_TO]-() | r]) AS facts"
)
Q_DELETE_ENTITIES = (
    "MATCH (n:Entity) WHERE n.group_id = $group_id AND n.uuid IN $uuids DETACH DELETE n RETURN count(n) AS n"
)
Q_NEO4J_DELETE_GROUP = "MATCH (n) WHERE n.group_id = $group_id DETACH DELETE n RETURN count(n) AS n"
Q_COUNT_EPISODES = "MATCH (e:Episodic) RETURN count(e) AS n"
Q_COUNT_FACTS = "MATCH ()-[r:RELATES_TO]->() RETURN count(r) AS n"
Q_INDEX_STATUSES = "CALL db.indexes() YIELD status RETURN status"
TELEMETRY_KEY = "telemetry{{{graph}}}"
INDEX_BUILD_POLLS = 100
# One batch of a group's nodes with their edges: a large group does not hold the graph's write
# lock (every query on it waits) in one long query.
Q_EMPTY_BATCH = "MATCH (n) WITH n LIMIT $batch DETACH DELETE n RETURN count(n) AS n"
EMPTY_BATCH = 5000
Q_ANY_NODE = "MATCH (n) RETURN 1 AS n LIMIT 1"
Q_NEO4J_GROUPS = "MATCH (n) WHERE n.group_id IS NOT NULL RETURN DISTINCT n.group_id AS group_id"


def _fact(r: dict[str, Any]) -> GraphFact:
    """A row of ``EDGE_FIELDS`` as the contract's fact."""
    return GraphFact(
        uuid=r["uuid"], name=r.get("name") or "", fact=r.get("fact") or "", group_id=r.get("group_id") or "",
        source_node_uuid=r.get("source_node_uuid") or "", target_node_uuid=r.get("target_node_uuid") or "",
        episodes=_strings(r.get("episodes")), valid_at=as_utc(r.get("valid_at")),
        invalid_at=as_utc(r.get("invalid_at")), created_at=as_utc(r.get("created_at")),
        expired_at=as_utc(r.get("expired_at")),
    )


def _strings(value: Any) -> list[str]:
    return [str(v) for v in value] if isinstance(value, (list, tuple)) else []


def _sendable(value: Any) -> bool:
    """False for a string with a NUL: FalkorDB reads a query's parameters as a C string, so a NUL
    ends the query ("Invalid input at end of input") and the request failed as a backend error.
    No stored uuid can hold one (it could not have been written), so such a lookup finds nothing
    (found by tests/fuzz: a valid edge or episode uuid may be any string)."""
    return not isinstance(value, str) or "\x00" not in value


def _first_int(rows: list[dict[str, Any]]) -> int:
    return int(rows[0]["n"]) if rows and rows[0].get("n") is not None else 0


class _Backend:
    """One admin request's view of the graph database."""

    async def group_names(self) -> list[str] | None:
        """FalkorDB: every graph that can be an engram group. Neo4j: None (one database)."""
        raise NotImplementedError

    async def read(self, graph: str | None, query: str, /, **params: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def write(self, graph: str | None, query: str, /, **params: Any) -> list[dict[str, Any]]:
        raise NotImplementedError

    async def drop_group(self, group_id: str) -> GraphDeleteResponse:
        raise NotImplementedError

    async def non_empty_groups(self) -> list[str]:
        """Every group holding at least one node."""
        raise NotImplementedError

    async def compact(self) -> None:
        """Rewrite the database's files so deleted data leaves the disk (FalkorDB: AOF and RDB)."""

    async def forget_queries(self, graph: str | None) -> None:
        """Drop the database's log of the graph's queries, which quotes their parameters."""

    async def close(self) -> None:
        pass


class _Falkor(_Backend):
    def __init__(self, client: Any) -> None:
        self.client = client

    @classmethod
    async def connect(cls, url: str) -> "_Falkor":
        # FalkorDB's constructor probes the server synchronously (cluster detection): in a thread,
        # with timeouts, so a stalled database cannot freeze the recall service's event loop.
        from falkordb.asyncio import FalkorDB

        parsed = urllib.parse.urlparse(url)
        client = await asyncio.to_thread(
            FalkorDB, host=parsed.hostname or "127.0.0.1", port=parsed.port or 6379, password=parsed.password,
            socket_connect_timeout=CONNECT_TIMEOUT_S, socket_timeout=QUERY_TIMEOUT_S,
        )
        return cls(client)

    async def group_names(self) -> list[str]:
        return sorted(g for g in await self.client.list_graphs() if subjects.is_valid_token(g))

    @staticmethod
    def _rows(result: Any) -> list[dict[str, Any]]:
        header = [h[1] for h in result.header]
        return [dict(zip(header, row)) for row in result.result_set]

    async def read(self, graph: str | None, query: str, /, **params: Any) -> list[dict[str, Any]]:
        assert graph is not None
        return self._rows(await self.client.select_graph(graph).ro_query(query, params))

    async def write(self, graph: str | None, query: str, /, **params: Any) -> list[dict[str, Any]]:
        assert graph is not None
        return self._rows(await self.client.select_graph(graph).query(query, params))

    async def drop_group(self, group_id: str) -> GraphDeleteResponse:
        from graphiti_core.driver.falkordb_driver import FalkorDriver

        if group_id not in await self.group_names():
            return GraphDeleteResponse(group_id=group_id)
        episodes = _first_int(await self.read(group_id, Q_COUNT_EPISODES))
        facts = _first_int(await self.read(group_id, Q_COUNT_FACTS))
        # Emptied, not GRAPH.DELETEd (see the module docstring).
        while _first_int(await self.write(group_id, Q_EMPTY_BATCH, batch=EMPTY_BATCH)) >= EMPTY_BATCH:
            pass
        # graphiti's indices, for a graph that had none: where they exist (every graph engram
        # created) each CREATE fails "already indexed" (graphiti ignores that) and FalkorDB builds
        # nothing. The driver shares our client; its constructor schedules exactly this build.
        driver = FalkorDriver(falkor_db=self.client, database=group_id)
        init = take_index_build(driver)
        await (init if init is not None else driver.build_indices_and_constraints())
        if facts:
            await self._renew_vector_index(group_id)
        await self.forget_queries(group_id)
        return GraphDeleteResponse(group_id=group_id, deleted_episodes=episodes)

    async def forget_queries(self, graph: str | None) -> None:
        # FalkorDB logs each query of a graph with its parameters (message text included) in the
        # stream ``telemetry{graph}`` (GRAPH.CONFIG CMD_INFO, the last MAX_INFO_QUERIES), saved
        # with the rest; GRAPH.DELETE drops it, emptying a graph or deleting an episode does not.
        assert graph is not None
        await self.client.connection.delete(TELEMETRY_KEY.format(graph=graph))

    async def _renew_vector_index(self, group_id: str) -> None:
        """Fresh vector indexes (same dimension: facts' and past turns') on the emptied graph, built before the
        compaction forks. FalkorDB 4.16.3 keeps deleted edges' vectors in the HNSW index, and a
        query's k nearest then include them (filtered out afterwards): 30 facts deleted, 3
        written, the 3 nearest returned 1. Recall would miss the group's new facts."""
        graph = self.client.select_graph(group_id)
        renewed = False
        for index in VECTOR_INDEXES:  # facts' and past turns' (the same holds for deleted nodes)
            options = await vector_index_options(graph, index)
            if not options or not options.get("dimension"):
                continue
            await graph.query(index.drop)
            await graph.query(index.create(int(options["dimension"])))
            renewed = True
        if not renewed:
            return
        for _ in range(INDEX_BUILD_POLLS):  # an empty graph: built at once
            statuses = (await graph.query(Q_INDEX_STATUSES)).result_set
            if all("OPERATIONAL" in str(row[0]) for row in statuses):
                return
            await asyncio.sleep(0.05)

    async def non_empty_groups(self) -> list[str]:
        # A deleted group's graph is re-created empty (with its indices): nothing in it to list.
        sem = asyncio.Semaphore(SCAN_CONCURRENCY)

        async def holds_a_node(name: str) -> bool:
            async with sem:
                try:
                    return bool(await self.read(name, Q_ANY_NODE))
                except Exception as exc:  # noqa: BLE001 - a graph deleted meanwhile
                    if "empty key" in str(exc):
                        return False
                    raise

        names = await self.group_names()
        found = await asyncio.gather(*(holds_a_node(n) for n in names))
        return [n for n, hit in zip(names, found) if hit]

    async def compact(self) -> None:
        """BGREWRITEAOF, waited for: Redis keeps every write in its append-only file, so a deleted
        graph stays on disk until the file is rewritten from memory. No BGSAVE: a FalkorDB 4.16.3
        server crashed once in its index free (RediSearch_DropIndex, "illegal decrRefCount") right
        after a BGSAVE that followed GRAPH.DELETEs, and an older dump.rdb is replaced anyway by the
        next periodic snapshot (``save 60 1``: the delete itself is a change), within a minute."""
        conn = self.client.connection

        async def idle(flag: str, polls: int) -> None:
            # Wait (bounded) until no such background job runs or is scheduled.
            for _ in range(polls):
                info = await conn.info("persistence")
                if not info.get(flag) and not info.get("aof_rewrite_scheduled"):
                    return
                await asyncio.sleep(0.05)

        if not (await conn.info("persistence")).get("aof_enabled"):
            return
        flag = "aof_rewrite_in_progress"
        for attempt in range(REWRITE_ATTEMPTS):
            await idle(flag, 200)  # a rewrite already running must finish before another starts
            try:
                await conn.execute_command("BGREWRITEAOF")
                break
            except Exception as exc:  # redis' ResponseError
                # Another delete's rewrite started between our idle check and our command. It
                # may have forked before our delete, so ours still runs once it has finished.
                if "already in progress" not in str(exc) or attempt == REWRITE_ATTEMPTS - 1:
                    raise
        await asyncio.sleep(0.05)  # let the job start before waiting for it to end
        await idle(flag, 600)

    async def close(self) -> None:
        await self.client.aclose()


class _Neo4j(_Backend):
    def __init__(self, graph: GraphDrivers) -> None:
        self.driver = graph.driver_for("_")  # one shared driver, whatever the group

    async def group_names(self) -> None:
        return None

    async def _run(self, query: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        return await query_rows(self.driver, query, **params)

    async def read(self, graph: str | None, query: str, /, **params: Any) -> list[dict[str, Any]]:
        return await self._run(query, params)

    async def write(self, graph: str | None, query: str, /, **params: Any) -> list[dict[str, Any]]:
        return await self._run(query, params)

    async def drop_group(self, group_id: str) -> GraphDeleteResponse:
        episodes = _first_int(await self._run("MATCH (e:Episodic) WHERE e.group_id = $group_id RETURN count(e) AS n",
                                              {"group_id": group_id}))
        await self._run(Q_NEO4J_DELETE_GROUP, {"group_id": group_id})
        return GraphDeleteResponse(group_id=group_id, deleted_episodes=episodes)

    async def non_empty_groups(self) -> list[str]:
        return sorted(str(r["group_id"]) for r in await self._run(Q_NEO4J_GROUPS, {}) if r.get("group_id"))


Req = TypeVar("Req", bound=BaseModel)
Resp = TypeVar("Resp", bound=BaseModel)


class GraphAdmin:
    def __init__(self, graph: GraphDrivers, broker: NatsBroker | None = None, embedder: Any = None) -> None:
        """``embedder``: graphiti EmbedderClient for entity name embeddings (the extractor's, so
        graphiti's entity resolution finds saved nodes); without it entity.save fails."""
        self.graph = graph
        self.embedder = embedder
        self.broker = broker  # for erasing a deleted group's or episode's messages (purge.py)

    def _js(self) -> Any:
        return jetstream(self.broker) if self.broker is not None else None

    @contextlib.asynccontextmanager
    async def _backend(self) -> AsyncIterator[_Backend]:
        # One short-lived FalkorDB connection per admin request (admin requests are rare, and
        # this keeps the recall service's per-group drivers out of every other graph).
        if self.graph.settings.graph_backend == "neo4j":
            yield _Neo4j(self.graph)
            return
        url = self.graph.settings.resolved_graph_url()
        if not url:
            raise RuntimeError("no graph database configured")
        backend = await _Falkor.connect(url)
        try:
            yield backend
        finally:
            with contextlib.suppress(Exception):
                await backend.close()

    async def _find(self, db: _Backend, query: str, **params: Any) -> tuple[str | None, dict[str, Any]] | None:
        """(group, first row) of the first graph where ``query`` returns a row; Neo4j: (None, row)."""
        if not all(map(_sendable, params.values())):
            return None
        names = await db.group_names()
        if names is None:
            rows = await db.read(None, query, **params)
            return (None, rows[0]) if rows else None
        sem = asyncio.Semaphore(SCAN_CONCURRENCY)

        async def probe(name: str) -> tuple[str, dict[str, Any]] | None:
            async with sem:
                try:
                    rows = await db.read(name, query, **params)
                except Exception as exc:  # noqa: BLE001 - a graph deleted meanwhile, or not graphiti's
                    if "empty key" in str(exc):
                        return None
                    raise
                return (name, rows[0]) if rows else None

        for hit in await asyncio.gather(*(probe(n) for n in names)):
            if hit is not None:
                return hit
        return None

    @staticmethod
    async def _delete_orphans(db: _Backend, graph: str | None, group: str, candidates: list[str], episode: str) -> int:
        """Delete the candidates left with no MENTIONS (but from ``episode``) and no RELATES_TO."""
        if not candidates:
            return 0
        found = await db.read(graph, Q_ORPHANS, group_id=group, uuids=candidates, episode=episode)
        orphans = [r["uuid"] for r in found if not r["mentions"] and not r["facts"]]
        if not orphans:
            return 0
        return _first_int(await db.write(graph, Q_DELETE_ENTITIES, group_id=group, uuids=orphans))

    # --- operations ----------------------------------------------------------------------
    async def episodes(self, req: GraphEpisodesRequest) -> GraphEpisodesResponse:
        async with self._backend() as db:
            names = await db.group_names()
            if names is not None and req.group_id not in names:
                return GraphEpisodesResponse()  # nothing written to this group (yet)
            rows = await db.read(req.group_id, Q_EPISODES, group_id=req.group_id, last_n=req.last_n)
        return GraphEpisodesResponse(episodes=[
            GraphEpisode(
                uuid=r["uuid"], name=r.get("name") or "", group_id=r.get("group_id") or req.group_id,
                content=r.get("content") or "", source=str(r.get("source") or "message"),
                source_description=r.get("source_description") or "", created_at=as_utc(r.get("created_at")),
                valid_at=as_utc(r.get("valid_at")), entity_edges=_strings(r.get("entity_edges")),
                message_ids=_strings(r.get("message_ids")),
                extraction=stored_extraction_cost(r.get("llm_calls"), r.get("input_tokens"), r.get("output_tokens"),
                                                  r.get("stage_ms")),
            )
            for r in rows
        ])

    async def _find_edge(self, db: _Backend, req: GraphEdgeRequest) -> tuple[str | None, dict[str, Any]] | None:
        """The edge in ``req.group_id``'s graph only, when named (one query), else in any graph."""
        if req.group_id is None:
            return await self._find(db, Q_EDGE, uuid=req.uuid)
        if not _sendable(req.uuid):
            return None
        names = await db.group_names()
        if names is not None and req.group_id not in names:
            return None
        graph = req.group_id if names is not None else None  # Neo4j: one database, filtered below
        rows = await db.read(graph, Q_EDGE_IN_GROUP, uuid=req.uuid, group_id=req.group_id)
        return (graph, rows[0]) if rows else None

    async def get_edge(self, req: GraphEdgeRequest) -> GraphEdgeResponse:
        async with self._backend() as db:
            hit = await self._find_edge(db, req)
        if hit is None:
            return GraphEdgeResponse(status="not_found")
        _, r = hit
        return GraphEdgeResponse(edge=_fact(r))

    async def delete_edge(self, req: GraphEdgeRequest) -> GraphDeleteResponse:
        async with self._backend() as db:
            hit = await self._find_edge(db, req)
            if hit is None:
                return GraphDeleteResponse(status="not_found")
            found_in, row = hit
            group = row.get("group_id") or found_in
            graph = found_in  # FalkorDB: the graph it was found in; Neo4j: None
            deleted = _first_int(await db.write(graph, Q_DELETE_FACTS, group_id=group, uuids=[req.uuid]))
            await db.write(graph, Q_DROP_FACTS_FROM_EPISODES, group_id=group, uuids=[req.uuid])
            endpoints = [u for u in (row.get("source_node_uuid"), row.get("target_node_uuid")) if u]
            orphans = await self._delete_orphans(db, graph, group, endpoints, episode="")
        return GraphDeleteResponse(group_id=group, deleted_facts=deleted, deleted_entities=orphans)

    async def delete_episode(self, req: GraphEpisodeDeleteRequest) -> GraphDeleteResponse:
        async with self._backend() as db:
            hit = await self._find(db, Q_EPISODE_GROUP, uuid=req.uuid)
            if hit is None:
                return GraphDeleteResponse(status="not_found")
            found_in, row = hit
            group = row.get("group_id") or found_in
            graph = found_in
            candidates = {r["uuid"] for r in await db.read(graph, Q_MENTIONED, uuid=req.uuid, group_id=group)}
            facts = await db.read(graph, Q_FACTS_OF_EPISODE, uuid=req.uuid, group_id=group)
            doomed = [f["uuid"] for f in facts if not f["rest"]]
            kept = [f["uuid"] for f in facts if f["rest"]]
            candidates |= {f[end] for f in facts if not f["rest"] for end in ("source", "target")}
            deleted_facts = updated = 0
            if doomed:
                deleted_facts = _first_int(await db.write(graph, Q_DELETE_FACTS, group_id=group, uuids=doomed))
                await db.write(graph, Q_DROP_FACTS_FROM_EPISODES, group_id=group, uuids=doomed)
            if kept:
                updated = _first_int(await db.write(graph, Q_DROP_EPISODE_FROM_FACTS, group_id=group, uuids=kept,
                                                    uuid=req.uuid))
            orphans = await self._delete_orphans(db, graph, group, sorted(candidates), episode=req.uuid)
            episodes = _first_int(await db.write(graph, Q_DELETE_EPISODE, uuid=req.uuid, group_id=group))
            message_ids = _strings(row.get("message_ids"))
            await db.forget_queries(graph)
            await db.compact()
        js = self._js()
        if js is not None:
            await purge.erase_episode(js, group, req.uuid, message_ids)
        return GraphDeleteResponse(group_id=group, deleted_episodes=episodes, deleted_facts=deleted_facts,
                                   updated_facts=updated, deleted_entities=orphans)

    async def delete_group(self, req: GraphGroupDeleteRequest) -> GraphDeleteResponse:
        js = self._js()
        if js is not None:
            # Streams first: a queued episode erased here can no longer re-create the graph.
            report = await purge.erase_group(js, self.graph.settings.group_prefix, req.group_id)
            if report.sessions:
                await self.broker.publish(sorted(report.sessions), subjects.CTL_FORGET_SESSIONS)
        async with self._backend() as db:
            response = await db.drop_group(req.group_id)
            if req.compact:
                await db.compact()
        return response

    async def episode_entities(self, req: GraphEpisodeEntitiesRequest) -> GraphEpisodeEntitiesResponse:
        """The entities each episode mentions and the facts it lists in ``entity_edges`` (the
        ones it wrote and the ones it confirmed), each once, episodes in the request's order."""
        entities: dict[str, GraphEntity] = {}
        facts: dict[str, GraphFact] = {}
        missing: list[str] = []
        async with self._backend() as db:
            for uuid in dict.fromkeys(req.uuids):
                hit = await self._find(db, Q_EPISODE_GROUP, uuid=uuid)
                if hit is None:
                    missing.append(uuid)
                    continue
                graph, row = hit
                group = row.get("group_id") or graph
                for r in await db.read(graph, Q_ENTITIES_OF_EPISODE, uuid=uuid, group_id=group):
                    entities.setdefault(r["uuid"], _entity(r, group))
                for r in await db.read(graph, Q_EDGES_OF_EPISODE, uuid=uuid, group_id=group):
                    facts.setdefault(r["uuid"], _fact(r))
        status = "not_found" if missing and not (entities or facts) and len(missing) == len(set(req.uuids)) else "ok"
        return GraphEpisodeEntitiesResponse(status=status, entities=list(entities.values()),
                                            facts=list(facts.values()), not_found=missing)

    async def groups(self, req: GraphGroupsRequest) -> GraphGroupsResponse:
        async with self._backend() as db:
            group_ids = sorted(await db.non_empty_groups())
            names: dict[str, str] = {}
            if req.with_names:  # the extractor records each group's scope and key in its graph
                for group_id in group_ids:
                    rows = await db.read(group_id, Q_GROUP_NAME, group_id=group_id)
                    if rows and rows[0].get("scope") and rows[0].get("key"):
                        names[group_id] = f"{rows[0]['scope']} {rows[0]['key']}"
            return GraphGroupsResponse(group_ids=group_ids, names=names)

    async def entities(self, req: GraphEntitiesRequest) -> GraphEntitiesResponse:
        """Entity nodes with their summaries (no name embedding): the named ones in the request's
        order, or the group's newest."""
        async with self._backend() as db:
            names = await db.group_names()
            if names is not None and req.group_id not in names:
                return GraphEntitiesResponse()  # nothing written to this group (yet)
            if req.uuids is not None:
                # FalkorDB 4.16.3 segfaults (Index_BuildQueryTree) on this IN lookup when a listed
                # uuid is a fulltext stopword ("a", "is"): such a string names no node engram or
                # graphiti made (uuid4s), so it is left out (found by tests/fuzz, regression test)
                uuids = [u for u in dict.fromkeys(req.uuids) if safe_entity_name(u) and _sendable(u)]
                rows = await db.read(req.group_id, Q_ENTITIES_BY_UUID, group_id=req.group_id, uuids=uuids)
                order = {u: i for i, u in enumerate(req.uuids)}
                rows.sort(key=lambda r: order.get(r["uuid"], len(order)))
            else:
                rows = await db.read(req.group_id, Q_ENTITIES_NEWEST, group_id=req.group_id, limit=req.limit)
        return GraphEntitiesResponse(entities=[_entity(r, req.group_id) for r in rows])

    async def save_entity(self, req: GraphEntityNodeRequest) -> GraphEntityNodeResponse:
        """graphiti server's ``save_entity_node``: EntityNode(name, uuid, group_id, summary), its
        name embedding, saved (MERGE on uuid). Through the group's driver, so a new group's graph
        gets its indices like one the extractor creates."""
        from graphiti_core.nodes import EntityNode

        if not safe_entity_name(req.name):
            # The extractor drops such names too: an entity named only "Is" crashed FalkorDB 4.16
            # in graphiti's name lookup (services/extractor/pipeline.py).
            return GraphEntityNodeResponse(status="error", reason="invalid: the name is empty, punctuation or "
                                           "only stopwords/pronouns")
        if self.embedder is None:
            raise RuntimeError("no embedder configured for entity names")
        # Scrubbed before the embedder sees the name or the graph stores either (REST /entity-node).
        node = EntityNode(uuid=req.uuid, name=scrub_secrets(req.name).text, group_id=req.group_id,
                          summary=scrub_secrets(req.summary).text)
        await node.generate_name_embedding(self.embedder)
        await node.save(await self.graph.driver(req.group_id))
        return GraphEntityNodeResponse(node=GraphEntity(
            uuid=node.uuid, name=node.name, group_id=node.group_id, labels=list(node.labels),
            created_at=as_utc(node.created_at), summary=node.summary, attributes=dict(node.attributes or {}),
        ))


async def answer(
    op: str, body: bytes, model: type[Req], handler: Callable[[Req], Awaitable[Resp]], error: type[Resp]
) -> Resp:
    """Parse, run, and turn every failure into an ``error`` response (never raise, never log content)."""
    try:
        request = model.model_validate_json(body)
    except ValidationError as exc:
        reason = "bad_request: " + error_locations(exc, 5)
        ADMIN_REQUESTS.labels(op=op, status="error").inc()
        return error(status="error", reason=reason)  # type: ignore[call-arg]
    try:
        response = await handler(request)
    except Exception as exc:  # noqa: BLE001 - answered, whatever broke
        log.warning("graph admin %s failed: %s", op, type(exc).__name__, exc_info=log.isEnabledFor(logging.DEBUG))
        ADMIN_REQUESTS.labels(op=op, status="error").inc()
        return error(status="error", reason=f"backend_error: {type(exc).__name__}")  # type: ignore[call-arg]
    ADMIN_REQUESTS.labels(op=op, status=getattr(response, "status", "ok")).inc()
    return response


def register_admin(broker: NatsBroker, graph: GraphDrivers, embedder: Any = None) -> GraphAdmin:
    """Subscribe the graph admin handlers (queue group ``graph-admin``: one replica answers)."""
    admin = GraphAdmin(graph, broker, embedder)

    @broker.subscriber(subjects.GRAPH_EPISODES, queue=QUEUE_GROUP, title="graph episodes", decoder=message_itself)
    async def on_episodes(msg: Any) -> GraphEpisodesResponse:
        return await answer("episodes", msg.body, GraphEpisodesRequest, admin.episodes, GraphEpisodesResponse)

    @broker.subscriber(subjects.GRAPH_EDGE_GET, queue=QUEUE_GROUP, title="graph edge get", decoder=message_itself)
    async def on_edge_get(msg: Any) -> GraphEdgeResponse:
        return await answer("edge_get", msg.body, GraphEdgeRequest, admin.get_edge, GraphEdgeResponse)

    @broker.subscriber(subjects.GRAPH_EDGE_DELETE, queue=QUEUE_GROUP, title="graph edge delete", decoder=message_itself)
    async def on_edge_delete(msg: Any) -> GraphDeleteResponse:
        return await answer("edge_delete", msg.body, GraphEdgeRequest, admin.delete_edge, GraphDeleteResponse)

    @broker.subscriber(subjects.GRAPH_EPISODE_DELETE, queue=QUEUE_GROUP, title="graph episode delete",
                       decoder=message_itself)
    async def on_episode_delete(msg: Any) -> GraphDeleteResponse:
        return await answer("episode_delete", msg.body, GraphEpisodeDeleteRequest, admin.delete_episode,
                            GraphDeleteResponse)

    @broker.subscriber(subjects.GRAPH_GROUP_DELETE, queue=QUEUE_GROUP, title="graph group delete",
                       decoder=message_itself)
    async def on_group_delete(msg: Any) -> GraphDeleteResponse:
        return await answer("group_delete", msg.body, GraphGroupDeleteRequest, admin.delete_group,
                            GraphDeleteResponse)

    @broker.subscriber(subjects.GRAPH_GROUPS, queue=QUEUE_GROUP, title="graph groups", decoder=message_itself)
    async def on_groups(msg: Any) -> GraphGroupsResponse:
        return await answer("groups", msg.body, GraphGroupsRequest, admin.groups, GraphGroupsResponse)

    @broker.subscriber(subjects.GRAPH_ENTITY_SAVE, queue=QUEUE_GROUP, title="graph entity save",
                       decoder=message_itself)
    async def on_entity_save(msg: Any) -> GraphEntityNodeResponse:
        return await answer("entity_save", msg.body, GraphEntityNodeRequest, admin.save_entity,
                            GraphEntityNodeResponse)

    @broker.subscriber(subjects.GRAPH_ENTITIES, queue=QUEUE_GROUP, title="graph entities", decoder=message_itself)
    async def on_entities(msg: Any) -> GraphEntitiesResponse:
        return await answer("entities", msg.body, GraphEntitiesRequest, admin.entities, GraphEntitiesResponse)

    @broker.subscriber(subjects.GRAPH_EPISODE_ENTITIES, queue=QUEUE_GROUP, title="graph episode entities",
                       decoder=message_itself)
    async def on_episode_entities(msg: Any) -> GraphEpisodeEntitiesResponse:
        return await answer("episode_entities", msg.body, GraphEpisodeEntitiesRequest, admin.episode_entities,
                            GraphEpisodeEntitiesResponse)

    return admin
