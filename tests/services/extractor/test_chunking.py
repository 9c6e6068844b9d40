"""Adaptive chunking and covering chunks (services/extractor/chunking.py). Pure; the tokenizer
(engram/text/tokens.py) is tested in tests/engram/text/test_tokens.py."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from engram.text.tokens import estimate_tokens, token_counter
from engram.services.extractor.chunking import (
    ChunkingSettings,
    assign_pairs,
    chunk_json,
    chunk_labelled,
    chunk_messages,
    chunk_text,
    chunk_text_spans,
    covering_chunk_count,
    covering_chunks,
    entity_density,
    merge_entity_names,
    should_chunk,
)

REPO = Path(__file__).resolve().parents[3]
COUNT = token_counter()
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def words(text: str) -> int:
    """A predictable stand-in tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def small(size: int = 40, overlap: int = 10) -> ChunkingSettings:
    return ChunkingSettings(chunk_token_size=size, chunk_overlap_tokens=overlap, chunk_min_tokens=0)


# --------------------------------------------------------------------------------- settings


def test_settings_defaults_are_the_seed_values() -> None:
    s = ChunkingSettings()
    assert (s.chunk_token_size, s.chunk_overlap_tokens, s.chunk_min_tokens) == (3000, 200, 1000)
    assert (s.density_threshold, s.max_nodes_per_chunk) == (0.15, 10)
    assert s.max_unchunked_tokens == 8000  # engram's bound on one prompt's share of an episode


@pytest.mark.parametrize(
    "bad",
    [
        {"chunk_token_size": 0},
        {"chunk_token_size": 100, "chunk_overlap_tokens": 100},
        {"chunk_overlap_tokens": -1},
        {"chunk_min_tokens": -1},
        {"density_threshold": 0.0},
        {"density_threshold": 1.01},
        {"max_nodes_per_chunk": 1},
        {"max_unchunked_tokens": 0},
        {"unknown": 1},
    ],
)
def test_settings_reject_invalid_values(bad: dict) -> None:
    with pytest.raises(ValidationError):
        ChunkingSettings(**bad)


def test_settings_are_frozen() -> None:
    with pytest.raises(ValidationError):
        ChunkingSettings().chunk_token_size = 5  # type: ignore[misc]


# --------------------------------------------------------------------------------- density


def test_entity_density_counts_the_documented_mentions() -> None:
    # Acme Corp (one run) | Bob | Carol | 2024 | acme.com | foo_bar  -> 6 of 14 words
    text = "we met Acme Corp and Bob, Carol in 2024 at acme.com via foo_bar today"
    assert entity_density(text, words) == pytest.approx(6 / 14)
    assert entity_density("Alice met Bob.", words) == pytest.approx(1 / 3)  # sentence starter skipped
    assert entity_density("The NASA team.", words) == pytest.approx(1 / 3)  # acronym counts anywhere
    assert entity_density('she said "Alice Smith" left', words) == pytest.approx(1 / 5)
    assert entity_density("Alice\nBob", words) == 0.0  # line starts are sentence starts
    assert entity_density("", words) == 0.0
    assert entity_density("   ", COUNT) == 0.0


def test_entity_density_separates_prose_from_entity_dumps() -> None:
    prose = (
        "We talked about the weekend and how tired everyone was after the long trip. "
        "It was nice to rest, and we decided to cook at home instead of going out. "
    ) * 5
    rows = [{"name": f"Person {i}", "email": f"p{i}@example.com", "team": "Infra", "id": i} for i in range(40)]
    assert entity_density(prose, COUNT) < 0.15 < entity_density(json.dumps(rows), COUNT)
    assert entity_density(json.dumps(rows), COUNT) == entity_density(json.dumps(rows), COUNT)
    assert 0.0 <= entity_density("1 2 3 4 5 6 7 8", estimate_tokens) <= 1.0  # capped


# --------------------------------------------------------------------------------- should_chunk


def test_should_chunk_needs_both_size_and_density() -> None:
    s = ChunkingSettings(chunk_min_tokens=10, density_threshold=0.5)
    dense = "x Alice y Bob z Carol w Dave v Eve"  # 10 words, 5 names -> 0.5
    assert entity_density(dense, words) == 0.5
    assert should_chunk(dense, s, words)  # exactly at both thresholds
    assert not should_chunk("x Alice y Bob z Carol w Dave v", s, words)  # 9 tokens: too short
    sparse = "x Alice y Bob z Carol w Dave v e"  # 10 words, 4 names -> 0.4
    assert not should_chunk(sparse, s, words)  # long enough, not dense enough
    assert should_chunk(dense + " " + dense, s, words)  # above both
    assert not should_chunk("", ChunkingSettings(chunk_min_tokens=0), words)


