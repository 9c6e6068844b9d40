"""Adaptive chunking for entity extraction and covering chunks for edge extraction.

Pure functions. Sizes are in tokens, counted by a ``count_tokens`` callable (normally
:func:`engram.text.tokens.token_counter`, which counts real cl100k tokens offline). Settings (:class:`ChunkingSettings`) follow the
episode-processing design (seed 002) and graphiti-core's ``helpers.py``:

====================  =======  ============================================================
setting               default  meaning
====================  =======  ============================================================
chunk_token_size      3000     largest chunk, in tokens (graphiti ``CHUNK_TOKEN_SIZE``)
chunk_overlap_tokens  200      at most this many tokens repeated between consecutive chunks
                               (``CHUNK_OVERLAP_TOKENS``)
chunk_min_tokens      1000     content shorter than this is never chunked
                               (``CHUNK_MIN_TOKENS``)
density_threshold     0.15     entities per token at/above which large content is chunked
                               (``CHUNK_DENSITY_THRESHOLD``)
max_nodes_per_chunk   10       entities per covering chunk for edge extraction (``MAX_NODES``)
max_unchunked_tokens  8000     content above this is chunked whatever its density (engram's
                               own bound, not in seed 002; see below)
====================  =======  ============================================================

Why ``max_unchunked_tokens`` = 8000: seed 002 leaves sparse prose whole however long it is,
which is right for ordinary turns (context across the text) but sends a pasted 1 MB message
(~250k tokens) to the LLM in one prompt that no model takes. 8000 tokens (~32k characters of
English) keeps every ordinary turn, and the benchmarks' turns, on the single-pass path, while
the whole prompt (the content, ~2k tokens of graphiti's instructions, the previous-episodes
window and the answer) still fits a 16k-token context model. Above it no LLM prompt carries
more than ``max(max_unchunked_tokens, chunk_token_size)`` tokens of one episode's content
(the pipeline also extracts facts per chunk there: services/extractor/pipeline.py).

Rules
-----
* :func:`should_chunk`: True if the content has more than ``max_unchunked_tokens`` tokens;
  otherwise only if it has ``>= chunk_min_tokens`` tokens AND its :func:`entity_density` is
  ``>= density_threshold``. Short content and sparse prose up to the bound stay whole.
* :func:`entity_density`: a cheap, deterministic estimate of entity mentions per token. A
  whitespace-separated word counts as one mention if it (a) contains a digit (numbers, dates,
  versions, ids), (b) looks like an identifier, path or address (``snake_case``, ``camelCase``,
  ``a.b``, ``a/b``, ``a::b``, ``x@y``, ``://``, a leading ``@ # / ~``, or a backtick-quoted word),
  (c) is an all-caps acronym of 2+ letters, or (d) is capitalised (2+ characters) and not the
  first word of a sentence or line. Consecutive capitalised words with no punctuation between
  them ("Acme Corp", ``"Alice Smith"``) count once. Quoted names count through these rules (the
  quotes are ignored). The count is divided by the token count and capped at 1.0. For JSON the
  same scan sees values: names, ids, numbers and e-mail addresses count, lower-case keys do not;
  indentation is tokens too, so pretty-printed JSON scores lower than the same data compact.
  It is a proxy, not NER: a capitalised sentence starter ("Alice met Bob") is missed, capitalised
  words in headings and titles and shouted all-caps text are over-counted.
* :func:`chunk_text`: the text is cut into units -- paragraphs (split at blank lines), then
  sentences (split after ``. ! ? …`` plus closing quotes/brackets when whitespace follows, after
  ``。！？``, and at every line break), and a sentence larger than ``chunk_token_size`` is cut into
  its words. Units are packed greedily, in order, up to ``chunk_token_size`` tokens (checked on
  the real chunk text). A chunk ends at the last paragraph break that fits if the chunk is then
  at least half full, otherwise after the last unit that fits. The next chunk starts with the
  longest run of whole trailing units of the previous chunk that has at most
  ``chunk_overlap_tokens`` tokens (and still leaves room for the next unit), so overlap is whole
  sentences (whole words inside an over-long sentence) and none when the last sentence alone is
  longer than the overlap. Every chunk is an exact slice of the input (stripped of surrounding
  whitespace); together the chunks cover every non-whitespace character, in order. Text that
  fits returns ``[text.strip()]``; blank text returns ``[]``.
* :func:`chunk_json`: a JSON array is split between elements (each chunk a valid, compact JSON
  array), a JSON object between top-level keys (each chunk a valid JSON object). JSON chunks do
  NOT overlap: elements and entries are self-contained records, and repeating them would only
  repeat extraction work; every element/entry appears in exactly one chunk, in order. Content
  that fits returns the original text; invalid JSON, ``NaN``/``Infinity`` and top-level scalars
  are chunked with :func:`chunk_text`.
* :func:`chunk_messages`: a turn's messages are packed in order (measured joined by newlines),
  never split; consecutive chunks share whole trailing messages worth at most
  ``chunk_overlap_tokens`` tokens.
* :func:`chunk_labelled`: one message larger than ``chunk_token_size`` (``label`` + body, e.g.
  ``"user (Ada): "`` + a pasted document) is cut with :func:`chunk_text` and every piece starts
  with the label, so a model reading any piece knows who said it; each piece, label included,
  has at most ``chunk_token_size`` tokens (the label's tokens come off the body's budget).
* :func:`merge_entity_names`: case-insensitive union (after stripping whitespace) that keeps the
  first-seen spelling and the first-seen order; blank names are dropped.
* :func:`assign_pairs` / :func:`covering_chunks`: entity groups of at most ``max_per_chunk``
  entities such that every unordered pair of distinct positions appears together in at least
  one group, and each pair is owned by exactly one group (the group whose edge extraction
  examines it). See :func:`covering_chunk_count` for the number of groups.

Limits
------
* A single word larger than ``chunk_token_size`` (a base64 blob, a URL, CJK text without spaces
  or punctuation) is never split: it becomes one over-sized chunk. Likewise one over-sized JSON
  element/entry or one over-sized message is its own over-sized chunk.
* Sentence splitting is heuristic: abbreviations ("Dr. Smith") end a sentence too.
* JSON chunks are re-serialised compactly (``ensure_ascii=False``); duplicate keys in an object
  collapse to the last value, as with any JSON parser.
* Token counts of concatenations are not additive: packing guesses with per-unit counts, then
  shrinks/grows each chunk by its real count, so limits hold for the ``count_tokens`` given.
  Cost: every unit is counted once, plus a few counts of each chunk (linear in the input).
* Covering groups are within about 2x of the known lower bound; they are deterministic and
  linear in the number of pairs, not an optimal covering design.
"""

