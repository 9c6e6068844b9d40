"""Prompt parsing: which blocks of graphiti's prompts are read (current vs previous/context), the two-call path, text and JSON episodes."""

from __future__ import annotations

from datetime import datetime, timezone

from graphiti_core.nodes import EpisodeType, EpisodicNode
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.extract_edges import ExtractedEdges
from graphiti_core.prompts.extract_nodes import ExtractedEntities
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction
from graphiti_core.utils.maintenance.node_operations import _build_entity_types_context
from graphiti_core.utils.text_utils import concatenate_timeline
from hypothesis import given

from engram.models.rules_llm import RulesExtractorClient
from tests.engram.models.rules_llm.helpers import CHAT_TURN, CHAT_TYPES, CODING_TYPES, REF, combined_messages, triples


async def test_only_current_messages_are_extracted() -> None:
    # engram's template examples (custom instructions) and previous messages name things too
    instructions = "Use specific names (`services/extractor/preprocessing.py`, `pytest`, `KeyError: 'group_id'`)."
    previous = ["user (Caroline): I use Django and live in Paris.", "assistant: Run `ruff check src/`."]
    content = "user (Caroline): Hi Melanie, I fixed app/main.py with mypy."
    response = await RulesExtractorClient().generate_response(
        combined_messages(content, CODING_TYPES, instructions, previous), response_model=CombinedExtraction
    )
    assert {e["name"] for e in response["extracted_entities"]} == {"Caroline", "Melanie", "app/main.py", "mypy"}
    assert ("Caroline", "FIXES", "app/main.py") in triples(response)


async def test_combined_extraction_multi_episode_indices_and_context_episodes() -> None:
    def episode(content: str, day: int) -> EpisodicNode:
        return EpisodicNode(
            name=f"e{day}", group_id="g", source=EpisodeType.message, source_description="chat",
            content=content, valid_at=datetime(2023, 5, day, tzinfo=timezone.utc),
        )

    first = episode("Caroline: I moved to Boston.", 1)
    context_only = episode("Melanie: I visited Tokyo.", 2)
    second = episode("Caroline: I work at Google.", 3)
    content = concatenate_timeline([first, second], [first, context_only, second])
    assert "[CONTEXT EPISODE]" in content
    response = await RulesExtractorClient().generate_response(combined_messages(content), response_model=CombinedExtraction)
    names = {e["name"] for e in response["extracted_entities"]}
    assert "Tokyo" not in names and "Melanie" not in names  # context is never extracted from
    by_triple = {(e["source_entity_name"], e["relation_type"], e["target_entity_name"]): e["episode_indices"] for e in response["edges"]}
    assert by_triple[("Caroline", "LIVES_IN", "Boston")] == [0]
    assert by_triple[("Caroline", "WORKS_AT", "Google")] == [1]


async def test_extracted_entities_then_extracted_edges() -> None:
    client = RulesExtractorClient()
    nodes_context = {
        "episode_content": CHAT_TURN,
        "episode_timestamp": REF.isoformat(),
        "previous_episodes": [{"content": "Caroline: Hi Melanie!", "timestamp": REF.isoformat()}],
        "custom_extraction_instructions": "",
        "entity_types": _build_entity_types_context(CHAT_TYPES),
        "source_description": "chat",
    }
    entities = await client.generate_response(
        prompt_library.extract_nodes.extract_message(nodes_context),
        response_model=ExtractedEntities,
        prompt_name="extract_nodes.extract_message",
    )
    ExtractedEntities.model_validate(entities)
    names = [e["name"] for e in entities["extracted_entities"]]
    assert names[:2] == ["Caroline", "Melanie"]
    assert {"LGBTQ support group", "Sweden", "Google", "pottery"} <= set(names)
    assert all(e["episode_indices"] == [0] for e in entities["extracted_entities"])

    # the edge prompt gets graphiti's node list; endpoints must come from it only
    given = [n for n in names if n != "Google"] + ["It", "Paris"]
    edges_context = {
        "episode_content": CHAT_TURN,
        "nodes": [{"name": n, "entity_types": ["Entity"]} for n in given],
        "previous_episodes": [],
        "reference_time": REF,
        "edge_types": [],
        "strict_edge_types": False,
        "custom_extraction_instructions": "",
    }
    edges = await client.generate_response(
        prompt_library.extract_edges.edge(edges_context), response_model=ExtractedEdges, prompt_name="extract_edges.edge"
    )
    ExtractedEdges.model_validate(edges)
    endpoints = {e["source_entity_name"] for e in edges["edges"]} | {e["target_entity_name"] for e in edges["edges"]}
    assert endpoints <= set(given) - {"It", "Paris"}
    by_triple = {(e["source_entity_name"], e["relation_type"], e["target_entity_name"]): e for e in edges["edges"]}
    attended = by_triple[("Caroline", "ATTENDED", "LGBTQ support group")]
    assert attended["valid_at"] == "2023-05-07T00:00:00Z"  # "yesterday" relative to REFERENCE_TIME
    assert by_triple[("Melanie", "LIVES_IN", "Sweden")]["valid_at"] == "2023-05-01T00:00:00Z"
    assert ("Melanie's kids", "LIKES", "pottery") in by_triple
    assert [c.prompt_name for c in client.calls] == ["extract_nodes.extract_message", "extract_edges.edge"]


async def test_extract_text_and_json_prompts() -> None:
    client = RulesExtractorClient()
    base = {
        "episode_timestamp": REF.isoformat(),
        "previous_episodes": [],
        "custom_extraction_instructions": "",
        "entity_types": _build_entity_types_context(CODING_TYPES),
        "source_description": "notes",
    }
    text = await client.generate_response(
        prompt_library.extract_nodes.extract_text({**base, "episode_content": "The deploy uses docker compose and reads deploy/nginx.conf."}),
        response_model=ExtractedEntities,
    )
    assert {e["name"] for e in text["extracted_entities"]} == {"docker compose", "deploy/nginx.conf"}
    as_json = await client.generate_response(
        prompt_library.extract_nodes.extract_json({**base, "episode_content": '{"user": "Jordan Lee", "service": "FastAPI on Kubernetes", "file": "app/main.py"}'}),
        response_model=ExtractedEntities,
    )
    assert {"Jordan Lee", "FastAPI", "Kubernetes", "app/main.py"} <= {e["name"] for e in as_json["extracted_entities"]}
