""""When" questions prefer dated items: a pure re-ranking stage for recall (issue 11, item 4).

"When did Calvin have a car incident?" is answered by the item that carries a date -- a fact or
a turn that says "on 2023-05-05", "in May 2023", or a relative one recall grounds against the
day it was said ("last Friday" -> "last Friday (2023-05-05)", :func:`engram.text.temporal.ground`).
:func:`prefer_dated` moves such items up a bounded number of places when
:func:`is_when_question` says the query asks for a time; everything else keeps its order.

Recall applies it to the merged items (``ENGRAM_RECALL_WHEN_LIFT``, services/recall/app.py; its
value chosen on bench/recall_quality.py's tuning split). English and Turkish questions; a question
in another language is never treated as a "when" question (the ranking stays as it is).

A question that names a time ("What did Maria donate in December 2023?", "Who did Maria have
dinner with on May 3, 2023?", "What did John do the week before August 3, 2023?") reads what was
said or dated then first: :func:`named_period` finds the days it names, :func:`prefer_period`
moves the items of those days up a bounded number of places (``ENGRAM_RECALL_PERIOD_LIFT``).
"""

from __future__ import annotations

import calendar
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from typing import TypeVar

from engram.text.temporal import MONTH_NAMES, MONTH_PATTERN, find_relative, mentions_date
from engram.schemas import RecallItem
from engram.services.recall.merge import Layout

#: asks for a time: "When did...", "what year/date/month...", "how long ago...", "since when"
_WHEN = re.compile(
    r"^\s*when\b"
    r"|\bwhen (?:did|do|does|was|were|is|are|will|has|have|had|would)\b"
    r"|\b(?:what|which) (?:year|date|day|month|week|time of year|season)\b"
    r"|\bhow long ago\b|\bsince when\b|\bon what (?:date|day)\b|\bin what (?:year|month)\b"
    # durations: answered from the dates of the start and the end
    r"|\bhow long (?:has|have|had|did|since)\b"
    r"|\bhow many (?:years|months|weeks|days) (?:passed|ago|since|between|after|before|have|has|had|did)\b"
    # Turkish (also without diacritics): "ne zaman", "hangi yıl/ay/gün/tarih", "kaç yıl önce",
    # "ne kadar zamandır/süredir/önce"
    r"|\bne zaman\b|\bhangi (?:yıl|yil|sene|ay|gün|gun|tarih)|\bkaç (?:yıl|yil|sene|ay|hafta|gün|gun) (?:önce|once)\b"
    r"|\bkac (?:yil|sene|ay|hafta|gun) once\b|\bne kadar (?:zamandır|zamandir|süredir|suredir|önce|once)\b",
    re.I,
)
# "When I asked you about X, what did you say?" is not about a time: a "when" clause
# followed by a subject pronoun and a comma-separated main question.
_WHEN_CLAUSE = re.compile(r"^\s*when (?:i|we|you|they|he|she|it)\b[^?]*,", re.I)

DEFAULT_LIFT = 5  # bench/temporal_grounding.py, tuning split (a flat-BM25 proxy): best at 500 and 1,000 tokens

Item = TypeVar("Item")


def is_when_question(query: str) -> bool:
    """True when ``query`` asks for a time ("When did Calvin have a car incident?", "What year
    did Melanie move?", "How long ago was the trip?", "How long has Melanie been painting?").
    A question that names a date ("What did Joanna watch on 1 May, 2022?") is not one: its
    answer was said on that day and rarely carries a date itself (on LoCoMo's tuning split,
    counting those lowered the gain at 500 tokens)."""
    if not query or _WHEN_CLAUSE.search(query):
        return False
    return bool(_WHEN.search(query))


# a question that places itself in time or asks about change: "before/after ...", "still",
# "anymore", "currently", "these days", "recently", "first/last time", "how old", "yet"
_TIME_WORDS = re.compile(
    r"\b(?:ago|before|after|since|until|till|during|still|anymore|any more|currently|nowadays|these days"
    r"|recent|recently|lately|latest|newest|oldest|earliest|first time|last time|yet|how old|age|anniversary"
    r"|birthday|today|yesterday|tomorrow|tonight|now|year|years|month|months|week|weeks|weekend|day|days"
    r"|morning|evening|night|season|summer|winter|spring|autumn|fall|holiday|holidays)\b",
    re.I,
)


def asks_about_time(query: str) -> bool:
    """True when ``query`` asks for a time (:func:`is_when_question`), names one (a date, "last
    Friday", "in 2022") or a time word ("before", "still", "these days", "weekend"). Answers to
    such a question need the day each line was said; other answers do not."""
    if not query:
        return False
    if is_when_question(query) or mentions_date(query) or _TIME_WORDS.search(query):
        return True
    return bool(find_relative(query, datetime(2000, 1, 1)))  # only whether one is found matters


def layout_for(layout: Layout, query: str) -> Layout:
    """``auto`` resolved for ``query``: ``by_day`` (a heading a day) when it asks about time,
    ``undated`` otherwise; any other layout as it is."""
    if layout != "auto":
        return layout
    return "by_day" if asks_about_time(query) else "undated"


def is_dated(item: RecallItem) -> bool:
    """The item's text holds an absolute date, or a relative one that grounding resolves (a
    past turn's "last Friday" against the day it was said)."""
    if mentions_date(item.fact):
        return True
    reference = item.valid_at or datetime(2000, 1, 1)  # only whether one is found matters here
    return bool(find_relative(item.fact, reference, grounded=True))


