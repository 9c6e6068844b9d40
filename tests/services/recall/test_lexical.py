"""BM25 over a group's episodes (services/recall/lexical.py): ranking, incremental updates,
deletes followed by inserts, and the bounded LRU of group indexes, against a real FalkorDB graph."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta, timezone

import pytest
from graphiti_core.driver.falkordb_driver import FalkorDriver
from prometheus_client import REGISTRY

from engram.compat import take_index_build
from engram.settings import EngramSettings
from engram.services.recall.app import Recall
from engram.services.recall.lexical import Doc, EpisodeIndex, LexicalEpisodes, tokens
from tests.services.extractor.test_pipeline import _host_port

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


async def _index_build_done(driver: FalkorDriver) -> None:
    """Wait for the index build the driver's constructor scheduled: a GRAPH.DELETE at the end of a
    fast test while FalkorDB still builds that graph's indices took the shared test server down
    (an indexer-thread crash, FalkorDB 4.16.3; docs/architecture.md, deleting a group)."""
    task = take_index_build(driver)
    if task is not None:
        await task


def doc(i: int, text: str) -> Doc:
    return Doc.of({"uuid": f"d{i}", "content": text})


def test_bm25_ranks_rare_terms_and_ignores_stopwords() -> None:
    index = EpisodeIndex()
    texts = ["Caroline went to the support group in Boston", "Melanie painted a lake sunrise",
             "the the the group", "Caroline and Melanie talked about the group and the painting"]
    for i, t in enumerate(texts):
        index.add(doc(i, t))
    hits = index.search("Where did Caroline go for the support group?", 4)
    assert hits[0][0].uuid == "d0"
    assert index.search("painted lake sunrise", 1)[0][0].uuid == "d1"
    assert index.search("the of and", 3) == []  # only stopwords
    assert index.search("zebra", 3) == []


def vdoc(i: int, text: str, vector: list[float] | None) -> Doc:
    return Doc.of({"uuid": f"d{i}", "content": text, "vector": vector})


def test_nearest_ranks_by_cosine_and_skips_turns_without_a_usable_vector() -> None:
    index = EpisodeIndex.of([
        vdoc(0, "we adopted a puppy", [1.0, 0.0, 0.0]),
        vdoc(1, "the dog chewed my shoes", [0.9, 0.1, 0.0]),
        vdoc(2, "tax forms are due", [0.0, 0.0, 1.0]),
        vdoc(3, "no vector stored yet", None),
        vdoc(4, "written by another embedder", [1.0, 0.0]),  # other dimension
        vdoc(5, "all zeros", [0.0, 0.0, 0.0]),
    ])
    assert [d.uuid for d, _ in index.nearest([2.0, 0.1, 0.0], 10)] == ["d0", "d1", "d2"]
    assert [d.uuid for d, _ in index.nearest([0.0, 0.0, 1.0], 1)] == ["d2"]
    assert index.nearest(None, 3) == [] and index.nearest([0.0, 0.0, 0.0], 3) == []
    # the vector counts against the memory bound: 3 float32s = 12 bytes besides the text
    assert index.docs[0].held_bytes == len(b"we adopted a puppy") + 12
    assert index.docs[3].held_bytes == len(b"no vector stored yet")
    # a change drops the cached matrix: a removed turn is never returned, an added one is
    index.remove("d0")
    index.add(vdoc(6, "kitten", [0.0, 1.0, 0.0]))
    assert [d.uuid for d, _ in index.nearest([0.1, 1.0, 0.0], 2)] == ["d6", "d1"]


def test_hybrid_finds_a_turn_sharing_no_word_with_the_question() -> None:
    """The reason for the dense half: "dog" never meets "puppy" in BM25."""
    index = EpisodeIndex.of([
        vdoc(0, "we adopted a puppy last week", [1.0, 0.0, 0.0]),
        vdoc(1, "my dog food order arrived", [0.2, 0.0, 1.0]),
        vdoc(2, "tax forms are due", [0.0, 1.0, 0.0]),
    ])
    question, vector = "When did they get the dog?", [1.0, 0.0, 0.1]
    assert [d.uuid for d, _ in index.search(question, 3)] == ["d1"]
    hybrid = [d.uuid for d, _ in index.hybrid(question, vector, 3)]
    assert hybrid[:2] == ["d1", "d0"] or hybrid[:2] == ["d0", "d1"]
    assert "d0" in hybrid and len(hybrid) == 3
    # reciprocal rank, equal weights: first in both rankings beats first in one
    both = EpisodeIndex.of([vdoc(0, "hiking trail", [1.0, 0.0]), vdoc(1, "hiking", [0.0, 1.0]),
                            vdoc(2, "kayak", [0.9, 0.1])])
    assert [d.uuid for d, _ in both.search("hiking trail", 3)] == ["d0", "d1"]
    assert [d.uuid for d, _ in both.nearest([1.0, 0.0], 3)] == ["d0", "d2", "d1"]
    # d0 first in both; d1 second + third beats d2 second in one ranking only
    assert [d.uuid for d, _ in both.hybrid("hiking trail", [1.0, 0.0], 3)] == ["d0", "d1", "d2"]
    assert [d.uuid for d, _ in index.hybrid(question, None, 3)] == ["d1"]  # no vector: BM25 alone


def test_removed_documents_score_as_if_never_added() -> None:
    texts = ["nginx on staging", "nginx crashed again", "postgres backups", "nginx and postgres", "redis"]
    index = EpisodeIndex.of([doc(i, t) for i, t in enumerate(texts)])
    index.remove("d1")
    fresh = EpisodeIndex.of([doc(i, t) for i, t in enumerate(texts) if i != 1])
    for query in ("nginx", "postgres nginx", "crashed", "redis staging"):
        assert [(d.uuid, round(s, 9)) for d, s in index.search(query, 5)] == \
               [(d.uuid, round(s, 9)) for d, s in fresh.search(query, 5)]
    assert index.compacted() is index  # one hole in five
    index.remove("d0")
    index.remove("d2")
    compact = index.compacted()
    assert compact is not index and [d.uuid for d in compact.docs] == ["d3", "d4"]
    assert compact.held_bytes == index.held_bytes and compact.total_length == index.total_length


async def test_index_follows_the_graph(falkordb_server) -> None:  # noqa: ANN001
    host, port = _host_port(falkordb_server.url)
    group = f"lex_{uuid.uuid4().hex[:8]}"
    driver = FalkorDriver(host=host, port=port, database=group)
    await _index_build_done(driver)
    try:
        async def add(i: int, text: str) -> None:
            await driver.execute_query(
                "CREATE (:Episodic {uuid: $u, group_id: $g, content: $c, created_at: $t, valid_at: $t})",
                u=f"e{i}", g=group, c=text, t=(T0 + timedelta(minutes=i)).isoformat(),
            )

        lexical = LexicalEpisodes()
        await add(0, "user: we deploy nginx with ansible")
        assert [d.uuid for d, _ in await lexical.search(driver, group, "nginx", 5)] == ["e0"]
        await add(1, "user: nginx crashed on staging")
        await add(2, "assistant: restart nginx and check the logs")
        assert {d.uuid for d, _ in await lexical.search(driver, group, "nginx", 5)} == {"e0", "e1", "e2"}
        assert len(lexical.indexes[group].docs) == 3  # appended, not rebuilt
        await driver.execute_query("MATCH (e:Episodic {uuid: 'e1'}) DELETE e")
        assert {d.uuid for d, _ in await lexical.search(driver, group, "nginx", 5)} == {"e0", "e2"}
        assert await lexical.search(driver, "lex_empty_group", "nginx", 5) == []
    finally:
        await driver.client.select_graph(group).delete()
        await driver.close()


class CountingDriver:
    """The real driver, with each query's row count recorded (the refresh rule must stay cheap)."""

    def __init__(self, driver: FalkorDriver) -> None:
        self.driver = driver
        self.provider = driver.provider
        self.rows: list[int] = []

    async def execute_query(self, query: str, **params):  # noqa: ANN003, ANN201
        result = await self.driver.execute_query(query, **params)
        self.rows.append(len(result[0]))
        return result


