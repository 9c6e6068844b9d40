"""Bench only: a graphiti ``LLMClient`` that answers extraction prompts with LoCoMo's own facts.

Why: the offline rules client (``RulesExtractorClient``) extracts few and shallow facts, so the
graph half of engram's recall cannot be judged with it. LoCoMo ships, per session, hand-checked
``observation`` entries ("Caroline attended an LGBTQ support group ...", citing dia id D1:3):
facts of the quality a good LLM would extract. This client answers graphiti's extraction prompts
for a turn with the observations that cite that turn's messages, so recall is measured over
LLM-grade facts with no model at hand. It is never a product default: nothing under engram/ or
services/ imports bench/.

Which prompts it answers itself (dispatch on ``response_model.__name__``, as the rules client does):

* ``CombinedExtraction`` (``extract_nodes_and_edges.extract_message``, the pipeline's default
  pass): entities and facts of ``<CURRENT MESSAGES>``; ``[Episode N]`` sections get their own
  episode index, ``[CONTEXT EPISODE]`` sections and PREVIOUS MESSAGES are never extracted from;
* ``ExtractedEntities`` (``extract_nodes.*``, the separate and chunked paths): the speakers and
  targets of the observations of ``<CURRENT MESSAGE>``;
* ``ExtractedEdges`` (``extract_edges.edge``): those observations whose two endpoints are in the
  prompt's ``<ENTITIES>`` list (the chunked path asks per group of entities).

The combined answer also carries what engram's prompt asks of each fact (its dates, the known facts
it restates or replaces) and names a known entity by its known name, answered by the rules model's
own rules (``answer_turn_context``), as
the rules model answered graphiti's separate timestamp and resolve_edge calls for them before.

Everything else (dedupe_nodes, dedupe_edges.resolve_edge, timestamps, the summary gate,
session summaries) goes to the wrapped rules client, so dedupe, invalidation and summaries run as
they do offline.

The turn -> dia ids mapping: a message of the conversation is in the prompt's turn when its text
(``engram.publishing.ingest.locomo_text``, as ``engram ingest --format locomo`` and the bench publish it;
whitespace normalised) follows a ``": "`` (the ``role (Name): text`` layout of an episode) and
ends at the end of the block or before whitespace. When messages of several conversations match
(short texts repeat), the conversation with the most matched messages wins (ties: file order).

Each observation becomes one fact: its text verbatim is the fact, its speaker the source entity,
and the target (:func:`target_of`) is chosen by a cheap deterministic rule:
1. the longest run of capitalised words that is not the speaker and not the fact's first word
   (a sentence starts capitalised): proper names are the most specific thing a fact names;
2. else the first noun phrase after the speaker's name introduced by a determiner or possessive
   ("a", "the", "her", ...): up to 3 words, ending at a function word or punctuation;
3. else the speaker itself (a self-referencing fact, which graphiti's prompt allows).
Limits: no parser, so the target can be a modifier ("LGBTQ" of "LGBTQ support group" when the
name comes first by rule 1), a time word, or miss the real object; a fact that starts with
another entity's name loses it (rule 1 skips the first word). A name graphiti's database cannot
take (``safe_entity_name``) falls through to the next rule. The relation type is the word after
the speaker's name ("ATTENDED", "IS"), else ``RELATES_TO``.
Turns whose messages no observation cites get no facts: this is LoCoMo's facts, not a model.
An observation citing messages of two turns is emitted with each; graphiti's edge dedupe merges
the restatement (same text) and the fact's episodes then cover both turns.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from graphiti_core.llm_client.config import ModelSize
from pydantic import BaseModel

from engram.publishing.ingest import locomo_text
from engram.models.delegating import DelegatingLLMClient
from engram.models.rules_llm import RulesExtractorClient
from engram.models.rules_llm.prompts import _block, _literal, answer_turn_context
from engram.services.extractor.pipeline import safe_entity_name

_DIA_ID = re.compile(r"D:?(\d+):(\d+)")
_OBSERVATION_KEY = re.compile(r"^session_(\d+)_observation$")
_SECTION = re.compile(r"^\[(?:Episode (\d+)|CONTEXT EPISODE)\][^\n]*$", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z0-9][\w'\u2019&.-]*")
# may sit inside a capitalised run ("Bank of America", "Lord of the Rings")
_CONNECTORS = {"of", "the", "and", "&", "de", "la", "del", "von", "van"}
_DETERMINERS = {"a", "an", "the", "her", "his", "their", "its", "my", "our", "your", "some", "several", "two", "three"}
# capitalised, but a date, not a thing: never a target by rule 1
_CALENDAR = {"monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday", "january", "february",
             "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"}
_STOP = {
    "a", "an", "the", "and", "or", "but", "of", "to", "in", "on", "at", "for", "with", "from", "by", "as", "about",
    "into", "after", "before", "during", "over", "since", "which", "that", "who", "because", "while", "when",
    "last", "this", "next", "recently", "yesterday", "today", "tomorrow", "ago", "is", "was", "are", "were",
    "has", "have", "had", "be", "been", "to", "it", "her", "his", "their", "them", "she", "he", "they",
    "year", "years", "month", "months", "week", "weeks", "day", "days", "lot", "time",
}
EXTRACTION_MODELS = ("CombinedExtraction", "ExtractedEntities", "ExtractedEdges")


def _norm(text: str) -> str:
    return " ".join(text.split())


def _possessive(word: str) -> str:
    return re.sub(r"['\u2019]s?$", "", word)


@dataclass(frozen=True)
class Observation:
    sample: str
    speaker: str
    fact: str
    dia_ids: tuple[str, ...]


def observations_of(conversation: dict) -> list[Observation]:
    """LoCoMo's ``observation`` of one conversation: session_N_observation -> {speaker: [[fact,
    dia id or list of dia ids], ...]}; malformed ids ("D8:6; D9:17") give every well-formed id."""
    sample = conversation.get("sample_id", "conv")
    out: list[Observation] = []
    sessions = sorted(((int(m.group(1)), v) for k, v in (conversation.get("observation") or {}).items()
                       if (m := _OBSERVATION_KEY.match(k)) and isinstance(v, dict)), key=lambda x: x[0])
    for _, by_speaker in sessions:
        for speaker, entries in by_speaker.items():
            for entry in entries or []:
                if not isinstance(entry, (list, tuple)) or len(entry) < 2 or not str(entry[0]).strip():
                    continue
                cited = entry[1] if isinstance(entry[1], list) else [entry[1]]
                ids = tuple(dict.fromkeys(f"D{s}:{t}" for raw in cited for s, t in _DIA_ID.findall(str(raw))))
                if ids:
                    out.append(Observation(sample, str(speaker), _norm(str(entry[0])), ids))
    return out


def target_of(fact: str, speaker: str) -> str:
    """The target entity of an observation (rules in the module docstring)."""
    words = [m.group(0).rstrip(".") for m in _WORD.finditer(fact)]
    speaker_key = speaker.casefold()

    def is_speaker(name: str) -> bool:
        return _possessive(name).casefold() == speaker_key

    # 1. the longest capitalised run (not the first word, not the speaker)
    runs: list[list[str]] = []
    current: list[str] = []
    for i, w in enumerate(words):
        capital = i > 0 and w[:1].isupper() and w != "I"
        if capital:
            current.append(w)
        elif current and w.lower() in _CONNECTORS and i + 1 < len(words) and words[i + 1][:1].isupper():
            current.append(w)
        else:
            if current:
                runs.append(current)
            current = []
    if current:
        runs.append(current)
    candidates = []
    for run in runs:
        while run and run[-1].lower() in _CONNECTORS:
            run = run[:-1]
        name = _possessive(" ".join(run)) if run else ""
        if name and not is_speaker(name) and safe_entity_name(name) and name.casefold() not in _CALENDAR:
            candidates.append(name)
    if candidates:
        return max(candidates, key=lambda n: (len(n.split()), -candidates.index(n)))
    # 2. the first determiner phrase after the speaker's name
    start = next((i + 1 for i, w in enumerate(words) if is_speaker(w)), 0)
    for i in range(start, len(words)):
        if words[i].lower() in _DETERMINERS:
            phrase: list[str] = []
            for w in words[i + 1:i + 4]:
                if w.lower() in _STOP or w.lower() in _DETERMINERS:
                    break
                phrase.append(w)
            name = " ".join(phrase)
            if phrase and safe_entity_name(name) and not is_speaker(name):
                return name
    # 3. a self-referencing fact
    return speaker


def relation_of(fact: str, speaker: str) -> str:
    m = re.search(rf"\b{re.escape(speaker)}(?:['\u2019]s)?\s+([a-z]+)", fact)
    return m.group(1).upper() if m else "RELATES_TO"


@dataclass(frozen=True)
class Fact:
    source: str
    target: str
    relation: str
    fact: str


class ReferenceFactsClient(DelegatingLLMClient):
    """Extraction prompts answered with LoCoMo observations; every other prompt by ``inner``
    (default: a fresh ``RulesExtractorClient``). ``answered`` counts the prompts answered here
    by response model, ``matched_turns`` / ``unmatched_turns`` the extraction prompts whose turn
    was / was not found among the conversations' messages (a bench checks the latter stays 0)."""

    def __init__(self, conversations: Iterable[dict], inner: Any = None) -> None:
        super().__init__(inner if inner is not None else RulesExtractorClient())
        self.by_text: dict[str, list[tuple[str, str]]] = defaultdict(list)  # normalised text -> (sample, dia id)
        self.by_message: dict[tuple[str, str], list[Observation]] = defaultdict(list)
        for conversation in conversations:
            sample = conversation.get("sample_id", "conv")
            for key, turns in (conversation.get("conversation") or {}).items():
                if re.fullmatch(r"session_\d+", key) and isinstance(turns, list):
                    for turn in turns:
                        text = _norm(locomo_text(turn))
                        if text and turn.get("dia_id"):
                            self.by_text[text].append((sample, str(turn["dia_id"])))
            for obs in observations_of(conversation):
                for dia in obs.dia_ids:
                    self.by_message[(sample, dia)].append(obs)
        self.answered: dict[str, int] = defaultdict(int)
        self.matched_turns = 0
        self.unmatched_turns = 0

    # -- the turn and its facts ---------------------------------------------------------------
    def messages_in(self, block: str) -> list[tuple[str, str]]:
        """(sample, dia id) of the conversation messages whose text is a message of ``block``."""
        text = _norm(block)
        found: dict[str, list[str]] = defaultdict(list)
        for message, owners in self.by_text.items():
            at = text.find(": " + message)
            while at >= 0:
                end = at + 2 + len(message)
                if end == len(text) or text[end] == " ":
                    for sample, dia in owners:
                        found[sample].append(dia)
                    break
                at = text.find(": " + message, at + 1)
        if not found:
            return []
        best = max(found, key=lambda s: len(set(found[s])))  # dict order = file order on ties
        return [(best, dia) for dia in dict.fromkeys(found[best])]

    def facts_for(self, block: str) -> list[Fact]:
        messages = self.messages_in(block)
        if messages:
            self.matched_turns += 1
        else:
            self.unmatched_turns += 1
        seen: dict[Observation, None] = {}
        for key in messages:
            for obs in self.by_message.get(key, []):
                seen.setdefault(obs)
        return [Fact(o.speaker, target_of(o.fact, o.speaker), relation_of(o.fact, o.speaker), o.fact) for o in seen]

    @staticmethod
    def sections(block: str) -> list[tuple[int, str]]:
        """(episode index, text) of a CURRENT MESSAGES block; [CONTEXT EPISODE] parts dropped."""
        marks = list(_SECTION.finditer(block))
        if not marks:
            return [(0, block)]
        out = []
        for i, m in enumerate(marks):
            end = marks[i + 1].start() if i + 1 < len(marks) else len(block)
            if m.group(1) is not None:
                out.append((int(m.group(1)), block[m.end():end]))
        return out

    # -- answers ------------------------------------------------------------------------------
    def combined(self, prompt: str) -> dict[str, Any]:
        entities: dict[str, None] = {}
        edges: dict[tuple[str, str, str], dict[str, Any]] = {}
        for index, text in self.sections(_block(prompt, "CURRENT MESSAGES") or ""):
            for f in self.facts_for(text):
                entities.setdefault(f.source)
                entities.setdefault(f.target)
                edge = edges.setdefault((f.source, f.target, f.fact), {
                    "source_entity_name": f.source, "target_entity_name": f.target, "relation_type": f.relation,
                    "fact": f.fact, "episode_indices": []})
                edge["episode_indices"].append(index)
        # the facts' dates and their relations to the prompt's known facts, as the rules model
        # answers them (and answered graphiti's separate calls for them before)
        return answer_turn_context(prompt, {"extracted_entities": [{"name": n, "entity_type_id": 0} for n in entities],
                                            "edges": list(edges.values())})

    def entities(self, prompt: str) -> dict[str, Any]:
        block = _block(prompt, "CURRENT MESSAGE") or ""
        names: dict[str, list[int]] = {}
        for index, text in self.sections(block):
            for f in self.facts_for(text):
                for name in (f.source, f.target):
                    names.setdefault(name, [])
                    if index not in names[name]:
                        names[name].append(index)
        return {"extracted_entities": [{"name": n, "entity_type_id": 0, "episode_indices": i} for n, i in names.items()]}

    def edges(self, prompt: str) -> dict[str, Any]:
        given = _literal(_block(prompt, "ENTITIES")) or []
        known = {str(item["name"]).casefold(): str(item["name"]) for item in given
                 if isinstance(item, dict) and isinstance(item.get("name"), str)} if isinstance(given, list) else {}
        edges = []
        for index, text in self.sections(_block(prompt, "CURRENT_MESSAGE") or ""):
            for f in self.facts_for(text):
                source, target = known.get(f.source.casefold()), known.get(f.target.casefold())
                if source and target:
                    edges.append({"source_entity_name": source, "target_entity_name": target,
                                  "relation_type": f.relation, "fact": f.fact, "valid_at": None, "invalid_at": None,
                                  "episode_indices": [index]})
        return {"edges": edges}

    async def generate_response(  # type: ignore[override]
        self,
        messages: list[Any],
        response_model: type[BaseModel] | None = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        group_id: str | None = None,
        prompt_name: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        name = response_model.__name__ if response_model is not None else ""
        if name not in EXTRACTION_MODELS:
            return await super().generate_response(messages, response_model, max_tokens, model_size, group_id,
                                                   prompt_name, **kwargs)
        prompt = "\n".join(m.content for m in messages if m.role != "system")
        answer = {"CombinedExtraction": self.combined, "ExtractedEntities": self.entities,
                  "ExtractedEdges": self.edges}[name](prompt)
        self.answered[name] += 1
        return response_model.model_validate(answer).model_dump(mode="json")  # type: ignore[union-attr]
