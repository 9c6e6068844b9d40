"""A turn's edge dedupe questions in one model call (services/extractor/dedupe_batch.py).

The wrapper with a recording inner client (no broker), the offline rules model's answer to the
batched prompt, and the pipeline on a real FalkorDB with test_pipeline's scripted LLM: a turn
whose two facts each have a close candidate the extraction call did not see makes one dedupe
call, with the same graph as two calls made."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import timedelta
from typing import Any

import pytest
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig
from graphiti_core.prompts.dedupe_edges import EdgeDuplicate

from engram.models.openai_compat import LLMOutputTruncated
from engram.models.rules_llm import RulesExtractorClient
from engram.services.extractor.dedupe_batch import (
    BATCH_PROMPT,
    BATCHED_QUESTIONS,
    DedupeBatcher,
    DedupeQuestion,
    EdgeDuplicates,
    answers_by_question,
    batch_messages,
)
from engram.services.extractor.local_answers import EDGE_DEDUPE_PROMPT, LocalAnswersLLMClient
from tests.services.extractor.test_local_answers import _ask_dedupe, dedupe_messages
from tests.services.extractor.test_pipeline import T1, Env, Turn, env  # noqa: F401 - env is a fixture


class Judge(LLMClient):
    """Answers graphiti's single question and engram's batched one by a fixed rule (a candidate
    containing ``old`` is contradicted); records (response model, prompt name) of every call."""

    def __init__(self, old: str = "Lisbon", batched: Any = None, fail: Exception | None = None) -> None:
        super().__init__(LLMConfig(model="m", small_model="m"), cache=False)
        self.old, self.batched, self.fail = old, batched, fail
        self.calls: list[tuple[str, str | None]] = []
        self.texts: list[str] = []

    async def generate_response(self, messages, response_model=None, max_tokens=None, model_size=None,  # noqa: ANN001
                                group_id=None, prompt_name=None, **_: Any) -> dict[str, Any]:
        self.calls.append((response_model.__name__, prompt_name))
        self.texts.append("\n".join(m.content for m in messages))
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        if response_model is EdgeDuplicates:
            if self.batched is not None:
                return self.batched
            block = re.search(r"<QUESTIONS>\s*(.*?)\s*</QUESTIONS>", self.texts[-1], re.S).group(1)
            rows = [json.loads(line) for line in block.splitlines()]
            return {"answers": [{"id": r["id"], "duplicate_facts": [],
                                 "contradicted_facts": [c["idx"] for c in r["existing_facts"] + r["invalidation_candidates"]
                                                        if self.old in c["fact"]]} for r in rows]}
        text = self.texts[-1]
        return {"duplicate_facts": [], "contradicted_facts": [0] if self.old in text.split("<NEW FACT>")[0] else []}

    async def _generate_response(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError


# each new fact has a close candidate (word overlap above the gate): the model must judge it
MOVE = ("Maya moved to Porto last month.", [], ["Maya lives in Lisbon.", "Maya works at the Lisbon office."])
JOB = ("Maya works at the Porto office now.", ["Maya works at the Lisbon office."], ["Maya lives in Lisbon."])
PET = ("Tom adopted a grey cat.", ["Tom adopted a cat."], [])


async def test_a_turns_questions_for_the_model_go_in_one_call() -> None:
    inner = Judge()
    client = LocalAnswersLLMClient(inner)
    before = BATCHED_QUESTIONS._value.get()
    move, job, pet = await asyncio.gather(_ask_dedupe(client, *MOVE), _ask_dedupe(client, *JOB), _ask_dedupe(client, *PET))
    assert inner.calls == [("EdgeDuplicates", BATCH_PROMPT)]
    # graphiti's own idx numbering, per question
    assert move == {"duplicate_facts": [], "contradicted_facts": [0, 1]}
    assert job == {"duplicate_facts": [], "contradicted_facts": [0, 1]}
    assert pet == {"duplicate_facts": [], "contradicted_facts": []}
    assert BATCHED_QUESTIONS._value.get() == before + 3
    asked = inner.texts[0]
    assert all(fact in asked for fact in (MOVE[0], JOB[0], PET[0], "Maya lives in Lisbon.", "Tom adopted a cat."))


async def test_a_question_alone_is_asked_with_graphitis_own_prompt() -> None:
    inner = Judge()
    answer = await _ask_dedupe(LocalAnswersLLMClient(inner), *MOVE)
    assert inner.calls == [("EdgeDuplicate", EDGE_DEDUPE_PROMPT)]
    assert answer == {"duplicate_facts": [], "contradicted_facts": [0]}


async def test_the_same_question_twice_is_one_question_of_the_batch() -> None:
    inner = Judge()
    client = LocalAnswersLLMClient(inner)
    first, second, pet = await asyncio.gather(_ask_dedupe(client, *MOVE), _ask_dedupe(client, *MOVE), _ask_dedupe(client, *PET))
    assert len(inner.calls) == 1 and first == second
    assert inner.texts[0].count(MOVE[0]) == 1


@pytest.mark.parametrize("answer", [
    {"answers": [{"id": 0, "duplicate_facts": [], "contradicted_facts": [1]}]},  # question 1 missing
    {"answers": [{"id": 0, "duplicate_facts": [], "contradicted_facts": [1]},
                 {"id": 1, "duplicate_facts": None, "contradicted_facts": []}]},  # not a list
    {"answers": [{"id": 0, "duplicate_facts": [], "contradicted_facts": [1]}, {"id": 7, "duplicate_facts": [],
                  "contradicted_facts": []}, "nonsense"]},  # no such question
])
async def test_a_question_the_batch_did_not_answer_is_asked_alone(answer: dict[str, Any]) -> None:
    inner = Judge(batched=answer)
    client = LocalAnswersLLMClient(inner)
    move, job = await asyncio.gather(_ask_dedupe(client, *MOVE), _ask_dedupe(client, *JOB))
    assert inner.calls == [("EdgeDuplicates", BATCH_PROMPT), ("EdgeDuplicate", EDGE_DEDUPE_PROMPT)]
    assert move == {"duplicate_facts": [], "contradicted_facts": [1]}  # the batch's answer
    assert job == {"duplicate_facts": [], "contradicted_facts": [0]}  # its own call's


def test_an_idx_outside_a_questions_lists_is_dropped_as_graphiti_drops_it() -> None:
    answer = {"answers": [{"id": 0, "duplicate_facts": [0, 1, 1], "contradicted_facts": [1, 9, -1]},
                          {"id": 1, "duplicate_facts": [5], "contradicted_facts": [0, 0]}]}
    questions = [DedupeQuestion(*JOB[:1], [(0, JOB[1][0])], [(1, JOB[2][0])]),
                 DedupeQuestion(*MOVE[:1], [], [(0, MOVE[2][0]), (1, MOVE[2][1])])]
    # a duplicate only among the existing facts; each idx once
    assert answers_by_question(answer, questions) == {0: {"duplicate_facts": [0], "contradicted_facts": [1]},
                                                      1: {"duplicate_facts": [], "contradicted_facts": [0]}}


async def test_a_failed_batched_call_fails_every_question_in_it() -> None:
    inner = Judge(fail=TimeoutError("model down"))
    client = LocalAnswersLLMClient(inner)
    results = await asyncio.gather(_ask_dedupe(client, *MOVE), _ask_dedupe(client, *JOB), return_exceptions=True)
    assert [type(r) for r in results] == [TimeoutError, TimeoutError]
    assert inner.calls == [("EdgeDuplicates", BATCH_PROMPT)]


def test_idx_values_are_read_as_graphiti_reads_its_own_answer() -> None:
    """A small model in JSON-object mode may write idx values as strings or floats: graphiti's
    EdgeDuplicate reads "0" and 1.0 as 0 and 1, so the batch does too; a row that cannot be read
    is left out (and asked alone)."""
    questions = [DedupeQuestion(*JOB[:1], [(0, JOB[1][0])], [(1, JOB[2][0])]),
                 DedupeQuestion(*MOVE[:1], [], [(0, MOVE[2][0])])]
    answer = {"answers": [{"id": "0", "duplicate_facts": ["0"], "contradicted_facts": [1.0]},
                          {"id": 1, "duplicate_facts": [], "contradicted_facts": ["soon"]}]}
    assert answers_by_question(answer, questions) == {0: {"duplicate_facts": [0], "contradicted_facts": [1]}}
    assert EdgeDuplicate(duplicate_facts=["0"], contradicted_facts=[1.0]).model_dump() == \
        {"duplicate_facts": [0], "contradicted_facts": [1]}  # what graphiti makes of the same answer alone


async def test_an_error_after_the_call_fails_the_questions_instead_of_hanging_them() -> None:
    class Broken(dict):  # an inner client whose answer object breaks when read
        def get(self, *args: Any) -> Any:
            raise RuntimeError("unreadable answer")

    async def ask(messages: list[Any]) -> dict[str, Any]:
        return Broken()

    async def alone() -> dict[str, Any]:  # pragma: no cover - never reached
        return {"duplicate_facts": [], "contradicted_facts": []}

    batcher = DedupeBatcher(ask, window_s=0.01)
    q = DedupeQuestion("a", [], [(0, "b")])
    results = await asyncio.wait_for(asyncio.gather(batcher.answer(q, alone), batcher.answer(q._replace(new="c"), alone),
                                                    return_exceptions=True), timeout=5)
    assert [type(r) for r in results] == [RuntimeError, RuntimeError]


async def test_an_unusable_batched_answer_sends_its_questions_alone() -> None:
    inner = Judge()
    real = inner.generate_response

    async def cut_off_batches(messages, response_model=None, *args: Any, **kwargs: Any) -> dict[str, Any]:  # noqa: ANN001
        if response_model is EdgeDuplicates:
            inner.calls.append(("EdgeDuplicates", BATCH_PROMPT))
            raise LLMOutputTruncated(BATCH_PROMPT, 512, attempts=2)
        return await real(messages, response_model, *args, **kwargs)

    inner.generate_response = cut_off_batches  # type: ignore[method-assign]
    client = LocalAnswersLLMClient(inner)
    move, job = await asyncio.gather(_ask_dedupe(client, *MOVE), _ask_dedupe(client, *JOB))
    assert inner.calls[0] == ("EdgeDuplicates", BATCH_PROMPT)
    assert inner.calls[1:] == [("EdgeDuplicate", EDGE_DEDUPE_PROMPT)] * 2
    assert move == job == {"duplicate_facts": [], "contradicted_facts": [0]}


async def test_a_batch_holds_at_most_its_cap_and_a_late_question_gets_its_own_call() -> None:
    asked: list[int] = []

    async def ask(messages: list[Any]) -> dict[str, Any]:
        n = messages[1].content.split("<QUESTIONS>")[1].count('"new_fact"')
        asked.append(n)
        return {"answers": [{"id": i, "duplicate_facts": [], "contradicted_facts": []} for i in range(n)]}

    alone: list[str] = []

    def forward(name: str):  # noqa: ANN202
        async def call() -> dict[str, Any]:
            alone.append(name)
            return {"duplicate_facts": [], "contradicted_facts": []}
        return call

    batcher = DedupeBatcher(ask, window_s=0.01, max_questions=2)
    q = DedupeQuestion("a", [], [(0, "b")])
    await asyncio.gather(*(batcher.answer(q._replace(new=str(i)), forward(str(i))) for i in range(3)))
    assert asked == [2] and alone == ["2"]  # two in the full batch; the third, alone, with its own prompt
    await asyncio.sleep(0.05)
    await batcher.answer(q, forward("late"))
    assert alone == ["2", "late"]


def test_the_rules_model_answers_the_batch_as_it_answers_each_question() -> None:
    rules = RulesExtractorClient()
    questions = [
        DedupeQuestion("The billing service uses SQLite.", [(0, "The billing service uses Postgres 15.")], []),
        DedupeQuestion("Alice adopted a cat named Tom.", [(0, "Alice adopted a cat named Tom.")], [(1, "Bob plays the cello.")]),
        DedupeQuestion("Bob plays the cello.", [], [(0, "Alice adopted a cat named Tom.")]),
    ]
    batched = rules.respond(batch_messages(questions), EdgeDuplicates)
    singles = [rules.respond(dedupe_messages(q.new, [f for _, f in q.existing], [f for _, f in q.others]), EdgeDuplicate)
               for q in questions]
    assert answers_by_question(batched, questions) == dict(enumerate(singles))
    assert singles[1]["duplicate_facts"] == [0]  # the rule does mark something: the comparison is not empty


# --------------------------------------------------------------------------- the pipeline
FIRST = "user(Maya): I live in Lisbon and I work at the Lisbon office."
SECOND = "user(Maya): Big news: I moved to Porto and I work at the Porto office now."
WORLD = {
    FIRST: Turn(["Maya", "Lisbon", "Lisbon office"], [("Maya", "Lisbon", "LIVES_IN", "Maya lives in Lisbon."),
                                                      ("Maya", "Lisbon office", "WORKS_AT", "Maya works at the Lisbon office.")]),
    SECOND: Turn(["Maya", "Porto", "Porto office"], [("Maya", "Porto", "LIVES_IN", "Maya now lives in Porto, not Lisbon."),
                                                     ("Maya", "Porto office", "WORKS_AT", "Maya works at the Porto office, not the Lisbon office.")]),
}


@pytest.fixture
def world(env: Env) -> Env:  # noqa: F811
    env.llm.world = WORLD
    env.llm.contradictions = [("Porto, not Lisbon", "lives in Lisbon"), ("Porto office, not", "Lisbon office")]
    return env


async def test_a_turn_with_two_unseen_close_candidates_makes_one_dedupe_call(world: Env) -> None:
    await world.run(world.episode("s1:t1", FIRST, T1))
    # known_facts=0: the extraction call sees no known fact, so both facts' close candidates go to the model
    second = await world.extract(world.episode("s1:t2", SECOND, T1 + timedelta(days=1)), known_facts=0)
    # (a node dedupe call may come too: "Porto office" / "Lisbon office" share a word)
    assert second.llm_calls[BATCH_PROMPT] == 1 and EDGE_DEDUPE_PROMPT not in second.llm_calls, second.llm_calls
    assert world.llm.names()["EdgeDuplicates"] == 1 and "EdgeDuplicate" not in world.llm.names()
    # both old facts are ended, as two separate calls would have ended them
    assert sorted(e.fact for e in second.invalidated_edges) == ["Maya lives in Lisbon.", "Maya works at the Lisbon office."]
