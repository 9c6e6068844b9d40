"""bench/reference_llm.py (issue 24, item 1): graphiti's real extraction prompts for a LoCoMo turn
are answered with the observations that cite the turn's messages; every other prompt goes to the
offline rules client; the target-entity rule on small hand-made facts."""

from __future__ import annotations

import json

import pytest
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate
from graphiti_core.prompts.extract_edges import ExtractedEdges
from graphiti_core.prompts.extract_nodes import ExtractedEntities
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction
from graphiti_core.utils.maintenance.node_operations import _build_entity_types_context

from bench._recall_common import load_conversations
from bench.extraction_cost import offline_episodes
from bench.recall_quality import build_corpus
from bench.reference_llm import ReferenceFactsClient, observations_of, target_of
from engram.models.rules_llm import RulesExtractorClient
from tests.conftest import LOCOMO

pytestmark = pytest.mark.skipif(not LOCOMO.exists(), reason=f"LoCoMo data not found at {LOCOMO}")


def cited(conversation: dict, dia_ids: set[str]) -> list[tuple[str, str]]:
    """(speaker, fact) of the observations citing any of ``dia_ids``, read from the raw JSON
    (not through observations_of, so the client's parsing is checked against the file)."""
    out = []
    for by_speaker in conversation["observation"].values():
        for speaker, entries in by_speaker.items():
            for text, ids in entries:
                if set(ids if isinstance(ids, list) else [ids]) & dia_ids:
                    out.append((speaker, " ".join(text.split())))
    return out


@pytest.fixture(scope="module")
def conv26() -> tuple[list[dict], dict, list]:
    conversations = load_conversations(LOCOMO)
    conversation = next(c for c in conversations if c["sample_id"] == "conv-26")
    episodes = offline_episodes(build_corpus(LOCOMO, conversation, 2).events)
    return conversations, conversation, episodes


def combined_prompt(content: str, previous: list[str] = ()) -> list:
    return prompt_library.extract_nodes_and_edges.extract_message({
        "episode_content": content, "previous_episodes": [{"content": p, "timestamp": None} for p in previous],
        "custom_extraction_instructions": "", "entity_types": _build_entity_types_context(None), "edge_types": [],
        "strict_edge_types": False})


async def test_the_combined_prompt_of_a_turn_gets_its_observations_as_facts(conv26) -> None:  # noqa: ANN001
    conversations, conversation, episodes = conv26
    client = ReferenceFactsClient(conversations)
    with_facts = 0
    for i, episode in enumerate(episodes):
        dia_ids = {m.message_id.split(":", 1)[1] for m in episode.messages}
        # the previous turn sits in PREVIOUS MESSAGES: its observations must not come back
        previous = [episodes[i - 1].content] if i else []
        answer = await client.generate_response(combined_prompt(episode.content, previous), CombinedExtraction)
        CombinedExtraction.model_validate(answer)
        expected = cited(conversation, dia_ids)
        assert sorted((e["source_entity_name"], e["fact"]) for e in answer["edges"]) == sorted(expected), episode.content
        names = {e["name"] for e in answer["extracted_entities"]}
        assert all({e["source_entity_name"], e["target_entity_name"]} <= names for e in answer["edges"])
        with_facts += bool(expected)
    assert with_facts >= 10  # sessions 1-2 of conv-26: 14 observations over most turns
    assert client.unmatched_turns == 0 and client.matched_turns == len(episodes)
    assert client.answered["CombinedExtraction"] == len(episodes)
    assert not client.inner.calls  # nothing was delegated


