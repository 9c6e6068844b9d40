"""Recall shaped by the graph (issue 24, item 4): entity-centric retrieval, fact-augmented turn
keys and the relevance floor. Pure parts first, then each against a real stack (turn-detector,
extractor with the offline rules model, recall; real NATS and FalkorDB)."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from engram.graph.drivers import GraphDrivers
from engram.schemas import subjects
from engram.services.recall.entities import entity_fact_ranking, named_entities, phrases
from engram.services.recall.lexical import FACTS, Doc, EpisodeIndex, LexicalEpisodes
from engram.services.recall.search import ENGLISH_STOPWORDS
from tests.services.recall.test_fact_changes import MONDAY, USER, _say
from tests.services.recall.test_service import stack


def test_phrases_take_off_possessives_and_edge_punctuation_and_skip_one_word_stopwords() -> None:
    found = phrases("What did Caroline's sister say about Node.js?", ENGLISH_STOPWORDS)
    assert "caroline" in found and "node.js" in found and "caroline sister" in found
    assert "what" not in found and "did" not in found  # one stopword names nothing
    assert "say about" in found  # longer phrases are kept: a name may hold a stopword ("Bank of America")
    assert phrases("") == [] and phrases("?? !!") == []
    assert len(max(phrases("a b c d e f g"), key=len).split()) == 4  # MAX_NAME_WORDS


def clients_embedder(settings):  # noqa: ANN001, ANN201 - the suite's embedder, as the stack's extractor has it
    from engram.models.factory import EmbedderSettings, build_embedder
    return build_embedder(EmbedderSettings())


def _doc(uuid: str, content: str, facts: str = "", vector: list[float] | None = None) -> Doc:
    doc = Doc.of({"uuid": uuid, "content": content, "vector": vector}, facts.split("|") if facts else ())
    return doc


def test_a_turn_is_found_by_the_words_of_its_facts() -> None:
    # The turn never says "adoption": its fact does (LongMemEval's K = V + fact).
    plain = EpisodeIndex.of([_doc("t1", "I went to that meeting about it yesterday, so moving!"),
                             _doc("t2", "The weather was lovely by the lake.")])
    keyed = EpisodeIndex.of([_doc("t1", "I went to that meeting about it yesterday, so moving!",
                                  "Caroline attended an adoption council meeting."),
                             _doc("t2", "The weather was lovely by the lake.")])
    assert plain.search("adoption meeting Caroline", 5)[0][0].uuid == "t1"  # "meeting" alone
    assert plain.search("adoption Caroline", 5) == []
    assert [d.uuid for d, _ in keyed.search("adoption Caroline", 5)] == ["t1"]
    # what recall shows is the turn, not its key
    assert keyed.search("adoption", 1)[0][0].content.startswith("I went")


def test_the_floor_keeps_dense_only_turns_at_or_above_it_and_words_always_count() -> None:
    q = [1.0, 0.0]
    index = EpisodeIndex.of([
        _doc("shares-a-word", "billing moved", vector=[0.0, 1.0]),            # cosine 0, a shared word
        _doc("similar", "our payments store changed", vector=[0.9, 0.1]),     # cosine ~0.99
        _doc("unlike", "thanks, that's all for today", vector=[0.2, 0.98]),   # cosine ~0.2
    ])
    everything = {d.uuid for d, _ in index.hybrid("billing", q, 10)}
    assert everything == {"shares-a-word", "similar", "unlike"}
    floored = {d.uuid for d, _ in index.hybrid("billing", q, 10, min_cosine=0.5)}
    assert floored == {"shares-a-word", "similar"}


def test_the_floor_takes_no_dense_vote_from_a_turn_the_keywords_found() -> None:
    from engram.services.recall.lexical import Doc, fuse_turns

    a, b, c = Doc("a", ""), Doc("b", ""), Doc("c", "")
    keyword = [(b, 0.0), (a, 0.0)]
    dense = [(a, 0.79), (c, 0.78)]
    # "a" is second by words and first by vector, below the floor: it keeps its vote, so it leads;
    # "c", found by its vector alone below the floor, stays out
    assert [d.uuid for d, _ in fuse_turns(keyword, dense, 10, min_cosine=0.8)] == ["a", "b"]
    assert [d.uuid for d, _ in fuse_turns(keyword, dense, 10)] == ["a", "b", "c"]


def test_the_floor_takes_no_vector_vote_from_a_fact_another_ranking_found() -> None:
    from engram.services.recall.vector import above_floor

    nearest = [("f1", 0.79), ("f2", 0.85), ("f3", 0.5)]
    assert above_floor(nearest, 0.8, [["f1"], []]) == [("f1", 0.79), ("f2", 0.85)]
    assert above_floor(nearest, 0.8, [[], ["f3"]]) == [("f2", 0.85), ("f3", 0.5)]  # the entity ranking's
    assert above_floor(nearest, None, [[]]) == nearest


async def test_entities_named_in_the_question_bring_their_facts_and_turns_are_found_by_facts(
    clean_nats, falkordb_server, tmp_path  # noqa: ANN001
) -> None:
    async with stack(clean_nats, falkordb_server.url, tmp_path) as (nc, settings):
        await _say(nc, "s1", MONDAY, "I researched adoption agencies in Sweden.", "Good luck.")
        await _say(nc, "s2", MONDAY + timedelta(days=1), "I painted Lake Tahoe at sunrise.", "Lovely.")
        await _say(nc, "s3", MONDAY + timedelta(days=2), "I run a pottery class at Clayworks on Tuesdays.", "Nice.")
        group = subjects.user_group(settings.group_prefix, USER.user)
        graph = GraphDrivers(settings)
        try:
            driver = await graph.driver(group)
            assert len(await named_entities(driver, group, "When did I paint lake tahoe?", ENGLISH_STOPWORDS)) == 1
            assert await named_entities(driver, group, "What did the team research?", ENGLISH_STOPWORDS) == []
            vector = await clients_embedder(settings).create(['pottery class'])
            ranked = await entity_fact_ranking(driver, group, "What happens at Clayworks?", vector, 10,
                                               stopwords=ENGLISH_STOPWORDS)
            rows = await driver.execute_query(
                "MATCH ()-[r:RELATES_TO]->() WHERE r.uuid IN $u RETURN r.fact AS fact", u=[u for u, _ in ranked])
            facts = [r["fact"] for r in rows[0]]
            assert facts and all("Clayworks" in f for f in facts), facts  # not Sweden's, not Lake Tahoe's
            # Ada is the subject of every fact (4 edges: the pottery class is at Clayworks and on Tuesdays)
            assert len(await entity_fact_ranking(driver, group, "What does Ada do?", vector, 10,
                                                 stopwords=ENGLISH_STOPWORDS)) == 4
            # a floor above every similarity leaves nothing
            assert await entity_fact_ranking(driver, group, "What happens at Clayworks?", vector, 10, min_cosine=1.01,
                                             stopwords=ENGLISH_STOPWORDS) == []

            # fact-augmented keys: the index reads each turn's facts with it
            lexical = LexicalEpisodes(fact_keys=True)
            index = await lexical._current(driver, group)
            keyed = [d for d in index.docs if d is not None and d.facts]
            assert keyed and any("Clayworks" in d.facts for d in keyed)
            assert not any(d.facts for d in (await LexicalEpisodes()._current(driver, group)).docs if d is not None)

            # BM25 over the current facts' text: stemmed ("paintings" finds "painted")
            facts_index = LexicalEpisodes(source=FACTS)
            found = await facts_index.search(driver, group, "paintings of lakes", 5)
            assert found and "Lake Tahoe" in found[0][0].content
            # a fact that ends leaves the index on the next search
            await driver.execute_query("MATCH ()-[r:RELATES_TO]->() WHERE r.uuid = $u SET r.expired_at = $t",
                                       u=found[0][0].uuid, t=MONDAY.isoformat())
            assert all("Lake Tahoe" not in d.content for d, _ in await facts_index.search(driver, group, "lake", 5))
        finally:
            await graph.close()


def test_unit_vectors_used_by_the_floor_are_cosines() -> None:
    doc = _doc("x", "text", vector=[3.0, 4.0])
    assert doc.vector is not None and np.isclose(float(doc.vector @ np.array([0.6, 0.8], np.float32)), 1.0)


def test_score_fusion_puts_what_both_halves_found_first_across_facts_and_turns() -> None:
    from engram.schemas import RecallItem
    from engram.services.recall.search import fuse

    def item(uuid: str, kind: str, score: float) -> RecallItem:
        return RecallItem(uuid=uuid, fact=uuid, kind=kind, score=score, group_id="g")  # type: ignore[arg-type]

    both = 1 / 61 + 1 / 62      # ranked 1st and 2nd by its two halves (RRF, k 60)
    one = 1 / 61                # found by one half only, at its top
    facts = [item("fact-one-half", "fact", one)]
    turns = [item("turn-both", "episode", both), item("turn-one-half", "episode", one)]
    # by place, each list's first ties: the fact's comes first though one half alone found it
    assert [i.uuid for i in fuse(facts, turns, 3)] == ["fact-one-half", "turn-both", "turn-one-half"]
    # by score, what both halves found comes first, fact or turn; each item keeps its score
    fused = fuse(facts, turns, 3, by_score=True)
    assert [i.uuid for i in fused] == ["turn-both", "fact-one-half", "turn-one-half"]
    assert fused[0].score == round(both, 6)
    # the episode weight scales the turns' scores only
    assert [i.uuid for i in fuse(facts, turns, 3, episode_weight=0.5, by_score=True)][0] == "fact-one-half"


def test_the_fusion_and_turn_weight_follow_who_extracts_the_facts(tmp_path) -> None:  # noqa: ANN001
    """Unset, the fusion and the turns' weight are the ones chosen on the tuning split for who
    extracts the facts; scores needs the turns' vector ranking (hashing: ranks); a setting given
    wins; a request that falls back to ranks weighs the turns as ranks does."""
    from graphiti_core.embedder.client import EmbedderClient

    from engram.models.hashing_embedder import HashingEmbedder
    from engram.services.recall.app import EPISODE_WEIGHT_BY_EXTRACTOR, Recall, RecallSettings
    from engram.settings import EngramSettings

    class Semantic(EmbedderClient):  # any embedder but the hashing one counts as semantic
        dim = 8

        async def create(self, input_data):  # noqa: ANN001, ANN201
            return [1.0] * self.dim

        async def create_batch(self, input_data_list):  # noqa: ANN001, ANN201
            return [[1.0] * self.dim for _ in input_data_list]

    settings = EngramSettings(data_dir=tmp_path)
    rules = Recall(settings, embedder=Semantic(), facts_from="rules")
    assert (rules.fusion, rules.episode_weight, rules.ranks_episode_weight) == ("scores", 1.5, 1.1)
    model = Recall(settings, embedder=Semantic(), facts_from="model")
    assert (model.fusion, model.episode_weight, model.ranks_episode_weight) == ("ranks", 0.8, 0.8)
    hashing = Recall(settings, embedder=HashingEmbedder(dim=8), facts_from="rules")
    assert (hashing.fusion, hashing.episode_weight) == ("ranks", 1.1)
    rules.configure(RecallSettings(fusion="ranks"))
    assert (rules.fusion, rules.episode_weight) == ("ranks", EPISODE_WEIGHT_BY_EXTRACTOR["rules", "ranks"])
    model.configure(RecallSettings(fusion="scores", episode_weight=2.0))
    assert (model.fusion, model.episode_weight, model.ranks_episode_weight) == ("scores", 2.0, 2.0)
