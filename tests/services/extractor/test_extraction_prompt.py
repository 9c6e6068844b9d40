"""engram's combined extraction prompt (services/extractor/extraction_prompt.py): its token budget,
the pieces a model needs, the lean schema, and that the rules model answers it as it answered
graphiti's prompt."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction as GraphitiCombinedExtraction
from graphiti_core.utils.maintenance.node_operations import _build_entity_types_context

from engram.models.rules_llm import RulesExtractorClient
from engram.text.tokens import token_counter
from engram.services.extractor.extraction_prompt import (
    FIXED_TOKEN_BUDGET,
    INSTRUCTIONS,
    PROMPT_LIBRARY,
    PROMPT_NAME,
    SYSTEM,
    LeanCombinedExtraction,
    LeanSchemaLLMClient,
    TurnContext,
    asked_in,
    build_prompt,
    engram_clients,
    is_engram_prompt,
)
from engram.services.extractor.preprocessing import ExtractionSettings, validate_at_startup
from engram.services.extractor.pipeline import KNOWN_NAMES_BY_WORDS
from tests.engram.models.rules_llm.helpers import CHAT_TURN, CHAT_TYPES, REF

SCHEMA_NOTE = "\n\nRespond with a JSON object in the following format:\n\n"  # what graphiti's client appends
# A conversation turn of LoCoMo's size (~80 tokens; LoCoMo itself is never stored in the project).
TURN = ("Caroline: I went to a LGBTQ support group yesterday and it was so powerful. The stories people shared "
        "about their transitions really inspired me to keep going with my counseling plans.\n"
        "Melanie: Wow, that's cool, Caroline! I'm so glad it helped. I took the kids to the museum last weekend "
        "and we spent hours at the dinosaur exhibit.")
PREVIOUS = [{"content": "Caroline: Hey Mel! Good to see you! How have you been?\nMelanie: Hey Caroline! I'm "
             "swamped with the kids and work. What's up with you? Anything new?", "timestamp": REF.isoformat()}] * 2


def context(content: str = TURN, previous: list[dict] | None = None, custom: str = "",
            types: Any = None, edge_types: list | None = None) -> dict[str, Any]:
    return {"episode_content": content, "previous_episodes": PREVIOUS if previous is None else previous,
            "custom_extraction_instructions": custom, "entity_types": _build_entity_types_context(types),
            "edge_types": edge_types or [], "strict_edge_types": False}


def call_tokens(ctx: dict[str, Any]) -> int:
    """cl100k tokens of the call as the rules model (and accounting) count it: messages + schema."""
    messages = build_prompt(ctx).as_messages()
    count = token_counter()
    schema = json.dumps(LeanCombinedExtraction.model_json_schema())
    return sum(count(m.content) for m in messages) + count(SCHEMA_NOTE + schema)


def test_fixed_part_stays_under_its_token_budget() -> None:
    assert call_tokens(context(content="", previous=[])) <= FIXED_TOKEN_BUDGET


def test_a_locomo_sized_call_with_the_default_template_stays_under_the_budget_for_0_15x() -> None:
    # 0.15x of upstream graphiti's ~12,250 tokens per LoCoMo turn is ~1,840 for everything a turn
    # costs (bench/extraction_cost.py); the extraction call must leave room for the rare small calls.
    template = validate_at_startup(ExtractionSettings()) or ""
    assert template and call_tokens(context(custom=template)) <= 1_500
    graphiti = prompt_library.extract_nodes_and_edges.extract_message(context(custom=template))
    before = sum(token_counter()(m.content) for m in graphiti) + token_counter()(
        SCHEMA_NOTE + json.dumps(GraphitiCombinedExtraction.model_json_schema()))
    assert call_tokens(context(custom=template)) < 0.6 * before


def test_the_prompt_carries_what_a_model_needs() -> None:
    messages = build_prompt(context(custom="KEEP-VERSIONS")).as_messages()
    assert [m.role for m in messages] == ["system", "user"] and messages[0].content.startswith(SYSTEM)
    user = messages[1].content
    for piece in (
        "CURRENT MESSAGES", "PREVIOUS MESSAGES",  # what to extract from, and context only
        "speaker", "fullest name",  # speaker attribution
        "actor", "source", "target", "extracted_entities",  # edges between extracted entities
        "no pronouns", "makes sense alone", "numbers, dates",  # self-contained facts with details
        "Not entities", "vague abstractions", "Skip content-free",  # no junk
        "changed or ended", "new state",  # changes, for invalidation
        "hedges", "SCREAMING_SNAKE_CASE", "language",
    ):
        assert piece in user, piece
    # the owner's instructions, after the rules, win on conflict; then the blocks the rules model reads
    assert user.index(INSTRUCTIONS) < user.index("<CUSTOM INSTRUCTIONS>\nKEEP-VERSIONS\n</CUSTOM INSTRUCTIONS>")
    assert "win over the rules above" in user
    assert user.index("</CUSTOM INSTRUCTIONS>") < user.index("<PREVIOUS MESSAGES>") < user.index("<CURRENT MESSAGES>")
    assert f"<CURRENT MESSAGES>\n{TURN}\n</CURRENT MESSAGES>" in user
    assert json.loads(user.split("<PREVIOUS MESSAGES>\n")[1].split("\n</PREVIOUS MESSAGES>")[0]) == [
        {"content": p["content"]} for p in PREVIOUS]
    # no section for empty custom instructions, no entity-type list for the one default type
    bare = build_prompt(context()).as_messages()[1].content
    assert "CUSTOM INSTRUCTIONS" not in bare and "ENTITY TYPES" not in bare and "entity_type_id" not in bare


def test_custom_entity_or_edge_types_get_graphitis_prompt() -> None:
    typed = build_prompt(context(types=CHAT_TYPES)).as_messages()
    edged = build_prompt(context(edge_types=[{"fact_type_name": "WORKS_AT", "fact_type_signatures": [],
                                              "fact_type_description": "x"}])).as_messages()
    for messages in (typed, edged):
        assert not is_engram_prompt(messages) and "<ENTITY TYPES>" in messages[1].content
    assert is_engram_prompt(build_prompt(context()).as_messages())


def test_the_lean_schema_has_no_defs_titles_descriptions_or_unused_fields() -> None:
    schema = LeanCombinedExtraction.model_json_schema()
    text = json.dumps(schema)
    for absent in ("$defs", "$ref", "title", "description", "episode_indices", "entity_type_id"):
        assert absent not in text, absent
    assert LeanCombinedExtraction.__name__ == "CombinedExtraction"  # the rules model answers by this name
    edge = schema["properties"]["edges"]["items"]
    assert set(edge["required"]) == {"source_entity_name", "target_entity_name", "relation_type", "fact"}
    # what the turn context asks is optional (a model may leave it out) and written compactly
    assert edge["properties"]["valid_at"] == {"type": ["string", "null"]}
    assert edge["properties"]["restates"] == {"type": ["integer", "null"]}
    assert edge["properties"]["replaces"] == {"items": {"type": "integer"}, "type": "array"}
    assert "anyOf" not in text and "default" not in text
    assert token_counter()(text) < 210


class Recording(RulesExtractorClient):
    def __init__(self, answer: dict | None = None) -> None:
        super().__init__()
        self.asked: list[tuple[str | None, Any]] = []
        self.answer = answer

    async def generate_response(self, messages, response_model=None, max_tokens=None, model_size=None,  # type: ignore[override]
                                group_id=None, prompt_name=None, **kwargs):  # noqa: ANN001, ANN003
        self.asked.append((prompt_name, response_model))
        if self.answer is not None:
            return dict(self.answer)
        return await super().generate_response(messages, response_model, prompt_name=prompt_name)


async def test_lean_client_asks_with_the_lean_schema_and_fills_graphitis_defaults() -> None:
    inner = Recording({"extracted_entities": [{"name": "Caroline"}, {"name": "LGBTQ support group"}],
                       "edges": [{"source_entity_name": "Caroline", "target_entity_name": "LGBTQ support group",
                                  "relation_type": "ATTENDED", "fact": "Caroline went to a LGBTQ support group."}]})
    client = LeanSchemaLLMClient(inner)
    answer = await client.generate_response(build_prompt(context()).as_messages(), GraphitiCombinedExtraction,
                                            prompt_name=PROMPT_NAME)
    assert inner.asked == [(PROMPT_NAME, LeanCombinedExtraction)]
    parsed = GraphitiCombinedExtraction(**answer)  # what graphiti does with it
    assert [e.entity_type_id for e in parsed.extracted_entities] == [0, 0] and parsed.edges[0].episode_indices == [0]
    # graphiti's own prompt (custom types) and every other prompt keep their response model
    await client.generate_response(build_prompt(context(types=CHAT_TYPES)).as_messages(), GraphitiCombinedExtraction,
                                   prompt_name=PROMPT_NAME)
    await client.generate_response(build_prompt(context()).as_messages(), GraphitiCombinedExtraction,
                                   prompt_name="extract_edges.edge")
    assert [m for _, m in inner.asked[1:]] == [GraphitiCombinedExtraction, GraphitiCombinedExtraction]


@pytest.mark.parametrize("turn", [CHAT_TURN, TURN])
async def test_the_rules_model_answers_engrams_prompt_as_it_answered_graphitis(turn: str) -> None:
    template = validate_at_startup(ExtractionSettings()) or ""
    ctx = context(content=turn, custom=template)
    rules = RulesExtractorClient()
    before = await rules.generate_response(prompt_library.extract_nodes_and_edges.extract_message(ctx),
                                           GraphitiCombinedExtraction, prompt_name=PROMPT_NAME)
    after = await LeanSchemaLLMClient(rules).generate_response(build_prompt(ctx).as_messages(),
                                                               GraphitiCombinedExtraction, prompt_name=PROMPT_NAME)
    assert after["edges"], "the turn has facts"
    assert after["extracted_entities"] == before["extracted_entities"]
    graphitis = ("source_entity_name", "target_entity_name", "relation_type", "fact")
    assert [{k: e[k] for k in graphitis} for e in after["edges"]] == [{k: e[k] for k in graphitis} for e in before["edges"]]
    # nothing more was asked, so nothing more was answered (the lean schema's defaults)
    assert all(e["valid_at"] is None and e["restates"] is None and e["replaces"] == [] for e in after["edges"])
    assert rules.calls[1].prompt_tokens < 0.6 * rules.calls[0].prompt_tokens


def test_engram_clients_route_only_the_combined_prompt() -> None:
    from graphiti_core.graphiti_types import GraphitiClients
    from graphiti_core.prompts.lib import default_chat_prompt_library, get_prompt_builder
    from graphiti_core.tracer import NoOpTracer

    from engram.models.hashing_embedder import HashingEmbedder
    from engram.services.extractor.app import NoRerank

    clients = GraphitiClients.model_construct(driver=None, llm_client=RulesExtractorClient(), embedder=HashingEmbedder(8),
                                              cross_encoder=NoRerank(), tracer=NoOpTracer())
    routed = engram_clients(clients)
    assert routed.prompt_library is PROMPT_LIBRARY and isinstance(routed.llm_client, LeanSchemaLLMClient)
    assert clients.prompt_library is None  # the other stages keep graphiti's legacy path
    assert is_engram_prompt(get_prompt_builder(PROMPT_LIBRARY, PROMPT_NAME)(context()).as_messages())
    timestamps = {"facts": [{"fact": "x", "reference_time": REF.isoformat()}]}
    ours = get_prompt_builder(PROMPT_LIBRARY, "extract_edges.extract_timestamps_batch")(timestamps).as_messages()
    theirs = get_prompt_builder(default_chat_prompt_library, "extract_edges.extract_timestamps_batch")(timestamps)
    assert [m.content for m in ours] == [m.content for m in theirs.as_messages()]
    legacy = prompt_library.extract_edges.extract_timestamps_batch(timestamps)
    assert [m.content for m in ours] == [m.content for m in legacy]


KNOWN = ("Caroline attends an LGBTQ support group.", "Melanie took the kids to the beach.")


def test_the_turn_context_asks_dates_and_relations_to_known_facts_only_when_given() -> None:
    bare = build_prompt(context()).as_messages()
    assert "REFERENCE TIME" not in bare[1].content and "KNOWN FACTS" not in bare[1].content
    assert asked_in(bare) == (False, [], [])
    told = build_prompt(context(), TurnContext(reference_time=REF)).as_messages()
    user = told[1].content
    assert f"<REFERENCE TIME>\n{REF.isoformat()}\n</REFERENCE TIME>" in user and "valid_at / invalid_at" in user
    assert "KNOWN FACTS" not in user and asked_in(told) == (True, [], [])
    full = build_prompt(context(), TurnContext(reference_time=REF, known_facts=KNOWN)).as_messages()
    user = full[1].content
    assert json.loads(user.split("<KNOWN FACTS>\n")[1].split("\n</KNOWN FACTS>")[0]) == [
        {"id": 0, "fact": KNOWN[0]}, {"id": 1, "fact": KNOWN[1]}]
    assert "restates" in user and "replaces" in user
    # the blocks sit between the context and the turn; the rules say what to do with them
    assert user.index("</PREVIOUS MESSAGES>") < user.index("<KNOWN FACTS>") < user.index("<CURRENT MESSAGES>")
    assert asked_in(full) == (True, list(KNOWN), [])
    # graphiti's own prompt (custom types) gets none of it
    assert asked_in(build_prompt(context(types=CHAT_TYPES), TurnContext(REF, KNOWN)).as_messages()) == (False, [], [])


def test_a_call_with_ten_known_facts_stays_within_0_15x_of_upstream() -> None:
    template = validate_at_startup(ExtractionSettings()) or ""
    known = tuple(f"Caroline told Melanie about the support group meeting number {i} in May 2023." for i in range(10))
    # the facts' entities and as many more as the turn's words may add (pipeline.KNOWN_NAMES_BY_WORDS)
    names = ("Caroline", "Melanie", *(f"support group {i}" for i in range(KNOWN_NAMES_BY_WORDS)))
    turn = TurnContext(reference_time=REF, known_facts=known, known_entities=names)
    messages = build_prompt(context(custom=template), turn).as_messages()
    count = token_counter()
    tokens = sum(count(m.content) for m in messages) + count(SCHEMA_NOTE + json.dumps(LeanCombinedExtraction.model_json_schema()))
    # upstream graphiti: ~12,250 tokens per LoCoMo turn; 0.15x is ~1,840 for the turn's calls
    # the dates and known-fact rules, the reference time, ten ~17-token facts with their ids and
    # eight entity names (~500 tokens in all)
    assert tokens <= 1_840 and tokens - call_tokens(context(custom=template)) < 510


async def test_the_rules_model_dates_facts_and_names_the_known_facts_they_replace() -> None:
    turn = "user (Ada): We switched the billing service to SQLite yesterday."
    known = ("The billing service uses Postgres 15.", "Ada lives in Lisbon.")
    messages = build_prompt(context(content=turn, previous=[]), TurnContext(reference_time=REF, known_facts=known))
    answer = await LeanSchemaLLMClient(RulesExtractorClient()).generate_response(
        messages.as_messages(), GraphitiCombinedExtraction, prompt_name=PROMPT_NAME)
    switched = [e for e in answer["edges"] if "SQLite" in e["fact"]]
    assert switched and all(e["replaces"] == [0] and e["restates"] is None for e in switched)
    assert all(e["valid_at"].startswith((REF.date() - timedelta(days=1)).isoformat()) for e in switched)
    # the same fact told again restates the known one and replaces nothing
    again = build_prompt(context(content="user (Ada): The billing service uses Postgres 15.", previous=[]),
                         TurnContext(reference_time=REF, known_facts=known))
    answer = await LeanSchemaLLMClient(RulesExtractorClient()).generate_response(
        again.as_messages(), GraphitiCombinedExtraction, prompt_name=PROMPT_NAME)
    same = [e for e in answer["edges"] if "Postgres" in e["fact"]]
    assert same and all(e["restates"] == 0 and e["replaces"] == [] for e in same)


def test_known_entities_are_listed_with_a_rule_to_name_them_exactly() -> None:
    from engram.services.extractor.extraction_prompt import KNOWN_NAMES

    bare = build_prompt(context(), TurnContext(reference_time=REF, known_facts=KNOWN)).as_messages()
    assert "KNOWN ENTITIES" not in bare[1].content and asked_in(bare).known_entities == []
    turn = TurnContext(reference_time=REF, known_facts=KNOWN, known_entities=("Caroline", "LGBTQ support group"))
    messages = build_prompt(context(), turn).as_messages()
    user = messages[1].content
    # the rule sits with the entity rules, the block with the known facts
    assert user.index(KNOWN_NAMES) < user.index("Facts:") and user.index("<KNOWN ENTITIES>") < user.index("<KNOWN FACTS>")
    assert asked_in(messages).known_entities == ["Caroline", "LGBTQ support group"]


async def test_the_rules_model_names_a_known_entity_as_the_graph_does() -> None:
    turn = TurnContext(reference_time=REF, known_facts=("Ada's cat loves the garden.",),
                       known_entities=("Ada", "Ada's cat", "Garden"))
    messages = build_prompt(context(content="user (Ada): My cats love the garden.", previous=[]), turn)
    answer = await LeanSchemaLLMClient(RulesExtractorClient()).generate_response(
        messages.as_messages(), GraphitiCombinedExtraction, prompt_name=PROMPT_NAME)
    names = [e["name"] for e in answer["extracted_entities"]]
    # resolve_node's rules (the node dedupe answer): "Ada's cats" is the known "Ada's cat", "garden" "Garden"
    assert "Ada's cat" in names and "Garden" in names and "Ada's cats" not in names and "garden" not in names
    ends = {n for e in answer["edges"] for n in (e["source_entity_name"], e["target_entity_name"])}
    assert ends <= set(names) and "Ada's cat" in ends
