"""bench/dedupe_threshold.py: the edge-dedupe gate's threshold in services/extractor/local_answers.py
is the one chosen on the tuning pairs, and it keeps every held-out pair that needs the call."""

from __future__ import annotations

from bench import dedupe_threshold


def test_the_module_threshold_is_the_one_chosen_on_the_tuning_pairs(capsys) -> None:  # noqa: ANN001
    assert dedupe_threshold.main() == 0
    out = capsys.readouterr().out
    assert "heldout : needed calls kept 35/35" in out and "MISSED" not in out
