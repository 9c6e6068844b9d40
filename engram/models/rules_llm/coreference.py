"""Coreference, conservatively: "it" (and "this one"/"that one") -> the one thing named just before.

graphiti's extraction prompt shows the session's previous turns (``<PREVIOUS MESSAGES>``) and asks
to resolve what the current message refers to. The rules extractor does a narrow part of that:
a referring "it" in a clause that names no other entity ("I got it a while ago", "it stands for
freedom") takes the one thing named just before it, so the clause gives a fact and the fact's
text names the thing ("Audrey got it (tattoo) a while ago.": its words are what recall matches).
Issue 11's miss: "I bought it a year ago" with the name in the previous turn.

Which "it" (:func:`referring`; heuristics that refuse when unsure):

* an object right after a verb that takes a thing ("bought it", "painted it", "love it"), not in
  idioms ("You got it!", "got it done", "make it to", "make it happen", "keep it up", "love it
  when ...", "sounds like it", "the love it deserves");
* a subject at a clause start before a verb that says something about a thing ("it represents",
  "it reminds me of", "it stands for", "it has"); never before a copula, a modal or a raising
  verb ("it is raining", "it was great", "it's been a while", "it can be", "it seems", "it takes
  courage"): those are expletive or refer to a whole event;
* "this one"/"that one" only as a verb's object; "that", "this", "they"/"them", "he"/"she" are
  never resolved (in chat "that" points at what was said: "that's awesome", "that is why").

Where the antecedent is looked for (:func:`antecedent`), nearest first: its own sentence before
it, the earlier sentences of its message, then the message before (the previous speaker block of
the current messages; for the first message, the last message of ``<PREVIOUS MESSAGES>``'s last
episode). Never further back. The nearest sentence that names a candidate decides: exactly one
distinct thing and nothing else there -> resolved; anything more -> ambiguous, not resolved.

What may be chosen (:func:`candidate_role`, :func:`unknown_things`): a non-person entity the
extractor found, or a short noun phrase it did not take ("a new guitar" -> entity "new guitar"),
singular, no activity ("painting animals"), no simile ("like a cool form of ..."), no predicate
("it's a refuge"), no feeling or event noun ("the idea", "a blast") and no person noun ("a
friend"). In the previous message only capitalised names, titles and technical entities are
chosen: a lower-case thing there was mostly not what "it" meant (measured on the tuning split).
Dates, untyped capitalised names (maybe a person), plurals and the rejected noun phrases make a
sentence ambiguous instead.

Measured (docs/architecture.md, issue 11): about 1 fact per 50 LoCoMo turns added, 18 of 20 right
by hand on the tuning split, 14 of the first 20 on the report split; evidence recall unchanged
within a run's noise, the fact ceiling +0.9 points (tuning). Known limits: no plural or personal pronouns, no resolution across more
than one message, none in the two-prompt path (``extract_edges.edge``: its entities come from
the prompt), the noun-phrase test is a regex (no part-of-speech tagger), and a resolved
pronoun whose clause already names an entity is left as it is.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass

from engram.models.rules_llm.text import _norm_key
from engram.models.rules_llm.vocabulary import COMMON_WORDS, _IRREGULAR_PAST

#: a possibly referring pronoun
PRONOUN = re.compile(r"(?<![\w'’-])(?:[Ii]t|[Tt]his one|[Tt]hat one)(?![\w'’-])")

_WORD = re.compile(r"[A-Za-z][\w'’-]*")

# Verbs whose object "it" is a thing (forms as written; matched lower-case).
_OBJECT_VERBS = frozenset(
    """
    buy buys bought buying got getting received receive
    paint paints painted painting draw draws drew drawn drawing build builds built building
    bake baked baking cook cooked cooking knit knitted sew sewed carve carved print printed
    design designed create created write wrote written make made making
    find found adopt adopted adopting read reading watch watched watching see saw seen
    love loved loving like liked enjoy enjoyed enjoying adore adored treasure treasured
    use used using wear wore wearing worn play played playing tried try trying
    name named fix fixed repair repaired sell sold selling order ordered plant planted
    finish finished finishing start started brought bring show showed shown share shared
    recommend recommended hang hung frame framed visit visited
    grab grabbed keep kept gift gifted install installed installing run ran running test tested
    upgrade upgraded update updated delete deleted remove removed open opened rename renamed
    """.split()
)

_DETERMINERS = frozenset("a an the this that my your our their his her its".split())
_LIKE_SUBJECTS = frozenset("i you we they he she would 'd really also to do don't did didn't will".split())
# "it" after these is an idiom, whatever follows ("You got it!", "Got it.").
_IDIOM_BEFORE = re.compile(r"(?:\byou (?:got|get)|^\W*got)\s*$", re.I)
# ... or when one of these follows ("love it when ...", "keep it up", "pick it up")
_IDIOM_AFTER = re.compile(r"^\s*(?:when|whenever|that|if|how|up|off|all|out)\b", re.I)
# After these verbs "it" is a thing only before a place, a beneficiary, a time ("I made it for my
# mom", "I found it at a flea market", "kept it in my room"): not "made it to the final", "make it
# happen", "found it hard", "keep it simple", "we made it!".
_COMPLEMENT_VERBS = frozenset("make made making find found keep kept".split())
_THING_COMPLEMENT = re.compile(
    r"^\s*(?:for|from|with|in|at|on|during|while|back|myself|yourself|himself|herself|ourselves|"
    r"last|yesterday|years?|months?|weeks?|days?)\b",
    re.I,
)

# Subject "it": only before a verb that says something about a thing.
_SUBJECT_VERBS = frozenset(
    """
    represents represented symbolizes symbolises symbolized symbolised stands stood reminds reminded
    belongs belonged belonged costs cost broke breaks holds held shows showed features featured
    sits sat hangs hung came comes has had includes included contains contained fits fit
    """.split()
)
# "it <verb> [me / my heart] that|why|how ...": an extraposed clause is what "it" stands for
_EXTRAPOSED = re.compile(r"^\s*(?:[\w'’-]+\s+){1,4}?(?:that|why|how|what)\b", re.I)
_SUBJECT_ADVERBS = frozenset("also really still always just even actually now".split())


@dataclass(frozen=True)
class Candidate:
    """An entity mention before a pronoun. ``chosen`` False: it makes its sentence ambiguous
    (a date, an untyped capitalised name that may be a person) but is never the antecedent."""

    key: str
    start: int
    end: int
    chosen: bool = True
    #: the sentence names something "it" may be: the search for an antecedent stops there
    known: bool = True
    name: str = ""  # for a noun phrase the extractor did not take: the words it would be called


@dataclass(frozen=True)
class Reference:
    """A resolved pronoun in a sentence: ``text[start:end]`` refers to entity ``key``."""

    start: int
    end: int
    key: str


_SIMILE = re.compile(
    r"(?:['’]s|\bis|\bwas|\bare|\bwere|\bbe|\bbeen|\bbecome|\bbecomes|\bbecame|\bfeels?|\bfelt|\blooks?|\bsounds?|"
    r"\btastes?|\bjust|\bkinda|\bmore|\bsomething)\s+like\s+(?:a|an|the)?\s*$",
    re.I,
)
_SINGULAR_S = frozenset("series species news canvas lens bus gas".split())
_TECH = frozenset({"file", "tool", "library", "version", "error", "concept"})


def candidate_role(name: str, category: str, kind: str = "", before: str = "", *, same_message: bool = True) -> str | None:
    """What an entity candidate is to "it": "chosen" (a thing it may refer to), "blocker" (its
    sentence becomes ambiguous) or None (a person: never "it", no competitor either).

    Blockers: a date or a decision; a capitalised name the extractor could not type (it may be a
    person); an activity ("painting animals", "exploring new scents": "it" after those mostly
    means the whole event); a lower-case plural ("stories", "Audrey's dogs": "it" is
    singular); a simile's noun ("like a cool form of self-expression"); and in the previous
    message, any lower-case thing (there only titles, names and technical entities are chosen:
    "Glad you enjoyed it" after "I watched "Little Women"")."""
    if category in ("person", "speaker"):
        return None
    if category in ("date", "decision") or (kind == "person" and category == "thing"):
        return "blocker"
    words = [w for w in name.split() if not re.search(r"['’]s$", w)]
    if not words:
        return "blocker"
    head = words[-1]
    if category not in _TECH:
        if words[0].lower().endswith("ing") or _SIMILE.search(before):
            return "blocker"
        if head.islower() and re.search(r"[^su]s$", head) and head not in _SINGULAR_S:
            return "blocker"
        named = any(w[:1].isupper() for w in words)
        if not same_message and not named:
            return "blocker"
    return "chosen"


# a noun phrase the extractor did not take ("this cool rainbow sidewalk", "the bones"): an
# unknown thing "it" may point at, so it makes its sentence ambiguous
_NOUN_PHRASE = re.compile(r"(?<![\w'’-])(?:[Tt]he|[Tt]his|[Tt]hat|[Aa]n?|[Mm]y|[Yy]our|[Oo]ur|[Tt]heir|[Hh]is|[Hh]er)\s+((?:[a-z][\w'’-]*\s+){0,3}[a-z][\w'’-]*)")
_NOT_A_NOUN = frozenset(
    """
    lot lots bit while way ways time times day days week weeks weekend year years month months moment
    moments few couple little same best most first last other one ones kind sort number chance point
    end rest whole
    is was are were be been has have had do does did can could will would should must might may
    sounds sound looks look seems seem feels feel means mean makes make made really so too very just
    also still always never not and or but if when because since as to of in on at for with from by
    a an the this that these those my your our their his her its
    about it he she they we you i me him them us what which who how why where there here
    """.split()
)
# nouns for what happened or was felt, not a thing "it" would name ("in the loop", "the idea",
# "having a blast"): a phrase headed by one is no candidate at all
_NOT_A_THING = frozenset(
    """
    idea ideas hype loop blast vibe vibes feeling feelings love support energy advice help opportunity
    fun life progress effort challenge goal dream dreams passion motivation inspiration reminder
    difference break escape thing things stuff sense reason fact way
    """.split()
)
# people: never "it", and no competitor of a thing either
_PEOPLE = frozenset(
    """
    friend friends guy guys girl girls man men woman women people person kid kids boy boys lady ladies
    mentor mentors teacher teachers family team everyone neighbor neighbors neighbour neighbours coworker
    coworkers colleague colleagues buddy buddies folks fam crew audience fans customer customers client
    clients student students fan fans
    """.split()
)


# verb forms that end a noun phrase after its first word (base forms are nouns too often: "the
# art show", "a board game"): past tenses and the subject verbs above
_VERB_FORMS = _SUBJECT_VERBS | frozenset(_IRREGULAR_PAST)

# "that"/"this" is a determiner at a sentence or clause start, or after a verb or a preposition
_DEMONSTRATIVE_BEFORE = re.compile(
    r"(?:^|[.!?,;:(\"“—–-]|\b(?:in|on|at|of|for|with|from|about|to|into|like|by|and|but|"
    + "|".join(sorted(_OBJECT_VERBS))
    + r"))\s*$",
    re.I,
)

_PREDICATE = re.compile(
    r"(?:['’]s|\bis|\bwas|\bare|\bwere|\bbe|\bbeen|\bbecome|\bbecomes|\bbecame|\bseems?|\bsuch|\bas)\s+"
    r"(?:(?:both|also|really|just|such|definitely|truly|always|still|not|quite|kind of|sort of)\s+)*$",
    re.I,
)


def unknown_things(text: str, taken: Sequence[tuple[int, int]], *, same_message: bool = True) -> list[Candidate]:
    """Candidates for the noun phrases of ``text`` outside ``taken`` (the spans of its entity
    mentions, people included): a determiner or possessive and one to three lower-case words,
    up to the first filler or verb; none when the first word is one ("a lot", "the way", "that
    sounds"). ``name`` is the words after the determiner ("a new guitar" -> "new guitar").

    Such a phrase may be chosen (it then also stops the search, :func:`antecedent`) when it is
    in the pronoun's own message, ends in a singular noun-like word, and is no activity, no
    simile, no predicate ("it's a refuge") and no longer than three words; otherwise it only
    makes a sentence with an entity in it ambiguous."""
    out: list[Candidate] = []
    for m in _NOUN_PHRASE.finditer(text):
        if any(a < m.end() and m.start() < b for a, b in taken):
            continue
        det = m.group(0).split()[0].lower()
        if det in ("that", "this") and not _DEMONSTRATIVE_BEFORE.search(text[: m.start()]):
            continue  # "poses that suit you", "so glad that it ...": a relative or a conjunction
        words: list[str] = []
        for w in m.group(1).split():
            low = w.lower().strip("'’")
            if low in _NOT_A_NOUN or (words and (low in _VERB_FORMS or low.endswith("ed"))):
                break  # a verb ends the phrase: "a friend gave me", "the cake tasted"
            words.append(w)
        if not words or words[-1].lower() in _NOT_A_THING or words[-1].lower() in _PEOPLE:
            continue
        name = " ".join(words)
        end = m.start(1) + len(" ".join(m.group(1).split()[: len(words)]))
        head = words[-1].lower()
        chosen = (
            len(words) <= 3
            and not _PREDICATE.search(text[: m.start()])
            and not re.match(r"\s+(?:and|or|&)\s", text[end:])  # "the pattern and colors"
            and candidate_role(name, "thing", "np", text[: m.start()], same_message=same_message) == "chosen"
            and head not in COMMON_WORDS
            and not re.search(r"(?:ly|ed|ful|ous|ive|able|ible|al|ic|est|less)$", head)
        )
        out.append(Candidate(_norm_key(name), m.start(), end, chosen=chosen, known=chosen, name=name))
    return out


def referring(text: str) -> list[tuple[int, int]]:
    """Spans of "it"/"this one"/"that one" in ``text`` that refer to a thing (see the module
    docstring): objects of thing-taking verbs, subjects of thing-describing verbs."""
    out: list[tuple[int, int]] = []
    for m in PRONOUN.finditer(text):
        word = m.group(0).lower()
        before, after = text[: m.start()], text[m.end() :]
        prev = _WORD.findall(before[-40:])
        nxt = _WORD.findall(after[:40])
        prev_word = prev[-1].lower() if prev and re.search(r"[\w'’-]\s+$", before) else ""
        prev2 = prev[-2].lower() if len(prev) >= 2 else ""
        if prev2 in _DETERMINERS:
            prev_word = ""  # "the love it deserves": a noun, not a verb
        if prev_word in ("like", "liked") and prev2 not in _LIKE_SUBJECTS:
            prev_word = ""  # "sounds like it", "nothing like it": a preposition
        if prev_word in _OBJECT_VERBS:
            if _IDIOM_BEFORE.search(before) or _IDIOM_AFTER.match(after):
                continue
            if prev_word in _COMPLEMENT_VERBS and not _THING_COMPLEMENT.match(after):
                continue
            if prev_word in ("got", "get", "getting") and re.match(r"^\s*(?:done|[a-z]+ed)\b", after):
                continue  # "got it done", "got it fixed": the work, not a thing
            out.append((m.start(), m.end()))
            continue
        if word != "it":
            continue  # "this one"/"that one" only as a verb's object (not "this one time")
        # subject: at a clause start (start of sentence, after a comma/and/but/because/so)
        if before.strip() and not re.search(r"(?:[,;:—–-]|\b(?:and|but|because|so|since|as|cause|'cause))\s*$", before, re.I):
            continue
        words = [w.lower() for w in nxt[:3]]
        while words and words[0] in _SUBJECT_ADVERBS:
            words.pop(0)
        if not words or words[0] not in _SUBJECT_VERBS:
            continue
        if words[0] in ("has", "had") and (len(words) < 2 or words[1] in ("been", "to", "got", "gotten", "become")):
            continue
        if words[0] in ("came", "comes") and (len(words) < 2 or words[1] != "from"):
            continue
        if _EXTRAPOSED.match(after):
            continue  # "it breaks my heart that ...", "it reminded me why ...": about the clause
        out.append((m.start(), m.end()))
    return out


def antecedent(here: Sequence[Candidate], pronoun_start: int, earlier: Sequence[Sequence[Candidate]]) -> str | None:
    """The key "it" at ``pronoun_start`` refers to: the nearest sentence that names an entity
    decides, its own sentence first (``here``, the part before the pronoun), then ``earlier``
    (nearest first). There, exactly one distinct chosen key and nothing else (no blocker, no
    other noun phrase) resolves; anything more is ambiguous: None. A sentence with noun phrases
    but no entity does not stop the search ("I watched "Little Women". The story was great.
    Glad you enjoyed it.")."""
    for sentence in [[c for c in here if c.end <= pronoun_start], *earlier]:
        if not any(c.known for c in sentence):
            continue
        keys = {c.key for c in sentence}
        if len(keys) == 1 and all(c.chosen for c in sentence):
            return sentence[0].key
        return None
    return None


def last_previous_message(previous: str | None) -> str | None:
    """The content of the last (most recent) episode in a ``<PREVIOUS MESSAGES>`` block (graphiti
    writes a JSON list of ``{"content", "timestamp"}`` in chronological order), or None."""
    if not previous or not previous.strip():
        return None
    try:
        data = json.loads(previous)
    except ValueError:
        return None
    if not isinstance(data, list) or not data:
        return None
    last = data[-1]
    content = last.get("content") if isinstance(last, dict) else last
    return content if isinstance(content, str) and content.strip() else None


def annotate(text: str, references: Sequence[Reference], names: dict[str, str]) -> str:
    """``text`` with each resolved pronoun followed by its antecedent's name in parentheses:
    "I got it a while ago." -> "I got it (tattoo) a while ago." (the fact names the thing)."""
    out, pos = [], 0
    for r in sorted(references, key=lambda r: r.start):
        out.append(text[pos : r.end])
        out.append(f" ({names[r.key]})")
        pos = r.end
    out.append(text[pos:])
    return "".join(out)
