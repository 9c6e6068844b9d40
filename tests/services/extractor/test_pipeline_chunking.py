"""Chunked extraction of large episodes (pipeline.py ``chunked`` mode, seed 002) against a real
FalkorDB: entities per chunk, merged case-insensitively; facts per covering group, every entity
pair examined exactly once; chat turns never split inside a role block."""

from __future__ import annotations

import contextlib
import itertools
from collections import Counter
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from graphiti_core.driver.falkordb_driver import FalkorDriver
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig
from graphiti_core.tracer import NoOpTracer

from engram.models.hashing_embedder import HashingEmbedder
from engram.text.tokens import token_counter
from engram.schemas import Episode, EpisodeMessage
from engram.services.extractor.chunking import ChunkingSettings, covering_chunk_count
from engram.services.extractor.pipeline import PREVIOUS_EPISODE_CHARS, episode_chunks, extract_episode
from tests.services.extractor.test_pipeline import NoOpCrossEncoder, _host_port
from tests.support.llm import RecordingLLMClient

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


@contextlib.asynccontextmanager
async def _fresh_graph(url: str, llm: Any) -> AsyncIterator[tuple[GraphitiClients, Any, str]]:
    """A graph of its own on the test FalkorDB, answered by ``llm``; dropped afterwards."""
    host, port = _host_port(url)
    group_id = f"t_{uuid.uuid4().hex[:12]}"
    driver = FalkorDriver(host=host, port=port, database=group_id)
    if driver._init_task is not None:
        await driver._init_task
    clients = GraphitiClients(driver=driver, llm_client=llm, embedder=HashingEmbedder(64),
                              cross_encoder=NoOpCrossEncoder(), tracer=NoOpTracer())
    try:
        yield clients, llm, group_id
    finally:
        try:
            await driver.client.select_graph(group_id).delete()
        finally:
            await driver.close()


@pytest.fixture
async def graph(falkordb_server) -> AsyncIterator[tuple[GraphitiClients, PairLLM, str]]:
    async with _fresh_graph(falkordb_server.url, PairLLM()) as made:
        yield made


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


# --------------------------------------------------------------------------- one long message
FILLER = ("the weather was mild and we walked along the river for a while. "
          "then we sat down near the old bridge and talked about nothing much.\n\n")
NEEDLE = "Ada works with Quorvex at Lisbon."  # the rules model extracts Quorvex from this sentence


