"""Fact search through FalkorDB's vector index (services/recall/vector.py) and the index itself
(engram.graph.drivers.GraphDrivers.ensure_indices), against the real FalkorDB of the test session.

Facts carry hand-made vectors (a few dimensions), so the expected neighbours and their order
are known exactly; the hybrid search is compared with graphiti's own search on the same graph."""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from graphiti_core.driver.driver import GraphProvider
from graphiti_core.edges import EntityEdge
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.nodes import EntityNode
from graphiti_core.search.search import search
from graphiti_core.search.search_config_recipes import EDGE_HYBRID_SEARCH_RRF
from graphiti_core.tracer import NoOpTracer

import engram.graph.drivers
from engram.graph.drivers import GraphDrivers, ensure_vector_index, vector_index_options
from engram.models.factory import EmbedderSettings, embedding_dim
from engram.models.hashing_embedder import HashingEmbedder
from engram.settings import EngramSettings
from engram.services.extractor.app import NoRerank
from engram.services.recall.app import _NoLLM
from engram.services.recall.search import NOT_EXPIRED
from engram.services.recall.vector import (
    GRAPHITI_MIN_COSINE,
    hybrid_fact_search,
    hybrid_fact_search_scored,
    vector_fact_search,
)

DIM = 4
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


def unit(*xs: float) -> list[float]:
    norm = math.sqrt(sum(x * x for x in xs))
    return [x / norm for x in xs]


def vec(angle_deg: float, dim: int = DIM) -> list[float]:
    """A unit vector in the plane of the first two axes: cosine to [1, 0, ...] is cos(angle)."""
    a = math.radians(angle_deg)
    return [math.cos(a), math.sin(a)] + [0.0] * (dim - 2)


@dataclass
class Graph:
    drivers: GraphDrivers
    settings: EngramSettings

    def group(self) -> str:
        return f"vec_{uuid.uuid4().hex[:10]}"

    async def driver(self, group: str) -> Any:
        return await self.drivers.driver(group)


@pytest.fixture
async def graph(falkordb_server, tmp_path: Path) -> AsyncIterator[Graph]:  # noqa: ANN001
    settings = EngramSettings(graph_url=falkordb_server.url, data_dir=tmp_path)
    drivers = GraphDrivers(settings, embedding_dim=DIM)
    try:
        yield Graph(drivers, settings)
    finally:
        await drivers.close()


async def write_facts(driver: Any, group: str, facts: list[tuple[str, list[float]]], *, expired: bool = False,
                      group_id: str | None = None) -> list[EntityEdge]:
    """One fact per (text, vector) between two entities of the group, saved by graphiti."""
    dim = len(facts[0][1])
    source = EntityNode(name="Ada", group_id=group, labels=["Entity"], created_at=T0, name_embedding=[1.0] * dim)
    target = EntityNode(name="thing", group_id=group, labels=["Entity"], created_at=T0, name_embedding=[1.0] * dim)
    await source.save(driver)
    await target.save(driver)
    edges = []
    for i, (fact, vector) in enumerate(facts):
        edge = EntityEdge(
            source_node_uuid=source.uuid, target_node_uuid=target.uuid, name="RELATES_TO", fact=fact,
            fact_embedding=vector, group_id=group_id or group, episodes=[f"ep-{i}"], created_at=T0,
            valid_at=T0 - timedelta(days=i), expired_at=T0 if expired else None,
        )
        await edge.save(driver)
        edges.append(edge)
    return edges


