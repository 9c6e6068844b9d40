"""Node and edge resolution.

Nodes (``NodeResolutions``, ``NodeDuplicate``): a duplicate is an existing candidate whose name
equals the new name case-insensitively after stripping punctuation, or differs only by a
trailing "s" on the last word; two names whose specific types (labels other than ``Entity``)
are both set and disjoint are never duplicates. Otherwise ``duplicate_candidate_id = -1``.

Edge resolution (``EdgeDuplicate``; ``idx`` numbering runs over EXISTING FACTS then FACT
INVALIDATION CANDIDATES, as graphiti sends them):

* duplicates: EXISTING FACTS whose normalised text (lower case, punctuation and extra spaces
  removed) equals the new fact's;
* contradictions (either list), any of:
  1. polarity: exactly one of the two facts carries a negation cue ("not", "n't", "never",
     "no longer", "stopped", "quit", "left", "gave up", "anymore"; a contrast "..., not Google
     Meet" is none) and at least 75% (and at least 2) of the old fact's content words (crudely
     stemmed, stopwords and cues removed) occur in the new fact;
  2. a change phrase in one fact ends the other (:func:`.changes.supersedes`): "switched/
     moved/migrated S to Y" or "... from X to Y", "replaced X with Y", "swapped X for Y",
     "Y instead of / rather than X", "Y now, not X", "no longer ...", "not ... any more", with the
     subject in the same words. Either way round: turns of two sessions reach the extractor in
     the order their sessions closed, not the order they were said, so the switch can be in the
     graph before the older "S uses X" arrives. The two contradict whichever came first;
     graphiti's resolve_extracted_edge compares their ``valid_at`` and ends the older one (a
     late-arriving older fact is stored already invalid, ``invalid_at`` = the switch's date).
     The reverse reading needs a switch of a subject of two words or more ("the billing
     service"): "Ada moved to Austin" must not end "Ada uses FastAPI" told after it;
  3. single-valued relation: both facts state LIVES_IN (lives in, moved to, relocated to, is
     based in) or WORKS_AT (works at/for, joined + a capitalised name) with the same subject
     words before the verb ("Maya's brother" is not "Maya") and different object words after it;
  4. versions: both facts give a version of the same package and the versions differ.
"""

from __future__ import annotations

import re
from typing import Any

from engram.models.rules_llm.entities import _SPACE_VERSION, _TOKEN, _VERSION_SPEC, _tech_category
from engram.models.rules_llm.changes import CONTRAST, supersedes
from engram.models.rules_llm.relations import _NEG_NOT, _NEG_STOP
from engram.models.rules_llm.text import _content_stems, _norm_fact
from engram.models.rules_llm.vocabulary import AMBIGUOUS_TECH


def _name_keys(name: str) -> tuple[str, str]:
    low = name.lower().replace("’", "'")
    key = re.sub(r"[^\w\s]", "", low)
    key = re.sub(r"\s+", " ", key).strip()
    words = key.split()
    if words and len(words[-1]) > 3 and words[-1].endswith("s") and not words[-1].endswith("ss"):
        variant = " ".join(words[:-1] + [words[-1][:-1]])
    else:
        variant = key
    return key, variant


