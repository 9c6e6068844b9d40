"""Changes: a later fact that says an earlier one stopped holding (issue 11, item 6).

:func:`supersedes` answers "does NEW make OLD false because something changed?" for graphiti's
``dedupe_edges.resolve_edge`` prompt (:mod:`.dedupe` calls it for every existing fact and
invalidation candidate). It reads change phrases in NEW (:func:`find_changes`):

* ``replacement``, the replaced value X named: "switched/moved/migrated/changed/ported/converted
  (S) from X to Y", "replaced X with/by Y", "X was replaced by Y", "swapped/traded/ditched/
  dropped X for Y", "X ... in favour of Y", "Y instead of / rather than / in place of X", and,
  in a fact that says "now"/"currently", "Y now, not X" (:data:`CONTRAST`). When Y comes before
  the cue it is read two ways: the words right before it ("Sam uses *Emacs* instead of Vim"; a
  value after a preposition from there on, "is in *Cascais* instead of ..."), or the words before
  the clause's first relation verb when the value was made the subject ("*Podman* runs our
  containers instead of Docker", the words after the verb then being subject and context);
* ``switch``, X not named: "switched/moved/migrated/ported/converted/upgraded/relocated S
  (over) to/onto Y", "S switched/moved/migrated (over) to Y";
* ``ending``: "no longer", "not/n't ... any more/anymore", "stopped", "quit", "gave up", "left",
  "got rid of" (in the clause that holds the cue).

and decides with word overlap (crude stems of content words, :func:`.text._content_stems`):

* replacement: X's words all occur in OLD, X is not part of Y, and NEW's remaining content
  words (the subject and context: "the billing service", "in the frontend"; relation verbs, time
  words and the change phrase removed) all occur in OLD;
* switch: OLD does not already hold Y (else it is a restatement: "we moved the frontend to
  React in 2023" after "the frontend is built with React"), NEW's remaining content words are
  not empty and all occur in OLD (so "Maya's brother moved to Berlin" does not end "Maya lives
  in Lisbon", nor "we switched the search service to OpenSearch" end "the billing service uses
  Postgres 15"), and OLD holds a value (a relation verb of :data:`RELATION_VERBS` or a copula)
  that it names and NEW lacks (a capitalised word past the first, a known tool or library, or a
  number; weekdays and months are no values): the value being replaced;
* ending: OLD carries no ending/negation cue (a contrast, "..., not Docker", is none) and the cue
  clause's content words (cues and time words removed, relation verbs kept: "Caroline no longer
  lives in Boston" does not end "Caroline likes Boston") are at least two and all occur in OLD
  ("Lena quit swimming" ends "Lena swims at ...": :func:`.text._stem` undoubles "swimm").

Known limits: English only; a switch of S ends every fact about S that names another value
through a relation verb ("the billing service sends invoices via Stripe" is ended by "we switched
the billing service to SQLite"); paraphrased subjects ("the DB" for "the database", "Postgres" for
"PostgreSQL") are not matched; a change in a lower-case value needs the value named in NEW
("switched from vim to emacs") unless OLD names it with a capital or a known tool word; a
subject NEW leaves implicit ("we switched to SQLite" with no subject) ends nothing; a relation
verb in NEW that OLD words differently is tolerated only when it is in :data:`RELATION_VERBS`;
a new value made the subject is found only before such a verb ("Keycloak handles our logins
instead of Auth0" ends nothing); "Y, not X" without "now" is no change.
Measured on ``bench/data/fact_changes.jsonl`` by ``bench/fact_changes.py`` (docs/architecture.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from engram.models.rules_llm.entities import _tech_category
from engram.models.rules_llm.text import _content_stems, _stem
from engram.models.rules_llm.vocabulary import MONTHS, WEEKDAYS

ChangeKind = Literal["replacement", "switch", "ending"]

_VERB = (
    r"switch(?:ed|es|ing)?|migrat(?:ed|es|ing|e)|mov(?:ed|es|ing|e)|port(?:ed|s|ing)?|convert(?:ed|s|ing)?"
    r"|chang(?:ed|es|ing|e)|transition(?:ed|s|ing)?|relocat(?:ed|es|ing|e)"
)
_NO_FROM_VERB = _VERB + r"|upgrad(?:ed|es|ing|e)|downgrad(?:ed|es|ing|e)"
# where a value phrase ends: punctuation, a new clause, or a time expression
_END = (
    r"(?=\s*[.,;:!?]|\s*$| because\b| since\b| so\b| after\b| when\b| but\b| and\b| as of\b| now\b| last\b| this\b"
    r"| in (?:19|20)\d\d| (?:yesterday|today|recently|earlier)\b)"
)
_STATE_VERB = r"is|are|'s|runs?|uses?|lives?|sits?|moved|switched|migrated"
_SUBJ = r"(?P<subj>(?: (?!from\b|to\b|onto\b|with\b|by\b|for\b)[\w.'’+#-]+){0,5}?)"
_REPLACEMENT_RES = [
    re.compile(rf"\b(?:{_VERB}){_SUBJ}(?: over| back| away)? from (?P<old>.+?) (?:to|onto|for) (?P<new>.+?){_END}", re.I),
    re.compile(rf"\breplac(?:ed|es|ing|e) (?P<old>.+?) (?:with|by) (?P<new>.+?){_END}", re.I),
    re.compile(rf"(?P<old>\b[\w.+#-]+(?: [\w.+#-]+){{0,2}}) (?:was|were|is|are|has been|have been|got|gets) replaced (?:with|by) (?P<new>.+?){_END}", re.I),
    re.compile(
        rf"\b(?:swapp?(?:ed|s|ing)?|trad(?:ed|es|ing|e)|exchang(?:ed|es|ing|e)|ditch(?:ed|es|ing)?|dropp?(?:ed|s|ing)?"
        rf"|dump(?:ed|s|ing)?)(?: out)? (?P<old>.+?) (?:for|in favou?r of) (?P<new>.+?){_END}",
        re.I,
    ),
    # "dropped Memcached, the cache runs on Redis now", "we ditched Mongo, the catalog is on Postgres now"
    re.compile(
        rf"\b(?:dropp?(?:ed)?|ditch(?:ed)?|dump(?:ed)?|got rid of|retired|killed) (?P<old>[^,;]+?)\s*(?:[,;]|\band\b)\s*"
        rf"[^,;]*?\b(?:{_STATE_VERB})(?: now| currently)?(?: (?:on|in|with|through|via|to|onto))? (?P<new>[\w.+#-]+(?: [\w.+#-]+){{0,2}}?){_END}",
        re.I,
    ),
]
#: "..., not Y" naming a value ("the standups happen in Zoom now, not Google Meet"): a contrast
#: that says which value does not hold; the fact itself is not negated (:func:`negated`).
CONTRAST = re.compile(r",\s*not\s+(?=(?:(?:a|an|the|on|in|at|with|by|via|through)\s+)?(?-i:[A-Z]))", re.I)
# Replacements that name the new value Y *before* the cue, read two ways (:func:`_new_first`):
# "Y instead of / rather than / in place of X", and a contrast said to hold now, "Y now, not X"
# (only in a fact that says "now"/"currently": without it "Tom works at Globex, not Initech"
# corrects a name rather than telling a change).
_INSTEAD_RE = re.compile(rf"(?P<new>\b[\w.+#-]+(?: [\w.+#-]+){{0,2}}) (?:instead of|rather than|in place of) (?P<old>.+?){_END}", re.I)
_NOW_NOT_RE = re.compile(rf"(?P<new>\b[\w.+#-]+(?: [\w.+#-]+){{0,2}})(?: now| currently)?{CONTRAST.pattern}(?P<old>.+?){_END}", re.I)
_SWITCH_RES = [
    re.compile(rf"\b(?:{_NO_FROM_VERB}){_SUBJ}(?: over| back)? (?:to|onto) (?P<new>.+?){_END}", re.I),
]
# A state said to hold *now* (the old value not named): "billing is now on SQLite", "the cache runs
# on Redis now", "we use SQLite for billing now"; a switch when its clause says "now"/"currently".
_NOW = re.compile(r"\b(?:now|currently|these days|nowadays)\b", re.I)
_STATE_RES = [
    re.compile(rf"\b(?:is|are|'s|runs?|lives?|sits?)(?: now| currently)? (?:on|in|with|through|via|at) (?P<new>[\w.+#-]+(?: [\w.+#-]+){{0,2}}?){_END}", re.I),
    re.compile(rf"\b(?:uses?|using)(?: now| currently)? (?P<new>[\w.+#-]+(?: [\w.+#-]+){{0,2}}?)(?: for\b|{_END})", re.I),
]
_ENDING = re.compile(
    r"\b(?:no longer|any ?more|stopped|stops|quit|quits|gave up|give up|got rid of|left|leaves)\b", re.I
)
_NEGATED = re.compile(r"(?<![\w'])(?:not|never|no)(?![\w'])|n't\b|\b(?:no longer|any ?more|stopped|quit|gave up)\b", re.I)
_CLAUSE_SPLIT = re.compile(r"[;:.!?]|,| but | and (?:now |then )?(?=\w+ (?:is|are|uses?|runs?|works?)\b)", re.I)
# A value phrase stops at its first preposition: "React in the frontend" -> "React"; one that
# ends at the cue starts after its last: "is in Cascais (instead of ...)" -> "Cascais".
_VALUE_TAIL = re.compile(r" (?:in|for|on|at|as|across|within|throughout|because|since) .*$", re.I)
_VALUE_HEAD = re.compile(r"^.*\b(?:in|on|at|with|through|via|by|to|onto|for|from|as) ", re.I)

#: Relation verbs (crude stems) that say *how* a subject holds a value; NEW may word the relation
#: differently from OLD ("uses" vs "is written in"), so they are not part of the subject.
RELATION_VERBS: frozenset[str] = frozenset(_stem(w) for w in (
    "use uses used using run runs ran running built build builds written write writes wrote host hosts hosted "
    "hosting deploy deploys deployed deploying serve serves served serving store stores stored storing keep keeps "
    "kept ship shipped shipping send sends sent drive drives drove driving play plays played playing work works "
    "worked working live lives lived living based powered backed sit sits sat"
).split())
_CHANGE_WORDS: frozenset[str] = frozenset(_stem(w) for w in (
    "switch switched switches switching migrate migrated migrates migrating move moved moves moving port ported "
    "porting convert converted converting change changed changing transition transitioned relocate relocated "
    "relocating upgrade upgraded upgrading downgrade downgraded replace replaced replacing swap swapped swapping "
    "trade traded exchange exchanged ditch ditched drop dropped dump dumped instead rather place favour favor "
    "longer anymore stopped stop quit gave give got rid left leave leaves over back away from"
    # an acknowledgement before a restated change ("Noted, billing is now on SQLite")
    " noted note ok okay sure understood alright"
).split())
_TIME_WORDS: frozenset[str] = frozenset(
    {_stem(w) for w in "still now currently today yesterday recently earlier lately last next ago week weeks month months year years "
     "spring summer autumn fall winter morning evening tonight time".split()}
    | {_stem(m) for m in MONTHS} | {_stem(d) for d in WEEKDAYS}
)


#: Generic head nouns of a subject: "the billing service" and "billing" name the same thing, so a
#: switch of "the billing service" may end "we use Postgres 15 for billing" (the trial's pair). The
#: subject's other words must still all be in OLD, and at least one must remain.
_SUBJECT_HEADS: frozenset[str] = frozenset(_stem(w) for w in (
    "service services app apps application system server backend project module job pipeline stack api"
).split())


def _subject_in(context: frozenset[str], old_stems: set[str]) -> bool:
    """NEW's subject words all in OLD, generic head nouns aside (at least one specific word)."""
    specific = context - _SUBJECT_HEADS
    return bool(specific) and specific <= old_stems


