"""Entity candidates: stopword-only names, redaction placeholders, random text never yields unsafe names."""

from __future__ import annotations

import pytest
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.extract_nodes import ExtractedEntities
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction
from graphiti_core.utils.maintenance.node_operations import _build_entity_types_context
from hypothesis import HealthCheck, given, settings, strategies as st

from engram.models.rules_llm import RulesExtractorClient, STOPWORDS, is_safe_entity_name
from engram.models.rules_llm.entities import _category_from_labels, _type_id
from tests.engram.models.rules_llm.helpers import CODING_TYPES, combined_messages


async def test_stopword_only_names_are_never_extracted() -> None:
    content = (
        "user: It is what it is. This is it. The end. Is it? We did. I am. They were. "
        "That Is The One. `It` and `This`. THE IT IS.\n\nassistant: It works. Those are here. You and I."
    )
    client = RulesExtractorClient()
    response = await client.generate_response(combined_messages(content), response_model=CombinedExtraction)
    assert {e["name"] for e in response["extracted_entities"]} == set()  # speaker roles are never entities
    entities = await client.generate_response(
        prompt_library.extract_nodes.extract_message(
            {"episode_content": content, "previous_episodes": [], "custom_extraction_instructions": "",
             "entity_types": _build_entity_types_context(None), "source_description": ""}
        ),
        response_model=ExtractedEntities,
    )
    assert {e["name"] for e in entities["extracted_entities"]} == set()


CASED_STOPWORDS = sorted(STOPWORDS) + [w.capitalize() for w in sorted(STOPWORDS)] + [w.upper() for w in sorted(STOPWORDS)]


VOCAB = CASED_STOPWORDS + (
    "Caroline Melanie Sweden Google src/app.py pyproject.toml pytest `pip install httpx` pydantic==2.14 "
    "ModuleNotFoundError OSError: [Errno 98] Traceback went to loves uses moved to works at my dad "
    "8 May 2023 yesterday ``` `x` LGBTQ support group"
).split() + [".", ",", "!", "?", ":", ";", "\n", "\n\n", "user:", "assistant (Bob):", "Caroline:", "'", '"', "(", ")", "-"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.sampled_from(VOCAB), max_size=80), st.text(max_size=60))
def test_random_text_never_yields_unsafe_names(words: list[str], noise: str) -> None:
    client = RulesExtractorClient()
    content = " ".join(words) + " " + noise
    response = client.respond(combined_messages(content), CombinedExtraction)
    CombinedExtraction.model_validate(response)
    names = [e["name"] for e in response["extracted_entities"]]
    assert len(names) == len({n.lower() for n in names})
    for name in names:
        assert is_safe_entity_name(name), name
        assert name.strip().lower() not in STOPWORDS
    for edge in response["edges"]:
        assert edge["source_entity_name"] in names and edge["target_entity_name"] in names
        assert edge["source_entity_name"] != edge["target_entity_name"]
        assert 0 < len(edge["fact"]) <= 300
        assert edge["relation_type"] == edge["relation_type"].upper()
    assert client.failures == {}


async def test_redaction_placeholders_never_become_entities() -> None:
    turn = ("user (Ada): Deploy it to staging with DATABASE_URL=postgres://app:[REDACTED:url_password]@db:5432/x "
            "and the key [REDACTED:openai_key] please.\n\nassistant: Deployed to staging with Terraform.")
    response = await RulesExtractorClient().generate_response(
        combined_messages(turn, CODING_TYPES), response_model=CombinedExtraction,
        prompt_name="extract_nodes_and_edges.extract_message",
    )
    names = [e["name"] for e in response["extracted_entities"]]
    assert names, "nothing extracted"
    assert not [n for n in names if "REDACTED" in n.upper()], names


TYPES = [{"entity_type_id": 0, "entity_type_name": "Entity"}, {"entity_type_id": 1, "entity_type_name": "Tool"},
         {"entity_type_id": 2, "entity_type_name": "Place"}, {"entity_type_id": 3, "entity_type_name": "Location"}]


@pytest.mark.parametrize(
    ("category", "type_id"),
    [("tool", 1), ("library", 1), ("place", 2), ("person", 0), ("version", 0), ("thing", 0)],
)
def test_type_id_is_the_first_custom_type_named_for_the_category(category: str, type_id: int) -> None:
    # libraries fall back from Concept to Tool; no Person type: the default Entity
    assert _type_id(category, TYPES) == type_id


@pytest.mark.parametrize(
    ("name", "labels", "category"),
    [("Caroline", ["Entity", "Person"], "person"), ("8 May 2023", ["Entity"], "date"), ("pytest", ["Entity"], "tool"),
     ("src/app.py", ["Entity", "File"], "file"), ("Boston", ["Entity"], "thing")],
)
def test_category_of_a_given_name(name: str, labels: list[str], category: str) -> None:
    assert _category_from_labels(name, labels) == category
