"""BM25 (``bm25s``) and turn vectors over a group's episodes (past turns), kept in memory by the
recall service (``ENGRAM_RECALL_TURN_INDEX=memory``; on Neo4j; and while a FalkorDB group's turn
vector index is not built yet). ``graph``, the default on FalkorDB, is services/recall/turns.py:
the graph's own fulltext and vector indices per request, no listing and no state per group (issue
25, item 3), its fulltext candidates ranked by this module's BM25 formula and stems
(``turns.bm25_rescored``); this module also holds the fusion both share (:func:`fuse_turns`,
:func:`with_followers`).

Dense half (issue 11): the extractor stores each turn's embedding on its Episodic node
(``engram_embedding``); the index keeps them as float32 unit vectors next to the text and ranks by
cosine to the question's vector (a matrix product: ~1 ms at 10k turns). ``hybrid`` fuses the BM25
and cosine rankings by reciprocal rank, as the best flat retriever bench/recall_quality.py
measured. Turns without a vector, or with one of another size (another embedder), are found by
BM25 only. Vectors count against the memory bound (1.5 KB a turn at 384 dimensions).

Why not the graph's fulltext index's own order: FalkorDB ranks it with TF-IDF over an OR of the
query words, and bench/recall_quality.py measured LoCoMo evidence recall@10 at 60.6% with it
against 69.8% for plain BM25 over the same turns. So this index keeps BM25 per group, built from
the Episodic nodes on first use; the graph mode (turns.py) instead ranks the fulltext index's
candidates by BM25 with frequencies it counts per request.

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

Scoring is ``bm25s`` (Lucene's BM25, k1 = 1.5, b = 0.75) over Snowball stems (``PyStemmer``)
in the group's language: "opened"/"open" and "veritabanı"/"veritabanını" meet; in English an
irregular verb is first brought to its lemma by ``lemminflect`` ("broke"/"broken" -> "break").
The language is guessed per group with no model: every episode votes with the stopwords it holds, for each of the
languages both libraries cover (bm25s ships the stopword lists, PyStemmer the stemmers), a word
shared by n of those lists counting 1/n, and Turkish lists also match without diacritics ("icin"),
as users often type them. The group takes the language with the most votes, English when there
are fewer than ``MIN_LANGUAGE_VOTES``; that language's stopwords are dropped and its stemmer
applied to the episodes and to the query. Partial: one language per group, so a group mixing two
languages stems the minority one with the majority's stemmer (its words still match exactly).

A bm25s index is immutable: inserts and deletes are applied to the document list (deletes leave
a hole, compacted once half are holes) and the next search rebuilds the group's bm25s index from
the live documents' cached term ids (no re-tokenising, no graph read), so scores always equal a
fresh build's. bm25s's own build loops over documents in Python (~400 ms at 10k episodes), so
``BM25`` below builds the same matrix with numpy (~2 ms at 1k, ~40 ms at 10k episodes, paid
once by the first search after a change). Costs in docs/architecture.md ("Recall's episode
index"). Partial: no delta index; a group of 10k+ episodes written to between every two
searches pays the rebuild on each.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import unicodedata
import weakref
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, KeysView, Sequence
from dataclasses import dataclass, field
from functools import cache, lru_cache
from typing import Any

import bm25s
import numpy as np
import Stemmer
from bm25s import stopwords as bm25s_stopwords
from graphiti_core.driver.driver import GraphProvider
from lemminflect import getAllLemmas
from prometheus_client import Counter as PromCounter
from prometheus_client import Gauge

from engram.compat import bm25_idf_scorer as _select_idf_scorer
from engram.compat import bm25_tfc_scorer as _select_tfc_scorer
from engram.graph.drivers import query_rows
from engram.services.extractor.pipeline import EMBEDDING_PROPERTY

_WORD = re.compile(r"\w+")
K1, B = 1.5, 0.75
DEFAULT_LANGUAGE = "english"
MIN_LANGUAGE_VOTES = 2.0  # below this a group is English: a turn or two of "de"/"on" proves nothing
DEFAULT_MAX_GROUPS = 1024
RRF_K = 60  # reciprocal-rank constant of the BM25 + dense fusion (the usual 60; not tuned)
CANDIDATES_PER_K = 3  # each ranking's depth in the fusion, per result asked for
# Text and turn vectors held. 64 MiB since turns carry vectors (384 float32 = 1.5 KB a turn, ~3x a
# LoCoMo turn's text): the text it bounds stays about the 16 MiB of text the bound was before (the
# BM25 index holds ~12x its text besides), and a group of ~35k turns still fits (at 16 MiB one of
# ~9k turns did not, and a group over the bound is re-read on every recall: 16 s at 20k turns).
DEFAULT_MAX_BYTES = 64 * 1024 * 1024
# One string, not a list: the Python client parses every list element on its own (measured at
# 10k episodes: 8.0 ms p50 / 56 ms p95 for the list, 3.2 / 4.5 ms joined; a count was 0.9 / 1.1).
# A uuid holding the separator only makes every request read it again, never hides it.
UUID_SEPARATOR = "\x1f"
Q_UUIDS_JOINED = "MATCH (e:Episodic) WHERE e.group_id = $g RETURN string.join(collect(e.uuid), $sep) AS uuids"
Q_UUIDS = "MATCH (e:Episodic) WHERE e.group_id = $g RETURN collect(e.uuid) AS uuids"  # Neo4j: no string.join
_FIELDS = (
    "e.uuid AS uuid, e.content AS content, e.valid_at AS valid_at, e.created_at AS created_at, "
    f"e.{EMBEDDING_PROPERTY} AS vector"
)
Q_EPISODES = f"MATCH (e:Episodic) WHERE e.group_id = $g RETURN {_FIELDS} ORDER BY e.created_at, e.uuid"
Q_EPISODES_IN = (
    f"MATCH (e:Episodic) WHERE e.group_id = $g AND e.uuid IN $uuids RETURN {_FIELDS} ORDER BY e.created_at, e.uuid"
)
# The facts each episode produced (fact-augmented turn keys): from the episode's MENTIONS edges to
# the facts between the entities it mentions that cite it. Superseded facts too: the turn said them.
Q_FACTS_OF = (
    "UNWIND $uuids AS u "
    "MATCH (e:Episodic {uuid: u})-[:MENTIONS]->(:Entity)-[r:RELATES_TO]-(:Entity) "
    "WHERE e.group_id = $g AND u IN r.episodes "
    "RETURN u AS uuid, collect(DISTINCT r.fact) AS facts"
)
FACT_KEY_BATCH = 2000  # episodes per facts query


@dataclass(frozen=True)
class Source:
    """What an index holds: the queries listing and reading its documents (``$g``: the group)."""

    uuids_joined: str  # FalkorDB: every uuid in one string joined by $sep
    uuids: str  # other graphs: a list
    rows: str  # every document: uuid, content, valid_at, created_at, vector
    rows_in: str  # the documents among $uuids


EPISODES = Source(Q_UUIDS_JOINED, Q_UUIDS, Q_EPISODES, Q_EPISODES_IN)
# The group's current facts (BM25 over their text; their vectors stay in the graph's vector index).
_CURRENT_FACT = "MATCH ()-[r:RELATES_TO]->() WHERE r.group_id = $g AND r.expired_at IS NULL"
_FACT_FIELDS = "r.uuid AS uuid, r.fact AS content, r.valid_at AS valid_at, r.created_at AS created_at, null AS vector"
FACTS = Source(
    f"{_CURRENT_FACT} RETURN string.join(collect(r.uuid), $sep) AS uuids",
    f"{_CURRENT_FACT} RETURN collect(r.uuid) AS uuids",
    f"{_CURRENT_FACT} RETURN {_FACT_FIELDS} ORDER BY r.created_at, r.uuid",
    f"{_CURRENT_FACT} AND r.uuid IN $uuids RETURN {_FACT_FIELDS} ORDER BY r.created_at, r.uuid",
)

EVICTIONS = PromCounter(
    "engram_recall_lexical_evictions_total",
    "Group BM25 indexes dropped from memory, by reason (groups, bytes: a bound was passed; "
    "too_large: one group's text alone exceeds ENGRAM_RECALL_LEXICAL_MAX_BYTES, built per request).",
    ["reason"],
)
INDEXED_BYTES = Gauge("engram_recall_lexical_indexed_bytes",
                      "Episode text (UTF-8 bytes) and turn vectors (float32 bytes) held in recall's episode indexes.")


def _fold(word: str) -> str:
    """``word`` without diacritics, dotless i as i: how Turkish is often typed on other keyboards."""
    return "".join(c for c in unicodedata.normalize("NFKD", word) if not unicodedata.combining(c)).replace("ı", "i")


def _stopword_lists() -> dict[str, frozenset[str]]:
    """The languages PyStemmer stems and bm25s has stopwords for, with their stopwords."""
    lists = {}
    for language in Stemmer.algorithms():
        words = getattr(bm25s_stopwords, "STOPWORDS_EN" if language == "english" else f"STOPWORDS_{language.upper()}", None)
        if words:
            lists[language] = frozenset(w.casefold() for w in words) | frozenset(_fold(w.casefold()) for w in words)
    return lists


STOPWORDS: dict[str, frozenset[str]] = _stopword_lists()
LANGUAGES = tuple(sorted(STOPWORDS))
# 1/n for a word that is a stopword in n languages ("de" is Dutch, French, Portuguese, Spanish, Turkish)
_VOTE: dict[str, dict[str, float]] = {}
for _language, _words in STOPWORDS.items():
    for _w in _words:
        _VOTE.setdefault(_w, {})[_language] = 1.0
for _w, _by in _VOTE.items():
    for _language in _by:
        _by[_language] = 1.0 / len(_by)


def words(text: str, language: str = DEFAULT_LANGUAGE) -> list[str]:
    """Lower-cased word tokens; Turkish lower-cases I to dotless ı, every language İ to i."""
    text = text.replace("İ", "i")
    if language == "turkish":
        text = text.replace("I", "ı")
    return _WORD.findall(text.casefold())


def language_votes(text: str) -> Counter[str]:
    """Stopword votes per language for ``text`` (see the module docstring)."""
    votes: Counter[str] = Counter()
    for w in words(text):
        for language, weight in _VOTE.get(w, {}).items():
            votes[language] += weight
    return votes


def language_of(votes: Counter[str]) -> str:
    if not votes:
        return DEFAULT_LANGUAGE
    language, count = max(votes.items(), key=lambda kv: (kv[1], kv[0] == DEFAULT_LANGUAGE, kv[0]))
    return language if count >= MIN_LANGUAGE_VOTES else DEFAULT_LANGUAGE


@cache
def _stemmer(language: str) -> Stemmer.Stemmer:
    return Stemmer.Stemmer(language)


@lru_cache(maxsize=65536)
def _term(word: str, language: str) -> str:
    stemmer = _stemmer(language)
    if language == "english":
        # Snowball leaves irregular verbs apart (broke, broken); lemminflect's table joins them
        word = (getAllLemmas(word).get("VERB") or (word,))[0]
        return stemmer.stemWord(word)
    stem = stemmer.stemWord(word)
    if language == "turkish":
        # Turkish Snowball reads the n of a vowel-final noun as a suffix buffer or not depending on
        # what follows: veritabanı -> veritaba, veritabanını -> veritaban. Stemming again until the
        # stem stops changing brings both to veritap (also sunucu/sunucunun, fatura/faturanın).
        while (again := stemmer.stemWord(stem)) != stem:
            stem = again
    return stem


def warm_up() -> None:
    """Pay the first English term's one-time costs now (lemminflect reads its tables: ~0.5 s, and
    the stemmer is built): the recall service calls it at start."""
    _term("went", DEFAULT_LANGUAGE)


def tokens(text: str, language: str = DEFAULT_LANGUAGE) -> list[str]:
    """The terms BM25 sees: ``language``'s stopwords dropped, the rest stemmed."""
    stop = STOPWORDS.get(language, frozenset())
    return [_term(w, language) for w in words(text, language) if w not in stop]


