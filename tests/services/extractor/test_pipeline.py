"""Extraction pipeline (services/extractor/pipeline.py) against a real FalkorDB (session fixture)
with a scripted LLM, the HashingEmbedder and a no-op cross encoder. One graph per test."""

from __future__ import annotations

import ast
import json
import re
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from graphiti_core.cross_encoder.client import CrossEncoderClient
from graphiti_core.driver.falkordb_driver import FalkorDriver
from graphiti_core.graphiti_types import GraphitiClients
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig
from graphiti_core.tracer import NoOpTracer

from engram.models.hashing_embedder import HashingEmbedder
from engram.schemas import Episode, EpisodeMessage
from engram.services.extractor.deltas import build_node_deltas
from engram.services.extractor.pipeline import (
    ExtractionResult,
    build_episodic_node,
    deltas_for_existing_episode,
    extract_episode,
)

T1 = datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc)
T2 = T1 + timedelta(days=1)
INSTRUCTIONS = "ENGRAM-TEST-INSTRUCTIONS: keep decisions, drop chit-chat."
SUMMARY_MODELS = {"SummarizedEntities", "EntitySummary", "SummarizedEntity"}
EXTRACTION_MODELS = {"CombinedExtraction", "ExtractedEntities", "ExtractedEdges"}


# --------------------------------------------------------------------------- scripted LLM
@dataclass
class Turn:
    entities: list[str]
    facts: list[tuple[str, str, str, str]]  # source, target, relation, fact


