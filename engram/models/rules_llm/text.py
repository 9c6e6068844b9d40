"""Limits and small text helpers shared by the other modules: name keys, the entity-name guard,
crude stemming, fact normalisation and masking.

A name that is empty, one character, longer than 80 characters, or made only of stopwords
and pronouns ("Is", "It", "This", "The", "I", "We", "It Is"...) is never emitted:
FalkorDB 4.16 crashed on such names (see shared/PLATFORM-NOTES.md). :func:`is_safe_entity_name`
is the guard; :data:`STOPWORDS` is its list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from engram.models.rules_llm.vocabulary import STOPWORDS

MAX_ENTITIES_PER_MESSAGE = 20
MAX_ENTITIES = 60
MAX_FACTS = 80
MAX_FACT_CHARS = 300
MAX_NAME_CHARS = 80
MAX_TARGETS_PER_CLAUSE = 5


def _norm_key(name: str) -> str:
    """graphiti's exact-name key: lower case, whitespace collapsed."""
    return re.sub(r"\s+", " ", name.lower()).strip()


def is_safe_entity_name(name: str) -> bool:
    """True if ``name`` may become an entity: 2-80 characters, has a letter or digit, and is
    not made only of :data:`STOPWORDS` (pronouns, determiners, auxiliaries...) or single
    letters. Case-insensitive: "Is", "IT", "This", "It Is", "I" are all rejected."""
    stripped = name.strip()
    if len(stripped) < 2 or len(stripped) > MAX_NAME_CHARS:
        return False
    if not any(ch.isalnum() for ch in stripped):
        return False
    low = stripped.lower().replace("’", "'")
    if low in STOPWORDS:
        return False
    words = [w for w in re.split(r"[\s\-_/.,;:!?\"()\[\]{}]+", low) if w]
    meaningful = [w for w in words if w not in STOPWORDS and len(w.strip("'")) > 1]
    if not meaningful:
        return False
    # "it's", "i'm": every word is a stopword once its clitic is split off
    if all(re.sub(r"'\w*$", "", w) in STOPWORDS or len(re.sub(r"'\w*$", "", w)) <= 1 for w in meaningful):
        return False
    return True


# A consonant doubled before "-ing"/"-ed" ("swimming", "stopped", "planned") is undoubled so the
# form meets "swims", "stops", "plans". Not l, s, f, z, d, r: "falling", "passing", "adding" keep
# them from their base ("falls", "adds").
_DOUBLED = re.compile(r"([bgmnpt])\1$")


def _stem(word: str) -> str:
    w = word.lower()
    for suf in ("ing", "ed", "es", "s"):
        if w.endswith(suf) and len(w) - len(suf) >= 2:
            w = w[: -len(suf)]
            if suf in ("ing", "ed"):
                w = _DOUBLED.sub(r"\1", w)
            break
    if w.endswith("e") and len(w) > 2:
        w = w[:-1]
    return w


_NEG_WORDS = {"not", "never", "no", "longer", "stopped", "stop", "stops", "quit", "quits", "left", "gave", "give", "up", "anymore", "more"}


# "won't" and "can't" are not "wo"/"ca" + "n't": left to the plain rule they leave a stray content
# stem that the earlier fact never holds ("The backup won't upload to Backblaze any more").
_IRREGULAR_NOT = {"won't": "will not", "can't": "can not", "shan't": "shall not"}


def _content_stems(text: str) -> list[str]:
    low = re.sub(r"\b(?:won|can|shan)'t\b", lambda m: _IRREGULAR_NOT[m.group(0)], text.lower().replace("’", "'"))
    words = re.findall(r"[\w.=+-]+", low.replace("n't", " not"))
    out = []
    for w in words:
        w = w.strip(".-")
        if not w or w in STOPWORDS or w in _NEG_WORDS:
            continue
        out.append(_stem(w))
    return out


def _norm_fact(text: str) -> str:
    t = text.lower().replace("’", "'")
    t = re.sub(r"[^\w\s=.+/-]", " ", t)
    t = re.sub(r"(?<!\w)[.\-/]|[.\-/](?!\w)", " ", t)
    return re.sub(r"\s+", " ", t).strip()


def _mask(text: str, spans: Iterable[tuple[int, int]], ch: str = "#") -> str:
    chars = list(text)
    for s, e in spans:
        for i in range(max(0, s), min(len(chars), e)):
            if not chars[i].isspace():
                chars[i] = ch
    return "".join(chars)
