"""Dates and time expressions: absolute dates (ISO, "8 May 2023", "May 8, 2023", "May 2023",
"in 2019") and relative ones ("yesterday", "last Friday", "two weeks ago", "next month", "last
summer", "this weekend", "in 2 days") resolved against the message's or session's reference time,
and the ``valid_at``/``invalid_at`` a fact's text gives. The relative grammar and its rules live
in :mod:`engram.text.temporal`, shared with recall (which grounds past turns with it); a period
("last month", "last summer") gives its first day as ``valid_at``.

Limits: no times of day outside ISO timestamps, no ranges other than "from X to Y"/"until X",
years alone only after "in/since/...", relative expressions in English and common Turkish forms
only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import date, datetime, timezone

from engram.models.rules_llm.vocabulary import MONTHS
from engram.text.temporal import MONTH_PATTERN as _MONTH_RX
from engram.text.temporal import find_relative, reference_day


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


_DATE_ISO = re.compile(
    r"(?<![\w.-])(\d{4})-(\d{2})-(\d{2})(?:[T ](\d{2}):(\d{2})(?::(\d{2})(?:\.\d+)?)?(?:Z|[+-]\d{2}:?\d{2})?)?(?![\w-])"
)
_DATE_DMY = re.compile(rf"(?<![\w.])(\d{{1,2}})(?:st|nd|rd|th)?\s+(?:of\s+)?({_MONTH_RX})\.?,?\s+(\d{{4}})(?!\w)")
_DATE_MDY = re.compile(rf"(?<![\w.])({_MONTH_RX})\.?\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})(?!\w)")
_DATE_MY = re.compile(rf"(?<![\w.])({_MONTH_RX})\.?,?\s+(\d{{4}})(?!\w)")
_DATE_YEAR = re.compile(r"\b(?:in|since|during|from|until|till|by|of|early|late|mid|around)\s+((?:19|20)\d{2})(?![\w.-])", re.I)


def _month_number(name: str) -> int:
    low = name.lower().rstrip(".")
    return MONTHS.get(low) or MONTHS.get(low[:3], 0)


def _safe_date(y: int, m: int, d: int) -> date | None:
    try:
        return date(y, m, d)
    except ValueError:
        return None


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
        for r in find_relative(text, reference, grounded=True):
            add(r.start, r.end, r.value, False)
    hits.sort(key=lambda h: h.start)
    return hits


_UNTIL = re.compile(r"\b(?:until|till|through|thru|up to)\s+$", re.I)


def fact_timestamps(fact: str, reference: datetime | None) -> tuple[str | None, str | None]:
    """(valid_at, invalid_at) for a fact: "from A to/until B" -> (A, B); "until B" -> invalid_at
    B; otherwise the first date mentioned -> valid_at. ISO 8601 with Z; (None, None) if none.

    A valid_at after the reference day ("Caroline will fly to Rome in 2 days") becomes the
    reference time, as graphiti's timestamp prompts ask ("a future-tense plan ... set valid_at to
    the episode timestamp / REFERENCE_TIME"); the future date stays in the fact's (grounded)
    text (:mod:`.prompts` grounds it with :func:`engram.text.temporal.ground`)."""
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
    if valid is not None and reference is not None and _day(valid) > reference_day(reference):
        valid = reference
    return (_iso(valid) if valid is not None else None, _iso(invalid) if invalid is not None else None)


def _day(value: date | datetime) -> date:
    return reference_day(value) if isinstance(value, datetime) else value

