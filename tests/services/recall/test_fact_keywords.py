"""The facts' keyword half through the graph's fulltext index ranked by BM25
(services/recall/fact_keywords.py), against the real FalkorDB of the test session."""

from __future__ import annotations

from typing import Any

import pytest

from engram.compat import falkor_graph
from engram.services.recall import turns as turns_module
from engram.services.recall.fact_keywords import bm25_fact_ranking
from tests.services.recall.test_vector import Graph, graph, vec, write_facts  # noqa: F401 - the fixture

RARE_LAST = [
    ("Ada likes the support group and the support people and the group support", vec(0)),
    ("Ada is grateful for the support system of her family", vec(10)),
    ("Ada went to an LGBTQ support group", vec(20)),
]


async def test_the_fact_with_the_rare_word_comes_first(graph: Graph) -> None:  # noqa: F811
    group = graph.group()
    driver = await graph.driver(group)
    edges = await write_facts(driver, group, RARE_LAST)
    ranked = await bm25_fact_ranking(falkor_graph(driver), group, "When did Ada go to the LGBTQ support group?", 10)
    assert ranked[0] == edges[2].uuid
    assert set(ranked) == {e.uuid for e in edges}


async def test_expired_facts_and_words_held_by_none_are_not_returned(graph: Graph) -> None:  # noqa: F811
    group = graph.group()
    driver = await graph.driver(group)
    current = await write_facts(driver, group, [("Ada drinks tea every morning", vec(0))])
    await write_facts(driver, group, [("Ada drinks coffee every morning", vec(5))], expired=True)
    raw: Any = falkor_graph(driver)
    assert await bm25_fact_ranking(raw, group, "What does Ada drink?", 10) == [current[0].uuid]  # stemmed; expired left out
    assert await bm25_fact_ranking(raw, group, "tea or coffee?", 10) == [current[0].uuid]
    assert await bm25_fact_ranking(raw, group, "bicycles", 10) == []
    assert await bm25_fact_ranking(raw, group, "", 10) == []


async def test_a_name_in_most_facts_stops_selecting_facts_alone(graph: Graph,  # noqa: F811
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """services/recall/turns.py ``keyword_query``'s ``common`` on the facts' index: once counted in
    most facts (COMMON_MIN_DOCS lowered for the test), the name only adds to the score of the facts
    another word selects."""
    monkeypatch.setattr(turns_module, "DOC_FREQUENCIES", turns_module.DocFrequencies())
    monkeypatch.setattr(turns_module, "COMMON_MIN_DOCS", 2)
    group = graph.group()
    driver = await graph.driver(group)
    edges = await write_facts(driver, group, [("Ada adopted a puppy", vec(0)), ("Ada drinks tea every morning", vec(5)),
                                              ("Ada paints on Sundays", vec(10)), ("Ada reads novels", vec(15))])
    raw: Any = falkor_graph(driver)
    question = "What did Ada adopt?"
    first = await bm25_fact_ranking(raw, group, question, 10)  # the words counted meanwhile: an OR
    assert first[0] == edges[0].uuid and len(first) == 4
    assert await bm25_fact_ranking(raw, group, question, 10) == [edges[0].uuid]