def test_should_chunk_with_the_default_settings_and_real_tokens() -> None:
    s = ChunkingSettings()
    rows = [{"name": f"Person {i}", "email": f"p{i}@example.com", "team": "Infra", "id": i} for i in range(200)]
    big_dense = json.dumps(rows)
    assert COUNT(big_dense) >= 1000 and should_chunk(big_dense, s, COUNT)
    small_dense = json.dumps(rows[:10])
    assert COUNT(small_dense) < 1000 and not should_chunk(small_dense, s, COUNT)
    prose = "We talked about the weekend and how tired everyone was after the long trip. " * 80
    assert COUNT(prose) >= 1000 and not should_chunk(prose, s, COUNT)


def sparse_prose(chars: int) -> str:
    """Lower-case prose (density 0: no digits, no capitals) of at least ``chars`` characters,
    every other word unique (``we`` + a letters-only counter), in sentences and paragraphs."""
    def word(n: int) -> str:
        letters = ""
        while True:
            n, r = divmod(n, 26)
            letters += "abcdefghijklmnopqrstuvwxyz"[r]
            if not n:
                return "q" + letters

    out, n = [], 0
    while sum(map(len, out)) < chars:
        sentence = " ".join(f"we {word(n + i)}" for i in range(6)) + "."
        n += 6
        out.append(sentence + ("\n\n" if n % 60 == 0 else " "))
    return "".join(out).strip()


def test_should_chunk_long_sparse_content_above_the_bound() -> None:
    s = ChunkingSettings(max_unchunked_tokens=500)
    prose = sparse_prose(5000)
    assert entity_density(prose, COUNT) < s.density_threshold and COUNT(prose) > 500
    assert should_chunk(prose, s, COUNT)  # sparse, but above the bound: chunked anyway
    # within the bound the density rule still decides (seed 002)
    assert not should_chunk(prose, ChunkingSettings(max_unchunked_tokens=COUNT(prose)), COUNT)
    assert not should_chunk(prose, ChunkingSettings(), COUNT)  # default bound 8000: whole
    huge = sparse_prose(50_000)
    assert COUNT(huge) > 8000 and should_chunk(huge, ChunkingSettings(), COUNT)


def test_chunk_labelled_cuts_a_long_message_and_labels_every_piece() -> None:
    s = ChunkingSettings()
    label, body = "user (Ada): ", sparse_prose(50_000)
    pieces = chunk_labelled(label, body, s, COUNT)
    assert len(pieces) >= 4
    assert all(p.startswith(label) for p in pieces)
    assert all(COUNT(p) <= s.chunk_token_size for p in pieces)
    seen = {w for p in pieces for w in p[len(label):].split()}
    assert set(body.split()) <= seen  # every word of the message is in some piece
    # consecutive pieces overlap (a sentence cut at a boundary is read whole in one of them)
    assert all(set(a.split()[-3:]) & set(b.split()) for a, b in itertools.pairwise(pieces))


def test_chunk_labelled_keeps_a_fitting_message_whole() -> None:
    assert chunk_labelled("user: ", "short text", ChunkingSettings(), COUNT) == ["user: short text"]
    assert chunk_labelled("", "  ", ChunkingSettings(), COUNT) == []
    pieces = chunk_labelled("", "a b c d e f g h", small(size=3, overlap=1), words)
    assert [p.split() for p in pieces][0] == ["a", "b", "c"] and all(len(p.split()) <= 3 for p in pieces)


# --------------------------------------------------------------------------------- chunk_text

WORDS = ["alpha", "beta", "Gamma", "delta", "42", "x_y", "kappa", "Lambda", "mu", "nu"]