@dataclass
class ScriptedLLM(LLMClient):
    """Answers graphiti's prompts from a script keyed by episode content; records every call."""

    world: dict[str, Turn]
    contradictions: list[tuple[str, str]] = field(default_factory=list)  # (new fact part, old fact part)
    calls: list[tuple[str, str]] = field(default_factory=list)  # (response model name, prompt text)

    def __post_init__(self) -> None:
        LLMClient.__init__(self, LLMConfig(model="scripted", small_model="scripted"), cache=False)

    def __hash__(self) -> int:  # dataclass eq=True would make it unhashable
        return id(self)

    def names(self) -> Counter[str]:
        return Counter(name for name, _ in self.calls)

    def prompts(self, name: str) -> list[str]:
        return [text for n, text in self.calls if n == name]

    async def _generate_response(self, messages, response_model=None, max_tokens=0, model_size=None, **_: Any):
        name = response_model.__name__ if response_model is not None else "text"
        text = "\n".join(m.content for m in messages)
        self.calls.append((name, text))
        handler: Callable[[str], dict[str, Any]] | None = getattr(self, f"_answer_{name}", None)
        if handler is None:
            raise AssertionError(f"unexpected LLM call with response model {name}")
        return handler(text)

    def _turn(self, text: str) -> Turn:
        match = re.search(r"<CURRENT[ _]MESSAGES?>\s*(.*?)\s*</CURRENT[ _]MESSAGES?>", text, re.S)
        assert match, "no current message section in the extraction prompt"
        for content, turn in self.world.items():
            if content in match.group(1):
                return turn
        raise AssertionError("episode not in the script")

    def _answer_CombinedExtraction(self, text: str) -> dict[str, Any]:
        turn = self._turn(text)
        edges = [{"source_entity_name": s, "target_entity_name": t, "relation_type": r, "fact": f, "episode_indices": [0]}
                 for s, t, r, f in turn.facts]
        # engram's prompt also asks each fact's dates and its relation to the KNOWN FACTS: answered
        # as this script answers graphiti's separate timestamp and dedupe prompts
        told = re.search(r"<REFERENCE TIME>\s*(\S+)\s*</REFERENCE TIME>", text)
        known = re.search(r"<KNOWN FACTS>\s*(.*?)\s*</KNOWN FACTS>", text, re.S)
        for edge in edges:
            if told:
                edge["valid_at"] = told.group(1)
            if known:
                rows = json.loads(known.group(1))
                same = [r["id"] for r in rows if r["fact"] == edge["fact"]]
                if same:
                    edge["restates"] = same[0]
                edge["replaces"] = [r["id"] for r in rows if any(
                    new in edge["fact"] and old in r["fact"] for new, old in self.contradictions)]
        return {"extracted_entities": [{"name": n, "entity_type_id": 0} for n in turn.entities], "edges": edges}

    def _answer_ExtractedEntities(self, text: str) -> dict[str, Any]:
        return {"extracted_entities": [{"name": n, "entity_type_id": 0} for n in self._turn(text).entities]}

    def _answer_ExtractedEdges(self, text: str) -> dict[str, Any]:
        ref = re.search(r"<REFERENCE_TIME>\s*(\S+ \S+|\S+)", text).group(1)  # "2024-05-01 10:00:00+00:00  # ..."
        valid_at = datetime.fromisoformat(ref).isoformat()
        return {
            "edges": [
                {"source_entity_name": s, "target_entity_name": t, "relation_type": r, "fact": f,
                 "valid_at": valid_at, "invalid_at": None, "episode_indices": [0]}
                for s, t, r, f in self._turn(text).facts
            ]
        }

    def _answer_BatchEdgeTimestamps(self, text: str) -> dict[str, Any]:
        facts = json.loads(re.search(r"<FACTS>\s*(.*?)\s*</FACTS>", text, re.S).group(1))
        return {"timestamps": [{"valid_at": f["reference_time"], "invalid_at": None} for f in facts]}

    def _answer_EdgeTimestamps(self, text: str) -> dict[str, Any]:
        return {"valid_at": None, "invalid_at": None}

    def _answer_EdgeDuplicate(self, text: str) -> dict[str, Any]:
        def section(tag: str) -> list[dict[str, Any]]:
            return ast.literal_eval(re.search(rf"<{tag}>\s*(.*?)\s*</{tag}>", text, re.S).group(1))

        existing, candidates = section("EXISTING FACTS"), section("FACT INVALIDATION CANDIDATES")
        new_fact = re.search(r"<NEW FACT>\s*(.*?)\s*</NEW FACT>", text, re.S).group(1)
        return self._judge(new_fact, existing, candidates)

    def _answer_EdgeDuplicates(self, text: str) -> dict[str, Any]:
        """engram's batched dedupe prompt (services/extractor/dedupe_batch.py): a JSON question a line."""
        rows = [json.loads(line) for line in re.search(r"<QUESTIONS>\s*(.*?)\s*</QUESTIONS>", text, re.S).group(1).splitlines()]
        return {"answers": [{"id": r["id"], **self._judge(r["new_fact"], r["existing_facts"], r["invalidation_candidates"])}
                            for r in rows]}

    def _judge(self, new_fact: str, existing: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> dict[str, Any]:
        duplicates = [f["idx"] for f in existing if f["fact"] == new_fact]
        contradicted = [
            f["idx"]
            for f in existing + candidates
            if any(new in new_fact and old in f["fact"] for new, old in self.contradictions)
        ]
        return {"duplicate_facts": duplicates, "contradicted_facts": contradicted}

    def _answer_NodeResolutions(self, text: str) -> dict[str, Any]:
        return {"entity_resolutions": []}  # graphiti keeps unresolved nodes as new


class NoOpCrossEncoder(CrossEncoderClient):
    async def rank(self, query: str, passages: list[str]) -> list[tuple[str, float]]:
        return [(p, 0.0) for p in passages]


# --------------------------------------------------------------------------- world
EP1_TEXT = "user(Alice): I work at Microsoft and I love hiking.\nassistant: Nice!"
EP2_TEXT = "user(Alice): I quit Microsoft, I work at Google now."
EP_UNSAFE_TEXT = "user(Alice): It is great, I adopted a cat named Tom."
WORLD = {
    EP1_TEXT: Turn(
        ["Alice", "Microsoft", "hiking"],
        [("Alice", "Microsoft", "WORKS_AT", "Alice works at Microsoft."),
         ("Alice", "hiking", "ENJOYS", "Alice loves hiking.")],
    ),
    EP2_TEXT: Turn(["Alice", "Google"], [("Alice", "Google", "WORKS_AT", "Alice works at Google.")]),
    EP_UNSAFE_TEXT: Turn(
        ["Alice", "It", "Is", "Tom"],
        [("It", "Alice", "IS_GREAT_FOR", "It is great for Alice."),
         ("Alice", "Tom", "ADOPTED", "Alice adopted a cat named Tom."),
         ("Is", "Tom", "RELATES_TO", "Is relates to Tom."),
         ("Alice", "This", "LIKES", "Alice likes this.")],  # "This" is not an entity: materialised endpoint
    ),
}
CONTRADICTIONS = [("works at Google", "works at Microsoft")]


def make_episode(group_id: str, turn_id: str, content: str, at: datetime) -> Episode:
    return Episode(
        episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"test/{group_id}/{turn_id}")),
        group_id=group_id,
        scope="session",
        turn_id=turn_id,
        session_id="s1",
        reference_time=at,
        content=content,
        messages=[EpisodeMessage(message_id=f"{turn_id}-m", role="user", name="Alice", timestamp=at)],
    )


