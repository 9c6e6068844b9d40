"""Graph admin handlers (services/recall/admin.py) against a real FalkorDB and a real NATS.

The graph is written by engram's own extraction stage (rules extractor, hashing embedder), so
the handlers see exactly what the extractor stores: Episodic nodes with entity_edges and
engram_message_ids, MENTIONS, RELATES_TO with their ``episodes`` lists."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import nats
import pytest
from falkordb.asyncio import FalkorDB
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.tracer import NoOpTracer

from engram.graph.drivers import GraphDrivers
from engram.models.hashing_embedder import HashingEmbedder
from engram.models.rules_llm import RulesExtractorClient
from engram.runtime.service import make_broker
from engram.settings import EngramSettings
from engram.schemas import Episode, EpisodeMessage, subjects
from engram.schemas.messages import (
    GraphDeleteResponse,
    GraphEdgeRequest,
    GraphEdgeResponse,
    GraphEpisodeDeleteRequest,
    GraphEpisodesRequest,
    GraphEpisodesResponse,
    GraphGroupDeleteRequest,
)
from engram.services.extractor.app import NoRerank
from engram.services.extractor.pipeline import extract_episode
from engram.services.recall.admin import GraphAdmin, answer, register_admin

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
TURN_1 = ("user (Ada): I moved the API from Flask to FastAPI and pinned pydantic==2.14 in pyproject.toml.\n"
          "assistant: Good call: FastAPI uses pydantic for validation.")
TURN_2 = ("user (Ada): We deploy FastAPI with Docker and run pytest in CI.\n"
          "assistant: Docker keeps the FastAPI image reproducible.")


def _falkor(url: str) -> FalkorDB:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return FalkorDB(host=host, port=int(port))


async def rows(url: str, group: str, query: str, **params) -> list[list]:  # noqa: ANN003
    db = _falkor(url)
    try:
        return (await db.select_graph(group).ro_query(query, params)).result_set
    finally:
        await db.aclose()


async def graph_names(url: str) -> list[str]:
    db = _falkor(url)
    try:
        return await db.list_graphs()
    finally:
        await db.aclose()


async def orphan_entities(url: str, group: str) -> int:
    return (await rows(url, group, "MATCH (n:Entity) WHERE NOT ()-[:MENTIONS]->(n) AND NOT (n)-[:RELATES_TO]-() "
                                   "RETURN count(n)"))[0][0]


async def write_turn(graph: GraphDrivers, group: str, content: str, i: int) -> Episode:
    """One completed turn written by the extractor's stage, as the extractor service would."""
    episode = Episode(
        episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{group}/{i}")), group_id=group, scope="session",
        turn_id=f"{group}:m{i}", session_id=group, reference_time=T0 + timedelta(hours=i), content=content,
        messages=[EpisodeMessage(message_id=f"{group}-u{i}", role="user", timestamp=T0 + timedelta(hours=i)),
                  EpisodeMessage(message_id=f"{group}-a{i}", role="assistant", timestamp=T0 + timedelta(hours=i))],
    )
    clients = GraphitiClients(driver=await graph.driver(group), llm_client=RulesExtractorClient(),
                              embedder=HashingEmbedder(), cross_encoder=NoRerank(), tracer=NoOpTracer())
    await extract_episode(clients, episode, custom_instructions="", previous_window=2)
    return episode


@pytest.fixture
async def setup(falkordb_server, tmp_path: Path) -> AsyncIterator[tuple[GraphAdmin, GraphDrivers, str, str]]:  # noqa: ANN001
    group = f"adm_{uuid.uuid4().hex[:10]}"
    settings = EngramSettings(graph_url=falkordb_server.url, data_dir=tmp_path)
    graph = GraphDrivers(settings)
    try:
        yield GraphAdmin(graph), graph, group, falkordb_server.url
    finally:
        await graph.close()


async def test_episodes_newest_first_with_provenance(setup) -> None:  # noqa: ANN001
    admin, graph, group, url = setup
    first = await write_turn(graph, group, TURN_1, 1)
    second = await write_turn(graph, group, TURN_2, 2)
    got = await admin.episodes(GraphEpisodesRequest(group_id=group, last_n=10))
    assert got.status == "ok"
    assert [e.uuid for e in got.episodes] == [second.episode_id, first.episode_id]
    newest = got.episodes[0]
    assert newest.content == TURN_2 and newest.group_id == group and newest.source == "message"
    assert newest.message_ids == [f"{group}-u2", f"{group}-a2"]
    assert newest.entity_edges, "the extractor lists the episode's facts on its node"
    assert newest.valid_at == T0 + timedelta(hours=2) and newest.created_at is not None
    only = await admin.episodes(GraphEpisodesRequest(group_id=group, last_n=1))
    assert [e.uuid for e in only.episodes] == [second.episode_id]