@st.composite
def documents(draw: st.DrawFn) -> str:
    def sentence() -> str:
        n = draw(st.one_of(st.integers(1, 12), st.integers(40, 90)))  # some longer than a chunk
        body = " ".join(draw(st.lists(st.sampled_from(WORDS), min_size=n, max_size=n)))
        return body + draw(st.sampled_from([".", "!", "?", ",", ""]))

    paragraphs = []
    for _ in range(draw(st.integers(0, 6))):
        sentences = [sentence() for _ in range(draw(st.integers(1, 6)))]
        paragraphs.append(draw(st.sampled_from([" ", "  ", "\n"])).join(sentences))
    if draw(st.booleans()):
        paragraphs.append("z" * draw(st.integers(300, 600)))  # one word larger than any chunk
    seps = draw(st.lists(st.sampled_from(["\n\n", "\n \n\n", " "]), min_size=len(paragraphs), max_size=len(paragraphs)))
    lead, trail = draw(st.sampled_from(["", "  \n"])), draw(st.sampled_from(["", "\n\n "]))
    return lead + "".join(p + s for p, s in zip(paragraphs, seps)) + trail


def check_spans(text: str, spans: list[tuple[int, int]], s: ChunkingSettings, count) -> None:
    """The chunk_text contract, from outside."""
    stripped = text.strip()
    if not stripped:
        assert spans == []
        return
    assert spans[0][0] == len(text) - len(text.lstrip())
    assert spans[-1][1] == len(text.rstrip())
    for a, b in spans:
        chunk = text[a:b]
        assert chunk and chunk == chunk.strip()
        assert a == 0 or text[a - 1].isspace(), "chunk starts mid-word"
        assert b == len(text) or text[b].isspace(), "chunk ends mid-word"
        assert count(chunk) <= s.chunk_token_size or len(chunk.split()) == 1
    for (a1, b1), (a2, b2) in itertools.pairwise(spans):
        assert a1 < a2 and b1 < b2, "chunks out of order"
        if a2 >= b1:
            assert not text[b1:a2].strip(), "text between chunks was dropped"
        else:
            assert count(text[a2:b1]) <= s.chunk_overlap_tokens


@PROPS
@given(text=documents(), size=st.integers(8, 60), overlap_frac=st.floats(0, 0.9))
def test_chunk_text_properties(text: str, size: int, overlap_frac: float) -> None:
    s = small(size, int(size * overlap_frac))
    spans = chunk_text_spans(text, s, COUNT)
    check_spans(text, spans, s, COUNT)
    assert chunk_text(text, s, COUNT) == [text[a:b] for a, b in spans]


def test_chunk_text_short_and_blank() -> None:
    assert chunk_text("  Hello there.\n", ChunkingSettings(), COUNT) == ["Hello there."]
    assert chunk_text(" \n\t ", ChunkingSettings(), COUNT) == []


def test_chunk_text_prefers_paragraph_breaks_then_sentences() -> None:
    p1 = "One two three. Four five six."  # 6 words
    p2 = "Seven eight nine. Ten eleven twelve. Thirteen fourteen fifteen."  # 9 words
    text = f"{p1}\n\n{p2}"
    # 12 words per chunk: p1 + the first two sentences of p2 would fit, but the paragraph
    # break comes first and leaves the chunk half full
    assert chunk_text(text, small(12, 0), words) == [p1, p2]
    # 20 words: everything fits in one chunk
    assert chunk_text(text, small(20, 0), words) == [text]
    # inside a paragraph the cut is at a sentence boundary
    assert chunk_text(p2, small(7, 0), words) == ["Seven eight nine. Ten eleven twelve.", "Thirteen fourteen fifteen."]


def test_chunk_text_overlaps_by_whole_sentences() -> None:
    sentences = [f"Sentence number {i} is here." for i in range(30)]  # 5 words each
    text = " ".join(sentences)
    chunks = chunk_text(text, small(20, 11), words)
    assert len(chunks) > 3
    for prev, nxt in itertools.pairwise(chunks):
        prev_s = [x + "." for x in prev.removesuffix(".").split(". ")]
        next_s = [x + "." for x in nxt.removesuffix(".").split(". ")]
        assert prev_s[-2:] == next_s[:2]  # 10 of the 11 overlap words: two whole sentences
        assert next_s[2] not in prev_s
    assert sentences == list(dict.fromkeys(s for c in chunks for s in [x + "." for x in c.removesuffix(".").split(". ")]))


def test_chunk_text_splits_a_long_sentence_at_words_only() -> None:
    sentence = " ".join(f"word{i}" for i in range(100))
    chunks = chunk_text(sentence, small(30, 5), words)
    assert all(words(c) <= 30 for c in chunks)
    assert [w for c in chunks for w in c.split()][:30] == sentence.split()[:30]
    assert set(w for c in chunks for w in c.split()) == set(sentence.split())


def test_chunk_text_keeps_a_giant_word_whole() -> None:
    blob = "Q" * 5000
    chunks = chunk_text(f"Before it. {blob} After it.", small(50, 10), COUNT)
    assert blob in chunks
    assert all(blob not in c or c == blob for c in chunks)


