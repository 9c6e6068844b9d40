"""The facts' keyword half through the graph's own fulltext index, ranked by BM25: recall's
``ENGRAM_RECALL_FACT_BM25`` with ``turn_index=graph`` (FalkorDB's default).

Why: the RELATES_TO fulltext index's own score (RediSearch's TF-IDF as FalkorDB runs it) ranks
text badly for recall: on past turns it put an evidence turn in its first 5 for 41.3% of LoCoMo
conv-26's questions against 72.7% by BM25 (services/recall/turns.py). The turns' keyword half was
rescored for that reason; the facts' half kept the index's order, and ``fact_bm25`` applied to
``turn_index=memory`` only, which lists every fact of a group per request. Here, as for turns,
nothing is listed or kept: the index's best ``RESCORE_DEPTH x depth`` current facts for an OR of
the question's words come back with their text, each word's document frequency is counted by
the index (over the graph, which on FalkorDB is the group: expired facts counted too, an
estimate; reused while the fact count holds within 2%, ``turns.DocFrequencies``) and the facts are ranked again by BM25, the same code as turns
(:func:`engram.services.recall.turns.rescored_keyword_ranking`).
"""

from __future__ import annotations

from typing import Any

from engram.services.recall.turns import rescored_keyword_ranking

Q_FACT_TEXT = (
    "CALL db.idx.fulltext.queryRelationships('RELATES_TO', $query) YIELD relationship AS e, score "
    "WITH e, score ORDER BY score DESC LIMIT $over WHERE e.group_id = $g AND e.expired_at IS NULL "
    "RETURN e.uuid AS uuid, e.fact AS fact ORDER BY score DESC, uuid LIMIT $k"
)
Q_FACT_DOC_FREQ = (
    "UNWIND $words AS w CALL db.idx.fulltext.queryRelationships('RELATES_TO', w) YIELD relationship "
    "RETURN w, count(relationship) AS df"
)
Q_FACT_COUNT = "MATCH ()-[e:RELATES_TO]->() RETURN count(e) AS n"


async def bm25_fact_ranking(graph: Any, group_id: str, query: str, depth: int) -> list[str]:
    """The group's current facts holding a word of ``query``, best ``depth`` edge uuids first
    by BM25 over their text. ``graph``: the raw FalkorDB graph (``engram.compat.falkor_graph``)."""
    return await rescored_keyword_ranking(graph, (Q_FACT_TEXT, Q_FACT_DOC_FREQ, Q_FACT_COUNT), group_id, query, depth)