from __future__ import annotations

import json
import logging
import math
import re
from bisect import bisect_left
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from engram.text.tokens import CountTokens, estimate_tokens, token_counter  # noqa: F401 - the last two re-exported for bench/

logger = logging.getLogger("engram.extractor")

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# Settings and the chunking decision
# ---------------------------------------------------------------------------------------------


class ChunkingSettings(BaseModel):
    """Chunking limits; defaults from the episode-processing design (see module docstring)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    chunk_token_size: int = Field(3000, gt=0, description="Largest chunk, in tokens.")
    chunk_overlap_tokens: int = Field(200, ge=0, description="Max tokens shared by consecutive chunks.")
    chunk_min_tokens: int = Field(
        1000, ge=0, description="Content with fewer tokens is never chunked (0: size never blocks)."
    )
    density_threshold: float = Field(
        0.15, gt=0.0, le=1.0, description="Chunk large content at/above this many entities per token."
    )
    max_nodes_per_chunk: int = Field(10, ge=2, description="Entities per covering chunk (edge extraction).")
    max_unchunked_tokens: int = Field(
        8000, gt=0,
        description="Content with more tokens is always chunked, and its facts extracted per chunk, whatever "
        "its density: bounds every extraction prompt (services/extractor/chunking.py says why 8000).",
    )

    @model_validator(mode="after")
    def _overlap_below_size(self) -> ChunkingSettings:
        if self.chunk_overlap_tokens >= self.chunk_token_size:
            raise ValueError("chunk_overlap_tokens must be smaller than chunk_token_size")
        return self


_WORD_RE = re.compile(r"\S+")
_EDGE_PUNCT = "\"'“”‘’«»()[]{}<>,;:.!?*"
_SENTENCE_END_RE = re.compile(r"[.!?…][\"'“”‘’»)\]]*$")
_IDENTIFIER_RE = re.compile(r"\w_|_\w|[a-z][A-Z]|\w(?:[./\\@#]|::)\w|^[@#~/\\]\w|://")
_NOT_IDENTIFIERS = frozenset({"e.g", "i.e", "a.m", "p.m", "etc"})


def _entity_mentions(text: str) -> int:
    """Entity-like mentions in ``text`` (the rules are in the module docstring)."""
    count = 0
    in_run = False  # the previous word was a counted capitalised word with nothing after it
    sentence_start = True
    prev_end = 0
    for m in _WORD_RE.finditer(text):
        word = m.group()
        if "\n" in text[prev_end : m.start()]:
            sentence_start, in_run = True, False
        prev_end = m.end()
        core = word.strip(_EDGE_PUNCT)
        capital = len(core) >= 2 and core[0].isupper()
        if any(c.isdigit() for c in core):
            count += 1
            in_run = False
        elif word.startswith("`") or (_IDENTIFIER_RE.search(core) and core.lower() not in _NOT_IDENTIFIERS):
            count += 1
            in_run = False
        elif capital and sum(c.isalpha() for c in core) >= 2 and core.isupper():
            count += 1  # acronym: counts even at a sentence start
            in_run = False
        elif capital and not sentence_start:
            if not in_run:
                count += 1
            in_run = True
        else:
            in_run = False
        if core and word[-1] in _EDGE_PUNCT and word[-1] not in "\"'“”‘’«»":
            in_run = False  # "Alice, Bob" are two names; a closing quote keeps the run
        sentence_start = bool(_SENTENCE_END_RE.search(word))
    return count


def entity_density(text: str, count_tokens: CountTokens) -> float:
    """Estimated entity mentions per token, in [0, 1]; 0.0 for blank text."""
    return _density(text, count_tokens(text))


def _density(text: str, tokens: int) -> float:
    if tokens <= 0:
        return 0.0
    return min(1.0, _entity_mentions(text) / tokens)


def should_chunk(text: str, settings: ChunkingSettings, count_tokens: CountTokens) -> bool:
    """Chunk content longer than ``max_unchunked_tokens`` (no model takes an unbounded prompt);
    below that, only content that is large (``>= chunk_min_tokens``) AND entity-dense
    (``entity_density >= density_threshold``)."""
    tokens = count_tokens(text)
    if tokens > settings.max_unchunked_tokens:
        return True
    if tokens == 0 or tokens < settings.chunk_min_tokens:
        return False
    return _density(text, tokens) >= settings.density_threshold


# ---------------------------------------------------------------------------------------------
# Greedy packing shared by text, JSON and messages
# ---------------------------------------------------------------------------------------------


def _pack(
    sizes: Sequence[int],
    limit: int,
    overlap: int,
    measure: Callable[[int, int], int],
    breaks: Sequence[int] = (),
) -> list[tuple[int, int]]:
    """Pack units ``0..n-1`` into half-open ranges ``[start, end)``, in order.

    ``sizes`` are per-unit token estimates that guide a greedy first guess; ``measure(a, b)``
    is the real token count of units a..b-1 rendered as one chunk and decides. Every unit is in
    a range; a range holds at most ``limit`` tokens unless it is a single unit that is larger.
    Each range adds at least one new unit and may start with trailing units of the previous
    range worth at most ``overlap`` tokens. ``breaks`` (sorted) are preferred ends: indices of
    units that start a paragraph.
    """
    n = len(sizes)
    ranges: list[tuple[int, int]] = []
    start = new = 0
    while new < n:
        end = new + 1
        total = sum(sizes[start:end])
        while end < n and total + sizes[end] <= limit:
            total += sizes[end]
            end += 1
        while end - new > 1 and measure(start, end) > limit:
            end -= 1
        while start < new and measure(start, end) > limit:
            start += 1
        while end < n and measure(start, end + 1) <= limit:
            end += 1
        if end < n and breaks:
            i = bisect_left(breaks, end) - 1
            if i >= 0 and breaks[i] > new and 2 * measure(start, breaks[i]) >= limit:
                end = breaks[i]
        ranges.append((start, end))
        if end >= n:
            break
        nxt = end
        while (
            overlap > 0
            and nxt - 1 > start
            and measure(nxt - 1, end) <= overlap
            and measure(nxt - 1, end + 1) <= limit
        ):
            nxt -= 1
        start, new = nxt, end
    return ranges


# ---------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------

_PARAGRAPH_BREAK_RE = re.compile(r"\n[^\S\n]*\n\s*")
_SENTENCE_BREAK_RE = re.compile(r"[.!?…]+[\"'“”‘’»)\]]*\s+|\s*\n\s*|[。！？]+\s*")


def _trim(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _split(text: str, start: int, end: int, separator: re.Pattern[str]) -> list[tuple[int, int]]:
    """Non-blank, trimmed spans of ``text[start:end]`` between matches of ``separator``."""
    spans = []
    pos = start
    for m in separator.finditer(text, start, end):
        spans.append(_trim(text, pos, m.end()))
        pos = m.end()
    spans.append(_trim(text, pos, end))
    return [(a, b) for a, b in spans if a < b]


def _text_units(
    text: str, start: int, end: int, limit: int, count_tokens: CountTokens
) -> tuple[list[tuple[int, int]], list[int]]:
    """Sentence (or, inside an over-long sentence, word) spans, and the unit indices that
    start a new paragraph."""
    units: list[tuple[int, int]] = []
    breaks: list[int] = []
    for p_start, p_end in _split(text, start, end, _PARAGRAPH_BREAK_RE):
        if units:
            breaks.append(len(units))
        for s_start, s_end in _split(text, p_start, p_end, _SENTENCE_BREAK_RE):
            if count_tokens(text[s_start:s_end]) > limit:
                units.extend((m.start(), m.end()) for m in _WORD_RE.finditer(text, s_start, s_end))
            else:
                units.append((s_start, s_end))
    return units, breaks


def chunk_text_spans(text: str, settings: ChunkingSettings, count_tokens: CountTokens) -> list[tuple[int, int]]:
    """Like :func:`chunk_text`, but returns the ``(start, end)`` offsets of each chunk."""
    first, last = _trim(text, 0, len(text))
    if first == last:
        return []
    limit = settings.chunk_token_size
    if count_tokens(text[first:last]) <= limit:
        return [(first, last)]
    units, breaks = _text_units(text, first, last, limit, count_tokens)
    # each unit's estimate includes the whitespace before it, as it appears inside a chunk
    sizes = [count_tokens(text[(units[i - 1][1] if i else s) : e]) for i, (s, e) in enumerate(units)]

    def measure(a: int, b: int) -> int:
        return count_tokens(text[units[a][0] : units[b - 1][1]])

    ranges = _pack(sizes, limit, settings.chunk_overlap_tokens, measure, breaks)
    return [(units[a][0], units[b - 1][1]) for a, b in ranges]


def chunk_text(text: str, settings: ChunkingSettings, count_tokens: CountTokens) -> list[str]:
    """Split text at paragraph, then sentence, then word boundaries into overlapping chunks of at
    most ``chunk_token_size`` tokens (rules in the module docstring)."""
    return [text[a:b] for a, b in chunk_text_spans(text, settings, count_tokens)]


# ---------------------------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------------------------


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def chunk_json(text: str, settings: ChunkingSettings, count_tokens: CountTokens) -> list[str]:
    """Split a JSON array between elements / a JSON object between top-level keys; every chunk
    is valid JSON of the same kind, chunks do not overlap. Anything else goes to chunk_text."""
    try:
        data = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        return chunk_text(text, settings, count_tokens)
    if not isinstance(data, (list, dict)):
        return chunk_text(text, settings, count_tokens)
    limit = settings.chunk_token_size
    if count_tokens(text) <= limit:
        return [text.strip()]
    render: Callable[[int, int], str]
    if isinstance(data, list):
        units: list[str] = [_dumps(element) for element in data]
        items_list = data

        def render(a: int, b: int) -> str:
            return _dumps(items_list[a:b])

    else:
        entries = list(data.items())
        units = [_dumps(dict([entry])) for entry in entries]

        def render(a: int, b: int) -> str:
            return _dumps(dict(entries[a:b]))

    if not units:
        return [text.strip()]
    sizes = [count_tokens(u) for u in units]
    ranges = _pack(sizes, limit, 0, lambda a, b: count_tokens(render(a, b)))
    return [render(a, b) for a, b in ranges]


# ---------------------------------------------------------------------------------------------
# Messages
# ---------------------------------------------------------------------------------------------


def chunk_messages(
    messages: Sequence[str], settings: ChunkingSettings, count_tokens: CountTokens
) -> list[list[str]]:
    """Group a turn's messages, in order and never split, into chunks of at most
    ``chunk_token_size`` tokens (joined by newlines); a larger message is a chunk of its own.
    Consecutive chunks share whole trailing messages worth at most ``chunk_overlap_tokens``."""
    if not messages:
        return []
    msgs = list(messages)
    sizes = [count_tokens(m) + (1 if i else 0) for i, m in enumerate(msgs)]  # + the newline

    def measure(a: int, b: int) -> int:
        return count_tokens("\n".join(msgs[a:b]))

    ranges = _pack(sizes, settings.chunk_token_size, settings.chunk_overlap_tokens, measure)
    return [msgs[a:b] for a, b in ranges]


def chunk_labelled(label: str, body: str, settings: ChunkingSettings, count_tokens: CountTokens) -> list[str]:
    """``label + body`` whole when it fits ``chunk_token_size``; otherwise ``body`` cut by
    :func:`chunk_text` (paragraph/sentence/word boundaries, overlap) into pieces that each start
    with ``label`` and, label included, hold at most ``chunk_token_size`` tokens (except a single
    word too large on its own, as in chunk_text). All-blank input gives ``[]``."""
    whole = label + body
    if count_tokens(whole) <= settings.chunk_token_size:
        return [whole] if whole.strip() else []
    # +1: the label and the piece may merge into different tokens at the seam than apart.
    budget = max(1, settings.chunk_token_size - (count_tokens(label) + 1 if label else 0))
    inner = settings.model_copy(
        update={"chunk_token_size": budget, "chunk_overlap_tokens": min(settings.chunk_overlap_tokens, budget - 1)}
    )
    return [label + piece for piece in chunk_text(body, inner, count_tokens)]


# ---------------------------------------------------------------------------------------------
# Merging chunk results
# ---------------------------------------------------------------------------------------------


def merge_entity_names(chunks_entities: Sequence[Sequence[str]]) -> list[str]:
    """Case-insensitive union of the names extracted from each chunk: first-seen spelling and
    order win; names are stripped and blank ones dropped."""
    seen: set[str] = set()
    merged: list[str] = []
    for names in chunks_entities:
        for name in names:
            clean = name.strip()
            key = clean.casefold()
            if clean and key not in seen:
                seen.add(key)
                merged.append(clean)
    return merged


# ---------------------------------------------------------------------------------------------
# Covering chunks for edge extraction
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CoveringChunk(Generic[T]):
    """One edge-extraction group.

    ``indices`` are the members' positions in the input list (ascending), ``entities`` the
    members themselves; ``owned_pairs`` are the pairs ``(i, j)``, ``i < j`` (input positions)
    that this group -- and no other -- is responsible for examining.
    """

    indices: tuple[int, ...]
    entities: tuple[T, ...]
    owned_pairs: tuple[tuple[int, int], ...]


def _check_max(max_per_chunk: int) -> None:
    if max_per_chunk < 2:
        raise ValueError("max_per_chunk must be at least 2 (a pair needs two places)")


def covering_chunk_count(n: int, max_per_chunk: int) -> int:
    """Number of groups :func:`assign_pairs` makes for ``n`` entities.

    0 for n = 0; 1 for 1 <= n <= k (k = max_per_chunk); otherwise with block size
    b = k // 2 and m = ceil(n / b) blocks: C(m, 2) = m (m - 1) / 2. For k = 10 that is about
    n^2 / 25 groups, roughly twice the Schönheim lower bound ceil(n/k * ceil((n-1)/(k-1))).
    """
    _check_max(max_per_chunk)
    if n <= 0:
        return 0
    if n <= max_per_chunk:
        return 1
    m = -(-n // (max_per_chunk // 2))
    return math.comb(m, 2)


def assign_pairs(entities: Sequence[T], max_per_chunk: int) -> list[CoveringChunk[T]]:
    """Covering groups of at most ``max_per_chunk`` entities plus the pairs each group owns.

    Every unordered pair of distinct positions appears together in at least one group and is
    owned by exactly one group. Pairs are by position, so equal entities at two positions form
    a pair (deduplicate names first, e.g. with :func:`merge_entity_names`).

    Construction: n <= k: one group with everything (none for n = 0). Otherwise the entities
    are split, in order, into m = ceil(n / b) blocks of near-equal size at most b = k // 2, and
    every two blocks form a group (size <= 2b <= k). Group (i, j) owns the pairs across blocks
    i and j; the pairs inside block i are owned by group (i, i+1), the last block's by group
    (0, m-1), which spreads the work evenly. Count: :func:`covering_chunk_count`.
    """
    _check_max(max_per_chunk)
    n = len(entities)
    if n == 0:
        return []
    if n <= max_per_chunk:
        idx = tuple(range(n))
        pairs = tuple((i, j) for i in range(n) for j in range(i + 1, n))
        return [CoveringChunk(idx, tuple(entities), pairs)]
    m = -(-n // (max_per_chunk // 2))
    base, extra = divmod(n, m)
    blocks: list[range] = []
    pos = 0
    for i in range(m):
        size = base + (1 if i < extra else 0)
        blocks.append(range(pos, pos + size))
        pos += size

    def inside(block: range) -> list[tuple[int, int]]:
        return [(a, b) for a in block for b in block if a < b]

    groups: list[CoveringChunk[T]] = []
    for i in range(m):
        for j in range(i + 1, m):
            owned = [(a, b) for a in blocks[i] for b in blocks[j]]
            if j == i + 1:
                owned += inside(blocks[i])
            if i == 0 and j == m - 1:
                owned += inside(blocks[j])
            idx = (*blocks[i], *blocks[j])
            groups.append(CoveringChunk(idx, tuple(entities[k] for k in idx), tuple(sorted(owned))))
    return groups


def covering_chunks(entities: Sequence[T], max_per_chunk: int) -> list[list[T]]:
    """The groups of :func:`assign_pairs`, as lists of entities."""
    return [list(group.entities) for group in assign_pairs(entities, max_per_chunk)]
