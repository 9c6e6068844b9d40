"""Entity-centric retrieval for recall: the entities a question names bring their current facts.

A question such as "What did Caroline research?" names an entity of the graph. Searching every
fact of the group by the question's words and embedding lets facts about anyone else compete
(in a two-person conversation, half of the nearest facts are the other speaker's); the facts
*of the named entity*, ranked by the same embedding, are a ranking of their own that recall
fuses with the other two (BM25 and vector) by reciprocal rank: a fact both found ranks first.
This is how the graph's structure reaches the agent across sessions: an entity's facts, whatever
session they came from, current ones only.

Naming is exact, with no model: a question names an entity when a phrase of 1 to
``MAX_NAME_WORDS`` of its words, casefolded, with edge punctuation and a possessive "'s" taken
off, equals the entity's name casefolded ("caroline's" names Caroline, "node.js?" names
Node.js). Phrases that are one stopword or one character name nothing. Partial: no aliases and
no embedding match of names ("Mel" does not name Melanie); graphiti's entity dedupe already
merges most name variants into one node at extraction.

FalkorDB only (the cosine is computed in the query over the named entities' facts, no index);
with another graph the ranking is empty and recall is what it was without it.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from graphiti_core.driver.driver import GraphProvider

from redis.exceptions import ResponseError

from engram.compat import falkor_graph
from engram.graph.drivers import query_rows
from engram.services.recall.lexical import resolved
from engram.services.recall.vector import _unusable

log = logging.getLogger("engram.recall.entities")

MAX_NAME_WORDS = 4
MAX_ENTITIES = 8  # named entities used per question, longest names first
_EDGE_PUNCTUATION = re.compile(r"^[^\w]+|[^\w]+$")
_POSSESSIVE = re.compile(r"['’]s$")

# Named entities of the group: casefolded names compared with the question's phrases in the query.
Q_NAMED = (
    "MATCH (n:Entity) WHERE n.group_id = $g AND toLower(n.name) IN $phrases "
    "RETURN n.uuid AS uuid, n.name AS name"
)
# Their current facts, nearest to the question first; cosine similarity in [-1, 1]. Bounded per
# request (issue 25, item 3: a year of memory makes the user a hub of tens of thousands of facts,
# and the cosine over all of them cost 87-230 ms at 50k on this machine): the first
# ``ENTITY_FACTS_SCANNED`` facts met (all of them for an entity with fewer: exact as before), and
# the facts among the ``ENTITY_FACTS_NEAREST`` nearest of the group (the vector index) that touch
# a named entity -- a hub's facts nearest to the question. Together ~5-7 ms at 50k facts.
# No ``r.group_id`` test: on FalkorDB (the only graph this runs on) every group is a graph of its own,
# and FalkorDB 4.16 answered no row with it in this query though the comparison held in a RETURN.
ENTITY_FACTS_SCANNED = 1000
ENTITY_FACTS_NEAREST = 256
Q_ENTITY_FACTS = (
    "MATCH (n:Entity)-[r:RELATES_TO]-(m:Entity) WHERE n.uuid IN $uuids "
    "WITH DISTINCT r LIMIT $scanned WITH r WHERE r.expired_at IS NULL AND r.fact_embedding IS NOT NULL "
    "RETURN r.uuid AS uuid, 1 - vec.cosineDistance(r.fact_embedding, vecf32($vector)) AS similarity "
    "ORDER BY similarity DESC LIMIT $k"
)
Q_ENTITY_FACTS_NEAREST = (
    "CALL db.idx.vector.queryRelationships('RELATES_TO', 'fact_embedding', $nearest, vecf32($vector)) "
    "YIELD relationship AS r, score WITH r, score, startNode(r) AS a, endNode(r) AS b "
    "WHERE (a.uuid IN $uuids OR b.uuid IN $uuids) AND r.expired_at IS NULL "
    "RETURN r.uuid AS uuid, 1 - score AS similarity ORDER BY score LIMIT $k"
)


def phrases(question: str, stopwords: frozenset[str] = frozenset()) -> list[str]:
    """Every phrase of 1 to ``MAX_NAME_WORDS`` words of ``question``, casefolded, each word without
    edge punctuation or a possessive; one-word phrases that are a stopword or one character left out."""
    words = []
    for raw in question.split():
        word = _POSSESSIVE.sub("", _EDGE_PUNCTUATION.sub("", raw.casefold()))
        word = _EDGE_PUNCTUATION.sub("", word)
        if word:
            words.append(word)
    out: dict[str, None] = {}
    for size in range(1, MAX_NAME_WORDS + 1):
        for at in range(len(words) - size + 1):
            phrase = " ".join(words[at:at + size])
            if size == 1 and (len(phrase) < 2 or phrase in stopwords):
                continue
            out[phrase] = None
    return list(out)


async def named_entities(driver: Any, group_id: str, question: str,
                         stopwords: frozenset[str] = frozenset()) -> list[str]:
    """uuids of the group's entities the question names (longest names first, at most
    ``MAX_ENTITIES``)."""
    wanted = phrases(question, stopwords)
    if not wanted:
        return []
    rows = await query_rows(driver, Q_NAMED, g=group_id, phrases=wanted)
    rows.sort(key=lambda r: (-len(r["name"] or ""), r["uuid"]))
    return [r["uuid"] for r in rows[:MAX_ENTITIES]]


async def entity_fact_ranking(driver: Any, group_id: str, question: str, vector: list[float] | None, k: int,
                              min_cosine: float | None = None,
                              stopwords: frozenset[str] = frozenset()) -> list[tuple[str, float]]:
    """The current facts of the entities ``question`` names, as (edge uuid, cosine similarity to
    ``vector``), nearest first, at most ``k``; only those at ``min_cosine`` or above when given.
    Empty when no entity is named, no vector is given, or the graph is not FalkorDB."""
    if getattr(driver, "provider", None) != GraphProvider.FALKORDB or vector is None or k <= 0:
        return []
    uuids = await named_entities(driver, group_id, question, stopwords)  # while the question is embedded
    vector = await resolved(vector)
    if not uuids or not vector:
        return []
    rows = await query_rows(driver, Q_ENTITY_FACTS, uuids=uuids, vector=vector, k=k, scanned=ENTITY_FACTS_SCANNED)
    if len(rows) >= k and ENTITY_FACTS_NEAREST > 0:  # maybe a hub: its facts among the group's nearest too
        try:  # the raw graph: the driver would log an unusable index as an error, with the question
            result = await falkor_graph(driver).ro_query(Q_ENTITY_FACTS_NEAREST, {
                "uuids": uuids, "vector": vector, "k": k, "nearest": max(ENTITY_FACTS_NEAREST, k)})
            rows += [{"uuid": u, "similarity": sim} for u, sim in result.result_set]
        except ResponseError as exc:
            if not _unusable(exc):
                raise
            log.debug("graph %s: entity facts without the vector index (%s)", group_id, exc)  # not built yet
    best: dict[str, float] = {}
    for r in rows:
        best[r["uuid"]] = max(best.get(r["uuid"], -2.0), float(r["similarity"]))
    ranked = sorted(best.items(), key=lambda kv: (-kv[1], kv[0]))[:k]
    return [(u, s) for u, s in ranked if min_cosine is None or s >= min_cosine]
