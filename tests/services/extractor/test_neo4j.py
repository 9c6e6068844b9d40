"""extractor on Neo4j (ENGRAM_GRAPH_BACKEND=neo4j).

Neo4j Community has one database: every group shares it and one driver, and graphiti's
``group_id`` property keeps groups apart. Unit tests (no server): settings validation at start,
one shared driver for all groups built without any connection, index building once per driver,
and the pipeline's driver check. The integration test runs the real extractor service (real
NATS JetStream from the session fixture) against a real Neo4j 5: a testcontainers ``neo4j:5``
container, or the server named by ENGRAM_TEST_NEO4J_URI (+ ENGRAM_TEST_NEO4J_USER/PASSWORD/
DATABASE). With neither a reachable Docker engine nor that variable it is skipped at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import nats
import pytest
from graphiti_core.driver.driver import GraphProvider
from graphiti_core.driver.neo4j_driver import Neo4jDriver
from neo4j import AsyncGraphDatabase

from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import Episode, NodeDelta, subjects
from engram.services.extractor import app as ex_app
from engram.services.extractor.pipeline import check_driver_for_group
from tests.services.turn_detector.helpers import read_all, wait_for

# --- unit tests: no Neo4j, no Docker, no NATS ---------------------------------------------------


def neo4j_settings(tmp_path: Path, **kw: Any) -> EngramSettings:
    # nats_url is never dialled here: the extractor's start() validates the graph settings first.
    return EngramSettings(nats_url="nats://127.0.0.1:1", data_dir=tmp_path, graph_backend="neo4j", **kw)


@pytest.mark.parametrize(
    ("uri", "match"),
    [(None, "needs ENGRAM_NEO4J_URI"), ("", "needs ENGRAM_NEO4J_URI"), ("http://db:7474", "must use one of")],
)
async def test_neo4j_settings_are_checked_at_start(tmp_path: Path, uri: str | None, match: str) -> None:
    service = ex_app.build(neo4j_settings(tmp_path, neo4j_uri=uri), llm=RulesExtractorClient())
    with pytest.raises(RuntimeError, match=match):
        await service.extractor.start()  # type: ignore[attr-defined]
    assert service.extractor.js is None  # type: ignore[attr-defined]  # failed before connecting to NATS


@pytest.fixture
def silent_port() -> Iterator[socket.socket]:
    """A listening socket that records whether anything connected to it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    srv.setblocking(False)
    yield srv
    srv.close()


def connected(srv: socket.socket) -> bool:
    try:
        conn, _ = srv.accept()
    except BlockingIOError:
        return False
    conn.close()
    return True


async def test_neo4j_groups_share_one_driver_and_nothing_connects_before_first_use(
    tmp_path: Path, silent_port: socket.socket
) -> None:
    port = silent_port.getsockname()[1]
    settings = neo4j_settings(tmp_path, neo4j_uri=f"bolt://127.0.0.1:{port}", neo4j_database="engramdb",
                              neo4j_user="u", neo4j_password="p")
    extractor = ex_app.build(settings, llm=RulesExtractorClient()).extractor  # type: ignore[attr-defined]
    a = SimpleNamespace(driver=extractor.graph.driver_for("engram_session_a"))
    b = SimpleNamespace(driver=extractor.graph.driver_for("engram_session_b"))
    assert isinstance(a.driver, Neo4jDriver)
    assert a.driver is b.driver is extractor.graph.neo4j
    assert a.driver._database == "engramdb"
    assert extractor.graph.falkor == {}  # no per-group drivers on Neo4j
    check_driver_for_group(a, "engram_session_a")
    check_driver_for_group(b, "engram_session_b")
    await asyncio.sleep(0.3)  # a scheduled index build would have dialled by now
    assert not connected(silent_port), "constructing the shared Neo4j driver must not connect"

    closed: list[bool] = []
    real_close = a.driver.close

    async def spy_close() -> None:
        closed.append(True)
        await real_close()

    a.driver.close = spy_close  # type: ignore[method-assign]
    await extractor.stop()
    assert closed == [True] and extractor.graph.neo4j is None
    assert not connected(silent_port)