Listing = str | tuple[str, ...]


async def episode_listing(driver: Any, group_id: str, source: Source = EPISODES) -> Listing:
    """The uuids of the group's Episodic nodes (or ``source``'s documents), in one query, as the
    graph returned them."""
    if getattr(driver, "provider", None) == GraphProvider.FALKORDB:
        rows = await query_rows(driver, source.uuids_joined, g=group_id, sep=UUID_SEPARATOR)
        return (rows[0]["uuids"] or "") if rows else ""
    rows = await query_rows(driver, source.uuids, g=group_id)
    return tuple(rows[0]["uuids"] or ()) if rows else ()


def uuid_set(listing: Listing) -> set[str]:
    if isinstance(listing, str):
        return set(listing.split(UUID_SEPARATOR)) if listing else set()
    return set(listing)


class BM25(bm25s.BM25):
    """bm25s's BM25 with its documented hook ``build_index_from_ids`` done in numpy.

    bm25s builds with a Python loop per document (~40 us each: 400 ms for a 10k-episode group),
    and a bm25s index is immutable, so every change would pay that. This build computes the same
    matrix with numpy over all documents at once, scored by bm25s's own idf and tf functions
    (``bm25s.scoring``), and leaves querying to bm25s; a test checks it equals bm25s's build."""

    def build_index_from_ids(self, unique_token_ids, corpus_token_ids, show_progress=True, leave_progress=False):  # noqa: ANN001, ANN201, ARG002
        if self.method in self.methods_requiring_nonoccurrence:  # BM25L, BM25+: not needed here
            raise NotImplementedError(self.method)
        self.nonoccurrence_array = None
        n_docs, n_vocab = len(corpus_token_ids), len(unique_token_ids)
        dtype = np.dtype(self.dtype)
        lengths = np.fromiter((len(t) for t in corpus_token_ids), dtype=np.int64, count=n_docs)
        flat = np.concatenate([np.asarray(t, dtype=np.int64) for t in corpus_token_ids]) if n_docs else np.empty(0, np.int64)
        # One sort of (term, document) keys, term-major: runs are term frequencies, and the
        # distinct keys come out in the column order of the CSC matrix bm25s queries.
        keys = np.sort(flat * max(n_docs, 1) + np.repeat(np.arange(n_docs, dtype=np.int64), lengths))
        starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1]))) if len(keys) else np.empty(0, np.int64)
        tf = np.diff(np.append(starts, len(keys)))
        voc_idx, doc_idx = np.divmod(keys[starts], max(n_docs, 1))
        df = np.bincount(voc_idx, minlength=n_vocab)
        # bm25s's idf is a scalar function: applied once per distinct document frequency
        distinct, inverse = np.unique(df, return_inverse=True)
        idf_of = _select_idf_scorer(self.idf_method)
        idf = np.array([idf_of(int(d), N=n_docs) for d in distinct], dtype=dtype)[inverse]
        avg_doc_len = lengths.mean() if n_docs else 1.0
        tfc = _select_tfc_scorer(self.method)(tf_array=tf.astype(dtype), l_d=lengths[doc_idx], l_avg=avg_doc_len,
                                              k1=self.k1, b=self.b, delta=self.delta)
        data = (idf[voc_idx] * tfc).astype(dtype)
        indices = doc_idx.astype(self.int_dtype)
        indptr = np.concatenate(([0], np.cumsum(df))).astype(np.int64)
        return {"data": data.astype(dtype), "indices": indices, "indptr": indptr, "num_docs": n_docs}