@dataclass
class Env:
    group_id: str
    clients: GraphitiClients
    llm: ScriptedLLM
    driver: FalkorDriver

    def episode(self, turn_id: str, content: str, at: datetime) -> Episode:
        return make_episode(self.group_id, turn_id, content, at)

    async def run(self, episode: Episode, mode: str = "combined") -> ExtractionResult:
        return await self.extract(episode, mode=mode)

    async def extract(self, episode: Episode, **kwargs: Any) -> ExtractionResult:
        return await extract_episode(self.clients, episode, custom_instructions=INSTRUCTIONS, previous_window=5, **kwargs)

    async def scalar(self, query: str, **params: Any) -> Any:
        records, _, _ = await self.driver.execute_query(query, **params)
        return list(records[0].values())[0]

    async def counts(self) -> dict[str, int]:
        return {
            "entities": await self.scalar("MATCH (n:Entity) RETURN count(n) AS c"),
            "facts": await self.scalar("MATCH ()-[e:RELATES_TO]->() RETURN count(e) AS c"),
            "episodes": await self.scalar("MATCH (n:Episodic) RETURN count(n) AS c"),
            "mentions": await self.scalar("MATCH ()-[e:MENTIONS]->() RETURN count(e) AS c"),
        }

    async def entity_names(self) -> set[str]:
        records, _, _ = await self.driver.execute_query("MATCH (n:Entity) RETURN n.name AS name")
        return {r["name"] for r in records}


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host, int(port)


@pytest.fixture
async def env(falkordb_server) -> AsyncIterator[Env]:
    host, port = _host_port(falkordb_server.url)
    group_id = f"t_{uuid.uuid4().hex[:12]}"
    driver = FalkorDriver(host=host, port=port, database=group_id)
    if driver._init_task is not None:  # index creation scheduled by the constructor
        await driver._init_task
    llm = ScriptedLLM(world=WORLD, contradictions=CONTRADICTIONS)
    clients = GraphitiClients(
        driver=driver, llm_client=llm, embedder=HashingEmbedder(256), cross_encoder=NoOpCrossEncoder(), tracer=NoOpTracer()
    )
    yield Env(group_id, clients, llm, driver)
    try:
        await driver.client.select_graph(group_id).delete()
    finally:
        await driver.close()


