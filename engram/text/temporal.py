"""Relative time expressions ("last Friday", "two weeks ago", "next month", "last summer",
"this weekend", "in 2 days") resolved against the date a message was said, and
:func:`ground`, which writes the resolved date into the text after the expression.

Shared by the offline rules model (engram/models/rules_llm/dates.py: a fact's ``valid_at``)
and recall (services/recall/merge.py: a past turn rendered into the prompt section). Pure
functions, no imports from the rest of engram (the rules package imports this module).

Resolution rules (English, and the common Turkish forms below; any other text is left as it is):

* days: "yesterday", "today", "tonight", "tomorrow", "last night", "this morning", "the day
  before yesterday", "the day after tomorrow";
* weekdays: "last/this past Friday" -> the latest Friday before the reference day, "next/this
  coming Friday" -> the first one after it, "this Friday" -> the Friday of the reference's
  (Monday-first) week;
* periods resolve to their first day: "last/this/next week" (Monday), "month" (the 1st),
  "year" (1 January), seasons (meteorological, northern hemisphere: spring = March-May, summer =
  June-August, autumn/fall = September-November, winter = December-February) and weekends
  (Saturday). "last summer" is the latest summer that ended before the reference day, "this
  summer" the one of the reference's year (for winter: the one the day is in, else the coming
  one), "next summer" the first after that. "this weekend" is the coming weekend, or the past
  one when the sentence is in the past tense or when said on a Monday, or the current one on
  a Saturday/Sunday;
* counts: "N days/weeks/months/years ago" -> the reference day minus N units (shown to the
  month for months and years: the speaker is rarely exact); "in N days/weeks/..." only when
  the sentence speaks of the future ("will", "going to", "'ll", "am flying"..., or "X is in 3
  weeks") -- "I read it in 2 days" is a duration, not a date -- and "N days from now" always.
  "a few" counts as 3, "a couple of" as 2.

Turkish (seed 004's users; also typed without diacritics where the form is unambiguous:
"gecen hafta", "2 gun once"): "dün", "bugün", "yarın", "evvelsi gün"; "geçen / gelecek /
önümüzdeki" + hafta, hafta sonu, ay, yıl/sene, seasons, weekdays (as last/next above); "bu" +
hafta, hafta sonu, yıl, seasons ("bu ay" is also "this moon", "bu pazar" "this market": not
taken); "N gün/hafta/ay/yıl önce". A suffixed form ("geçen haftaki", "dünkü") is not taken.
Labels are the same as for English ("June 2023", :meth:`RelativeDate.label`).

Conservative by design (a wrong date in the context is worse than none): nothing after "the"
("the next day", "the last week of June" are relative to the story, not to the message),
nothing followed by "of" ("last week of June") or by a possessive ("last week's", unclear
what to annotate), nothing capitalised in mid-sentence ("I Know What You Did Last Summer",
"USA Today"), no English "last/next/this ..." or day word at a sentence start followed by
another capitalised word other than "I" ("Last Friday Night", "Tomorrow Never Dies"), no bare
weekdays ("on Friday", "Friday Night Lights"), no vague amounts ("years ago", "yıllar önce",
"several weeks ago", "recently", "the other day").
"""

from __future__ import annotations

import calendar
import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import Literal

Granularity = Literal["day", "week", "weekend", "month", "season", "year"]

WEEKDAY_NUMBERS = {d: i for i, d in enumerate(["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"])}
MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
               "October", "November", "December")
#: season -> first month (meteorological seasons, northern hemisphere)
SEASON_START = {"spring": 3, "summer": 6, "autumn": 9, "fall": 9, "winter": 12}
_NUMBERS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
            "eight": 8, "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "a few": 3, "a couple of": 2,
            "a couple": 2, "couple of": 2}

