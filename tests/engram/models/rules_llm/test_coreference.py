"""Coreference: which "it" refers, where its thing is looked for, and facts through graphiti's prompt."""

from __future__ import annotations

import json

import pytest
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction

from engram.models.rules_llm import RulesExtractorClient
from engram.models.rules_llm.coreference import (
    Candidate,
    Reference,
    annotate,
    antecedent,
    candidate_role,
    last_previous_message,
    referring,
    unknown_things,
)
from tests.engram.models.rules_llm.helpers import CHAT_TYPES, combined_messages


def pronouns(text: str) -> list[str]:
    return [text[a:b] for a, b in referring(text)]


@pytest.mark.parametrize(
    "text",
    [
        "I bought it a year ago.",
        "A friend made it for my 18th birthday.",
        "Glad to hear you enjoyed it!",
        "Got the tattoo a few years ago, it stands for freedom.",
        "It represents my love for nature.",
        "It has an almond flour crust.",
        "I bought this one at a flea market.",
    ],
)
def test_a_referring_it_is_found(text: str) -> None:
    assert len(referring(text)) == 1, text


@pytest.mark.parametrize(
    "text",
    [
        "It is raining.",
        "It was great!",
        "It's been a while.",
        "It seems fine to me.",
        "It takes courage to talk about it.",
        "It can be hard.",
        "That's awesome!",
        "That is why I left.",
        "You got it!",
        "Got it.",
        "We made it!",
        "I made it to the finals.",
        "Let's make it happen.",
        "I found it hard to stop.",
        "Put in a ton of late nights but finally got it done.",
        "I love it when you sing.",
        "Keep it up!",
        "It sounds like it would be difficult.",
        "Give a pup the love it deserves.",
        "There was this one time my pup chased a squirrel.",
        "It breaks my heart that our kids lack books.",  # extraposed: "it" is the that-clause
        "It reminded me why I joined the army.",
    ],
)
def test_expletive_and_idiomatic_it_is_left_alone(text: str) -> None:
    assert pronouns(text) == [], text


def test_antecedent_needs_exactly_one_candidate_in_the_nearest_sentence_that_names_one() -> None:
    guitar = Candidate("guitar", 0, 6)
    lamp = Candidate("lamp", 10, 14)
    date = Candidate("may 2023", 20, 28, chosen=False)
    story = Candidate("story", 0, 5, chosen=False, known=False)  # a noun phrase only
    assert antecedent([], 10, [[guitar]]) == "guitar"
    assert antecedent([], 10, [[guitar, lamp]]) is None  # ambiguous
    assert antecedent([], 10, [[guitar, date]]) is None  # a blocker makes it ambiguous
    assert antecedent([], 10, [[], [story], [guitar]]) == "guitar"  # sentences without an entity are skipped
    assert antecedent([], 10, [[lamp], [guitar]]) == "lamp"  # the nearest decides
    assert antecedent([Candidate("guitar", 30, 36)], 20, [[lamp]]) == "lamp"  # only before the pronoun
    assert antecedent([], 10, []) is None


def test_candidate_roles() -> None:
    assert candidate_role("Caroline", "person") is None
    assert candidate_role("Caroline", "speaker") is None
    assert candidate_role("8 May 2023", "date") == "blocker"
    assert candidate_role("Jordan", "thing", "person") == "blocker"  # an untyped name may be a person
    assert candidate_role("painting animals", "thing", "object") == "blocker"  # an activity
    assert candidate_role("stories", "thing", "object") == "blocker"  # plural
    assert candidate_role("series", "thing", "object") == "chosen"
    assert candidate_role("cool form", "thing", "object", "It's like a ") == "blocker"  # a simile
    assert candidate_role("tattoo", "thing", "object") == "chosen"
    assert candidate_role("tattoo", "thing", "object", same_message=False) == "blocker"
    assert candidate_role("Little Women", "thing", "group", same_message=False) == "chosen"
    assert candidate_role("httpx", "library", same_message=False) == "chosen"
    assert candidate_role("Paris", "place") == "chosen"