# --------------------------------------------------------------------------- (a) one episode
async def test_episode_creates_nodes_and_edges_in_one_combined_pass(env: Env) -> None:
    ep = env.episode("s1:t1", EP1_TEXT, T1)
    result = await env.run(ep)

    assert not result.already_present and result.mode == "combined"
    assert {n.name for n in result.nodes} == {"Alice", "Microsoft", "hiking"}
    assert set(result.new_node_uuids) == {n.uuid for n in result.nodes}
    assert {e.fact for e in result.new_edges} == {"Alice works at Microsoft.", "Alice loves hiking."}
    assert result.invalidated_edges == [] and result.dropped_entities == 0
    assert len(result.episodic_edges) == 3
    assert all(e.valid_at == T1 for e in result.new_edges)

    # stored: deterministic episode uuid, MENTIONS, facts with vectors, nodes without summaries
    assert await env.counts() == {"entities": 3, "facts": 2, "episodes": 1, "mentions": 3}
    stored = await env.scalar("MATCH (e:Episodic {uuid: $u}) RETURN e.valid_at AS v", u=ep.episode_id)
    assert datetime.fromisoformat(stored) == T1
    assert await env.scalar("MATCH (n:Entity) WHERE n.summary <> '' RETURN count(n) AS c") == 0
    assert await env.scalar("MATCH (n:Entity) WHERE n.name_embedding IS NULL RETURN count(n) AS c") == 0
    assert await env.scalar("MATCH ()-[e:RELATES_TO]->() WHERE e.fact_embedding IS NULL RETURN count(e) AS c") == 0

    # LLM: one extraction pass carrying the instructions, no summary / attribute call
    names = env.llm.names()
    assert names["CombinedExtraction"] == 1
    assert not names.keys() & SUMMARY_MODELS
    assert set(names) <= {"CombinedExtraction", "BatchEdgeTimestamps", "EdgeDuplicate", "EdgeDuplicates", "NodeResolutions"}
    assert INSTRUCTIONS in env.llm.prompts("CombinedExtraction")[0]
    assert result.llm_call_count == len(env.llm.calls)
    assert result.llm_calls["extract_nodes_and_edges.extract_message"] == 1
    assert result.timings["total_ms"] > 0


async def test_separate_mode_puts_instructions_in_node_and_edge_prompts(env: Env) -> None:
    result = await env.run(env.episode("s1:t1", EP1_TEXT, T1), mode="separate")

    names = env.llm.names()
    assert names["ExtractedEntities"] == 1 and names["ExtractedEdges"] == 1
    assert "CombinedExtraction" not in names
    assert not names.keys() & SUMMARY_MODELS
    assert INSTRUCTIONS in env.llm.prompts("ExtractedEntities")[0]
    assert INSTRUCTIONS in env.llm.prompts("ExtractedEdges")[0]
    assert {n.name for n in result.nodes} == {"Alice", "Microsoft", "hiking"}
    assert len(result.new_edges) == 2
    assert await env.counts() == {"entities": 3, "facts": 2, "episodes": 1, "mentions": 3}


# --------------------------------------------------------------------------- (b) idempotency
@pytest.mark.parametrize("mode", ["combined", "separate"])
async def test_same_episode_again_is_already_present_without_llm_calls(env: Env, mode: str) -> None:
    ep = env.episode("s1:t1", EP1_TEXT, T1)
    await env.run(ep, mode)
    calls, counts = len(env.llm.calls), await env.counts()

    again = await env.run(ep, mode)

    assert again.already_present and again.episode is not None and again.episode.uuid == ep.episode_id
    assert again.llm_calls == {} and again.nodes == [] and again.new_edges == []
    assert len(env.llm.calls) == calls
    assert await env.counts() == counts