@dataclass(frozen=True)
class Change:
    """One change phrase in a fact: ``old``/``new`` are the content stems of the replaced and the
    replacing value (``old`` empty when not named), ``context`` the fact's other content stems."""

    kind: ChangeKind
    old: frozenset[str]
    new: frozenset[str]
    context: frozenset[str]


def _value(text: str) -> frozenset[str]:
    return frozenset(_content_stems(_VALUE_TAIL.sub("", text)))


def _context(fact: str, *values: frozenset[str], verbs: bool = False) -> frozenset[str]:
    drop = set().union(*values) | _CHANGE_WORDS | _TIME_WORDS | (set() if verbs else RELATION_VERBS)
    return frozenset(s for s in _content_stems(fact) if s not in drop and not s.isdigit())


def _new_first(fact: str, m: re.Match[str]) -> list[Change]:
    """The replacements "Y instead of X" / "Y now, not X" may mean: Y is the words right before
    the cue ("Sam uses *Emacs* instead of Vim", "the offsite is in *Cascais* instead of ..."), or,
    when the value was made the subject, the words before the clause's first relation verb
    ("*Podman* runs our containers instead of Docker", the rest then being context)."""
    old = _value(m.group("old"))
    if not old:
        return []
    news = [frozenset(_content_stems(_VALUE_HEAD.sub("", m.group("new"))))]
    clause = re.split(r"[,;:.!?]", fact[: m.end("new")])[-1].split()
    verb = next((i for i, w in enumerate(clause) if _stem(w) in RELATION_VERBS), 0)
    news.append(frozenset(_content_stems(" ".join(clause[:verb]))))
    return [Change("replacement", old, new, _context(fact, old, new)) for new in news if new]


