"""Chunked extraction of large episodes (pipeline.py ``chunked`` mode, seed 002) against a real
FalkorDB: entities per chunk, merged case-insensitively; facts per covering group, every entity
pair examined exactly once; chat turns never split inside a role block."""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pytest
from graphiti_core.driver.falkordb_driver import FalkorDriver
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig
from graphiti_core.tracer import NoOpTracer

from engram.models.hashing_embedder import HashingEmbedder
from engram.tokens import token_counter
from schemas import Episode, EpisodeMessage
from services.extractor.chunking import ChunkingSettings, covering_chunk_count
from services.extractor.pipeline import episode_chunks, extract_episode
from tests.services.extractor.test_pipeline import NoOpCrossEncoder, _host_port

T1 = datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc)
INSTRUCTIONS = "ENGRAM-CHUNK-INSTRUCTIONS: keep systems and hosts."
NAME = re.compile(r"\b[A-Z][a-z]+\d+\b")  # the test world's entities: Kafka17, Host05, ...
SMALL = ChunkingSettings(chunk_token_size=120, chunk_overlap_tokens=30, chunk_min_tokens=100,
                         density_threshold=0.1, max_nodes_per_chunk=6)
SYSTEMS = ["Kafka", "Redis", "Nats", "Postgres", "Falkor", "Neo", "Mongo"]


def dense_turn(entities: int = 14) -> str:
    """A chat turn of short role blocks, each naming three of ``entities`` systems."""
    names = [f"{SYSTEMS[i % len(SYSTEMS)]}{10 + i}" for i in range(entities)]
    blocks = []
    for i in range(entities):
        a, b, c = names[i], names[(i + 1) % entities], names[(i + 5) % entities]
        role = "user" if i % 2 == 0 else "assistant"
        blocks.append(f"{role}: we compared {a} with {b} and {c} on the staging cluster.\nIt held up.")
    return "\n\n".join(blocks)


@dataclass
class PairLLM(LLMClient):
    """Entities = capitalised names with digits in the CURRENT MESSAGE; facts = every pair of the
    given ENTITIES plus one to an unknown name (which graphiti would materialise)."""

    calls: list[tuple[str, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        LLMClient.__init__(self, LLMConfig(model="pairs", small_model="pairs"), cache=False)

    def __hash__(self) -> int:
        return id(self)

    def prompts(self, name: str) -> list[str]:
        return [text for n, text in self.calls if n == name]

    async def _generate_response(self, messages, response_model=None, max_tokens=0, model_size=None, **_: Any):
        name = response_model.__name__ if response_model is not None else "text"
        text = "\n".join(m.content for m in messages)
        self.calls.append((name, text))
        if name == "ExtractedEntities":
            current = re.search(r"<CURRENT MESSAGE>\s*(.*?)\s*</CURRENT MESSAGE>", text, re.S).group(1)
            found = list(dict.fromkeys(NAME.findall(current)))
            if found:
                found.append(found[0].upper())  # same entity in other case: merged away
            return {"extracted_entities": [{"name": n, "entity_type_id": 0} for n in found]}
        if name == "ExtractedEdges":
            listed = [n["name"] for n in json.loads(re.search(r"<ENTITIES>\s*(.*?)\s*</ENTITIES>", text, re.S).group(1))]
            edges = [
                {"source_entity_name": a, "target_entity_name": b, "relation_type": "COMPARED_WITH",
                 "fact": f"{a} was compared with {b}.", "valid_at": T1.isoformat(), "invalid_at": None}
                for a, b in itertools.combinations(listed, 2)
            ]
            edges.append({"source_entity_name": listed[0], "target_entity_name": "Ghost99", "relation_type": "HAUNTS",
                          "fact": f"Ghost99 haunts {listed[0]}.", "valid_at": T1.isoformat(), "invalid_at": None})
            return {"edges": edges}
        if name == "CombinedExtraction":
            return {"extracted_entities": [], "edges": []}
        if name == "NodeResolutions":
            return {"entity_resolutions": []}
        if name == "EdgeDuplicate":
            return {"duplicate_facts": [], "contradicted_facts": []}
        if name == "EdgeTimestamps":
            return {"valid_at": None, "invalid_at": None}
        raise AssertionError(f"unexpected LLM call {name}")


@pytest.fixture
async def graph(falkordb_server) -> AsyncIterator[tuple[GraphitiClients, PairLLM, str]]:
    host, port = _host_port(falkordb_server.url)
    group_id = f"t_{uuid.uuid4().hex[:12]}"
    driver = FalkorDriver(host=host, port=port, database=group_id)
    if driver._init_task is not None:
        await driver._init_task
    llm = PairLLM()
    clients = GraphitiClients(driver=driver, llm_client=llm, embedder=HashingEmbedder(64),
                              cross_encoder=NoOpCrossEncoder(), tracer=NoOpTracer())
    yield clients, llm, group_id
    try:
        await driver.client.select_graph(group_id).delete()
    finally:
        await driver.close()


def episode(group_id: str, content: str, kind: str = "chat_turn") -> Episode:
    return Episode(
        episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"chunk/{group_id}/{len(content)}")),
        group_id=group_id, scope="session", turn_id="s1:m1", session_id="s1", reference_time=T1,
        content=content, kind=kind,  # type: ignore[arg-type]
        messages=[EpisodeMessage(message_id="m1", role="user", timestamp=T1)],
    )


