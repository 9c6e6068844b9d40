"""Text analysis: an episode block -> speaker blocks -> sentences (:class:`_Doc`).

Speakers come from ``role (Name):`` and ``Name:`` prefixes (the form engram's ``render_turn``
writes; unnamed ``user:``/``assistant:`` become "User" and "Assistant"); ``[Episode N]`` and
``[CONTEXT EPISODE]`` headers mark episodes (context episodes are never extracted from);
code lines, URLs, e-mail addresses and redaction placeholders are marked so they are never
split into sentences or names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

from engram.models.rules_llm.coreference import last_previous_message
from engram.models.rules_llm.dates import _parse_datetime
from engram.models.rules_llm.text import is_safe_entity_name
from engram.models.rules_llm.vocabulary import COMMON_WORDS, STOPWORDS


_EPISODE_HEADER = re.compile(r"^\[(?:Episode (\d+)|CONTEXT EPISODE)\] \(timestamp: ([^)\n]*)\)[ \t]*$", re.M)
_ROLE_LABEL = re.compile(
    r"^[ \t]*(?P<role>user|assistant|system|tool|human|ai|bot)(?:[ \t]*\((?P<name>[^()\n]{1,60})\))?[ \t]*:[ \t]?",
    re.I,
)
_NAME_LABEL = re.compile(r"^[ \t]*(?P<name>[A-Z][\w'’.-]*(?: [A-Z][\w'’.-]*){0,2})[ \t]*:[ \t]+(?=\S)")
_LABEL_STOP = frozenset(
    "note notes error warning traceback file step example examples output input result update edit fix "
    "summary question answer q a re subject from to date time ps todo nb tip hint reason cause solution "
    "problem issue status decision context goal usage options returns args raises http https usage "
    "important caution info debug details description title name type value key command run".split()
)
_CODE_LINE = re.compile(
    r'^\s*(?:Traceback \(most recent call last\):|File "[^"]+", line \d+|\$ |>>> |at [\w.$<>]+\(|\^+\s*$|\.\.\. )'
    r"|^(?: {4,}|\t)\S"
)
#: a sentence ends after . ! ? … (and closing quotes/brackets) before a capital, digit, quote...
_SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*(?=\s+[\"'“‘(\[]?[A-Z0-9`/~.\[])|[!?][\"'”’)\]]*(?=\s)")
_CLAUSE_SPLIT = re.compile(
    r";\s+|,\s+(?=(?:and|but|so|then|when|because|while|which|after|before|although|though|if|since)\b)"
    r"|\s+(?=(?:when|because|while|although|though|whereas|but|so that|unless)\s)",
)
_FIRST_PERSON = re.compile(r"(?<![\w'’-])(?:I(?:'m|’m|'ve|’ve|'ll|’ll|'d|’d)?|[Mm]e|[Mm]y|[Mm]ine|[Mm]yself|[Ww]e|[Uu]s|[Oo]ur|[Oo]urs|[Oo]urselves)(?![\w'’-])")
_URL = re.compile(r"\b(?:https?|ftp|file|ssh|git)://\S+|\bwww\.\S+", re.I)
# engram's turn-detector replaces secrets by typed placeholders: never entities.
_REDACTED = re.compile(r"\[REDACTED:[a-z_]+\]")
_EMAIL = re.compile(r"^[\w.+-]+@[\w-]+\.[\w.-]+$")
_INLINE_CODE = re.compile(r"`([^`\n]{1,200})`")


@dataclass
class _Sentence:
    text: str
    speaker: str | None  # display name of the speaker, if any
    episode: int
    reference: datetime | None
    code: bool
    block: int
    start_of_line: bool = True


@dataclass
class _Doc:
    sentences: list[_Sentence]
    speakers: list[str]  # speakers of CURRENT content, in order
    known_people: set[str]  # lower-case speaker names seen anywhere (incl. previous messages)
    lower_words: set[str]  # words that occur in lower case somewhere in the content
    n_blocks: int = 0
    #: lower-cased words that occur capitalised after a lower-case word (not a sentence start)
    mid_caps: set[str] = field(default_factory=set)
    #: the last episode of PREVIOUS MESSAGES, analysed: where "it" in the first message may point
    previous: _Doc | None = None


def _speaker_of(line: str) -> tuple[str | None, int, bool] | None:
    """(speaker, label length, is_label) if the line starts a speaker block."""
    m = _ROLE_LABEL.match(line)
    if m:
        role = m.group("role").lower()
        name = (m.group("name") or "").strip()
        if name and is_safe_entity_name(name):
            return name, m.end(), True
        if role in ("user", "human"):
            return "User", m.end(), True
        if role in ("assistant", "ai", "bot"):
            return "Assistant", m.end(), True
        return None, m.end(), True
    m = _NAME_LABEL.match(line)
    if m:
        name = m.group("name").strip()
        low = name.lower()
        if (
            low.split()[0] not in _LABEL_STOP
            and low not in COMMON_WORDS
            and not re.search(r"(?:Error|Exception|Warning)$", name)
            and is_safe_entity_name(name)
            and not any(w.lower() in STOPWORDS for w in name.split())
        ):
            return name, m.end(), True
    return None


def _split_sentences(text: str) -> list[tuple[str, bool]]:
    """(sentence, code?) pieces of one speaker block."""
    out: list[tuple[str, bool]] = []
    in_fence = False
    fence: list[str] = []
    for line in text.split("\n"):
        if line.strip().startswith("```"):
            if in_fence:
                out.extend((f, True) for f in fence if f.strip())
                fence = []
            in_fence = not in_fence
            continue
        if in_fence:
            fence.append(line)
            continue
        if not line.strip():
            continue
        if _CODE_LINE.match(line):
            out.append((line.strip(), True))
            continue
        line = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s+", "", line)
        line = line.strip()
        last = 0
        for m in _SENTENCE_END.finditer(line):
            if line[last : m.end()].strip():
                out.append((line[last : m.end()].strip(), False))
            last = m.end()
        if line[last:].strip():
            out.append((line[last:].strip(), False))
    out.extend((f, True) for f in fence if f.strip())
    return out


def _speaker_names(text: str | None) -> set[str]:
    names: set[str] = set()
    if not text:
        return names
    for line in text.replace("\\n", "\n").split("\n"):
        line = re.sub(r'^\s*\{?"content":\s*"', "", line)
        got = _speaker_of(line)
        if got and got[0]:
            names.add(got[0].lower())
            names.add(got[0].split()[0].lower())
    return names


def _analyse(content: str, previous: str | None = None, reference: datetime | None = None) -> _Doc:
    episodes: list[tuple[int | None, datetime | None, str]] = []
    headers = list(_EPISODE_HEADER.finditer(content))
    if not headers:
        episodes.append((0, reference, content))
    else:
        if content[: headers[0].start()].strip():
            episodes.append((0, reference, content[: headers[0].start()]))
        for i, h in enumerate(headers):
            end = headers[i + 1].start() if i + 1 < len(headers) else len(content)
            idx = int(h.group(1)) if h.group(1) is not None else None
            episodes.append((idx, _parse_datetime(h.group(2)) or reference, content[h.end() : end]))
    sentences: list[_Sentence] = []
    speakers: list[str] = []
    block = -1
    for idx, ref, text in episodes:
        if idx is None:  # [CONTEXT EPISODE]: context only, never extracted from
            continue
        speaker: str | None = None
        buf: list[str] = []
        in_fence = False

        def flush() -> None:
            nonlocal block
            if not buf:
                return
            block += 1
            for sent, code in _split_sentences("\n".join(buf)):
                sentences.append(_Sentence(sent, speaker, idx, ref, code, block))
            buf.clear()

        for line in text.split("\n"):
            if line.strip().startswith("```"):
                in_fence = not in_fence
            got = None if in_fence else _speaker_of(line)
            if got is not None:
                flush()
                speaker = got[0]
                if speaker and speaker not in speakers:
                    speakers.append(speaker)
                buf.append(line[got[1] :])
            else:
                buf.append(line)
        flush()
    known = {s.lower() for s in speakers} | {s.split()[0].lower() for s in speakers} | _speaker_names(previous)
    known -= {"user", "assistant"}
    lower_words = set(re.findall(r"(?<![\w'])[a-z][a-z'-]+", content))
    mid_caps = {w.lower() for s in sentences if not s.code for w in re.findall(r"(?<=[a-z0-9,] )[A-Z][\w'-]+", s.text)}
    last = last_previous_message(previous)
    prior = _analyse(last, None, reference) if last is not None else None
    return _Doc(sentences, speakers, known, lower_words, block + 1, mid_caps, prior)
