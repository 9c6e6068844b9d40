"""The LLMClient: determinism, token accounting, graphiti's own extraction function end to end."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from graphiti_core.cross_encoder.client import CrossEncoderClient
from graphiti_core.driver.driver import GraphDriver
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.nodes import EpisodeType, EpisodicNode
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate
from graphiti_core.prompts.extract_nodes_and_edges import CombinedExtraction
from graphiti_core.prompts.models import Message
from graphiti_core.prompts.summarize_nodes import Summary
from graphiti_core.tracer import NoOpTracer
from graphiti_core.utils.maintenance.combined_extraction import extract_nodes_and_edges

from engram.models.hashing_embedder import HashingEmbedder
from engram.models.rules_llm import CallRecord, RulesExtractorClient, is_safe_entity_name
from tests.engram.models.rules_llm.helpers import CHAT_TURN, CHAT_TYPES, CODING_TURN, CODING_TYPES, REF, combined_messages, resolve_edge_messages


async def test_same_prompt_same_answer() -> None:
    a, b = RulesExtractorClient(), RulesExtractorClient()
    for content in (CODING_TURN, CHAT_TURN):
        first = await a.generate_response(combined_messages(content, CODING_TYPES), response_model=CombinedExtraction)
        again = await a.generate_response(combined_messages(content, CODING_TYPES), response_model=CombinedExtraction)
        other = await b.generate_response(combined_messages(content, CODING_TYPES), response_model=CombinedExtraction)
        assert first == again == other
        assert first["edges"]
    dup = [await c.generate_response(resolve_edge_messages("User switched from requests to httpx.", [], ["User uses requests."]), response_model=EdgeDuplicate) for c in (a, b)]
    assert dup[0] == dup[1] == {"duplicate_facts": [], "contradicted_facts": [0]}


async def test_token_accounting_records_every_call() -> None:
    words = lambda text: len(text.split())  # noqa: E731
    client = RulesExtractorClient(count_tokens=words)
    messages = combined_messages(CHAT_TURN)
    response = await client.generate_response(messages, response_model=CombinedExtraction, prompt_name="extract_nodes_and_edges.extract_message")
    assert len(client.calls) == 1
    record = client.calls[0]
    assert isinstance(record, CallRecord)
    assert record.prompt_name == "extract_nodes_and_edges.extract_message"
    assert record.response_model == "CombinedExtraction"
    # generate_response appended the JSON schema and the language note to the messages it sent
    assert "Respond with a JSON object" in messages[-1].content
    assert record.prompt_tokens == sum(words(m.content) for m in messages)
    import json

    assert record.completion_tokens == words(json.dumps(response, ensure_ascii=False))
    usage = client.token_tracker.get_usage()["extract_nodes_and_edges.extract_message"]
    assert (usage.call_count, usage.total_input_tokens, usage.total_output_tokens) == (1, record.prompt_tokens, record.completion_tokens)


async def test_default_token_counter_is_a_real_tokenizer_or_says_it_estimates() -> None:
    client = RulesExtractorClient()
    await client.generate_response([Message(role="system", content="s"), Message(role="user", content="hello world")], response_model=Summary)
    assert client.token_counting in ("cl100k", "chars/4")
    assert client.calls[0].prompt_tokens > 0 and client.calls[0].response_model == "Summary"


class NoOpCrossEncoder(CrossEncoderClient):
    async def rank(self, query: str, passages: list[str]) -> list[tuple[str, float]]:
        return [(p, 0.0) for p in passages]


class UnusedDriver(GraphDriver):
    """Satisfies GraphitiClients' type check; any use fails the test."""

    provider = None  # type: ignore[assignment]

    def _fail(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("extract_nodes_and_edges must not touch the graph driver")

    execute_query = session = close = delete_all_indexes = build_indices_and_constraints = _fail  # type: ignore[assignment]


async def test_graphiti_extract_nodes_and_edges_end_to_end() -> None:
    llm = RulesExtractorClient()
    clients = GraphitiClients(
        driver=UnusedDriver(), llm_client=llm, embedder=HashingEmbedder(), cross_encoder=NoOpCrossEncoder(), tracer=NoOpTracer()
    )
    episode = EpisodicNode(
        name="turn-1", group_id="engram-test", source=EpisodeType.message, source_description="chat turn",
        content=CHAT_TURN, valid_at=REF,
    )
    nodes, edges, index_map = await extract_nodes_and_edges(clients, episode, previous_episodes=[], entity_types=CHAT_TYPES)
    by_name = {n.name: n for n in nodes}
    assert {"Caroline", "Melanie", "LGBTQ support group", "Sweden", "Google", "painting", "pottery"} <= set(by_name)
    assert "Person" in by_name["Caroline"].labels and "Place" in by_name["Sweden"].labels
    assert all(is_safe_entity_name(n.name) for n in nodes)
    names = {n.uuid: n.name for n in nodes}
    got = {(names[e.source_node_uuid], e.name, names[e.target_node_uuid]): e for e in edges}
    attended = got[("Caroline", "ATTENDED", "LGBTQ support group")]
    assert attended.episodes == [episode.uuid]
    assert attended.valid_at == datetime(2023, 5, 7, tzinfo=timezone.utc)  # from the timestamp batch call
    assert got[("Melanie", "LIVES_IN", "Sweden")].valid_at == datetime(2023, 5, 1, tzinfo=timezone.utc)
    # a fact is its whole sentence, so the sentence's date dates every fact drawn from it
    assert got[("Melanie", "WORKS_AT", "Google")].valid_at == datetime(2023, 5, 1, tzinfo=timezone.utc)
    assert got[("Melanie", "LIKES", "painting")].valid_at is None
    assert set(index_map) == {n.uuid for n in nodes}
    # one combined call plus one timestamp batch; nothing unanswered
    assert [c.response_model for c in llm.calls] == ["CombinedExtraction", "BatchEdgeTimestamps"]
    assert [c.prompt_name for c in llm.calls] == ["extract_nodes_and_edges.extract_message", "extract_edges.extract_timestamps_batch"]
    assert llm.failures == {} and llm.unhandled == {}