@pytest.fixture
async def graph(falkordb_server) -> AsyncIterator[tuple[FalkorDriver, Callable[..., Awaitable[None]]]]:  # noqa: ANN001
    """A fresh FalkorDB graph and ``add(group, uuid, text, minute)`` writing an Episodic node."""
    host, port = _host_port(falkordb_server.url)
    name = f"lex_{uuid.uuid4().hex[:8]}"
    driver = FalkorDriver(host=host, port=port, database=name)
    await _index_build_done(driver)

    async def add(group: str, uid: str, text: str, minute: int) -> None:
        await driver.execute_query(
            "CREATE (:Episodic {uuid: $u, group_id: $g, content: $c, created_at: $t, valid_at: $t})",
            u=uid, g=group, c=text, t=(T0 + timedelta(minutes=minute)).isoformat(),
        )

    try:
        yield driver, add
    finally:
        await driver.client.select_graph(name).delete()
        await driver.close()


async def delete(driver: FalkorDriver, uid: str) -> None:
    await driver.execute_query("MATCH (e:Episodic {uuid: $u}) DETACH DELETE e", u=uid)


async def found(lexical: LexicalEpisodes, driver: object, group: str, query: str) -> set[str]:
    return {d.uuid for d, _ in await lexical.search(driver, group, query, 10)}