# --------------------------------------------------------------------------- (c) contradiction
async def test_contradicting_episode_invalidates_and_flips_polarity(env: Env) -> None:
    first = await env.run(env.episode("s1:t1", EP1_TEXT, T1))
    old = next(e for e in first.new_edges if "Microsoft" in e.fact)
    ep2 = env.episode("s1:t2", EP2_TEXT, T2)
    second = await env.run(ep2)

    [new] = second.new_edges
    assert new.fact == "Alice works at Google."
    assert [e.uuid for e in second.invalidated_edges] == [old.uuid]
    assert second.invalidated_by == {old.uuid: [new.uuid]}
    assert second.previous_episodes == 1
    alice = next(n for n in second.nodes if n.name == "Alice")
    assert alice.uuid not in second.new_node_uuids  # deduplicated against episode 1
    assert {n.name for n in second.context_nodes} == {"Microsoft"}

    stored_invalid = await env.scalar(
        "MATCH ()-[e:RELATES_TO {uuid: $u}]->() WHERE e.expired_at IS NOT NULL RETURN e.invalid_at AS v", u=old.uuid
    )
    assert datetime.fromisoformat(stored_invalid) == T2
    assert await env.counts() == {"entities": 4, "facts": 3, "episodes": 2, "mentions": 5}

    deltas = {d.node_name: d for d in build_node_deltas(ep2, second)}
    assert set(deltas) == {"Alice", "Google", "Microsoft"}
    for name in ("Alice", "Microsoft"):
        [inv] = deltas[name].invalidated_facts
        assert inv.uuid == old.uuid and inv.invalidated_by == new.uuid
        assert deltas[name].polarity_flip
    assert deltas["Google"].is_new_node and not deltas["Google"].polarity_flip
    assert not deltas["Alice"].is_new_node
    assert [f.uuid for f in deltas["Alice"].new_facts] == [new.uuid]
    assert deltas["Alice"].new_facts[0].embedding and len(deltas["Alice"].new_facts[0].embedding) == 256


# --------------------------------------------------------------------------- (d) unsafe names
@pytest.mark.parametrize("mode", ["combined", "separate"])
async def test_stopword_entities_are_dropped_and_falkordb_survives(env: Env, falkordb_server, mode: str) -> None:
    result = await env.run(env.episode("s1:t3", EP_UNSAFE_TEXT, T1), mode)

    assert {n.name for n in result.nodes} == {"Alice", "Tom"}
    assert {e.fact for e in result.new_edges} == {"Alice adopted a cat named Tom."}
    assert result.dropped_entities >= 2 and result.dropped_edges == 3
    assert await env.entity_names() == {"Alice", "Tom"}
    assert falkordb_server.alive()
    assert await env.scalar("RETURN 1 AS one") == 1
    assert await env.driver.client.connection.ping()


# --------------------------------------------------------------------------- (e) rebuilt deltas
async def test_deltas_for_existing_episode_match_the_first_run(env: Env) -> None:
    ep1, ep2 = env.episode("s1:t1", EP1_TEXT, T1), env.episode("s1:t2", EP2_TEXT, T2)
    first1, first2 = await env.run(ep1), await env.run(ep2)
    calls = len(env.llm.calls)

    for ep, first in ((ep1, first1), (ep2, first2)):
        original = build_node_deltas(ep, first)
        rebuilt = await deltas_for_existing_episode(env.clients, ep)
        assert {d.node_uuid for d in rebuilt} == {d.node_uuid for d in original}
        for a, b in zip(original, rebuilt, strict=True):
            assert (a.node_uuid, a.node_name, a.is_new_node, a.polarity_flip) == (
                b.node_uuid, b.node_name, b.is_new_node, b.polarity_flip
            )
            assert [f.uuid for f in a.new_facts] == [f.uuid for f in b.new_facts]
            assert a.invalidated_facts == b.invalidated_facts  # incl. inferred invalidated_by
            for fa, fb in zip(a.new_facts, b.new_facts, strict=True):
                assert fb.embedding == pytest.approx(fa.embedding, abs=1e-6)  # stored as float32
    assert len(env.llm.calls) == calls


