"""Embedding calls per extracted turn (issue 25, item 5): everything one turn embeds -- the
entity names graphiti's dedupe search and node embeddings need, the facts its edge search and
resolution need, the turn's own text for recall -- goes to the embedder in ONE call.

Real parts only: the offline rules model, the hashing embedder counted by the bench's
CountingEmbedder (every call and text that reaches the model), graphiti-core's stages over a real
FalkorDB (session fixture). Before the BatchingEmbedder a turn with facts made 5 calls (names
twice, facts twice, the turn) and ~7 texts."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from graphiti_core.driver.falkordb_driver import FalkorDriver
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.tracer import NoOpTracer

from bench.extraction_embeddings import CountingEmbedder
from engram.models.embedding_cache import BatchingEmbedder
from engram.models.hashing_embedder import HashingEmbedder, hash_embed
from engram.models.rules_llm import RulesExtractorClient
from engram.schemas import Episode, EpisodeMessage
from engram.services.extractor.app import NoRerank
from engram.services.extractor.chunking import ChunkingSettings
from engram.services.extractor.pipeline import EMBEDDING_PROPERTY, ExtractionResult, extract_episode

T0 = datetime(2024, 3, 1, 9, 0, tzinfo=timezone.utc)
CHAT_TURN = ("user (Caroline): I went to a LGBTQ support group yesterday and it was so powerful.\n\n"
             "assistant (Melanie): Wow, that's cool, Caroline! I love painting and my kids love pottery. "
             "We moved to Sweden in May 2023 and I work at Google.")
BEFORE = "user (Ada): The billing service uses Postgres 15."
SWITCH = "user (Ada): We switched the billing service to SQLite."
SMALL_TALK = "user (Ada): ok thanks!\n\nassistant: You're welcome."


@dataclass
class Graph:
    group_id: str
    driver: FalkorDriver
    counting: CountingEmbedder
    embedder: object  # what the clients get: the counter itself, or a shared BatchingEmbedder as the service has

    async def extract(self, turn_id: str, content: str, at: datetime = T0, **kwargs: object) -> ExtractionResult:
        episode = Episode(
            episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"embeddings/{self.group_id}/{turn_id}")),
            group_id=self.group_id, scope="session", turn_id=turn_id, session_id="s1", reference_time=at,
            content=content,
            messages=[EpisodeMessage(message_id=f"{turn_id}-m", role="user", name="Ada", timestamp=at)],
        )
        clients = GraphitiClients(driver=self.driver, llm_client=RulesExtractorClient(), embedder=self.embedder,
                                  cross_encoder=NoRerank(), tracer=NoOpTracer())
        return await extract_episode(clients, episode, custom_instructions="", previous_window=2, **kwargs)

    async def counted(self, turn_id: str, content: str, at: datetime = T0, **kwargs: object) -> tuple[ExtractionResult, int, int]:
        """The result, and the embedder calls and texts this one turn made."""
        calls, texts = self.counting.calls, self.counting.texts
        result = await self.extract(turn_id, content, at, **kwargs)
        return result, self.counting.calls - calls, self.counting.texts - texts


async def _graph(falkordb_server, shared: bool) -> AsyncIterator[Graph]:  # noqa: ANN001
    host, port = falkordb_server.url.split("://", 1)[1].rsplit(":", 1)
    group_id = f"emb_{uuid.uuid4().hex[:12]}"
    driver = FalkorDriver(host=host, port=int(port), database=group_id)
    if driver._init_task is not None:  # noqa: SLF001 - index creation scheduled by the constructor
        await driver._init_task  # noqa: SLF001
    counting = CountingEmbedder(HashingEmbedder(256))
    yield Graph(group_id, driver, counting, BatchingEmbedder(counting) if shared else counting)
    try:
        await driver.client.select_graph(group_id).delete()
    finally:
        await driver.close()


@pytest.fixture
async def graph(falkordb_server) -> AsyncIterator[Graph]:  # noqa: ANN001
    """Clients with the plain embedder: extract_episode batches within the turn by itself."""
    async for g in _graph(falkordb_server, shared=False):
        yield g


@pytest.fixture
async def service_graph(falkordb_server) -> AsyncIterator[Graph]:  # noqa: ANN001
    """Clients with one BatchingEmbedder for every turn, as the extractor service builds them."""
    async for g in _graph(falkordb_server, shared=True):
        yield g


async def test_a_turn_with_entities_and_facts_makes_one_embedding_call(graph: Graph) -> None:
    result, calls, texts = await graph.counted("t1", CHAT_TURN)
    assert result.new_edges and len(result.nodes) >= 2, "the rules model found no fact: the turn tests nothing"
    assert calls == 1
    names = {n.name for n in result.nodes}
    facts = {e.fact for e in result.resolved_edges}
    assert texts == len(names | facts | {CHAT_TURN})  # each text once
    # the vectors are the embedder's own, where graphiti and recall read them
    assert all(n.name_embedding == hash_embed(n.name, 256) for n in result.nodes if n.uuid in result.new_node_uuids)
    assert all(e.fact_embedding == hash_embed(e.fact, 256) for e in result.resolved_edges)
    records, _, _ = await graph.driver.execute_query(
        f"MATCH (e:Episodic {{uuid: $uuid}}) RETURN e.{EMBEDDING_PROPERTY} AS v", uuid=result.episode_id)
    assert records[0]["v"] == pytest.approx(hash_embed(CHAT_TURN, 256), abs=1e-6)  # stored as float32


async def test_a_turn_with_nothing_to_extract_makes_one_call_for_its_own_text(graph: Graph) -> None:
    result, calls, texts = await graph.counted("t1", SMALL_TALK)
    assert not result.new_edges
    assert (calls, texts) == (1, 1)


async def test_later_turns_also_make_one_call_each(graph: Graph) -> None:
    """Entities seen before are found by the dedupe search (their stored vectors), not embedded again
    by another call."""
    await graph.extract("t1", BEFORE)
    await graph.extract("t2", CHAT_TURN, T0 + timedelta(hours=1))
    for i, content in enumerate((BEFORE, CHAT_TURN, SMALL_TALK)):
        _, calls, _ = await graph.counted(f"again{i}", content, T0 + timedelta(days=1, hours=i))
        assert calls == 1, content


async def test_an_invalidating_turn_makes_one_call_with_the_services_shared_cache(service_graph: Graph) -> None:
    """graphiti re-embeds the fact it invalidates, an old text: the service's cache still holds it."""
    first, calls, _ = await service_graph.counted("t1", BEFORE)
    assert first.new_edges and calls == 1
    second, calls, _ = await service_graph.counted("t2", SWITCH, T0 + timedelta(days=7))
    assert second.invalidated_edges, "the rules model invalidated nothing: the turn tests nothing"
    assert calls == 1