async def test_the_separate_prompts_and_episode_sections(conv26) -> None:  # noqa: ANN001
    conversations, conversation, episodes = conv26
    client = ReferenceFactsClient(conversations)
    episode = next(e for e in episodes if any(m.message_id == "conv-26:D1:3" for m in e.messages))
    expected = cited(conversation, {m.message_id.split(":", 1)[1] for m in episode.messages})
    assert expected
    nodes = await client.generate_response(prompt_library.extract_nodes.extract_message({
        "episode_content": episode.content, "previous_episodes": [], "entity_types": _build_entity_types_context(None),
        "custom_extraction_instructions": ""}), ExtractedEntities)
    names = [n["name"] for n in nodes["extracted_entities"]]
    assert {speaker for speaker, _ in expected} <= set(names)
    edge_context = {"episode_content": episode.content, "previous_episodes": [], "reference_time": "2023-05-08T13:56:00Z",
                    "custom_extraction_instructions": "", "edge_types": [],
                    "nodes": [{"name": n, "entity_types": ["Entity"]} for n in names]}
    edges = await client.generate_response(prompt_library.extract_edges.edge(edge_context), ExtractedEdges)
    assert sorted(e["fact"] for e in edges["edges"]) == sorted(f for _, f in expected)
    # an entity group without the target (the chunked path asks per group): no fact between them
    only_speakers = {**edge_context, "nodes": [{"name": s, "entity_types": ["Entity"]} for s, _ in expected]}
    edges = await client.generate_response(prompt_library.extract_edges.edge(only_speakers), ExtractedEdges)
    assert all(e["source_entity_name"] == e["target_entity_name"] or e["target_entity_name"] in {s for s, _ in expected}
               for e in edges["edges"])
    # [Episode N] sections keep their index; a [CONTEXT EPISODE] is never extracted from
    block = (f"[CONTEXT EPISODE] (timestamp: unknown)\n{episodes[0].content}\n\n"
             f"[Episode 0] (timestamp: unknown)\n{episode.content}")
    answer = await client.generate_response(combined_prompt(block), CombinedExtraction)
    assert sorted(e["fact"] for e in answer["edges"]) == sorted(f for _, f in expected)
    assert all(e["episode_indices"] == [0] for e in answer["edges"])


async def test_other_prompts_go_to_the_rules_client(conv26) -> None:  # noqa: ANN001
    conversations, _, _ = conv26
    client = ReferenceFactsClient(conversations)
    fact = "Caroline attended an LGBTQ support group recently and found the transgender stories inspiring."
    context = {"existing_edges": json.dumps([{"idx": 0, "fact": fact}]), "edge_invalidation_candidates": "[]",
               "new_edge": fact}
    messages = prompt_library.dedupe_edges.resolve_edge(context)
    answer = await client.generate_response(messages, EdgeDuplicate, prompt_name="dedupe_edges.resolve_edge")
    alone = await RulesExtractorClient().generate_response(prompt_library.dedupe_edges.resolve_edge(context), EdgeDuplicate)
    assert answer == alone and answer["duplicate_facts"] == [0]
    assert [c.response_model for c in client.inner.calls] == ["EdgeDuplicate"]
    assert not client.answered


def test_observations_parse_lists_and_malformed_ids() -> None:
    conversation = {"sample_id": "x", "observation": {"session_2_observation": {"Ada": [
        ["Ada adopted a cat called Pixel.", "D2:1"], ["Ada and Bo met in Paris.", ["D2:3", "D2:5"]],
        ["Ada  likes\nRust.", "D2:6; D3:1"], ["", "D2:7"], ["no id", "D"]]}}}
    got = [(o.fact, o.dia_ids) for o in observations_of(conversation)]
    assert got == [("Ada adopted a cat called Pixel.", ("D2:1",)), ("Ada and Bo met in Paris.", ("D2:3", "D2:5")),
                   ("Ada likes Rust.", ("D2:6", "D3:1"))]


def test_the_target_rule() -> None:
    # 1. the longest capitalised run that is not the speaker (nor the sentence's first word, nor a weekday)
    assert target_of("Ada adopted a cat called Pixel Grey last week.", "Ada") == "Pixel Grey"
    assert target_of("Caroline received a necklace from her grandmother in Sweden.", "Caroline") == "Sweden"
    assert target_of("Melanie ran a charity race last Saturday.", "Melanie") == "charity race"
    # 2. else the first determiner phrase after the speaker's name
    assert target_of("Melanie painted a lake sunrise last year.", "Melanie") == "lake sunrise"
    # 3. else the speaker (a self-referencing fact)
    assert target_of("Melanie has been married for 5 years.", "Melanie") == "Melanie"
    assert target_of("Tim's family enjoys Home Alone at Thanksgiving.", "Tim") == "Home Alone"