async def test_driver_for_another_group_is_refused(env: Env) -> None:
    other = make_episode("another_group", "s1:t1", EP1_TEXT, T1)
    with pytest.raises(ValueError, match="another_group"):
        await env.run(other)
    assert env.llm.calls == []


async def test_previous_episodes_compare_reference_times_in_utc(env: Env) -> None:
    # 11:30+02:00 is 09:30Z, before episode 1 (10:00Z): episode 1 is not a previous episode,
    # although "...T10:00:00+00:00" sorts before "...T11:30:00+02:00" as a string.
    await env.run(env.episode("s1:t1", EP1_TEXT, T1))
    earlier = env.episode("s1:t0", EP2_TEXT, datetime(2024, 5, 1, 11, 30, tzinfo=timezone(timedelta(hours=2))))
    assert build_episodic_node(earlier, T1).valid_at.utcoffset() == timedelta(0)
    result = await env.run(earlier)
    assert result.previous_episodes == 0


async def test_source_message_ids_are_stored_on_the_episode_node(env: Env) -> None:
    ep = env.episode("s1:t1", EP1_TEXT, T1)
    await env.run(ep)
    ids = await env.scalar("MATCH (e:Episodic {uuid: $u}) RETURN e.engram_message_ids AS ids", u=ep.episode_id)
    assert ids == ["s1:t1-m"]
    # a redelivery after a crash that lost the property writes it again, with no LLM call
    await env.driver.execute_query("MATCH (e:Episodic) REMOVE e.engram_message_ids")
    calls = len(env.llm.calls)
    again = await env.run(ep)
    assert again.already_present and len(env.llm.calls) == calls
    assert await env.scalar("MATCH (e:Episodic {uuid: $u}) RETURN e.engram_message_ids AS ids", u=ep.episode_id) == ["s1:t1-m"]


async def test_extraction_cost_is_stored_on_the_episode_and_kept_on_redelivery(env: Env) -> None:
    """Issue 23 item 6: what one turn cost is on its Episodic node, and a redelivery (no LLM call)
    neither zeroes nor rewrites it, also after a crash that lost the other properties."""
    ep = env.episode("s1:t1", EP1_TEXT, T1)
    result = await env.run(ep)
    query = ("MATCH (e:Episodic {uuid: $u}) RETURN [e.engram_llm_calls, e.engram_input_tokens, "
             "e.engram_output_tokens, e.engram_stage_ms] AS cost")
    calls, tokens_in, tokens_out, stage_ms = await env.scalar(query, u=ep.episode_id)
    assert calls == result.llm_call_count == len(env.llm.calls) > 0
    assert tokens_in == sum(t["input"] for t in result.llm_tokens.values()) > 0
    assert tokens_out == sum(t["output"] for t in result.llm_tokens.values()) > 0
    stages = json.loads(stage_ms)
    assert {"lookup", "previous_episodes", "extract", "resolve_nodes", "resolve_edges", "embed", "save", "total"} <= set(stages)
    assert stages["total"] >= stages["extract"] >= 0 and stages["total"] > 0

    first = await env.scalar(query, u=ep.episode_id)
    again = await env.run(ep)
    assert again.already_present and len(env.llm.calls) == calls
    assert await env.scalar(query, u=ep.episode_id) == first, "a redelivery must not overwrite the recorded cost"
    await env.driver.execute_query("MATCH (e:Episodic) REMOVE e.engram_message_ids")  # a crash before they were written
    await env.run(ep)
    assert await env.scalar(query, u=ep.episode_id) == first


