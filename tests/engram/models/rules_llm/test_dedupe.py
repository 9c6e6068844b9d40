"""Node and edge resolution: duplicates and contradictions."""

from __future__ import annotations


import pytest
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate
from graphiti_core.prompts.dedupe_nodes import NodeDuplicate, NodeResolutions

from engram.models.rules_llm import RulesExtractorClient
from tests.engram.models.rules_llm.helpers import CHAT_TURN, resolve_edge_messages


async def test_node_resolutions() -> None:
    extracted = ["Caroline", "LGBTQ support groups", "Sweden", "Java", "pyproject.toml", "Dr. Who?"]
    context = {
        "extracted_nodes": [
            {"id": i, "name": n, "entity_type": ["Entity", "Tool"] if n == "Java" else ["Entity"], "entity_type_description": "x"}
            for i, n in enumerate(extracted)
        ],
        "existing_nodes": [
            {"candidate_id": 0, "name": "lgbtq support group", "entity_types": ["Entity"], "summary": ""},
            {"candidate_id": 1, "name": "CAROLINE", "entity_types": ["Entity", "Person"], "summary": "Caroline likes art"},
            {"candidate_id": 2, "name": "Swedish", "entity_types": ["Entity"], "summary": ""},
            {"candidate_id": 3, "name": "Java", "entity_types": ["Entity", "Place"], "summary": "An island"},
            {"candidate_id": 4, "name": "pyproject.toml", "entity_types": ["Entity"], "summary": ""},
            {"candidate_id": 5, "name": "Dr Who", "entity_types": ["Entity"], "summary": ""},
        ],
        "episode_content": CHAT_TURN,
        "previous_episodes": [],
    }
    response = await RulesExtractorClient().generate_response(
        prompt_library.dedupe_nodes.nodes(context), response_model=NodeResolutions, prompt_name="dedupe_nodes.nodes"
    )
    resolutions = NodeResolutions.model_validate(response).entity_resolutions
    assert [r.id for r in resolutions] == list(range(len(extracted)))
    assert [r.name for r in resolutions] == extracted
    # case, plural "s", punctuation: duplicates; a similar word or a different type: not
    assert [r.duplicate_candidate_id for r in resolutions] == [1, 0, -1, -1, 4, 5]


async def test_node_duplicate_single_prompt() -> None:
    context = {
        "previous_episodes": [],
        "episode_content": CHAT_TURN,
        "extracted_node": {"name": "Melanie", "entity_types": ["Entity"]},
        "entity_type_description": {},
        "existing_nodes": [{"candidate_id": 0, "name": "Mel", "entity_types": ["Entity"]}, {"candidate_id": 1, "name": "melanie", "entity_types": ["Entity"]}],
    }
    response = await RulesExtractorClient().generate_response(prompt_library.dedupe_nodes.node(context), response_model=NodeDuplicate)
    assert NodeDuplicate.model_validate(response).duplicate_candidate_id == 1


@pytest.mark.parametrize(
    ("new", "existing", "candidates", "duplicates", "contradicted"),
    [
        # same normalised text: duplicate
        ("Caroline moved to Sweden in May 2023", ["Caroline moved to Sweden in May 2023.", "Caroline likes Sweden."], [], [0], []),
        # polarity
        ("Caroline no longer uses Vim.", ["Caroline uses Vim."], ["Caroline loves painting."], [], [0]),
        ("Caroline stopped using Vim.", [], ["Caroline uses Vim.", "Caroline uses Emacs for notes."], [], [0]),
        ("User does not use Docker anymore.", ["User uses Docker for deploys."], [], [], [0]),
        ("The nightly backup won't upload to Backblaze any more.", [], ["The nightly backup uploads to Backblaze."], [], [0]),
        # a contrast naming a value ("..., not Docker") is no negation: no polarity flip with a restatement
        ("Podman runs our containers now, not Docker.", [], ["Our containers run on Podman."], [], []),
        ("Client calls happen in Zoom now, not Google Meet.", [], ["Our standups happen in Google Meet."], [], []),
        # replacement
        ("User switched from requests to httpx.", [], ["User uses requests for HTTP calls.", "User uses pytest."], [], [0]),
        ("User uses httpx instead of requests.", [], ["User uses requests."], [], [0]),
        ("Podman runs our containers instead of Docker now.", [], ["Our containers run on Docker.", "Docker builds our images."], [], [0]),
        ("Our standups happen in Zoom now, not Google Meet.", [], ["Our standups happen in Google Meet."], [], [0]),
        ("Caroline moved from Boston to Austin.", [], ["Caroline lives in Boston.", "Caroline works at Google."], [], [0]),
        # single-valued relations with a different object
        ("Caroline lives in Austin.", ["Caroline lives in Boston."], [], [], [0]),
        ("Alice works at Acme Corp as a senior engineer.", ["Alice works at Acme Corp as a software engineer."], [], [], [0]),
        ("Caroline works at Google.", [], ["Melanie works at Apple.", "Caroline lives in Boston."], [], []),
        # versions of one package
        ("User upgraded pydantic to 2.15.", [], ["User pinned pydantic==2.14 in pyproject.toml.", "User pinned httpx==0.28."], [], [0]),
        # compatible facts: neither
        ("Bob ran 3 miles on Wednesday.", ["Bob ran 5 miles on Tuesday."], [], [], []),
        ("Caroline loves painting.", [], ["Caroline loves pottery.", "Caroline uses Vim."], [], []),
    ],
)
async def test_edge_duplicate(new: str, existing: list[str], candidates: list[str], duplicates: list[int], contradicted: list[int]) -> None:
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages(new, existing, candidates), response_model=EdgeDuplicate, prompt_name="dedupe_edges.resolve_edge"
    )
    assert EdgeDuplicate.model_validate(response) == EdgeDuplicate(duplicate_facts=duplicates, contradicted_facts=contradicted)


async def test_contradicted_index_counts_across_both_lists() -> None:
    response = await RulesExtractorClient().generate_response(
        resolve_edge_messages("Caroline no longer lives in Boston.", ["Caroline likes Boston."], ["Caroline visited Paris.", "Caroline lives in Boston."]),
        response_model=EdgeDuplicate,
    )
    assert response == {"duplicate_facts": [], "contradicted_facts": [2]}
