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
        # no longer / not ... any more
        ("Tom no longer works at Globex.", "Tom works at Globex.", "ending"),
        ("The team is not using Slack any more.", "The team uses Slack for chat.", "ending"),
        ("We don't deploy the app to Heroku anymore; it runs on Fly.io.", "We deploy the app to Heroku.", "ending"),
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
    ],
)
def test_no_change(new: str, old: str) -> None:
    assert supersedes(new, old) is None


def test_find_changes_names_the_values() -> None:
    [change] = find_changes("We replaced Vue with React in the frontend.")
    assert (change.kind, set(change.old), set(change.new), set(change.context)) == ("replacement", {"vu"}, {"react"}, {"frontend"})
    [switch] = find_changes("We switched the billing service to SQLite.")
    assert (switch.kind, set(switch.old), set(switch.new), set(switch.context)) == ("switch", set(), {"sqlit"}, {"bill", "servic"})


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
