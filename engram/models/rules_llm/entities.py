"""Entities (regex/heuristics, per speaker block; at most ``max_entities_per_message`` new ones
per block and ``max_entities`` per prompt):

* files and paths: tokens with a known extension (``src/app.py``, ``pyproject.toml``,
  ``/etc/x.conf``, ``.env``), well-known file names (``Dockerfile``, ``Makefile``), paths that
  start with ``/``, ``~/``, ``./`` or a common source directory (``src/``, ``tests/``...);
* tools and commands: a fixed vocabulary of CLIs (``pytest``, ``pip``, ``docker compose``,
  ``git``...) -- words that are also English (``make``, ``go``, ``black``, ``requests``) only in
  backticks or in command position -- the first word of a backticked command, the installer
  and the packages of ``pip install x`` / ``uv add x`` / ``npm install x`` ...;
* libraries (typed ``Concept`` as engram's template asks, else ``Tool``) and versions:
  ``pydantic==2.14``, ``httpx 0.28``, ``Python 3.11``, "upgraded pydantic to 2.15" give the
  package and a version entity (``pydantic==2.14``, ``httpx 0.28``) linked by ``USES_VERSION``;
* errors: ``*Error``/``*Exception``/``*Warning`` names (with ``[Errno N]`` or a short quoted
  message: ``OSError: [Errno 98]``, ``KeyError: 'group_id'``), errno codes, ``Segmentation
  fault``, HTTP status phrases, ``Traceback`` when no error type is named;
* code identifiers: CamelCase class names and backticked identifiers (``Concept``);
* people, places, organisations: runs of capitalised words, split at stopwords. At the start
  of a sentence a run loses leading common words and verb forms, and a lone capitalised word
  there is kept only with support (a speaker or known name, or the same word capitalised
  mid-sentence elsewhere): chat is full of "Wow", "Got", "Lost" sentence starters. Speakers come
  from ``role (Name):`` and ``Name:`` prefixes (the form engram's ``render_turn`` writes;
  unnamed ``user:``/``assistant:`` are roles, never entities (issue 24 item 6)); "my dad"
  -> "Caroline's dad"; "<Capitalised> ... group/club/center" phrases ("LGBTQ support group");
  quoted titles ("Finding Freedom"); short lower-case objects of a few verbs ("loves
  painting", "painted a lake sunrise", "plays golf", "quit swimming"). Person/Place/
  Organization come from cues (speaker names, "with", "met", "in"/"from", "works at", suffixes
  like "University", "Park", "Inc") and short lists of well-known places and organisations,
  else the default type;
* dates: ISO dates, "8 May 2023", "May 8, 2023", "May 2023" (type ``Entity``; as fact targets
  they get ``OCCURRED_ON``); a ``Decision`` entity ("decided to X") only when that type exists.

``entity_type_id``: the id of the first custom type in ``<ENTITY TYPES>`` named for the
entity's category (case-insensitive): File; Tool; Concept, else Tool, for libraries and
versions; Error; Person; Place or Location; Organization or Organisation; Decision; Concept
for code identifiers. Otherwise the default ``Entity`` type's id.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engram.models.rules_llm.dates import find_dates
from engram.models.rules_llm.episodes import _Doc, _EMAIL, _INLINE_CODE
from engram.models.rules_llm.relations import _OBJECT_RELATIONS, _ONE_WORD_OBJECT_RELATIONS, _VERB_RES, _VerbHit
from engram.models.rules_llm.text import is_safe_entity_name
from engram.models.rules_llm.vocabulary import AMBIGUOUS_TECH, CLI_TOOLS, COMMON_WORDS, ERRNO_CODES, FILE_EXTENSIONS, GENERIC_ACRONYMS, GENERIC_NOUNS, KIN_WORDS, KNOWN_DIRS, KNOWN_FILENAMES, KNOWN_ORGS, KNOWN_PLACES, LIBRARIES, STOPWORDS, _CALENDAR_WORDS, _GROUP_HEADS, _IRREGULAR_PAST, _ORG_SUFFIX, _PET_WORDS, _PLACE_SUFFIX


#: category -> entity type names to look for (first present wins), else the default type 0.
CATEGORY_TYPES: dict[str, tuple[str, ...]] = {
    "file": ("File",),
    "tool": ("Tool",),
    "library": ("Concept", "Tool"),
    "version": ("Concept",),
    "error": ("Error",),
    "concept": ("Concept",),
    "person": ("Person",),
    "speaker": ("Person",),
    "place": ("Place", "Location"),
    "org": ("Organization", "Organisation"),
    "decision": ("Decision",),
    "date": (),
    "thing": (),
}
_PRIORITY = {"file": 9, "error": 8, "version": 8, "date": 7, "tool": 6, "library": 6, "concept": 5,
             "group": 5, "kin": 5, "person": 4, "place": 4, "org": 4, "thing": 4, "object": 2, "decision": 1}


@dataclass
class _Cand:
    name: str
    category: str
    start: int
    end: int
    kind: str = ""  # priority class; defaults to category
    package: str | None = None  # for versions: the package name
    package_span: tuple[int, int] | None = None

    @property
    def priority(self) -> int:
        return _PRIORITY.get(self.kind or self.category, 3)


def _tech_category(word: str) -> str | None:
    low = word.lower()
    if low in CLI_TOOLS:
        return "tool"
    if low in LIBRARIES:
        return "library"
    return None


_TOKEN = re.compile(r"[^\s`'\"“”‘’()<>\[\]{},;|]+")
_VERSION_SPEC = re.compile(r"^(?P<pkg>[A-Za-z][\w.-]*?)(?:\[[\w,.-]+\])?(?P<op>===|==|>=|<=|~=|!=|@)v?(?P<ver>\d[\w.+-]*)$")
_FILE_TOKEN = re.compile(rf"^(?:~|\.{{1,2}})?/?(?:[\w@+.-]+/)*[\w@+.-]*\.(?:{FILE_EXTENSIONS})$", re.I)
_ERROR_TOKEN = re.compile(r"^(?:[a-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Warning|Exit|Interrupt|Fault)$")
_CAMEL = re.compile(r"^[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]+)+$")
_SPACE_VERSION = re.compile(r"(?<![\w.=/-])(?P<pkg>[A-Za-z][\w.-]*[A-Za-z0-9])(?P<sep>\s+v?|\s+(?:to|from|version|at)\s+v?)(?P<ver>\d+\.\d+(?:\.\d+)*(?:[a-z]+\d*)?)(?!\w|\.\w)")
_INSTALL = re.compile(
    r"(?<![\w-])(?P<tool>pip3?|uv pip|uv|poetry|pipx|pdm|npm|pnpm|yarn|apt-get|apt|brew|cargo|go|gem|conda|mamba)\s+"
    r"(?P<verb>install|add|get|i)\s+(?P<args>(?:-{1,2}[\w-]+(?:=\S+)?\s+)*(?:[\w@./\[\],=<>~!+-]+(?:\s+|$)){1,8})",
)
_ERROR_PHRASE = re.compile(
    r"(?i:\bsegmentation fault\b|\bcore dumped\b|\bout of memory\b)|\b(?:HTTP\s)?[45]\d\d (?:Not Found|Internal Server Error|Bad Request|Unauthorized|Forbidden|Bad Gateway|Service Unavailable|Gateway Timeout|Too Many Requests|Conflict)\b"
)
_NAME_RUN = re.compile(r"(?<![\w'’@./#-])[A-Z][\w'’&.-]*(?:[ \t]+(?:(?:of|the|de|da|du|van|von|der|del|la|le|di|&)[ \t]+)?[A-Z][\w'’&-]*)*")
_CONNECTORS = {"of", "the", "de", "da", "du", "van", "von", "der", "del", "la", "le", "di", "&"}
_GROUP_PHRASE = re.compile(
    r"(?<![\w'-])((?:[A-Z][\w'’&-]*[ \t]+){1,3}(?:[a-z][\w'-]*[ \t]+){0,2}(?:"
    + "|".join(sorted(_GROUP_HEADS, key=len, reverse=True))
    + r"))(?![\w-])"
)
_KIN = re.compile(rf"(?<![\w'’])(?P<owner>[Mm]y|[A-Z][a-z]+(?:'s|’s))\s+(?P<noun>(?:(?:little|big|older|younger|best|new|old|late|baby)\s+)?(?:{KIN_WORDS}))(?=['’]s\b|[^\w'’-]|$)")
_PERSON_BEFORE = re.compile(r"(?:\b(?:with|met|meet|meeting|told|tell|asked|ask|call|called|thanks|thank you|hey|hi|hello|dear|mr\.?|mrs\.?|ms\.?|dr\.?|friend|brother|sister|mom|dad|wife|husband|son|daughter|cousin|aunt|uncle|named|and|by)\s*,?\s*$)", re.I)
_PERSON_AFTER = re.compile(r"^\s*(?:said|says|told|asked|wrote|and I|and me|'s (?:" + KIN_WORDS + r")\b|[!,]\s*$)", re.I)
_PLACE_BEFORE = re.compile(r"\b(?:in|from|near|to|visited|visiting|visit|moved to|trip to|flew to|travell?ed to|drove to|live in|lives in|living in|based in|around)\s+(?:the\s+)?$", re.I)
_ORG_BEFORE = re.compile(r"\b(?:at|for|joined|join|hired by|interview(?:ed)? (?:at|with)|works? (?:at|for)|worked (?:at|for)|working (?:at|for)|employed by)\s+(?:the\s+)?$", re.I)
_OBJECT_STOP = STOPWORDS | GENERIC_NOUNS | {
    "yesterday", "today", "tomorrow", "tonight", "last", "next", "ago", "recently", "again", "earlier",
    "later", "every", "so", "really", "too", "lot", "much", "because", "since", "though", "although",
    # an ending or a replacement after the object ("plays golf anymore", "chess instead of golf"),
    # and adverbs that follow an activity verb ("practicing hard", "play together")
    "anymore", "instead", "rather", "hard", "together", "alone", "outside", "online",
}
_DETERMINERS = re.compile(r"^(?:(?P<det>a|an|the|my|our|some|his|her|their|this|that|these|those|your)\s+)?", re.I)


def _is_command_position(text: str, start: int, end: int, word: str) -> bool:
    """For ambiguous tech words: backticked, in command position, imported or installed."""
    before = text[max(0, start - 30) : start]
    after = text[end : end + 30]
    if start > 0 and text[start - 1] == "`":
        return True
    if re.search(r"(?:\bimport|\bfrom|\binstall|\badd|\bwith the|\busing the)\s+$", before, re.I):
        if word.lower() in ("code", "make", "go"):
            return False
        return True
    if re.match(r"\s*(?:library|package|module|lib|crate|gem|framework|cli)\b", after, re.I):
        return True
    follow = AMBIGUOUS_TECH.get(word.lower(), "")
    return bool(follow) and bool(re.match(r"\s+" + follow, after))


class _Extractor:
    """Entity candidates of one sentence."""

    def __init__(self, doc: _Doc, types_present: set[str]):
        self.doc = doc
        self.types_present = types_present

    # -- token based: files, paths, versions, errors, identifiers, tech words -----------------
    def tokens(self, text: str, masked_urls: str, code: bool) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _TOKEN.finditer(masked_urls):
            raw = m.group(0)
            tok = raw.rstrip(".,:;!?")
            tok_start = m.start()
            lead = len(tok) - len(tok.lstrip("*_"))
            tok = tok.lstrip("*_")
            tok_start += lead
            tok_end = tok_start + len(tok)
            if len(tok) < 2 or "://" in tok or _EMAIL.match(tok):
                continue
            in_backticks = tok_start > 0 and text[tok_start - 1] == "`"
            low = tok.lower()
            vm = _VERSION_SPEC.match(tok)
            if vm:
                pkg = vm.group("pkg")
                name = f"{pkg}{vm.group('op')}{vm.group('ver')}"
                out.append(_Cand(name, "version", tok_start, tok_end, package=pkg, package_span=(tok_start, tok_start + len(pkg))))
                continue
            if _tech_category(tok) and ("/" not in tok):
                out.append(_Cand(tok, _tech_category(tok) or "tool", tok_start, tok_end))
                continue
            basename = tok.rstrip("/").rsplit("/", 1)[-1]
            if (_FILE_TOKEN.match(tok) and not re.match(r"^[\d.]+$", basename.rsplit(".", 1)[0] or "x")) or basename in KNOWN_FILENAMES:
                after = masked_urls[tok_end : tok_end + 1]
                if after == "(":
                    continue
                if re.match(r"^(?:e\.g|i\.e|a\.m|p\.m|etc|vs)\.?$", low):
                    continue
                out.append(_Cand(tok, "file", tok_start, tok_end))
                continue
            if "/" in tok and self._is_path(tok):
                out.append(_Cand(tok, "file", tok_start, tok_end))
                continue
            if _ERROR_TOKEN.match(tok):
                name = tok
                rest = text[tok_end : tok_end + 80]
                em = re.match(r":\s*(\[Errno \d+\])", rest) or re.match(r":\s*('[^'\n]{1,40}'|\"[^\"\n]{1,40}\")(?=\s*(?:$|[\s.,;)]))", rest)
                end = tok_end
                if em:
                    name = f"{tok}: {em.group(1)}"
                    end = tok_end + em.end()
                    if em.group(1).startswith("[Errno"):
                        # the errno message ("Address already in use") belongs to the error
                        msg = re.match(r"[^.;\n]*?(?=\s+(?:when|while|after|because|since)\s|[.;\n]|$)", text[end:])
                        end += msg.end() if msg else 0
                out.append(_Cand(name, "error", tok_start, end))
                continue
            if tok in ERRNO_CODES:
                out.append(_Cand(tok, "error", tok_start, tok_end))
                continue
            if low in AMBIGUOUS_TECH and _is_command_position(text, tok_start, tok_end, tok):
                out.append(_Cand(tok, "library" if low in ("requests", "click", "rich", "hypothesis", "express", "spark") else "tool", tok_start, tok_end))
                continue
            if _CAMEL.match(tok) and not code:
                out.append(_Cand(tok, "concept", tok_start, tok_end))
                continue
            if in_backticks and re.match(r"^[A-Za-z_][\w.]*(?:\(\))?$", tok) and not is_stop_or_common(tok):
                if "_" in tok or "." in tok or tok.endswith("()") or re.search(r"[a-z][A-Z]", tok) or tok.isupper():
                    out.append(_Cand(tok.removesuffix("()"), "concept", tok_start, tok_end))
        return out

    @staticmethod
    def _is_path(tok: str) -> bool:
        t = tok.rstrip("/")
        if not t or t.count("/") == 0 and not tok.endswith("/"):
            return False
        if re.match(r"^\d+(?:/\d+)+$", t) or re.match(r"^\d", t):
            return False
        segs = [s for s in t.split("/") if s]
        if not segs or not all(re.match(r"^[\w@+.-]+$", s) for s in segs):
            return False
        if tok.startswith(("/", "~/", "./", "../")):
            return len(segs) >= 2 or tok.startswith(("~/", "./", "../")) or (len(segs) == 1 and segs[0] in KNOWN_DIRS)
        if segs[0] in KNOWN_DIRS and len(segs) >= 2:
            return True
        if tok.endswith("/") and len(segs) == 1 and (segs[0] in KNOWN_DIRS or re.search(r"[_.-]", segs[0])):
            return True
        return len(segs) >= 2 and any(re.search(r"[_.]", s) for s in segs) and not all(len(s) <= 3 for s in segs)

    # -- phrase based ---------------------------------------------------------------------------
    def installs(self, text: str) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _INSTALL.finditer(text):
            tool = m.group("tool")
            out.append(_Cand(tool.split()[0], "tool", m.start("tool"), m.start("tool") + len(tool.split()[0])))
            pos = m.start("args")
            for am in re.finditer(r"\S+", m.group("args")):
                arg = am.group(0)
                a_start = pos + am.start()
                if arg.startswith("-"):
                    continue
                core = re.sub(r"\[[\w,.-]*\]", "", arg).rstrip(".,;")
                vm = _VERSION_SPEC.match(core)
                if vm:
                    continue  # the token pass makes the version and its package
                if core.lower() in STOPWORDS or core.lower() in ("to", "the", "it", "them", "and"):
                    break
                if not re.match(r"^[\w@./-]+$", core) or not re.search(r"[A-Za-z]", core):
                    break
                cat = "library" if _tech_category(core) != "tool" else "tool"
                out.append(_Cand(core, cat, a_start, a_start + len(core), kind="library"))
        return out

    def space_versions(self, text: str) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _SPACE_VERSION.finditer(text):
            pkg = m.group("pkg")
            low = pkg.lower()
            if not (_tech_category(pkg) or low in AMBIGUOUS_TECH):
                continue
            sep = m.group("sep").strip()
            name = f"{pkg} {m.group('ver')}"
            start = m.start("pkg") if not sep or sep.startswith("v") else m.start("ver")
            cand = _Cand(name, "version", start, m.end(), package=pkg, package_span=(m.start("pkg"), m.end("pkg")))
            if start != m.start("pkg"):
                # "upgraded pydantic to 2.15": the package keeps its own span
                out.append(_Cand(pkg, _tech_category(pkg) or "library", m.start("pkg"), m.end("pkg")))
                cand.package_span = None
            out.append(cand)
        return out

    def tech_words(self, text: str) -> list[_Cand]:
        out: list[_Cand] = []
        for m in re.finditer(r"(?<![\w./-])(?:docker[ -]compose|vs code|github actions|google cloud|apt-get|llama\.cpp)(?![\w-])", text, re.I):
            out.append(_Cand(m.group(0), "tool", m.start(), m.end()))
        # a backticked command: its first word is a tool
        for m in _INLINE_CODE.finditer(text):
            inner = m.group(1).strip()
            first = re.match(r"[\w.+-]+", inner)
            if " " in inner and first and re.match(r"^[a-z][\w.+-]*$", first.group(0)):
                word = first.group(0)
                rest = inner[len(word) :]
                # an unknown first word counts only if the rest looks like arguments
                looks_like_command = bool(_tech_category(word)) or bool(re.search(r"(?:^|\s)(?:--?\w|[\w.-]*/|[\w-]+\.\w{1,5}\b)", rest))
                if (
                    looks_like_command
                    and not is_stop_or_common(word)
                    and not any(rx.fullmatch(word) for rx, _, _ in _VERB_RES)
                    and word not in ("cd", "ls", "cat", "echo", "export", "sudo", "source", "rm", "mv", "cp", "mkdir")
                ):
                    s = m.start(1) + m.group(1).index(word)
                    out.append(_Cand(word, _tech_category(word) or "tool", s, s + len(word)))
        return out

    def errors(self, text: str) -> list[_Cand]:
        return [_Cand(m.group(0), "error", m.start(), m.end()) for m in _ERROR_PHRASE.finditer(text)]

    def titles(self, text: str) -> list[_Cand]:
        """Quoted titles of works: "Finding Freedom", “The Night Circus”."""
        out = []
        for m in re.finditer(r"[\"“]([A-Z][\w'’&:!?-]*(?: (?:[A-Z0-9][\w'’&:!?-]*|of|the|a|an|and|in|on|to|for|with)){0,6})[.,!?]?[\"”]", text):
            title = m.group(1).rstrip(".,!?:")
            if " " in title and is_safe_entity_name(title):
                out.append(_Cand(title, "thing", m.start(1), m.start(1) + len(title), kind="group"))
        return out

    def dates(self, text: str) -> list[_Cand]:
        return [_Cand(text[h.start : h.end], "date", h.start, h.end) for h in find_dates(text) if h.absolute]

    def kin(self, text: str, speaker: str | None) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _KIN.finditer(text):
            owner = m.group("owner")
            if owner.lower() == "my":
                if not speaker or speaker in ("User", "Assistant"):
                    continue
                owner_name = speaker
            else:
                owner_name = owner[:-2]
            noun = m.group("noun")
            cat = "thing" if noun.split()[-1].lower() in _PET_WORDS else "person"
            out.append(_Cand(f"{owner_name}'s {noun}", cat, m.start(), m.end(), kind="kin"))
        return out

    def groups(self, text: str, sentence_start: int) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _GROUP_PHRASE.finditer(text):
            phrase = m.group(1)
            words = phrase.split()
            start = m.start(1)
            # drop leading stop/common words ("The", "Our") and sentence-initial capitals
            while words and (words[0].lower() in STOPWORDS or (start == sentence_start and words[0].lower() in COMMON_WORDS)):
                start = text.index(words[1], start + len(words[0])) if len(words) > 1 else start
                words = words[1:]
            if len(words) < 2 or not words[0][:1].isupper():
                continue
            name = " ".join(words)
            out.append(_Cand(name, _GROUP_HEADS.get(words[-1].lower(), "thing"), start, m.end(1), kind="group"))
        return out

    def names(self, text: str, masked: str, at_start: Callable[[int], bool]) -> list[_Cand]:
        out: list[_Cand] = []
        for m in _NAME_RUN.finditer(masked):
            words: list[tuple[str, int]] = []
            pos = m.start()
            for w in re.finditer(r"\S+", m.group(0)):
                words.append((w.group(0), pos + w.start()))
            # split runs at stopwords (other than connectors between capitalised words)
            runs: list[list[tuple[str, int]]] = [[]]
            for w, p in words:
                bare = w.rstrip(".").replace("’", "'")
                low = bare.lower()
                low_nopos = re.sub(r"'s$", "", low)
                if low in _CONNECTORS:
                    runs[-1].append((w, p))
                    continue
                if (
                    low in STOPWORDS
                    or low_nopos in STOPWORDS
                    or low_nopos in _CALENDAR_WORDS
                    or (bare.isupper() and (low in COMMON_WORDS or bare in GENERIC_ACRONYMS))
                    or len(bare) < 2
                ):
                    runs.append([])
                    continue
                runs[-1].append((w, p))
                if re.search(r"['’]s$", w):  # a possessive ends the name
                    runs.append([])
            for run in runs:
                while run and run[0][0].lower() in _CONNECTORS:
                    run.pop(0)
                while run and run[-1][0].lower() in _CONNECTORS:
                    run.pop()
                if not run:
                    continue
                # sentence-initial common words and capitalised ordinary words are not names; a
                # lone capitalised sentence starter needs support (a known name, or the same word
                # capitalised mid-sentence somewhere else)
                while run and at_start(run[0][1]) and (self._ordinary(run[0][0]) or (len(run) == 1 and not self._supported(run[0][0]))):
                    run.pop(0)
                    while run and run[0][0].lower() in _CONNECTORS:
                        run.pop(0)
                if not run:
                    continue
                start = run[0][1]
                last_word, last_pos = run[-1]
                end = last_pos + len(last_word)
                name = text[start:end]
                name = re.sub(r"['’]s$", "", name).rstrip(".")
                end = start + len(name)
                if len(run) == 1 and (name.lower() in COMMON_WORDS or name in GENERIC_ACRONYMS or name.lower() in GENERIC_NOUNS):
                    continue
                out.append(_Cand(name, self._classify(name, text, start, end), start, end, kind="person"))
        return out

    def _supported(self, word: str) -> bool:
        low = re.sub(r"['’]s$", "", word.rstrip(".,")).lower()
        if low in self.doc.known_people or low in KNOWN_ORGS or low in KNOWN_PLACES or low in self.doc.mid_caps:
            return True
        bare = word.rstrip(".,")
        return len(bare) >= 2 and bare.isupper() and bare not in GENERIC_ACRONYMS and low not in COMMON_WORDS

    def _ordinary(self, word: str) -> bool:
        low = word.rstrip(".,").lower().replace("’", "'")
        if low in COMMON_WORDS or low in STOPWORDS or low in GENERIC_NOUNS:
            return True
        if low in self.doc.known_people or low in KNOWN_ORGS or low in KNOWN_PLACES:
            return False
        if low in self.doc.lower_words:
            return True
        if any(rx.fullmatch(low) for rx, _, _ in _VERB_RES) or low in _IRREGULAR_PAST:
            return True
        return bool(re.search(r"(?:ing|ed|ly)$", low)) and not word.isupper()

    def _classify(self, name: str, text: str, start: int, end: int) -> str:
        low = name.lower()
        first = low.split()[0]
        if low in self.doc.known_people or (first in self.doc.known_people and len(name.split()) <= 3):
            return "person"
        if low in KNOWN_ORGS or _ORG_SUFFIX.search(name):
            return "org"
        if low in KNOWN_PLACES or _PLACE_SUFFIX.search(name) or all(w in KNOWN_PLACES for w in low.split()):
            return "place"
        before = text[max(0, start - 40) : start]
        after = text[end : end + 25]
        if _ORG_BEFORE.search(before):
            return "org"
        if _PERSON_BEFORE.search(before) or _PERSON_AFTER.match(after):
            return "person"
        if _PLACE_BEFORE.search(before):
            return "place"
        return "thing"

    def objects(self, text: str, masked: str, speaker: str | None, verbs: list[_VerbHit]) -> list[_Cand]:
        out: list[_Cand] = []
        for v in verbs:
            if v.relation not in _OBJECT_RELATIONS or v.passive:
                continue
            rest = masked[v.end :]
            lead = len(rest) - len(rest.lstrip(" "))
            if lead == 0 and rest and rest[0] not in " ":
                continue
            dm = _DETERMINERS.match(rest[lead:])
            det = (dm.group("det") or "").lower() if dm else ""
            pos = v.end + lead + (dm.end() if dm else 0)
            words: list[tuple[str, int]] = []
            for w in re.finditer(r"[A-Za-z][\w'-]*|\S", masked[pos:]):
                token = w.group(0)
                if (
                    not re.match(r"^[a-z][\w'-]*$", token)
                    or token in _OBJECT_STOP
                    or token.endswith("ly")
                    or len(words) >= 4
                ):
                    break
                if words and w.start() + pos != words[-1][1] + len(words[-1][0]) + 1:
                    break
                words.append((token, pos + w.start()))
            if not words:
                continue
            if len(words) == 1 and (
                v.relation not in _ONE_WORD_OBJECT_RELATIONS
                or words[0][0] in GENERIC_NOUNS
                or words[0][0] in ("user", "assistant", "system", "tool")
                # a verb is no object ("loves using X"), an activity is ("loves playing")
                or any(rx.fullmatch(words[0][0]) for rx, rel, _ in _VERB_RES if rel != "DOES")
            ):
                continue
            if words[-1][0] in GENERIC_NOUNS and len(words) == 1:
                continue
            phrase = " ".join(w for w, _ in words)
            start, end = words[0][1], words[-1][1] + len(words[-1][0])
            if det == "my" and speaker and speaker not in ("User", "Assistant"):
                phrase = f"{speaker}'s {phrase}"
            out.append(_Cand(phrase, "thing", start, end, kind="object"))
        return out

    def topics(self, masked: str) -> list[_Cand]:
        """What a stack statement is about, in lower case (issue 24, item 6): "we use Postgres 15
        for *billing*", "*billing* is on / runs on Postgres 15", "switched / moved /
        migrated *billing* (over) to SQLite". ``masked``: names already found are ``#``."""
        out: list[_Cand] = []
        for rx in _TOPIC_RES:
            for m in rx.finditer(masked):
                words = m.group("t").split()
                while words and (words[-1].lower() in STOPWORDS or words[-1].lower() in _TOPIC_STOP):
                    words.pop()
                if not words or any(w.lower() in STOPWORDS or w.lower() in _TOPIC_STOP or "#" in w for w in words):
                    continue
                phrase = " ".join(words)
                start = m.start("t")
                out.append(_Cand(phrase, "thing", start, start + len(phrase), kind="object"))
        return out

    def decisions(self, text: str) -> list[_Cand]:
        if "Decision" not in self.types_present:
            return []
        out = []
        for m in re.finditer(r"\b(?:decided|decide|chose|agreed|settled) (?:to|on) (?P<p>[\w.=/-]+(?: [\w.=/-]+){0,4}?)(?=\s*(?:[.,;!?]|$| because| since| instead| so | over | rather))", text, re.I):
            phrase = m.group("p")
            if is_safe_entity_name(phrase) and len(phrase.split()) >= 2:
                out.append(_Cand(phrase, "decision", m.start("p"), m.end("p"), kind="decision"))
        return out


