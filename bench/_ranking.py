"""Ranking and scoring primitives shared by bench/recall_quality.py and its bars (bench/_flat_bars.py):
the budget fill rule, what is inside a line, the provenance rule every row is scored with,
tokens-to-evidence, BM25 (plain and stemmed), dense cosine and reciprocal-rank fusion.

The provenance rule (one for every row, engram's and the flat ones): a line holding a fact counts
for the messages of the turn(s) it came from (its episodes' source message ids, stored on the
Episodic nodes); a line holding a turn counts for the messages whose text it holds
(:func:`holds`: the first 80% of the message, whitespace normalised); a line holding an entity
(its name and summary) counts for no message (a summary cites none)."""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import bm25s
import numpy as np
import Stemmer

from engram.text.temporal import strip_grounding

MAX_ITEMS = 80  # items asked for: ~25 fit 2,000 tokens; a response this long means the count bound (checked).
# Not 200: recall's near-duplicate merge is quadratic in it (~0.5 s a request at 200 on 2 cores).
INSIDE_SHARE = 0.8  # a shortened turn holds a message when this share of its text (from the start) is in it
RRF_K = 60


# --- context at a token budget ----------------------------------------------------------------

def normalized(text: str) -> str:
    return " ".join(text.split())


def holds(line: str, message: str, share: float = INSIDE_SHARE) -> bool:
    """``message`` is inside ``line``: its first ``share`` of text (whitespace normalised) is there.
    The dates recall writes after relative expressions ("last Friday (2023-05-05)") are not text
    the message lacks: they are removed before the comparison (their tokens still count)."""
    text = normalized(message)
    return bool(text) and text[: max(1, math.ceil(share * len(text)))] in normalized(strip_grounding(line))


def fill(lines: Sequence[str], budget: int, count_tokens: Callable[[str], int], header: str = "") -> int:
    """How many of ``lines`` (best first) the context holds: add lines until the next one does not
    fit ``budget`` tokens (the recall service's rule), then shrink until the joined text fits."""
    used, n = count_tokens(header), 0
    for line in lines:
        cost = count_tokens(line)
        if used + cost > budget:
            break
        used += cost
        n += 1
    while n and count_tokens(header + "".join(lines[:n])) > budget:
        n -= 1
    return n


@dataclass
class Outcome:
    """One method's result for one question at one budget."""

    hit: bool  # any evidence message inside the context
    tokens: int
    items: int
    hit_by_provenance: bool | None = None  # engram only: every provenance message of a kept turn counts
    all_hit: bool = False  # every evidence message of the question inside the context (recall_all)
    # the smallest context (tokens) holding an evidence message, by the same fill rule; inf when
    # none does within the largest budget (budget independent: the same in each budget's outcome)
    need: float = math.inf


def need_of(costs: Sequence[int], joint: Callable[[int], int], holding: Sequence[bool], cap: int, base: int = 0) -> float:
    """Tokens of the shortest prefix that holds an evidence line, under the fill rule: lines are
    added while the summed line costs (plus ``base``, a header's) fit, then the joined text must
    fit too, so a prefix of n lines is in the context at budget B iff max(summed, joined(n)) <= B.
    inf when no line holds evidence or that prefix exceeds ``cap`` (the largest budget asked: what
    lies beyond it is not measured for engram, whose response stops there)."""
    used = base
    for n, (cost, hold) in enumerate(zip(costs, holding), start=1):
        used += cost
        if used > cap:
            return math.inf
        if hold:
            need = max(used, joint(n))
            return need if need <= cap else math.inf
    return math.inf


def tokens_to(needs: Sequence[float], share: float) -> float:
    """The smallest context (tokens) at which ``share`` of the questions have an evidence message
    inside: the ceil(share * n)-th smallest per-question need; inf when not reached."""
    if not needs:
        return math.nan
    ordered = sorted(needs)
    return ordered[max(1, math.ceil(share * len(ordered) - 1e-9)) - 1]


# --- flat retrievers over raw texts -----------------------------------------------------------

_STEMMER = Stemmer.Stemmer("english")