def test_noun_phrases_the_extractor_did_not_take() -> None:
    [guitar] = unknown_things("I bought a new guitar last week.", [])
    assert (guitar.key, guitar.name, guitar.chosen) == ("new guitar", "new guitar", True)
    assert unknown_things("I learned a lot and had a blast.", []) == []
    assert unknown_things("A friend gave me the idea.", []) == []  # a person noun, a thought
    [refuge] = unknown_things("It's a refuge from the city.", [])
    assert not refuge.chosen  # a predicate describes "it", it is no new thing
    [bones] = unknown_things("The bones were so cool.", [])
    assert not bones.chosen and not bones.known  # plural: competes, never chosen
    assert unknown_things("I love my dog.", [(7, 13)]) == []  # taken by an entity mention
    assert unknown_things("Congrats on finding poses that suit you.", []) == []  # "that" relative, no determiner
    [castle] = unknown_things("That castle looks amazing!", [])
    assert castle.name == "castle" and castle.chosen
    [tattoo] = unknown_things("Love the tattoo!", [], same_message=False)
    assert not tattoo.chosen  # a lower-case thing of the previous message is never chosen


def test_last_previous_message_reads_graphitis_json_list() -> None:
    block = json.dumps([{"content": "user (A): old", "timestamp": None}, {"content": "user (A): new", "timestamp": None}])
    assert last_previous_message(block) == "user (A): new"
    assert last_previous_message("[]") is None
    assert last_previous_message("not json") is None
    assert last_previous_message(None) is None


def test_annotate_names_the_thing_after_the_pronoun() -> None:
    text = "I got it a while ago and wear it daily."
    second = text.index("it daily")
    refs = [Reference(6, 8, "tattoo"), Reference(second, second + 2, "tattoo")]
    assert annotate(text, refs, {"tattoo": "tattoo"}) == "I got it (tattoo) a while ago and wear it (tattoo) daily."


async def combined(turn: str, previous: list[str] | None = None) -> dict:
    return await RulesExtractorClient().generate_response(
        combined_messages(turn, CHAT_TYPES, previous=previous), response_model=CombinedExtraction,
        prompt_name="extract_nodes_and_edges.extract_message",
    )


async def test_it_resolves_to_a_title_in_the_previous_turn() -> None:
    """Issue 11's miss: "I bought it a year ago" with the name in the previous turn. The fact
    now exists and names the book (its words are what recall matches)."""
    previous = ['user (Audrey): Any reading tips?\n\nassistant (Andrew): I just finished "The Night Circus" and loved every page.']
    response = await combined("user (Audrey): Oh nice, I bought it a year ago!", previous)
    edges = [(e["source_entity_name"], e["target_entity_name"], e["fact"]) for e in response["edges"]]
    assert ("Audrey", "The Night Circus", "Oh nice, Audrey bought it (The Night Circus) a year ago!") in edges, edges
    assert "The Night Circus" in [e["name"] for e in response["extracted_entities"]]


async def test_it_resolves_to_a_thing_earlier_in_the_same_message() -> None:
    response = await combined("user (Caroline): I bought a new guitar last week. I play it every day.")
    facts = {e["fact"]: e["target_entity_name"] for e in response["edges"]}
    assert facts.get("Caroline plays it (new guitar) every day.") == "new guitar", facts


async def test_previous_messages_alone_give_no_entities_or_facts() -> None:
    previous = ['user (Audrey): Hi!\n\nassistant (Andrew): I just finished "The Night Circus" and loved every page.']
    response = await combined("user (Audrey): Thanks, that sounds great!", previous)
    assert [e["name"] for e in response["extracted_entities"]] == ["Audrey"]
    assert response["edges"] == []


async def test_expletive_ambiguous_and_lower_case_previous_turn_it_stay_unresolved() -> None:
    turns = [
        # expletive / idiom
        ("user (Caroline): I went to the concert last night. It was great! You got it.", None),
        # two things in the nearest sentence: ambiguous
        ("user (Caroline): I bought a guitar and a lamp. I love it.", None),
        # a lower-case thing in the previous message was mostly not what "it" meant
        ("user (Audrey): I got it a while ago.", ["user (Audrey): Hi!\n\nassistant (Andrew): Wow, I love that tattoo!"]),
    ]
    for turn, previous in turns:
        response = await combined(turn, previous)
        assert not [e["fact"] for e in response["edges"] if " (" in e["fact"]], (turn, response["edges"])