_WEEKDAY = r"(?:mon|tues|wednes|thurs|fri|satur|sun)day"
_COUNT = r"\d{1,3}|a couple of|a couple|couple of|a few|an?|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve"
#: the grammar, one branch per form, each with the substrings (lower case) it cannot match
#: without: a turn is searched only with the branches its text can match (one big alternation
#: tried at every word costs ~0.4 ms per 1,000-char turn; recall renders dozens per request)
_UNIT = r"days?|weeks?|months?|years?"
_BRANCHES: dict[str, tuple[str, tuple[str, ...]]] = {
    "day": (
        r"(?P<day>the day before yesterday|the day after tomorrow|yesterday|today|tonight|tomorrow|last night"
        r"|this (?:morning|afternoon|evening))",
        ("yesterday", "today", "tonight", "tomorrow", "last night", "this morning", "this afternoon", "this evening"),
    ),
    "mod": (
        r"(?P<mod>last|next|this|this past|this coming|past|coming) (?P<unit>" + _WEEKDAY +
        r"|week|weekend|month|year|spring|summer|autumn|fall|winter)",
        ("last ", "next ", "this ", "past ", "coming "),
    ),
    "ago": (r"(?P<n>" + _COUNT + r") (?P<unit_ago>" + _UNIT + r") ago", (" ago",)),
    "from": (r"(?P<n_from>" + _COUNT + r") (?P<unit_from>" + _UNIT + r") from (?:now|today)", (" from now", " from today")),
    "in": (r"in (?P<n_in>" + _COUNT + r") (?P<unit_in>" + _UNIT + r")", ("in ",)),
    # Turkish, also typed without diacritics where the form is unambiguous ("gecen hafta", "2 gun once");
    # re.IGNORECASE already matches ı/i and I/İ both ways
    "tr_day": (r"(?P<tr_day>dün|bugün|bugun|yarın|evvelsi gün|evvelki gün)", ("dün", "bugün", "bugun", "yarın", "yarin", "evvel")),
    "tr_mod": (
        r"(?P<tr_mod>geçen|gecen|gelecek|önümüzdeki|onumuzdeki|bu) (?P<tr_unit>hafta sonu|haftasonu|hafta|ay|yıl|sene|yaz"
        r"|kış|kis|ilkbahar|sonbahar|bahar|pazartesi|salı|çarşamba|carsamba|perşembe|persembe|cumartesi|cuma|pazar)",
        ("geçen ", "gecen ", "gelecek ", "önümüzdeki ", "onumuzdeki ", "bu "),
    ),
    "tr_ago": (
        r"(?P<tr_n>\d{1,3}|birkaç|birkac|bir kaç|bir kac|bir|iki|üç|uc|dört|dort|beş|bes|altı|yedi|sekiz|dokuz|on)"
        r" (?P<tr_unit_ago>gün|gun|hafta|ay|yıl|sene) (?:önce|once)",
        (" önce", " once"),
    ),
}
_ASCII_TR = str.maketrans("çğıöşüÇĞIİÖŞÜ", "cgiosuCGIIOSU")
_TR_MOD = {"gecen": "last", "gelecek": "next", "onumuzdeki": "next", "bu": "this"}
_TR_UNIT = {"hafta sonu": "weekend", "haftasonu": "weekend", "hafta": "week", "ay": "month", "yil": "year",
            "sene": "year", "yaz": "summer", "kis": "winter", "ilkbahar": "spring", "bahar": "spring",
            "sonbahar": "autumn", "pazartesi": "monday", "sali": "tuesday", "carsamba": "wednesday",
            "persembe": "thursday", "cuma": "friday", "cumartesi": "saturday", "pazar": "sunday"}
_TR_COUNT = {"bir": 1, "iki": 2, "uc": 3, "dort": 4, "bes": 5, "alti": 6, "yedi": 7, "sekiz": 8, "dokuz": 9,
             "on": 10, "birkac": 3, "bir kac": 3}
_TR_UNIT_AGO = {"gun": "day", "hafta": "week", "ay": "month", "yil": "year", "sene": "year"}


def _ascii_tr(text: str) -> str:
    """Lower case without Turkish diacritics (the dictionary keys of the Turkish branches)."""
    return " ".join(text.translate(_ASCII_TR).lower().replace("\u0307", "").split())


@functools.lru_cache(maxsize=64)
def _grammar(branches: tuple[str, ...]) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(_BRANCHES[b][0] for b in branches) + r")\b", re.I)


def _matches(text: str) -> Iterator[re.Match[str]]:
    low = text.lower()
    active = tuple(name for name, (_, needles) in _BRANCHES.items() if any(n in low for n in needles))
    return _grammar(active).finditer(text) if active else iter(())