@pytest.mark.parametrize("new_minute", [10, -10], ids=["newest", "older-than-indexed"])
async def test_an_episode_written_after_a_delete_is_indexed(graph, new_minute: int) -> None:  # noqa: ANN001
    """Issue 10 item 9: the count stays 2 after delete + insert, and the rule by count never read
    the new episode. "older-than-indexed": the writer's clock is behind, so neither would the
    newest created_at have told."""
    driver, add = graph
    lexical = LexicalEpisodes()
    await add("g", "e0", "user: we deploy nginx with ansible", 0)
    await add("g", "e1", "user: nginx crashed on staging", 1)
    assert await found(lexical, driver, "g", "nginx") == {"e0", "e1"}
    await delete(driver, "e1")
    await add("g", "e2", "user: the kubernetes upgrade is on friday", new_minute)
    assert await found(lexical, driver, "g", "kubernetes") == {"e2"}
    assert await found(lexical, driver, "g", "nginx") == {"e0"}
    assert await found(lexical, driver, "g", "staging") == set()
    # and the same again on the index it keeps
    await delete(driver, "e0")
    await add("g", "e3", "assistant: ansible playbook for the kubernetes nodes", new_minute - 1)
    assert await found(lexical, driver, "g", "kubernetes") == {"e2", "e3"}
    assert await found(lexical, driver, "g", "nginx") == set()


@pytest.mark.parametrize("uid", ["e\x1fx", "plain"], ids=["uuid-with-separator", "list-query"])
async def test_uuid_edge_cases_never_hide_an_episode(graph, uid: str) -> None:  # noqa: ANN001
    """A uuid holding the join separator, and the plain list query other backends use."""
    driver, add = graph
    reader = CountingDriver(driver)
    if uid == "plain":
        reader.provider = None  # the collect() query, as on Neo4j
    lexical = LexicalEpisodes()
    await add("g", "e0", "user: nginx", 0)
    assert await found(lexical, reader, "g", "nginx") == {"e0"}
    await delete(driver, "e0")
    await add("g", uid, "user: kubernetes", 1)
    assert await found(lexical, reader, "g", "kubernetes") == {uid}
    assert await found(lexical, reader, "g", "kubernetes nginx") == {uid}


async def test_refresh_reads_only_what_changed(graph) -> None:  # noqa: ANN001
    driver, add = graph
    counting = CountingDriver(driver)
    lexical = LexicalEpisodes()
    for i in range(6):
        await add("g", f"e{i}", f"user: turn {i} about postgres", i)
    assert len(await found(lexical, counting, "g", "postgres")) == 6
    assert counting.rows == [1, 6]  # the uuid list (one row), then every episode once
    counting.rows.clear()
    await found(lexical, counting, "g", "postgres")
    assert counting.rows == [1]  # unchanged: the uuid list only
    counting.rows.clear()
    await add("g", "e6", "user: postgres backups", 6)
    assert "e6" in await found(lexical, counting, "g", "backups postgres")
    assert counting.rows == [1, 1]  # the new episode only
    counting.rows.clear()
    await delete(driver, "e2")
    assert "e2" not in await found(lexical, counting, "g", "postgres")
    assert counting.rows == [1]  # a delete is applied in memory
    assert lexical.indexes["g"].uuids == {"e0", "e1", "e3", "e4", "e5", "e6"}


