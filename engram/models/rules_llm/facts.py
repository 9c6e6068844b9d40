"""Facts: each sentence is split into clauses (at ";", and at "when", "because", "but", ...).
A clause with two or more entity mentions (a first-person pronoun counts as the speaker)
gives facts from its actor (the subject before the first mapped verb, co-subjects joined by
"and", the speaker for "I"/"we", the agent after a passive "caused by"/"fixed by") to each
other mention (at most 5); a mention right before a mapped verb starts a new subject ("I love
painting and my kids love pottery" -> Melanie LIKES painting, Melanie's kids LIKES pottery).
A clause with one entity gives speaker -> entity; a package gets ``USES_VERSION`` to its
version entity; a date target gets ``OCCURRED_ON``. The relation
is the SCREAMING_SNAKE_CASE of the nearest mapped verb before the target (see
:data:`VERB_RELATIONS`: USES, FIXES, DEPENDS_ON, DECIDED, CAUSES, TESTED_BY, LIVES_IN, WORKS_AT,
LIKES, ATTENDED, CREATED, USES_VERSION, INSTALLED, RAISES, RUNS, IMPORTS, DOES, QUIT), prefixed
``NOT_`` after "not"/"never"/"n't" and ``NO_LONGER_`` after "no longer"/"stopped"/"quit", after
"not ... any more", or for the old side of "switched from X to Y" / "Y instead of X"; else
RELATES_TO. The fact text is the sentence with "I", "my", "me" replaced by the speaker's name
(with a crude third-person verb fix: "I love" -> "Caroline loves"), cut to ``max_fact_chars``
(300). A traceback in a code block gives ``<error> OCCURRED_IN <file>``. A question gives no
fact ("Is Pepper adjusting well to her?"), only a statement before it does ("We moved to Porto,
have you been?" -> "We moved to Porto"); neither does a reaction to the listener ("Wow, love that
painting!", "Sorry about your job, Jon"): :func:`statement_before_question`,
:func:`reaction_to_listener`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from datetime import datetime

from engram.models.rules_llm.coreference import Reference, annotate
from engram.models.rules_llm.episodes import _CLAUSE_SPLIT, _FIRST_PERSON, _Sentence
from engram.models.rules_llm.relations import _ANY_MORE, _NEG_NOT, _NEG_STOP, _SWITCH_RES, _VerbHit, _find_verbs
from engram.models.rules_llm.text import MAX_FACTS, MAX_TARGETS_PER_CLAUSE, _content_stems, _mask, _stem
from engram.models.rules_llm.vocabulary import IRREGULAR_PREFIXES, ROLE_WORDS, STOPWORDS, _IRREGULAR_PAST


@dataclass
class _Mention:
    key: str
    start: int
    end: int
    category: str
    package_key: str | None = None
    pronoun: bool = False  # a first-person pronoun standing for the speaker
    refers: bool = False  # "it"/"this one" resolved to this entity (:mod:`.coreference`)


@dataclass
class _Entity:
    name: str
    category: str
    episodes: set[int] = field(default_factory=set)
    order: int = 0


@dataclass
class _Fact:
    source: str
    target: str
    relation: str
    fact: str
    episodes: set[int]
    reference: datetime | None


_AUX_3RD = {"am": "is", "'m": "is", "’m": "is", "have": "has", "'ve": "has", "’ve": "has", "do": "does",
            "don't": "doesn't", "don’t": "doesn’t", "'ll": "will", "’ll": "will", "'d": "would", "’d": "would"}


def _irregular_past(low: str) -> bool:
    """"wrote", and with a prefix: "rewrote", "overtook", "undid", "mistook", "withheld"."""
    return low in _IRREGULAR_PAST or any(
        low.startswith(p) and low[len(p):] in _IRREGULAR_PAST and len(low) - len(p) >= 3 for p in IRREGULAR_PREFIXES
    )


def _third_person_verb(word: str) -> str:
    low = word.lower()
    if _irregular_past(low) or low.endswith("ed") or not low.isalpha():
        return word
    if low == "have":
        return "has"
    if low in ("do", "go"):
        return word + "es"
    if re.search(r"(?:s|sh|ch|x|z|o)$", low):
        return word + "es"
    if re.search(r"[^aeiou]y$", low):
        return word[:-1] + "ies"
    return word + "s"


def speaker_in_text(speaker: str | None) -> str | None:
    """How a fact's text names its speaker: the name, or "the user"/"the assistant" for an
    unnamed role (roles are never entities, issue 24 item 6)."""
    if speaker and speaker.lower() in ROLE_WORDS:
        return f"the {speaker.lower()}"
    return speaker


def third_person(sentence: str, speaker: str | None) -> str:
    """Replace "I", "me", "my" with the speaker's name ("I love painting" -> "Caroline loves
    painting"; an unnamed role: "I rewrote it" -> "The assistant rewrote it"). "we"/"our" are
    kept (they include others)."""
    speaker = speaker_in_text(speaker)
    if not speaker:
        return sentence
    out = _third_person(sentence, speaker)
    return out[:1].upper() + out[1:] if out.startswith(speaker) and speaker[:1].islower() else out


def _third_person(sentence: str, speaker: str) -> str:

    def repl_i(m: re.Match[str]) -> str:
        clitic = m.group("clitic")
        if clitic:
            return f"{speaker} {_AUX_3RD.get(clitic.lower(), clitic)}"
        nxt = m.group("next")
        if not nxt:
            return speaker
        low = nxt.lower()
        if low in _AUX_3RD:
            return f"{speaker} {_AUX_3RD[low]}"
        if low in ("was", "did", "didn't", "can", "could", "will", "would", "should", "might", "must", "had", "can't", "won't", "wasn't", "couldn't", "wouldn't", "shouldn't"):
            return f"{speaker} {nxt}"
        if low in ("also", "just", "really", "never", "always", "still", "finally", "recently", "actually", "even", "already", "usually", "often", "sometimes", "totally", "absolutely", "definitely", "no", "not"):
            return f"{speaker} {nxt}"
        return f"{speaker} {_third_person_verb(nxt)}"

    # "I/O" is no pronoun
    out = re.sub(r"(?<![\w'’/-])I(?:(?P<clitic>['’](?:m|ve|ll|d))|\s+(?P<next>[A-Za-z'’]+))?(?![\w'’/-])", repl_i, sentence)
    # "I no longer live ..." -> "<speaker> no longer lives ..." (a negation: keep it intact)
    out = re.sub(
        rf"(?<=\b{re.escape(speaker)} )no longer ([a-z]+)\b",
        lambda m: f"no longer {_third_person_verb(m.group(1))}",
        out,
    )
    # "I" + adverb + verb: conjugate the verb after the adverb
    out = re.sub(
        rf"(?<=\b{re.escape(speaker)} )(also|just|really|never|always|still|finally|usually|often|sometimes|actually|even|already) ([a-z]+)\b",
        lambda m: f"{m.group(1)} {_third_person_verb(m.group(2)) if m.group(1) not in ('finally', 'recently', 'just', 'already') or not m.group(2).endswith('ed') else m.group(2)}",
        out,
    )
    out = re.sub(r"(?<![\w'’-])[Mm]y(?![\w'’-])", f"{speaker}'s", out)
    out = re.sub(r"(?<![\w'’-])(?:me|myself)(?![\w'’-])", speaker, out)
    out = re.sub(r"(?<![\w'’-])mine(?![\w'’-])", f"{speaker}'s", out)
    return out


def _trim(text: str, limit: int) -> str:
    text = re.sub(r"\s+", " ", text).strip()
    if len(text) <= limit:
        return text
    cut = text[: limit - 3]
    if " " in cut[limit // 2 :]:
        cut = cut[: cut.rfind(" ")]
    return cut.rstrip(" ,;:") + "..."


def _clauses(text: str) -> list[tuple[int, int]]:
    bounds = [0]
    for m in _CLAUSE_SPLIT.finditer(text):
        bounds.append(m.end())
    bounds.append(len(text))
    out = []
    for s, e in zip(bounds, bounds[1:]):
        if e > s:
            out.append((s, e))
    return out


_SUBJECT_GAP = re.compile(
    r"\s*(?:(?:also|just|really|still|never|not|always|often|usually|sometimes|finally|recently|actually|"
    r"already|totally|absolutely|even|no longer|do|does|did|don't|doesn't|didn't|has|have|had|is|are|was|"
    r"were|will|would|can|could|should|might|must|has been|have been|'ve|'s|'re|'m)\s+)*"
)


# Words that carry no fact on their own: greetings, acknowledgements, intensifiers.
_SMALL_TALK = frozenset(
    "wow hey hi hello thanks thank yeah yep yes yup no nope oh ok okay cool great awesome totally agree "
    "sure lol haha bye see talk soon nice really so too omg aw aww hmm um well "
    "amazing sounds sound fun congrats congratulations welcome sorry please anytime".split()
)
_WORD = re.compile(r"[A-Za-z][A-Za-z'’-]{2,}")


def _has_content(masked_sentence: str) -> bool:
    """False for small talk around a name: once entity mentions are masked, the sentence holds
    small-talk words and nothing but stopwords besides ("Wow, Melanie!", "Thanks, Caroline!")."""
    words = [w.lower().strip("'’-") for w in _WORD.findall(masked_sentence)]
    small_talk = [w for w in words if w in _SMALL_TALK]
    content = [w for w in words if w not in _SMALL_TALK and w not in STOPWORDS]
    return bool(content) or not small_talk


_PLAIN_WORD = re.compile(r"^[A-Za-z][A-Za-z'’-]*[.,;:!?]?$")
MIN_PLAIN_WORDS = 2


def _prose(text: str) -> bool:
    """At least ``MIN_PLAIN_WORDS`` whitespace-separated plain words: a line of tool output kept by
    the turn-detector's reduction ("tests/test_mod19.py ....  [95%]") states no fact, while
    "Bumped pydantic==2.14 in pyproject.toml" still does."""
    return sum(1 for token in text.split() if _PLAIN_WORD.match(token)) >= MIN_PLAIN_WORDS


# A question asks; it states nothing (issue 24 item 6: "What type of movies do you like best?",
# "Is Pepper adjusting well to her?"). A statement before it, at a comma or dash, is kept: "I'm on
# Python 3.12 - why does this fail?" states "I'm on Python 3.12".
_QUESTION_END = re.compile(r"\?[\s\"'”’)\]]*$")
_AUXILIARIES = (
    r"do|does|did|is|are|was|were|am|can|could|would|will|should|shall|may|might|must|have|has|had|"
    r"don't|doesn't|didn't|isn't|aren't|wasn't|weren't|can't|couldn't|wouldn't|won't|shouldn't|haven't|hasn't"
)
_QUESTION_OPENER = re.compile(rf"^\W*(?:who|whom|whose|what|which|when|where|why|how|{_AUXILIARIES})\b", re.I)
_QUESTION_AFTER = re.compile(
    rf"(?:,|;|:|\s[-–—])\s+(?=(?:who|whom|whose|what|which|when|where|why|how|{_AUXILIARIES}|right|ok|okay|eh|"
    r"any|anything|anyone|got|you)\b)",
    re.I,
)


def statement_before_question(text: str) -> int | None:
    """Where the statement part of ``text`` ends: ``len(text)`` for a sentence that is no
    question, the end of the statement before a question asked after a comma, dash, colon or
    semicolon ("We moved to Porto, have you been?" -> the end of "We moved to Porto"), None for
    a question with no statement before it ("Who supports you, Mel?", "Did you go?")."""
    if not _QUESTION_END.search(text):
        return len(text)
    cuts = list(_QUESTION_AFTER.finditer(text))
    if not cuts or _QUESTION_OPENER.match(text):
        return None
    head = text[: cuts[-1].start()].rstrip()
    return len(head) if head and not _QUESTION_OPENER.match(head) else None


# A reaction to what the listener said or shared: an exclamation ("Wow", "Aww", "Sorry",
# "Congrats") about "you"/"your" or "that"/"this" with nothing of the speaker in it ("Wow, love
# that painting!", "Sorry about your job Jon, but ..."): no lasting fact. With a first-person
# pronoun it may state one ("Wow, I love that painting too") and goes on as any sentence.
_REACTION_OPENER = re.compile(
    r"^\W*(?:wow+|whoa|woah|aw+|omg|ooh+|yay|sorry|congrats|congratulations|haha|lol)\b", re.I
)
_LISTENER_OR_THAT = re.compile(r"(?<![\w'’-])(?:you|your|yours|you're|you’re|that|this|those|these|that's|that’s)(?![\w'’-])", re.I)


def reaction_to_listener(text: str) -> bool:
    """True for an exclamation about the listener's news or things with nothing of the speaker
    in it (see :data:`_REACTION_OPENER`)."""
    return bool(_REACTION_OPENER.match(text)) and not _FIRST_PERSON.search(text) and bool(_LISTENER_OR_THAT.search(text))


_VOCATIVE_BEFORE = re.compile(
    r"(?:^|[,;:!?.]|\b(?:hey|hi|hello|thanks|thank you|wow|oh|yes|yeah|yep|congrats|congratulations|dear|sorry|"
    r"bye|great|awesome|absolutely|sure|okay|ok|aw|aww|haha|lol|omg))\W*$",
    re.I,
)


def _vocative(text: str, m: _Mention) -> bool:
    """A person named to address them ("Thanks, Melanie!", "Wow, Caroline, way to go!",
    "Caroline, did you ...?") is the listener, not an argument of the sentence's fact."""
    if m.category not in ("person", "speaker") or m.pronoun:
        return False
    before, after = text[: m.start], text[m.end :].lstrip()
    return bool(_VOCATIVE_BEFORE.search(before)) and (not after or after[0] in ",!?.")