async def resolved(vector: Any) -> Any:
    """``vector``, or what it resolves to when it is still being computed (an awaitable: recall
    starts the question's embedding and its graph reads that need no vector side by side)."""
    return await vector if inspect.isawaitable(vector) else vector


def unit_vector(values: Any) -> np.ndarray | None:
    """``values`` as a float32 unit vector; None when absent, empty or all zeros."""
    if values is None:
        return None
    vector = np.asarray(values, dtype=np.float32).ravel()
    norm = float(np.linalg.norm(vector)) if vector.size else 0.0
    return vector / norm if norm > 0 and np.isfinite(norm) else None


@dataclass(eq=False)
class Doc:
    uuid: str
    content: str
    valid_at: Any = None
    created_at: Any = None
    held_bytes: int = 0  # UTF-8 text + float32 vector: what the memory bound counts
    votes: Counter[str] = field(default_factory=Counter)  # stopword votes per language
    vector: np.ndarray | None = None  # the turn's embedding (unit length), None when it has none
    facts: str = ""  # the text of the facts it produced, searched with it (fact-augmented keys)

    @classmethod
    def of(cls, row: dict[str, Any], facts: Sequence[str] = ()) -> Doc:
        content = row.get("content") or ""
        vector = unit_vector(row.get("vector"))
        fact_text = "\n".join(sorted(facts))
        held = len((content + fact_text).encode("utf-8", "surrogatepass")) + (vector.nbytes if vector is not None else 0)
        return cls(row["uuid"], content, row.get("valid_at"), row.get("created_at"), held,
                   language_votes(content), vector, fact_text)

    @property
    def key(self) -> str:
        """What BM25 searches: the turn's text, and its facts' when the index keeps them."""
        return f"{self.content}\n{self.facts}" if self.facts else self.content


