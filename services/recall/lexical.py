"""Okapi BM25 over a group's episodes (past turns), kept in memory by the recall service.

Why not the graph's fulltext index: FalkorDB ranks it with TF-IDF over an OR of the query words,
and bench/recall_quality.py measured LoCoMo evidence recall@10 at 60.6% with it against 69.8%
for plain BM25 over the same turns. So recall keeps a BM25 index per group, built from the
Episodic nodes on first use.

Kept current by comparing sets, not counts: every request reads the uuids of the group's
episodes (one query, one joined string) and compares them with the uuids indexed. The same
string as last time, or the same set: the index is used as it is. Otherwise episodes that are
gone are removed in memory (no graph read) and only the episodes it lacks are read and added. A
count (the rule before) misses a delete followed by an insert for good, and neither the newest
``created_at`` nor FalkorDB's node ids fix that: ids of deleted nodes are reused, and
``created_at`` is the writer's clock. Cost: the uuid listing is O(episodes) per request
(measured in docs/architecture.md, "Recall's episode index"); step 6 of the roadmap replaces
this index. An episode's content is never rewritten under the same uuid (engram deletes and
writes anew), so the set of uuids is the whole state; after an in-place rewrite, call
``invalidate``.

Bounded: the indexes are kept least recently used first, at most ``max_groups`` groups and
``max_bytes`` of indexed episode text (UTF-8) in all; the least recently used are dropped beyond
either and rebuilt from the graph on their next request. A group larger than ``max_bytes`` on
its own is built for the request and not kept. The graph stays the source of truth: an item
whose episode no longer exists is dropped when its provenance is read.

k1 = 1.5, b = 0.75, lower-cased word tokens, no stemming, a small English stopword list.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import re
import weakref
from collections import Counter, OrderedDict
from collections.abc import KeysView
from dataclasses import dataclass, field
from typing import Any

from graphiti_core.driver.driver import GraphProvider
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge

from engram.graph import query_rows

_WORD = re.compile(r"\w+")
STOPWORDS = frozenset(
    "a an and are as at be but by did do does for from had has have he her his i if in is it its me my "
    "of on or our she so that the their them they this to was we were what when where which who why "
    "will with you your".split()
)
K1, B = 1.5, 0.75
DEFAULT_MAX_GROUPS = 1024
DEFAULT_MAX_BYTES = 16 * 1024 * 1024  # of text; the index holds ~17x that in memory (LoCoMo turns)

# One string, not a list: the Python client parses every list element on its own (measured at
# 10k episodes: 8.0 ms p50 / 56 ms p95 for the list, 3.2 / 4.5 ms joined; a count was 0.9 / 1.1).
# A uuid holding the separator only makes every request read it again, never hides it.
UUID_SEPARATOR = "\x1f"
Q_UUIDS_JOINED = "MATCH (e:Episodic) WHERE e.group_id = $g RETURN string.join(collect(e.uuid), $sep) AS uuids"
Q_UUIDS = "MATCH (e:Episodic) WHERE e.group_id = $g RETURN collect(e.uuid) AS uuids"  # Neo4j: no string.join
_FIELDS = "e.uuid AS uuid, e.content AS content, e.valid_at AS valid_at, e.created_at AS created_at"
Q_EPISODES = f"MATCH (e:Episodic) WHERE e.group_id = $g RETURN {_FIELDS} ORDER BY e.created_at, e.uuid"
Q_EPISODES_IN = (
    f"MATCH (e:Episodic) WHERE e.group_id = $g AND e.uuid IN $uuids RETURN {_FIELDS} ORDER BY e.created_at, e.uuid"
)

EVICTIONS = PromCounter(
    "engram_recall_lexical_evictions_total",
    "Group BM25 indexes dropped from memory, by reason (groups, bytes: a bound was passed; "
    "too_large: one group's text alone exceeds ENGRAM_RECALL_LEXICAL_MAX_BYTES, built per request).",
    ["reason"],
)
INDEXED_BYTES = Gauge("engram_recall_lexical_indexed_bytes", "Episode text (UTF-8 bytes) held in BM25 indexes.")


def tokens(text: str) -> list[str]:
    return [w for w in _WORD.findall(text.casefold()) if w not in STOPWORDS]


Listing = str | tuple[str, ...]


async def episode_listing(driver: Any, group_id: str) -> Listing:
    """The uuids of the group's Episodic nodes, in one query, as the graph returned them."""
    if getattr(driver, "provider", None) == GraphProvider.FALKORDB:
        rows = await query_rows(driver, Q_UUIDS_JOINED, g=group_id, sep=UUID_SEPARATOR)
        return (rows[0]["uuids"] or "") if rows else ""
    rows = await query_rows(driver, Q_UUIDS, g=group_id)
    return tuple(rows[0]["uuids"] or ()) if rows else ()


def uuid_set(listing: Listing) -> set[str]:
    if isinstance(listing, str):
        return set(listing.split(UUID_SEPARATOR)) if listing else set()
    return set(listing)


@dataclass
class Doc:
    uuid: str
    content: str
    valid_at: Any
    created_at: Any
    terms: Counter
    length: int
    text_bytes: int = 0

    @classmethod
    def of(cls, row: dict[str, Any]) -> Doc:
        content = row["content"] or ""
        words = tokens(content)
        return cls(row["uuid"], content, row["valid_at"], row["created_at"], Counter(words), len(words),
                   len(content.encode("utf-8", "surrogatepass")))


