"""Content that breaks graphiti's FalkorDB fulltext queries (issue 10, item 10).

graphiti turns the words of a fact or a name into a RediSearch query and strips only ASCII
punctuation: a markdown blank (``\\_\\_\\_\\_``) leaves lone ``_`` terms, control characters
pass as they are, and RediSearch answers "Syntax error" -- at every retry, so the turn was
dead-lettered. Real FalkorDB (session fixture), the offline rules extractor, the hashing
embedder: no mocks. The reproduction tests run graphiti's own driver and must fail; the others
run engram's driver (engram/graph/drivers.py) and must not.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import nats
import pytest
from graphiti_core.driver.driver import GraphProvider
from graphiti_core.driver.falkordb_driver import FalkorDriver
from graphiti_core.graph_queries import get_nodes_query, get_relationships_query
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.search.search_filters import SearchFilters
from graphiti_core.search.search_utils import edge_fulltext_search, node_fulltext_search
from graphiti_core.tracer import NoOpTracer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from redis.exceptions import ResponseError

from engram.graph.drivers import FULLTEXT_REJECTED, EngramFalkorDriver, fulltext_words
from engram.models.hashing_embedder import HashingEmbedder
from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import Episode, EpisodeMessage, subjects
from engram.services.extractor import app as ex_app
from engram.services.extractor.app import NoRerank
from engram.services.extractor.pipeline import extract_episode, find_episode, safe_entity_name
from tests.services.turn_detector.helpers import read_all, wait_for

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc)
BRIDGE = r"there is a bridge \_\_\_\_ the Thames River"
BRIDGE_TURN = (
    f"user (Alice): Fill in the blank for Bob: {BRIDGE} in London.\n\n"
    "assistant: The answer is over: there is a bridge over the Thames River."
)
# RediSearch query syntax: every operator and special character of its query language
# (OR, NOT, optional, prefix/suffix/infix wildcard, fuzzy, field, tag, numeric/geo ranges, exact
# phrase, grouping, attributes, parameters, escapes, verbatim, vector KNN) and graphiti's own
# separators -- as single characters and as the forms they take in a query.
OPERATOR_CHARS = list("|-~*%@:\"'()[]{}$=>;\\/,.<!#^&+?`_") + ["\t", "\n", "\x00", "\x01", "\x1f", "\x7f"]
OPERATOR_FORMS = [
    "a|b", "-word", "~word", "word*", "*fix*", "%word%", "%%fuzzy%%", "@name:foo", "@group_id:{x}",
    "@n:[1 2]", "@loc:[0 0 10 km]", '"exact phrase"', "(a b)", "{tag}", "=>{$weight:2}", "$param",
    "w'wild*'", "ismissing(@f)", "-(a|b)", "\\", "\\\\", "\\_", "_", "__", "\\_\\_\\_\\_", "*", "**", "-",
    "--", "|", "||", "@", "'", "''", '"', "...", "=>[KNN 10 @v $blob]", "INTERSECT", "UNION", "NOT", "AND",
    "OR", "$", "%", "~", ":", "-_-", "_-_", "¯\\_(ツ)_/¯", "·", "—", "…", "‘quoted’", "“quoted”",
]
WORDS = ["Alice", "Bob", "London", "Thames", "River", "bridge", "FastAPI", "pydantic", "works", "at", "the", "I", "is"]
SPEAKER_LINES = ["user (Alice): ", "user (Alice): I work at ", "assistant: Bob uses ", "user: I moved to "]


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


def _rejected() -> float:
    return sum(s.value for m in FULLTEXT_REJECTED.collect() for s in m.samples if s.name.endswith("_total"))


def _episode(group_id: str, turn_id: str, content: str, at: datetime = T0) -> Episode:
    return Episode(
        episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"fulltext/{group_id}/{turn_id}")),
        group_id=group_id, scope="session", turn_id=turn_id, session_id="s1", reference_time=at, content=content,
        messages=[EpisodeMessage(message_id=f"{turn_id}-m", role="user", name="Alice", timestamp=at)],
    )


@dataclass
class Graph:
    group_id: str
    driver: FalkorDriver

    def clients(self) -> GraphitiClients:
        return GraphitiClients(driver=self.driver, llm_client=RulesExtractorClient(), embedder=HashingEmbedder(256),
                               cross_encoder=NoRerank(), tracer=NoOpTracer())

    async def extract(self, turn_id: str, content: str, at: datetime = T0):  # noqa: ANN201
        return await extract_episode(self.clients(), _episode(self.group_id, turn_id, content, at),
                                     custom_instructions="", previous_window=2)


async def _graph(falkordb_server, driver_class: type[FalkorDriver], group_id: str | None = None) -> Graph:  # noqa: ANN001
    host, port = _host_port(falkordb_server.url)
    group_id = group_id or f"ft_{uuid.uuid4().hex[:12]}"
    driver = driver_class(host=host, port=port, database=group_id)
    if driver._init_task is not None:  # noqa: SLF001 - index creation scheduled by the constructor
        await driver._init_task  # noqa: SLF001
    return Graph(group_id, driver)


async def _drop(graph: Graph) -> None:
    try:
        await graph.driver.client.select_graph(graph.group_id).delete()
    finally:
        await graph.driver.close()


@pytest.fixture
async def engram_graph(falkordb_server) -> AsyncIterator[Graph]:  # noqa: ANN001
    graph = await _graph(falkordb_server, EngramFalkorDriver)
    yield graph
    await _drop(graph)


@pytest.fixture
async def graphiti_graph(falkordb_server) -> AsyncIterator[Graph]:  # noqa: ANN001
    graph = await _graph(falkordb_server, FalkorDriver)
    yield graph
    await _drop(graph)


# --------------------------------------------------------------------------- reproduction
async def test_graphiti_fulltext_query_of_the_bridge_fact_is_a_redisearch_syntax_error(graphiti_graph: Graph) -> None:
    """graphiti's own driver: the lookup itself and the whole extraction fail on the text."""
    g = graphiti_graph
    for search in (edge_fulltext_search, node_fulltext_search):
        with pytest.raises(ResponseError, match="Syntax error"):
            await search(g.driver, BRIDGE, SearchFilters(), [g.group_id])
    with pytest.raises(ResponseError, match="Syntax error"):
        await g.extract("s1:t1", BRIDGE_TURN)
    assert await find_episode(g.clients(), _episode(g.group_id, "s1:t1", BRIDGE_TURN).episode_id) is None