# The sentence a match sits in: future and past cues for "in N days" and "this weekend".
_FUTURE = re.compile(
    r"\b(?:will|won['’]t|shall|gonna|going to|plan(?:ning)? to|about to|scheduled|hoping to|hope to|want to|"
    r"can['’]t wait|looking forward)\b|['’]ll\b"
    r"|\b(?:am|are|is|i['’]m|we['’]re|you['’]re|he['’]s|she['’]s|they['’]re)\s+\w+ing\b",
    re.I,
)
_PAST = re.compile(
    r"\b(?:was|were|had|did|went|got|saw|visited|spent|came|took|made|met|bought|tried|finished|enjoyed|"
    r"watched|played|attended|stayed|started|ran|drove|flew|ate|found|loved)\b",
    re.I,
)
_IS_BEFORE = re.compile(r"(?:\b(?:is|are)|['’](?:s|re))\s+$", re.I)
_SENTENCE_END = re.compile(r"[.!?\n]")
_AFTER_THE = re.compile(r"\bthe\s+$", re.I)
_FOLLOWED_BY = re.compile(r"\s+of\b|['’]s\b|\s*\(", re.I)
_LABEL_AFTER = re.compile(r" \((?:\d{4}-\d{2}-\d{2}|week of |weekend of |[A-Z][a-z]+ \d{4}|[a-z]+ \d{4}|\d{4})")
_NEXT_CAPITAL = re.compile(r"\s+(?!I\b|I['’])[A-Z]")
_SENTENCE_START = re.compile(r"(?:^\s*|[.!?:;\n]\s*)$")


@dataclass(frozen=True)
class RelativeDate:
    """A relative time expression at ``text[start:end]`` and the date it stands for: the day,
    or the first day of the period (week, weekend, month, season, year) it names."""

    start: int
    end: int
    value: date
    granularity: Granularity

    def label(self) -> str:
        """The absolute date as written into the text: ``2023-05-05``, ``week of 2023-05-01``,
        ``weekend of 2023-05-06``, ``April 2023``, ``summer 2022``, ``winter 2022/23``, ``2022``."""
        v = self.value
        if self.granularity == "day":
            return v.isoformat()
        if self.granularity in ("week", "weekend"):
            return f"{self.granularity} of {v.isoformat()}"
        if self.granularity == "month":
            return f"{MONTH_NAMES[v.month - 1]} {v.year}"
        if self.granularity == "season":
            name = {3: "spring", 6: "summer", 9: "autumn", 12: "winter"}[v.month]
            return f"winter {v.year}/{(v.year + 1) % 100:02d}" if name == "winter" else f"{name} {v.year}"
        return str(v.year)


def reference_day(reference: date | datetime) -> date:
    """The calendar day of ``reference`` (UTC for aware datetimes)."""
    if isinstance(reference, datetime):
        return (reference.astimezone(timezone.utc) if reference.tzinfo else reference).date()
    return reference


def add_months(d: date, months: int) -> date:
    """``d`` moved by ``months`` (negative: back), the day clamped to the month's length."""
    y, m = divmod(d.year * 12 + d.month - 1 + months, 12)
    return date(y, m + 1, min(d.day, calendar.monthrange(y, m + 1)[1]))


def _count(text: str) -> int | None:
    t = " ".join(text.lower().split())
    return int(t) if t.isdigit() else _NUMBERS.get(t)


def _shift(ref: date, n: int, unit: str) -> tuple[date, Granularity]:
    unit = unit.lower().rstrip("s")
    if unit == "day":
        return ref + timedelta(days=n), "day"
    if unit == "week":
        return ref + timedelta(weeks=n), "day"
    if unit == "month":
        return add_months(ref, n), "month"
    return add_months(ref, 12 * n), "month"


def _sentence(text: str, start: int, end: int) -> str:
    before = [m.end() for m in _SENTENCE_END.finditer(text, 0, start)]
    after = _SENTENCE_END.search(text, end)
    return text[before[-1] if before else 0 : after.start() if after else len(text)]


def _season(ref: date, season: str, mod: str) -> date:
    start = SEASON_START[season]
    # instances of this season around the reference: (first day, first day of the next season)
    instances = [(date(y, start, 1), add_months(date(y, start, 1), 3)) for y in range(ref.year - 2, ref.year + 2)]
    if mod in ("last", "past", "this past"):
        return max(s for s, e in instances if e <= ref)
    current = next((s for s, e in instances if s <= ref < e), None)
    this = current or next(s for s, _ in instances if s.year == ref.year)
    if mod in ("this", "coming", "this coming") and not (mod != "this" and this <= ref):
        return this
    return min(s for s, _ in instances if s > this and s > ref)


