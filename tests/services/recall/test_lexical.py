"""BM25 over a group's episodes (services/recall/lexical.py): ranking, incremental updates and
rebuild after deletes against a real FalkorDB graph."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone

from graphiti_core.driver.falkordb_driver import FalkorDriver

from services.recall.lexical import Doc, EpisodeIndex, LexicalEpisodes, tokens
from tests.services.extractor.test_pipeline import _host_port

T0 = datetime(2024, 1, 1, tzinfo=timezone.utc)


def doc(i: int, text: str) -> Doc:
    words = tokens(text)
    return Doc(f"d{i}", text, None, None, Counter(words), len(words))


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


async def test_index_follows_the_graph(falkordb_server) -> None:  # noqa: ANN001
    host, port = _host_port(falkordb_server.url)
    group = f"lex_{uuid.uuid4().hex[:8]}"
    driver = FalkorDriver(host=host, port=port, database=group)
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
