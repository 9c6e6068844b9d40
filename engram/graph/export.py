"""Take your memory with you (issue 26, item 5): one group's graph as JSONL, and back.

``engram export --group G`` writes every node and relationship of the group's graph, one JSON
object a line, with all their properties: episodes (turn text, source message ids, extraction
cost), entities (names, summaries, attributes), facts (validity, ``expired_at``, the episodes
that wrote them -- what invalidated a fact is the episode that lists it in ``entity_edges``
without being one of its ``episodes``), MENTIONS, and in a user's memory group the preferences,
notes, favorites, activity log and session summaries the sessions service keeps there (their own node labels). Vectors
(``*_embedding``) are kept, so an import needs no embedder and recall answers as before.

``engram import FILE [--group G]`` writes it into a stack's graph: nodes MERGEd on their label
and uuid, relationships on their endpoints, type and uuid, properties set from the file --
importing the same file twice changes nothing, and into another group name (``--group``)
renames the group id on every node and relationship. The graph's indices are built first, as
for any new group (engram.graph.drivers.GraphDrivers.driver).

Format, line by line (``schema`` first):
``{"schema": "engram.export/1", "group_id": ..., "exported_at": ...}``,
``{"node": {"labels": [...], "properties": {...}}}``,
``{"edge": {"type": ..., "source": <uuid>, "target": <uuid>, "properties": {...}}}``.

Partial: FalkorDB only (the default backend); a Neo4j group is refused with that said. The
export reads one group at a time while the stack may be writing to it: a consistent copy of a
running stack needs ``engram backup`` (not built yet).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from datetime import datetime, timezone
from typing import Any

from engram.graph.drivers import GraphDrivers, query_rows
from engram.settings import EngramSettings

SCHEMA = "engram.export/1"
BATCH = 500
_LABEL = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

Q_NODES = "MATCH (n) WHERE n.uuid IS NOT NULL RETURN labels(n) AS labels, properties(n) AS props"
Q_EDGES = (
    "MATCH (a)-[r]->(b) WHERE a.uuid IS NOT NULL AND b.uuid IS NOT NULL "
    "RETURN type(r) AS type, a.uuid AS source, b.uuid AS target, labels(a) AS source_labels, "
    "labels(b) AS target_labels, properties(r) AS props"
)


class ExportError(ValueError):
    """A file or a backend engram cannot export or import (the message says which and why)."""


def _is_vector(key: str, value: Any) -> bool:
    return key.endswith("_embedding") and isinstance(value, list)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    return value


def _label(name: str) -> str:
    if not _LABEL.match(name):
        raise ExportError(f"a label or relationship type engram cannot write: {name!r}")
    return name


async def _falkor_driver(settings: EngramSettings, group_id: str, *, create: bool) -> tuple[GraphDrivers, Any]:
    if settings.graph_backend == "neo4j":
        raise ExportError("engram export/import reads and writes FalkorDB graphs only (ENGRAM_GRAPH_BACKEND=neo4j)")
    graphs = GraphDrivers(settings)
    if not create and not await graphs.exists(group_id):
        await graphs.close()
        raise ExportError(f"no graph for group {group_id!r}")
    return graphs, await graphs.driver(group_id)


async def export_lines(settings: EngramSettings, group_id: str) -> list[str]:
    """The group's graph as export lines (see the module docstring)."""
    graphs, driver = await _falkor_driver(settings, group_id, create=False)
    try:
        nodes = await query_rows(driver, Q_NODES)
        edges = await query_rows(driver, Q_EDGES)
    finally:
        await graphs.close()
    lines = [json.dumps({"schema": SCHEMA, "group_id": group_id,
                         "exported_at": datetime.now(timezone.utc).isoformat()})]
    for row in sorted(nodes, key=lambda r: (sorted(r["labels"]), str(r["props"].get("uuid")))):
        lines.append(json.dumps({"node": {"labels": sorted(row["labels"]), "properties": _jsonable(row["props"])}}))
    for row in sorted(edges, key=lambda r: (r["type"], str(r["props"].get("uuid")), r["source"], r["target"])):
        lines.append(json.dumps({"edge": {
            "type": row["type"], "source": row["source"], "target": row["target"],
            "source_label": sorted(row["source_labels"])[0] if row["source_labels"] else None,
            "target_label": sorted(row["target_labels"])[0] if row["target_labels"] else None,
            "properties": _jsonable(row["props"])}}))
    return lines


