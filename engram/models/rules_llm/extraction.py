"""The extraction pipeline: entity candidates (:mod:`.entities`) per speaker block, then facts
(:mod:`.facts`) between them; ``_facts_for_given_entities`` does the same for the names a
prompt gives (``extract_edges.edge``). Caps: ``max_entities_per_message`` new entities per
block, ``max_entities`` per prompt, ``max_fact_chars`` per fact.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from engram.models.rules_llm.entities import _Cand, _Extractor, _VERSION_SPEC, _category_from_labels, _resolve_overlaps, _tech_category
from engram.models.rules_llm.episodes import _Doc, _FIRST_PERSON, _INLINE_CODE, _REDACTED, _Sentence, _URL
from engram.models.rules_llm.facts import _Entity, _Fact, _FactBuilder, _Mention, _traceback_facts
from engram.models.rules_llm.relations import _find_verbs
from engram.models.rules_llm.text import _mask, _norm_key, is_safe_entity_name


@dataclass
class ExtractionResult:
    entities: list[_Entity]
    facts: list[_Fact]


def _extract(doc: _Doc, types_present: set[str], *, max_per_message: int, max_entities: int, max_fact_chars: int) -> ExtractionResult:
    ex = _Extractor(doc, types_present)
    entities: dict[str, _Entity] = {}
    per_block: Counter[int] = Counter()
    mentions: dict[int, list[_Mention]] = {}

    def register(name: str, category: str, sent: _Sentence) -> str | None:
        name = name.strip()
        if not is_safe_entity_name(name):
            return None
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
            k = register(s.speaker, "speaker" if s.speaker != "Assistant" else "thing", s)
            if k:
                speaker_keys[s.speaker] = k
                entities[k].episodes.add(s.episode)

    for i, s in enumerate(doc.sentences):
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
            cands += ex.decisions(prose)
        kept = _resolve_overlaps(cands)
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
        ms.sort(key=lambda m: (m.start, -m.end))
        mentions[i] = ms
        for m in ms:
            if not m.pronoun:
                entities[m.key].episodes.add(s.episode)

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
