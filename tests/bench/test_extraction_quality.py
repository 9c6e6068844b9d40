"""bench/extraction_quality.py: the match threshold, the junk flags, the scoring, the labelled
pairs (references resolved at run time) and the slice (its smoke run, which also re-extracts the
rules-model facts the pairs name, is in test_bench_smoke.py)."""

from __future__ import annotations

import pytest

from bench._recall_common import TUNING_SPLIT, load_conversations
from bench.extraction_quality import (
    PAIRS,
    TurnRecord,
    broken_verbs,
    build_slice,
    choose_threshold,
    junk_flags,
    load_pairs,
    observation_texts,
    pair_turns,
    resolve_pairs,
    score,
    text_sha,
    turn_observations,
)
from tests.conftest import LOCOMO


def test_threshold_separates_labelled_pairs_at_the_middle_of_the_gap() -> None:
    threshold, agreement = choose_threshold([0.80, 0.82, 0.85, 0.93, 0.95], [False, False, False, True, True])
    assert agreement == 1.0
    assert threshold == pytest.approx(0.89)


def test_threshold_on_overlapping_labels_keeps_the_best_agreement() -> None:
    sims = [0.80, 0.86, 0.88, 0.90, 0.91, 0.95]
    labels = [False, True, False, False, True, True]
    threshold, agreement = choose_threshold(sims, labels)
    assert agreement == pytest.approx(5 / 6)
    assert sum((s >= threshold) == y for s, y in zip(sims, labels)) == 5
    assert 0.90 < threshold < 0.91


def test_threshold_refuses_mismatched_input() -> None:
    with pytest.raises(ValueError):
        choose_threshold([0.9], [True, False])
    with pytest.raises(ValueError):
        choose_threshold([], [])


@pytest.mark.parametrize(("fact", "entities", "flag"), [
    ("Assistant rewrotes the parser in Rust", ["Assistant", "parser"], "role as entity"),
    ("The user likes hiking", ["Caroline", "hiking"], "role as entity"),
    ("Caroline likes hiking", ["User", "hiking"], "role as entity"),
    ("Audrey got new collars for her dogs", ["user (Audrey)", "collars"], "role as entity"),
    ("Hey Joanna! I won my first video game tournament", ["Nate", "Joanna"], "remark to the listener"),
    ("Assistant rewrotes the parser in Rust", ["Assistant", "parser"], "broken verb form"),
    ("Caroline decideds to adopt", ["Caroline", "adoption"], "broken verb form"),
    ("Joanna firsts watched it around 3 years ago", ["Joanna", "movie"], "broken verb form"),
    ("What type of movies do you like best?", ["Nate", "movies"], "remark to the listener"),
    ("Wow, love that painting!", ["Melanie", "painting"], "remark to the listener"),
    ("Painting looks like a great outlet for expressing yourself.", ["Caroline", "painting"], "remark to the listener"),
    ("Melanie thanked Caroline for the kind words", ["Melanie", "Caroline"], "remark to the listener"),
])
def test_junk_flags(fact: str, entities: list[str], flag: str) -> None:
    assert flag in junk_flags(fact, entities, "Caroline", "Melanie")


@pytest.mark.parametrize("fact", [
    "Caroline attended an LGBTQ support group yesterday",
    "Melanie's kids watched the fireworks",
    "Audrey always walks her dogs in the morning",
    "Caroline needs a break and proceeds with her plans",
    "Melanie painted a lake sunrise last year",
])
def test_clean_facts_are_not_flagged(fact: str) -> None:
    assert junk_flags(fact, ["Caroline", "Melanie"], "Caroline", "Melanie") == []
    assert broken_verbs(fact) == []


def _record(index: int, observations: list[str], facts: list[str], **kw: object) -> TurnRecord:
    return TurnRecord("conv-x", index, ["Caroline", "Melanie"], [f"conv-x:D1:{index}"], observations,
                      [{"fact": f, "source": "Caroline", "target": "thing"} for f in facts], **kw)  # type: ignore[arg-type]


def test_score_matches_within_the_turn_only_and_counts_junk_among_the_unmatched() -> None:
    near = {("Caroline went to a support group", "Caroline attended a support group"): 0.95,
            ("Melanie paints", "Melanie painted a sunrise"): 0.93,
            ("Thanks, you are great!", "Caroline attended a support group"): 0.80}

    def sim(a: str, b: str) -> float:
        return near.get((a, b), 0.5)

    records = [
        _record(1, ["Caroline attended a support group", "Caroline is single"],
                ["Caroline went to a support group", "Thanks, you are great!"], invalidated=1, llm_calls=3,
                input_tokens=100, output_tokens=10, seconds=2.0),
        # the matching fact is in another turn than the observation: no match
        _record(2, ["Melanie painted a sunrise"], [], llm_calls=1, input_tokens=50, output_tokens=5, seconds=1.0),
        _record(3, [], ["Melanie paints"], failed="", llm_calls=2, seconds=0.5),
    ]
    s = score(records, sim, threshold=0.9)
    assert (s.observations, s.matched) == (3, 1)
    assert s.recall == pytest.approx(1 / 3)
    assert s.facts == 3
    assert sorted(f["fact"] for _, f in s.unmatched) == ["Melanie paints", "Thanks, you are great!"]
    assert s.junk_facts == 1 and s.junk == {"remark to the listener": 1}
    assert (s.invalidated, s.calls, s.input_tokens, s.output_tokens, s.seconds) == (1, 6, 150, 15, 3.5)
    assert score(records, sim, threshold=0.99).matched == 0