_TOPIC = r"(?P<t>[A-Za-z][\w-]*(?: [a-z][\w-]*){0,2}?)"
_TOPIC_END = r"(?=\s*(?:[.,;:!?]|$)|\s+(?:now|too|also|again|these days|nowadays|today|instead|as well)\b)"
_TOPIC_RES = [
    # "we use Postgres 15 for billing", "we run Redis for the cache now"
    re.compile(rf"\b(?:use|uses|using|used|run|runs|running|host|hosts|rely on|relies on)\b[^.,;:!?]{{1,60}}? for (?:the |our |my )?{_TOPIC}{_TOPIC_END}", re.I),
    # "billing is on Postgres 15", "the billing service runs on Postgres", "Noted, billing is now on SQLite"
    re.compile(rf"(?:^|[,;:]\s*|\b(?:and|but|so|now)\s+)(?:the |our |my )?{_TOPIC} (?:is|are|runs|run|lives|live|sits)"
               rf"(?: now| still| currently| already)? (?:on|in|with|through|via|at)", re.I),
    # "switched billing to SQLite", "moved the blog over to Ghost"
    re.compile(rf"\b(?:switch(?:ed|ing)?|mov(?:ed|ing|e)|migrat(?:ed|ing|e)|port(?:ed|ing)?) (?:the |our |my )?{_TOPIC}"
               rf"(?: over| back)? (?:to|onto|from)\b", re.I),
]
# never a topic: pronouns, role words, generic placeholders
_TOPIC_STOP = frozenset("it we us they them this that these those everything something stuff things thing everyone "
                        "user users assistant it's which what who".split())