@lru_cache(maxsize=4096)
def find_changes(fact: str) -> tuple[Change, ...]:
    """The change phrases of ``fact`` (see the module docstring), replacements first. Cached:
    graphiti asks about one new fact against each of its candidates."""
    out: list[Change] = []
    for rx in _REPLACEMENT_RES:
        for m in rx.finditer(fact):
            old, new = _value(m.group("old")), _value(m.group("new"))
            if old and new:
                out.append(Change("replacement", old, new, _context(fact, old, new)))
    for rx in (_INSTEAD_RE, _NOW_NOT_RE):
        if rx is _NOW_NOT_RE and not _NOW.search(fact):
            continue  # "Y, not X" tells a change only with "now"
        for m in rx.finditer(fact):
            out.extend(_new_first(fact, m))
    if not out:
        for rx in _SWITCH_RES:
            for m in rx.finditer(fact):
                new = _value(m.group("new"))
                if new:
                    out.append(Change("switch", frozenset(), new, _context(fact, new)))
    if not out:
        for clause in _CLAUSE_SPLIT.split(fact):
            if not _NOW.search(clause):
                continue
            for rx in _STATE_RES:
                for m in rx.finditer(clause):
                    new = _value(m.group("new"))
                    if new:
                        out.append(Change("switch", frozenset(), new, _context(clause, new)))
    for clause in _CLAUSE_SPLIT.split(fact):
        if _ENDING.search(clause):
            out.append(Change("ending", frozenset(), frozenset(), _context(clause, verbs=True)))
    return tuple(out)


