"""Answers engram gives itself instead of a model call (issue 25, item 6: one model call per turn).

graphiti-core's stage functions make small follow-up calls after the extraction: the combined
extraction dates its facts in a batched ``extract_edges.extract_timestamps_batch`` call, and
``resolve_extracted_edges`` asks ``dedupe_edges.resolve_edge`` for every fact with any candidate
(same-pair facts or whatever the group's hybrid search returns). graphiti-core is kept
unmodified, so :class:`LocalAnswersLLMClient` sits between graphiti and the model (outside the
accounting wrapper, so what it answers is not counted as a call) and answers what engram can:

* **timestamps**: a fact whose only date words are ones engram resolves itself
  (:func:`engram.models.rules_llm.dates.fact_timestamps`: ISO and written dates, "in 2019", and
  the relative expressions of :mod:`engram.text.temporal` against the fact's reference time), or that
  has no date word at all (valid_at = its reference time: graphiti's prompt's rule for an
  ongoing fact, and what the pipeline gives an undated fact anyway) is dated here. Only facts
  with a time expression engram does not resolve ("on Friday", "recently", "since college",
  "no longer", "until the launch") are sent to the model, in one batch of those facts only; none
  left, no call. Any date word outside the resolved spans sends the fact to the model
  (:data:`TIME_WORDS`: broad on purpose, a false alarm costs a call, a miss a wrong date);
* **edge dedupe**: the call is made only when some candidate is close enough to the new fact to
  be a duplicate or a contradiction of it: content-word overlap (:func:`fact_similarity`) at or
  above :data:`DEDUPE_SIMILARITY`, chosen on the labelled pairs of ``bench/data/fact_changes.jsonl``
  (tuning split; ``bench/dedupe_threshold.py`` reports the held-out split). Below it the
  answer is "no duplicate, nothing contradicted", which is what graphiti itself concludes with
  no candidate at all;
* the same edge dedupe question twice in a turn (one fact text on several entity pairs, with
  the same candidates) is asked once;
* **node dedupe**: skipped only when every candidate of every entity is a possessive of it or
  it of the candidate ("Melanie's husband" / "Melanie"): something of X is never X. Nothing
  looser: the hard cases ("NYC" / "New York City", "Marco's car" / "Marco's vehicle") share no
  word, so a lexical threshold would skip the calls that matter.

Partial (issue 25, item 6): node dedupe is otherwise not gated (no labelled entity pairs), and the
extraction prompt itself is graphiti's, so neither 1.0 call per turn nor 0.15x upstream tokens is
met (docs/architecture.md, "Fewer model calls per turn").

The model's answer for the facts it is asked about is used as is; an answer of the wrong
length is padded with nulls (graphiti then keeps the fact undated, as it does for a failed
batch).
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import re
from datetime import datetime, timezone
from typing import Any

from graphiti_core.llm_client.client import LLMClient
from graphiti_core.prompts import prompt_library
from prometheus_client import Counter

from engram.models.delegating import DelegatingLLMClient, Forward
from engram.models.rules_llm.dates import _parse_datetime, fact_timestamps, find_dates

log = logging.getLogger("engram.extractor")

TIMESTAMPS_PROMPT = "extract_edges.extract_timestamps_batch"
EDGE_DEDUPE_PROMPT = "dedupe_edges.resolve_edge"
NODE_DEDUPE_PROMPT = "dedupe_nodes.nodes"

LOCAL_ANSWERS = Counter(
    "engram_extractor_local_answers_total",
    "Model questions engram answered itself instead of a call: dated facts, dedupe calls skipped.",
    ["kind"],
)

#: Time words outside the spans engram resolves: their fact goes to the model. Broad on purpose.
TIME_WORDS = re.compile(
    r"\b(?:(?:mon|tues|wednes|thurs|fri|satur|sun)days?|weekends?|jan(?:uary)?|feb(?:ruary)?|mar(?:ch)?"
    r"|apr(?:il)?|june?|july?|aug(?:ust)?|sept?(?:ember)?|oct(?:ober)?|nov(?:ember)?|dec(?:ember)?"
    r"|spring|summer|autumn|fall|winter|seasons?|(?:19|20)\d{2}s?|\d{1,2}[/.]\d{1,2}(?:[/.]\d{2,4})?"
    r"|days?|nights?|weeks?|months?|years?|decades?|hours?|minutes?|mornings?|evenings?|afternoons?"
    r"|yesterday|today|tonight|tomorrow|ago|since|until|till|through|thru|before|after|during"
    r"|recent(?:ly)?|lately|earlier|later|soon|former(?:ly)?|previous(?:ly)?|anymore|any more|no longer"
    r"|used to|last|next|stopped|quit|ended|ends|expires?|expired|retired|christmas|easter|holidays?"
    r"|vacation|semester|quarter|q[1-4]|deadline|due"
    r"|dün|bugün|yarın|geçen|gecen|gelecek|hafta|önce|sonra|yıl|sene)\b",
    re.IGNORECASE,
)


#: a frequency ("each day", "every Friday", "twice a week") dates nothing: not a reason to ask
_FREQUENCY = re.compile(
    r"\b(?:each|every|per|a|an)\s+(?:single\s+)?(?:(?:mon|tues|wednes|thurs|fri|satur|sun)day|day|night|week"
    r"|weekend|month|year|morning|evening|afternoon|hour)\b",
    re.IGNORECASE,
)


def _outside(text: str, spans: list[tuple[int, int]]) -> str:
    parts, pos = [], 0
    for start, end in sorted(spans):
        parts.append(text[pos:start])
        pos = max(pos, end)
    parts.append(text[pos:])
    return " ".join(parts)


def local_timestamps(fact: str, reference: datetime | None) -> tuple[str | None, str | None] | None:
    """(valid_at, invalid_at) as ISO strings for ``fact`` said at ``reference``, or None when it
    holds a time expression engram does not resolve (the model is asked)."""
    if reference is None:
        return None
    hits = find_dates(fact, reference)
    if TIME_WORDS.search(_FREQUENCY.sub(" ", _outside(fact, [(h.start, h.end) for h in hits]))):
        return None
    if not hits:
        return reference.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), None
    return fact_timestamps(fact, reference)


def _literal(text: str) -> Any:
    """A prompt block's list: JSON (``to_prompt_json``) or a Python repr (graphiti formats some
    blocks, e.g. resolve_edge's candidates, with an f-string of the list). None if neither."""
    try:
        return json.loads(text)
    except ValueError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return None