async def test_lru_bounds_groups_and_bytes_and_rebuilds_what_it_evicted(graph) -> None:  # noqa: ANN001
    driver, add = graph
    before = {r: evictions(r) for r in ("groups", "bytes", "too_large")}
    for n, group in enumerate(("g1", "g2", "g3")):
        await add(group, f"{group}-a", f"user: {group} talks about redis", n)
    lexical = LexicalEpisodes(max_groups=2)
    for group in ("g1", "g2", "g3"):
        assert await found(lexical, driver, group, "redis") == {f"{group}-a"}
    assert list(lexical.indexes) == ["g2", "g3"]
    assert evictions("groups") == before["groups"] + 1
    assert len(lexical.locks) == 0  # no lock kept for a group no request is using

    # g1 changes while it is out of memory; its rebuild reads the graph as it is now
    await delete(driver, "g1-a")
    await add("g1", "g1-b", "user: g1 moved to valkey", 9)
    assert await found(lexical, driver, "g1", "redis valkey") == {"g1-b"}
    assert list(lexical.indexes) == ["g3", "g1"]
    await found(lexical, driver, "g3", "redis")  # a hit makes g3 the most recently used
    assert list(lexical.indexes) == ["g1", "g3"]

    # bytes: room for two groups' text, not three
    sizes = {g: len(f"user: {g} talks about redis".encode()) for g in ("g2", "g3")}
    by_bytes = LexicalEpisodes(max_groups=10, max_bytes=sizes["g2"] + sizes["g3"])
    for group in ("g1", "g2", "g3"):
        await found(by_bytes, driver, group, "redis")
    assert list(by_bytes.indexes) == ["g2", "g3"]
    assert by_bytes.indexed_bytes == sizes["g2"] + sizes["g3"]
    assert evictions("bytes") == before["bytes"] + 1
    assert await found(by_bytes, driver, "g1", "valkey") == {"g1-b"}
    assert list(by_bytes.indexes) == ["g3", "g1"]

    # one group larger than the bound: answered from a fresh index every time, never kept
    tiny = LexicalEpisodes(max_bytes=8)
    assert await found(tiny, driver, "g2", "redis") == {"g2-a"}
    await add("g2", "g2-b", "user: redis cluster", 10)
    assert await found(tiny, driver, "g2", "redis") == {"g2-a", "g2-b"}
    assert not tiny.indexes and tiny.indexed_bytes == 0
    assert evictions("too_large") == before["too_large"] + 2


def test_recall_settings_bound_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_RECALL_LEXICAL_MAX_GROUPS", "7")
    monkeypatch.setenv("ENGRAM_RECALL_LEXICAL_MAX_BYTES", "4096")
    recall = Recall(EngramSettings(graph_url="falkor://127.0.0.1:1"))
    assert (recall.memory_turns.max_groups, recall.memory_turns.max_bytes) == (7, 4096)  # turn_index=memory, Neo4j


def evictions(reason: str) -> float:
    return REGISTRY.get_sample_value("engram_recall_lexical_evictions_total", {"reason": reason}) or 0.0


# Issue 11 item 2: stems and stopwords in the conversation's language, from libraries.
TURKISH = [
    "user: Merhaba, dün gece üretimdeki veritabanı çöktü ve sabaha kadar uğraştık.",
    "assistant: Geçmiş olsun! Yedekten geri yükleme yapabildiniz mi?",
    "user: Evet, ama son iki saatin faturaları kayboldu, müşteriler şikayet ediyor.",
    "assistant: Faturaları ödeme sağlayıcısının kayıtlarından yeniden oluşturabiliriz.",
    "user: Ayrıca sunucu diski tamamen dolmuştu, loglar hiç temizlenmemiş.",
    "assistant: Log döndürmeyi açalım ve disk için bir uyarı kuralım.",
    "user: Bir de kedim Pamuk bu hafta aşı oldu, o yüzden geç yazıyorum.",
    "assistant: Pamuk'a da geçmiş olsun, umarım iyidir.",
]


