"""Okapi BM25 over a group's episodes (past turns), kept in memory by the recall service.

Why not the graph's fulltext index: FalkorDB ranks it with TF-IDF over an OR of the query words,
and bench/recall_quality.py measured LoCoMo evidence recall@10 at 60.6% with it against 69.8%
for plain BM25 over the same turns. So recall keeps a BM25 index per group, built from the
Episodic nodes on first use and brought up to date on every request with one count query:
new episodes (the extractor writes a group's episodes in order) are appended; fewer episodes
than indexed (a delete) rebuilds the index. The graph stays the source of truth: an item whose
episode no longer exists is dropped when its provenance is read.

k1 = 1.5, b = 0.75, lower-cased word tokens, no stemming, a small English stopword list.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from engram.graph import query_rows

_WORD = re.compile(r"\w+")
STOPWORDS = frozenset(
    "a an and are as at be but by did do does for from had has have he her his i if in is it its me my "
    "of on or our she so that the their them they this to was we were what when where which who why "
    "will with you your".split()
)
K1, B = 1.5, 0.75


def tokens(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.casefold()) if w not in STOPWORDS]


@dataclass
class Doc:
    uuid: str
    content: str
    valid_at: Any
    created_at: Any
    terms: Counter
    length: int


@dataclass
class EpisodeIndex:
    docs: list[Doc] = field(default_factory=list)
    postings: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # term -> [(doc index, tf)]
    total_length: int = 0

    def add(self, doc: Doc) -> None:
        index = len(self.docs)
        self.docs.append(doc)
        for term, tf in doc.terms.items():
            self.postings.setdefault(term, []).append((index, tf))
        self.total_length += doc.length

    def search(self, query: str, k: int) -> list[tuple[Doc, float]]:
        """Top ``k`` episodes by BM25; only documents holding a query term are scored."""
        n = len(self.docs)
        if not n:
            return []
        avgdl = self.total_length / n or 1.0
        scores: dict[int, float] = {}
        for term in set(tokens(query)):
            postings = self.postings.get(term)
            if not postings:
                continue
            idf = math.log(1 + (n - len(postings) + 0.5) / (len(postings) + 0.5))
            for index, tf in postings:
                norm = K1 * (1 - B + B * self.docs[index].length / avgdl)
                scores[index] = scores.get(index, 0.0) + idf * tf * (K1 + 1) / (tf + norm)
        best = heapq.nlargest(k, scores.items(), key=lambda pair: pair[1])
        return [(self.docs[i], score) for i, score in best]


class LexicalEpisodes:
    """BM25 indexes of every group this recall replica has searched."""

    def __init__(self) -> None:
        self.indexes: dict[str, EpisodeIndex] = {}
        self.locks: dict[str, asyncio.Lock] = {}

    def invalidate(self, group_id: str) -> None:
        self.indexes.pop(group_id, None)

    async def _current(self, driver: Any, group_id: str) -> EpisodeIndex:
        async with self.locks.setdefault(group_id, asyncio.Lock()):
            index = self.indexes.get(group_id) or EpisodeIndex()
            count = (await query_rows(driver, "MATCH (e:Episodic) WHERE e.group_id = $g RETURN count(e) AS n", g=group_id))[0]["n"]
            if count < len(index.docs):
                index = EpisodeIndex()  # episodes were deleted: rebuild
            if count > len(index.docs):
                rows = await query_rows(
                    driver,
                    "MATCH (e:Episodic) WHERE e.group_id = $g RETURN e.uuid AS uuid, e.content AS content, "
                    "e.valid_at AS valid_at, e.created_at AS created_at ORDER BY e.created_at, e.uuid SKIP $skip",
                    g=group_id, skip=len(index.docs),
                )
                known = {d.uuid for d in index.docs}
                if any(r["uuid"] in known for r in rows):
                    # written out of creation order: read everything again
                    index = EpisodeIndex()
                    rows = await query_rows(
                        driver,
                        "MATCH (e:Episodic) WHERE e.group_id = $g RETURN e.uuid AS uuid, e.content AS content, "
                        "e.valid_at AS valid_at, e.created_at AS created_at ORDER BY e.created_at, e.uuid",
                        g=group_id,
                    )
                for r in rows:
                    words = tokens(r["content"] or "")
                    index.add(Doc(r["uuid"], r["content"] or "", r["valid_at"], r["created_at"], Counter(words), len(words)))
            self.indexes[group_id] = index
            return index

    async def search(self, driver: Any, group_id: str, query: str, k: int) -> list[tuple[Doc, float]]:
        index = await self._current(driver, group_id)
        return index.search(query, k)