def bm25_index(texts: list[str], stem: bool) -> tuple[bm25s.BM25, Callable[[str], list[str]]]:
    """A bm25s index (Lucene BM25, k1 1.5, b 0.75) and the query tokenizer that matches it."""
    options = {"stopwords": "en", "stemmer": _STEMMER.stemWords} if stem else {"stopwords": None}

    def tok(batch: list[str]) -> list[list[str]]:
        return bm25s.tokenize(batch, return_ids=False, show_progress=False, **options)

    index = bm25s.BM25()
    index.index(tok(texts), show_progress=False)
    vocab = index.vocab_dict
    return index, lambda query: [t for t in tok([query])[0] if t in vocab]


def bm25_ranking(index: bm25s.BM25, query: list[str], limit: int = MAX_ITEMS) -> list[int]:
    """Documents with a positive score, best first (ties: document order)."""
    if not query:
        return []
    scores = index.get_scores(query)
    order = np.lexsort((np.arange(len(scores)), -scores))
    return [int(i) for i in order if scores[i] > 0][:limit]


def dense_ranking(doc_vectors: np.ndarray, query_vector: np.ndarray, limit: int = MAX_ITEMS) -> list[int]:
    if not len(doc_vectors):
        return []
    sims = doc_vectors @ query_vector
    return [int(i) for i in np.argsort(-sims, kind="stable")[:limit]]


def rrf(*rankings: list[int], k: int = RRF_K, limit: int = MAX_ITEMS) -> list[int]:
    """Reciprocal-rank fusion, equal weights (ties: document order)."""
    scores: dict[int, float] = defaultdict(float)
    for ranking in rankings:
        for rank, doc in enumerate(ranking):
            scores[doc] += 1 / (k + rank + 1)
    return sorted(scores, key=lambda d: (-scores[d], d))[:limit]


async def unit_vectors(embedder, texts: list[str], queries: bool = False) -> np.ndarray:  # noqa: ANN001
    """``texts`` embedded as stored text, or as questions (``queries``: an e5 model's ``query:``
    side, as recall embeds a question), unit length."""
    if not texts:
        return np.zeros((0, 1), dtype=np.float32)
    create_query = getattr(embedder, "create_query", None) if queries else None
    if create_query is not None:
        vectors = np.asarray([await create_query(t) for t in texts], dtype=np.float32)
    else:
        vectors = np.asarray(await embedder.create_batch(texts), dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)



# --- the provenance rule, and scoring a ranked list of lines ----------------------------------

def fact_inside(episodes: Iterable[str], message_ids: Mapping[str, Sequence[str]]) -> frozenset[str]:
    """A fact's line counts for the source messages of the turns it came from (its episodes)."""
    return frozenset(mid for episode in episodes for mid in message_ids.get(episode, ()))


def turn_inside(line: str, message_ids: Iterable[str], said: Mapping[str, str]) -> frozenset[str]:
    """A turn's line counts for the messages whose text it holds (:func:`holds`: a shortened turn
    may have lost some)."""
    return frozenset(mid for mid in message_ids if holds(line, said.get(mid, "")))


ENTITY_INSIDE: frozenset[str] = frozenset()  # an entity's name and summary cite no message


@dataclass(frozen=True)
class Line:
    """One item of a flat context as rendered ("- text\n") and the messages it counts for."""

    text: str
    inside: frozenset[str]


def score_lines(lines: Sequence[Line], evidence: frozenset[str], budgets: Sequence[int],
                count_tokens: Callable[[str], int]) -> dict[int, Outcome]:
    """Budget -> outcome of one question for a ranked list of lines with no header: the flat
    rows' context, filled by :func:`fill`; the need by :func:`need_of` up to the largest budget.
    Only the lines that can reach the largest budget are costed (a ranking may be long)."""
    cap = max(budgets)
    costs: list[int] = []
    for line in lines:
        costs.append(count_tokens(line.text))
        if sum(costs) > cap:
            break
    texts = [line.text for line in lines[:len(costs)]]
    need = need_of(costs, lambda n: count_tokens("".join(texts[:n])),
                   [bool(line.inside & evidence) for line in lines[:len(costs)]], cap)
    out: dict[int, Outcome] = {}
    for budget in budgets:
        n = fill(texts, budget, count_tokens)
        kept = frozenset().union(*(line.inside for line in lines[:n]))
        out[budget] = Outcome(bool(kept & evidence), count_tokens("".join(texts[:n])) if n else 0, n,
                              all_hit=bool(evidence) and evidence <= kept, need=need)
    return out
