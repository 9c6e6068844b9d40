""""When" questions prefer dated items: a pure re-ranking stage for recall (issue 11, item 4).

"When did Calvin have a car incident?" is answered by the item that carries a date -- a fact or
a turn that says "on 2023-05-05", "in May 2023", or a relative one recall grounds against the
day it was said ("last Friday" -> "last Friday (2023-05-05)", :func:`engram.text.temporal.ground`).
:func:`prefer_dated` moves such items up a bounded number of places when
:func:`is_when_question` says the query asks for a time; everything else keeps its order.

Recall applies it to the merged items (``ENGRAM_RECALL_WHEN_LIFT``, services/recall/app.py; its
value chosen on bench/recall_quality.py's tuning split). English and Turkish questions; a question
in another language is never treated as a "when" question (the ranking stays as it is).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TypeVar

from engram.text.temporal import find_relative, mentions_date
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
