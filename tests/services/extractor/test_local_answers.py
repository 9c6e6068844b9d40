"""One model call per turn (issue 25, item 6): services/extractor/local_answers.py answers the
timestamp questions engram can date itself and skips edge dedupe with no close candidate, and
still asks the model when it must (an unresolvable date, a near-duplicate or contradicted fact).

Unit tests of the wrapper with a recording inner client, then the pipeline on a real FalkorDB
with test_pipeline's scripted LLM: calls per turn counted by prompt."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate
from graphiti_core.prompts.dedupe_nodes import NodeResolutions
from graphiti_core.prompts.extract_edges import BatchEdgeTimestamps

from engram.services.extractor.local_answers import (
    DEDUPE_SIMILARITY,
    EDGE_DEDUPE_PROMPT,
    NODE_DEDUPE_PROMPT,
    TIMESTAMPS_PROMPT,
    LocalAnswersLLMClient,
    fact_similarity,
    local_timestamps,
)
from engram.services.extractor.pipeline import extract_episode
from tests.services.extractor.test_pipeline import T1, Env, Turn, env  # noqa: F401 - env is a fixture

REF = datetime(2023, 5, 12, 10, 0, tzinfo=timezone.utc)


class Recording(LLMClient):
    """Answers every timestamp question with (REF day, null) and every dedupe with nothing; keeps the prompts."""

    def __init__(self) -> None:
        super().__init__(LLMConfig(model="m", small_model="m"), cache=False)
        self.prompts: list[str] = []

    async def _generate_response(self, messages, response_model=None, max_tokens=0, model_size=None, **_: Any):  # noqa: ANN001
        text = "\n".join(m.content for m in messages)
        self.prompts.append(text)
        if response_model is BatchEdgeTimestamps:
            n = text.split("<FACTS>")[1].count('"fact"')
            return {"timestamps": [{"valid_at": "2023-05-01T00:00:00Z", "invalid_at": None}] * n}
        if response_model is NodeResolutions:
            return {"entity_resolutions": [{"id": 0, "name": "x", "duplicate_candidate_id": 0}]}
        return {"duplicate_facts": [], "contradicted_facts": [0]}


def _facts(*facts: str) -> dict[str, Any]:
    return {"facts": [{"fact": f, "reference_time": REF.isoformat()} for f in facts]}


async def _ask_timestamps(client: LocalAnswersLLMClient, *facts: str) -> list[dict[str, Any]]:
    messages = prompt_library.extract_edges.extract_timestamps_batch(_facts(*facts))
    answer = await client.generate_response(messages, response_model=BatchEdgeTimestamps, prompt_name=TIMESTAMPS_PROMPT)
    return answer["timestamps"]


@pytest.mark.parametrize(
    ("fact", "expected"),
    [
        ("Caroline adopted a dog.", ("2023-05-12T10:00:00Z", None)),  # no date word: said-at time
        ("Calvin crashed his Ferrari last Friday.", ("2023-05-05T00:00:00Z", None)),
        ("Maya moved to Porto on 3 March 2021.", ("2021-03-03T00:00:00Z", None)),
        ("Caroline will fly to Rome in 2 days.", ("2023-05-12T10:00:00Z", None)),  # a plan: valid from now
        ("Melanie runs every day and swims twice a week.", ("2023-05-12T10:00:00Z", None)),  # frequencies
    ],
)
def test_dates_engram_resolves_need_no_model(fact: str, expected: tuple[str | None, str | None]) -> None:
    assert local_timestamps(fact, REF) == expected


@pytest.mark.parametrize(
    "fact",
    ["Melanie ran a charity race on Saturday.", "Tom no longer works at Globex.", "Jon has painted since college.",
     "The lease runs until the launch.", "Gina recently opened a studio.", "Nate went camping the week before."],
)
def test_time_expressions_engram_cannot_resolve_go_to_the_model(fact: str) -> None:
    assert local_timestamps(fact, REF) is None


async def test_a_batch_of_resolvable_facts_makes_no_call() -> None:
    inner = Recording()
    client = LocalAnswersLLMClient(inner)
    rows = await _ask_timestamps(client, "Caroline adopted a dog.", "Calvin crashed his Ferrari yesterday.")
    assert inner.prompts == []
    assert rows == [{"valid_at": "2023-05-12T10:00:00Z", "invalid_at": None},
                    {"valid_at": "2023-05-11T00:00:00Z", "invalid_at": None}]


async def test_only_the_unresolvable_fact_is_asked_and_answers_keep_their_order() -> None:
    inner = Recording()
    client = LocalAnswersLLMClient(inner)
    rows = await _ask_timestamps(client, "Caroline adopted a dog.", "Melanie ran a race on Saturday.",
                                 "Calvin crashed his Ferrari yesterday.")
    assert len(inner.prompts) == 1
    asked = inner.prompts[0].split("<FACTS>")[1]
    assert "Saturday" in asked and "dog" not in asked and "Ferrari" not in asked
    assert [r["valid_at"] for r in rows] == ["2023-05-12T10:00:00Z", "2023-05-01T00:00:00Z", "2023-05-11T00:00:00Z"]


async def _ask_dedupe(client: LocalAnswersLLMClient, new: str, existing: list[str], candidates: list[str]) -> dict:
    context = {
        "existing_edges": [{"idx": i, "fact": f} for i, f in enumerate(existing)],
        "new_edge": new,
        "edge_invalidation_candidates": [{"idx": len(existing) + i, "fact": f} for i, f in enumerate(candidates)],
    }
    messages = prompt_library.dedupe_edges.resolve_edge(context)
    return await client.generate_response(messages, response_model=EdgeDuplicate, prompt_name=EDGE_DEDUPE_PROMPT)


async def test_dedupe_with_no_close_candidate_makes_no_call() -> None:
    inner = Recording()
    answer = await _ask_dedupe(LocalAnswersLLMClient(inner), "Priya drives a Toyota Corolla.", [],
                               ["The office printer was replaced.", "Our CI runs on Jenkins."])
    assert inner.prompts == [] and answer == {"duplicate_facts": [], "contradicted_facts": []}


async def test_a_near_duplicate_or_a_change_is_still_asked() -> None:
    inner = Recording()
    client = LocalAnswersLLMClient(inner)
    # graphiti formats resolve_edge's lists as Python reprs: the gate reads them too
    answer = await _ask_dedupe(client, "Maya moved to Porto last month.", [], ["Maya lives in Lisbon."])
    assert len(inner.prompts) == 1 and answer["contradicted_facts"] == [0]
    await _ask_dedupe(client, "The billing service runs on Postgres 15.", ["The billing service uses Postgres 15."], [])
    assert len(inner.prompts) == 2
    assert fact_similarity("Maya moved to Porto last month.", "Maya lives in Lisbon.") >= DEDUPE_SIMILARITY


async def test_the_same_dedupe_question_twice_in_a_turn_is_asked_once() -> None:
    inner = Recording()
    client = LocalAnswersLLMClient(inner)
    question = ("We migrated our CI from Jenkins to GitHub Actions.", [], ["Our CI runs on Jenkins."])
    first, second = await asyncio.gather(_ask_dedupe(client, *question), _ask_dedupe(client, *question))
    assert len(inner.prompts) == 1 and first == second == {"duplicate_facts": [], "contradicted_facts": [0]}
    await _ask_dedupe(client, "We migrated our CI to GitHub Actions.", [], ["Our CI runs on Jenkins."])
    assert len(inner.prompts) == 2  # another fact: asked


async def test_without_a_threshold_every_dedupe_is_asked() -> None:
    inner = Recording()
    await _ask_dedupe(LocalAnswersLLMClient(inner, dedupe_similarity=None), "Priya drives a Toyota.", [],
                      ["Our CI runs on Jenkins."])
    assert len(inner.prompts) == 1


async def _ask_nodes(client: LocalAnswersLLMClient, entity: str, candidates: list[str]) -> dict:
    context = {
        "extracted_nodes": [{"id": 0, "name": entity, "entity_type": ["Entity"], "entity_type_description": "x"}],
        "existing_nodes": [{"candidate_id": i, "name": c, "entity_types": ["Entity"], "summary": ""}
                           for i, c in enumerate(candidates)],
        "episode_content": "", "previous_episodes": [],
    }
    messages = prompt_library.dedupe_nodes.nodes(context)
    return await client.generate_response(messages, response_model=NodeResolutions, prompt_name=NODE_DEDUPE_PROMPT)


async def test_node_dedupe_against_only_the_possessor_makes_no_call() -> None:
    inner = Recording()
    answer = await _ask_nodes(LocalAnswersLLMClient(inner), "Melanie's husband", ["Melanie"])
    assert inner.prompts == []
    assert answer["entity_resolutions"] == [{"id": 0, "name": "Melanie's husband", "duplicate_candidate_id": -1}]


async def test_node_dedupe_with_a_possible_duplicate_is_still_asked() -> None:
    inner = Recording()
    client = LocalAnswersLLMClient(inner)
    await _ask_nodes(client, "Marco's car", ["Marco", "Marco's vehicle"])  # car / vehicle: the model decides
    await _ask_nodes(client, "NYC", ["New York City"])
    assert len(inner.prompts) == 2


# --------------------------------------------------------------------------- the pipeline
NO_DATE = "user(Alice): I adopted a cat named Tom."
NO_DATE_2 = "user(Alice): Bob plays the cello."
UNRESOLVED = "user(Alice): I ran a marathon on Saturday."
REPEAT = "user(Alice): Tom the cat is mine, I adopted him."
WORLD = {
    NO_DATE: Turn(["Alice", "Tom"], [("Alice", "Tom", "ADOPTED", "Alice adopted a cat named Tom.")]),
    NO_DATE_2: Turn(["Bob", "cello"], [("Bob", "cello", "PLAYS", "Bob plays the cello.")]),
    UNRESOLVED: Turn(["Alice", "marathon"], [("Alice", "marathon", "RAN", "Alice ran a marathon on Saturday.")]),
    REPEAT: Turn(["Alice", "Tom"], [("Alice", "Tom", "ADOPTED", "Alice adopted Tom the cat.")]),
}


@pytest.fixture
def world(env: Env) -> Env:  # noqa: F811
    env.llm.world = WORLD
    env.llm.contradictions = []
    return env


async def test_a_turn_with_no_date_word_and_no_near_duplicate_makes_exactly_one_call(world: Env) -> None:
    first = await world.run(world.episode("s1:t1", NO_DATE, T1))
    assert first.llm_calls == {"extract_nodes_and_edges.extract_message": 1}
    assert all(e.valid_at == T1 for e in first.new_edges)
    second = await world.run(world.episode("s1:t2", NO_DATE_2, T1 + timedelta(days=1)))
    assert second.llm_call_count == 1, second.llm_calls
    assert world.llm.names() == {"CombinedExtraction": 2}


async def test_an_unresolvable_date_is_still_asked(world: Env) -> None:
    result = await world.run(world.episode("s1:t1", UNRESOLVED, T1))
    assert result.llm_calls == {"extract_nodes_and_edges.extract_message": 1, TIMESTAMPS_PROMPT: 1}
    assert "Saturday" in world.llm.prompts("BatchEdgeTimestamps")[0]


async def test_a_near_duplicate_fact_is_still_deduped(world: Env) -> None:
    await world.run(world.episode("s1:t1", NO_DATE, T1))
    again = await world.run(world.episode("s1:t2", REPEAT, T1 + timedelta(days=1)))
    assert again.llm_calls.get(EDGE_DEDUPE_PROMPT) == 1, again.llm_calls
    assert "Alice adopted a cat named Tom." in world.llm.prompts("EdgeDuplicate")[0]


# --------------------------------------------------------------------------- the OpenAI path
async def test_short_turns_through_the_openai_path_cost_one_request_each(env: Env, sim: Any) -> None:  # noqa: F811
    """engram's OpenAI client against the simulator (the rules model behind HTTP): a short turn with
    no date word, and one with a date engram resolves, are one chat request each; a turn restating
    a stored fact still asks the dedupe prompt (the model must see the near duplicate)."""
    from engram.models.factory import LLMSettings, build_llm

    llm = build_llm(LLMSettings(provider="openai", base_url=sim.base_url, model="sim", requests_per_second=1000))
    clients = env.clients.model_copy(update={"llm_client": llm})
    turns = ["user (Maya): I adopted a cat named Tom.", "user (Bob): Bob plays the cello in an orchestra.",
             "user (Rin): Rin crashed her bike yesterday.", "user (Maya): I adopted a cat named Tom, he is mine."]
    results = []
    for i, text in enumerate(turns):
        before = sim.count()
        result = await extract_episode(clients, env.episode(f"s1:t{i}", text, T1 + timedelta(days=i)),
                                       custom_instructions="", previous_window=2)
        results.append((result, sim.count() - before))
    for result, requests in results[:3]:
        assert requests == result.llm_call_count == 1, result.llm_calls
    last, requests = results[3]
    assert last.llm_calls.get(EDGE_DEDUPE_PROMPT, 0) >= 1 and requests == last.llm_call_count, last.llm_calls