async def test_episodes_carry_their_extraction_cost_or_none(setup) -> None:  # noqa: ANN001
    """Issue 23 item 6: the cost the extractor recorded on the node; none for an episode stored
    without one (before costs were recorded); stage times that do not parse are left out, not an error."""
    admin, graph, group, url = setup
    first = await write_turn(graph, group, TURN_1, 1)
    second = await write_turn(graph, group, TURN_2, 2)
    (stored,) = await rows(url, group, "MATCH (e:Episodic {uuid: $u}) RETURN [e.engram_llm_calls, "
                           "e.engram_input_tokens, e.engram_output_tokens]", u=second.episode_id)
    got = {e.uuid: e for e in (await admin.episodes(GraphEpisodesRequest(group_id=group))).episodes}
    cost = got[second.episode_id].extraction
    assert cost is not None and [cost.llm_calls, cost.input_tokens, cost.output_tokens] == stored[0]
    assert cost.llm_calls > 0 and cost.input_tokens > 0 and cost.stage_ms["total"] > 0

    db = _falkor(url)
    try:
        g = db.select_graph(group)
        await g.query("MATCH (e:Episodic {uuid: $u}) REMOVE e.engram_llm_calls, e.engram_input_tokens, "
                      "e.engram_output_tokens, e.engram_stage_ms", {"u": first.episode_id})
        await g.query("MATCH (e:Episodic {uuid: $u}) SET e.engram_stage_ms = 'not json'", {"u": second.episode_id})
    finally:
        await db.aclose()
    got = {e.uuid: e for e in (await admin.episodes(GraphEpisodesRequest(group_id=group))).episodes}
    assert got[first.episode_id].extraction is None
    kept = got[second.episode_id].extraction
    assert kept is not None and kept.llm_calls == cost.llm_calls and kept.stage_ms == {}, kept


async def test_episodes_of_an_unknown_group_are_empty_and_create_no_graph(setup) -> None:  # noqa: ANN001
    admin, _, group, url = setup
    got = await admin.episodes(GraphEpisodesRequest(group_id=group))
    assert got.status == "ok" and got.episodes == []
    assert group not in await graph_names(url)


async def test_entities_by_uuid_in_order_or_newest_with_summaries(setup) -> None:  # noqa: ANN001
    from engram.schemas.messages import GraphEntitiesRequest

    admin, graph, group, url = setup
    assert (await admin.entities(GraphEntitiesRequest(group_id=group))).entities == []  # no graph yet
    assert group not in await graph_names(url)
    await write_turn(graph, group, TURN_1, 1)
    names = {r[0]: r[1] for r in await rows(url, group, "MATCH (n:Entity) RETURN n.uuid, n.name")}
    assert len(names) >= 2
    first, second = sorted(names)[:2]
    db = _falkor(url)
    try:
        await db.select_graph(group).query("MATCH (n:Entity {uuid: $u}) SET n.summary = 'a summary'", {"u": second})
    finally:
        await db.aclose()
    got = await admin.entities(GraphEntitiesRequest(group_id=group, uuids=[second, "no-such-uuid", first]))
    assert got.status == "ok"
    assert [(e.uuid, e.name) for e in got.entities] == [(second, names[second]), (first, names[first])]
    assert got.entities[0].summary == "a summary" and got.entities[0].group_id == group
    newest = await admin.entities(GraphEntitiesRequest(group_id=group, limit=1))
    assert len(newest.entities) == 1 and newest.entities[0].uuid in names


async def test_edge_get_searches_every_group_and_unknown_is_not_found(setup) -> None:  # noqa: ANN001
    admin, graph, group, url = setup
    other = group + "_other"
    await write_turn(graph, other, TURN_2, 1)
    await write_turn(graph, group, TURN_1, 1)
    uuid_, fact = (await rows(url, group, "MATCH ()-[r:RELATES_TO]->() RETURN r.uuid, r.fact LIMIT 1"))[0]
    got = await admin.get_edge(GraphEdgeRequest(uuid=uuid_))
    assert got.status == "ok" and got.edge is not None
    assert got.edge.uuid == uuid_ and got.edge.fact == fact and got.edge.group_id == group
    assert got.edge.episodes and got.edge.source_node_uuid and got.edge.target_node_uuid
    assert got.edge.created_at is not None
    missing = await admin.get_edge(GraphEdgeRequest(uuid="not_a_real_uuid"))
    assert missing.status == "not_found" and missing.edge is None