def negated(fact: str) -> bool:
    """Whether ``fact`` carries a negation or ending cue; a contrast ("..., not Google Meet") is none."""
    return bool(_NEGATED.search(CONTRAST.sub(", ", fact)))


def _named_values(fact: str) -> set[str]:
    """Stems of what ``fact`` names: capitalised words past the first word, known tools and
    libraries, numbers."""
    words = re.findall(r"[\w.+#-]+", fact)
    out = set()
    for i, w in enumerate(words):
        w = w.strip(".-")
        if not w:
            continue
        if (i > 0 and w[:1].isupper()) or _tech_category(w) or any(ch.isdigit() for ch in w):
            out.add(_stem(w))
    return out - _TIME_WORDS


_COPULA = re.compile(r"\b(?:is|are|was|were|'s)\b", re.I)


def _holds_a_value(fact: str) -> bool:
    """Whether ``fact`` says how its subject holds a value: a relation verb or a copula."""
    return bool(RELATION_VERBS & set(_content_stems(fact)) or _COPULA.search(fact.replace("’", "'")))


def supersedes(new_fact: str, old_fact: str, *, min_switch_context: int = 1) -> ChangeKind | None:
    """Which change in ``new_fact`` ends ``old_fact`` (see the module docstring), or None.

    ``min_switch_context``: content words a "switched S to Y" needs in S. Read against a fact that
    reached the graph *after* the switch (dedupe.contradicts, the reverse direction), 2: a
    one-word subject -- a person -- holds many values at once ("Ada moved to Austin" does not end
    "Ada uses FastAPI" said the next day), a named thing ("the billing service") one."""
    old_stems = set(_content_stems(old_fact))
    if not old_stems or negated(old_fact):
        return None
    new_stems = set(_content_stems(new_fact))
    for change in find_changes(new_fact):
        if change.kind == "replacement":
            if change.old <= old_stems and not change.old <= change.new and change.context <= old_stems:
                return "replacement"
        elif change.kind == "switch":
            if (not change.new <= old_stems and len(change.context) >= min_switch_context
                    and change.context and _subject_in(change.context, old_stems)
                    and _holds_a_value(old_fact) and _named_values(old_fact) - new_stems):
                return "switch"
        elif len(change.context) >= 2 and change.context <= old_stems:
            return "ending"
    return None
