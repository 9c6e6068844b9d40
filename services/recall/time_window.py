"""Recall at a time, and facts narrowed by time or relation (issue 26, item 1).

Why: a temporal graph knows that billing ran on Postgres until the switch to SQLite in October,
but a recall that only ever answers "what holds now" cannot say what was used in September.
Graphiti's own MCP server filters facts by ``valid_at`` / ``invalid_at`` ranges and edge types;
engram's recall, ``/search``, MCP ``search_memory_facts`` and ``engram recall`` take the same,
plus ``as_of``:

* ``as_of`` T: the facts valid at T (``valid_at <= T`` and no ``invalid_at`` at or before T),
  whether or not they ended since, and the past turns said at or before T. Valid time, not
  transaction time: a fact engram learnt after T about a time before T counts (the question is
  what was true then, as engram knows it now);
* ``valid_at`` / ``invalid_at`` ranges: facts that became true / ended within them (a fact still
  true has no end, so an ``invalid_at`` range leaves it out);
* ``edge_types``: facts whose relation name, mapped to engram's canonical vocabulary
  (schemas/relations.py), is one of them.

How: a request with any of these takes graphiti's own search (BM25 + cosine over facts, RRF)
with graphiti's ``SearchFilters`` built from them instead of recall's vector-index path, which
only knows current facts; expired facts are excluded only when the request asks for neither a
time nor ended facts. Every fact and turn found is checked again here (:meth:`TimeWindow.keeps`),
so a backend whose filter differs cannot let a fact of the wrong time through. The searches ask
for ``OVERFETCH`` times the limit, then drop what falls outside.

Partial: past turns are searched by the group's ranked index and filtered afterwards, so a
question whose best matches all come after ``as_of`` can miss an older turn ranked beyond
``OVERFETCH`` times the limit; relation names are filtered after the search (synonyms), with
the same bound.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from graphiti_core.search.search_filters import ComparisonOperator, DateFilter, SearchFilters

from engram.graph.drivers import as_utc
from engram.schemas import RecallRequest, TimeRange
from engram.schemas.relations import canonical_relation

OVERFETCH = 4
"""Candidates asked of a search per item kept: what a time window or a relation filter drops."""


def relation_key(name: str | None) -> str:
    """A relation name as filters compare it: canonical (a synonym counts as its canonical name),
    upper case, separators as ``_`` ("works for" and "WORKS_FOR" are one)."""
    return re.sub(r"[^A-Z0-9]+", "_", (canonical_relation(name) or "").upper()).strip("_")


def _range(window: TimeRange | None) -> list[DateFilter]:
    if window is None:
        return []
    out = []
    if window.after is not None:
        out.append(DateFilter(date=window.after, comparison_operator=ComparisonOperator.greater_than_equal))
    if window.before is not None:
        out.append(DateFilter(date=window.before, comparison_operator=ComparisonOperator.less_than_equal))
    return out


def _within(when: datetime | None, window: TimeRange | None) -> bool:
    if window is None:
        return True
    if when is None:
        return False
    return (window.after is None or when >= window.after) and (window.before is None or when <= window.before)


@dataclass(frozen=True)
class TimeWindow:
    """What one request narrows recall to (see the module docstring)."""

    as_of: datetime | None = None
    valid_at: TimeRange | None = None
    invalid_at: TimeRange | None = None
    edge_types: frozenset[str] = frozenset()

    @classmethod
    def of(cls, request: RecallRequest) -> TimeWindow | None:
        """The request's window, None when it narrows nothing (recall's usual path)."""
        if not request.filters_time():
            return None
        return cls(as_of=as_utc(request.as_of), valid_at=request.valid_at, invalid_at=request.invalid_at,
                   edge_types=frozenset(relation_key(t) for t in request.edge_types))

    def search_filters(self) -> SearchFilters:
        """graphiti's filters for this window (its date filters: an OR of ANDs)."""
        valid = _range(self.valid_at)
        ended = _range(self.invalid_at)
        filters: dict = {}
        if self.as_of is not None:
            valid.append(DateFilter(date=self.as_of, comparison_operator=ComparisonOperator.less_than_equal))
            if ended:  # ended within the range and after as_of (still valid at as_of)
                filters["invalid_at"] = [ended + [DateFilter(date=self.as_of, comparison_operator=ComparisonOperator.greater_than)]]
            else:
                filters["invalid_at"] = [[DateFilter(comparison_operator=ComparisonOperator.is_null)],
                                         [DateFilter(date=self.as_of, comparison_operator=ComparisonOperator.greater_than)]]
        elif ended:
            filters["invalid_at"] = [ended]
        else:  # no time asked of the fact's end: the facts that hold now
            filters["expired_at"] = [[DateFilter(comparison_operator=ComparisonOperator.is_null)]]
        if valid:
            filters["valid_at"] = [valid]
        return SearchFilters(**filters)

    def keeps_fact(self, name: str | None, valid_at: datetime | None, invalid_at: datetime | None,
                   expired_at: datetime | None) -> bool:
        valid_at, invalid_at = as_utc(valid_at), as_utc(invalid_at)
        if self.edge_types and relation_key(name) not in self.edge_types:
            return False
        if not _within(valid_at, self.valid_at):
            return False
        if self.invalid_at is not None and not _within(invalid_at, self.invalid_at):
            return False
        if self.as_of is not None:
            return valid_at is not None and valid_at <= self.as_of and (invalid_at is None or invalid_at > self.as_of)
        if self.invalid_at is None and expired_at is not None:
            return False  # ended: only a time asked of facts brings ended ones back
        return True

    def keeps_turn(self, said_at: datetime | None) -> bool:
        """A past turn said at or before ``as_of`` (any turn without one)."""
        said_at = as_utc(said_at)
        return self.as_of is None or (said_at is not None and said_at <= self.as_of)