async def test_indices_are_built_once_per_driver_and_a_failed_build_is_retried(tmp_path: Path) -> None:
    settings = neo4j_settings(tmp_path, neo4j_uri="bolt://127.0.0.1:1")
    extractor = ex_app.build(settings, llm=RulesExtractorClient()).extractor  # type: ignore[attr-defined]
    driver = extractor.graph.driver_for("engram_session_a")
    builds: list[str] = []

    async def flaky_build(delete_existing: bool = False) -> None:
        builds.append("build")
        if len(builds) == 1:
            raise ConnectionError("neo4j not up yet")
        await asyncio.sleep(0.05)

    driver.build_indices_and_constraints = flaky_build  # type: ignore[method-assign]
    with pytest.raises(ConnectionError):
        await extractor.graph.driver("engram_session_a")
    # Concurrent first episodes of two groups: one build for the shared driver.
    await asyncio.gather(extractor.graph.driver("engram_session_a"), extractor.graph.driver("engram_session_b"))
    await extractor.graph.driver("engram_session_a")
    assert builds == ["build", "build"]
    await extractor.stop()


def test_driver_check_per_backend() -> None:
    # Constructed outside an event loop: graphiti schedules no index build, nothing connects.
    neo = Neo4jDriver("bolt://127.0.0.1:1", "neo4j", "", database="neo4j")
    check_driver_for_group(SimpleNamespace(driver=neo), "engram_session_a")  # type: ignore[arg-type]
    check_driver_for_group(SimpleNamespace(driver=neo), "engram_session_b")  # type: ignore[arg-type]
    # A FalkorDriver as the check sees it (the real constructor connects to the server).
    falkor = SimpleNamespace(provider=GraphProvider.FALKORDB, _database="engram_session_a")
    check_driver_for_group(SimpleNamespace(driver=falkor), "engram_session_a")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="targets graph 'engram_session_a'"):
        check_driver_for_group(SimpleNamespace(driver=falkor), "engram_session_b")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unsupported graph backend"):
        check_driver_for_group(SimpleNamespace(driver=SimpleNamespace(provider=GraphProvider.KUZU)), "g")  # type: ignore[arg-type]


# --- integration: real extractor service, real NATS, real Neo4j 5 -------------------------------


@dataclass(frozen=True)
class Neo4jTarget:
    uri: str
    user: str
    password: str
    database: str
    fresh: bool  # an empty database started for this module (the container), not a shared server


def docker_unreachable() -> str | None:
    """Why no Docker engine can be used (None when one answers a ping within 2 s)."""
    try:
        from testcontainers.core.docker_client import DockerClient

        client = DockerClient(timeout=2)  # same host resolution as testcontainers itself
        client.client.ping()
        client.client.close()
    except Exception as exc:  # noqa: BLE001 - any failure means: no usable engine here
        return f"no Docker engine reachable ({type(exc).__name__}: {str(exc)[:200]})"
    return None


@pytest.fixture(scope="module")
def neo4j_target() -> Iterator[Neo4jTarget]:
    uri = os.environ.get("ENGRAM_TEST_NEO4J_URI")
    if uri:
        yield Neo4jTarget(
            uri=uri,
            user=os.environ.get("ENGRAM_TEST_NEO4J_USER", "neo4j"),
            password=os.environ.get("ENGRAM_TEST_NEO4J_PASSWORD", ""),
            database=os.environ.get("ENGRAM_TEST_NEO4J_DATABASE", "neo4j"),
            fresh=False,
        )
        return
    reason = docker_unreachable()
    if reason:
        pytest.skip(f"{reason}; set ENGRAM_TEST_NEO4J_URI to test against a running Neo4j 5")
    from testcontainers.community.neo4j import Neo4jContainer

    container = Neo4jContainer("neo4j:5", password="engram-test-pw")
    try:
        container.start()
    except Exception as exc:  # noqa: BLE001 - e.g. the image cannot be pulled offline
        with contextlib.suppress(Exception):
            container.stop()
        pytest.skip(f"could not start neo4j:5 with testcontainers ({type(exc).__name__}: {str(exc)[:200]})")
    try:
        yield Neo4jTarget(container.get_connection_url(), container.username, container.password, "neo4j", fresh=True)
    finally:
        container.stop()


