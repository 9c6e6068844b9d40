"""The entity-fact ranking is bounded per request (services/recall/entities.py): a hub entity's
facts are scanned up to a cap, and its facts among the group's nearest (the vector index) are
added, so the nearest one is found however many facts the hub has. Real FalkorDB."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from engram.graph.drivers import GraphDrivers
from engram.settings import EngramSettings
from engram.services.recall import entities
from engram.services.recall.entities import entity_fact_ranking

DIM = 3


async def test_a_hubs_nearest_fact_is_found_beyond_the_scan_cap(falkordb_server, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    drivers = GraphDrivers(EngramSettings(graph_url=falkordb_server.url), embedding_dim=DIM)
    group = f"ent_{uuid.uuid4().hex[:8]}"
    driver = await drivers.driver(group)
    graph = driver._get_graph(None)  # noqa: SLF001
    try:
        await graph.query("CREATE (:Entity {uuid: 'hub', name: 'Ada', group_id: $g}), "
                          "(:Entity {uuid: 'other', name: 'Bob', group_id: $g})", {"g": group})
        # the fact of Ada nearest to the question, then 40 far from it (FalkorDB walks an entity's
        # edges newest first: the capped scan meets the far ones)
        rows = [{"u": "near", "v": [1.0, 0.0, 0.0]}] + [{"u": f"far{i}", "v": [0.0, 1.0, 0.01 * i]} for i in range(40)]
        await graph.query("UNWIND $rows AS r MATCH (a:Entity {uuid: 'hub'}), (b:Entity {uuid: 'other'}) "
                          "CREATE (a)-[:RELATES_TO {uuid: r.u, group_id: $g, fact: r.u, "
                          "fact_embedding: vecf32(r.v)}]->(b)", {"rows": rows, "g": group})
        for _ in range(200):
            statuses = (await graph.query("CALL db.indexes() YIELD status RETURN status")).result_set
            if all("OPERATIONAL" in str(s[0]) for s in statuses):
                break
            await asyncio.sleep(0.05)
        question, vector = "What did Ada say?", [1.0, 0.0, 0.0]
        # uncapped (the scan holds every fact): exact
        assert (await entity_fact_ranking(driver, group, question, vector, 5))[0][0] == "near"
        monkeypatch.setattr(entities, "ENTITY_FACTS_SCANNED", 10)
        scanned_only = await _ranking_without_nearest(driver, group, question, vector, monkeypatch)
        assert "near" not in [u for u, _ in scanned_only] and len(scanned_only) == 5  # capped: the scan misses it
        monkeypatch.setattr(entities, "ENTITY_FACTS_NEAREST", 256)
        ranked = await entity_fact_ranking(driver, group, question, vector, 5)
        assert ranked[0][0] == "near" and ranked[0][1] == pytest.approx(1.0, abs=1e-4)
        assert len(ranked) == 5 and len({u for u, _ in ranked}) == 5
    finally:
        await graph.delete()
        await drivers.close()


async def _ranking_without_nearest(driver, group, question, vector, monkeypatch):  # noqa: ANN001, ANN202
    monkeypatch.setattr(entities, "ENTITY_FACTS_NEAREST", 0)
    return await entity_fact_ranking(driver, group, question, vector, 5)