def _weekend(ref: date, mod: str, sentence: str) -> date:
    saturday_this_week = ref - timedelta(days=ref.weekday()) + timedelta(days=5)
    previous = saturday_this_week - timedelta(days=7)
    if mod in ("last", "past", "this past"):
        return previous
    if mod == "next":
        return saturday_this_week + timedelta(days=7) if ref.weekday() >= 5 else saturday_this_week
    if mod == "coming" or mod == "this coming":
        return saturday_this_week if ref.weekday() < 5 else saturday_this_week + timedelta(days=7)
    # "this weekend"
    if ref.weekday() >= 5:
        return saturday_this_week
    if _FUTURE.search(sentence):
        return saturday_this_week
    if _PAST.search(sentence) or ref.weekday() == 0:
        return previous
    return saturday_this_week


def _period(ref: date, mod: str, unit: str, sentence: str) -> tuple[date, Granularity] | None:
    step = {"last": -1, "past": -1, "this past": -1, "next": 1, "coming": 1, "this coming": 1, "this": 0}[mod]
    if unit.endswith("day"):
        target = WEEKDAY_NUMBERS[unit]
        if step < 0:
            return ref - timedelta(days=(ref.weekday() - target) % 7 or 7), "day"
        if step > 0:
            return ref + timedelta(days=(target - ref.weekday()) % 7 or 7), "day"
        return ref - timedelta(days=ref.weekday()) + timedelta(days=target), "day"
    if unit == "week":
        if mod in ("past", "coming"):  # "the past week" = the last 7 days, not a calendar week
            return None
        return ref - timedelta(days=ref.weekday()) + timedelta(weeks=step), "week"
    if unit == "weekend":
        return _weekend(ref, mod, sentence), "weekend"
    if unit == "month":
        if mod in ("past", "coming"):
            return None
        return add_months(ref.replace(day=1), step), "month"
    if unit == "year":
        if mod in ("past", "coming"):
            return None
        return date(ref.year + step, 1, 1), "year"
    return _season(ref, unit, mod), "season"


def _resolve(m: re.Match[str], ref: date, text: str) -> RelativeDate | None:
    sentence = _sentence(text, m.start(), m.end())
    g = {k: m.groupdict().get(k) for k in ("day", "mod", "unit", "n", "unit_ago", "n_from", "unit_from", "n_in", "unit_in",
                                           "tr_day", "tr_mod", "tr_unit", "tr_n", "tr_unit_ago")}
    if g["tr_day"]:
        word = _ascii_tr(g["tr_day"])
        delta = {"dun": -1, "yarin": 1, "evvelsi gun": -2, "evvelki gun": -2}.get(word, 0)
        return RelativeDate(m.start(), m.end(), ref + timedelta(days=delta), "day")
    if g["tr_mod"]:
        mod, unit = _TR_MOD[_ascii_tr(g["tr_mod"])], _TR_UNIT[_ascii_tr(g["tr_unit"])]
        if mod == "this" and (unit == "month" or unit.endswith("day")):
            return None  # "bu ay" is also "this moon", "bu pazar" "this market"
        got = _period(ref, mod, unit, sentence)
        return RelativeDate(m.start(), m.end(), *got) if got else None
    if g["tr_n"]:
        key = _ascii_tr(g["tr_n"])
        n = int(key) if key.isdigit() else _TR_COUNT.get(key)
        if n is None or n > 100:
            return None
        return RelativeDate(m.start(), m.end(), *_shift(ref, -n, _TR_UNIT_AGO[_ascii_tr(g["tr_unit_ago"])]))
    if g["day"]:
        word = " ".join(g["day"].lower().split())
        delta = {"yesterday": -1, "last night": -1, "the day before yesterday": -2, "tomorrow": 1,
                 "the day after tomorrow": 2}.get(word, 0)
        return RelativeDate(m.start(), m.end(), ref + timedelta(days=delta), "day")
    if g["mod"]:
        mod = " ".join(g["mod"].lower().split())
        got = _period(ref, mod, g["unit"].lower(), sentence)
        return RelativeDate(m.start(), m.end(), *got) if got else None
    if g["n"]:
        n, unit = _count(g["n"]), g["unit_ago"]
        sign = -1
    elif g["n_from"]:
        n, unit = _count(g["n_from"]), g["unit_from"]
        sign = 1
    else:
        # "I read it in 2 days" is a duration; "I'll fly in 2 days", "the wedding is in 3 weeks" a date
        if not (_FUTURE.search(sentence) or _IS_BEFORE.search(text[: m.start()])):
            return None
        n, unit = _count(g["n_in"]), g["unit_in"]
        sign = 1
    if n is None or n > 100:
        return None
    return RelativeDate(m.start(), m.end(), *_shift(ref, sign * n, unit))


