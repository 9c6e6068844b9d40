"""Relative dates in facts reach the stored RELATES_TO edge as absolute dates (issue 11, item 4).

The real extraction pipeline (services/extractor/pipeline.py: graphiti's combined and separate
prompts, its batch timestamp prompt and edge resolution) with the offline rules extractor, the
hashing embedder and engram's FalkorDB driver against a real FalkorDB (session fixture): no
mocks. A turn said on Friday 2023-05-12 about "last Friday" must store valid_at 2023-05-05; a
future plan keeps the time it was said as valid_at (graphiti's timestamp prompt rule). The fact's
text is grounded ("last Friday (2023-05-05)") where the prompt gives the rules model a reference
time: the separate path's edge prompt, not the combined prompt of a single episode.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone

import pytest
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.tracer import NoOpTracer

from engram.graph.drivers import EngramFalkorDriver
from engram.models.hashing_embedder import HashingEmbedder
from engram.models.rules_llm import RulesExtractorClient
from engram.services.extractor.app import NoRerank
from engram.services.extractor.pipeline import extract_episode
from tests.services.extractor.test_pipeline import _host_port, make_episode

SAID = datetime(2023, 5, 12, 15, 30, tzinfo=timezone.utc)  # a Friday


@pytest.fixture
async def driver(falkordb_server) -> AsyncIterator[EngramFalkorDriver]:  # noqa: ANN001
    host, port = _host_port(falkordb_server.url)
    group_id = f"tg_{uuid.uuid4().hex[:12]}"
    driver = EngramFalkorDriver(host=host, port=port, database=group_id)
    if driver._init_task is not None:  # noqa: SLF001 - index creation scheduled by the constructor
        await driver._init_task  # noqa: SLF001
    yield driver
    try:
        await driver.client.select_graph(group_id).delete()
    finally:
        await driver.close()


async def _stored_facts(driver: EngramFalkorDriver, content: str, mode: str) -> tuple[RulesExtractorClient, dict[str, object]]:
    llm = RulesExtractorClient()
    clients = GraphitiClients(driver=driver, llm_client=llm, embedder=HashingEmbedder(256),
                              cross_encoder=NoRerank(), tracer=NoOpTracer())
    episode = make_episode(driver._database, "s1:t1", content, SAID)  # noqa: SLF001
    await extract_episode(clients, episode, custom_instructions="", previous_window=2, mode=mode)  # type: ignore[arg-type]
    records, _, _ = await driver.execute_query(
        "MATCH (:Entity)-[e:RELATES_TO]->(:Entity) RETURN e.fact AS fact, e.valid_at AS valid_at")
    return llm, {r["fact"]: r["valid_at"] for r in records}


def _day(value: object) -> str:
    return value.isoformat()[:10] if isinstance(value, datetime) else str(value)[:10]


@pytest.mark.parametrize("mode", ["combined", "separate"])
@pytest.mark.parametrize(
    ("content", "grounded", "valid_day"),
    [
        ("user (Calvin): I crashed my Ferrari last Friday.", "last Friday (2023-05-05)", "2023-05-05"),
        ("user (Calvin): Two weeks ago I visited Tokyo.", "Two weeks ago (2023-04-28)", "2023-04-28"),
        ("user (Caroline): I went to Paris last summer.", "last summer (summer 2022)", "2022-06-01"),
        ("user (Caroline): I moved to Sweden a year ago.", "a year ago (May 2022)", "2022-05-12"),
        # a future plan: valid from when it was said, the date it names kept in the text
        ("user (Caroline): I will fly to Rome in 2 days.", "in 2 days (2023-05-14)", "2023-05-12"),
    ],
)
async def test_relative_date_in_a_fact_reaches_the_stored_edge(
    driver: EngramFalkorDriver, mode: str, content: str, grounded: str, valid_day: str
) -> None:
    llm, facts = await _stored_facts(driver, content, mode)
    assert facts and {_day(v) for v in facts.values()} == {valid_day}, facts
    if mode == "separate":
        # graphiti's edge prompt gives REFERENCE_TIME: the rules model grounds the fact's text
        assert all(grounded in fact for fact in facts), facts
    else:
        # graphiti's combined prompt carries no timestamp for a single current episode (only
        # [Episode N] headers when several are extracted together): the text stays relative,
        # the date reaches valid_at through the batch timestamp prompt's per-fact reference_time
        assert all(grounded.split(" (")[0] in fact and "(" not in fact for fact in facts), facts
    # the prompts graphiti sent: the fact's date came from engram's own dating of graphiti's
    # timestamp prompt (combined: services/extractor/local_answers.py, no model call, since engram
    # resolves the expression) or the rules model's answer to the edge prompt (separate)
    names = [c.response_model for c in llm.calls]
    assert ("BatchEdgeTimestamps" not in names) if mode == "combined" else ("ExtractedEdges" in names), names


async def test_a_fact_without_a_date_is_valid_from_the_turn_and_its_text_is_unchanged(driver: EngramFalkorDriver) -> None:
    _, facts = await _stored_facts(driver, "user (Calvin): I love my Ferrari.", "combined")
    assert facts and all("(" not in fact for fact in facts), facts
    assert {_day(v) for v in facts.values()} == {"2023-05-12"}
