"""Dates and time expressions: absolute dates (ISO, "8 May 2023", "May 8, 2023", "May 2023",
"in 2019") and relative ones ("yesterday", "last Friday", "two weeks ago") resolved against the
message's or session's reference time, and the ``valid_at``/``invalid_at`` a fact's text gives.

Limits: no times of day outside ISO timestamps, no ranges other than "from X to Y"/"until X",
no "next week" (future dates are left to graphiti's own normalisation), years alone only after
"in/since/...".
"""

from __future__ import annotations

import calendar
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone

from engram.models.rules_llm.vocabulary import MONTHS, WEEKDAYS

def _iso(d: date | datetime) -> str:
    if isinstance(d, datetime):
        d = d.astimezone(timezone.utc) if d.tzinfo else d
        return d.strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{d.isoformat()}T00:00:00Z"


def _parse_datetime(value: str | None) -> datetime | None:
    if not value:
        return None
    m = re.search(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?(?:Z|[+-]\d{2}:?\d{2})?", value)
    if not m:
        return None
    text = m.group(0).replace("Z", "+00:00")
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        return None
    return dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)


_MONTH_RX = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sept?(?:ember)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_DATE_ISO = re.compile(
    r"(?<![\w.-])(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w-])"
)
_DATE_DMY = re.compile(rf"(?<![\w.])(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH_RX})\.?,?\s+(\d{{4}})(?!\w)")
_DATE_MDY = re.compile(rf"(?<![\w.])({_MONTH_RX})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})(?!\w)")
_DATE_MY = re.compile(rf"(?<![\w.])({_MONTH_RX})\.?,?\s+(\d{{4}})(?!\w)")
_DATE_YEAR = re.compile(r"\b(?:in|since|during|from|until|till|by|of|early|late|mid|around)\s+((?:19|20)\d{2})(?![\w.-])", re.I)
_DATE_REL = re.compile(
    r"\b(?P<word>yesterday|today|tonight|this morning|this afternoon|this evening|earlier today|last night)\b"
    r"|\blast (?P<unit>week|month|year|weekend|(?:mon|tues|wednes|thurs|fri|satur|sun)day)\b"
    r"|\b(?P<n>\d+|a|an|one|two|three|four|five|six|seven|eight|nine|ten|a few|a couple of)\s+"
    r"(?P<unit2>days?|weeks?|months?|years?) ago\b",
    re.I,
)
_NUMBER_WORDS = {"a": 1, "an": 1, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7,
                 "eight": 8, "nine": 9, "ten": 10, "a few": 3, "a couple of": 2}


def _month_number(name: str) -> int:
    low = name.lower().rstrip(".")
    return MONTHS.get(low) or MONTHS.get(low[:3], 0)


def _safe_date(y: int, m: int, d: int) -> date | None:
    try:
        return date(y, m, d)
    except ValueError:
        return None


def _minus_months(d: date, months: int) -> date:
    y, m = d.year, d.month - months
    while m <= 0:
        m += 12
        y -= 1
    return date(y, m, min(d.day, calendar.monthrange(y, m)[1]))


@dataclass
class _DateHit:
    start: int
    end: int
    value: date | datetime
    absolute: bool


def find_dates(text: str, reference: datetime | None = None) -> list[_DateHit]:
    """Dates mentioned in ``text``: absolute ones always, relative ones ("yesterday", "last
    year", "3 days ago") only with a ``reference`` time. Non-overlapping, in text order."""
    hits: list[_DateHit] = []

    def add(start: int, end: int, value: date | datetime | None, absolute: bool) -> None:
        if value is None:
            return
        if any(not (end <= h.start or start >= h.end) for h in hits):
            return
        hits.append(_DateHit(start, end, value, absolute))

    for m in _DATE_ISO.finditer(text):
        y, mo, d = int(m.group(1)), int(m.group(2)), int(m.group(3))
        if m.group(4):
            try:
                value: date | datetime | None = datetime(y, mo, d, int(m.group(4)), int(m.group(5)), int(m.group(6) or 0), tzinfo=timezone.utc)
            except ValueError:
                value = None
        else:
            value = _safe_date(y, mo, d)
        add(m.start(), m.end(), value, True)
    for m in _DATE_DMY.finditer(text):
        add(m.start(), m.end(), _safe_date(int(m.group(3)), _month_number(m.group(2)), int(m.group(1))), True)
    for m in _DATE_MDY.finditer(text):
        add(m.start(), m.end(), _safe_date(int(m.group(3)), _month_number(m.group(1)), int(m.group(2))), True)
    for m in _DATE_MY.finditer(text):
        add(m.start(), m.end(), _safe_date(int(m.group(2)), _month_number(m.group(1)), 1), True)
    for m in _DATE_YEAR.finditer(text):
        add(m.start(1), m.end(1), date(int(m.group(1)), 1, 1), False)
    if reference is not None:
        ref = reference.astimezone(timezone.utc).date() if reference.tzinfo else reference.date()
        for m in _DATE_REL.finditer(text):
            value = None
            if m.group("word"):
                w = m.group("word").lower()
                value = ref - timedelta(days=1) if w in ("yesterday", "last night") else ref
            elif m.group("unit"):
                u = m.group("unit").lower()
                if u == "week":
                    value = ref - timedelta(days=7)
                elif u == "weekend":
                    value = ref - timedelta(days=(ref.weekday() - 5) % 7 or 7)
                elif u == "month":
                    value = _minus_months(ref.replace(day=1), 1)
                elif u == "year":
                    value = date(ref.year - 1, 1, 1)
                else:
                    target = WEEKDAYS[u]
                    value = ref - timedelta(days=(ref.weekday() - target) % 7 or 7)
            else:
                n_text = m.group("n").lower()
                n = int(n_text) if n_text.isdigit() else _NUMBER_WORDS.get(n_text, 1)
                u = m.group("unit2").lower().rstrip("s")
                if u == "day":
                    value = ref - timedelta(days=n)
                elif u == "week":
                    value = ref - timedelta(weeks=n)
                elif u == "month":
                    value = _minus_months(ref.replace(day=1), n)
                else:
                    value = date(ref.year - n, 1, 1)
            add(m.start(), m.end(), value, False)
    hits.sort(key=lambda h: h.start)
    return hits


_UNTIL = re.compile(r"\b(?:until|till|through|thru|up to)\s+$", re.I)


def fact_timestamps(fact: str, reference: datetime | None) -> tuple[str | None, str | None]:
    """(valid_at, invalid_at) for a fact: "from A to/until B" -> (A, B); "until B" -> invalid_at
    B; otherwise the first date mentioned -> valid_at. ISO 8601 with Z; (None, None) if none."""
    hits = find_dates(fact, reference)
    if not hits:
        return None, None
    valid: date | datetime | None = None
    invalid: date | datetime | None = None
    for i, h in enumerate(hits):
        before = fact[max(0, h.start - 14) : h.start]
        if _UNTIL.search(before) or (i > 0 and re.search(r"\b(?:to|and|-)\s*$", before) and valid is not None):
            if invalid is None:
                invalid = h.value
        elif valid is None:
            valid = h.value
    return (_iso(valid) if valid is not None else None, _iso(invalid) if invalid is not None else None)