def read_export(lines: Iterable[str]) -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]]:
    """(header, nodes, edges) of an export; ExportError naming the line of anything else."""
    header: dict[str, Any] | None = None
    nodes: list[dict[str, Any]] = []
    edges: list[dict[str, Any]] = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ExportError(f"line {number}: not JSON ({exc.msg})") from exc
        if header is None:
            if not isinstance(item, dict) or item.get("schema") != SCHEMA:
                raise ExportError(f"line {number}: not an engram export (the first line names schema {SCHEMA!r})")
            header = item
        elif isinstance(item, dict) and isinstance(item.get("node"), dict):
            node = item["node"]
            if not isinstance(node.get("properties"), dict) or not node["properties"].get("uuid"):
                raise ExportError(f"line {number}: a node without a uuid")
            nodes.append(node)
        elif isinstance(item, dict) and isinstance(item.get("edge"), dict):
            edge = item["edge"]
            if not (edge.get("type") and edge.get("source") and edge.get("target")):
                raise ExportError(f"line {number}: an edge without a type, source or target")
            edges.append(edge)
        else:
            raise ExportError(f"line {number}: neither a node nor an edge")
    if header is None:
        raise ExportError("an empty file: no engram export header")
    return header, nodes, edges


def _chunks(items: list[Any], size: int = BATCH) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _split(props: dict[str, Any], group_id: str) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Plain properties (the group id set to the target group) and vectors, apart: FalkorDB
    stores a vector with ``vecf32()`` for its vector indices."""
    plain = {k: v for k, v in props.items() if not _is_vector(k, v)}
    if "group_id" in plain:
        plain["group_id"] = group_id
    return plain, {k: v for k, v in props.items() if _is_vector(k, v)}


async def import_lines(settings: EngramSettings, lines: Iterable[str], group_id: str | None = None) -> dict[str, Any]:
    """Write an export into ``group_id`` (default: the exported group); returns what was written."""
    header, nodes, edges = read_export(lines)
    target = group_id or header.get("group_id")
    if not target:
        raise ExportError("the export names no group: give --group")
    graphs, driver = await _falkor_driver(settings, target, create=True)
    try:
        by_labels: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        for node in nodes:
            labels = tuple(_label(name) for name in node.get("labels") or ["Entity"])
            by_labels.setdefault(labels, []).append(node["properties"])
        for labels, rows in by_labels.items():
            first = labels[0]
            extra = "".join(f" SET n:{name}" for name in labels[1:])
            for chunk in _chunks(rows):
                prepared = [dict(zip(("props", "vectors"), _split(p, target))) | {"uuid": p["uuid"]} for p in chunk]
                await driver.execute_query(
                    f"UNWIND $rows AS row MERGE (n:{first} {{uuid: row.uuid}}) SET n += row.props{extra}",
                    rows=[{"uuid": r["uuid"], "props": r["props"]} for r in prepared])
                for name in sorted({k for r in prepared for k in r["vectors"]}):
                    with_vector = [{"uuid": r["uuid"], "v": r["vectors"][name]} for r in prepared if name in r["vectors"]]
                    await driver.execute_query(
                        f"UNWIND $rows AS row MATCH (n:{first} {{uuid: row.uuid}}) SET n.{_label(name)} = vecf32(row.v)",
                        rows=with_vector)
        by_type: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
        for edge in edges:
            key = (_label(edge["type"]), _label(edge.get("source_label") or "Entity"),
                   _label(edge.get("target_label") or "Entity"))
            by_type.setdefault(key, []).append(edge)
        for (kind, source_label, target_label), rows in by_type.items():
            for chunk in _chunks(rows):
                prepared = []
                for edge in chunk:
                    plain, vectors = _split(edge.get("properties") or {}, target)
                    prepared.append({"source": edge["source"], "target": edge["target"], "uuid": plain.get("uuid"),
                                     "props": plain, "vectors": vectors})
                match = (f"UNWIND $rows AS row MATCH (a:{source_label} {{uuid: row.source}}) "
                         f"MATCH (b:{target_label} {{uuid: row.target}}) ")
                keyed = [{k: r[k] for k in ("source", "target", "uuid", "props")} for r in prepared if r["uuid"]]
                if keyed:
                    await driver.execute_query(match + f"MERGE (a)-[r:{kind} {{uuid: row.uuid}}]->(b) SET r += row.props",
                                               rows=keyed)
                unkeyed = [{k: r[k] for k in ("source", "target", "props")} for r in prepared if not r["uuid"]]
                if unkeyed:  # a relationship without a uuid: one of its type between the two nodes
                    await driver.execute_query(match + f"MERGE (a)-[r:{kind}]->(b) SET r += row.props", rows=unkeyed)
                prepared = [r for r in prepared if r["uuid"]]
                for name in sorted({k for r in prepared for k in r["vectors"]}):
                    with_vector = [{"source": r["source"], "target": r["target"], "uuid": r["uuid"],
                                    "v": r["vectors"][name]} for r in prepared if name in r["vectors"]]
                    await driver.execute_query(
                        f"UNWIND $rows AS row MATCH (a:{source_label} {{uuid: row.source}})-[r:{kind} {{uuid: row.uuid}}]->"
                        f"(b:{target_label} {{uuid: row.target}}) SET r.{_label(name)} = vecf32(row.v)",
                        rows=with_vector)
    finally:
        await graphs.close()
    return {"group_id": target, "nodes": len(nodes), "edges": len(edges)}
