"""A turn's edge dedupe questions in one model call (issue 25, item 6: one model call per turn).

graphiti's ``resolve_extracted_edges`` asks ``dedupe_edges.resolve_edge`` once per new fact with
candidates, all at once (``semaphore_gather``). services/extractor/local_answers.py answers most
of them itself (no close candidate; the extraction call already judged every close one). What
is left are facts whose close candidates the extraction call did not see; with a small real
model past a conversation's first turns that was 0.54 calls a turn, up to 6 in one turn
(Qwen2.5-Coder-1.5B, 46 LoCoMo turns, docs/architecture.md "Fewer model calls per turn"): the
model restates old relations in new words and each one is asked alone.

:class:`DedupeBatcher` gathers the questions of one turn that must go to the model and asks
them in ONE call (:data:`BATCH_PROMPT`, :func:`batch_messages`): graphiti's rules for a
duplicate and a contradiction stated once, each question with its new fact and its two lists in
graphiti's own idx numbering, so each answer maps back to graphiti's question unchanged. A
question arriving alone is asked with graphiti's own prompt, as before. Which questions go
together: the ones that arrive before the turn has been quiet for :data:`BATCH_WINDOW_S` (graphiti
launches them together; the gates before them wait at most for one embedding call), at most
:data:`BATCH_MAX_QUESTIONS` per call. A late question gets a call of its own: more calls, never
a wrong answer.

What an answer can do: a question the batch's answer leaves out (or answers without both lists)
is asked alone with graphiti's prompt; an idx outside a question's lists is dropped, as graphiti
drops one from its own call's answer; a batched answer that is cut off or not valid JSON of
the schema (after the client's re-asks) sends its questions alone; a batched call that fails
otherwise (the model down, a timeout) fails every question in it, as their own calls would have.
Counted: ``engram_extractor_dedupe_batches_total`` and
``engram_extractor_dedupe_batched_questions_total``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NamedTuple

from graphiti_core.prompts.models import Message
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from engram.models.openai_compat import LLMOutputInvalid, LLMOutputTruncated

log = logging.getLogger("engram.extractor")

#: engram's prompt name for the batched question (per-prompt output caps: the ``dedupe_edges`` group's)
BATCH_PROMPT = "dedupe_edges.resolve_edges"
#: how long the turn must be quiet before its gathered questions are asked (a model call takes
#: seconds; graphiti's questions of one turn arrive within one embedding call of each other)
BATCH_WINDOW_S = 0.05
#: questions per call at most: a small model's answer stays short (~25 tokens a question)
BATCH_MAX_QUESTIONS = 8

DEDUPE_BATCHES = Counter(
    "engram_extractor_dedupe_batches_total",
    "Edge dedupe calls made for several of a turn's questions at once.",
)
BATCHED_QUESTIONS = Counter(
    "engram_extractor_dedupe_batched_questions_total",
    "Edge dedupe questions answered by a batched call (each would have been a call of its own).",
)


class DedupeQuestion(NamedTuple):
    """graphiti's ``resolve_edge`` question: the new fact, the same-pair facts it may duplicate and
    the other facts it may contradict, each ``(idx, fact)`` in the prompt's continuous numbering."""

    new: str
    existing: list[tuple[int, str]]
    others: list[tuple[int, str]]

    @property
    def candidates(self) -> list[str]:
        return [f for _, f in (*self.existing, *self.others)]


class EdgeDuplicateAnswer(BaseModel):
    id: int
    duplicate_facts: list[int]
    contradicted_facts: list[int]


class EdgeDuplicates(BaseModel):
    """The batched answer: one entry per question, by its id."""

    answers: list[EdgeDuplicateAnswer]


_SYSTEM = (
    "You are a fact deduplication assistant. "
    "NEVER mark facts as contradicted unless the new fact explicitly makes the old fact false."
)

_INSTRUCTIONS = """Each QUESTION below has a new_fact, its existing_facts (facts between the same entities) and its
invalidation_candidates (other facts), with idx values continuous across the two lists. Answer
every question, by its id:
- duplicate_facts: idx values from existing_facts ONLY that state the same information as the
  new_fact. Facts differing in numbers, dates or key qualifiers are NOT duplicates.
- contradicted_facts: idx values from either list that cannot be true together with the new_fact:
  it ended or replaced them. NOT a contradiction: recency alone, more activity, progress or a new
  event involving the same entities, work on something a person owns or is responsible for.
Empty lists when none. Example: existing "Alice works at Acme as an engineer", new "Alice works
at Acme as a senior engineer": duplicate_facts [], contradicted_facts [its idx].

<QUESTIONS>
{questions}
</QUESTIONS>"""


def batch_messages(questions: Sequence[DedupeQuestion]) -> list[Message]:
    """The batched prompt: question ``i`` of ``questions`` has id ``i``; idx values are graphiti's."""
    rows = [
        {
            "id": i,
            "new_fact": q.new,
            "existing_facts": [{"idx": idx, "fact": fact} for idx, fact in q.existing],
            "invalidation_candidates": [{"idx": idx, "fact": fact} for idx, fact in q.others],
        }
        for i, q in enumerate(questions)
    ]
    body = "\n".join(json.dumps(row, ensure_ascii=False) for row in rows)
    return [Message(role="system", content=_SYSTEM), Message(role="user", content=_INSTRUCTIONS.format(questions=body))]