def test_a_turkish_group_is_stemmed_in_turkish() -> None:
    index = EpisodeIndex.of([doc(i, t) for i, t in enumerate(TURKISH)])
    assert index.language == "turkish"
    # inflected otherwise than in the turns: veritabanı/veritabanının, sunucu/sunucunun, faturaları/faturanın
    assert index.search("Veritabanının çökmesi ne zaman oldu?", 1)[0][0].uuid == "d0"
    assert index.search("sunucunun diskinde ne vardı", 1)[0][0].uuid == "d4"
    assert index.search("Kedinin aşısı", 1)[0][0].uuid == "d6"
    # Turkish stopwords only: nothing to search for
    assert index.search("bu ve için de", 3) == []


def test_english_inflection_meets_the_turn() -> None:
    texts = ["user: the staging build is broken since the nginx upgrade", "user: I opened a ticket with the vendor",
             "user: lunch was great today", "assistant: the nginx config lives in /etc/nginx"]
    index = EpisodeIndex.of([doc(i, t) for i, t in enumerate(texts)])
    assert index.language == "english"
    # the only word shared with the turn is the inflected one
    assert [d.uuid for d, _ in index.search("what broke?", 3)] == ["d0"]
    assert [d.uuid for d, _ in index.search("did they open anything", 3)] == ["d1"]


def test_language_votes_need_evidence_and_follow_the_group() -> None:
    assert EpisodeIndex.of([doc(0, "nginx postgres redis")]).language == "english"  # no stopwords: English
    assert EpisodeIndex.of([doc(0, "de")]).language == "english"  # one shared word proves nothing
    # typed without diacritics, as in seed 004 ("icin", "degil"): still Turkish
    assert EpisodeIndex.of([doc(0, "Bu ayar icin degil, ama yine de bunu da deneyelim")]).language == "turkish"
    # an English group that becomes mostly Turkish is re-stemmed as Turkish, and back after deletes
    index = EpisodeIndex.of([doc(100, "user: the database crashed on staging and we were down")])
    assert index.search("database", 1)
    for i, t in enumerate(TURKISH):
        index.add(doc(i, t))
    assert index.language == "turkish"
    assert index.search("veritabanının", 1)[0][0].uuid == "d0"
    for i in range(len(TURKISH)):
        index.remove(f"d{i}")
    assert index.language == "english" and index.search("databases crashing", 1)[0][0].uuid == "d100"


def test_the_numpy_build_equals_bm25s_own() -> None:
    """lexical.BM25 only replaces bm25s's per-document build loop: same matrix, same scores."""
    import bm25s
    import numpy as np

    from engram.services.recall.lexical import BM25

    rng = np.random.default_rng(7)
    corpus = [rng.integers(0, 80, size=rng.integers(0, 40)).tolist() for _ in range(400)]
    vocab = {f"t{i}": i for i in range(90)}  # ids 80..89 in no document, as after deletes
    theirs = bm25s.BM25(k1=1.5, b=0.75, method="lucene")
    theirs.index((corpus, dict(vocab)), create_empty_token=False, show_progress=False)
    ours = BM25(k1=1.5, b=0.75, method="lucene")
    ours.index(([np.asarray(c, dtype=np.int32) for c in corpus], dict(vocab)), create_empty_token=False,
               show_progress=False)
    for query in ([1, 2, 3], [79], [5, 5, 60], [85], list(range(80))):
        assert np.array_equal(theirs.get_scores_from_ids(query), ours.get_scores_from_ids(query))


def test_warm_up_pays_the_first_english_term_at_start() -> None:
    """The recall service calls warm_up at start: the first recall (graph turn index: every one
    stems) does not load lemminflect's tables."""
    from engram.services.recall import lexical

    lexical.warm_up()
    before = lexical._term.cache_info().hits  # noqa: SLF001
    assert lexical._term("went", "english") == "go"  # noqa: SLF001
    assert lexical._term.cache_info().hits == before + 1  # noqa: SLF001