# --------------------------------------------------------------------------- chunk decisions
def test_short_or_sparse_episodes_are_not_chunked() -> None:
    short = "user: we compared Kafka10 with Redis11.\n\nassistant: Redis11 wins."
    assert episode_chunks(episode("g", short), SMALL) == [short]
    prose = "\n\n".join(["user: " + "the cluster was slow today and we looked at it for a while. " * 8] * 4)
    assert episode_chunks(episode("g", prose), SMALL) == [prose]  # large but sparse


def test_chat_turn_chunks_are_whole_role_blocks_in_order() -> None:
    content = dense_turn()
    blocks = content.split("\n\n")
    chunks = episode_chunks(episode("g", content), SMALL)
    assert len(chunks) > 1
    count = token_counter()
    seen: list[str] = []
    for chunk in chunks:
        parts = chunk.split("\n\n")
        assert all(p in blocks for p in parts), "a role block was split"
        assert count(chunk) <= SMALL.chunk_token_size or len(parts) == 1
        seen.extend(p for p in parts if not seen or p not in seen[-len(parts):])
    assert list(dict.fromkeys(seen)) == blocks  # every block, in order (overlap repeats whole blocks)


def test_non_chat_json_episode_is_chunked_at_elements() -> None:
    records = [{"host": f"Host{i:02d}", "service": f"Kafka{i}", "owner": f"Team{i % 3}"} for i in range(40)]
    content = json.dumps(records)
    chunks = episode_chunks(episode("g", content, kind="repo_state"), SMALL)
    assert len(chunks) > 1
    assert [r for c in chunks for r in json.loads(c)] == records


# --------------------------------------------------------------------------- chunked extraction
async def test_large_episode_extracts_per_chunk_and_examines_every_pair_once(graph) -> None:
    clients, llm, group_id = graph
    ep = episode(group_id, dense_turn(14))
    chunks = episode_chunks(ep, SMALL)

    result = await extract_episode(clients, ep, custom_instructions=INSTRUCTIONS, previous_window=0, chunking=SMALL)

    assert result.mode == "chunked" and result.chunks == len(chunks) > 1
    # entity extraction saw chunks, not the whole turn, each with the instructions
    node_prompts = llm.prompts("ExtractedEntities")
    assert len(node_prompts) == len(chunks)
    assert all(INSTRUCTIONS in p and ep.content not in p for p in node_prompts)
    # merged case-insensitively: 14 entities, no upper-case twins
    names = sorted(n.name for n in result.nodes)
    assert len(names) == 14 and all(not n.isupper() for n in names)
    # facts: covering groups of <= 6 entities, each seeing the full episode, every pair kept once
    edge_prompts = llm.prompts("ExtractedEdges")
    assert len(edge_prompts) == result.edge_groups == covering_chunk_count(14, SMALL.max_nodes_per_chunk)
    assert all(INSTRUCTIONS in p and ep.content in p for p in edge_prompts)
    listed = [json.loads(re.search(r"<ENTITIES>\s*(.*?)\s*</ENTITIES>", p, re.S).group(1)) for p in edge_prompts]
    assert max(len(x) for x in listed) <= SMALL.max_nodes_per_chunk
    by_uuid = {n.uuid: n.name for n in result.nodes}
    pairs = [frozenset((by_uuid[e.source_node_uuid], by_uuid[e.target_node_uuid])) for e in result.new_edges]
    assert len(pairs) == len(set(pairs)) == 14 * 13 // 2
    assert not any("Ghost99" in e.fact for e in result.new_edges)  # outside every group: dropped
    records, _, _ = await clients.driver.execute_query("MATCH ()-[e:RELATES_TO]->() RETURN count(e) AS c")
    assert records[0]["c"] == 91


async def test_small_episode_with_chunking_on_keeps_the_single_pass(graph) -> None:
    clients, llm, group_id = graph
    ep = episode(group_id, "user: we compared Kafka10 with Redis11.")
    result = await extract_episode(clients, ep, custom_instructions="", previous_window=0, chunking=SMALL)
    assert result.mode == "combined" and result.chunks == 1 and result.edge_groups == 0
    assert [name for name, _ in llm.calls] == ["CombinedExtraction"]
