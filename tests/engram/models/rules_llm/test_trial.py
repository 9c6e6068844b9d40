"""What a new user hit with the offline model (issue 24, item 6): speaker roles as entities, a fact
stored twice (the user's statement and the assistant's restatement), "Assistant rewrotes", casual
stack statements that a later switch did not end, and an assistant's restatement of the old fact
left current."""

from __future__ import annotations

import pytest
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction

from engram.models.rules_llm import RulesExtractorClient, supersedes, third_person
from tests.engram.models.rules_llm.helpers import combined_messages


def extract(content: str) -> dict:
    return RulesExtractorClient().respond(combined_messages(content), CombinedExtraction)


def contradicted(new_fact: str, old_facts: list[str]) -> list[str]:
    messages = prompt_library.dedupe_edges.resolve_edge({
        "existing_edges": [], "new_edge": new_fact,
        "edge_invalidation_candidates": [{"idx": i, "fact": f} for i, f in enumerate(old_facts)],
    })
    answer = RulesExtractorClient().respond(messages, EdgeDuplicate)
    return [old_facts[i] for i in answer["contradicted_facts"]]


def test_speaker_roles_are_never_entities_and_a_named_speaker_is() -> None:
    got = extract("user: We use Postgres 15 for billing. The User is me.\n\n"
                  "assistant: Noted. I asked the assistant and the user.")
    names = {e["name"].lower() for e in got["extracted_entities"]}
    assert not names & {"user", "assistant", "the user", "the assistant"}, names
    assert {"postgres", "billing"} <= names
    # the fact still stands on its own: the role is named in its text
    named = extract("user (Ada): I use Postgres 15 for billing.\n\nassistant: I rewrote the billing job in Go.")
    assert "Ada" in {e["name"] for e in named["extracted_entities"]}
    assert "Assistant" not in {e["name"] for e in named["extracted_entities"]}


@pytest.mark.parametrize("user, assistant", [
    ("The billing service uses Postgres 15.", "Noted, billing is on Postgres 15."),
    ("We use Postgres 15 for billing.", "Noted, billing is on Postgres 15."),
    ("we switched billing to SQLite", "Got it, billing is now on SQLite."),
])
def test_an_assistant_restatement_in_the_same_turn_is_one_fact(user: str, assistant: str) -> None:
    got = extract(f"user (Ada): {user}\n\nassistant: {assistant}")
    assert {e["fact"] for e in got["edges"]} == {user}, got["edges"]


def test_an_assistant_statement_with_new_content_is_kept() -> None:
    got = extract("user (Ada): We use Postgres 15 for billing.\n\nassistant (Max): Max moved the billing reports to Metabase.")
    assert "Max moved the billing reports to Metabase." in {e["fact"] for e in got["edges"]}


@pytest.mark.parametrize("sentence, speaker, expected", [
    ("I rewrote the parser.", "Assistant", "The assistant rewrote the parser."),
    ("I overtook Bob and I undid the change.", "Ada", "Ada overtook Bob and Ada undid the change."),
    ("I mistook the flag for a bug.", "User", "The user mistook the flag for a bug."),
    ("I write tests.", "Ada", "Ada writes tests."),
    ("I rewrite the docs and I fix my tests.", "Ada", "Ada rewrites the docs and Ada fixes Ada's tests."),
])
def test_fact_sentences_conjugate_irregular_and_prefixed_verbs(sentence: str, speaker: str, expected: str) -> None:
    assert third_person(sentence, speaker) == expected


def test_no_built_fact_has_a_doubly_inflected_verb() -> None:
    got = extract("assistant: I rewrote src/app.py and I overrode the defaults in pyproject.toml.")
    facts = " ".join(e["fact"] for e in got["edges"])
    assert facts and "rewrotes" not in facts and "overrodes" not in facts and "Assistant" not in facts


