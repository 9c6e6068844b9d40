"""Recall's pure stages: which groups to search, merge by scope priority, near-duplicate removal,
token-budget truncation and the ``<graphiti_memory>`` prompt section.

No broker, no database: every function here is unit-tested alone (tests/services/recall).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Literal
from datetime import date, datetime, timezone

from engram.text.secrets import scrub_secrets
from engram.text.temporal import ground
from engram.schemas import RecallItem, RecallRequest, subjects

SCOPE_ORDER = ("session", "workspace", "user")
RECENT_MESSAGES_IN_QUERY = 3

def groups_for(request: RecallRequest, prefix: str) -> list[tuple[str | None, str]]:
    """(scope, group_id) to search, in priority order: session > workspace > user > extra groups."""
    out: list[tuple[str | None, str]] = []
    if request.scopes.session:
        out.append(("session", subjects.session_group(prefix, request.scopes.session)))
    if request.scopes.workspace:
        out.append(("workspace", subjects.workspace_group(prefix, request.scopes.workspace)))
    if request.scopes.user:
        out.append(("user", subjects.user_group(prefix, request.scopes.user)))
    seen = {g for _, g in out}
    for group in request.group_ids:
        if subjects.is_valid_token(group) and group not in seen:
            seen.add(group)
            out.append((None, group))
    return out


def query_text(request: RecallRequest) -> str:
    """The search query: the explicit query, else the last few recent messages; scrubbed of
    secrets, because the graph keeps what it is asked (FalkorDB logs each query with its
    parameters in a saved key) and nothing stored holds a secret to be found by one anyway."""
    if request.query and request.query.strip():
        return scrub_secrets(request.query.strip()).text
    text = "\n".join(m.content for m in request.recent_messages[-RECENT_MESSAGES_IN_QUERY:]).strip()
    return scrub_secrets(text).text


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", text.casefold()))


def near_duplicate(a: str, b: str, threshold: float = 0.8) -> bool:
    """Same words (Jaccard >= threshold) -- "Alice works at Acme." vs "Alice works at Acme"."""
    wa, wb = _words(a), _words(b)
    if not wa or not wb:
        return a.strip() == b.strip()
    return len(wa & wb) / len(wa | wb) >= threshold


def merge(results: Sequence[Sequence[RecallItem]], max_items: int, now: datetime | None = None) -> list[RecallItem]:
    """Concatenate per-group results (already in scope priority order, each best first), drop
    near-duplicates of an item already kept (the higher-priority scope wins), keep ``max_items``,
    current facts before superseded ones (:func:`current_facts_first`; current at ``now``, a
    request's ``as_of``, else the present)."""
    kept: list[RecallItem] = []
    for items in results:
        for item in items:
            if len(kept) >= max_items:
                return current_facts_first(kept, now)
            if any(item.uuid == k.uuid or near_duplicate(item.fact, k.fact) for k in kept):
                continue
            kept.append(item)
    return current_facts_first(kept, now)


def superseded(item: RecallItem, now: datetime | None = None) -> bool:
    """A fact that no longer holds: its ``invalid_at`` has passed (graphiti sets it when a later
    fact contradicts this one -- then ``expired_at`` too -- or when the fact said when it ended)."""
    if item.kind != "fact" or item.invalid_at is None:
        return False
    return item.invalid_at <= (now or datetime.now(timezone.utc))


def current_facts_first(items: Sequence[RecallItem], now: datetime | None = None) -> list[RecallItem]:
    """``items`` with every current fact before every superseded one (issue 11, item 6). Only the
    facts move, among the positions facts hold, each group keeping its order: past turns keep
    their places, and a superseded fact stays in the context, after what replaced it."""
    facts = [i for i in items if i.kind == "fact"]
    ordered = iter([f for f in facts if not superseded(f, now)] + [f for f in facts if superseded(f, now)])
    return [next(ordered) if i.kind == "fact" else i for i in items]


def drop_covered_facts(items: Sequence[RecallItem]) -> list[RecallItem]:
    """``items`` without the facts whose every source turn is already an item ranked above them:
    the turn says what the fact says, and the fact's line would take budget a further turn needs."""
    shown: set[str] = set()
    out: list[RecallItem] = []
    for item in items:
        if item.kind == "episode":
            shown.add(item.uuid)
        elif item.provenance and all(p.episode_id in shown for p in item.provenance):
            continue
        out.append(item)
    return out


def drop_covered_turns(items: Sequence[RecallItem]) -> list[RecallItem]:
    """``items`` without the past turns a fact extracted from them already stands for, ranked
    above them: the fact (~10 tokens) says what the question found in the turn, and the turn's
    line would take budget a further item needs (the converse of :func:`drop_covered_facts`)."""
    covered: set[str] = set()
    out: list[RecallItem] = []
    for item in items:
        if item.kind == "fact":
            covered.update(p.episode_id for p in item.provenance)
        elif item.uuid in covered:
            continue
        out.append(item)
    return out


# Short on purpose: every token here is one a remembered turn cannot use (at a 500-token budget
# the longer header and a scope tag on every line cost ~3 points of evidence recall on LoCoMo;
# the by_day header's 28-token sentence cut to 18 on 2026-11-28 gained 1.1 points of recall_all at
# 500 tokens on the tuning split with reference facts: docs/architecture.md).
HEADER = (
    "<graphiti_memory>\n"
    "Remembered facts and past exchanges, most relevant first; they may be stale: what the user says now wins.\n"
)
HEADER_BY_DAY = (
    "<graphiti_memory>\n"
    "Memory by day, newest first; may be stale: what the user says now wins.\n"
)
HEADER_UNDATED = (
    "<graphiti_memory>\n"
    "Memory, most relevant first; may be stale: what the user says now wins.\n"
)
FOOTER = "</graphiti_memory>"
UNDATED = "undated"
# English abbreviations, not strftime's %b: the heading must not follow the process's locale
MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
Layout = Literal["ranked", "by_day", "undated", "auto"]
"""How recall's prompt section lays its items out. ``ranked``: one line per item, most relevant
first, each line with its date ("said 2023-05-08", "since ..."). ``by_day``: the same items (the
budget still keeps the most relevant ones), grouped under a heading per day, newest day first,
each day's items most relevant first; a line keeps only its end mark ("superseded ...",
"until ..."). A date costs ~10 cl100k tokens a line, more than a short fact itself: said once
per day, the same budget holds more of what was said, with every date still in the text.
``undated``: one line per item, most relevant first, no start dates; an end mark keeps its date
("superseded 2023-05-08"), so what changed still says when. ``auto``: ``by_day`` for a question
about time, ``undated`` for any other (:func:`services.recall.temporal.layout_for`): a heading
a day is ~6 tokens that only a question about time reads."""


def _date(item: RecallItem, now: datetime | None = None, dated: bool = True) -> str:
    if item.kind == "episode":
        said = f"said {item.valid_at.date().isoformat()}" if item.valid_at and dated else ""
        if item.invalid_at is not None:
            # every fact of this turn was superseded (services/recall/supersession.py)
            end = f"superseded {item.invalid_at.date().isoformat()}"
            return f" ({said}, {end})" if said else f" ({end})"
        return f" ({said})" if said else ""
    since = f"since {item.valid_at.date().isoformat()}" if item.valid_at and dated else ""
    if item.invalid_at:
        # a fact whose end has passed is marked superseded, so a model does not take it as current
        end = f"{'superseded' if superseded(item, now) else 'until'} {item.invalid_at.date().isoformat()}"
        return f" ({since}, {end})" if since else f" ({end})"
    return f" ({since})" if since else ""


def render_line(item: RecallItem, now: datetime | None = None, show_scope: bool = True, dated: bool = True) -> str:
    """One item's line; ``dated`` False leaves its start date out (the ``by_day`` layout's heading says it)."""
    scope = f"[{item.scope}] " if item.scope and show_scope else ""
    text = item.fact.strip()
    if item.kind == "episode":
        # a past turn's "last Friday" is written out against the day it was said (valid_at)
        text = ground(text, item.valid_at)
    return f"- {scope}{text}{_date(item, now, dated)}\n"


def day_of(item: RecallItem) -> str:
    """The heading an item goes under in the ``by_day`` layout: the day it was said (a fact: the
    day it became true), ISO; ``undated`` when unknown."""
    return item.valid_at.date().isoformat() if item.valid_at else UNDATED


def _heading(day: str) -> str:
    """A day's heading, "8 May 2023:" (6 cl100k tokens; "2023-05-08:" is 7): a token less a day
    gained 1.0 point of recall_all at 500 tokens on the LoCoMo tuning split (docs/architecture.md,
    2026-11-28 fourth session); the month by name cannot be read day-first or month-first."""
    if day == UNDATED:
        return f"{UNDATED}:\n"
    when = date.fromisoformat(day)
    return f"{when.day} {MONTHS[when.month - 1]} {when.year}:\n"


_HEADERS = {"ranked": HEADER, "by_day": HEADER_BY_DAY, "undated": HEADER_UNDATED}


def _concrete(layout: Layout) -> Layout:
    if layout == "auto":
        # no question to read here: the caller resolves auto first (temporal.layout_for); dated is the safe side
        return "by_day"
    return layout


def render_section(items: Sequence[RecallItem], layout: Layout = "ranked", show_scope: bool | None = None,
                   now: datetime | None = None) -> str:
    """The prompt section of ``items`` (in their order of relevance) in ``layout``; "" for none."""
    layout = _concrete(layout)
    if not items:
        return ""
    if show_scope is None:
        show_scope = len({item.scope for item in items}) > 1
    if layout == "ranked":
        return HEADER + "".join(render_line(i, now, show_scope=show_scope) for i in items) + FOOTER
    if layout == "undated":
        return HEADER_UNDATED + "".join(render_line(i, now, show_scope=show_scope, dated=False) for i in items) + FOOTER
    by_day: dict[str, list[str]] = {}
    for item in items:
        by_day.setdefault(day_of(item), []).append(render_line(item, now, show_scope=show_scope, dated=False))
    # newest day first: what replaced a fact is read before it (knowledge updates), as in the ranked layout
    days = sorted((d for d in by_day if d != UNDATED), reverse=True) + ([UNDATED] if UNDATED in by_day else [])
    return HEADER_BY_DAY + "".join(_heading(d) + "".join(by_day[d]) for d in days) + FOOTER


def line_costs(items: Sequence[RecallItem], count_tokens: Callable[[str], int], layout: Layout = "ranked",
               show_scope: bool | None = None, now: datetime | None = None) -> tuple[int, list[int]]:
    """Tokens of the section's frame (header and footer) and what each item adds to it, in
    order: its line, and in the ``by_day`` layout its day's heading when it is the day's first
    item. Sums of counts, not the count of the joined text (``fit_budget`` checks that too)."""
    layout = _concrete(layout)
    if show_scope is None:
        show_scope = len({item.scope for item in items}) > 1
    base = count_tokens(_HEADERS[layout]) + count_tokens(FOOTER)
    costs: list[int] = []
    days: set[str] = set()
    for item in items:
        cost = count_tokens(render_line(item, now, show_scope=show_scope, dated=layout == "ranked"))
        if layout == "by_day" and day_of(item) not in days:
            days.add(day_of(item))
            cost += count_tokens(_heading(day_of(item)))
        costs.append(cost)
    return base, costs


def fit_budget(items: Sequence[RecallItem], token_budget: int, count_tokens: Callable[[str], int],
               layout: Layout = "ranked", now: datetime | None = None) -> tuple[list[RecallItem], str]:
    """The longest prefix of ``items`` whose rendered section (``layout``) fits ``token_budget``
    tokens, and that section ("" when not even one item fits). Lines name their scope only when
    the items come from more than one. ``now``: what counts as ended (a request's ``as_of``)."""
    show_scope = len({item.scope for item in items}) > 1
    used, costs = line_costs(items, count_tokens, layout, show_scope, now)
    kept: list[RecallItem] = []
    for item, cost in zip(items, costs):
        if used + cost > token_budget:
            break
        used += cost
        kept.append(item)
    section = render_section(kept, layout, show_scope, now)
    # token counts of concatenations are not additive: shrink until the real count fits
    while kept and count_tokens(section) > token_budget:
        kept.pop()
        section = render_section(kept, layout, show_scope, now)
    return kept, section
