"""Past turns through the graph's own indices (services/recall/turns.py), against a real FalkorDB:
nothing listed per request, a write or a delete seen by the next recall at once, followers, the
relevance floor, and the fallback to the in-memory index while the vector index cannot answer."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from engram.graph.drivers import TURN_VECTOR_INDEX, GraphDrivers, ensure_vector_index, vector_index_options
from engram.models.hashing_embedder import HashingEmbedder
from engram.settings import EngramSettings
from engram.schemas import RecallRequest, RecallScopes, subjects
from engram.services.extractor.pipeline import EMBEDDING_PROPERTY
from engram.services.recall import lexical as lexical_module
from engram.services.recall import turns as turns_module
from engram.services.recall.app import Recall, RecallSettings
from engram.services.recall.lexical import LexicalEpisodes
from engram.services.recall.turns import Q_DOC_FREQ, Q_TURN_COUNT, GraphTurns, bm25_rescored, keyword_query, keyword_ranking

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
DIM = 3


class Recording:
    """The real driver; every query sent through it or its raw graph is recorded."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver
        self.queries: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.driver, name)

    async def execute_query(self, query: str, **params: Any) -> Any:
        self.queries.append(query)
        return await self.driver.execute_query(query, **params)


@pytest.fixture
async def group(falkordb_server, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Any, Callable[..., Awaitable[None]], list[str]]]:  # noqa: ANN001
    """A fresh group graph with engram's indices (fulltext, range, both vector indexes at 3-d),
    ``add(uid, text, minute, vector)`` writing an Episodic node, and the queries sent."""
    settings = EngramSettings(graph_url=falkordb_server.url)
    drivers = GraphDrivers(settings, embedding_dim=DIM)
    name = f"turns_{uuid.uuid4().hex[:8]}"
    driver = await drivers.driver(name)
    sent: list[str] = []
    graph = driver._get_graph(None)  # noqa: SLF001 - the raw graph recall's turn search queries
    for method in ("query", "ro_query"):
        real = getattr(graph, method)

        async def recorded(q: str, params: Any = None, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            sent.append(q)
            return await _real(q, params, *args, **kwargs)

        monkeypatch.setattr(graph, method, recorded)
    monkeypatch.setattr("engram.services.recall.turns.falkor_graph", lambda _driver: graph)
    await _operational(graph)

    async def add(uid: str, text: str, minute: int, vector: list[float] | None = None) -> None:
        at = (T0 + timedelta(minutes=minute)).isoformat()
        props = "uuid: $u, group_id: $g, content: $c, created_at: $t, valid_at: $t"
        if vector is not None:
            props += f", {EMBEDDING_PROPERTY}: vecf32($v)"
        await graph.query(f"CREATE (:Episodic {{{props}}})", {"u": uid, "g": name, "c": text, "t": at, "v": vector})

    try:
        yield driver, add, sent
    finally:
        await graph.delete()
        await drivers.close()


async def _operational(graph: Any) -> None:
    for _ in range(200):
        rows = (await graph.query("CALL db.indexes() YIELD status RETURN status")).result_set
        if all("OPERATIONAL" in str(r[0]) for r in rows):
            return
        await asyncio.sleep(0.05)


def uuids(hits: list) -> list[str]:
    return [d.uuid for d, _ in hits]


async def test_keyword_and_dense_halves_fused_with_nothing_listed(group) -> None:  # noqa: ANN001
    driver, add, sent = group
    await add("e0", "user: we adopted a puppy last week", 0, [1.0, 0.0, 0.0])
    await add("e1", "user: my dog food order arrived", 1, [0.2, 0.0, 1.0])
    await add("e2", "user: tax forms are due", 2, [0.0, 1.0, 0.0])
    turns = GraphTurns()
    name = driver._database  # noqa: SLF001
    # keyword alone (no vector): only the turn sharing a word
    assert uuids(await turns.search(driver, name, "When did they get the dog?", 3)) == ["e1"]
    # the dense half brings the puppy turn, which shares no word with the question
    hybrid = await turns.search(driver, name, "When did they get the dog?", 3, vector=[1.0, 0.0, 0.1])
    assert set(uuids(hybrid)[:2]) == {"e0", "e1"} and len(hybrid) == 3
    doc = dict((d.uuid, d) for d, _ in hybrid)["e0"]
    assert doc.content == "user: we adopted a puppy last week" and doc.valid_at
    # the relevance floor leaves out a turn found only by a distant vector
    floored = await turns.search(driver, name, "When did they get the dog?", 3, vector=[1.0, 0.0, 0.1], min_cosine=0.9)
    assert set(uuids(floored)) == {"e0", "e1"}
    # no query lists the group or reads it whole: every query is an index call or a read by uuid
    assert sent and not any("collect(" in q or "string.join" in q for q in sent)
    # (the turn count is FalkorDB's label count: no scan either)
    assert all("db.idx." in q or "UNWIND $uuids" in q or "CALL db.indexes" in q or q.startswith("CREATE")
               or q == Q_TURN_COUNT for q in sent), sent
    assert not turns.fallback.indexes  # the in-memory index was never built


async def test_a_write_and_a_delete_are_seen_by_the_next_search(group) -> None:  # noqa: ANN001
    driver, add, _ = group
    name = driver._database  # noqa: SLF001
    turns = GraphTurns()
    await add("e0", "user: nginx crashed on staging", 0, [1.0, 0.0, 0.0])
    assert uuids(await turns.search(driver, name, "nginx", 5, vector=[1.0, 0.0, 0.0])) == ["e0"]
    await add("e1", "assistant: restart nginx and check the logs", 1, [0.9, 0.1, 0.0])
    assert set(uuids(await turns.search(driver, name, "nginx", 5, vector=[1.0, 0.0, 0.0]))) == {"e0", "e1"}
    await driver.execute_query("MATCH (e:Episodic {uuid: 'e0'}) DETACH DELETE e")
    assert uuids(await turns.search(driver, name, "nginx", 5, vector=[1.0, 0.0, 0.0])) == ["e1"]
    assert uuids(await turns.search(driver, name, "nginx", 5)) == ["e1"]


async def test_followers_come_from_the_next_turn_in_time_within_the_window(group) -> None:  # noqa: ANN001
    driver, add, _ = group
    name = driver._database  # noqa: SLF001
    await add("q", "user: which warehouse stores the invoices?", 0, [1.0, 0.0, 0.0])
    await add("a", "assistant: the Lisbon one, since March", 1, [0.0, 1.0, 0.0])
    await add("bye", "user: thanks, that's all for today", 2, [0.0, 0.0, 1.0])
    await add("parrots", "user: our parrots learned a new word", 60 * 24 * 7, [0.0, 0.0, 1.0])
    await add("far", "user: unrelated chatter", 60 * 24 * 9, [0.0, 0.0, 1.0])
    turns = GraphTurns()
    assert uuids(await turns.search(driver, name, "warehouse invoices", 2, followers=1)) == ["q", "a"]
    assert uuids(await turns.search(driver, name, "warehouse invoices", 2, followers=0)) == ["q"]
    # the next turn two days later is outside the window: none brought
    assert uuids(await turns.search(driver, name, "parrots", 2, followers=1)) == ["parrots"]
    # below the floor (cosine 0 to the question), a follower is not brought
    floored = await turns.search(driver, name, "warehouse invoices", 2, vector=[1.0, 0.0, 0.0],
                                 followers=1, min_cosine=0.99)
    assert uuids(floored) == ["q"]


def test_bm25_rescoring_puts_the_turn_with_the_rare_word_first() -> None:
    """RediSearch's TF-IDF ranked a turn repeating a common question word above the one holding
    the rare one (LoCoMo conv-26); BM25 with the group's frequencies does not."""
    candidates = [("common", "user: support, support and more support from my group, group, group"),
                  ("gold", "user: I went to an LGBTQ support group yesterday"),
                  ("none", "user: the weather is nice")]
    ranked = bm25_rescored("When did she go to the LGBTQ support group?", candidates,
                           {"lgbtq": 2, "support": 40, "group": 30, "go": 60}, 200, 5)
    assert [u for u, _ in ranked] == ["gold", "common"]  # "none" holds no question term
    assert ranked[0][1] > ranked[1][1] > 0
    assert bm25_rescored("the of", candidates, {}, 200, 5) == []
    assert bm25_rescored("LGBTQ", [], {"lgbtq": 2}, 200, 5) == []
    # a frequency the index did not count (0) is at least the candidates holding the term
    assert [u for u, _ in bm25_rescored("lgbtq", candidates, {}, 200, 5)] == ["gold"]
    # keep_unscored (a question matched by prefix): what no stem joins follows, in the index's order
    kept = bm25_rescored("lgbtq", candidates, {}, 200, 5, keep_unscored=True)
    assert kept[0][0] == "gold" and [u for u, s in kept[1:]] == ["common", "none"] and kept[1][1] == 0.0
    assert len(bm25_rescored("lgbtq", candidates, {}, 200, 2, keep_unscored=True)) == 2


async def test_the_keyword_half_ranks_as_the_in_memory_bm25(group) -> None:  # noqa: ANN001
    """Over the same turns, the graph's keyword half (fulltext candidates rescored by BM25 with the
    frequencies the index counts) orders turns as the in-memory index's BM25."""
    driver, add, _ = group
    name = driver._database  # noqa: SLF001
    texts = ["user (Ana): support support support, my support group group met again",
             "user (Ana): I went to an LGBTQ support group yesterday, it was powerful",
             "assistant (Bo): the adoption agency called about the interview",
             "user (Ana): my group of friends went hiking, lots of support",
             "assistant (Bo): painting a sunset with the kids this weekend",
             "user (Ana): the LGBTQ pride parade was last week"]
    for at, text in enumerate(texts):
        await add(f"e{at}", text, at)
    question = "When did Ana go to the LGBTQ support group?"
    memory = LexicalEpisodes()
    expected = [d.uuid for d, _ in (await memory._current(driver, name)).search(question, 10)]  # noqa: SLF001
    assert expected[0] == "e1"
    assert await keyword_ranking(driver._get_graph(None), name, question, 10) == expected  # noqa: SLF001


def test_a_question_with_non_ascii_letters_also_matches_by_prefix() -> None:
    assert keyword_query("When did they get the dog?") == "(When | did | get | dog)"
    assert "veritaban*" in keyword_query("Veritabanının çökmesi ne zaman oldu?")
    assert keyword_query("the of") == "" and keyword_query('x_y "(a)|b"') == "(x_y | b)"


def test_a_common_word_only_adds_to_what_the_other_words_select() -> None:
    assert keyword_query("When did Caroline go to the support group?", {"caroline"}) == \
        "(When | did | go | support | group) ~Caroline"
    assert keyword_query("Caroline?", {"caroline"}) == "(Caroline)"  # nothing else to select by
    assert keyword_query("Veritabanının çökmesi ne zaman oldu?", {"zaman"}).endswith(" ~zaman")
    assert "zam*" not in keyword_query("Veritabanının çökmesi ne zaman oldu?", {"zaman"})


async def test_a_word_counted_in_most_turns_stops_selecting_turns_alone(group,  # noqa: ANN001
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Once a word's count shows it in more than COMMON_SHARE of the turns (and more than
    COMMON_MIN_DOCS), a turn holding only it is no candidate: the lookup no longer scores every
    turn holding the name; the turns the other word selects rank as before."""
    driver, add, _ = group
    monkeypatch.setattr(turns_module, "DOC_FREQUENCIES", turns_module.DocFrequencies())
    monkeypatch.setattr(turns_module, "COMMON_MIN_DOCS", 5)
    for i in range(12):
        await add(f"c{i}", f"user: Caroline talked about the weather on day {i}", i)
    await add("dog", "user: Caroline adopted a dog from the shelter", 20)
    await add("cat", "user: Melanie adopted a cat", 21)
    graph = turns_module.falkor_graph(driver)
    name = driver._database  # noqa: SLF001
    first = await keyword_ranking(graph, name, "What did Caroline adopt?", 20)  # counts the words
    assert set(first[:2]) == {"dog", "cat"} and "c0" in first  # an OR: the name alone selected the weather
    again = await keyword_ranking(graph, name, "What did Caroline adopt?", 20)
    assert again == first[:2]  # "adopt" selects, ranked as before
    assert await keyword_ranking(graph, name, "Caroline", 20)  # the name alone still finds turns
    monkeypatch.setattr(turns_module, "COMMON_MIN_DOCS", 100)  # a small group: the name still selects
    assert "c0" in await keyword_ranking(graph, name, "What did Caroline adopt?", 20)


async def test_a_turkish_question_finds_the_turn_by_prefix(group) -> None:  # noqa: ANN001
    driver, add, _ = group
    name = driver._database  # noqa: SLF001
    await add("tr0", "user: Dün gece veritabanı çöktü, sabaha kadar uğraştım.", 0)
    await add("tr1", "user: Bir de kedim Pamuk bu hafta aşı oldu.", 1)
    hits = await GraphTurns().search(driver, name, "Veritabanının çökmesi ne zaman oldu?", 2)
    assert uuids(hits)[0] == "tr0"


async def drop_turn_vector_index(graph: Any) -> None:
    """Drop the turn vector index and wait until the graph no longer lists it (a query right
    after the drop could still be answered by it)."""
    await graph.query(TURN_VECTOR_INDEX.drop)
    for _ in range(100):
        if await vector_index_options(graph, TURN_VECTOR_INDEX) is None:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the turn vector index is still listed 5 s after its drop")


async def test_the_in_memory_index_answers_while_the_vector_index_cannot(group) -> None:  # noqa: ANN001
    driver, add, _ = group
    name = driver._database  # noqa: SLF001
    await add("e0", "user: we deploy nginx with ansible", 0, [1.0, 0.0, 0.0])
    graph = driver._get_graph(None)  # noqa: SLF001
    await drop_turn_vector_index(graph)  # an upgraded graph before its index is made
    fallback = LexicalEpisodes()
    turns = GraphTurns(fallback)
    assert uuids(await turns.search(driver, name, "nginx", 3, vector=[1.0, 0.0, 0.0])) == ["e0"]
    assert name in fallback.indexes
    assert await ensure_vector_index(graph, DIM, TURN_VECTOR_INDEX) == "created"


async def test_a_large_graph_answers_with_its_words_while_its_vector_index_cannot(group,  # noqa: ANN001
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Past FALLBACK_MAX_TURNS the in-memory index is not built per request (15-23 s a recall at
    60k turns while FalkorDB built the index): the keyword half answers alone."""
    driver, add, _ = group
    name = driver._database  # noqa: SLF001
    await add("k0", "user: we deploy nginx with ansible", 0, [1.0, 0.0, 0.0])
    await add("k1", "user: my cat likes the garden", 1, [0.0, 1.0, 0.0])
    graph = driver._get_graph(None)  # noqa: SLF001
    await drop_turn_vector_index(graph)
    monkeypatch.setattr(turns_module, "FALLBACK_MAX_TURNS", 1)
    fallback = LexicalEpisodes()
    before = turns_module.VECTOR_UNUSABLE.labels("keywords")._value.get()  # noqa: SLF001
    # the vector points at the cat turn: only the words can have found the nginx one
    assert uuids(await GraphTurns(fallback).search(driver, name, "nginx", 3, vector=[0.0, 1.0, 0.0])) == ["k0"]
    assert name not in fallback.indexes
    assert turns_module.VECTOR_UNUSABLE.labels("keywords")._value.get() == before + 1  # noqa: SLF001
    assert await ensure_vector_index(graph, DIM, TURN_VECTOR_INDEX) == "created"


async def test_word_frequencies_are_counted_once_while_the_group_holds_still(group,  # noqa: ANN001
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A word's document frequency is a lookup of every turn holding it: counted once, reused while
    the group's turn count stays within the drift, counted again past it; the ranking is the same."""
    driver, add, sent = group
    monkeypatch.setattr(turns_module, "DOC_FREQUENCIES", turns_module.DocFrequencies())
    for i in range(20):
        await add(f"d{i}", f"user: the deploy of service {i} went fine", i)
    await add("n0", "user: the nginx deploy broke the config", 30)
    graph = turns_module.falkor_graph(driver)  # the fixture's recorded graph
    name = driver._database  # noqa: SLF001

    def counted() -> int:
        return sum(q == Q_DOC_FREQ for q in sent)

    first = await keyword_ranking(graph, name, "nginx deploy", 5)
    assert first[0] == "n0" and counted() == 1
    assert await keyword_ranking(graph, name, "nginx deploy", 5) == first and counted() == 1
    await keyword_ranking(graph, name, "nginx config", 5)  # a new word: counted, alone
    assert counted() == 2
    await add("n1", "user: nginx again", 31)  # 21 -> 22 turns: past the 2% drift
    assert (await keyword_ranking(graph, name, "nginx deploy", 5))[0] in {"n0", "n1"} and counted() == 3


def test_kept_frequencies_expire_and_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(turns_module.time, "monotonic", lambda: clock[0])
    kept = turns_module.DocFrequencies(max_words=2, drift=0.02, ttl_s=60)
    index = ("g", "q")
    kept.put(index, {"a": 5, "b": 7}, 1000)
    assert kept.get(index, ["a", "b", "c"]) == {"a": (5, 1000), "b": (7, 1000)}
    assert kept.current(1000, 1020) and not kept.current(1000, 1021) and not kept.current(1000, 979)
    kept.put(index, {"c": 1}, 1000)  # the least recently used ("a") goes
    assert set(kept.get(index, ["a", "b", "c"])) == {"b", "c"}
    clock[0] += 61
    assert kept.get(index, ["b", "c"]) == {}
    assert kept.get(("other", "q"), ["b"]) == {}


class CountingEmbedder(HashingEmbedder):
    """The hashing embedder, counting the questions it embeds."""

    def __init__(self) -> None:
        super().__init__(dim=DIM * 32)
        self.questions: list[str] = []

    async def create_query(self, text: str) -> list[float]:
        self.questions.append(text)
        return await self.create([text])


async def test_the_service_lists_nothing_embeds_once_and_sees_a_delete_at_once(falkordb_server, tmp_path,  # noqa: ANN001
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Recall with two scopes: the question is embedded once for both and cached by model and
    text; no request lists a group's episodes or facts (the in-memory index's per-request rule:
    this fails with turn_index=memory); a turn deleted is gone from the next answer."""
    listings: list[str] = []
    real_listing = lexical_module.episode_listing

    async def counted(driver: Any, group_id: str, source: Any = lexical_module.EPISODES) -> Any:
        listings.append(group_id)
        return await real_listing(driver, group_id, source)

    monkeypatch.setattr(lexical_module, "episode_listing", counted)
    settings = EngramSettings(graph_url=falkordb_server.url, data_dir=tmp_path, group_prefix=f"t{uuid.uuid4().hex[:6]}")
    embedder = CountingEmbedder()
    recall = Recall(settings, embedder=embedder, facts_from="rules")
    recall.configure(RecallSettings(dense_episodes=True, turn_index="graph"))
    user, session = subjects.user_group(settings.group_prefix, "ada"), subjects.session_group(settings.group_prefix, "s1")
    try:
        for group, text in ((user, "user: the billing service runs on Postgres"),
                            (session, "user: the billing invoices go out on Mondays")):
            driver = await recall.graph.driver(group)
            await driver.execute_query(
                "CREATE (:Episodic {uuid: $u, group_id: $g, content: $c, created_at: $t, valid_at: $t})",
                u=f"{group}-0", g=group, c=text, t=T0.isoformat())
            await _operational(driver._get_graph(None))  # noqa: SLF001
        request = RecallRequest(query="what about billing?", scopes=RecallScopes(user="ada", session="s1"), max_facts=5)
        first = await recall.recall(request)
        assert {i.group_id for i in first.items if i.kind == "episode"} == {user, session}
        assert embedder.questions == ["what about billing?"]  # once for both scopes
        await recall.recall(request)
        assert embedder.questions == ["what about billing?"]  # cached
        assert list(recall.query_vectors) == [(recall.embedder_key, "what about billing?")]
        driver = await recall.graph.driver(user)
        await driver.execute_query("MATCH (e:Episodic {uuid: $u}) DETACH DELETE e", u=f"{user}-0")
        after = await recall.recall(request)
        assert {i.uuid for i in after.items if i.kind == "episode"} == {f"{session}-0"}
        assert listings == []  # nothing listed, however many requests
    finally:
        for group in (user, session):
            await recall.graph.driver_for(group)._get_graph(None).delete()  # noqa: SLF001
        await recall.stop()


async def test_a_request_that_falls_back_to_ranks_weighs_the_turns_as_ranks_does(
        group, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    """fusion=scores puts facts and turns on one scale through the vector index path; a request
    whose facts come from graphiti's search (a time window) is fused by place, and its turns then
    weigh what ranks' weight says, not the scores' weight."""
    from graphiti_core.graphiti_types import GraphitiClients
    from graphiti_core.tracer import NoOpTracer

    from engram.services.extractor.app import NoRerank
    from engram.services.recall import search as search_module
    from engram.services.recall.app import _NoLLM
    from engram.services.recall.time_window import TimeWindow

    driver, add, _ = group
    await add("t1", "user: we moved billing to SQLite", 0, [1.0, 0.0, 0.0])
    clients = GraphitiClients(driver=driver, llm_client=_NoLLM(), embedder=HashingEmbedder(dim=8),  # unused: the vector is given
                              cross_encoder=NoRerank(), tracer=NoOpTracer())
    fused: list[tuple[float, bool]] = []
    real_fuse = search_module.fuse

    def recorded(facts: Any, turns: Any, limit: int, weight: float, by_score: bool = False) -> Any:
        fused.append((weight, by_score))
        return real_fuse(facts, turns, limit, weight, by_score=by_score)

    monkeypatch.setattr(search_module, "fuse", recorded)
    window = TimeWindow.of(RecallRequest(query="billing", as_of=T0 + timedelta(days=1)))
    for w in (None, window):
        items = await search_module.search_group(
            clients, driver._database, None, "billing", 5, query_vector=[1.0, 0.0, 0.0],  # noqa: SLF001
            lexical=GraphTurns(), dense_episodes=True, fusion="scores", episode_weight=1.5,
            ranks_episode_weight=1.1, window=w)
        assert [i.uuid for i in items] == ["t1"]
    assert fused == [(1.5, True), (1.1, False)]