_FACTS = re.compile(r"<FACTS>\s*(.*?)\s*</FACTS>", re.S)


def _prompt_facts(messages: list[Any]) -> list[dict[str, Any]] | None:
    """The facts of graphiti's batch timestamp prompt (``<FACTS>`` JSON), None if unreadable."""
    for message in reversed(messages):
        m = _FACTS.search(str(getattr(message, "content", "")))
        if m:
            facts = _literal(m.group(1))
            return facts if isinstance(facts, list) and all(isinstance(f, dict) for f in facts) else None
    return None


_WORD = re.compile(r"[\w'’]+", re.UNICODE)
_STOP = frozenset(
    "a an the and or but of to in on at for with by from as is are was were be been being has have had do does "
    "did not no it its this that these those there here he she they we i you me him her them us my our your "
    "his their theirs mine ours yours who whom which what than then so if about into over up down out off "
    "also just very can could will would shall should may might must now".split()
)


def _content_words(text: str) -> set[str]:
    words = set()
    for w in _WORD.findall(text.casefold().replace("’", "'")):
        w = w.removesuffix("'s").strip("'")
        if w and w not in _STOP:
            words.add(w[:4])  # a crude stem: "moved"/"moving", "swims"/"swimming"
    return words


def fact_similarity(a: str, b: str) -> float:
    """Content-word overlap of two facts: shared words / the smaller fact's words (stopwords
    dropped, words cut to 4 letters). 0 when either has no content word."""
    wa, wb = _content_words(a), _content_words(b)
    if not wa or not wb:
        return 0.0
    return len(wa & wb) / min(len(wa), len(wb))


#: Edge dedupe is asked only when a candidate is at least this close (bench/dedupe_threshold.py:
#: the lowest similarity of a change or restatement pair of the tuning split, 1/3, rounded down to
#: 0.3; held-out: 35/35 needed calls kept, 9/15 unneeded ones skipped).
DEDUPE_SIMILARITY = 0.3


def _dedupe_context(messages: list[Any]) -> tuple[str, list[str]] | None:
    """(new fact, candidate facts) of graphiti's ``resolve_edge`` prompt, None if unreadable."""
    text = "\n".join(str(getattr(m, "content", "")) for m in messages)
    new = re.search(r"<NEW FACT>\s*(.*?)\s*</NEW FACT>", text, re.S)
    if not new:
        return None
    candidates: list[str] = []
    for block in ("EXISTING FACTS", "FACT INVALIDATION CANDIDATES"):
        m = re.search(rf"<{block}>\s*(.*?)\s*</{block}>", text, re.S)
        if not m:
            return None
        rows = _literal(m.group(1))
        if not isinstance(rows, list):
            return None
        candidates += [str(r.get("fact", "")) for r in rows if isinstance(r, dict)]
    return new.group(1), candidates


_POSSESSIVE = re.compile(r"^(.+?)['’]s?\s+\S")