@dataclass
class EpisodeIndex:
    """BM25 (bm25s) over a set of documents that grows by ``add`` and shrinks by ``remove``.

    A removed document leaves a hole (None) in ``docs``; the bm25s index, immutable, is rebuilt
    from the live documents by the first search after a change, so scores equal a fresh build's.
    Each document's term ids are kept (``terms``, parallel to ``docs``) for the group's current
    language: a rebuild neither tokenises nor stems again unless that language changed."""

    docs: list[Doc | None] = field(default_factory=list)
    positions: dict[str, int] = field(default_factory=dict)  # uuid -> doc index, live documents only
    votes: Counter[str] = field(default_factory=Counter)  # stopword votes of the live documents
    held_bytes: int = 0
    listing: Listing | None = None  # the graph's uuid listing this index was last found equal to
    terms: list[np.ndarray | None] = field(default_factory=list)  # term ids per doc, None to compute
    vocab: dict[str, int] = field(default_factory=dict)  # stem -> term id, for ``terms_language``
    terms_language: str = DEFAULT_LANGUAGE
    bm25: BM25 | None = None  # over ``live``; None after a change
    live: list[Doc] = field(default_factory=list)  # the documents in bm25s row order
    vectors: np.ndarray | None = None  # unit turn vectors of ``with_vectors``, one row each; None after a change
    with_vectors: list[Doc] = field(default_factory=list)
    successor: dict[str, Doc] | None = None  # uuid -> the turn after it in time; None after a change

    @classmethod
    def of(cls, docs: list[Doc]) -> EpisodeIndex:
        index = cls()
        for doc in docs:
            index.add(doc)
        return index

    @property
    def uuids(self) -> KeysView[str]:
        return self.positions.keys()

    @property
    def language(self) -> str:
        return language_of(self.votes)

    @property
    def total_length(self) -> int:
        """Terms in the live documents (what bm25s averages document lengths over)."""
        self._term_ids()
        return sum(len(t) for d, t in zip(self.docs, self.terms) if d is not None and t is not None)

    def add(self, doc: Doc) -> None:
        self.positions[doc.uuid] = len(self.docs)
        self.docs.append(doc)
        self.terms.append(None)
        self.votes.update(doc.votes)
        self.held_bytes += doc.held_bytes
        self.bm25 = self.vectors = self.successor = None

    def remove(self, uuid: str) -> None:
        at = self.positions.pop(uuid)
        doc, self.docs[at], self.terms[at] = self.docs[at], None, None
        assert doc is not None
        self.votes.subtract(doc.votes)
        self.votes = +self.votes  # drop languages at zero (and float dust below it)
        self.held_bytes -= doc.held_bytes
        self.bm25 = self.vectors = self.successor = None

    def compacted(self) -> EpisodeIndex:
        """This index, or a fresh build of its live documents once half of ``docs`` are holes."""
        if len(self.docs) <= 2 * len(self.positions):
            return self
        return EpisodeIndex.of([d for d in self.docs if d is not None])

    def _term_ids(self) -> None:
        language = self.language
        if language != self.terms_language:  # the group's language changed: every doc again
            self.terms_language, self.vocab = language, {}
            self.terms = [None] * len(self.docs)
        vocab = self.vocab
        for at, doc in enumerate(self.docs):
            if doc is not None and self.terms[at] is None:
                ids = [vocab.setdefault(t, len(vocab)) for t in tokens(doc.key, language)]
                self.terms[at] = np.asarray(ids, dtype=np.int32)

    def _built(self) -> BM25:
        if self.bm25 is None or self.terms_language != self.language:
            self._term_ids()
            self.live = [d for d in self.docs if d is not None]
            corpus = [t for d, t in zip(self.docs, self.terms) if d is not None]
            # Every id of the vocabulary, also those only deleted documents held: their columns are
            # empty and score nothing; the vocabulary is rebuilt when the index is compacted.
            model = BM25(k1=K1, b=B, method="lucene")
            model.index((corpus, dict(self.vocab)), create_empty_token=False, show_progress=False)
            self.bm25 = model
        return self.bm25

    def search(self, query: str, k: int) -> list[tuple[Doc, float]]:
        """Top ``k`` episodes by BM25, best first; only documents holding a query term."""
        if not self.positions or k <= 0:
            return []
        model = self._built()
        ids = sorted({self.vocab[t] for t in tokens(query, self.terms_language) if t in self.vocab})
        if not ids:
            return []
        scores = model.get_scores_from_ids(ids)
        hits = np.flatnonzero(scores > 0)
        if len(hits) > k:
            hits = hits[np.argpartition(-scores[hits], k - 1)[:k]]
        hits = hits[np.lexsort((hits, -scores[hits]))]  # by score, ties in insertion order
        return [(self.live[i], float(scores[i])) for i in hits]

    def nearest(self, vector: Any, k: int) -> list[tuple[Doc, float]]:
        """Top ``k`` episodes by cosine similarity of their turn vector to ``vector``, best first.
        Turns without a vector, or with one of another dimension (written by another embedder),
        are left out: BM25 still finds them."""
        query = unit_vector(vector)
        if query is None or not self.positions or k <= 0:
            return []
        if self.vectors is None or self.vectors.shape[1] != query.size:
            self.with_vectors = [d for d in self.docs if d is not None and d.vector is not None
                                 and d.vector.size == query.size]
            self.vectors = (np.stack([d.vector for d in self.with_vectors]) if self.with_vectors
                            else np.empty((0, query.size), np.float32))
        if not self.with_vectors:
            return []
        scores = self.vectors @ query
        top = np.argpartition(-scores, k - 1)[:k] if len(scores) > k else np.arange(len(scores))
        top = top[np.lexsort((top, -scores[top]))]
        return [(self.with_vectors[i], float(scores[i])) for i in top]

    def following(self, uuid: str) -> Doc | None:
        """The group's next turn after ``uuid`` in time (``valid_at``, then ``created_at``), None
        for the last one or an unknown uuid: where a conversation continues after a matched turn."""
        if self.successor is None:
            ordered = sorted((d for d in self.docs if d is not None),
                             key=lambda d: (str(d.valid_at or ""), str(d.created_at or ""), d.uuid))
            self.successor = {a.uuid: b for a, b in zip(ordered, ordered[1:])}
        return self.successor.get(uuid)

    def hybrid(self, query: str, vector: Any, k: int, rrf_k: int = RRF_K,
               min_cosine: float | None = None) -> list[tuple[Doc, float]]:
        """BM25 and dense rankings fused by reciprocal rank (equal weights, rank constant
        ``rrf_k``), best ``k`` first -- the flat retriever bench/recall_quality.py measured best.
        Each side contributes its ``CANDIDATES_PER_K`` x ``k`` best; without a vector, BM25 alone.
        ``min_cosine`` (the relevance floor): a turn the dense side finds counts only at this
        cosine or above, so a turn sharing no word with the question and unlike it is left out."""
        depth = max(k * CANDIDATES_PER_K, k)
        lexical = self.search(query, depth)
        dense = self.nearest(vector, depth) if vector is not None else []
        return fuse_turns(lexical, dense, k, rrf_k, min_cosine)


