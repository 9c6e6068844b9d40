"""Change phrases (engram/models/rules_llm/changes.py): which later facts end an earlier one, and
the same decision through graphiti's resolve_edge prompt."""

from __future__ import annotations

import pytest
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate

from engram.models.rules_llm import RulesExtractorClient
from engram.models.rules_llm.changes import find_changes, supersedes
from tests.engram.models.rules_llm.helpers import resolve_edge_messages


@pytest.mark.parametrize(
    ("new", "old", "kind"),
    [
        # switched/moved/migrated S to Y, the old value not named
        ("We switched the billing service to SQLite.", "The billing service uses Postgres 15.", "switch"),
        ("We moved the search service to OpenSearch.", "The search service uses Elasticsearch 7.", "switch"),
        ("The billing service migrated over to SQLite last week.", "The billing service uses Postgres 15.", "switch"),
        # ... from X to Y, with a subject between verb and "from"
        ("We migrated our CI from Jenkins to GitHub Actions.", "Our CI runs on Jenkins.", "replacement"),
        ("We switched log shipping from Datadog to Grafana Loki.", "Logs are shipped to Datadog.", "replacement"),
        # replaced X with Y (context after Y), X was replaced by Y, swapped X for Y, Y instead of X
        ("We replaced Vue with React in the frontend.", "The frontend is built with Vue.", "replacement"),
        ("Vue was replaced by React in the frontend.", "The frontend is built with Vue.", "replacement"),
        ("Priya swapped her Toyota Corolla for a Tesla.", "Priya drives a Toyota Corolla.", "replacement"),
        ("The API now uses FastAPI instead of Flask.", "The API is written in Flask.", "replacement"),
        ("Sam uses Emacs rather than Vim now.", "Sam's favourite editor is Vim.", "replacement"),
        # ... the new value after a preposition, or made the subject ("Z <verb> S instead of Y")
        ("The team offsite is in Cascais instead of Sintra this year.", "The team offsite is in Sintra.", "replacement"),
        ("We deploy with Kamal rather than Capistrano now.", "Deploys go through Capistrano.", "replacement"),
        ("Podman runs our containers instead of Docker now.", "Our containers run on Docker.", "replacement"),
        ("Fastly serves our assets in place of Cloudflare.", "Our assets are served by Cloudflare.", "replacement"),
        ("Regus was replaced by WeWork at the Lisbon office.", "Regus provides the desks for the Lisbon office.", "replacement"),
        # Y now, not X (a contrast naming the old value)
        ("Our standups happen in Zoom now, not Google Meet.", "Our standups happen in Google Meet.", "replacement"),
        ("Now Dara reads the news on Inoreader, not Feedly.", "Dara reads the news on Feedly.", "replacement"),
        # no longer / not ... any more
        ("Tom no longer works at Globex.", "Tom works at Globex.", "ending"),
        ("The team is not using Slack any more.", "The team uses Slack for chat.", "ending"),
        ("We don't deploy the app to Heroku anymore; it runs on Fly.io.", "We deploy the app to Heroku.", "ending"),
        ("The nightly backup won't upload to Backblaze any more.", "The nightly backup uploads to Backblaze.", "ending"),
        ("The office isn't open on Saturdays anymore.", "The office is open on Saturdays.", "ending"),
        ("Ben doesn't go climbing anymore.", "Ben goes climbing on Saturdays.", "ending"),
        # stopped / quit / gave up an activity ("swimming" meets "swims")
        ("Lena quit swimming last year.", "Lena swims at the Aquatic Centre on Mondays.", "ending"),
        ("Raj gave up the violin.", "Raj plays the violin in a quartet.", "ending"),
        ("Jo stopped running on weekdays.", "Jo runs on weekdays.", "ending"),
    ],
)
def test_a_change_supersedes_the_old_fact(new: str, old: str, kind: str) -> None:
    assert supersedes(new, old) == kind