async def test_edge_get_in_a_named_group_reads_that_group_only(setup) -> None:  # noqa: ANN001
    """With ``group_id`` the lookup is one read of that group's graph (the explorer's /facts asks
    up to 500 edges: a scan of every graph per edge grew with the number of groups), and an edge
    of another group is not_found there: no way to reach it through the wrong group."""
    admin, graph, group, url = setup
    other = group + "_other"
    await write_turn(graph, other, TURN_2, 1)
    await write_turn(graph, group, TURN_1, 1)
    mine = (await rows(url, group, "MATCH ()-[r:RELATES_TO]->() RETURN r.uuid LIMIT 1"))[0][0]
    theirs = (await rows(url, other, "MATCH ()-[r:RELATES_TO]->() RETURN r.uuid LIMIT 1"))[0][0]
    reads: list[str | None] = []
    connect = admin._backend

    @contextlib.asynccontextmanager
    async def counted():  # noqa: ANN202 - every graph the handler reads
        async with connect() as db:
            read = db.read

            async def read_counted(graph_name, query, /, **params):  # noqa: ANN001, ANN003, ANN202
                reads.append(graph_name)
                return await read(graph_name, query, **params)

            db.read = read_counted
            yield db

    admin._backend = counted
    got = await admin.get_edge(GraphEdgeRequest(uuid=mine, group_id=group))
    assert got.status == "ok" and got.edge is not None and got.edge.group_id == group
    assert reads == [group]
    assert (await admin.get_edge(GraphEdgeRequest(uuid=theirs, group_id=group))).status == "not_found"
    assert (await admin.get_edge(GraphEdgeRequest(uuid=mine, group_id="no_such_group"))).status == "not_found"
    assert (await admin.delete_edge(GraphEdgeRequest(uuid=theirs, group_id=group))).status == "not_found"
    assert (await admin.get_edge(GraphEdgeRequest(uuid=theirs))).status == "ok"  # still there
    reads.clear()
    await admin.get_edge(GraphEdgeRequest(uuid=mine))
    assert len(reads) >= 2, reads  # without a group: every graph (the cost the group spares)


async def test_edge_delete_removes_the_fact_and_its_references(setup) -> None:  # noqa: ANN001
    admin, graph, group, url = setup
    episode = await write_turn(graph, group, TURN_1, 1)
    uuid_ = (await rows(url, group, "MATCH ()-[r:RELATES_TO]->() RETURN r.uuid LIMIT 1"))[0][0]
    done = await admin.delete_edge(GraphEdgeRequest(uuid=uuid_))
    assert done.status == "ok" and done.deleted_facts == 1 and done.group_id == group
    assert (await admin.get_edge(GraphEdgeRequest(uuid=uuid_))).status == "not_found"
    listed = (await rows(url, group, "MATCH (e:Episodic {uuid: $u}) RETURN e.entity_edges", u=episode.episode_id))[0][0]
    assert uuid_ not in listed
    assert await orphan_entities(url, group) == 0
    assert (await admin.delete_edge(GraphEdgeRequest(uuid=uuid_))).status == "not_found"


async def test_episode_delete_keeps_shared_facts_and_leaves_no_orphans(setup) -> None:  # noqa: ANN001
    admin, graph, group, url = setup
    first = await write_turn(graph, group, TURN_1, 1)
    second = await write_turn(graph, group, TURN_2, 2)
    # A fact both episodes support (as graphiti records a re-stated fact): it must survive.
    shared = (await rows(url, group, "MATCH ()-[r:RELATES_TO]->() WHERE $u IN r.episodes RETURN r.uuid LIMIT 1",
                         u=second.episode_id))[0][0]
    await rows_write(url, group, "MATCH ()-[r:RELATES_TO {uuid: $u}]->() SET r.episodes = r.episodes + [$e]",
                     u=shared, e=first.episode_id)
    only_first = {r[0] for r in await rows(url, group, "MATCH ()-[r:RELATES_TO]->() WHERE r.episodes = [$e] "
                                                         "RETURN r.uuid", e=first.episode_id)}
    assert only_first, "the first turn should have facts of its own"
    entities_before = (await rows(url, group, "MATCH (n:Entity) RETURN count(n)"))[0][0]

    done = await admin.delete_episode(GraphEpisodeDeleteRequest(uuid=first.episode_id))
    assert done.status == "ok" and done.group_id == group
    assert done.deleted_episodes == 1 and done.deleted_facts == len(only_first) and done.updated_facts >= 1
    assert done.deleted_entities >= 1, "entities only the first turn mentioned are gone"

    left = await admin.episodes(GraphEpisodesRequest(group_id=group))
    assert [e.uuid for e in left.episodes] == [second.episode_id]
    facts = {r[0]: r[1] for r in await rows(url, group, "MATCH ()-[r:RELATES_TO]->() RETURN r.uuid, r.episodes")}
    assert not only_first & set(facts), "facts only the deleted turn supported must be gone"
    assert facts[shared] == [second.episode_id], "a shared fact keeps its other episode and loses this one"
    assert all(first.episode_id not in eps for eps in facts.values())
    assert await orphan_entities(url, group) == 0
    entities_after = (await rows(url, group, "MATCH (n:Entity) RETURN count(n)"))[0][0]
    assert entities_after == entities_before - done.deleted_entities
    assert (await admin.delete_episode(GraphEpisodeDeleteRequest(uuid=first.episode_id))).status == "not_found"