def fuse_turns(lexical: list[tuple[Doc, float]], dense: list[tuple[Doc, float]], k: int, rrf_k: int = RRF_K,
               min_cosine: float | None = None) -> list[tuple[Doc, float]]:
    """The keyword and dense rankings of past turns (each best first; dense scored by cosine)
    fused by reciprocal rank, best ``k`` first; a dense hit below ``min_cosine`` that the keyword
    ranking did not find is left out (the floor is for turns sharing no word with the question: a
    turn both halves found keeps its dense vote, else a floor demotes the very turns it should keep).
    Without dense hits, the keyword ranking alone, scored as the fusion would (recall's score
    fusion compares them). Shared by the in-memory index and the graph's (services/recall/turns.py)."""
    if min_cosine is not None:
        found = {doc.uuid for doc, _ in lexical}
        dense = [(doc, cos) for doc, cos in dense if cos >= min_cosine or doc.uuid in found]
    if not dense:
        return [(doc, 1.0 / (rrf_k + rank + 1)) for rank, (doc, _) in enumerate(lexical[:k])]
    fused: dict[str, float] = {}
    by_uuid: dict[str, Doc] = {}
    for ranking in (lexical, dense):
        for rank, (doc, _) in enumerate(ranking):
            fused[doc.uuid] = fused.get(doc.uuid, 0.0) + 1.0 / (rrf_k + rank + 1)
            by_uuid.setdefault(doc.uuid, doc)
    best = sorted(fused, key=lambda u: -fused[u])[:k]  # stable: ties keep the keyword order
    return [(by_uuid[u], fused[u]) for u in best]


