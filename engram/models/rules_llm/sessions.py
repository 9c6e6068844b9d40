"""The session close stage's two prompts, answered offline and deterministically (extractive).

Prompt contract (services/sessions/close.py writes it): the user message holds ``<TRANSCRIPT>``,
a JSON list of ``{"role": "user"|"assistant", "name", "text"}`` (oldest first), and
``<PREVIOUS_SUMMARIES>``, a JSON list of earlier sessions' summaries (context for a real model;
ignored here: a summary of this segment states only what this segment says).

* ``HybridSessionSummary`` (``sessions.summary``): ``language`` from :func:`engram.text.language.detect_language`;
  ``narrative`` = one sentence naming the topics plus the 1-3 most informative user/assistant
  sentences (most content words, a bonus for a decision, a pending item or a self statement),
  in transcript order, each introduced by who said it -- the connecting words in the
  conversation's language (English or Turkish); ``topics`` = the rules extractor's entities
  (speakers left out), else the most repeated content words; ``decisions``, ``pending``,
  ``user_info`` = sentences with a cue phrase (English and Turkish lists below; user_info only
  from the user's own messages).
* ``UserFacts`` (``sessions.facts``): ``preferences`` only from explicit patterns ("my favourite
  K is V" -> ``favorite_k``, "I prefer V" -> ``theme`` for dark/light mode else ``prefers_<last
  word>``, "please answer in L" -> ``language``, "call me N" -> ``preferred_name``; Turkish "en
  sevdiğim K V", "K tercihim V", "Türkçe cevap ver", "bana N de"); ``notes`` = the user's self
  statements (the user_info sentences), English ones rewritten in the third person ("I am" ->
  "The user is"), Turkish ones kept as the user wrote them.

Limits: not a summariser. Sentences are chosen, not paraphrased; cue lists are short; a
preference phrased any other way is missed (a missed preference costs nothing; a wrong one would
be stored, hence explicit patterns only).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

from engram.text.language import detect_language
from engram.models.rules_llm.episodes import _analyse
from engram.models.rules_llm.extraction import _extract

MAX_ITEMS = 6
MAX_SENTENCE_WORDS = 40
MAX_TOPICS = 8
MAX_FACTS = 8

_SENTENCE = re.compile(r"(?<=[.!?…])\s+|\n+")
_GREETING = re.compile(r"^(?:hi|hello|hey|merhaba|selam|günaydın)\b[\s,!.]*", re.I)
_WORD = re.compile(r"[^\W_]+(?:['’][^\W_]+)?", re.UNICODE)

DECISION_CUES = re.compile(
    r"\b(?:decided|decide to|decision|let'?s go with|let’s go with|we'?ll use|we will use|i'?ll use|i will use|"
    r"chose|choose to|going with|instead of|settled on|opted for|agreed to|"
    r"karar|tercih ettim|tercih ettik|seçtik|seçtim|kullanacağız|kullanacağım|yerine|anlaştık)",
    re.I,
)
PENDING_CUES = re.compile(
    r"\b(?:todo|to-do|to do|need to|needs to|have to|haven'?t yet|not yet|still need|next step|later|"
    r"will need|remaining|pending|tomorrow|"
    r"henüz|yapılacak|yapılmadı|sonra|daha sonra|gerekiyor|lazım|bir sonraki adım|kaldı|ileride)",
    re.I,
)
_EN_SELF = re.compile(
    r"^\s*(?:(?:so|well|and|also|btw|actually|wow|oh|yeah|yes|ok|okay|hey|haha|honestly|sure)[,!]?\s+)?(?:I am|I'm|I’m|I work|I live|I have|I've been|I’ve been|"
    r"I study|I use|my\s+\w+)\b",
    re.I,
)
_TR_SELF = re.compile(
    r"(?:^|\s)ben\s|\b\w+?(?:y[ıiuü]m|(?<![dt])[ıiuü]m)\b|çalışıyorum|yaşıyorum|okuyorum|kullanıyorum|"
    r"\b(?:benim|adım)\b",
    re.I,
)
# words that end like a Turkish first-person form but are not one
_TR_NOT_SELF = frozenset("bir şim için yim bilim resim isim kim hem ekim düzenim".split())

_EN_STOP = frozenset(
    "the a an and or but if then so to of in on at for with from by as is are was were be been being it its this "
    "that these those there here i you he she we they me him her us them my your our their mine yours what which "
    "who whom how why when where do does did done have has had will would should could can may might must not no "
    "yes ok okay just also very really about into over under more most some any all each other such only own same "
    "than too now again let lets let's use used using like want need get got make sure thanks thank please hi hello "
    "well good great yeah right think know see going go one two".split()
)
_TR_STOP = frozenset(
    "ve veya ama fakat ile için gibi kadar daha çok az bir bu şu o ben sen biz siz onlar bunu şunu onu bana sana "
    "bize size benim senin bizim de da ki mi mı mu mü ne neden nasıl evet hayır tamam lütfen teşekkürler merhaba "
    "şimdi sonra henüz var yok olarak olan oldu olur değil her hiç en çünkü eğer ise diye".split()
)

# chat filler that repeats without being a topic
_FILLER = frozenset(
    "wow yeah yes haha lol omg hey awesome cool nice great thanks thank sure gonna wanna really totally "
    "amazing glad sounds sound love pretty super stuff things thing something anything everything "
    "harika süper tamam evet teşekkür teşekkürler selam merhaba".split()
)

WORDS = {
    "en": {
        "user": "The user", "assistant": "The assistant", "said": "said", "about": "The conversation was about {}.",
        "and": "and",
    },
    "tr": {
        "user": "Kullanıcı", "assistant": "Asistan", "said": "şunu söyledi", "about": "Konuşma {} hakkındaydı.",
        "and": "ve",
    },
}

_LANGUAGES = {
    "english": "English", "turkish": "Turkish", "german": "German", "french": "French", "spanish": "Spanish",
    "italian": "Italian", "dutch": "Dutch", "portuguese": "Portuguese", "russian": "Russian", "arabic": "Arabic",
    "türkçe": "Türkçe", "turkce": "Türkçe", "ingilizce": "İngilizce", "i̇ngilizce": "İngilizce",
    "almanca": "Almanca", "fransızca": "Fransızca", "ispanyolca": "İspanyolca",
}
_LANG_WORDS = "|".join(sorted((re.escape(k) for k in _LANGUAGES), key=len, reverse=True))
_VALUE = r"([^.!?,;\n]{1,80}?)"
_END = r"(?=\s*(?:[.!?,;\n]|$|\s+(?:and|but|because|ve|ama)\s))"
_PREFERENCE_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(rf"\bmy\s+favou?rite\s+(\w+(?:\s+\w+)?)\s+is\s+{_VALUE}{_END}", re.I), "favorite"),
    (re.compile(rf"\b(?:please\s+)?(?:answer|respond|reply|write|talk|speak)(?:\s+to\s+me)?\s+in\s+({_LANG_WORDS})\b", re.I),
     "language"),
    (re.compile(rf"\b(?i:call)\s+me\s+([A-ZÇĞİÖŞÜ][\w'-]{{0,30}})", re.UNICODE), "preferred_name"),
    (re.compile(rf"\bI\s+(?:would\s+)?prefer\s+{_VALUE}(?=\s*(?:[.!?,;\n]|$|\s+(?:over|to|instead|rather|and|but)\s))",
                re.I), "prefer"),
    (re.compile(rf"\ben\s+sevdiğim\s+(\w+)\s+{_VALUE}{_END}", re.I), "favorite"),
    (re.compile(rf"\b(\w+)\s+tercihim\s+{_VALUE}{_END}", re.I), "tercih"),
    (re.compile(rf"\b({_LANG_WORDS})\s+(?:cevap|yanıt)\s+ver", re.I), "language"),
    (re.compile(rf"\b({_LANG_WORDS})\s+(?:konuş|yaz)", re.I), "language"),
    (re.compile(r"\bbana\s+([A-ZÇĞİÖŞÜ][\w'-]{0,30})\s+(?:de|diye\s+hitap\s+et)\b", re.UNICODE), "preferred_name"),
)


# --- text helpers ----------------------------------------------------------------------------
def _lines(transcript: str | None) -> list[dict[str, str]]:
    """The ``<TRANSCRIPT>`` block's user and assistant lines with text."""
    try:
        data = json.loads(transcript or "[]")
    except ValueError:
        return []
    out = []
    for item in data if isinstance(data, list) else []:
        if isinstance(item, dict) and item.get("role") in ("user", "assistant") and str(item.get("text") or "").strip():
            out.append({"role": item["role"], "name": str(item.get("name") or ""), "text": str(item["text"])})
    return out


