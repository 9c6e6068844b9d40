"""The extraction pipeline: entity candidates (:mod:`.entities`) per speaker block, then facts
(:mod:`.facts`) between them; ``_facts_for_given_entities`` does the same for the names a
prompt gives (``extract_edges.edge``). Caps: ``max_entities_per_message`` new entities per
block, ``max_entities`` per prompt, ``max_fact_chars`` per fact.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from engram.models.rules_llm.coreference import Candidate, Reference, antecedent, candidate_role, referring, unknown_things
from engram.models.rules_llm.entities import _Cand, _Extractor, _VERSION_SPEC, _category_from_labels, _resolve_overlaps, _tech_category
from engram.models.rules_llm.episodes import _Doc, _FIRST_PERSON, _INLINE_CODE, _REDACTED, _Sentence, _URL
from engram.models.rules_llm.facts import _Entity, _Fact, _FactBuilder, _Mention, _clauses, _traceback_facts
from engram.models.rules_llm.relations import _find_verbs
from engram.models.rules_llm.text import _mask, _norm_key, is_safe_entity_name
from engram.models.rules_llm.vocabulary import ROLE_WORDS


@dataclass
class ExtractionResult:
    entities: list[_Entity]
    facts: list[_Fact]


def _sentence_candidates(ex: _Extractor, s: _Sentence) -> list[_Cand]:
    """Entity candidates of one sentence, overlaps resolved."""
    text = s.text
    masked_urls = _mask(
        text, [(m.start(), m.end()) for pattern in (_URL, _REDACTED) for m in pattern.finditer(text)], " "
    )
    cands: list[_Cand] = []
    cands += ex.tokens(text, masked_urls, s.code)
    cands += ex.installs(masked_urls)
    cands += ex.space_versions(masked_urls)
    cands += ex.errors(masked_urls)
    cands += ex.dates(masked_urls)
    cands += ex.tech_words(masked_urls)
    if not s.code:
        code_spans = [(m.start(), m.end()) for m in _INLINE_CODE.finditer(masked_urls)]
        prose = _mask(masked_urls, code_spans, " ")
        cands += ex.kin(prose, s.speaker)
        cands += ex.groups(prose, 0)
        cands += ex.titles(prose)
        # text after an error name is its message ("Address already in use"): no names there
        messages = [(c.end, len(prose)) for c in cands if c.category == "error"]
        taken = _mask(prose, [(c.start, c.end) for c in cands if c.category in ("file", "version", "error", "date", "tool", "library") or c.kind in ("kin", "group")] + messages, " ")

        def at_start(pos: int, _t: str = prose) -> bool:
            head = _t[:pos]
            return not head.strip() or bool(re.search(r"(?:[.!?:;\"“(]|^[-*•])\s*$", head))

        cands += ex.names(prose, taken, at_start)
        pre = _resolve_overlaps(cands)
        verbs = _find_verbs(_mask(prose, [(c.start, c.end) for c in pre]))
        cands += ex.objects(prose, _mask(prose, [(c.start, c.end) for c in pre], "#"), s.speaker, verbs)
        cands += ex.topics(_mask(prose, [(c.start, c.end) for c in pre], "#"))
        cands += ex.decisions(prose)
    return _resolve_overlaps(cands)


def _things(text: str, named: list[tuple[str, str, str, int, int, str]], taken: list[tuple[int, int]],
            same_message: bool, seen: dict[str, tuple[str, str]]) -> list[Candidate]:
    """The candidates "it" may point at in one sentence: ``named`` entity mentions as (key, name,
    category, start, end, kind) with their :func:`candidate_role`, and noun phrases the extractor
    did not take (blockers, unless the phrase is the name of an entity ``seen`` before: "Love the
    tattoo!" ... "Got the tattoo years ago, it stands for freedom"); ``same_message``: the
    pronoun is in this sentence's message."""
    out: list[Candidate] = []
    for key, name, category, start, end, kind in named:
        role = candidate_role(name, category, kind, text[:start], same_message=same_message)
        if role:
            out.append(Candidate(key, start, end, role == "chosen"))
    for c in unknown_things(text, taken, same_message=same_message):
        if c.key in seen:  # "the tattoo" after the entity "tattoo": that entity
            name, category = seen[c.key]
            role = candidate_role(name, category, "", text[: c.start], same_message=same_message)
            if role:
                out.append(Candidate(c.key, c.start, c.end, role == "chosen"))
        else:
            if c.chosen:
                seen[c.key] = (c.name, "thing")
            out.append(c)
    return sorted(out, key=lambda c: c.start)


def _prior_things(doc: _Doc, types_present: set[str], names: dict[str, tuple[str, str]]) -> list[list[Candidate]]:
    """Candidates of the last message before the current ones (the last speaker block of
    PREVIOUS MESSAGES' last episode), nearest sentence first; ``names`` learns their names."""
    prior = doc.previous
    if prior is None or not prior.sentences:
        return []
    ex = _Extractor(prior, types_present)
    last_block = prior.sentences[-1].block
    out: list[list[Candidate]] = []
    for s in prior.sentences:
        if s.block != last_block or s.code:
            continue
        named = []
        cands = _sentence_candidates(ex, s)
        for c in cands:
            if is_safe_entity_name(c.name.strip()):
                key = _norm_key(c.name.strip())
                names.setdefault(key, (c.name.strip(), c.category))
                named.append((key, c.name.strip(), c.category, c.start, c.end, c.kind))
        out.append(_things(s.text, named, [(c.start, c.end) for c in cands], False, names))
    return out[::-1]


@dataclass
class _SentenceThings:
    """One sentence's candidates for "it", as seen from its own message and from the next."""

    block: int
    same: list[Candidate]
    other: list[Candidate]


def _references(s: _Sentence, ms: list[_Mention], here: list[Candidate], things: list[_SentenceThings],
                prior_things: list[list[Candidate]]) -> list[Reference]:
    """The referring pronouns of sentence ``s`` resolved to an antecedent, in clauses that name
    nothing else (a first-person pronoun does not count); ``here``: its own candidates."""
    out: list[Reference] = []
    for start, end in referring(s.text):
        if any(m.start < end and start < m.end for m in ms):
            continue
        clause = next(((a, b) for a, b in _clauses(s.text) if a <= start < b), (0, len(s.text)))
        if any(clause[0] <= m.start < clause[1] and not m.pronoun for m in ms):
            continue
        # earlier sentences of this message and of the one before it, nearest first
        earlier = [t.same if t.block == s.block else t.other for t in reversed(things) if t.block in (s.block, s.block - 1)]
        if s.block == 0:
            earlier += prior_things
        key = antecedent(here, start, earlier)
        if key is not None:
            out.append(Reference(start, end, key))
    return out


def _extract(doc: _Doc, types_present: set[str], *, max_per_message: int, max_entities: int, max_fact_chars: int) -> ExtractionResult:
    ex = _Extractor(doc, types_present)
    entities: dict[str, _Entity] = {}
    per_block: Counter[int] = Counter()
    mentions: dict[int, list[_Mention]] = {}

    def register(name: str, category: str, sent: _Sentence) -> str | None:
        name = name.strip()
        if not is_safe_entity_name(name) or name.lower() in ROLE_WORDS:
            return None  # "User", "assistant": a speaker role is never an entity (a named speaker is)
        key = _norm_key(name)
        if key in entities:
            ent = entities[key]
            if category == "speaker" or (ent.category == "thing" and category not in ("thing", "date")):
                ent.category = category
            return key
        if per_block[sent.block] >= max_per_message or len(entities) >= max_entities:
            return None
        per_block[sent.block] += 1
        entities[key] = _Entity(name, category, set(), len(entities))
        return key

    blocks_with_error_type = {s.block for s in doc.sentences if re.search(r"\b[A-Z]\w*(?:Error|Exception|Warning)\b", s.text)}
    # speakers first (graphiti asks for the speaker as the first entity)
    speaker_keys: dict[str, str] = {}
    for s in doc.sentences:
        if s.speaker and s.speaker not in speaker_keys:
            k = register(s.speaker, "speaker", s)
            if k:
                speaker_keys[s.speaker] = k
                entities[k].episodes.add(s.episode)

    # coreference: per sentence, the mentions "it" may point at (see :mod:`.coreference`)
    things: list[_SentenceThings] = []
    names_seen: dict[str, tuple[str, str]] = {}
    prior_things = _prior_things(doc, types_present, names_seen)
    for i, s in enumerate(doc.sentences):
        text = s.text
        kept = _sentence_candidates(ex, s)
        if s.block not in blocks_with_error_type and re.search(r"\bTraceback\b", text) and not any(c.category == "error" for c in kept):
            pos = text.index("Traceback")
            kept.append(_Cand("Traceback", "error", pos, pos + len("Traceback")))
        ms: list[_Mention] = []
        for c in kept:
            key = register(c.name, c.category, s)
            if key is None:
                continue
            pkg_key = None
            if c.category == "version" and c.package:
                pkg_key = register(c.package, _tech_category(c.package) or "library", s)
                if pkg_key and c.package_span:
                    ms.append(_Mention(pkg_key, c.package_span[0], c.package_span[1], entities[pkg_key].category))
            ms.append(_Mention(key, c.start, c.end, entities[key].category, package_key=pkg_key))
        sk = speaker_keys.get(s.speaker or "")
        if sk and not s.code:
            for m in _FIRST_PERSON.finditer(text):
                if not any(x.start <= m.start() < x.end for x in ms):
                    ms.append(_Mention(sk, m.start(), m.end(), "speaker", pronoun=True))
        kinds = {(c.start, c.end): c.kind for c in kept}
        taken = [(m.start, m.end) for m in ms] + [(c.start, c.end) for c in kept]
        if not s.code:
            named = [(m.key, entities[m.key].name, m.category, m.start, m.end, kinds.get((m.start, m.end), "")) for m in ms if not m.pronoun]
            here = _things(text, named, taken, True, names_seen)
            for ref in _references(s, ms, here, things, prior_things):
                key = register(*names_seen[ref.key], s) if ref.key not in entities else ref.key
                if key is not None:
                    ms.append(_Mention(key, ref.start, ref.end, entities[key].category, refers=True))
                    kinds[(ref.start, ref.end)] = "reference"
        ms.sort(key=lambda m: (m.start, -m.end))
        mentions[i] = ms
        if not s.code:
            named = [(m.key, entities[m.key].name, m.category, m.start, m.end, kinds.get((m.start, m.end), "")) for m in ms if not m.pronoun]
            things.append(_SentenceThings(s.block, _things(text, named, taken, True, names_seen),
                                          _things(text, named, taken, False, names_seen)))
        for m in ms:
            if not m.pronoun:
                entities[m.key].episodes.add(s.episode)
                names_seen.setdefault(m.key, (entities[m.key].name, entities[m.key].category))

    builder = _FactBuilder(entities, max_fact_chars)
    for i, s in enumerate(doc.sentences):
        builder.sentence(s, mentions.get(i, []), speaker_keys.get(s.speaker or ""))
    _traceback_facts(builder, doc.sentences, mentions)
    ordered = sorted(entities.values(), key=lambda e: e.order)
    for e in ordered:
        if not e.episodes:
            e.episodes.add(0)
    return ExtractionResult(ordered, builder.facts)


def _facts_for_given_entities(doc: _Doc, names: list[tuple[str, list[str]]], max_fact_chars: int) -> list[_Fact]:
    """Facts between entity names given by the prompt (the separate extract_edges path)."""
    entities: dict[str, _Entity] = {}
    for i, (name, labels) in enumerate(names):
        if not is_safe_entity_name(name):
            continue
        key = _norm_key(name)
        if key in entities:
            continue
        specific = [lbl for lbl in labels if lbl != "Entity"]
        cat = _category_from_labels(name, specific)
        entities[key] = _Entity(name, cat, set(), i)
    patterns: list[tuple[str, re.Pattern[str]]] = []
    for key, ent in entities.items():
        surfaces = {ent.name}
        pm = re.match(r"^(.+?)['’]s (.+)$", ent.name)
        if pm:
            surfaces.add(f"my {pm.group(2)}")
        vm = _VERSION_SPEC.match(ent.name) or re.match(r"^(?P<pkg>[A-Za-z][\w.-]*) (?P<ver>\d[\w.]*)$", ent.name)
        for surface in surfaces:
            left = r"(?<![\w])" if surface[:1].isalnum() or surface[:1] == "_" else r"(?<![\w.])"
            right = r"(?![\w])" if surface[-1:].isalnum() or surface[-1:] == "_" else ""
            patterns.append((key, re.compile(left + re.escape(surface).replace(r"\ ", r"\s+") + right, re.I)))
        if vm:
            ent.category = "version"
    speakers = {s: _norm_key(s) for s in doc.speakers if _norm_key(s) in entities}
    builder = _FactBuilder(entities, max_fact_chars)
    for s in doc.sentences:
        found: list[_Mention] = []
        for key, rx in patterns:
            for m in rx.finditer(s.text):
                found.append(_Mention(key, m.start(), m.end(), entities[key].category))
        kept: list[_Mention] = []
        for m in sorted(found, key=lambda m: (-(m.end - m.start), m.start)):
            if any(not (m.end <= k.start or m.start >= k.end) for k in kept):
                continue
            kept.append(m)
        for m in kept:
            ent = entities[m.key]
            if ent.category == "version":
                pkg = (_VERSION_SPEC.match(ent.name) or re.match(r"^(?P<pkg>[A-Za-z][\w.-]*) ", ent.name))
                if pkg and _norm_key(pkg.group("pkg")) in entities:
                    m.package_key = _norm_key(pkg.group("pkg"))
        sk = speakers.get(s.speaker or "")
        if sk and not s.code:
            for m in _FIRST_PERSON.finditer(s.text):
                if not any(x.start <= m.start() < x.end for x in kept):
                    kept.append(_Mention(sk, m.start(), m.end(), "speaker", pronoun=True))
        kept.sort(key=lambda m: (m.start, -m.end))
        builder.sentence(s, kept, sk)
    return builder.facts