async def usable(driver: Any, group: str, dim: int = DIM, timeout: float = 20.0) -> None:
    """Wait until the group's vector index answers (it is built in the background)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while await vector_fact_search(driver, group, [1.0] + [0.0] * (dim - 1), 1) is None:
        assert asyncio.get_running_loop().time() < deadline, "vector index never became usable"
        await asyncio.sleep(0.02)


async def vector_indices(driver: Any) -> list[dict]:
    result = await driver._get_graph(None).query(  # noqa: SLF001
        "CALL db.indexes() YIELD label, types, options RETURN label, types, options")
    return [options["fact_embedding"] for label, types, options in result.result_set
            if label == "RELATES_TO" and "VECTOR" in types.get("fact_embedding", [])]


# --- the index -------------------------------------------------------------------------------------
async def test_ensure_indices_creates_the_vector_index_once(graph: Graph) -> None:
    group = graph.group()
    driver = await graph.driver(group)
    await usable(driver, group)
    options = await vector_index_options(driver._get_graph(None))  # noqa: SLF001
    assert options is not None
    assert (options["dimension"], options["similarityFunction"], options["efRuntime"]) == (DIM, "cosine", 200)
    # again: the same drivers (remembered), fresh drivers (checked, left alone), and directly
    await graph.drivers.ensure_indices(driver)
    other = GraphDrivers(graph.settings, embedding_dim=DIM)
    try:
        await other.driver(group)
    finally:
        await other.close()
    assert await ensure_vector_index(driver._get_graph(None), DIM) == "exists"  # noqa: SLF001
    assert await vector_indices(driver) == [options]


async def test_no_embedding_dim_no_vector_index_and_search_falls_back(graph: Graph) -> None:
    group = graph.group()
    plain = GraphDrivers(graph.settings)
    try:
        driver = await plain.driver(group)
        await write_facts(driver, group, [("Ada likes tea", vec(0))])
        assert await vector_indices(driver) == []
        assert await vector_fact_search(driver, group, vec(0), 5) is None
        clients = GraphitiClients(driver=driver, llm_client=_NoLLM(), embedder=HashingEmbedder(),
                                  cross_encoder=NoRerank(), tracer=NoOpTracer())
        assert await hybrid_fact_search(clients, group, "tea", vec(0), 5) is None
    finally:
        await plain.close()


async def test_dimension_change_drops_and_recreates_the_index(graph: Graph, caplog: pytest.LogCaptureFixture) -> None:
    group = graph.group()
    driver = await graph.driver(group)
    await write_facts(driver, group, [("Ada likes tea", vec(0))])
    await usable(driver, group)
    wide = GraphDrivers(graph.settings, embedding_dim=8)
    try:
        with caplog.at_level(logging.WARNING, logger="engram.graph"):
            wide_driver = await wide.driver(group)
        assert any("dropping and recreating" in r.getMessage() for r in caplog.records)
        assert (await vector_index_options(wide_driver._get_graph(None)))["dimension"] == 8  # noqa: SLF001
        [new] = await write_facts(wide_driver, group, [("Ada likes coffee", vec(0, dim=8))])
        await usable(wide_driver, group, dim=8)
        assert [i["dimension"] for i in await vector_indices(wide_driver)] == [8]
        # the old 4-d facts are not in the 8-d index, and 4-d queries are refused: fall back
        assert await vector_fact_search(wide_driver, group, vec(0, dim=8), 5) == [(new.uuid, pytest.approx(1.0))]
        assert await vector_fact_search(wide_driver, group, vec(0), 5) is None
    finally:
        await wide.close()


async def test_server_refusing_the_index_is_logged_not_raised(
    graph: Graph, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error FalkorDB answers with (here an unknown similarity function) leaves the graph
    usable without the index: logged, remembered (not retried per call), search falls back."""
    monkeypatch.setitem(engram.graph.drivers.VECTOR_INDEX_OPTIONS, "similarityFunction", "bogus")
    group = graph.group()
    with caplog.at_level(logging.WARNING, logger="engram.graph"):
        driver = await graph.driver(group)
    assert any("not created" in r.getMessage() for r in caplog.records)
    assert await vector_indices(driver) == []
    assert await vector_fact_search(driver, group, vec(0), 5) is None
    with pytest.raises(ValueError, match="positive"):
        GraphDrivers(graph.settings, embedding_dim=0)


