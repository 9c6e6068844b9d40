"""bench/temporal_grounding.py runs on a slice of LoCoMo and its rows are consistent: lift 0 over
grounded turns keeps the ranking (so it differs from the raw row only by the labels' tokens),
and a bigger budget never holds fewer evidence messages."""

from __future__ import annotations

import pytest

from bench import temporal_grounding as tg
from bench._recall_common import load_conversations
from bench.recall_quality import build_corpus
from tests.conftest import LOCOMO


def test_when_recall_on_a_slice(capsys: pytest.CaptureFixture[str]) -> None:
    if not LOCOMO.exists():
        pytest.skip(f"LoCoMo data not found at {LOCOMO}")
    conv = next(c for c in load_conversations(LOCOMO) if c.get("sample_id") == "conv-26")
    corpus = build_corpus(LOCOMO, conv, 6)
    asked, hits = tg.when_recall([corpus], (0, 5), (500, 2000))
    assert asked > 0
    for row in (tg.RAW, 0, 5):
        assert hits[(row, 500)] <= hits[(row, 2000)] <= asked
    # grounding only adds tokens: at a budget, the grounded lift-0 context holds no more turns
    assert hits[(0, 500)] <= hits[(tg.RAW, 500)]
    assert tg.main(["--samples", "conv-26", "--sessions", "3", "--lifts", "0", "5", "--budgets", "500"]) == 0
    out = capsys.readouterr().out
    assert "tuning split (conv-26)" in out and "grounded, lift 5" in out and "run time" in out