async def test_an_invalidating_turn_after_a_restart_makes_at_most_two_calls(graph: Graph) -> None:
    """No cache across turns (a fresh process): the invalidated fact's old text is not known before
    graphiti asks for it after resolution -- the one case left with a second call."""
    await graph.extract("t1", BEFORE)
    second, calls, _ = await graph.counted("t2", SWITCH, T0 + timedelta(days=7))
    assert second.invalidated_edges
    assert calls <= 2


async def test_a_stored_turn_again_makes_one_call(graph: Graph) -> None:
    await graph.extract("t1", CHAT_TURN)
    again, calls, texts = await graph.counted("t1", CHAT_TURN)
    assert again.already_present and (calls, texts) == (1, 1)


async def test_the_separate_mode_makes_two_calls(graph: Graph) -> None:
    """Names and the turn before node resolution; facts, extracted afterwards, in a second call."""
    result, calls, _ = await graph.counted("t1", CHAT_TURN, mode="separate")
    assert result.new_edges and calls == 2


async def test_a_chunked_turn_makes_two_calls(graph: Graph) -> None:
    content = "\n\n".join(f"user (Ada): Alice{i} works at Company{i} in City{i}." for i in range(12))
    result, calls, _ = await graph.counted("t1", content, mode="chunked",
                                           chunking=ChunkingSettings(chunk_token_size=60, chunk_overlap_tokens=10,
                                                                            chunk_min_tokens=0, max_nodes_per_chunk=8))
    assert result.mode == "chunked" and result.chunks > 1 and result.new_edges
    assert calls == 2