# --------------------------------------------------------------------------- engram's driver
async def test_bridge_turn_is_extracted_and_its_fact_found_by_fulltext(engram_graph: Graph) -> None:
    g = engram_graph
    rejected = _rejected()
    result = await g.extract("s1:t1", BRIDGE_TURN)

    assert not result.already_present and result.resolved_edges
    assert await find_episode(g.clients(), result.episode_id) is not None
    blank = [e for e in result.resolved_edges if "\\_" in e.fact]
    assert blank, [e.fact for e in result.resolved_edges]  # the blank reached a fact, and so the query
    # the same turn again in a later episode: its facts are searched against the stored ones
    again = await g.extract("s1:t2", BRIDGE_TURN, T0 + timedelta(minutes=1))
    assert not again.already_present and await find_episode(g.clients(), again.episode_id) is not None
    hits = await edge_fulltext_search(g.driver, BRIDGE, SearchFilters(), [g.group_id])
    assert blank[0].uuid in {e.uuid for e in hits}  # sanitised, the lookup still finds the fact
    assert _rejected() == rejected  # sanitising alone was enough: the fallback was not needed


@pytest.mark.parametrize("driver_class", [FalkorDriver, EngramFalkorDriver])
async def test_a_group_id_with_a_hyphen_is_found_by_fulltext_with_engrams_driver(falkordb_server,  # noqa: ANN001
                                                                                  driver_class: type[FalkorDriver]) -> None:
    """A group id may hold a hyphen (ENGRAM_GROUP_PREFIX allows one): graphiti's group filter
    (``@group_id:"session\\_..."``) never matches such a group in RediSearch, so graphiti's own
    driver finds none of its facts by words (graphiti's dedupe searches lost their keyword side);
    engram's finds them."""
    g = await _graph(falkordb_server, driver_class, group_id=f"session_{uuid.uuid4()}")
    try:
        result = await g.extract("s1:t1", "user (Alice): I work at Globex in London.")
        assert result.resolved_edges
        hits = await edge_fulltext_search(g.driver, "Globex London", SearchFilters(), [g.group_id])
        assert ({e.uuid for e in hits} == {e.uuid for e in result.resolved_edges}) == (driver_class is EngramFalkorDriver)
        assert (await edge_fulltext_search(g.driver, "Globex", SearchFilters(), ["another_group"])) == []
    finally:
        await _drop(g)