def is_stop_or_common(word: str) -> bool:
    low = word.lower()
    return low in STOPWORDS or low in COMMON_WORDS or low in GENERIC_NOUNS


def _resolve_overlaps(cands: list[_Cand]) -> list[_Cand]:
    """Keep the best non-overlapping candidates (priority, then length, then position)."""
    kept: list[_Cand] = []
    for c in sorted(cands, key=lambda c: (-c.priority, -(c.end - c.start), c.start)):
        if c.kind == "decision":
            kept.append(c)
            continue
        if any(not (c.end <= k.start or c.start >= k.end) for k in kept if k.kind != "decision"):
            continue
        kept.append(c)
    return sorted(kept, key=lambda c: (c.start, -c.end))


def _category_from_labels(name: str, labels: list[str]) -> str:
    """Category of a name given by the prompt, from its type labels, else from its form."""
    low = {lbl.lower() for lbl in labels}
    for cat in ("file", "tool", "error", "person", "place", "org", "decision", "concept"):
        if any(t.lower() in low for t in CATEGORY_TYPES[cat]):
            return cat
    hits = find_dates(name)
    if hits and hits[0].absolute and hits[0].start == 0 and hits[0].end == len(name):
        return "date"
    return _tech_category(name) or "thing"


def _type_id(category: str, types: list[dict[str, Any]]) -> int:
    by_name = {str(t.get("entity_type_name", "")).lower(): int(t.get("entity_type_id", 0)) for t in types}
    for wanted in CATEGORY_TYPES.get(category, ()):
        if wanted.lower() in by_name:
            return by_name[wanted.lower()]
    if "entity" in by_name:
        return by_name["entity"]
    return int(types[0].get("entity_type_id", 0)) if types else 0