async def test_index_being_built_falls_back(graph: Graph) -> None:
    """FalkorDB answers "Invalid arguments" while the index is under construction: None."""
    group = graph.group()
    plain = GraphDrivers(graph.settings)
    try:
        driver = await plain.driver(group)
        raw = driver._get_graph(None)  # noqa: SLF001
        # 20k facts written in one query, so that the index takes a while to build
        await raw.query(
            "CREATE (a:Entity {uuid: 'a', group_id: $g}), (b:Entity {uuid: 'b', group_id: $g}) "
            "WITH a, b UNWIND range(1, 20000) AS i "
            "CREATE (a)-[:RELATES_TO {uuid: 'f' + toString(i), group_id: $g, fact: 'fact ' + toString(i), "
            "fact_embedding: vecf32([toFloat(i % 7), toFloat(i % 11), toFloat(i % 13), 1.0])}]->(b)",
            {"g": group})
        assert await ensure_vector_index(raw, DIM) == "created"
        statuses = [s for label, s in (await raw.query(
            "CALL db.indexes() YIELD label, status RETURN label, status")).result_set if label == "RELATES_TO"]
        assert any("UNDER CONSTRUCTION" in s for s in statuses), statuses
        assert await vector_fact_search(driver, group, vec(0), 5) is None
        assert await ensure_vector_index(raw, DIM) == "exists"  # the index being built counts
        await usable(driver, group, timeout=60)
        hits = await vector_fact_search(driver, group, unit(6, 10, 12, 1), 3)
        assert hits is not None and hits[0][1] == pytest.approx(1.0, abs=1e-5)
    finally:
        await plain.close()


async def test_other_providers_fall_back() -> None:
    neo4j = SimpleNamespace(provider=GraphProvider.NEO4J)
    assert await vector_fact_search(neo4j, "g", vec(0), 5) is None
    assert await hybrid_fact_search(SimpleNamespace(driver=neo4j), "g", "tea", vec(0), 5) is None


def test_embedding_dim_follows_the_embedder_settings() -> None:
    assert embedding_dim(EmbedderSettings(provider="hashing", dim=256)) == 256
    assert embedding_dim(EmbedderSettings(provider="openai", dim=1536)) == 1536
    assert embedding_dim(EmbedderSettings(provider="minilm", dim=256)) == 384


# --- vector_fact_search -------------------------------------------------------------------------------
async def test_nearest_current_facts_best_first_with_cosine_similarity(graph: Graph) -> None:
    group = graph.group()
    driver = await graph.driver(group)
    angles = [90, 0, 180, 30, 60]
    edges = await write_facts(driver, group, [(f"fact at {a} degrees", vec(a)) for a in angles])
    by_angle = dict(zip(angles, edges))
    await usable(driver, group)
    hits = await vector_fact_search(driver, group, vec(0), 10)
    assert [u for u, _ in hits] == [by_angle[a].uuid for a in (0, 30, 60, 90, 180)]
    assert [s for _, s in hits] == pytest.approx([1.0, math.sqrt(3) / 2, 0.5, 0.0, -1.0], abs=1e-5)
    assert [u for u, _ in await vector_fact_search(driver, group, vec(0), 2)] == [by_angle[0].uuid, by_angle[30].uuid]
    # min_score on the cosine scale, strictly above (as graphiti's)
    kept = await vector_fact_search(driver, group, vec(0), 10, min_score=0.4)
    assert [u for u, _ in kept] == [by_angle[a].uuid for a in (0, 30, 60)]
    # graphiti's 0.6 threshold on its (1 + cos) / 2 scale is cos > 0.2
    assert GRAPHITI_MIN_COSINE == pytest.approx(0.2)


async def test_expired_facts_are_excluded_even_when_they_crowd_the_nearest(graph: Graph) -> None:
    group = graph.group()
    driver = await graph.driver(group)
    # 60 expired facts nearer to the query than any current one: the first k nearest are all expired
    await write_facts(driver, group, [(f"old {i}", vec(i * 0.1)) for i in range(60)], expired=True)
    current = await write_facts(driver, group, [(f"new {a}", vec(a)) for a in (20, 40, 80)])
    await usable(driver, group)
    hits = await vector_fact_search(driver, group, vec(0), 3)
    assert [u for u, _ in hits] == [e.uuid for e in current]
    assert await vector_fact_search(driver, group, vec(0), 10, min_score=0.95) == []