def _labels(value: Any) -> set[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        return set()
    return {str(v) for v in value if str(v) != "Entity"}


def resolve_node(name: str, labels: set[str], candidates: list[dict[str, Any]]) -> int:
    """candidate_id of the existing entity that duplicates ``name``, else -1."""
    key, variant = _name_keys(name)
    if not key:
        return -1
    best: tuple[int, int] | None = None
    for c in candidates:
        try:
            cid = int(c.get("candidate_id", c.get("idx", -1)))
        except (TypeError, ValueError):
            continue
        cname = str(c.get("name", ""))
        ckey, cvariant = _name_keys(cname)
        if not ckey:
            continue
        clabels = _labels(c.get("entity_types", c.get("labels", [])))
        if labels and clabels and not (labels & clabels):
            continue
        if ckey == key:
            rank = 0
        elif cvariant == variant:
            rank = 1
        else:
            continue
        if best is None or (rank, cid) < best:
            best = (rank, cid)
    return best[1] if best else -1


_SINGLE_VALUED_RES = [
    (re.compile(r"\b(?:lives?|lived|living|resides?|resided|residing|(?:is|am|are|was) based) in\b|\b(?:moved|moves|relocated|relocates) (?:back )?to\b", re.I), "LIVES_IN"),
    (re.compile(r"\b(?:works?|worked|working|is employed) (?:at|for)\b|\bjoined\b(?= (?:the )?(?-i:[A-Z]))", re.I), "WORKS_AT"),
]


def _svo(fact: str) -> list[tuple[str, tuple[str, ...], tuple[str, ...]]]:
    out = []
    for rx, rel in _SINGLE_VALUED_RES:
        m = rx.search(fact)
        if not m:
            continue
        subj = tuple(_content_stems(fact[: m.start()]))
        obj_text = re.split(r"[.,;!?]| since | until | from | because | in (?:19|20)\d\d", fact[m.end() :])[0]
        obj = tuple(_content_stems(obj_text))
        if subj and obj:
            out.append((rel, subj, obj))
    return out


def _versions(fact: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for tok in _TOKEN.findall(fact):
        vm = _VERSION_SPEC.match(tok.rstrip(".,;:"))
        if vm:
            out[vm.group("pkg").lower()] = vm.group("ver")
    for m in _SPACE_VERSION.finditer(fact):
        if _tech_category(m.group("pkg")) or m.group("pkg").lower() in AMBIGUOUS_TECH:
            out.setdefault(m.group("pkg").lower(), m.group("ver"))
    return out


def _is_negated(fact: str) -> bool:
    fact = CONTRAST.sub(", ", fact)  # "Zoom now, not Google Meet" says Zoom holds: no negation
    return bool(_NEG_STOP.search(fact) or _NEG_NOT.search(fact) or re.search(r"\b(?:left|anymore)\b", fact, re.I))


def contradicts(new: str, old: str) -> bool:
    """True if ``new`` makes ``old`` false by one of the documented lexical rules."""
    n_stems, o_stems = _content_stems(new), _content_stems(old)
    if not o_stems:
        return False
    # 1. polarity flip over (mostly) the same content
    if _is_negated(new) != _is_negated(old):
        covered = sum(1 for s in set(o_stems) if s in set(n_stems))
        if covered >= 2 and covered / len(set(o_stems)) >= 0.75:
            return True
    # 2. a change phrase, in either fact: "switched X to Y", "replaced X with Y", "Y instead of X",
    # "no longer" (which of the two holds is graphiti's call, by their valid_at)
    if supersedes(new, old) or supersedes(old, new, min_switch_context=2):
        return True
    # 3. single-valued relations: same subject, different object
    for rel_n, subj_n, obj_n in _svo(new):
        for rel_o, subj_o, obj_o in _svo(old):
            if rel_n == rel_o and set(subj_n) == set(subj_o) and set(obj_n) != set(obj_o) and not _is_negated(new) and not _is_negated(old):
                return True
    # 4. versions of one package
    vn, vo = _versions(new), _versions(old)
    for pkg, ver in vn.items():
        if pkg in vo and vo[pkg] != ver:
            return True
    return False


def resolve_edge(new_fact: str, existing: list[dict[str, Any]], candidates: list[dict[str, Any]]) -> dict[str, list[int]]:
    duplicates: list[int] = []
    contradicted: list[int] = []
    norm_new = _norm_fact(new_fact)
    for item in existing:
        idx, fact = int(item.get("idx", -1)), str(item.get("fact", ""))
        if idx < 0:
            continue
        if _norm_fact(fact) == norm_new:
            duplicates.append(idx)
        elif contradicts(new_fact, fact):
            contradicted.append(idx)
    for item in candidates:
        idx, fact = int(item.get("idx", -1)), str(item.get("fact", ""))
        if idx < 0 or _norm_fact(fact) == norm_new:
            continue
        if contradicts(new_fact, fact):
            contradicted.append(idx)
    return {"duplicate_facts": duplicates, "contradicted_facts": contradicted}