def _sentences(text: str) -> list[str]:
    out = []
    for part in _SENTENCE.split(text):
        part = _GREETING.sub("", " ".join(part.split()).strip(" -*•"))
        part = part[:1].upper() + part[1:]
        if len(_WORD.findall(part)) >= 2:
            words = part.split()
            out.append(" ".join(words[:MAX_SENTENCE_WORDS]) + ("…" if len(words) > MAX_SENTENCE_WORDS else ""))
    return out


def _content_words(sentence: str) -> list[str]:
    return [w for w in _WORD.findall(sentence.casefold()) if len(w) > 2 and w not in _EN_STOP and w not in _TR_STOP]


def _key(text: str) -> str:
    return " ".join(_WORD.findall(text.casefold()))


def _is_self_statement(sentence: str, language: str) -> bool:
    if _EN_SELF.search(sentence):
        return True
    if language != "tr" or sentence.rstrip().endswith("?"):
        return False
    for match in _TR_SELF.finditer(sentence):
        word = match.group(0).strip().casefold()
        if word not in _TR_NOT_SELF and len(word) > 4 or word in ("ben", "benim", "adım"):
            return True
    return False


def _third_person(sentence: str, subject: str = "") -> str:
    """An English self statement as a note about the user: "I am" -> "The user is" (or the
    user's name when the transcript gives one: "Caroline is")."""
    who = subject or "the user"
    out = re.sub(r"^\s*(?:(?:so|well|and|also|btw|actually|wow|oh|yeah|yes|ok|okay|hey|haha|honestly|sure)[,!]?\s+)",
                 "", sentence, flags=re.I)
    for pattern, repl in (
        (r"\bI am\b|\bI'm\b|\bI’m\b", f"{who} is"), (r"\bI've\b|\bI’ve\b", f"{who} has"),
        (r"\bI'd\b|\bI’d\b", f"{who} would"), (r"\bI'll\b|\bI’ll\b", f"{who} will"),
        (r"\bI have\b", f"{who} has"), (r"\bI was\b", f"{who} was"),
        (r"\bI (work|live|study|use|like|love|want|need|prefer|think)\b", None),
        (r"\bmy\b", f"{who}'s"), (r"\bme\b", who), (r"\bI\b", who),
    ):
        # replacements are literal text (a name may hold a backslash); only the verb is copied
        out = re.sub(pattern, lambda m, r=repl: r if r is not None else f"{who} {m.group(1)}s", out, flags=re.I)
    out = out.strip()
    return out[:1].upper() + out[1:] if out else out