class Graph:
    """Read-only Cypher on the target database (the neo4j driver, not graphiti)."""

    def __init__(self, target: Neo4jTarget) -> None:
        self.target = target
        self.driver = AsyncGraphDatabase.driver(target.uri, auth=(target.user, target.password))

    async def rows(self, cypher: str, **params: Any) -> list[dict[str, Any]]:
        records, _, _ = await self.driver.execute_query(cypher, parameters_=params, database_=self.target.database)
        return [r.data() for r in records]

    async def counts(self, groups: list[str]) -> dict[str, int]:
        nodes = await self.rows("MATCH (n) WHERE n.group_id IN $g RETURN count(n) AS c", g=groups)
        rels = await self.rows("MATCH ()-[r]->() WHERE r.group_id IN $g RETURN count(r) AS c", g=groups)
        out = {"nodes": nodes[0]["c"], "relationships": rels[0]["c"]}
        if self.target.fresh:
            out["all_nodes"] = (await self.rows("MATCH (n) RETURN count(n) AS c"))[0]["c"]
            out["all_relationships"] = (await self.rows("MATCH ()-[r]->() RETURN count(r) AS c"))[0]["c"]
        return out

    async def close(self) -> None:
        await self.driver.close()


@pytest.fixture
async def graph(neo4j_target: Neo4jTarget) -> AsyncIterator[Graph]:
    g = Graph(neo4j_target)
    yield g
    await g.close()


async def published_deltas(js) -> list[tuple[str, NodeDelta]]:  # noqa: ANN001
    return [(m.subject, NodeDelta.model_validate_json(m.data)) for m in await read_all(js, subjects.STREAM_DELTAS)]


async def settled(js, episodes: int) -> bool:  # noqa: ANN001
    """``episodes`` episodes in the stream and every extractor consumer done with them."""
    stream = await js.stream_info(subjects.STREAM_EPISODES)
    if stream.state.messages < episodes:
        return False
    infos = await js.consumers_info(subjects.STREAM_EPISODES)
    mine = [c for c in infos if c.name.startswith("extractor")]
    return bool(mine) and all(c.num_pending == 0 and c.num_ack_pending == 0 for c in mine)


def episode_for(group: str, session: str, content: str) -> Episode:
    return Episode(
        episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"engram-test/{group}/{session}:m0")), group_id=group,
        scope="session", turn_id=f"{session}:m0", session_id=session, reference_time="2026-01-01T12:00:00Z",
        content=content, messages=[],
    )


# FastAPI appears in both groups: each group must get its own FastAPI node (no cross-group dedupe).
CONTENT = {
    "a": "user (Ada): I moved the API from Flask to FastAPI and pinned pydantic==2.14 in pyproject.toml.\n\n"
         "assistant: Good call: FastAPI uses pydantic for validation.",
    "b": "user (Bob): We deployed FastAPI to Kubernetes with Terraform.\n\n"
         "assistant: Nice, Terraform keeps the Kubernetes setup reproducible.",
}


@pytest.mark.timeout(900)  # includes pulling and starting the neo4j:5 container
async def test_extractor_on_neo4j_keeps_groups_apart_and_is_idempotent(
    clean_nats: str, neo4j_target: Neo4jTarget, graph: Graph, tmp_path: Path
) -> None:
    settings = EngramSettings(
        nats_url=clean_nats, data_dir=tmp_path, partitions=2, turn=TurnDetectorSettings(max_deliveries=2),
        graph_backend="neo4j", neo4j_uri=neo4j_target.uri, neo4j_user=neo4j_target.user,
        neo4j_password=neo4j_target.password, neo4j_database=neo4j_target.database,
    )
    await two_groups_then_redelivery(settings, graph, fresh=neo4j_target.fresh)