async def test_other_groups_are_never_returned(graph: Graph) -> None:
    mine, theirs = graph.group(), graph.group()
    my_driver, their_driver = await graph.driver(mine), await graph.driver(theirs)
    [own] = await write_facts(my_driver, mine, [("Ada likes tea", vec(10))])
    await write_facts(their_driver, theirs, [("Bob likes tea", vec(0))])
    # an edge in my graph labelled with another group (never written by engram) is still not mine
    await write_facts(my_driver, mine, [("stray", vec(0))], group_id=theirs)
    await usable(my_driver, mine)
    await usable(their_driver, theirs)
    assert [u for u, _ in await vector_fact_search(my_driver, mine, vec(0), 10)] == [own.uuid]


# --- hybrid_fact_search -------------------------------------------------------------------------------------
async def test_hybrid_fuses_a_keyword_only_and_a_vector_only_match_like_graphiti(graph: Graph) -> None:
    group = graph.group()
    driver = await graph.driver(group)
    query, q = "pydantic", vec(0)
    keyword_only, vector_only, neither, both = await write_facts(driver, group, [
        ("Ada pinned pydantic in pyproject.toml", vec(85)),  # cos 0.09 < 0.2: not a vector hit
        ("Ada deployed the billing service on Friday", vec(5)),
        ("Bob adopted a dog named Max", vec(100)),
        ("pydantic validates the FastAPI models", vec(15)),
    ])
    [expired] = await write_facts(driver, group, [("pydantic was pinned to 1.10", vec(0))], expired=True)
    await usable(driver, group)
    clients = GraphitiClients(driver=driver, llm_client=_NoLLM(), embedder=HashingEmbedder(),
                              cross_encoder=NoRerank(), tracer=NoOpTracer())

    scored = await hybrid_fact_search_scored(clients, group, query, q, 10)
    got = [e.uuid for e, _ in scored]
    assert got[0] == both.uuid  # first in both lists
    assert set(got) == {both.uuid, keyword_only.uuid, vector_only.uuid}
    assert neither.uuid not in got and expired.uuid not in got

    # the same facts, order and RRF scores as graphiti's hybrid search with recall's filter
    config = EDGE_HYBRID_SEARCH_RRF.model_copy(update={"limit": 10})
    reference = await search(clients, query, [group], config, NOT_EXPIRED, query_vector=q)
    assert got == [e.uuid for e in reference.edges]
    assert [s for _, s in scored] == pytest.approx(reference.edge_reranker_scores)
    edges = await hybrid_fact_search(clients, group, query, q, 10)
    for mine, theirs in zip(edges, reference.edges):
        for field in ("uuid", "group_id", "name", "fact", "episodes", "source_node_uuid", "target_node_uuid",
                      "created_at", "valid_at", "invalid_at", "expired_at"):
            assert getattr(mine, field) == getattr(theirs, field), field
        assert mine.fact_embedding is None  # never shipped
    assert [e.uuid for e in await hybrid_fact_search(clients, group, query, q, 1)] == [both.uuid]
    assert await hybrid_fact_search(clients, group, "   ", q, 10) == []


def test_weighted_rrf_is_graphitis_rrf_at_equal_weights_and_weights_a_ranking() -> None:
    from graphiti_core.search.search_utils import rrf

    from engram.services.recall.vector import weighted_rrf

    rankings = [["a", "b", "c"], ["c", "d"], ["d", "a"]]
    assert weighted_rrf(rankings, [1.0, 1.0, 1.0], 1) == rrf(rankings, rank_const=1)
    assert weighted_rrf(rankings, [1.0, 1.0, 1.0], 61) == rrf(rankings, rank_const=61)
    uuids, scores = weighted_rrf(rankings, [1.0, 1.0, 2.0], 1)
    assert uuids == ["d", "a", "c", "b"] and scores[:2] == [2.5, 2.0]  # d: 1/2 + 2/1; a: 1/1 + 2/2