def long_message_turn(chars: int = 50_000) -> str:
    """A chat turn whose first message is ``chars`` characters of sparse prose, numbered so every
    paragraph is distinct, with :data:`NEEDLE` in the middle; then a short reply."""
    paragraphs = [f"part {i}: " + FILLER for i in range(chars // len(FILLER) + 1)]
    paragraphs.insert(len(paragraphs) // 2, NEEDLE + "\n\n")
    return "user (Ada): " + "".join(paragraphs).strip() + "\n\nassistant: noted, thanks."


def test_a_long_sparse_message_is_chunked_with_its_speaker_label() -> None:
    settings, count = ChunkingSettings(), token_counter()
    content = long_message_turn()
    assert len(content) > 50_000 and count(content) > settings.max_unchunked_tokens
    chunks = episode_chunks(episode("g", content), settings)
    assert len(chunks) > 1
    assert all(count(c) <= settings.chunk_token_size for c in chunks)
    message = content.split("\n\nassistant: ")[0]
    pieces = [c for c in chunks if c.startswith("user (Ada): ")]
    assert len(pieces) == len(chunks) or chunks[-1].endswith("assistant: noted, thanks.")
    assert all(c.startswith(("user (Ada): ", "assistant: ")) for c in chunks)  # every piece says who
    assert set(message.split()) <= {w for c in chunks for w in c.split()}  # no word lost
    assert sum(NEEDLE in c for c in chunks) >= 1
    # an ordinary long-but-sparse turn below the bound keeps seed 002's single pass
    ordinary = "user (Ada): " + FILLER * 40
    assert count(ordinary) < settings.max_unchunked_tokens
    assert episode_chunks(episode("g", ordinary), settings) == [ordinary]


# Graphiti's fixed instructions, the entity list and the episode's framing around one chunk: the
# largest prompt measured here was a 2,980-token chunk + ~1.8k tokens. 2,500 leaves room for a
# longer entity list without letting a second chunk's worth of the episode in.
PROMPT_OVERHEAD_TOKENS = 2500


@pytest.fixture
async def rules_graph(falkordb_server) -> AsyncIterator[tuple[GraphitiClients, RecordingLLMClient, str]]:
    async with _fresh_graph(falkordb_server.url, RecordingLLMClient()) as made:
        yield made


async def test_a_50k_character_message_is_extracted_in_bounded_prompts(rules_graph) -> None:
    """Before the bound, this sparse 50k-character message went whole into ONE combined prompt
    (~12k tokens; a 1 MB message would be ~250k)."""
    clients, llm, group_id = rules_graph
    settings, count = ChunkingSettings(), token_counter()
    ep = episode(group_id, long_message_turn())
    chunks = episode_chunks(ep, settings)

    result = await extract_episode(clients, ep, custom_instructions="", previous_window=0, chunking=settings)

    assert result.mode == "chunked" and result.chunks == len(chunks) > 1
    sizes = [count("\n".join(contents)) for _, contents in llm.prompts]
    assert max(sizes) <= settings.chunk_token_size + PROMPT_OVERHEAD_TOKENS, max(sizes)
    assert not any(ep.content in "\n".join(contents) for _, contents in llm.prompts)
    # calls: one node extraction per chunk, at most one resolution and (a handful of entities
    # per chunk, <= max_nodes_per_chunk) one edge call per chunk, plus per-fact resolution
    by_name = Counter(name for name, _ in llm.prompts)
    assert by_name["extract_nodes.extract_message"] == len(chunks)
    assert by_name["dedupe_nodes.nodes"] <= len(chunks)
    assert by_name["extract_edges.edge"] == result.edge_groups <= len(chunks)
    assert len(llm.prompts) <= 3 * len(chunks) + 2 * len(result.resolved_edges)
    # the middle of the message reached the graph
    assert "Quorvex" in {n.name for n in result.nodes}
    assert any("Quorvex" in e.fact for e in result.new_edges)
    records, _, _ = await clients.driver.execute_query(
        "MATCH (a:Entity)-[e:RELATES_TO]->(b:Entity) WHERE a.name = 'Quorvex' OR b.name = 'Quorvex' RETURN e.fact AS f")
    assert records and all("Quorvex" in r["f"] for r in records)


async def test_the_next_turns_read_only_the_tail_of_a_long_previous_message(rules_graph) -> None:
    """The previous-episodes window is context in every prompt of the next turns: before the cut,
    the 50k-character message went whole (~12k tokens) into each of them."""
    clients, llm, group_id = rules_graph
    settings, count = ChunkingSettings(), token_counter()
    await extract_episode(clients, episode(group_id, long_message_turn()), custom_instructions="",
                          previous_window=0, chunking=settings)
    llm.prompts.clear()
    later = episode(group_id, "user (Ada): the Quorvex rollout starts on Monday.\n\nassistant: noted.")
    later = later.model_copy(update={"episode_id": str(uuid.uuid4()), "turn_id": "s1:m3",
                                     "reference_time": T1 + timedelta(minutes=5)})
    await extract_episode(clients, later, custom_instructions="", previous_window=2, chunking=settings)
    sizes = [count("\n".join(contents)) for _, contents in llm.prompts]
    assert llm.prompts and max(sizes) <= PREVIOUS_EPISODE_CHARS // 2 + PROMPT_OVERHEAD_TOKENS, max(sizes)


async def test_an_unnamed_speakers_fact_about_one_thing_reaches_the_graph(rules_graph) -> None:
    """Speaker roles are no entities (issue 24 item 6); a fact an unnamed user states about one
    thing is stored as that entity's own fact (a self-edge) through graphiti's pipeline."""
    clients, _, group_id = rules_graph
    content = "user: Decision: pin every direct dependency in pyproject.toml so CI matches laptops.\n\nassistant: Done."
    result = await extract_episode(clients, episode(group_id, content), custom_instructions="", previous_window=0,
                                   chunking=ChunkingSettings())
    assert "pyproject.toml" in {n.name for n in result.nodes}
    assert not {n.name.lower() for n in result.nodes} & {"user", "assistant"}
    records, _, _ = await clients.driver.execute_query(
        "MATCH (a:Entity)-[e:RELATES_TO]->(b:Entity) WHERE e.fact CONTAINS 'pin every direct dependency' "
        "RETURN a.name AS a, b.name AS b")
    assert [(r["a"], r["b"]) for r in records] == [("pyproject.toml", "pyproject.toml")]