def test_fulltext_words_keeps_words_and_drops_every_operator() -> None:
    assert fulltext_words(BRIDGE) == "there is a bridge the Thames River"
    assert fulltext_words("snake_case @name:{x} -not ~opt pre* %fz% \"a b\" w'x' $p =>[KNN]") == (
        "snake_case name x not opt pre fz a b w x p KNN"
    )
    assert fulltext_words("_ __ \\_ \x01 \x7f | - * @ ' \" \\") == ""
    assert fulltext_words("Zürich 東京 ²") == "Zürich 東京 ²"


@pytest.mark.parametrize("name", ["_", "___", "\\_\\_\\_\\_", "'_'", "-", "|", "*", "@", "\\", '"'])
def test_entity_names_of_only_punctuation_or_underscores_are_unsafe(name: str) -> None:
    assert not safe_entity_name(name)


def test_entity_names_with_underscores_inside_words_are_kept() -> None:
    assert safe_entity_name("snake_case") and safe_entity_name("__init__") and safe_entity_name("_private")


async def test_a_fulltext_query_falkordb_rejects_is_no_hits_counted_and_logged_without_content(
    engram_graph: Graph, caplog: pytest.LogCaptureFixture
) -> None:
    """The fallback, for a query the sanitiser did not build (graphiti's raw syntax)."""
    g = engram_graph
    raw = f'(@group_id:"{g.group_id}") (secretword | _)'
    edges = get_relationships_query("edge_name_and_fact", limit=10, provider=GraphProvider.FALKORDB)
    nodes = get_nodes_query("node_name_and_summary", "$query", limit=10, provider=GraphProvider.FALKORDB)
    before = {label: FULLTEXT_REJECTED.labels(index=label)._value.get() for label in ("RELATES_TO", "Entity")}  # noqa: SLF001
    caplog.set_level(logging.DEBUG)

    assert await g.driver.execute_query(edges + " YIELD relationship AS rel, score RETURN rel.uuid AS uuid",
                                        query=raw, limit=10) == ([], [], None)
    assert await g.driver.execute_query(nodes + " YIELD node AS n, score RETURN n.uuid AS uuid",
                                        query=raw, limit=10) == ([], [], None)

    assert FULLTEXT_REJECTED.labels(index="RELATES_TO")._value.get() == before["RELATES_TO"] + 1  # noqa: SLF001
    assert FULLTEXT_REJECTED.labels(index="Entity")._value.get() == before["Entity"] + 1  # noqa: SLF001
    assert "secretword" not in caplog.text  # neither graphiti's error log nor ours holds the query
    assert [r for r in caplog.records if r.name == "engram.graph" and "rejected a fulltext query" in r.getMessage()]
    # graphiti's own driver logs the same failure with the query: the filter is engram's, per call
    caplog.clear()
    with pytest.raises(ResponseError):
        await FalkorDriver.execute_query(g.driver, edges + " YIELD relationship AS rel, score RETURN rel.uuid AS uuid",
                                         query=raw, limit=10)
    assert "secretword" in caplog.text


async def test_other_errors_of_a_fulltext_query_still_raise(engram_graph: Graph) -> None:
    edges = get_relationships_query("edge_name_and_fact", limit=10, provider=GraphProvider.FALKORDB)
    with pytest.raises(ResponseError):
        await engram_graph.driver.execute_query(edges + " YIELD relationship AS rel RETURN nosuchvar", query="bridge")


# --------------------------------------------------------------------------- properties
_operator_text = st.lists(
    st.one_of(st.sampled_from(OPERATOR_CHARS), st.sampled_from(OPERATOR_FORMS), st.sampled_from(WORDS),
              st.text(max_size=6)),
    min_size=1, max_size=25,
).flatmap(lambda parts: st.lists(st.sampled_from(["", " ", "  "]), min_size=len(parts), max_size=len(parts))
          .map(lambda seps: "".join(p + s for p, s in zip(parts, seps, strict=True))))