def test_turn_observations_follow_the_cited_dia_ids() -> None:
    conversation = {
        "sample_id": "conv-x",
        "observation": {"session_1_observation": {
            "Caroline": [["Caroline went hiking.", "D1:2"], ["Caroline is a painter.", ["D1:3", "D1:5"]]],
            "Melanie": [["Melanie has two kids.", "D1:5; D1:6"], ["Malformed", ""]],
        }},
    }
    assert turn_observations(conversation, ["conv-x:D1:1", "conv-x:D1:2"]) == ["Caroline went hiking."]
    assert turn_observations(conversation, ["conv-x:D1:5"]) == ["Caroline is a painter.", "Melanie has two kids."]
    assert turn_observations(conversation, ["conv-y:D1:2", "conv-x:D1:9"]) == []


def test_labelled_pairs_are_enough_both_ways_and_hold_no_text() -> None:
    pairs = load_pairs(PAIRS)
    assert len(pairs) >= 45
    for p in pairs:
        assert set(p) == {"turn", "fact_sha256", "observation", "observation_sha256", "same"}, "references only"
        assert isinstance(p["same"], bool)
        assert len(p["fact_sha256"]) == len(p["observation_sha256"]) == 12
        assert p["turn"].split("#")[0] == p["observation"].split(":")[0], "an observation of the fact's conversation"
    same = sum(p["same"] for p in pairs)
    assert 10 <= same <= len(pairs) - 10, "both labels need enough cases to place a threshold"
    assert len({(p["turn"], p["fact_sha256"], p["observation"]) for p in pairs}) == len(pairs), "a pair is labelled once"
    assert set(pair_turns(pairs)) <= set(TUNING_SPLIT)


_CONVERSATION = {
    "sample_id": "conv-x",
    "observation": {"session_1_observation": {
        "Caroline": [["Caroline went  hiking.", "D1:2"], ["", "D1:3"], ["Caroline is a painter.", "D1:5"]],
        "Melanie": [["Melanie has two kids.", "D1:5"]],
    }, "session_1_summary": "not an observation"},
}


def test_observations_are_addressed_by_session_speaker_and_position() -> None:
    assert observation_texts([_CONVERSATION]) == {
        "conv-x:session_1:Caroline:0": "Caroline went hiking.",  # whitespace-normalised as observations_of
        "conv-x:session_1:Caroline:2": "Caroline is a painter.",  # the position counts the empty entry
        "conv-x:session_1:Melanie:0": "Melanie has two kids.",
    }


def test_pairs_resolve_to_the_rules_facts_and_observations_and_report_what_does_not() -> None:
    observations = observation_texts([_CONVERSATION])
    facts = {"conv-x#0": ["Caroline went hiking yesterday.", "Melanie has kids."], "conv-x#1": []}

    def pair(turn: str, fact: str, obs: str, same: bool, obs_text: str | None = None) -> dict:
        return {"turn": turn, "fact_sha256": text_sha(fact), "observation": obs,
                "observation_sha256": text_sha(obs_text or observations.get(obs, "")), "same": same}

    pairs = [pair("conv-x#0", "Caroline went hiking yesterday.", "conv-x:session_1:Caroline:0", True),
             pair("conv-x#0", "Melanie has kids.", "conv-x:session_1:Caroline:2", False),
             pair("conv-x#1", "Gone with the rules model", "conv-x:session_1:Melanie:0", True),
             pair("conv-x#0", "Melanie has kids.", "conv-x:session_1:Melanie:0", True, obs_text="Melanie has 3 kids."),
             pair("conv-x#0", "Melanie has kids.", "conv-x:session_2:Melanie:0", True)]
    resolved, problems = resolve_pairs(pairs, observations, facts)
    assert resolved == [
        {"fact": "Caroline went hiking yesterday.", "observation": "Caroline went hiking.", "same": True, "turn": "conv-x#0"},
        {"fact": "Melanie has kids.", "observation": "Caroline is a painter.", "same": False, "turn": "conv-x#0"},
    ]
    assert len(problems) == 3
    assert "no rules-model fact" in problems[0] and "changed" in problems[1] and "missing" in problems[2]
    assert pair_turns(pairs) == {"conv-x": 2}


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo data not found at {LOCOMO}")
def test_every_labelled_observation_resolves_in_locomo() -> None:
    observations = observation_texts(load_conversations(LOCOMO))
    for p in load_pairs(PAIRS):
        assert text_sha(observations[p["observation"]]) == p["observation_sha256"], p["observation"]


@pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo data not found at {LOCOMO}")
def test_the_slice_is_60_consecutive_tuning_turns_with_their_observations() -> None:
    conversations = load_conversations(LOCOMO)
    turns = build_slice(LOCOMO, conversations, TUNING_SPLIT, 15)
    assert len(turns) == 60
    for sample in TUNING_SPLIT:
        mine = [t for t in turns if t.sample == sample]
        assert [t.index for t in mine] == list(range(15))
        assert all(m.startswith(f"{sample}:") for t in mine for m in t.message_ids)
        assert mine[0].message_ids[0] == f"{sample}:D1:1"
    assert sum(len(t.observations) for t in turns) >= 30
    # the episode is the turn-detector's: its messages are the turn's
    assert all([m.message_id for m in t.episode.messages] == t.message_ids for t in turns)