async def rows_write(url: str, group: str, query: str, **params) -> None:  # noqa: ANN003
    db = _falkor(url)
    try:
        await db.select_graph(group).query(query, params)
    finally:
        await db.aclose()


async def test_group_delete_leaves_an_empty_indexed_graph(setup) -> None:  # noqa: ANN001
    admin, graph, group, url = setup
    await write_turn(graph, group, TURN_1, 1)
    await write_turn(graph, group, TURN_2, 2)
    done = await admin.delete_group(GraphGroupDeleteRequest(group_id=group))
    assert done.status == "ok" and done.deleted_episodes == 2
    assert (await admin.episodes(GraphEpisodesRequest(group_id=group))).episodes == []
    assert (await rows(url, group, "MATCH (n) RETURN count(n)"))[0][0] == 0
    # graphiti's fulltext indices are back, so a process that cached the group's driver (and
    # will not build them again) still gets fulltext hits after writing to the group anew
    indexed = {(r[0], r[1]) for r in await rows(url, group, "CALL db.indexes() YIELD label, entitytype "
                                                           "RETURN label, entitytype")}
    assert ("Entity", "NODE") in indexed and ("RELATES_TO", "RELATIONSHIP") in indexed
    # writing to the group again works, extraction included
    again = await write_turn(graph, group, TURN_1, 3)
    assert [e.uuid for e in (await admin.episodes(GraphEpisodesRequest(group_id=group))).episodes] == [again.episode_id]
    unknown = group + "_never"
    gone = await admin.delete_group(GraphGroupDeleteRequest(group_id=unknown))
    assert gone.status == "ok" and gone.deleted_episodes == 0
    assert unknown not in await graph_names(url)


async def test_over_nats_errors_are_answers_and_the_subscriber_survives(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    group = f"adm_{uuid.uuid4().hex[:10]}"
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path)
    broken = EngramSettings(nats_url=clean_nats, graph_url="falkor://127.0.0.1:1", data_dir=tmp_path)
    graph, dead_graph = GraphDrivers(settings), GraphDrivers(broken)
    broker = make_broker(settings, service="admin-test")
    register_admin(broker, graph)
    await broker.start()
    nc = await nats.connect(clean_nats)

    async def ask(subject: str, body: bytes, model):  # noqa: ANN001, ANN202
        return model.model_validate_json((await nc.request(subject, body, timeout=10)).data)

    try:
        await write_turn(graph, group, TURN_1, 1)
        bad = await ask(subjects.GRAPH_EPISODES, b"{not json", GraphEpisodesResponse)
        assert bad.status == "error" and bad.reason.startswith("bad_request")
        bad = await ask(subjects.GRAPH_GROUP_DELETE, b'{"group_id": "a.b"}', GraphDeleteResponse)
        assert bad.status == "error" and "group_id" in bad.reason
        ok = await ask(subjects.GRAPH_EPISODES, GraphEpisodesRequest(group_id=group).model_dump_json().encode(),
                       GraphEpisodesResponse)
        assert ok.status == "ok" and len(ok.episodes) == 1
        missing = await ask(subjects.GRAPH_EDGE_GET, GraphEdgeRequest(uuid="nope").model_dump_json().encode(),
                            GraphEdgeResponse)
        assert missing.status == "not_found"
        for subject, body in [
            (subjects.GRAPH_EPISODE_DELETE, GraphEpisodeDeleteRequest(uuid="nope")),
            (subjects.GRAPH_EDGE_DELETE, GraphEdgeRequest(uuid="nope")),
        ]:
            assert (await ask(subject, body.model_dump_json().encode(), GraphDeleteResponse)).status == "not_found"
        # the subscriber survived the bad requests above
        again = await ask(subjects.GRAPH_EPISODES, GraphEpisodesRequest(group_id=group).model_dump_json().encode(),
                          GraphEpisodesResponse)
        assert again == ok
        # a database that is down: a structured error naming the exception type only
        down = await answer("episodes", GraphEpisodesRequest(group_id=group).model_dump_json().encode(),
                            GraphEpisodesRequest, GraphAdmin(dead_graph).episodes, GraphEpisodesResponse)
        assert down.status == "error" and down.reason.startswith("backend_error: ") and group not in down.reason
    finally:
        await nc.close()
        await broker.stop()
        await graph.close()
        await dead_graph.close()