def test_chunk_text_default_settings_on_large_text() -> None:
    text = ("Alice met Bob in Berlin on Monday. They talked about the Acme launch. " * 25 + "\n\n") * 60
    s = ChunkingSettings()
    spans = chunk_text_spans(text, s, COUNT)
    assert len(spans) > 5
    check_spans(text, spans, s, COUNT)
    assert all(COUNT(text[a:b]) > 1500 for a, b in spans[:-1])  # chunks are reasonably full


# --------------------------------------------------------------------------------- chunk_json

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@PROPS
@given(data=st.lists(json_values, max_size=40), size=st.integers(10, 80))
def test_chunk_json_array_properties(data: list, size: int) -> None:
    s = small(size, size // 3)
    text = json.dumps(data, indent=1)
    chunks = chunk_json(text, s, COUNT)
    parsed = [json.loads(c) for c in chunks]
    assert all(isinstance(p, list) for p in parsed)
    assert [e for p in parsed for e in p] == data  # every element exactly once, in order: no overlap
    assert all(COUNT(c) <= size or len(p) == 1 for c, p in zip(chunks, parsed))


@PROPS
@given(data=st.dictionaries(st.text(max_size=8), json_values, max_size=30), size=st.integers(10, 80))
def test_chunk_json_object_properties(data: dict, size: int) -> None:
    s = small(size, size // 3)
    chunks = chunk_json(json.dumps(data), s, COUNT)
    parsed = [json.loads(c) for c in chunks]
    assert all(isinstance(p, dict) for p in parsed)
    keys = [k for p in parsed for k in p]
    assert keys == list(data)  # every top-level key exactly once, in order
    assert {k: v for p in parsed for k, v in p.items()} == data
    assert all(COUNT(c) <= size or len(p) == 1 for c, p in zip(chunks, parsed))


def test_chunk_json_small_invalid_and_scalar() -> None:
    s = small(20, 5)
    assert chunk_json('  [1, 2, 3] \n', s, COUNT) == ["[1, 2, 3]"]  # fits: original text
    broken = "[" + ", ".join(f'"Item {i}"' for i in range(30))  # unterminated
    assert chunk_json(broken, s, COUNT) == chunk_text(broken, s, COUNT)
    long_string = json.dumps(" ".join(["word"] * 100))
    assert chunk_json(long_string, s, COUNT) == chunk_text(long_string, s, COUNT)
    nan = "[" + ", ".join(["NaN"] * 40) + "]"
    assert chunk_json(nan, s, COUNT) == chunk_text(nan, s, COUNT)
    assert chunk_json("", s, COUNT) == []


def test_chunk_json_oversized_element_is_its_own_chunk() -> None:
    data = [1, {"text": " ".join(["word"] * 200)}, 2]
    chunks = chunk_json(json.dumps(data), small(30, 5), COUNT)
    assert [json.loads(c) for c in chunks] == [[1], [data[1]], [2]]


# --------------------------------------------------------------------------------- messages

messages_st = st.lists(
    st.tuples(st.sampled_from(["Alice", "Bob"]), st.one_of(st.integers(0, 15), st.integers(60, 90))),
    max_size=25,
).map(lambda specs: [f"{who} #{i}: " + " ".join(["talk"] * n) for i, (who, n) in enumerate(specs)])


@PROPS
@given(messages=messages_st, size=st.integers(10, 60), overlap_frac=st.floats(0, 0.9))
def test_chunk_messages_properties(messages: list[str], size: int, overlap_frac: float) -> None:
    s = small(size, int(size * overlap_frac))
    chunks = chunk_messages(messages, s, COUNT)
    # rebuild the message order by position: each chunk is a contiguous run of whole messages
    position = 0
    starts = []
    for chunk in chunks:
        assert chunk, "empty chunk"
        start = next(i for i in range(max(0, position - len(chunk)), position + 1) if messages[i : i + len(chunk)] == chunk)
        assert start <= position < start + len(chunk), "a chunk adds nothing new or skips messages"
        overlap = messages[start:position]
        assert COUNT("\n".join(overlap)) <= s.chunk_overlap_tokens or not overlap
        assert COUNT("\n".join(chunk)) <= size or len(chunk) == 1
        starts.append(start)
        position = start + len(chunk)
    assert position == len(messages)
    assert starts == sorted(set(starts))


def test_chunk_messages_never_splits_and_isolates_oversized() -> None:
    huge = "Bob: " + " ".join(["word"] * 100)
    msgs = ["Alice: one two", "Bob: three four", huge, "Alice: five six", "Bob: seven"]
    chunks = chunk_messages(msgs, small(8, 4), words)
    assert chunks == [
        ["Alice: one two", "Bob: three four"],
        [huge],
        ["Alice: five six", "Bob: seven"],
    ]
    assert chunk_messages([], ChunkingSettings(), COUNT) == []


def test_chunk_messages_overlap_is_whole_trailing_messages() -> None:
    msgs = [f"M{i}: a b" for i in range(8)]  # 3 words each
    assert chunk_messages(msgs, small(9, 3), words) == [msgs[0:3], msgs[2:5], msgs[4:7], msgs[6:8]]
    assert chunk_messages(msgs, small(9, 0), words) == [msgs[0:3], msgs[3:6], msgs[6:8]]


# --------------------------------------------------------------------------------- merge


def test_merge_entity_names_is_case_insensitive_and_order_stable() -> None:
    merged = merge_entity_names([["Apple Inc", " Bob ", ""], ["apple inc", "Carol", "  "], ["BOB", "Dave", "carol"]])
    assert merged == ["Apple Inc", "Bob", "Carol", "Dave"]
    assert merge_entity_names([]) == []


@given(st.lists(st.lists(st.text(alphabet="abAB ", max_size=4), max_size=5), max_size=5))
def test_merge_entity_names_properties(chunks: list[list[str]]) -> None:
    merged = merge_entity_names(chunks)
    keys = [m.casefold() for m in merged]
    assert len(keys) == len(set(keys)) and all(m and m == m.strip() for m in merged)
    flat = [n.strip() for c in chunks for n in c if n.strip()]
    assert set(keys) == {n.casefold() for n in flat}
    first = {}
    for n in flat:
        first.setdefault(n.casefold(), n)
    assert merged == list(first.values())


# --------------------------------------------------------------------------------- covering chunks


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 60), k=st.integers(2, 12))
def test_covering_chunks_cover_every_pair_once(n: int, k: int) -> None:
    entities = [f"E{i}" for i in range(n)]
    groups = assign_pairs(entities, k)
    assert len(groups) == covering_chunk_count(n, k)
    owner: dict[tuple[int, int], int] = {}
    covered: set[tuple[int, int]] = set()
    for g_index, g in enumerate(groups):
        assert 1 <= len(g.indices) <= k
        assert len(set(g.indices)) == len(g.indices)
        assert list(g.entities) == [entities[i] for i in g.indices]
        covered.update(itertools.combinations(sorted(g.indices), 2))
        for pair in g.owned_pairs:
            i, j = pair
            assert i < j and i in g.indices and j in g.indices
            assert pair not in owner, f"pair {pair} owned twice"
            owner[pair] = g_index
    all_pairs = set(itertools.combinations(range(n), 2))
    assert covered == all_pairs
    assert set(owner) == all_pairs
    assert covering_chunks(entities, k) == [list(g.entities) for g in groups]