async def with_followers(hits: list[tuple[Doc, float]], k: int, followers: int,
                         following: Callable[[Doc], Awaitable[Doc | None]], vector: Any = None,
                         min_cosine: float | None = None) -> list[tuple[Doc, float]]:
    """``hits`` with the turn that follows each of the first ``followers`` right after it (when
    not already there), scored as the turn it follows, ``k`` at most. ``following``: a turn's next
    turn in time, or None. With ``min_cosine`` a follower whose vector is below it is not brought."""
    if followers <= 0:
        return hits
    seen = {doc.uuid for doc, _ in hits}
    query_unit = unit_vector(vector) if min_cosine is not None and vector is not None else None
    out: list[tuple[Doc, float]] = []
    for rank, (doc, score) in enumerate(hits):
        out.append((doc, score))
        after = await following(doc) if rank < followers else None
        if after is not None and query_unit is not None and after.vector is not None \
                and after.vector.size == query_unit.size and float(after.vector @ query_unit) < min_cosine:
            after = None  # below the floor: an exchange unlike the question adds nothing
        if after is not None and after.uuid not in seen:
            seen.add(after.uuid)
            out.append((after, score))
    return out[:k]


class LexicalEpisodes:
    """BM25 indexes of the groups this recall replica searched most recently (bounded LRU)."""

    def __init__(self, max_groups: int = DEFAULT_MAX_GROUPS, max_bytes: int = DEFAULT_MAX_BYTES,
                 fact_keys: bool = False, source: Source = EPISODES) -> None:
        self.source = source  # EPISODES (past turns) or FACTS (current facts' text)
        self.max_groups = max_groups
        self.max_bytes = max_bytes
        # A turn is also found by the text of the facts it produced (LongMemEval's K = V + fact).
        # Read when the turn is indexed: a fact a later turn adds to it (a restatement) joins its
        # key when the index is rebuilt (eviction, restart), not before -- partial, on purpose: a
        # re-read of every turn's facts per change would cost O(facts) per request.
        self.fact_keys = fact_keys
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
            self.indexed_bytes -= index.held_bytes
            INDEXED_BYTES.dec(index.held_bytes)
            if reason:
                EVICTIONS.labels(reason=reason).inc()

    def _keep(self, group_id: str, index: EpisodeIndex) -> None:
        """Store ``index`` as the most recently used, then evict down to the bounds. No await in
        here: the map and the byte count change together."""
        self._drop(group_id, None)
        if index.held_bytes > self.max_bytes:
            EVICTIONS.labels(reason="too_large").inc()
            return
        self.indexes[group_id] = index
        self.indexed_bytes += index.held_bytes
        INDEXED_BYTES.inc(index.held_bytes)
        while len(self.indexes) > self.max_groups:
            self._drop(next(iter(self.indexes)), "groups")
        while self.indexed_bytes > self.max_bytes:
            self._drop(next(iter(self.indexes)), "bytes")

    async def _current(self, driver: Any, group_id: str) -> EpisodeIndex:
        lock = self.locks.get(group_id)
        if lock is None:
            lock = self.locks[group_id] = asyncio.Lock()
        async with lock:
            listing = await episode_listing(driver, group_id, self.source)
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
                    rows = await query_rows(driver, self.source.rows, g=group_id)
                else:
                    rows = await query_rows(driver, self.source.rows_in, g=group_id, uuids=sorted(missing))
                # Read after the uuids: an episode written in between is added now, one deleted
                # in between is absent here; the next request's comparison settles either.
                facts = await self._facts_of(driver, group_id, [r["uuid"] for r in rows if r["uuid"] not in index.uuids])
                for r in rows:
                    if r["uuid"] not in index.uuids:
                        index.add(Doc.of(r, facts.get(r["uuid"], ())))
            index.listing = listing if index.uuids == in_graph else None
            self._keep(group_id, index)
            return index

    async def _facts_of(self, driver: Any, group_id: str, uuids: list[str]) -> dict[str, list[str]]:
        """episode uuid -> the facts it produced, when the index keeps fact keys."""
        if not self.fact_keys or not uuids or self.source is not EPISODES:
            return {}
        out: dict[str, list[str]] = {}
        for at in range(0, len(uuids), FACT_KEY_BATCH):
            rows = await query_rows(driver, Q_FACTS_OF, g=group_id, uuids=uuids[at:at + FACT_KEY_BATCH])
            out.update({r["uuid"]: [f for f in r["facts"] or [] if f] for r in rows})
        return out

    async def search(self, driver: Any, group_id: str, query: str, k: int,
                     vector: Any = None, followers: int = 0, min_cosine: float | None = None) -> list[tuple[Doc, float]]:
        """The group's best ``k`` past turns for ``query``: BM25 fused with the turn vectors'
        cosine to ``vector`` when given (:meth:`EpisodeIndex.hybrid`), else BM25 alone. The first
        ``followers`` turns each bring the turn that follows them right after them (when not
        already returned), with the score of the turn they follow: an answer often continues in
        the next exchange. ``min_cosine``: the relevance floor (:meth:`EpisodeIndex.hybrid`); a
        follower below it is not brought either ("Thanks, that's all for today" after the answer)."""
        index, vector = await asyncio.gather(self._current(driver, group_id), resolved(vector))
        hits = index.hybrid(query, vector, k, min_cosine=min_cosine) if vector is not None else index.search(query, k)

        async def following(doc: Doc) -> Doc | None:
            return index.following(doc.uuid)

        return await with_followers(hits, k, followers, following, vector, min_cosine)