def test_the_known_facts_query_keeps_names_and_long_words_within_graphitis_limit() -> None:
    from engram.services.extractor.pipeline import KNOWN_FACT_QUERY_WORDS, known_fact_query

    query = known_fact_query("user (Ada): We switched the billing service to SQLite.\n\nassistant: Noted, it is.")
    assert query.split() == ["SQLite", "Noted", "Ada", "switched", "billing", "service"]  # no roles, stopwords
    long_turn = "user (Ada): " + " ".join(f"word{i:03d}x" for i in range(200)) + " Postgres"
    words = known_fact_query(long_turn).split()
    # graphiti's FalkorDB query refuses 128 terms (words and their "|"): kept under it, names first
    assert len(words) == KNOWN_FACT_QUERY_WORDS and words[:2] == ["Postgres", "Ada"]
    assert known_fact_query("user: ok, it is") == ""


async def test_the_known_facts_shown_are_distinct_texts(env: Env) -> None:
    """One fact text on two entity pairs is one known fact, and so is a copy with another closing
    full stop (one statement, services/extractor/local_answers.py ``statement_key``: the model's
    answer about one stands for the other): the block is not filled with repeats."""
    hike = "user(Alice): Bob and I went hiking in the Alps."
    again = "user(Alice): The Alps hiking trip with Bob was great."
    env.llm.world = {
        hike: Turn(["Alice", "Bob", "Alps"], [("Alice", "Alps", "HIKED_IN", "Alice and Bob went hiking in the Alps."),
                                               ("Bob", "Alps", "HIKED_IN", "Alice and Bob went hiking in the Alps."),
                                               ("Alice", "Bob", "HIKED_WITH", "Alice and Bob went hiking in the Alps")]),
        again: Turn(["Alice", "Alps"], [("Alice", "Alps", "ENJOYED", "Alice enjoyed the Alps hiking trip.")]),
    }
    await env.run(env.episode("s1:t1", hike, T1))
    assert await env.scalar("MATCH ()-[e:RELATES_TO]->() RETURN count(e) AS c") == 3  # one statement, three pairs
    await env.run(env.episode("s1:t2", again, T1 + timedelta(days=1)))
    known = json.loads(re.search(r"<KNOWN FACTS>\s*(.*?)\s*</KNOWN FACTS>",
                                 env.llm.prompts("CombinedExtraction")[1], re.S).group(1))
    assert [k["fact"].removesuffix(".") for k in known] == ["Alice and Bob went hiking in the Alps"]  # either copy


async def test_free_known_fact_slots_are_filled_from_the_previous_turns_words(env: Env) -> None:
    """A model restates what the previous messages said too: facts matching their words fill the
    slots the turn's own words leave free, and the block stays within its limit."""
    cat = "user(Alice): I adopted a cat named Tom."
    thanks = "user(Alice): Thanks! Bob plays the cello."
    env.llm.world = {
        cat: Turn(["Alice", "Tom"], [("Alice", "Tom", "ADOPTED", "Alice adopted a cat named Tom.")]),
        thanks: Turn(["Bob", "cello"], [("Bob", "cello", "PLAYS", "Bob plays the cello.")]),
    }
    await env.run(env.episode("s1:t1", cat, T1))
    await env.run(env.episode("s1:t2", thanks, T1 + timedelta(minutes=1)))
    known = re.search(r"<KNOWN FACTS>\s*(.*?)\s*</KNOWN FACTS>", env.llm.prompts("CombinedExtraction")[1], re.S)
    assert known and [k["fact"] for k in json.loads(known.group(1))] == ["Alice adopted a cat named Tom."]
    # the turn's own words first; the limit holds
    from graphiti_core.nodes import EpisodicNode

    from engram.services.extractor.pipeline import known_facts_for

    again = env.episode("s1:t3", "user(Carol): Bob and his cello again.", T1 + timedelta(minutes=2))
    previous = await EpisodicNode.get_by_group_ids(env.driver, [env.group_id])
    facts = await known_facts_for(env.clients, again, 1, previous)
    assert [e.fact for e in facts] == ["Bob plays the cello."]
    both = await known_facts_for(env.clients, again, 10, previous)
    assert [e.fact for e in both] == ["Bob plays the cello.", "Alice adopted a cat named Tom."]
