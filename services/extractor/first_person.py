"""A fact the model wrote in its speaker's own words, put in the third person.

Small models often copy a speaker's line as the fact: "I enjoy reading.", "I won my first video
game tournament last week!" (Qwen2.5-Coder-1.5B, 22 of 152 facts in one 60-turn LoCoMo run), and
sometimes on the other speaker's entity pair. Such a fact does not stand alone (the extraction
prompt asks that it does): stored, "I" names nobody, it matches no fact written about the speaker
("Joanna enjoys reading."), and graphiti's dedupe questions about it and its copies go to the model.

The first person of a line is its speaker, and the turn says who spoke which line ("user
(Joanna): ..."): :func:`facts_in_third_person` rewrites a fact that opens in the first person
singular ("I", "I'm", "My", ...) with the name of the speaker of the line holding the most of its
words, at least :data:`LINE_SHARE` of them (the turn's lines and its PREVIOUS MESSAGES'), by the
offline rules model's own grammar (:func:`engram.models.rules_llm.facts.third_person`:
"I enjoy" -> "Joanna enjoys", "my" -> "Joanna's"). A fact put on another speaker as its source is
moved to the line's speaker (the actor is the source), unless that speaker is its target.
"we"/"our" are kept (they include others), and so are "Me too! ..." (a reaction), a fact that only
quotes a line inside it ("Melanie said 'I'm swamped'"), a fact no line holds enough of, and every
fact of a turn whose speakers are not named.

:class:`ThirdPersonLLMClient` applies it to the combined extraction's answer (engram's prompt,
services/extractor/extraction_prompt.py) before anything reads it, so the rest of the turn (dates,
the dedupe answers of services/extractor/local_answers.py, graphiti) sees the rewritten fact.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter

from engram.models.delegating import DelegatingLLMClient, Forward
from engram.models.rules_llm.facts import third_person
from engram.services.extractor.extraction_prompt import PROMPT_NAME as EXTRACTION_PROMPT
from engram.services.extractor.extraction_prompt import turn_in
from engram.services.extractor.local_answers import turn_speakers

FIRST_PERSON_FACTS = Counter(
    "engram_extractor_first_person_facts_total",
    "Facts the model wrote in a speaker's own words (\"I ...\"), rewritten in the third person.",
)

#: a fact that opens in the first person singular (after any quote mark or dash); not "Me too!",
#: a reaction to the other speaker, nor "I/O"
_OPENS_FIRST_PERSON = re.compile(r"^\W*(?:I(?:['’](?:m|ve|d|ll))?|My)(?![\w'’/-])")
_WORD = re.compile(r"[\w'’]+", re.UNICODE)


def _words(text: str) -> set[str]:
    return {w.casefold() for w in _WORD.findall(text) if len(w) > 2}


#: the share of a fact's words its line must hold: a fact that only shares a few words with a
#: line (a remark about another speaker's news) is not that speaker's line
LINE_SHARE = 0.6


def line_speaker(fact: str, lines: list[tuple[str, str]], source: str | None = None) -> str | None:
    """The speaker of the line that holds the largest share of ``fact``'s words, at least
    :data:`LINE_SHARE` (the fact's ``source`` on a tie it is part of, else the first such line);
    None when no line holds that much."""
    words = _words(fact)
    if not words:
        return None
    best: dict[str, float] = {}
    for speaker, said in lines:
        best[speaker] = max(best.get(speaker, 0.0), len(words & _words(said)) / len(words))
    top = max(best.values(), default=0.0)
    if top < LINE_SHARE:
        return None
    tied = [s for s, share in best.items() if share == top]
    return source if source in tied else tied[0]


def facts_in_third_person(answer: dict[str, Any], turn: str,
                          previous: Sequence[str] = ()) -> tuple[dict[str, Any], int]:
    """``answer`` (the combined extraction's: ``extracted_entities`` and ``edges``) with each fact
    that opens in the first person singular rewritten for its line's speaker (module docstring),
    and how many were. The lines are the turn's and the ``previous`` turns' (a small model copies
    a line of PREVIOUS MESSAGES too). The answer given is not changed."""
    edges = answer.get("edges") if isinstance(answer, dict) else None
    lines = [line for text in (turn, *previous) for line in turn_speakers(text)]
    if not isinstance(edges, list) or not lines:
        return answer, 0
    speakers = {s for s, _ in lines}
    entities = answer.get("extracted_entities")
    names = {e.get("name") for e in entities if isinstance(e, dict)} if isinstance(entities, list) else set()
    out = copy.deepcopy(answer)
    rewritten = 0
    for edge in out["edges"]:
        fact = edge.get("fact") if isinstance(edge, dict) else None
        if not isinstance(fact, str) or not _OPENS_FIRST_PERSON.match(fact):
            continue
        source, target = edge.get("source_entity_name"), edge.get("target_entity_name")
        speaker = line_speaker(fact, lines, source)
        if speaker is None:
            continue
        edge["fact"] = third_person(fact, speaker)
        rewritten += 1
        # the actor is the source: the line's speaker, not the other speaker it was put on
        if source in speakers and source != speaker and target != speaker and speaker in names:
            edge["source_entity_name"] = speaker
    return out, rewritten


class ThirdPersonLLMClient(DelegatingLLMClient):
    """Rewrites the combined extraction's first-person facts (:func:`facts_in_third_person`);
    every other call and answer passes unchanged. Sits under services/extractor/local_answers.py's
    client, so the extraction's dates and dedupe answers are keyed by the rewritten facts."""

    async def around(self, forward: Forward, messages: list[Any], prompt: str) -> dict[str, Any]:
        answer = await forward()
        turn = turn_in(messages) if prompt == EXTRACTION_PROMPT else None
        if turn is None:
            return answer
        answer, n = facts_in_third_person(answer, *turn)
        if n:
            FIRST_PERSON_FACTS.inc(n)
        return answer