# An acknowledgement and the words a restatement may add or reword ("Noted, billing is on
# Postgres 15." after "We use Postgres 15 for billing."): not content of an echo.
_ECHO_FREE = frozenset(_stem(w) for w in (
    "noted note got it ok okay sure understood right great thanks thank perfect yes yep alright so then "
    "use uses used using run runs running built based sits sit lives live hosted host on in with via"
).split())


def _echo_stems(fact: str) -> frozenset[str]:
    return frozenset(s for s in _content_stems(fact) if s not in _ECHO_FREE)


class _FactBuilder:
    def __init__(self, entities: dict[str, _Entity], max_fact_chars: int):
        self.entities = entities
        self.max_fact_chars = max_fact_chars
        self.facts: list[_Fact] = []
        self._seen: set[tuple[str, str, str, str]] = set()
        # (episode, block, speaker, entity keys, echo stems) of each fact's sentence
        self._said: list[tuple[int, int, str | None, frozenset[str], frozenset[str]]] = []

    def _echo(self, source: str, target: str, fact: str, sent: _Sentence) -> bool:
        """A fact another speaker stated earlier in the same episode, said again ("Noted, billing is
        on Postgres 15." after "The billing service uses Postgres 15."): one fact, the first
        (issue 24, item 6). Same words (acknowledgements, relation verbs and prepositions aside)
        and an entity in common."""
        stems = _echo_stems(fact)
        if not stems:
            return False
        return any(
            ep == sent.episode and block < sent.block and speaker != sent.speaker and keys & {source, target}
            and stems <= said for ep, block, speaker, keys, said in self._said
        )

    def add(self, source: str, target: str, relation: str, text: str, sent: _Sentence, *, about_one: bool = False) -> None:
        if (source == target and not about_one) or len(self.facts) >= MAX_FACTS:
            return
        if source not in self.entities or target not in self.entities:
            return
        fact = _trim(text, self.max_fact_chars)
        key = (source, target, relation, fact)
        if key in self._seen or self._echo(source, target, fact, sent):
            return
        self._seen.add(key)
        self._said.append((sent.episode, sent.block, sent.speaker, frozenset((source, target)), _echo_stems(fact) | frozenset(
            _content_stems(fact))))
        self.facts.append(_Fact(source, target, relation, fact, {sent.episode}, sent.reference))
        for k in (source, target):
            self.entities[k].episodes.add(sent.episode)

    def sentence(self, sent: _Sentence, mentions: list[_Mention], speaker_key: str | None) -> None:
        text = sent.text
        if sent.code or not _prose(text) or reaction_to_listener(text):
            return
        end = statement_before_question(text)
        if end is None:
            return  # a question states nothing
        if end < len(text):  # the statement before a question
            sent = replace(sent, text=text[:end])
            text = sent.text
            mentions = [m for m in mentions if m.end <= end]
        references = [Reference(m.start, m.end, m.key) for m in mentions if m.refers]
        if references:
            # the fact names what "it" is: "Audrey got it (tattoo) a while ago."
            text_named = annotate(text, references, {r.key: self.entities[r.key].name for r in references})
        else:
            text_named = text
        role = bool(sent.speaker) and sent.speaker.lower() in ROLE_WORDS  # named in the text, no entity
        fact_text = third_person(text_named, sent.speaker if speaker_key or role else None)
        masked = _mask(text, [(m.start, m.end) for m in mentions if not m.pronoun])
        if not _has_content(masked):
            return  # "Wow, Melanie!", "Thanks, Caroline!": a name in a greeting is no fact
        mentions = [m for m in mentions if not _vocative(text, m)]  # the listener is no argument
        verbs = _find_verbs(masked)
        switches = []
        for rx in _SWITCH_RES:
            for m in rx.finditer(text):
                switches.append((m.start("old"), m.end("old"), m.start("new"), m.end("new"), m.group(0).lower()))
        handled_versions: set[str] = set()
        for c_start, c_end in _clauses(text):
            ms = [m for m in mentions if c_start <= m.start < c_end]
            vs = [v for v in verbs if c_start <= v.start < c_end]
            self._clause(sent, fact_text, text, ms, vs, switches, speaker_key, c_start)
        # package -> version facts
        for m in mentions:
            if m.category == "version" and m.package_key and m.key not in handled_versions:
                handled_versions.add(m.key)
                rel = "USES_VERSION"
                if any(s[0] <= m.start < s[1] for s in switches):
                    rel = "NO_LONGER_USES_VERSION"
                self.add(m.package_key, m.key, rel, fact_text, sent)

    def _clause(self, sent: _Sentence, fact_text: str, text: str, ms: list[_Mention], vs: list[_VerbHit],
                switches: list[tuple[int, int, int, int, str]], speaker_key: str | None, c_start: int) -> None:
        # one mention per entity (the first)
        firsts: dict[str, _Mention] = {}
        for m in ms:
            if m.key not in firsts:
                firsts[m.key] = m
        ordered = sorted(firsts.values(), key=lambda m: m.start)
        keys = {m.key for m in ordered}
        non_speaker = [m for m in ordered if m.key != speaker_key]
        if not non_speaker:
            return
        if len(keys) == 1:
            # the speaker plus one entity
            m = non_speaker[0]
            if m.category == "version" and m.package_key:
                return
            if speaker_key and speaker_key in self.entities:
                self.add(speaker_key, m.key, self._relation(m, vs, text, switches, c_start), fact_text, sent)
            elif sent.speaker and sent.speaker.lower() in ROLE_WORDS:
                # an unnamed user or assistant is no entity (issue 24 item 6), yet what they said
                # about one thing is a fact about it ("Decision: pin every dependency in
                # pyproject.toml"): kept as a fact of that entity alone (a self-edge)
                self.add(m.key, m.key, self._relation(m, vs, text, switches, c_start), fact_text, sent, about_one=True)
            return
        # a passive verb: the agent after it acts on what precedes it ("X was caused by Y")
        v0 = vs[0] if vs else None
        if v0 is not None and v0.passive:
            after = [m for m in ordered if m.start >= v0.end and m.category != "date"]
            if after:
                agent = after[0]
                for t in [m for m in ordered if m is not agent][:MAX_TARGETS_PER_CLAUSE]:
                    rel = v0.relation if t.start < v0.start else self._relation(t, vs, text, switches, c_start)
                    self.add(agent.key, t.key, rel, fact_text, sent)
                return
        # split the clause where a verb has its own subject right before it
        # ("I love painting and my kids love pottery" -> two segments)
        cuts: list[int] = []
        for v in vs:
            prev = [m for m in ordered if m.end <= v.start]
            if prev and prev[-1].start > c_start and _SUBJECT_GAP.fullmatch(text[prev[-1].end : v.start]):
                # co-subjects joined by "and" stay with it
                idx = ordered.index(prev[-1])
                while idx > 0 and self._co_subject(text, ordered, idx, vs, c_start):
                    idx -= 1
                cuts.append(ordered[idx].start)
        bounds = sorted({c_start, *cuts, len(text) + 1})
        for a, b in zip(bounds, bounds[1:]):
            seg = [m for m in ordered if a <= m.start < b]
            seg_verbs = [v for v in vs if a <= v.start < b]
            if seg:
                self._segment(sent, fact_text, text, seg, seg_verbs, vs, switches, speaker_key, a)

    @staticmethod
    def _co_subject(text: str, ordered: list[_Mention], idx: int, vs: list[_VerbHit], lower: int) -> bool:
        """Is ordered[idx - 1] a co-subject of ordered[idx] ("Caroline and Melanie went")? Not
        if a verb precedes it (then it is an object: "I love painting and my kids love ...")."""
        prev = ordered[idx - 1]
        if not re.fullmatch(r"\s*(?:,|and|&|,\s*and)\s*", text[prev.end : ordered[idx].start]):
            return False
        before = ordered[idx - 2].end if idx >= 2 else lower
        return not any(before <= v.start < prev.start for v in vs)

    def _segment(self, sent: _Sentence, fact_text: str, text: str, ordered: list[_Mention], seg_verbs: list[_VerbHit],
                 all_verbs: list[_VerbHit], switches: list[tuple[int, int, int, int, str]], speaker_key: str | None, s_start: int) -> None:
        keys = {m.key for m in ordered}
        has_pronoun = any(m.pronoun for m in ordered)
        v0 = seg_verbs[0] if seg_verbs else None
        actor: _Mention | None = None
        co_actors: list[_Mention] = []
        if v0 is not None:
            before = [m for m in ordered if m.end <= v0.start]
            if before:
                actor = before[-1]
                idx = ordered.index(actor)
                while idx > 0 and self._co_subject(text, ordered, idx, all_verbs, s_start):
                    co_actors.append(ordered[idx - 1])
                    idx -= 1
            elif not (speaker_key and speaker_key in self.entities):
                actor = ordered[0]
        elif not (has_pronoun and speaker_key):
            actor = ordered[0]
        if actor is None:
            if not (speaker_key and speaker_key in self.entities):
                return
            actor = _Mention(speaker_key, s_start, s_start, "speaker", pronoun=True)
        subjects = [actor] + co_actors
        skip = {s.key for s in subjects}
        targets = [m for m in ordered if m.key not in skip and not (m.start < actor.end and m.end > actor.start)]
        if actor.end > s_start or co_actors:
            after = [m for m in targets if m.start >= actor.end]
            if after:
                targets = after
        # a version whose package is mentioned hangs off the package (USES_VERSION), not the actor
        targets = [t for t in targets if not (t.category == "version" and t.package_key and t.package_key in keys)]
        tools = [t for t in targets if t.category in ("tool", "library")]
        for subj in subjects:
            for t in targets[:MAX_TARGETS_PER_CLAUSE]:
                rel = self._relation(t, all_verbs, text, switches, s_start)
                if rel.endswith("TESTED_BY") and tools:
                    # "I tested src/app.py with pytest": the tested thing -> the tool
                    if t not in tools:
                        for tool in tools:
                            self.add(t.key, tool.key, rel, fact_text, sent)
                    elif all(x in tools for x in targets):
                        self.add(subj.key, t.key, rel, fact_text, sent)
                    continue
                self.add(subj.key, t.key, rel, fact_text, sent)

    def _relation(self, target: _Mention, vs: list[_VerbHit], text: str, switches: list[tuple[int, int, int, int, str]], c_start: int) -> str:
        if target.category == "date":
            return "OCCURRED_ON"
        before = [v for v in vs if v.start < target.start]
        verb = before[-1] if before else (vs[0] if vs else None)
        if verb is None:
            rel = "RELATES_TO"
        else:
            rel = verb.relation
        cat = self.entities[target.key].category if target.key in self.entities else target.category
        if rel == "LIVES_IN" and cat in ("tool", "library", "file", "version", "concept"):
            rel = "USES"
        elif rel == "USES_VERSION" and cat not in ("tool", "library", "version", "concept"):
            rel = "RELATES_TO"
        for o_s, o_e, n_s, n_e, phrase in switches:
            if o_s <= target.start < o_e:
                base = "LIVES_IN" if re.match(r"(?:mov|reloc|went|go)", phrase) and cat not in ("tool", "library", "file", "version", "concept") else ("USES" if rel in ("RELATES_TO", "USES", "LIVES_IN") else rel)
                return "NO_LONGER_" + base
            if n_s <= target.start < n_e and rel == "RELATES_TO":
                return "USES"
        if verb is not None:
            window = text[max(c_start, verb.start - 30) : verb.start]
            if _NEG_STOP.search(window):
                rel = "NO_LONGER_" + rel
            elif _NEG_NOT.search(window):
                # "doesn't play golf any more": an ending, not a plain negation
                after = re.split(r"[.;!?]", text[verb.end :], maxsplit=1)[0]
                rel = ("NO_LONGER_" if _ANY_MORE.search(after) else "NOT_") + rel
        return rel


def _traceback_facts(builder: _FactBuilder, sentences: list[_Sentence], mentions: dict[int, list[_Mention]]) -> None:
    """A code block (or traceback lines) naming an error and files: error OCCURRED_IN file."""
    by_block: dict[int, list[int]] = {}
    for i, s in enumerate(sentences):
        by_block.setdefault(s.block, []).append(i)
    for idxs in by_block.values():
        errors: list[tuple[str, int]] = []
        files: list[str] = []
        for i in idxs:
            s = sentences[i]
            for m in mentions.get(i, []):
                cat = builder.entities[m.key].category if m.key in builder.entities else m.category
                if cat == "error" and (s.code or "Traceback" in s.text or re.match(r"^\s*[\w.]+(?:Error|Exception|Warning)\b", s.text)):
                    errors.append((m.key, i))
                elif cat == "file" and s.code:
                    if m.key not in files:
                        files.append(m.key)
        if not errors or not files:
            continue
        err_key, err_idx = errors[-1]
        err_line = sentences[err_idx].text
        for f in files[-3:]:
            fact = f"{err_line} (raised in {builder.entities[f].name})"
            builder.add(err_key, f, "OCCURRED_IN", fact, sentences[err_idx])