def test_covering_chunks_small_cases_and_seed_example() -> None:
    assert covering_chunks([], 10) == [] and covering_chunk_count(0, 10) == 0
    (one,) = assign_pairs(["Alice"], 10)
    assert one.entities == ("Alice",) and one.owned_pairs == ()
    assert covering_chunks(list("ABCDEFGHIJ"), 10) == [list("ABCDEFGHIJ")]
    # the seed's example: 6 entities, 4 per chunk -> 3 chunks, 6 + 5 + 4 pairs
    groups = assign_pairs(["Alice", "Bob", "Carol", "Dave", "Eve", "Frank"], 4)
    assert [list(g.entities) for g in groups] == [
        ["Alice", "Bob", "Carol", "Dave"],
        ["Alice", "Bob", "Eve", "Frank"],
        ["Carol", "Dave", "Eve", "Frank"],
    ]
    assert sum(len(g.owned_pairs) for g in groups) == 15
    assert covering_chunk_count(50, 10) == 45  # 10 blocks of 5
    with pytest.raises(ValueError):
        covering_chunks(["a", "b"], 1)


def test_covering_chunks_pairs_are_by_position() -> None:
    groups = assign_pairs(["x", "x", "y"], 2)
    assert sorted(p for g in groups for p in g.owned_pairs) == [(0, 1), (0, 2), (1, 2)]
