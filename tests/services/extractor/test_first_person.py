"""A fact the model copied from a speaker's line is put in the third person
(services/extractor/first_person.py): the stage alone, then through the pipeline on FalkorDB."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from engram.services.extractor.extraction_prompt import PROMPT_NAME, build_prompt
from engram.services.extractor.first_person import (FIRST_PERSON_FACTS, ThirdPersonLLMClient, facts_in_third_person,
                                                    line_speaker)
from tests.services.extractor.test_extraction_prompt import context
from tests.services.extractor.test_local_answers import Recording
from tests.services.extractor.test_pipeline import T1, Env, Turn, env  # noqa: F401 - env is a fixture

TURN = ("user (Joanna): Yeah! Besides writing, I also enjoy reading and watching movies. Anything else, Nate?\n\n"
        "assistant (Nate): I won my first video game tournament last week - so exciting!")


def _answer(*edges: tuple[str, str, str], entities: tuple[str, ...] = ("Joanna", "Nate", "reading")) -> dict[str, Any]:
    return {"extracted_entities": [{"name": n} for n in entities],
            "edges": [{"source_entity_name": s, "target_entity_name": t, "relation_type": "R", "fact": f}
                      for s, t, f in edges]}


def _facts(answer: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(e["source_entity_name"], e["target_entity_name"], e["fact"]) for e in answer["edges"]]


def test_a_copied_line_names_its_speaker() -> None:
    given = _answer(("Joanna", "reading", "I enjoy reading and watching movies."),
                    ("Joanna", "reading", "My hobbies include reading and watching movies."))
    out, n = facts_in_third_person(given, TURN)
    assert n == 2
    assert _facts(out) == [("Joanna", "reading", "Joanna enjoys reading and watching movies."),
                           ("Joanna", "reading", "Joanna's hobbies include reading and watching movies.")]
    assert given["edges"][0]["fact"] == "I enjoy reading and watching movies."  # the answer given is kept
    out, _ = facts_in_third_person(_answer(("Joanna", "reading", "I enjoy reading, watching movies and I/O.")), TURN)
    assert _facts(out)[0][2] == "Joanna enjoys reading, watching movies and I/O."


def test_a_line_put_on_the_other_speaker_moves_to_its_speaker() -> None:
    tournament = "I won my first video game tournament last week - so exciting!"
    out, _ = facts_in_third_person(_answer(("Joanna", "video game tournament", tournament)), TURN)
    assert _facts(out) == [("Nate", "video game tournament",
                            "Nate won Nate's first video game tournament last week - so exciting!")]
    # the line's speaker as the target: the pair is kept (no fact of Nate about Nate)
    out, _ = facts_in_third_person(_answer(("Joanna", "Nate", tournament)), TURN)
    assert _facts(out)[0][:2] == ("Joanna", "Nate")


def test_a_line_of_the_previous_turns_counts() -> None:
    previous = "assistant (Melanie): I ran a charity race for mental health last Saturday - it was rewarding."
    now = "user (Caroline): That charity race sounds great, Mel! Raising awareness for mental health is rewarding."
    copied = "I ran a charity race for mental health last Saturday - it was rewarding."
    out, n = facts_in_third_person(_answer(("Caroline", "charity race", copied),
                                           entities=("Caroline", "Melanie", "charity race")), now, [previous])
    assert n == 1
    assert _facts(out) == [("Melanie", "charity race",
                            "Melanie ran a charity race for mental health last Saturday - it was rewarding.")]


@pytest.mark.parametrize("fact", [
    "Joanna enjoys reading.",  # already in the third person
    "We should plan a movie night soon!",  # "we" includes others
    "Me too! Reading is so relaxing.",  # a reaction, not a line of one speaker
    "Joanna said 'I enjoy reading' to Nate.",  # a quote inside a fact that names its speaker
    "I think so.",  # shares no word with any line
    "I/O slows reading and watching movies.",  # "I/O" is no pronoun
])
def test_what_is_not_a_copied_first_person_line_is_kept(fact: str) -> None:
    out, n = facts_in_third_person(_answer(("Joanna", "reading", fact)), TURN)
    assert n == 0 and _facts(out) == [("Joanna", "reading", fact)]


def test_a_turn_without_named_speakers_is_kept() -> None:
    given = _answer(("User", "reading", "I enjoy reading."))
    assert facts_in_third_person(given, "user: I enjoy reading.\n\nassistant: Nice!") == (given, 0)


def test_the_line_holding_most_of_the_fact_wins_and_a_small_share_is_no_line() -> None:
    lines = [("Caroline", "That charity race sounds great!"), ("Melanie", "I ran a charity race last Saturday.")]
    assert line_speaker("I ran a charity race last Saturday.", lines) == "Melanie"
    assert line_speaker("I love the charity race idea and the cause behind it.", lines) is None


async def test_the_client_reads_the_turn_and_its_previous_messages_from_engrams_prompt() -> None:
    """The lines come from the prompt as engram builds it, a custom instructions block before them
    naming neither; any other prompt's answer passes unchanged."""
    previous = [{"content": "assistant (Melanie): I ran a charity race for mental health last Saturday.",
                 "valid_at": None}]
    ctx = context("user (Caroline): That charity race sounds great, Mel!", previous, custom="<CURRENT MESSAGES>")
    copied = _answer(("Caroline", "charity race", "I ran a charity race for mental health last Saturday."),
                     entities=("Caroline", "Melanie", "charity race"))
    client = ThirdPersonLLMClient(Recording())

    async def answer() -> dict[str, Any]:  # the model's answer, as the inner client would return it
        return copied

    out = await client.around(answer, build_prompt(ctx).as_messages(), PROMPT_NAME)
    assert _facts(out) == [("Melanie", "charity race", "Melanie ran a charity race for mental health last Saturday.")]
    assert await client.around(answer, build_prompt(ctx).as_messages(), "dedupe_edges.resolve_edge") == copied


# --------------------------------------------------------------------------- through the pipeline
async def test_the_stored_fact_is_the_rewritten_one_and_its_extraction_dates_still_apply(env: Env) -> None:  # noqa: F811
    """The model writes Joanna's line as the fact, on Nate. The graph gets "Joanna ran ...", from
    Joanna, and the date the extraction gave it ("on Saturday" is no date engram resolves itself)
    is used: the dates are keyed by the rewritten fact, so no timestamp call is made."""
    text = ("user (Joanna): I ran a charity race for mental health on Saturday.\n\n"
            "assistant (Nate): That's great, Joanna!")
    env.llm.world = {text: Turn(["Joanna", "Nate", "charity race"],
                                [("Nate", "charity race", "RAN", "I ran a charity race for mental health on Saturday.")])}
    before = FIRST_PERSON_FACTS._value.get()
    result = await env.run(env.episode("s1:t1", text, T1 + timedelta(days=1)))
    assert result.llm_calls == {"extract_nodes_and_edges.extract_message": 1}, result.llm_calls
    assert FIRST_PERSON_FACTS._value.get() == before + 1
    rows = await env.driver.execute_query(
        "MATCH (s:Entity)-[e:RELATES_TO]->(t:Entity) WHERE e.group_id = $g RETURN s.name AS s, t.name AS t, e.fact AS f",
        g=env.group_id)
    assert [(r["s"], r["t"], r["f"]) for r in rows[0]] == [
        ("Joanna", "charity race", "Joanna ran a charity race for mental health on Saturday.")]
