"""Graphiti REST drop-in gaps (issue 10, item 8), over a real socket with real NATS, FalkorDB and
the pipeline in-process (turn-detector -> extractor, recall with graph admin):

* a REST session's episode exists within seconds, not after the turn-detector's 120 s idle flush;
* ``POST /search`` without ``group_ids`` searches every group, as upstream does;
* ``POST /entity-node`` and ``POST /clear`` do what upstream's do;
* one edge has one name on ``/entity-edge`` and ``/search``."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import nats
import pytest

from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import RecallItem
from engram.schemas.messages import GraphFact, GraphGroupsRequest, GraphGroupsResponse
from engram.schemas import subjects
from engram.services.gateway import mapping
from engram.services.gateway.models import Message
from engram.services.gateway.settings import GatewaySettings
from tests.services.gateway.test_gateway import episodes_of, graph_count, pipeline, serve_gateway, turn
from tests.services.recall.test_admin import rows
from tests.services.turn_detector.helpers import wait_for

pytestmark = pytest.mark.slow


def settings_for(nats_url: str, tmp_path: Path, graph_url: str) -> EngramSettings:
    """The turn-detector's own idle timeout stays at its default (120 s): only the gateway's
    per-message timeout can complete a REST turn quickly."""
    return EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp_path, partitions=2,
                          turn=TurnDetectorSettings())


async def groups_in_graph(nats_url: str) -> list[str]:
    nc = await nats.connect(nats_url)
    try:
        reply = await nc.request(subjects.GRAPH_GROUPS, GraphGroupsRequest().model_dump_json().encode(), timeout=30)
    finally:
        await nc.close()
    return GraphGroupsResponse.model_validate_json(reply.data).group_ids


# --- pure ------------------------------------------------------------------------------------
def test_gateway_default_idle_timeout_is_short() -> None:
    assert TurnDetectorSettings().idle_timeout_s == 120
    assert GatewaySettings().idle_timeout_s <= 15
    messages = mapping.chat_messages("g", [Message(role_type="user", content="hi")],
                                     datetime.now(timezone.utc), idle_timeout_s=GatewaySettings().idle_timeout_s)
    assert messages[0].idle_timeout_s == GatewaySettings().idle_timeout_s


def test_edge_result_uses_the_canonical_name_like_search() -> None:
    fact = GraphFact(uuid="e1", name="CREATED", fact="Ada created the migration script", group_id="g",
                     source_node_uuid="a", target_node_uuid="b")
    item = RecallItem(uuid="e1", fact=fact.fact, name="CREATED", group_id="g")
    assert mapping.edge_result(fact).name == mapping.fact_result(item).name == "GENERATED"
    unknown = fact.model_copy(update={"name": "WORKS_AT"})
    assert mapping.edge_result(unknown).name == "WORKS_AT"


def test_ranked_across_groups_interleaves_by_score_and_drops_repeats() -> None:
    def item(uid: str, group: str, rank: int) -> RecallItem:
        return RecallItem(uuid=uid, fact=uid, group_id=group, score=1 / (60 + rank))

    a = [item("a0", "A", 0), item("a1", "A", 1), item("a2", "A", 2)]
    b = [item("b0", "B", 0), item("a1", "B", 1)]
    assert [i.uuid for i in mapping.ranked_across_groups([a, b], 4)] == ["a0", "b0", "a1", "a2"]


# --- end to end ------------------------------------------------------------------------------
async def test_rest_turns_become_episodes_within_seconds(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """Default gateway settings; measured from the POST to the episode being readable."""
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    pair, ends_on_user = f"pair-{uuid.uuid4().hex[:6]}", f"user-{uuid.uuid4().hex[:6]}"
    async with pipeline(settings), serve_gateway(settings) as http:
        started = time.monotonic()
        assert (await http.post("/messages", json={"group_id": pair, "messages": turn()})).status_code == 202
        user_only = [turn("Where do we deploy the FastAPI service?")[0]]
        assert (await http.post("/messages", json={"group_id": ends_on_user, "messages": user_only})).status_code == 202
        got_pair = await episodes_of(http, pair, 1, timeout=25)
        took_pair = time.monotonic() - started
        got_user = await episodes_of(http, ends_on_user, 1, timeout=25)
        took_user = time.monotonic() - started
    assert len(got_pair) == 1 and len(got_user) == 1
    assert took_pair < 20 and took_user < 20, (took_pair, took_user)
    print(f"REST episode readable after {took_pair:.1f} s (pair) and {took_user:.1f} s (ends on user)")


async def test_search_without_group_ids_and_one_name_per_edge(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    g1, g2 = f"all-a-{uuid.uuid4().hex[:6]}", f"all-b-{uuid.uuid4().hex[:6]}"
    async with pipeline(settings), serve_gateway(settings, GatewaySettings(idle_timeout_s=1)) as http:
        await http.post("/messages", json={"group_id": g1, "messages": turn()})
        await http.post("/messages", json={"group_id": g2, "messages": turn(
            "We deploy the billing service with Docker on Fridays.", "Docker keeps the image reproducible.")})
        assert await episodes_of(http, g1, 1) and await episodes_of(http, g2, 1)

        for body in ({"query": "FastAPI Docker", "max_facts": 20}, {"group_ids": None, "query": "FastAPI Docker"},
                     {"group_ids": [], "query": "FastAPI Docker", "max_facts": 20}):
            r = await http.post("/search", json=body)
            assert r.status_code == 200, r.text
            facts = r.json()["facts"]
            assert any("FastAPI" in f["fact"] for f in facts) and any("Docker" in f["fact"] for f in facts), facts

        # one edge, one name: give a stored fact a synonym of a canonical relation
        one = (await http.post("/search", json={"group_ids": [g1], "query": "FastAPI", "max_facts": 1})).json()["facts"][0]
        from falkordb.asyncio import FalkorDB

        host, port = falkordb_server.url.split("://", 1)[1].rsplit(":", 1)
        db = FalkorDB(host=host, port=int(port))
        try:
            # every edge of that text (one sentence between several entities is one edge per pair)
            await db.select_graph(g1).query("MATCH ()-[r:RELATES_TO]->() WHERE r.fact = $f SET r.name = 'CREATED'",
                                            {"f": one["fact"]})
        finally:
            await db.aclose()
        edge = (await http.get(f"/entity-edge/{one['uuid']}")).json()
        # found by its text: the edge itself or its equal-text twin (recall keeps one of near-duplicates)
        searched = [f for f in (await http.post("/search", json={"group_ids": [g1], "query": one["fact"],
                                                                 "max_facts": 10})).json()["facts"]
                    if f["fact"] == one["fact"]]
        assert edge["name"] == searched[0]["name"] == "GENERATED"

    few = GatewaySettings(idle_timeout_s=1, search_all_max_groups=1)
    async with pipeline(settings), serve_gateway(settings, few) as http:
        r = await http.post("/search", json={"query": "FastAPI"})
        assert r.status_code == 400 and "group_ids" in r.json()["detail"] and "more than 1 " in r.json()["detail"]


async def test_entity_node_and_clear(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    settings = settings_for(clean_nats, tmp_path, falkordb_server.url)
    group, other = f"ent-{uuid.uuid4().hex[:6]}", f"ent-other-{uuid.uuid4().hex[:6]}"
    node_uuid = str(uuid.uuid4())
    async with pipeline(settings), serve_gateway(settings, GatewaySettings(idle_timeout_s=1)) as http:
        r = await http.post("/entity-node", json={"uuid": node_uuid, "group_id": group, "name": "Ada Lovelace",
                                                  "summary": "Maintains the billing API."})
        assert r.status_code == 201, r.text
        node = r.json()
        assert (node["uuid"], node["name"], node["group_id"], node["summary"]) == (
            node_uuid, "Ada Lovelace", group, "Maintains the billing API.")
        assert "name_embedding" not in node
        stored = await rows(falkordb_server.url, group, "MATCH (n:Entity {uuid: $u}) RETURN n.name, n.summary, "
                            "n.group_id, n.name_embedding IS NOT NULL", u=node_uuid)
        assert stored[0] == ["Ada Lovelace", "Maintains the billing API.", group, True]
        # the same uuid again updates the node
        r = await http.post("/entity-node", json={"uuid": node_uuid, "group_id": group, "name": "Ada Lovelace",
                                                  "summary": "Owns the billing API."})
        assert r.status_code == 201
        assert await graph_count(falkordb_server.url, group, "MATCH (n:Entity) RETURN count(n)") == 1
        # names the extractor refuses are refused here too, with a 422 in plain words
        r = await http.post("/entity-node", json={"uuid": str(uuid.uuid4()), "group_id": group, "name": "Is"})
        assert r.status_code == 422 and "stopwords" in r.json()["detail"]
        assert (await http.post("/entity-node", json={"uuid": "x", "group_id": "bad group", "name": "A"})).status_code == 422

        await http.post("/messages", json={"group_id": other, "messages": turn()})
        assert await episodes_of(http, other, 1)
        assert {group, other} <= set(await groups_in_graph(clean_nats))

        rewrites = aof_rewrites(falkordb_server.url)
        r = await http.post("/clear")
        assert r.status_code == 200 and r.json() == {"message": "Graph cleared", "success": True}
        assert await groups_in_graph(clean_nats) == []
        # the append-only file is rewritten once for the whole clear, not once per group
        assert aof_rewrites(falkordb_server.url) == rewrites + 1
        for g in (group, other):
            assert await graph_count(falkordb_server.url, g, "MATCH (n) RETURN count(n)") == 0
        assert (await http.get(f"/episodes/{other}")).json() == []
        r = await http.post("/search", json={"query": "FastAPI"})
        assert r.status_code == 200 and r.json() == {"facts": []}
        assert (await http.post("/clear")).status_code == 200  # clearing an empty graph is fine


def aof_rewrites(graph_url: str) -> int:
    import redis

    host, port = graph_url.split("://", 1)[1].rsplit(":", 1)
    client = redis.Redis(host=host, port=int(port))
    try:
        return int(client.info("persistence")["aof_rewrites"])
    finally:
        client.close()
