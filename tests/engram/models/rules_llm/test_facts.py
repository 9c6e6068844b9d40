"""Facts: the third-person rewrite, greetings, negations, stopped activities, vocatives."""

from __future__ import annotations


import pytest
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction

from engram.models.rules_llm import RulesExtractorClient, contradicts, third_person
from engram.models.rules_llm.facts import _Mention, _vocative, reaction_to_listener, statement_before_question
from tests.engram.models.rules_llm.helpers import CHAT_TYPES, combined_messages, triples


async def _facts(turn: str) -> list[str]:
    """The facts the rules model extracts from one chat turn."""
    response = await RulesExtractorClient().generate_response(
        combined_messages(turn, CHAT_TYPES), response_model=CombinedExtraction,
        prompt_name="extract_nodes_and_edges.extract_message",
    )
    return [e["fact"] for e in response["edges"]]


def test_third_person_rewrite() -> None:
    assert third_person("I love painting and my kids love pottery.", "Melanie") == "Melanie loves painting and Melanie's kids love pottery."
    assert third_person("I'm swamped, I've been busy and I fixed it for me.", "Bob") == "Bob is swamped, Bob has been busy and Bob fixed it for Bob."
    assert third_person("I also go there.", "Ann") == "Ann also goes there."
    assert third_person("I love it.", None) == "I love it."


async def test_greetings_with_a_name_are_not_facts() -> None:
    turn = ("user (Caroline): Wow, Melanie! Thanks, Melanie! I went to a LGBTQ support group yesterday "
            "and it was so powerful.\n\nassistant (Melanie): Hey Caroline! Totally agree, Caroline.")
    facts = await _facts(turn)
    assert facts, "the support-group sentence should still give a fact"
    assert any("support group" in f for f in facts)
    assert not [f for f in facts if f.rstrip("!.").split(",")[0].strip().lower() in {"wow", "thanks", "hey", "totally agree"}], facts


def test_first_person_negations_survive_the_third_person_rewrite() -> None:
    """Found by a summary-gate test: "I no longer live in Boston" became "Alice noes longer live
    in Boston", which lost the negation, so the old fact was never invalidated."""
    assert third_person("I no longer live in Boston.", "Alice") == "Alice no longer lives in Boston."
    assert third_person("I do not like tea.", "Alice") == "Alice does not like tea."
    assert third_person("I never go there.", "Alice") == "Alice never goes there."
    assert contradicts("Alice no longer lives in Boston.", "Alice lives in Boston.")


@pytest.mark.parametrize(
    ("earlier", "later", "old_triple", "new_triple"),
    [
        # a negated activity: the object of "play" is its thing, "any more" makes it an ending
        ("Mo plays golf on Fridays.", "Mo doesn't play golf any more.",
         ("Ada", "DOES", "golf"), ("Ada", "NO_LONGER_DOES", "golf")),
        ("Ben goes climbing on Saturdays.", "Ben does not go climbing anymore.",
         ("Ada", "DOES", "climbing"), ("Ada", "NO_LONGER_DOES", "climbing")),
        # stopped / quit / gave up: the cue takes the activity as its object
        ("Raj plays the violin in a quartet.", "Raj gave up the violin.", ("Ada", "DOES", "violin"), ("Ada", "QUIT", "violin")),
        ("Lena plays chess at the Riverside Club.", "Lena quit chess.", ("Ada", "DOES", "chess"), ("Ada", "QUIT", "chess")),
    ],
)
async def test_a_stopped_activity_is_a_fact_that_ends_the_earlier_one(
    earlier: str, later: str, old_triple: tuple[str, str, str], new_triple: tuple[str, str, str],
) -> None:
    """Found by the change corpus: a negated activity ("... doesn't play golf any more") gave no fact
    at all (a lower-case object after a verb the rules did not know), so nothing could end it."""
    client = RulesExtractorClient()
    facts = {}
    for statement, triple in ((earlier, old_triple), (later, new_triple)):
        response = await client.generate_response(combined_messages(f"user (Ada): {statement}", CHAT_TYPES),
                                                  response_model=CombinedExtraction)
        assert triple in triples(response), triples(response)
        facts[statement] = next(e["fact"] for e in response["edges"] if e["target_entity_name"] == triple[2])
    assert contradicts(facts[later], facts[earlier])