async def two_groups_then_redelivery(settings: EngramSettings, graph: Any, *, fresh: bool) -> None:
    """Two groups' episodes through the real service, checked in the graph and on NATS, then one
    episode redelivered. ``graph`` answers read-only Cypher (``rows``) and ``counts``."""
    run = uuid.uuid4().hex[:8]  # fresh group ids: the test also runs against a shared server
    groups = {k: f"engram_session_n4j{run}{k}" for k in CONTENT}
    episodes = {k: episode_for(groups[k], f"n4j{run}{k}", CONTENT[k]) for k in CONTENT}
    group_list = sorted(groups.values())
    llm = RulesExtractorClient()
    service = ex_app.build(settings, llm=llm)
    await service.start()
    nc = await nats.connect(settings.resolved_nats_url())
    js = nc.jetstream()
    try:
        for ep in episodes.values():
            await js.publish(subjects.episode(ep.group_id), ep.model_dump_json().encode(),
                             headers={subjects.HDR_MSG_ID: ep.episode_id})
        assert await wait_for(lambda: settled(js, 2), 120), "the extractor did not finish both episodes"
        extractor = service.extractor  # type: ignore[attr-defined]
        if settings.graph_backend == "neo4j":
            assert extractor.graph.falkor == {} and isinstance(extractor.graph.neo4j, Neo4jDriver)

        # Episodes: one Episodic node each, in its own group.
        stored = await graph.rows("MATCH (e:Episodic) WHERE e.uuid IN $ids RETURN e.uuid AS uuid, e.group_id AS g",
                                  ids=[ep.episode_id for ep in episodes.values()])
        assert {(r["uuid"], r["g"]) for r in stored} == {(ep.episode_id, ep.group_id) for ep in episodes.values()}

        # Entities: written with their episode's group; FastAPI once per group, as two nodes.
        entities = await graph.rows("MATCH (n:Entity) WHERE n.group_id IN $g RETURN n.group_id AS g, n.name AS name, "
                                    "n.uuid AS uuid", g=group_list)
        names = {k: {r["name"] for r in entities if r["g"] == groups[k]} for k in groups}
        assert {"FastAPI", "pyproject.toml"} <= names["a"], names
        assert {"FastAPI", "Terraform", "Kubernetes"} <= names["b"], names
        fastapi = [r for r in entities if r["name"] == "FastAPI"]
        assert len(fastapi) == 2 and len({r["uuid"] for r in fastapi}) == 2, fastapi

        # Facts and MENTIONS: group_id on the relationship equals both endpoints' group_id.
        facts = await graph.rows(
            "MATCH (a:Entity)-[r:RELATES_TO]->(b:Entity) WHERE a.group_id IN $g OR b.group_id IN $g OR r.group_id IN $g "
            "RETURN r.group_id AS g, a.group_id AS ga, b.group_id AS gb, r.fact AS fact", g=group_list)
        assert facts and all(f["g"] == f["ga"] == f["gb"] for f in facts), facts
        assert {f["g"] for f in facts} == set(group_list), "every group should have facts"
        mentions = await graph.rows(
            "MATCH (e:Episodic)-[m:MENTIONS]->(n:Entity) WHERE e.uuid IN $ids OR n.group_id IN $g "
            "RETURN e.group_id AS ge, m.group_id AS gm, n.group_id AS gn",
            ids=[ep.episode_id for ep in episodes.values()], g=group_list)
        assert mentions and all(m["ge"] == m["gm"] == m["gn"] for m in mentions), mentions
        if fresh:  # nothing in the database outside the two groups
            assert (await graph.rows("MATCH (n) WHERE NOT n.group_id IN $g OR n.group_id IS NULL "
                                     "RETURN count(n) AS c", g=group_list))[0]["c"] == 0

        # NodeDeltas: on each group's own subject, one per entity of that group. Stored subjects
        # carry the stream's partition: engram.delta.<p>.<group>.
        out = await published_deltas(js)
        assert out, "no NodeDelta published"
        assert all(s.startswith("engram.delta.") and s.rsplit(".", 1)[1] == d.group_id for s, d in out), out
        for k, group in groups.items():
            mine = [d for _, d in out if d.group_id == group]
            assert {d.node_name for d in mine} == names[k]
            assert {d.node_uuid for d in mine} == {r["uuid"] for r in entities if r["g"] == group}
            assert all(d.episode_id == episodes[k].episode_id for d in mine)
        assert any(d.new_facts and d.new_facts[0].embedding for _, d in out)

        # Redelivery: the same episode again under a new Nats-Msg-Id adds nothing.
        before_graph, before_calls, before_deltas = await graph.counts(group_list), len(llm.calls), len(out)
        again = episodes["a"]
        await js.publish(subjects.episode(again.group_id), again.model_dump_json().encode(),
                         headers={subjects.HDR_MSG_ID: f"again-{again.episode_id}"})
        assert await wait_for(lambda: settled(js, 3), 60), "the redelivered episode was not handled"
        assert len(llm.calls) == before_calls, "an episode already in the graph must cost no LLM call"
        assert await graph.counts(group_list) == before_graph
        assert len(await published_deltas(js)) == before_deltas, "re-published deltas must be deduplicated"
    finally:
        await nc.close()
        await service.stop()