def _slug(text: str) -> str:
    return "_".join(_WORD.findall(text.casefold()))[:60]


# --- the hybrid summary ----------------------------------------------------------------------
def _topics(lines: list[dict[str, str]]) -> list[str]:
    content = "\n".join(f"{line['role']}: {line['text']}" for line in lines)
    names: list[str] = []
    try:
        result = _extract(_analyse(content), {"Entity"}, max_per_message=20, max_entities=60, max_fact_chars=300)
        speakers = {"user", "assistant"} | {line["name"].casefold() for line in lines if line["name"]}
        names = [
            e.name for e in result.entities
            if e.category not in ("speaker", "date") and e.name.casefold() not in speakers
            # a sentence-initial run ("Lütfen Türkçe") or a lower-case object ("short") is no topic
            and e.name.split()[0].casefold() not in _EN_STOP | _TR_STOP and not e.name.islower()
            and not re.search(r"['’]", e.name)
        ]
    except Exception:  # the entity rules are best effort here: fall back to repeated words
        names = []
    if len(names) < 3:
        # repeated content words, not already part of a topic, not a speaker, not chat filler
        speakers = {w.casefold() for line in lines for w in line["name"].split()}
        counts = Counter(w for line in lines for s in _sentences(line["text"]) for w in set(_content_words(s)))
        seen = {w for n in names for w in _WORD.findall(n.casefold())}
        names += [w for w, c in counts.most_common()
                  if c >= 2 and len(w) >= 4 and w not in seen and w not in speakers and w not in _FILLER
                  and not re.search(r"['’]", w)][: MAX_TOPICS - len(names)]
    return names[:MAX_TOPICS]