def _plausible(m: re.Match[str], text: str, *, grounded: bool = False) -> bool:
    """The conservative filters of the module docstring (``grounded``: a parenthesis after the
    expression is the label :func:`ground` wrote, not a reason to skip it)."""
    start, end = m.start(), m.end()
    before, after = text[:start], text[end:]
    day = m.groupdict().get("day")
    if day is None or not day.lower().startswith("the "):
        if _AFTER_THE.search(before):
            return False
    if _FOLLOWED_BY.match(after) and not (grounded and _LABEL_AFTER.match(after)):
        return False
    if re.match(r"\s*-\w", after) or before.endswith("-"):  # "last-minute", "year-long"
        return False
    if m.group(0)[0].isupper():
        if not _SENTENCE_START.search(before):
            return False  # a title in mid-sentence: "Did Last Summer", "USA Today"
        # (not for Turkish: "Geçen Cuma Ahmet'le konuştum" drops its subject, names follow freely)
        if (day or m.groupdict().get("mod")) and _NEXT_CAPITAL.match(after):
            return False  # "Last Friday Night", "Yesterday Once More" (not "Two weeks ago Calvin")
    return True


def find_relative(text: str, reference: date | datetime, *, grounded: bool = False) -> list[RelativeDate]:
    """The relative time expressions of ``text`` resolved against ``reference`` (the day the
    text was said), in text order. An expression already followed by a parenthesis (as
    :func:`ground` leaves it) is skipped, unless ``grounded``: then it is found as well (a
    fact's dates are read from its grounded text)."""
    ref = reference_day(reference)
    out: list[RelativeDate] = []
    for m in _matches(text):
        if not _plausible(m, text, grounded=grounded):
            continue
        hit = _resolve(m, ref, text)
        if hit is not None:
            out.append(hit)
    return out


def ground(text: str, reference: date | datetime | None) -> str:
    """``text`` with each relative time expression followed by its absolute date in
    parentheses: "I went there last Friday" said on 2023-05-12 -> "I went there last Friday
    (2023-05-05)". Idempotent; ``text`` unchanged when nothing is found or ``reference`` is
    None."""
    if reference is None or not text:
        return text
    hits = find_relative(text, reference)
    if not hits:
        return text
    parts: list[str] = []
    pos = 0
    for h in hits:
        parts.append(text[pos : h.end])
        parts.append(f" ({h.label()})")
        pos = h.end
    parts.append(text[pos:])
    return "".join(parts)


_LABEL = re.compile(
    r" \((?:\d{4}-\d{2}-\d{2}|(?:week|weekend) of \d{4}-\d{2}-\d{2}|[A-Z][a-z]+ \d{4}|(?:spring|summer|autumn) \d{4}"
    r"|winter \d{4}/\d{2}|\d{4})\)"
)


def strip_grounding(text: str) -> str:
    """``text`` without the labels :func:`ground` wrote (a label right after a relative
    expression): ``strip_grounding(ground(t, day)) == t``. For comparing a rendered turn with
    the raw message, e.g. a benchmark's "is this message in the context" test."""
    cuts: list[tuple[int, int]] = []
    for m in _matches(text):
        label = _LABEL.match(text, m.end())
        if label and _plausible(m, text, grounded=True):
            cuts.append((label.start(), label.end()))
    if not cuts:
        return text
    parts, pos = [], 0
    for start, end in cuts:
        parts.append(text[pos:start])
        pos = end
    parts.append(text[pos:])
    return "".join(parts)


MONTH_PATTERN = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sept?(?:ember)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
#: an absolute date, or a label :func:`ground` writes: ISO day, "8 May 2023", "May 8, 2023",
#: "May 2023", "(2022)", "in 2019", "summer 2022", "week of 2023-05-01"
_ABSOLUTE = re.compile(
    r"(?<![\w.-])\d{4}-\d{2}-\d{2}(?![\w-])"
    rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{MONTH_PATTERN}\.?,?\s+\d{{4}}\b"
    rf"|\b{MONTH_PATTERN}\.?,?\s+(?:\d{{1,2}}(?:st|nd|rd|th)?,?\s+)?(?:19|20)\d{{2}}\b"
    r"|\((?:19|20)\d{2}\)"
    r"|\b(?:in|since|during|early|late|mid|around|spring|summer|autumn|fall|winter)\s+(?:19|20)\d{2}\b",
)


def mentions_date(text: str) -> bool:
    """True when ``text`` holds an absolute date (as written by people or by :func:`ground`)."""
    return bool(_ABSOLUTE.search(text))
