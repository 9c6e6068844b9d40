"""bench/recall_quality.py at equal context size (issue 11, item 1): the budget rule, what counts
as inside a shortened turn, the fixed splits, and ``--data`` on a LoCoMo-format file the bench
has never seen (extra fields ignored, its conversation reported as held out). Issue 24, item 2:
recall_all, tokens to reach X% recall, the oracle ordering; ``--facts reference`` end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench._recall_common import REPORT_SPLIT, TUNING_SPLIT, load_conversations, split_of
import math
from datetime import datetime, timezone

import pytest

from bench.recall_quality import Outcome, engram_need, engram_outcome, fill, holds, need_of, oracle_order, rrf, tokens_to
from schemas import Provenance, RecallItem
from services.recall.merge import fit_budget
from engram.tokens import token_counter
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