async def test_stop_before_a_thing_is_no_activity() -> None:
    response = await RulesExtractorClient().generate_response(
        combined_messages("user (Ada): I stopped the server before lunch.", CHAT_TYPES), response_model=CombinedExtraction,
    )
    assert not [e for e in response["extracted_entities"] if e["name"] in ("server", "the server")], response


def test_a_name_used_to_address_the_listener_is_no_argument() -> None:
    def mention(text: str, name: str) -> _Mention:
        start = text.index(name)
        return _Mention(name.lower(), start, start + len(name), "person")

    for text, name in [("Thanks, Melanie!", "Melanie"), ("Wow, Caroline, way to go!", "Caroline"),
                       ("Caroline, did you see it?", "Caroline"), ("Hey Mel!", "Mel")]:
        assert _vocative(text, mention(text, name)), text
    for text, name in [("I met Caroline at the park.", "Caroline"), ("Caroline went to Boston.", "Caroline"),
                       ("I painted it for Melanie.", "Melanie")]:
        assert not _vocative(text, mention(text, name)), text


async def test_lines_of_tool_output_are_not_facts() -> None:
    """What the turn-detector keeps of a pytest run (head and tail lines) names files and
    packages, but states nothing; a short sentence with a version still does."""
    turn = ("tool (pytest): $ pytest -q\ntests/test_mod1.py ....  [5%]\ntests/test_mod19.py ....  [95%]\n"
            "========== 212 passed, 3 skipped in 41.2s ==========\n\n"
            "user (Ada): Bumped pydantic==2.14 in pyproject.toml.")
    facts = await _facts(turn)
    assert not [f for f in facts if "test_mod" in f], facts
    assert any("pydantic" in f for f in facts), facts


@pytest.mark.parametrize(
    ("text", "statement"),
    [
        ("What type of movies do you like best?", None),
        ("Is Pepper adjusting well to her?", None),
        ("Who supports you, Mel?", None),
        ("Got any other objects that you treasure, like that necklace?", None),
        ("What do you think, should I switch to SQLite?", None),
        ("I'm on Python 3.12 - why does this fail?", "I'm on Python 3.12"),
        ("We switched to SQLite last week, can you update the config?", "We switched to SQLite last week"),
        ("The blog is on WordPress, right?", "The blog is on WordPress"),
        ("I moved to Berlin.", "I moved to Berlin."),
    ],
)
def test_a_question_states_nothing_but_a_statement_before_it_does(text: str, statement: str | None) -> None:
    end = statement_before_question(text)
    assert (None if end is None else text[:end]) == statement


def test_a_reaction_to_the_listener_states_nothing() -> None:
    assert reaction_to_listener("Wow, love that painting!")
    assert reaction_to_listener("Sorry about your job Jon, but starting your own business sounds awesome!")
    assert not reaction_to_listener("Wow, I love that painting too!")  # the speaker's own taste
    assert not reaction_to_listener("Oh, Pepper got adopted last week!")  # news, not a reaction
    assert not reaction_to_listener("Ok, that fixed the flaky test.")


async def test_questions_and_reactions_give_no_fact_but_the_facts_beside_them_stay() -> None:
    """Issue 24 item 6's junk: questions and remarks to the listener are not facts; a fact in the
    same message, before the question or in its own sentence, still is."""
    turn = ("user (Caroline): Wow, love that painting! Is Pepper adjusting well to her? "
            "I adopted a dog named Pepper last week, have you met her?\n\n"
            "assistant (Melanie): What type of movies do you like best? I love pottery.")
    facts = await _facts(turn)
    assert not [f for f in facts if "?" in f or f.startswith("Wow")], facts
    assert any("Pepper" in f and "adopted" in f for f in facts), facts
    assert any("pottery" in f for f in facts), facts