def _hypothesis(**kw):  # noqa: ANN003, ANN201 - a body run in a thread against the test's event loop
    return settings(deadline=None, suppress_health_check=list(HealthCheck), database=None, **kw)


async def test_no_text_makes_the_fulltext_query_a_syntax_error(engram_graph: Graph) -> None:
    """Every text, sanitised, is a query RediSearch parses: run on the raw graph, no fallback."""
    g = engram_graph
    graph = g.driver.client.select_graph(g.group_id)
    edges = get_relationships_query("edge_name_and_fact", limit=10, provider=GraphProvider.FALKORDB)
    nodes = get_nodes_query("node_name_and_summary", "$query", limit=10, provider=GraphProvider.FALKORDB)
    loop = asyncio.get_running_loop()

    async def check(text: str) -> None:
        query = g.driver.build_fulltext_query(text, [g.group_id], 128)
        if query:
            await graph.query(edges + " YIELD relationship AS rel, score RETURN count(rel)", {"query": query, "limit": 10})
            await graph.query(nodes + " YIELD node AS n, score RETURN count(n)", {"query": query, "limit": 10})

    @_hypothesis(max_examples=400)
    @given(st.one_of(_operator_text, st.text(max_size=60)))
    @example(BRIDGE)
    @example("".join(OPERATOR_CHARS))
    @example(" ".join(OPERATOR_FORMS))
    def run(text: str) -> None:
        asyncio.run_coroutine_threadsafe(check(text), loop).result(30)

    await asyncio.to_thread(run)


async def test_turns_with_every_redisearch_operator_are_extracted(engram_graph: Graph) -> None:
    """Generated turns full of RediSearch operators go through the whole extraction (rules
    extractor, real FalkorDB, one graph: later turns search the facts of earlier ones): each is
    stored, and no fulltext lookup needed the fallback."""
    g = engram_graph
    loop = asyncio.get_running_loop()
    rejected = _rejected()
    turns = iter(range(10_000))

    async def check(content: str) -> None:
        n = next(turns)
        result = await g.extract(f"s1:t{n}", content, T0 + timedelta(minutes=n))
        assert await find_episode(g.clients(), result.episode_id) is not None

    @_hypothesis(max_examples=40)
    @given(st.sampled_from(SPEAKER_LINES), _operator_text, _operator_text)
    @example("user (Alice): ", f"Fill in the blank for Bob: {BRIDGE} in London.", "")
    @example("user (Alice): I work at ", "Acme_|-*@Corp and Bob uses " + " ".join(OPERATOR_FORMS), "".join(OPERATOR_CHARS))
    def run(speaker: str, first: str, second: str) -> None:
        content = f"{speaker}{first} Alice met Bob in London. {second}\n\nassistant: Bob {second} likes {first}."
        asyncio.run_coroutine_threadsafe(check(content), loop).result(60)

    await asyncio.to_thread(run)
    assert _rejected() == rejected


# --------------------------------------------------------------------------- service: no dead letter
async def test_the_bridge_turn_is_stored_by_the_extractor_service_with_no_dead_letter(
    clean_nats, falkordb_server, tmp_path  # noqa: ANN001
) -> None:
    settings_ = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=1,
                               turn=TurnDetectorSettings(max_deliveries=2))
    service = ex_app.build(settings_, llm=RulesExtractorClient())
    await service.start()
    nc = await nats.connect(clean_nats)
    group_id = f"engram_session_ft{uuid.uuid4().hex[:8]}"
    content = BRIDGE_TURN + " " + " ".join(OPERATOR_FORMS) + " " + "".join(OPERATOR_CHARS)
    episode = _episode(group_id, "s1:t1", content)
    try:
        js = nc.jetstream()
        await js.publish(subjects.episode(group_id), episode.model_dump_json().encode(),
                         headers={subjects.HDR_MSG_ID: episode.episode_id})

        async def stored() -> bool | None:
            graphs = service.extractor.graph  # type: ignore[attr-defined]
            if not await graphs.exists(group_id, max_age_s=0):
                return None
            clients = await service.extractor._clients(group_id)  # type: ignore[attr-defined]  # noqa: SLF001
            return await find_episode(clients, episode.episode_id, group_id) is not None or None

        assert await wait_for(stored, 60), "the episode never reached the graph"
        assert await read_all(js, subjects.STREAM_DLQ) == []
    finally:
        await nc.close()
        await service.stop()
