"""Graph reads and writes of the summary-gate: a node's active facts, its gate state, its summary.

Plain Cypher through graphiti's driver (``driver.execute_query``), written for both FalkorDB
(one graph per group) and Neo4j (one database, groups separated by ``group_id``), so every
query also filters on ``group_id``.

Gate state lives on the Entity node: ``_graphiti_meta`` (GateMeta as JSON, see gate.py) and
``_summary_due_at`` (epoch seconds of a pending deferred refresh, or null), which lets a flush
find every node of the group that is due and refresh them in one batch. Existing node
properties are never touched except ``summary`` (on refresh) and these two.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pydantic import ValidationError

from engram.graph.drivers import as_utc, query_rows
from engram.services.summary_gate.gate import ActiveFact, GateMeta

META_PROPERTY = "_graphiti_meta"
DUE_PROPERTY = "_summary_due_at"


@dataclass
class NodeView:
    """What the gate and the summary prompt need to know about one entity."""

    uuid: str
    name: str
    summary: str
    meta: GateMeta
    facts: list[ActiveFact] = field(default_factory=list)
    invalidated: list[str] = field(default_factory=list)  # texts of facts no longer true
    episodes: list[str] = field(default_factory=list)  # recent episodes mentioning the node, newest first


def _as_datetime(value: Any) -> datetime | None:
    try:
        return as_utc(value)
    except ValueError:
        return None  # an unreadable stored time is treated as absent


def parse_meta(raw: Any) -> GateMeta:
    """The stored gate state; a missing or unreadable one starts fresh (the node is then
    treated as never summarised, which costs one refresh and repairs the state)."""
    if not raw:
        return GateMeta()
    try:
        return GateMeta.model_validate(json.loads(raw) if isinstance(raw, str) else raw)
    except (ValueError, ValidationError):
        return GateMeta()


async def load_node(driver: Any, group_id: str, node_uuid: str, *, max_facts: int, episodes: int) -> NodeView | None:
    """The node with its gate state, active facts (newest first) and context; None if absent."""
    rows = await query_rows(
        driver,
        f"MATCH (n:Entity {{uuid: $uuid}}) WHERE n.group_id = $group_id "
        f"RETURN n.name AS name, n.summary AS summary, n.`{META_PROPERTY}` AS meta",
        uuid=node_uuid, group_id=group_id,
    )
    if not rows:
        return None
    row = rows[0]
    facts = await query_rows(
        driver,
        # Filter the group on the node: FalkorDB 4.16 answers an undirected match filtered on
        # e.group_id with the node's OUTGOING edges only (an index scan), losing facts it is the object of.
        "MATCH (n:Entity {uuid: $uuid})-[e:RELATES_TO]-(:Entity) "
        "WHERE n.group_id = $group_id AND e.expired_at IS NULL AND e.invalid_at IS NULL "
        "RETURN DISTINCT e.uuid AS uuid, e.fact AS fact, e.fact_embedding AS embedding, e.valid_at AS valid_at, "
        "e.created_at AS created_at",
        uuid=node_uuid, group_id=group_id,
    )
    active = [
        ActiveFact(
            uuid=f["uuid"], fact=f["fact"] or "", embedding=list(f["embedding"]) if f["embedding"] else None,
            valid_at=_as_datetime(f["valid_at"]) or _as_datetime(f["created_at"]),
        )
        for f in facts
    ]
    epoch = datetime.min.replace(tzinfo=timezone.utc)
    active.sort(key=lambda f: (f.valid_at or epoch, f.uuid), reverse=True)
    invalid = await query_rows(
        driver,
        "MATCH (n:Entity {uuid: $uuid})-[e:RELATES_TO]-(:Entity) "
        "WHERE n.group_id = $group_id AND (e.expired_at IS NOT NULL OR e.invalid_at IS NOT NULL) "
        "RETURN DISTINCT e.fact AS fact LIMIT $limit",
        uuid=node_uuid, group_id=group_id, limit=max_facts,
    )
    context: list[dict[str, Any]] = []
    if episodes > 0:
        context = await query_rows(
            driver,
            "MATCH (ep:Episodic)-[:MENTIONS]->(n:Entity {uuid: $uuid}) WHERE ep.group_id = $group_id "
            "RETURN ep.content AS content, ep.valid_at AS valid_at ORDER BY ep.valid_at DESC LIMIT $limit",
            uuid=node_uuid, group_id=group_id, limit=episodes,
        )
    return NodeView(
        uuid=node_uuid,
        name=row["name"] or "",
        summary=row["summary"] or "",
        meta=parse_meta(row["meta"]),
        facts=active,
        invalidated=[r["fact"] for r in invalid if r["fact"]],
        episodes=[r["content"] for r in context if r["content"]],
    )


def _meta_json(meta: GateMeta) -> str:
    return meta.model_dump_json(exclude_none=False)


def _due(meta: GateMeta) -> float | None:
    return meta.pending.flush_after.timestamp() if meta.pending is not None else None


async def save_meta(driver: Any, group_id: str, node_uuid: str, meta: GateMeta) -> None:
    await driver.execute_query(
        f"MATCH (n:Entity {{uuid: $uuid}}) WHERE n.group_id = $group_id "
        f"SET n.`{META_PROPERTY}` = $meta, n.`{DUE_PROPERTY}` = $due",
        uuid=node_uuid, group_id=group_id, meta=_meta_json(meta), due=_due(meta),
    )


async def save_summary(driver: Any, group_id: str, node_uuid: str, summary: str, meta: GateMeta) -> None:
    """Summary and state in one statement, so a crash never leaves one without the other."""
    await driver.execute_query(
        f"MATCH (n:Entity {{uuid: $uuid}}) WHERE n.group_id = $group_id "
        f"SET n.summary = $summary, n.`{META_PROPERTY}` = $meta, n.`{DUE_PROPERTY}` = $due",
        uuid=node_uuid, group_id=group_id, summary=summary, meta=_meta_json(meta), due=_due(meta),
    )


async def due_nodes(driver: Any, group_id: str, now: datetime, *, limit: int, exclude: str | None = None) -> list[str]:
    """uuids of the group's nodes whose deferred refresh is due at ``now`` (oldest first)."""
    rows = await query_rows(
        driver,
        f"MATCH (n:Entity) WHERE n.group_id = $group_id AND n.`{DUE_PROPERTY}` IS NOT NULL "
        f"AND n.`{DUE_PROPERTY}` <= $now AND n.uuid <> $exclude "
        f"RETURN n.uuid AS uuid ORDER BY n.`{DUE_PROPERTY}` LIMIT $limit",
        group_id=group_id, now=now.timestamp(), exclude=exclude or "", limit=limit,
    )
    return [r["uuid"] for r in rows]