@pytest.mark.parametrize(
    ("new", "old"),
    [
        # another subject, with the same change phrase
        ("We switched the search service to OpenSearch.", "The billing service uses Postgres 15."),
        ("The admin dashboard uses React instead of Angular.", "The API uses Angular."),
        ("Maya's brother moved to Berlin.", "Maya lives in Lisbon."),
        # the old fact already holds the new value: a restatement, not a change
        ("We migrated the frontend to React in 2023.", "The frontend is built with React."),
        ("We switched the billing service to SQLite.", "The billing service uses SQLite."),
        # an ending of something else
        ("Priya no longer eats meat.", "Priya drives a Toyota Corolla."),
        ("Caroline no longer lives in Boston.", "Caroline likes Boston."),
        ("We no longer use Redis for caching.", "Our CI runs on Jenkins."),
        # an old fact that is itself negated is not ended again
        ("Tom no longer works at Globex.", "Tom does not work at Globex."),
        # no change phrase at all
        ("The billing service runs on Postgres 15.", "The billing service uses Postgres 15."),
        # replaced something the old fact does not hold
        ("We replaced the office printer with a new one.", "We deploy the app to Heroku."),
        # the new value already held: "rather than" / "not" name what was never there
        ("The team offsite is in Cascais rather than Sintra.", "The team offsite is in Cascais."),
        ("Podman runs our containers now, not Docker.", "Our containers run on Podman."),
        # another subject with the same contrast or ending
        ("Client calls happen in Zoom now, not Google Meet.", "Our standups happen in Google Meet."),
        ("The mobile team uses React instead of Angular.", "The web team uses Angular."),
        ("Lena's brother quit swimming.", "Lena swims at the Aquatic Centre on Mondays."),
        ("Raj doesn't play football anymore.", "Raj plays the violin in a quartet."),
        # "Y, not X" without "now" is no change told (a correction or a plain contrast)
        ("The team chats on Discord, not Slack.", "The team chats on Slack."),
    ],
)
def test_no_change(new: str, old: str) -> None:
    assert supersedes(new, old) is None


def test_find_changes_names_the_values() -> None:
    [change] = find_changes("We replaced Vue with React in the frontend.")
    assert (change.kind, set(change.old), set(change.new), set(change.context)) == ("replacement", {"vu"}, {"react"}, {"frontend"})
    [switch] = find_changes("We switched the billing service to SQLite.")
    assert (switch.kind, set(switch.old), set(switch.new), set(switch.context)) == ("switch", set(), {"sqlit"}, {"bill", "servic"})


def test_a_new_value_before_the_cue_is_read_two_ways() -> None:
    # the words right before "instead of", or the subject when the value was made the subject;
    # supersedes() takes whichever leaves the rest of the fact in the old one
    changes = find_changes("Podman runs our containers instead of Docker now.")
    assert {(c.kind, c.old, c.new, c.context) for c in changes} == {
        ("replacement", frozenset({"docker"}), frozenset({"run", "container"}), frozenset({"podman"})),
        ("replacement", frozenset({"docker"}), frozenset({"podman"}), frozenset({"container"})),
    }
    [after_preposition] = find_changes("The offsite is in Cascais instead of Sintra.")
    assert (after_preposition.new, after_preposition.context) == (frozenset({"cascai"}), frozenset({"offsit"}))


async def test_resolve_edge_prompt_marks_the_switched_fact_contradicted() -> None:
    # graphiti's dedupe_edges.resolve_edge prompt, as _dedupe_extracted_edge builds it
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages(
            "We switched the billing service to SQLite.",
            [],
            ["The billing service sends invoices on Mondays.", "The billing service uses Postgres 15.",
             "The search service uses Elasticsearch 7."],
        ),
        response_model=EdgeDuplicate,
    )
    assert response == {"duplicate_facts": [], "contradicted_facts": [1]}


async def test_the_older_fact_arriving_after_the_switch_contradicts_it() -> None:
    # the switch already in the graph, the fact it ended extracted later (another session that
    # closed later): they contradict, and graphiti's valid_at comparison ends the older one
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages(
            "The billing service uses Postgres 15.",
            [],
            ["We switched the billing service to SQLite.", "We switched the search service to OpenSearch."],
        ),
        response_model=EdgeDuplicate,
    )
    assert response == {"duplicate_facts": [], "contradicted_facts": [0]}
    # a person's switch does not end another value of the person told after it (the explorer's
    # "I moved to Austin." then "I use FastAPI.")
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages("Ada uses FastAPI.", [], ["Ada moved to Austin."]), response_model=EdgeDuplicate,
    )
    assert response["contradicted_facts"] == []
    # a fact the switch does not end (it already holds the new value) is no contradiction
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages("The billing service uses SQLite.", [], ["We switched the billing service to SQLite."]),
        response_model=EdgeDuplicate,
    )
    assert response["contradicted_facts"] == []


@pytest.mark.parametrize(
    ("new", "old"),
    [
        ("Maya's brother moved to Berlin.", "Maya lives in Lisbon."),  # another subject
        ("Tom joined a climbing club.", "Tom works at Globex."),  # "joined" an organisation only when named
    ],
)
async def test_single_valued_relations_need_the_same_subject_and_an_organisation(new: str, old: str) -> None:
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages(new, [], [old]), response_model=EdgeDuplicate
    )
    assert response["contradicted_facts"] == []