def answers_by_question(answer: Any, questions: Sequence[DedupeQuestion]) -> dict[int, dict[str, list[int]]]:
    """graphiti's ``EdgeDuplicate`` answer of each question the batched ``answer`` answered: its
    row with that id and both lists. An idx outside the question's range (a duplicate outside its
    existing facts) is dropped, as graphiti drops one from its own call's answer."""
    rows = answer.get("answers") if isinstance(answer, dict) else None
    out: dict[int, dict[str, list[int]]] = {}
    for row in rows if isinstance(rows, list) else []:
        try:  # pydantic's lax mode, as graphiti reads its own answer: "0" and 1.0 are idx 0 and 1
            parsed = EdgeDuplicateAnswer.model_validate(row)
        except ValidationError:
            continue
        i = parsed.id
        if not 0 <= i < len(questions) or i in out:
            continue
        q = questions[i]
        existing = {idx for idx, _ in q.existing}
        every = existing | {idx for idx, _ in q.others}
        out[i] = {"duplicate_facts": [x for x in dict.fromkeys(parsed.duplicate_facts) if x in existing],
                  "contradicted_facts": [x for x in dict.fromkeys(parsed.contradicted_facts) if x in every]}
    return out


Forward = Callable[[], Awaitable[dict[str, Any]]]
AskBatch = Callable[[list[Message]], Awaitable[dict[str, Any]]]


class _Pending(NamedTuple):
    question: DedupeQuestion
    forward: Forward  # graphiti's own prompt for this question alone
    answer: asyncio.Future[dict[str, Any]]


class DedupeBatcher:
    """Gathers one turn's dedupe questions and asks them together (module docstring).
    ``ask`` makes the batched call (the model's, with :class:`EdgeDuplicates` as its answer)."""

    def __init__(self, ask: AskBatch, *, window_s: float = BATCH_WINDOW_S,
                 max_questions: int = BATCH_MAX_QUESTIONS) -> None:
        self.ask = ask
        self.window_s = window_s
        self.max_questions = max_questions
        self._pending: list[_Pending] = []
        self._timer: asyncio.TimerHandle | None = None
        self._running: set[asyncio.Task[None]] = set()

    async def answer(self, question: DedupeQuestion, forward: Forward) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        pending = _Pending(question, forward, loop.create_future())
        self._pending.append(pending)
        if self._timer is not None:
            self._timer.cancel()
        if len(self._pending) >= self.max_questions:
            self._flush()
        else:
            self._timer = loop.call_later(self.window_s, self._flush)
        return await pending.answer

    def _flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        batch, self._pending = [p for p in self._pending if not p.answer.done()], []
        if batch:
            task = asyncio.ensure_future(self._run(batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, batch: list[_Pending]) -> None:
        try:
            await self._answer(batch)
        except BaseException as exc:  # no question may wait for ever on a dead batch
            failure = exc if isinstance(exc, Exception) else RuntimeError("batched dedupe call cancelled")
            for p in batch:
                if not p.answer.done():
                    p.answer.set_exception(failure)
            if not isinstance(exc, Exception):
                raise  # a cancellation goes on; an error is its questions' now

    async def _answer(self, batch: list[_Pending]) -> None:
        if len(batch) == 1:
            await _settle(batch[0].answer, batch[0].forward)
            return
        questions = [p.question for p in batch]
        try:
            answer = await self.ask(batch_messages(questions))
        except (LLMOutputTruncated, LLMOutputInvalid) as exc:
            # the batch's answer, not the model, failed (after the client's own re-asks): the
            # questions' own, shorter prompts may still be answered
            log.info("batched dedupe answer unusable (%s); asking its %d questions alone",
                     type(exc).__name__, len(batch))
            await asyncio.gather(*(_settle(p.answer, p.forward) for p in batch))
            return
        except Exception as exc:  # noqa: BLE001 - every question's own call would have failed alike
            for p in batch:
                if not p.answer.done():
                    p.answer.set_exception(exc)
            return
        answered = answers_by_question(answer, questions)
        DEDUPE_BATCHES.inc()
        BATCHED_QUESTIONS.inc(len(answered))
        alone = [p for i, p in enumerate(batch) if i not in answered]
        for i, p in enumerate(batch):
            if i in answered and not p.answer.done():
                p.answer.set_result(answered[i])
        if alone:
            log.info("%d of %d batched dedupe questions unanswered; asking them alone", len(alone), len(batch))
            await asyncio.gather(*(_settle(p.answer, p.forward) for p in alone))


async def _settle(answer: asyncio.Future[dict[str, Any]], forward: Forward) -> None:
    try:
        result = await forward()
    except Exception as exc:  # noqa: BLE001 - handed to the question's caller
        if not answer.done():
            answer.set_exception(exc)
        return
    if not answer.done():
        answer.set_result(result)