OLD = ["We use Postgres 15 for billing.", "Billing is on Postgres 15.", "Billing runs on Postgres 15.",
       "Noted, billing is on Postgres 15."]
NEW = ["We switched billing to SQLite.", "we moved billing over to SQLite", "We migrated billing to SQLite.",
       "Noted, billing is now on SQLite.", "billing runs on SQLite now", "we use SQLite for billing now",
       "Dropped Postgres, billing runs on SQLite now.", "we ditched Postgres, billing is on SQLite now"]


@pytest.mark.parametrize("old", OLD)
@pytest.mark.parametrize("new", NEW)
def test_use_for_is_on_runs_on_are_ended_by_a_switch_of_the_same_subject(old: str, new: str) -> None:
    assert supersedes(new, old)


@pytest.mark.parametrize("new, old", [
    ("billing is on SQLite now", "Billing is on SQLite."),  # a restatement
    ("the search service runs on OpenSearch now", "Billing is on Postgres 15."),  # another subject
    ("we use Jira for tickets now", "We use Slack for chat."),
    ("Dropped Jenkins, CI runs on Buildkite now.", "Our cache runs on Redis."),
    ("billing is on Postgres 15", "We use Postgres 15 for billing."),  # no "now": no change cue
])
def test_a_now_state_ends_nothing_about_another_subject_or_the_same_value(new: str, old: str) -> None:
    assert supersedes(new, old) is None


def test_the_trial_nothing_old_stays_current() -> None:
    # day 0: the user's statement and the assistant's restatement; days later: the switch and its restatement
    before = extract("user: We use Postgres 15 for billing.\n\nassistant: Noted, billing is on Postgres 15.")
    after = extract("user: we switched billing to SQLite\n\nassistant: Noted, billing is now on SQLite.")
    old = list(dict.fromkeys(e["fact"] for e in before["edges"]))
    new = list(dict.fromkeys(e["fact"] for e in after["edges"]))
    assert old and new
    ended = {f for n in new for f in contradicted(n, old)}
    assert ended == set(old), (old, new)
    # and an assistant restatement of the old fact, were it stored, is ended too
    assert contradicted("we switched billing to SQLite", ["Noted, billing is on Postgres 15."])
    assert contradicted("Noted, billing is now on SQLite.", ["We use Postgres 15 for billing."])


def test_what_an_unnamed_speaker_says_about_one_thing_stays_a_fact_of_that_thing() -> None:
    """Roles are no entities, yet "Decision: pin every direct dependency in pyproject.toml" from an
    unnamed user is a fact: of pyproject.toml alone (a self-edge), not lost (the coding example
    kept 6 of its 10 facts without this)."""
    got = extract("user: Decision: pin every direct dependency in pyproject.toml so CI matches laptops.\n\n"
                  "assistant: Done.")
    names = [e["name"] for e in got["extracted_entities"]]
    [edge] = [e for e in got["edges"] if "pin every direct dependency" in e["fact"]]
    assert edge["source_entity_name"] == edge["target_entity_name"] == "pyproject.toml"
    assert not {n.lower() for n in names} & {"user", "assistant"}
    # a named speaker still gets the two-entity fact
    named = extract("user (Ada): Decision: pin every direct dependency in pyproject.toml.\n\nassistant: Done.")
    assert any({e["source_entity_name"], e["target_entity_name"]} == {"Ada", "pyproject.toml"} for e in named["edges"])


def test_a_switch_of_the_billing_service_ends_we_use_postgres_for_billing() -> None:
    """The trial's other wording: the subject's generic head noun ("service") may be missing from
    the old fact; a specific word must remain and match ("search service" ends nothing of billing)."""
    assert supersedes("We switched the billing service to SQLite.", "We use Postgres 15 for billing.") == "switch"
    assert supersedes("We switched the search service to OpenSearch.", "We use Postgres 15 for billing.") is None
    assert supersedes("We switched the service to SQLite.", "We use Postgres 15 for billing.") is None
