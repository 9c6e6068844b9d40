"""Take your memory with you (issue 26, item 5; engram/graph/export.py): a group's graph exported to
JSONL and imported into another group gives the same recall answers and the same counts, and an
import run twice changes nothing. Real NATS and FalkorDB, the pipeline in-process (rules model)."""

from __future__ import annotations

import json

import pytest

from engram.graph.export import ExportError, export_lines, import_lines, read_export
from engram.graph.drivers import GraphDrivers, query_rows
from engram.schemas import RecallRequest, RecallScopes, subjects
from tests.services.recall.test_fact_changes import MONDAY, THURSDAY, USER, _say
from tests.services.recall.test_service import ask, stack

COUNTS = {
    "episodes": "MATCH (e:Episodic) RETURN count(e) AS n",
    "entities": "MATCH (n:Entity) RETURN count(n) AS n",
    "facts": "MATCH ()-[r:RELATES_TO]->() RETURN count(r) AS n",
    "ended facts": "MATCH ()-[r:RELATES_TO]->() WHERE r.expired_at IS NOT NULL RETURN count(r) AS n",
    "mentions": "MATCH ()-[r:MENTIONS]->() RETURN count(r) AS n",
}


async def counts(settings, group: str) -> dict[str, int]:  # noqa: ANN001
    graph = GraphDrivers(settings)
    try:
        driver = await graph.driver(group)
        return {name: (await query_rows(driver, q))[0]["n"] for name, q in COUNTS.items()}
    finally:
        await graph.close()


def answer(response) -> list[tuple[str, str, str | None]]:  # noqa: ANN001
    return [(i.kind, i.fact, i.invalid_at.isoformat() if i.invalid_at else None) for i in response.items]


async def test_export_then_import_elsewhere_gives_the_same_memory(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        await _say(nc, "monday", MONDAY, "The billing service uses Postgres 15.", "Noted.")
        await _say(nc, "thursday", THURSDAY, "We switched the billing service to SQLite.", "Noted.")
        source = subjects.user_group(settings.group_prefix, USER.user)
        copy = f"{settings.group_prefix}_imported"

        lines = await export_lines(settings, source)
        header, nodes, edges = read_export(lines)
        assert header["group_id"] == source and nodes and edges
        assert all("uuid" in n["properties"] for n in nodes)
        assert any("name_embedding" in n["properties"] for n in nodes), "vectors travel with the memory"

        first = await import_lines(settings, lines, copy)
        assert first == {"group_id": copy, "nodes": len(nodes), "edges": len(edges)}
        assert await counts(settings, copy) == await counts(settings, source)
        await import_lines(settings, lines, copy)  # again: nothing changes
        assert await counts(settings, copy) == await counts(settings, source)

        question = "are we still on Postgres for billing?"
        original = await ask(nc, RecallRequest(query=question, group_ids=[source], timeout_ms=10_000))
        imported = await ask(nc, RecallRequest(query=question, group_ids=[copy], timeout_ms=10_000))
        assert not original.degraded and not imported.degraded, (original.reason, imported.reason)
        assert answer(imported) == answer(original) and answer(original), (answer(original), answer(imported))
        assert "superseded" in imported.prompt_section  # what invalidated the Postgres fact came along


def test_a_file_that_is_no_export_is_refused_with_its_line() -> None:
    header = json.dumps({"schema": "engram.export/1", "group_id": "g"})
    with pytest.raises(ExportError, match="line 1: not an engram export"):
        read_export(['{"hello": 1}'])
    with pytest.raises(ExportError, match="line 2: not JSON"):
        read_export([header, "{nope"])
    with pytest.raises(ExportError, match="line 2: a node without a uuid"):
        read_export([header, json.dumps({"node": {"labels": ["Entity"], "properties": {}}})])
    with pytest.raises(ExportError, match="empty file"):
        read_export([])