def _possessor(name: str) -> str | None:
    m = _POSSESSIVE.match(name.strip())
    return m.group(1).strip().casefold() if m else None


def possessive_of(a: str, b: str) -> bool:
    """True when one name is a possessive of the other: "Melanie's kids" and "Melanie"."""
    return _possessor(a) == b.strip().casefold() or _possessor(b) == a.strip().casefold()


def _node_dedupe_context(messages: list[Any]) -> tuple[list[dict[str, Any]], list[str]] | None:
    """(entities, candidate names) of graphiti's ``dedupe_nodes.nodes`` prompt, None if unreadable."""
    text = "\n".join(str(getattr(m, "content", "")) for m in messages)
    blocks = []
    for block in ("ENTITIES", "EXISTING ENTITIES"):
        m = re.search(rf"<{block}>\s*(.*?)\s*</{block}>", text, re.S)
        rows = _literal(m.group(1)) if m else None
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            return None
        blocks.append(rows)
    entities, existing = blocks
    if not all(isinstance(e.get("id"), int) and isinstance(e.get("name"), str) for e in entities):
        return None
    return entities, [str(c.get("name", "")) for c in existing]


class LocalAnswersLLMClient(DelegatingLLMClient):
    """Answers the questions engram can answer itself (module docstring); forwards the rest.

    ``dedupe_similarity`` None: every dedupe question goes to the model."""

    def __init__(self, inner: LLMClient, *, dedupe_similarity: float | None = DEDUPE_SIMILARITY) -> None:
        super().__init__(inner)
        self.dedupe_similarity = dedupe_similarity
        self.answered: dict[str, int] = {}
        self._asked: dict[str, asyncio.Future[dict[str, Any]]] = {}  # one per extract_episode: a turn's questions

    def _count(self, kind: str, n: int = 1) -> None:
        if n:
            self.answered[kind] = self.answered.get(kind, 0) + n
            LOCAL_ANSWERS.labels(kind=kind).inc(n)

    async def around(self, forward: Forward, messages: list[Any], prompt: str) -> dict[str, Any]:
        if prompt == TIMESTAMPS_PROMPT:
            facts = _prompt_facts(messages)
            if facts is not None:
                return await self._timestamps(facts, forward, messages)
        elif prompt == EDGE_DEDUPE_PROMPT:
            context = _dedupe_context(messages) if self.dedupe_similarity is not None else None
            if context is not None:
                new, candidates = context
                if max((fact_similarity(new, c) for c in candidates), default=0.0) < self.dedupe_similarity:
                    self._count("edge_dedupe_skipped")
                    return {"duplicate_facts": [], "contradicted_facts": []}
            # the same question asked again in this turn (one fact text on several entity pairs,
            # the same candidates in the same order) gets the first one's answer
            key = "\n".join(str(getattr(m, "content", "")) for m in messages)
            task = self._asked.get(key)
            if task is None:
                task = self._asked[key] = asyncio.ensure_future(forward())
            else:
                self._count("edge_dedupe_shared")
            return dict(await asyncio.shield(task))
        elif prompt == NODE_DEDUPE_PROMPT:
            nodes = _node_dedupe_context(messages)
            if nodes is not None:
                entities, candidates = nodes
                if all(possessive_of(e["name"], c) for e in entities for c in candidates):
                    self._count("node_dedupe_skipped")
                    return {"entity_resolutions": [{"id": e["id"], "name": e["name"], "duplicate_candidate_id": -1}
                                                   for e in entities]}
        return await forward()

    async def _timestamps(self, facts: list[dict[str, Any]], forward: Forward, messages: list[Any]) -> dict[str, Any]:
        answers: list[dict[str, Any] | None] = []
        asked: list[int] = []
        for i, item in enumerate(facts):
            local = local_timestamps(str(item.get("fact", "")), _parse_datetime(str(item.get("reference_time") or "")))
            if local is None:
                asked.append(i)
                answers.append(None)
            else:
                answers.append({"valid_at": local[0], "invalid_at": local[1]})
        self._count("fact_dated", len(facts) - len(asked))
        if asked:
            # graphiti builds the list for this call only (and its client edits it): the same
            # prompt, holding only the facts engram could not date
            messages[:] = prompt_library.extract_edges.extract_timestamps_batch({"facts": [facts[i] for i in asked]})
            response = await forward()
            rows = response.get("timestamps") if isinstance(response, dict) else None
            rows = rows if isinstance(rows, list) else []
            if len(rows) != len(asked):
                log.warning("timestamp answer for %d facts had %d rows", len(asked), len(rows))
            for i, row in zip(asked, [*rows, *[None] * len(asked)], strict=False):
                answers[i] = row if isinstance(row, dict) else {"valid_at": None, "invalid_at": None}
        return {"timestamps": answers}