def prefer_dated(items: Sequence[Item], *, lift: int = DEFAULT_LIFT,
                 dated: Callable[[Item], bool] | None = None) -> list[Item]:
    """``items`` (best first) with every dated item (``dated``, default :func:`is_dated`) moved
    up by at most ``lift`` places, ahead of the undated ones it passes; stable otherwise (dated
    items keep their order among themselves, so do undated ones). ``lift`` 0 is the identity."""
    if lift <= 0:
        return list(items)
    test = dated or is_dated
    # sort key: the position an item aims for, dated before undated on a tie, then the old order
    keyed = []
    for i, x in enumerate(items):
        has_date = test(x)  # type: ignore[arg-type]
        keyed.append((i - lift if has_date else i, not has_date, i))
    return [items[i] for _, _, i in sorted(keyed)]


def rank_for_query(query: str, items: Sequence[RecallItem], *, lift: int = DEFAULT_LIFT) -> list[RecallItem]:
    """:func:`prefer_dated` for a "when" question, ``items`` unchanged for any other query."""
    if lift <= 0 or not is_when_question(query):  # lift 0 (the default) is the identity: no regex per request
        return list(items)
    return prefer_dated(items, lift=lift)


# --- a time the question names --------------------------------------------------------------

_MONTHS = {name[:3].lower(): i for i, name in enumerate(MONTH_NAMES, start=1)}  # "dec" -> 12
_ORDINAL = r"(?:st|nd|rd|th)?"
#: a day, a month or a year a question names; one alternative per form, named groups per field
_NAMED_TIME = re.compile(
    r"(?<![\w-])(?P<iso_y>\d{4})-(?P<iso_m>\d{2})-(?P<iso_d>\d{2})(?![\w-])"
    rf"|\b(?P<dm_d>\d{{1,2}}){_ORDINAL}\s+(?:of\s+)?(?P<dm_m>{MONTH_PATTERN})\.?,?\s+(?P<dm_y>(?:19|20)\d{{2}})\b"
    rf"|\b(?P<md_m>{MONTH_PATTERN})\.?\s+(?P<md_d>\d{{1,2}}){_ORDINAL},?\s+(?P<md_y>(?:19|20)\d{{2}})\b"
    rf"|\b(?P<m_m>{MONTH_PATTERN})\.?,?\s+(?P<m_y>(?:19|20)\d{{2}})\b"
    r"|\b(?:in|during)\s+(?P<y_y>(?:19|20)\d{2})\b",  # not "for 2023": a plan names its year
    re.I,
)
#: "the week before August 3, 2023", "two weeks after ...": the days next to the named one
_BEFORE = re.compile(r"\bbefore\s*$", re.I)
_AFTER = re.compile(r"\bafter\s*$", re.I)
NEAR_DAYS = 14  # "before"/"after" a day: the two weeks on that side (LoCoMo asks "the week/weekend/two weeks before")
DAY_SLACK = 1  # a day named: said the day after ("yesterday") or before ("tomorrow") counts too


@dataclass(frozen=True)
class Period:
    """The days a question names, both ends included."""

    start: date
    end: date

    def holds(self, when: datetime | None) -> bool:
        if when is None:
            return False
        day = (when.astimezone(timezone.utc) if when.tzinfo else when).date()
        return self.start <= day <= self.end


def _month(name: str) -> int:
    return _MONTHS[name[:3].lower()]


def _span(m: re.Match[str]) -> tuple[date, date] | None:
    """The days one named time covers (None: no such day, e.g. 31 February)."""
    g = m.groupdict()
    try:
        if g["iso_y"]:
            day = date(int(g["iso_y"]), int(g["iso_m"]), int(g["iso_d"]))
        elif g["dm_y"]:
            day = date(int(g["dm_y"]), _month(g["dm_m"]), int(g["dm_d"]))
        elif g["md_y"]:
            day = date(int(g["md_y"]), _month(g["md_m"]), int(g["md_d"]))
        elif g["m_y"]:
            year, month = int(g["m_y"]), _month(g["m_m"])
            return date(year, month, 1), date(year, month, calendar.monthrange(year, month)[1])
        else:
            year = int(g["y_y"])
            return date(year, 1, 1), date(year, 12, 31)
    except ValueError:
        return None
    return day - timedelta(days=DAY_SLACK), day + timedelta(days=DAY_SLACK)


def named_period(query: str) -> Period | None:
    """The days ``query`` names, from its first to its last named time: a day ("on 3 May, 2023",
    "May 3, 2023", "2023-05-03"; a day either side, for "yesterday" and "tomorrow"), a month ("in
    December 2023") or a year ("in 2023"); "before"/"after" a time adds the two weeks on that side.
    None when it names none (relative times such as "last week" name no day without a reference,
    and a question is asked now)."""
    if not query:
        return None
    spans: list[tuple[date, date]] = []
    for m in _NAMED_TIME.finditer(query):
        span = _span(m)
        if span is None:
            continue
        start, end = span
        ahead = query[max(0, m.start() - 12):m.start()]
        if _BEFORE.search(ahead):
            start = start - timedelta(days=NEAR_DAYS)
        elif _AFTER.search(ahead):
            end = end + timedelta(days=NEAR_DAYS)
        spans.append((start, end))
    if not spans:
        return None
    return Period(min(s for s, _ in spans), max(e for _, e in spans))


def prefer_period(query: str, items: Sequence[RecallItem], *, lift: int) -> list[RecallItem]:
    """``items`` with those said or dated in the time ``query`` names (:func:`named_period`; the
    item's ``valid_at``: a turn's time, a fact's start) moved up by at most ``lift`` places, the
    rest in their order; unchanged when the query names no time or ``lift`` is 0."""
    period = named_period(query) if lift > 0 else None
    if period is None:
        return list(items)
    return prefer_dated(items, lift=lift, dated=lambda item: period.holds(item.valid_at))