def _cued(lines: list[dict[str, str]], cue: re.Pattern[str], roles: tuple[str, ...] = ("user", "assistant")) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for line in lines:
        if line["role"] not in roles:
            continue
        for sentence in _sentences(line["text"]):
            key = _key(sentence)
            if cue.search(sentence) and key not in seen and not sentence.rstrip().endswith("?"):
                seen.add(key)
                out.append(sentence)
    return out[:MAX_ITEMS]


def _user_info(lines: list[dict[str, str]], language: str) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for line in lines:
        if line["role"] != "user":
            continue
        for sentence in _sentences(line["text"]):
            key = _key(sentence)
            if key not in seen and _is_self_statement(sentence, language):
                seen.add(key)
                out.append(sentence)
    return out[:MAX_ITEMS]


def _narrative(lines: list[dict[str, str]], topics: list[str], cued: set[str], language: str) -> str:
    words = WORDS[language]
    scored: list[tuple[float, int, str, str]] = []
    order = 0
    for line in lines:
        for sentence in _sentences(line["text"]):
            content = _content_words(sentence)
            score = len(set(content)) + (3 if _key(sentence) in cued else 0) - (2 if sentence.endswith("?") else 0)
            speaker = line["name"] or words[line["role"]]
            scored.append((score, order, speaker, sentence))
            order += 1
    picked = sorted(sorted(scored, key=lambda s: (-s[0], s[1]))[:3], key=lambda s: s[1])
    parts: list[str] = []
    if topics:
        shown = topics[:3]
        joined = shown[0] if len(shown) == 1 else f"{', '.join(shown[:-1])} {words['and']} {shown[-1]}"
        parts.append(words["about"].format(joined))
    for _, _, speaker, sentence in picked:
        end = "" if sentence[-1:] in ".!?…" else "."
        parts.append(f"{speaker} {words['said']}: “{sentence}{end}”")
    return " ".join(parts[:4])


def session_summary(transcript: str | None) -> dict[str, Any]:
    """The ``HybridSessionSummary`` of the prompt's ``<TRANSCRIPT>`` block."""
    lines = _lines(transcript)
    language = detect_language(line["text"] for line in lines) or "en"
    topics = _topics(lines)
    decisions = _cued(lines, DECISION_CUES)
    pending = _cued(lines, PENDING_CUES)
    user_info = _user_info(lines, language)
    cued = {_key(s) for s in decisions + pending + user_info}
    return {
        "language": language,
        "narrative": _narrative(lines, topics, cued, language) if lines else "",
        "topics": topics,
        "decisions": decisions,
        "pending": pending,
        "user_info": user_info,
    }


# --- preferences and notes -------------------------------------------------------------------
def _preference(match: re.Match[str], kind: str) -> tuple[str, str] | None:
    if kind == "favorite":
        return f"favorite_{_slug(match.group(1))}", match.group(2).strip()
    if kind == "language":
        return "language", _LANGUAGES.get(match.group(1).casefold(), match.group(1).strip())
    if kind == "preferred_name":
        return "preferred_name", match.group(1).strip()
    if kind == "tercih":
        return _slug(match.group(1)), match.group(2).strip()
    value = match.group(1).strip()
    if re.search(r"\b(?:dark|light)\s+(?:mode|theme)\b", value, re.I):
        return "theme", value
    words = _WORD.findall(value)
    if not words:
        return None
    return f"prefers_{_slug(words[-1])}", value


def user_facts(transcript: str | None) -> dict[str, Any]:
    """The ``UserFacts`` of the prompt's ``<TRANSCRIPT>`` block."""
    lines = _lines(transcript)
    language = detect_language(line["text"] for line in lines) or "en"
    preferences: dict[str, str] = {}
    for line in lines:
        if line["role"] != "user":
            continue
        for sentence in _sentences(line["text"]):
            if sentence.rstrip().endswith("?"):
                continue
            for pattern, kind in _PREFERENCE_PATTERNS:
                for match in pattern.finditer(sentence):
                    found = _preference(match, kind)
                    if found and found[0] and found[1]:
                        preferences.pop(found[0], None)
                        preferences[found[0]] = found[1]  # a later statement wins
    user_names = [line["name"] for line in lines if line["role"] == "user" and line["name"]]
    subject = user_names[0] if user_names and len(set(user_names)) == 1 else ""
    notes = [_third_person(s, subject) if language == "en" else s for s in _user_info(lines, language)]
    return {
        "preferences": [{"key": k, "value": v} for k, v in list(preferences.items())[-MAX_FACTS:]],
        "notes": notes[:MAX_FACTS],
    }