@dataclass
class EpisodeIndex:
    """BM25 over a set of documents that grows by ``add`` and shrinks by ``remove``.

    A removed document leaves a hole (None) in ``docs`` and its postings stay until the index is
    compacted; ``df`` counts live documents per term, so scores equal a fresh build's."""

    docs: list[Doc | None] = field(default_factory=list)
    postings: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # term -> [(doc index, tf)]
    df: dict[str, int] = field(default_factory=dict)  # term -> live documents holding it
    positions: dict[str, int] = field(default_factory=dict)  # uuid -> doc index, live documents only
    total_length: int = 0
    text_bytes: int = 0
    listing: Listing | None = None  # the graph's uuid listing this index was last found equal to

    @classmethod
    def of(cls, docs: list[Doc]) -> EpisodeIndex:
        index = cls()
        for doc in docs:
            index.add(doc)
        return index

    @property
    def uuids(self) -> KeysView[str]:
        return self.positions.keys()

    def add(self, doc: Doc) -> None:
        index = len(self.docs)
        self.docs.append(doc)
        self.positions[doc.uuid] = index
        for term, tf in doc.terms.items():
            self.postings.setdefault(term, []).append((index, tf))
            self.df[term] = self.df.get(term, 0) + 1
        self.total_length += doc.length
        self.text_bytes += doc.text_bytes

    def remove(self, uuid: str) -> None:
        at = self.positions.pop(uuid)
        doc, self.docs[at] = self.docs[at], None
        assert doc is not None
        for term in doc.terms:
            self.df[term] -= 1
        self.total_length -= doc.length
        self.text_bytes -= doc.text_bytes

    def compacted(self) -> EpisodeIndex:
        """This index, or a fresh build of its live documents once half of ``docs`` are holes."""
        if len(self.docs) <= 2 * len(self.positions):
            return self
        return EpisodeIndex.of([d for d in self.docs if d is not None])

    def search(self, query: str, k: int) -> list[tuple[Doc, float]]:
        """Top ``k`` episodes by BM25; only documents holding a query term are scored."""
        n = len(self.positions)
        if not n:
            return []
        avgdl = self.total_length / n or 1.0
        scores: dict[int, float] = {}
        for term in set(tokens(query)):
            df = self.df.get(term, 0)
            if not df:
                continue
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            for index, tf in self.postings[term]:
                doc = self.docs[index]
                if doc is None:
                    continue
                norm = K1 * (1 - B + B * doc.length / avgdl)
                scores[index] = scores.get(index, 0.0) + idf * tf * (K1 + 1) / (tf + norm)
        best = heapq.nlargest(k, scores.items(), key=lambda pair: pair[1])
        return [(self.docs[i], score) for i, score in best]  # type: ignore[misc] - scored docs are live


class LexicalEpisodes:
    """BM25 indexes of the groups this recall replica searched most recently (bounded LRU)."""

    def __init__(self, max_groups: int = DEFAULT_MAX_GROUPS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_groups = max_groups
        self.max_bytes = max_bytes
        self.indexes: OrderedDict[str, EpisodeIndex] = OrderedDict()  # least recently used first
        self.indexed_bytes = 0
        # One lock per group while some request uses it: a map of every group ever seen would
        # grow without bound too.
        self.locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()

    def invalidate(self, group_id: str) -> None:
        self._drop(group_id, None)

    def _drop(self, group_id: str, reason: str | None) -> None:
        index = self.indexes.pop(group_id, None)
        if index is not None:
            self.indexed_bytes -= index.text_bytes
            INDEXED_BYTES.dec(index.text_bytes)
            if reason:
                EVICTIONS.labels(reason=reason).inc()

    def _keep(self, group_id: str, index: EpisodeIndex) -> None:
        """Store ``index`` as the most recently used, then evict down to the bounds. No await in
        here: the map and the byte count change together."""
        self._drop(group_id, None)
        if index.text_bytes > self.max_bytes:
            EVICTIONS.labels(reason="too_large").inc()
            return
        self.indexes[group_id] = index
        self.indexed_bytes += index.text_bytes
        INDEXED_BYTES.inc(index.text_bytes)
        while len(self.indexes) > self.max_groups:
            self._drop(next(iter(self.indexes)), "groups")
        while self.indexed_bytes > self.max_bytes:
            self._drop(next(iter(self.indexes)), "bytes")

    async def _current(self, driver: Any, group_id: str) -> EpisodeIndex:
        lock = self.locks.get(group_id)
        if lock is None:
            lock = self.locks[group_id] = asyncio.Lock()
        async with lock:
            listing = await episode_listing(driver, group_id)
            index = self.indexes.get(group_id)
            # The listing the index was last found equal to: the same set, for one string comparison
            if index is not None and index.listing == listing:
                self.indexes.move_to_end(group_id)
                return index
            in_graph = uuid_set(listing)
            if index is not None and index.uuids == in_graph:  # listed in another order
                index.listing = listing
                self.indexes.move_to_end(group_id)
                return index
            self._drop(group_id, None)  # changed: accounted again by _keep once up to date
            index = index or EpisodeIndex()
            for gone in [u for u in index.uuids if u not in in_graph]:
                index.remove(gone)  # deleted episodes leave in memory, no graph read
            index = index.compacted()
            missing = in_graph - index.uuids
            if missing:
                if len(missing) * 2 > len(in_graph):  # mostly new: one scan beats a long IN list
                    rows = await query_rows(driver, Q_EPISODES, g=group_id)
                else:
                    rows = await query_rows(driver, Q_EPISODES_IN, g=group_id, uuids=sorted(missing))
                # Read after the uuids: an episode written in between is added now, one deleted
                # in between is absent here; the next request's comparison settles either.
                for r in rows:
                    if r["uuid"] not in index.uuids:
                        index.add(Doc.of(r))
            index.listing = listing if index.uuids == in_graph else None
            self._keep(group_id, index)
            return index

    async def search(self, driver: Any, group_id: str, query: str, k: int) -> list[tuple[Doc, float]]:
        index = await self._current(driver, group_id)
        return index.search(query, k)
