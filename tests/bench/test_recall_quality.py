"""bench/recall_quality.py at equal context size (issue 11, item 1): the budget rule, what counts
as inside a shortened turn, the fixed splits, and ``--data`` on a LoCoMo-format file the bench
has never seen (extra fields ignored, its conversation reported as held out). Issue 24, item 2:
recall_all, tokens to reach X% recall, the oracle ordering; ``--facts reference`` end to end.
Issue 24, item 3: the one provenance rule, the bars' rankings and fusion (bench/_flat_bars.py),
margins paired by run, and LongMemEval-format input (bench/_longmemeval.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench._recall_common import REPORT_SPLIT, TUNING_SPLIT, load_conversations, split_of
import asyncio
import math
from datetime import datetime, timezone

import numpy as np
import pytest
from graphiti_core.edges import EntityEdge
from graphiti_core.nodes import EntityNode, EpisodeType, EpisodicNode
from graphiti_core.search.search_config import SearchResults

from bench._flat_bars import FlatStore, fact_vectors, graphiti_lines, store_lines
from bench._longmemeval import is_longmemeval, longmemeval_item, session_date, session_key
from bench._ranking import ENTITY_INSIDE, Line, Outcome, fact_inside, fill, holds, need_of, rrf, score_lines, tokens_to, turn_inside
from bench.recall_quality import engram_need, engram_outcome, item_inside, longmemeval_corpus, oracle_order
from engram.schemas import ChatMessage, Provenance, RecallItem, SessionClosed
from engram.services.recall.merge import fit_budget
from engram.text.tokens import token_counter
from tests.conftest import LOCOMO

ROOT = Path(__file__).resolve().parents[2]


def test_fill_stops_at_the_first_line_that_does_not_fit() -> None:
    count = token_counter()
    lines = ["- alpha beta gamma\n", "- " + "word " * 40 + "\n", "- short\n"]
    first = count(lines[0])
    assert fill(lines, first, count) == 1
    # the long line does not fit: the short one after it is not taken either (the recall service's rule)
    assert fill(lines, first + count(lines[1]) - 1, count) == 1
    assert fill(lines, 10_000, count) == 3
    assert fill(lines, first - 1, count) == 0
    header = "<memory>\n"
    assert fill(lines, first, count, header=header) == 0


def test_a_message_is_inside_a_shortened_turn_only_when_most_of_it_is_there() -> None:
    message = "I went to the LGBTQ support group yesterday and it was so powerful."
    turn = f"user(Caroline): {message}\nassistant(Melanie): That sounds great!"
    assert holds(turn, message)
    cut = turn[: len("user(Caroline): ") + len(message) // 2] + "…"
    assert not holds(cut, message)
    assert holds(" ".join(turn.split()), "  I went to the LGBTQ support group\n yesterday and it was so powerful.")
    assert not holds(turn, "")


def test_rrf_fuses_by_rank_with_equal_weights() -> None:
    assert rrf([1, 2, 3], [3, 2, 1]) == [1, 3, 2]  # 1 and 3 tie (document order breaks it), above 2 (2/62)
    assert rrf([5, 2], [2, 7]) == [2, 5, 7]


def test_the_splits_are_fixed_disjoint_and_cover_the_shared_file() -> None:
    assert len(TUNING_SPLIT) == 4 and len(REPORT_SPLIT) == 3
    assert not set(TUNING_SPLIT) & set(REPORT_SPLIT)
    assert split_of("conv-26") == "tuning" and split_of("conv-41") == "report" and split_of("x-1") == "other"
    if LOCOMO.exists():
        assert {c["sample_id"] for c in load_conversations(LOCOMO)} == set(TUNING_SPLIT) | set(REPORT_SPLIT)


def test_data_scores_any_locomo_format_file(tmp_path: Path) -> None:
    def turn(speaker: str, dia: str, text: str) -> dict:
        return {"speaker": speaker, "dia_id": dia, "text": text, "mood": "unknown field"}

    conversation = {
        "sample_id": "mine-1",
        "annotator": "an unknown field",
        "conversation": {
            "speaker_a": "Ada", "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [turn("Ada", "D1:1", "I adopted a grey cat called Pixel last week."),
                          turn("Bo", "D1:2", "Lovely! Is Pixel settling in?"),
                          turn("Ada", "D1:3", "Yes, she sleeps on my keyboard while I write Rust."),
                          turn("Bo", "D1:4", "Ha, a programmer's cat.")],
            "session_2_date_time": "3:00 pm on 20 May, 2023",
            "session_2": [turn("Ada", "D2:1", "I started rock climbing at the gym downtown."),
                          turn("Bo", "D2:2", "Climbing is a great workout, enjoy it.")],
            "extra_notes": {"anything": 1},
        },
        "qa": [{"question": "What is the name of Ada's cat?", "answer": "Pixel", "evidence": ["D1:1"], "category": 4,
                "difficulty": "unknown field"},
               {"question": "What sport did Ada start?", "answer": "climbing", "evidence": ["D2:1"], "category": 4}],
        "event_summary": {"ignored": True},
    }
    data = tmp_path / "mine.json"
    data.write_text(json.dumps([conversation]))
    env = {**os.environ, "GRAPHITI_TELEMETRY_ENABLED": "false", "COLUMNS": "220"}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "recall_quality.py"), "--smoke", "--data", str(data),
                           "--samples", "all", "--sessions", "2"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "1 conversation(s) (mine-1)" in out and "2 questions" in out, out[-3000:]
    assert "other conversations (not in the shared file: held out)" in out, out[-3000:]
    assert "TUNING split" not in out and "REPORT split" not in out
    assert f"tuning split (knobs are chosen here only): {', '.join(TUNING_SPLIT)}" in out
    assert "run time " in out
    # two questions, each answered by one message of a six-message chat: 2,000 tokens hold it all
    bm25_row = next(line for line in out.splitlines() if "BM25 messages" in line)
    assert "100.0" in bm25_row, bm25_row
    assert out.rstrip().splitlines()[-1] == "smoke: ok"


def fact(uuid: str, text: str, *messages: str) -> RecallItem:
    return RecallItem(uuid=uuid, fact=text, kind="fact", group_id="g", scope="user",
                      valid_at=datetime(2023, 5, 8, tzinfo=timezone.utc),
                      provenance=[Provenance(episode_id="e-" + uuid, message_ids=list(messages))])


def test_recall_all_needs_every_evidence_message() -> None:
    count = token_counter()
    items = [fact("1", "Ada adopted a cat called Pixel.", "m1"), fact("2", "Ada lives in Paris.", "m2"),
             fact("3", "Bo plays chess.", "m3")]
    evidence = frozenset({"m1", "m3"})
    kept, section = fit_budget(items[:2], 10_000, count)
    partial = engram_outcome(kept, section, evidence, {}, count)
    assert partial.hit and not partial.all_hit
    kept, section = fit_budget(items, 10_000, count)
    assert engram_outcome(kept, section, evidence, {}, count).all_hit
    assert not engram_outcome([], "", evidence, {}, count).hit


def test_need_is_the_smallest_budget_that_holds_evidence() -> None:
    count = token_counter()
    lines = ["- alpha beta gamma\n", "- delta epsilon\n", "- the evidence line\n"]
    costs = [count(line) for line in lines]
    need = need_of(costs, lambda n: count("".join(lines[:n])), [False, False, True], cap=10_000)
    assert need == max(sum(costs), count("".join(lines)))
    # the fill rule agrees: the evidence line is in the context at that budget, not one token below
    assert fill(lines, int(need), count) == 3 and fill(lines, int(need) - 1, count) < 3
    assert need_of(costs, lambda n: count("".join(lines[:n])), [False, True, True], cap=10_000) < need
    assert need_of(costs, lambda n: count("".join(lines[:n])), [False, False, True], cap=int(need) - 1) == math.inf
    assert need_of(costs, lambda n: count("".join(lines[:n])), [False, False, False], cap=10_000) == math.inf
    # engram's rendering: header and footer count once, the same rule as fit_budget
    items = [fact("1", "Bo plays chess.", "m3"), fact("2", "Ada adopted a cat called Pixel.", "m1")]
    need = engram_need(items, frozenset({"m1"}), {}, count, cap=10_000)
    assert [i.uuid for i in fit_budget(items, int(need), count)[0]] == ["1", "2"]
    assert [i.uuid for i in fit_budget(items, int(need) - 1, count)[0]] == ["1"]


def test_tokens_to_reach_a_share_of_questions() -> None:
    needs = [100, 300, 200, math.inf, 400, 150, 120, 500, 250, 180]  # 10 questions, one never reached
    assert tokens_to(needs, 0.8) == 400  # 8 of 10 questions hold evidence at 400 tokens, 7 at 300
    assert tokens_to(needs, 0.9) == 500
    assert tokens_to(needs, 1.0) == math.inf
    assert tokens_to([300], 0.8) == 300
    assert math.isnan(tokens_to([], 0.8))


def test_the_oracle_puts_the_cheapest_evidence_item_first() -> None:
    count = token_counter()
    items = [fact("1", "Bo plays chess every Sunday at the club near the old harbour.", "m3"),
             fact("2", "Ada adopted a grey cat called Pixel who sleeps on her keyboard while she writes Rust.", "m1"),
             fact("3", "Ada has a cat.", "m2"), fact("4", "Bo likes tea.", "m4")]
    ordered = oracle_order(items, frozenset({"m1", "m2"}), {}, count)
    assert [i.uuid for i in ordered] == ["3", "2", "1", "4"]
    assert engram_need(ordered, frozenset({"m1", "m2"}), {}, count, 10_000) < \
        engram_need(items, frozenset({"m1", "m2"}), {}, count, 10_000)
    assert Outcome(True, 1, 1).need == math.inf  # flat rows without a need never count as reached


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo data not found at {LOCOMO}")
def test_reference_facts_smoke_runs_end_to_end() -> None:
    env = {**os.environ, "GRAPHITI_TELEMETRY_ENABLED": "false", "COLUMNS": "220", "ENGRAM_LOCOMO": str(LOCOMO)}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "recall_quality.py"), "--smoke", "--facts", "reference"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "facts: reference" in out and "LoCoMo reference facts" in out
    assert "extraction prompts matched to LoCoMo turns, 0 not" in out, out[-3000:]
    assert "recall_all (%, every evidence message inside)" in out and ": oracle (its" in out  # rich wraps the method cell
    assert "margins of engram" in out and "vs BM25 messages:" in out
    assert out.rstrip().splitlines()[-1] == "smoke: ok"


# --- issue 24, item 3: the bars, and one provenance rule for every row ------------------------

def test_one_provenance_rule_for_facts_turns_and_entities() -> None:
    message_ids = {"ep1": ["m1", "m2"], "ep2": ["m3"]}
    said = {"m1": "I adopted a grey cat called Pixel last week.", "m2": "Lovely, is Pixel settling in?",
            "m3": "I started rock climbing."}
    # a fact counts for every message of the turn(s) it came from, whatever its words
    assert fact_inside(["ep1"], message_ids) == {"m1", "m2"}
    assert fact_inside(["ep1", "ep2"], message_ids) == {"m1", "m2", "m3"}
    assert fact_inside(["gone"], message_ids) == frozenset()
    # a turn counts for the messages whose text it holds: a shortened one loses the cut message
    whole = "- Ada: I adopted a grey cat called Pixel last week. Bo: Lovely, is Pixel settling in?\n"
    assert turn_inside(whole, ["m1", "m2"], said) == {"m1", "m2"}
    assert turn_inside("- Ada: I adopted a grey cat called Pixel last week. Bo: Lovely…\n", ["m1", "m2"], said) == {"m1"}
    assert ENTITY_INSIDE == frozenset()
    # engram's own rows count by the same rule: a fact item by its provenance, a turn item by its text
    item = fact("f", "Ada has a cat named Pixel.", "m1", "m2")
    assert item_inside(item, said) == set(fact_inside(["ep1"], message_ids))
    turn = RecallItem(uuid="ep1", fact=whole[2:-1][:60] + "…", kind="episode", group_id="g", scope="user",
                      provenance=[Provenance(episode_id="ep1", message_ids=["m1", "m2"])])
    assert item_inside(turn, said) == set(turn_inside(turn.fact, ["m1", "m2"], said)) == {"m1"}


def test_score_lines_fills_like_the_flat_rows_and_counts_by_provenance() -> None:
    count = token_counter()
    lines = [Line("- Ada: hello there, how are you?\n", frozenset({"m0"})),
             Line("- Pixel: a grey cat who sleeps on keyboards\n", ENTITY_INSIDE),  # an entity: counts for none
             Line("- Ada has a cat named Pixel.\n", frozenset({"m1", "m2"})),
             Line("- Bo plays chess.\n", frozenset({"m3"}))]
    cost = [count(line.text) for line in lines]
    budgets = [cost[0] + cost[1], sum(cost[:3]), 10_000]
    out = score_lines(lines, frozenset({"m1", "m3"}), budgets, count)
    assert not out[budgets[0]].hit and out[budgets[0]].items == 2
    assert out[budgets[1]].hit and not out[budgets[1]].all_hit and out[budgets[1]].items == 3
    assert out[budgets[2]].all_hit and out[budgets[2]].items == 4
    assert all(o.need == max(sum(cost[:3]), count("".join(line.text for line in lines[:3]))) for o in out.values())
    assert all(o.hit == (o.need <= b) for b, o in out.items())
    # an entity summary naming the evidence counts for nothing
    assert not score_lines(lines[1:2], frozenset({"m1"}), [10_000], count)[10_000].hit


def test_the_flat_store_fuses_bm25_and_dense_over_facts_and_turns() -> None:
    facts = [("Ada adopted a cat named Pixel.", ["ep1"], None), ("Bo plays chess on Sundays.", ["ep2"], None)]
    message_ids = {"ep1": ["m1"], "ep2": ["m2"]}
    said = {"m1": "I adopted a cat, her name is Pixel.", "m2": "I play chess every Sunday.",
            "m3": "The weather is lovely today."}
    turn_texts = ["Ada: I adopted a cat, her name is Pixel.", "Bo: I play chess every Sunday.",
                  "Ada: The weather is lovely today."]
    fact_lines, turn_lines = store_lines(facts, message_ids, turn_texts, [["m1"], ["m2"], ["m3"]], said)
    assert [line.text for line in fact_lines] == ["- Ada adopted a cat named Pixel.\n", "- Bo plays chess on Sundays.\n"]
    assert [line.inside for line in fact_lines] == [{"m1"}, {"m2"}]
    assert [line.inside for line in turn_lines] == [{"m1"}, {"m2"}, {"m3"}]
    # dense: the question vector points at fact 1 (chess) and at turn 2 (weather), not at the cat
    fact_vectors = np.asarray([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=np.float32)
    turn_vectors = np.asarray([[1.0, 0.0, 0.0], [0.6, 0.8, 0.0], [0.0, 0.0, 1.0]], dtype=np.float32)
    store = FlatStore(fact_lines, turn_lines, fact_vectors, turn_vectors)
    query = np.asarray([0.0, 0.6, 0.8], dtype=np.float32)
    ranked = store.ranking("What is the name of Ada's cat?", query)
    # four rankings fused by RRF (k=60): BM25 facts [cat fact] (stemmed: "named" matches "name"),
    # dense facts [chess, cat], BM25 turns [cat turn, weather turn ("Ada")], dense turns [weather,
    # chess turn, cat turn]. The cat fact and the weather turn tie at 1/61 + 1/62 (document order:
    # facts first), then the cat turn 1/61 + 1/63, the chess fact 1/61, the chess turn 1/62.
    assert [line.text for line in ranked] == [
        "- Ada adopted a cat named Pixel.\n", "- Ada: The weather is lovely today.\n",
        "- Ada: I adopted a cat, her name is Pixel.\n", "- Bo plays chess on Sundays.\n", "- Bo: I play chess every Sunday.\n"]
    # no fact in the graph: the store is the turns alone
    only_turns = FlatStore([], turn_lines, np.zeros((0, 3), dtype=np.float32), turn_vectors)
    assert {line.text for line in only_turns.ranking("cat Pixel", query)} == {line.text for line in turn_lines}


class _Embedder:
    """Embeds a text as a fixed vector by its first word (a stand-in for engram's embedder)."""

    vectors = {"Ada": [1.0, 0.0], "Bo": [0.0, 1.0]}

    async def create_batch(self, texts: list[str]) -> list[list[float]]:
        return [self.vectors[t.split()[0]] for t in texts]


def test_stored_fact_vectors_are_reused_only_when_they_are_this_embedders() -> None:
    same = [("Ada has a cat.", ["e"], [2.0, 0.0]), ("Bo plays chess.", ["e"], [0.0, 3.0])]
    vectors, reused = asyncio.run(fact_vectors(_Embedder(), same))
    assert reused and np.allclose(vectors, [[1, 0], [0, 1]])
    other = [("Ada has a cat.", ["e"], [0.0, 1.0]), ("Bo plays chess.", ["e"], [1.0, 0.0])]  # another model's vectors
    vectors, reused = asyncio.run(fact_vectors(_Embedder(), other))
    assert not reused and np.allclose(vectors, [[1, 0], [0, 1]])
    missing = [("Ada has a cat.", ["e"], None)]
    assert asyncio.run(fact_vectors(_Embedder(), missing))[1] is False


def test_graphiti_results_interleave_by_rrf_rank_and_render_by_kind() -> None:
    now = datetime(2023, 5, 8, tzinfo=timezone.utc)
    edges = [EntityEdge(group_id="g", source_node_uuid="a", target_node_uuid="b", created_at=now, name="HAS",
                        fact=f"Ada fact {i}.", episodes=["ep1"]) for i in range(2)]
    nodes = [EntityNode(name="Pixel", group_id="g", summary="Ada's grey cat."), EntityNode(name="Bo", group_id="g")]
    episode = EpisodicNode(name="t", group_id="g", source=EpisodeType.message, source_description="chat",
                           content="user(Ada): I adopted a cat called Pixel.", valid_at=now)
    results = SearchResults(edges=edges, nodes=nodes, episodes=[episode])
    said = {"m1": "I adopted a cat called Pixel.", "m2": "unrelated"}
    lines = graphiti_lines(results, {"ep1": ["m1", "m2"], episode.uuid: ["m1", "m2"]}, said)
    assert [line.text for line in lines] == ["- Ada fact 0.\n", "- Pixel: Ada's grey cat.\n",
                                             "- user(Ada): I adopted a cat called Pixel.\n", "- Ada fact 1.\n", "- Bo\n"]
    assert lines[0].inside == {"m1", "m2"}  # a fact: its turn's messages
    assert lines[1].inside == frozenset() and lines[4].inside == frozenset()  # entities: none
    assert lines[2].inside == {"m1"}  # a turn: the messages whose text it holds


def _outcomes(hits: list[bool], alls: list[bool] | None = None) -> dict:
    alls = alls or [False] * len(hits)
    return {b: {("s", f"q{i}"): Outcome(h, 1, 1, all_hit=a) for i, (h, a) in enumerate(zip(hits, alls))} for b in (500, 1000)}


def test_bar_margins_pair_each_run_with_its_own_graph() -> None:
    from bench._recall_common import Question
    from bench.recall_quality import BAR_GRAPHITI, BAR_STORE, EngramRun, bar_margins

    qs = [Question("s", f"q{i}", 1, frozenset({"m"})) for i in range(4)]
    share = {75: [1, 1, 1, 0], 50: [1, 1, 0, 0], 25: [1, 0, 0, 0], 0: [0, 0, 0, 0]}  # % of the 4 questions
    runs = []
    for mine, store, graphiti in ((75, 25, 50), (50, 75, 50), (25, 50, 0)):
        run = EngramRun("engram run", outcomes=_outcomes([bool(x) for x in share[mine]]))
        run.bars = {BAR_STORE: _outcomes([bool(x) for x in share[store]]),
                    BAR_GRAPHITI: _outcomes([bool(x) for x in share[graphiti]])}
        runs.append(run)
    flat = {"BM25 messages": _outcomes([True] * 4), "BM25 turns, stemmed": _outcomes([bool(x) for x in share[75]]),
            "BM25 stemmed + x RRF, turns": _outcomes([bool(x) for x in share[25]]),
            "BM25 stemmed + x RRF, turns, dated as engram's": _outcomes([True] * 4)}
    margins = bar_margins(qs, [500, 1000], runs, flat, lambda o: o.hit)
    # (a): the best flat row over turns, not messages nor the dated diagnostic; engram's median (50) minus it (75)
    best = margins["(a) best flat turn retriever"]
    assert (best.points, best.what) == ([-25.0, -25.0], "BM25 turns, stemmed")
    # (b), (c): the median of the per-run differences (each run against its own graph), which
    # here differs from the difference of the medians (0 for both)
    assert margins[BAR_STORE].points == [-25.0, -25.0]  # +50, -25, -25
    assert margins[BAR_GRAPHITI].points == [25.0, 25.0]  # +25, 0, +25
    assert bar_margins(qs, [500], runs, flat, lambda o: o.all_hit)[BAR_STORE].points == [0.0]
    # each interval holds the mean per-question difference it was drawn around
    for margin in margins.values():
        assert all(lo <= hi for lo, hi in margin.intervals)
    # per question, engram averaged over its runs (1, 2/3, 1/3, 0) minus graphiti's (2/3, 2/3, 0, 0):
    # a mean of 1/6, which the interval brackets
    lo, hi = margins[BAR_GRAPHITI].intervals[0]
    assert lo <= 100 / 6 <= hi


def test_paired_interval_narrows_with_more_questions_and_brackets_the_mean() -> None:
    from bench.recall_quality import paired_interval

    few = [1, 0, 0, 1, -1, 1, 0, 0]  # mean +25 points
    lo, hi = paired_interval(few)
    assert lo <= 25.0 <= hi and lo < 0 < hi  # 8 questions cannot tell +25 from nothing
    many_lo, many_hi = paired_interval(few * 60)  # the same mix over 480 questions
    assert many_lo <= 25.0 <= many_hi and many_lo > 0  # 480 can
    assert many_hi - many_lo < (hi - lo) / 5
    assert paired_interval([0, 0, 0]) == (0.0, 0.0)
    assert all(math.isnan(x) for x in paired_interval([]))  # nothing to resample


# --- LongMemEval-format input -----------------------------------------------------------------

LONGMEMEVAL_MINI = ROOT / "tests" / "bench" / "data" / "longmemeval_mini.json"


def test_a_longmemeval_item_is_one_corpus_with_has_answer_turns_as_evidence() -> None:
    items = json.loads(LONGMEMEVAL_MINI.read_text())
    assert is_longmemeval(items) and not is_longmemeval([{"sample_id": "x", "conversation": {}}])
    sample, events, question, category, evidence = longmemeval_item(items[0])
    messages = [e for e in events if isinstance(e, ChatMessage)]
    assert sample == "mini_q1" and category == "single-session-user" and question.startswith("Which city")
    assert evidence == {"mini_q1:answer_q1_1:0"}
    # sessions in date order: hay_a (Jan 5), hay_b (Jan 20), the answer session (Feb 11)
    assert [m.message_id for m in messages][:3] == ["mini_q1:hay_a:0", "mini_q1:hay_a:1", "mini_q1:hay_b:0"]
    assert all(a.timestamp < b.timestamp for a, b in zip(messages, messages[1:]))
    assert messages[0].timestamp == datetime(2024, 1, 5, 9, 12, 1, tzinfo=timezone.utc)
    assert {m.scopes.user for m in messages} == {"mini_q1"} and {m.role for m in messages} == {"user", "assistant"}
    assert sum(isinstance(e, SessionClosed) for e in events) == 3
    # the first two sessions by date hold no evidence: the question has none to find
    assert longmemeval_item(items[0], max_sessions=2)[4] == frozenset()
    assert longmemeval_item(items[2])[4] == frozenset()  # an abstention item
    corpus = longmemeval_corpus(items[1], None)
    assert [q.category for q in corpus.questions] == ["knowledge-update"] and len(corpus.turns) == 2
    assert corpus.questions[0].evidence == {"mini_q2:answer_q2_1:0", "mini_q2:answer_q2_2:0"}


def test_longmemeval_dates_and_session_ids() -> None:
    fallback = datetime(2020, 1, 1, tzinfo=timezone.utc)
    assert session_date("2023/05/20 (Sat) 02:21", fallback) == datetime(2023, 5, 20, 2, 21, tzinfo=timezone.utc)
    assert session_date("2024-01-10", fallback) == datetime(2024, 1, 10, tzinfo=timezone.utc)
    assert session_date("sometime", fallback) == fallback and session_date(None, fallback) == fallback
    key = session_key("q1", "sharegpt_Yu hn/SNa_0")
    assert key == "q1-sharegpt_Yu_hn_SNa_0"
    long = session_key("q" * 100, "s" * 100)
    assert len(long) == 128 and long != session_key("q" * 100, "s" * 99 + "t")


def test_longmemeval_file_runs_end_to_end_with_the_bars() -> None:
    env = {**os.environ, "GRAPHITI_TELEMETRY_ENABLED": "false", "COLUMNS": "220"}
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "recall_quality.py"), "--smoke", "--data",
                           str(LONGMEMEVAL_MINI), "--samples", "all", "--sessions", "5"],
                          capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "LongMemEval-format: 3 items read, 2 with questions" in out and "(left out): mini_q3_abs" in out, out[-3000:]
    assert "cat knowledge-update" in out and "cat single-session-user" in out
    assert "(b) flat facts+turns store, graph of engram" in out and "(c) graphiti search, graph of engram" in out
    assert "vs (a) best flat turn retriever" in out and "vs (b) flat facts+turns store" in out and "vs (c) graphiti search" in out
    assert out.rstrip().splitlines()[-1] == "smoke: ok"
