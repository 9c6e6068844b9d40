"""Recall's pure stages: which groups to search, merge by scope priority, near-duplicate removal,
token-budget truncation and the ``<graphiti_memory>`` prompt section.

No broker, no database: every function here is unit-tested alone (tests/services/recall).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from schemas import RecallItem, RecallRequest, subjects

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
    """The search query: the explicit query, else the last few recent messages."""
    if request.query and request.query.strip():
        return request.query.strip()
    return "\n".join(m.content for m in request.recent_messages[-RECENT_MESSAGES_IN_QUERY:]).strip()


def _words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", text.casefold()))


def near_duplicate(a: str, b: str, threshold: float = 0.8) -> bool:
    """Same words (Jaccard >= threshold) -- "Alice works at Acme." vs "Alice works at Acme"."""
    wa, wb = _words(a), _words(b)
    if not wa or not wb:
        return a.strip() == b.strip()
    return len(wa & wb) / len(wa | wb) >= threshold


def merge(results: Sequence[Sequence[RecallItem]], max_items: int) -> list[RecallItem]:
    """Concatenate per-group results (already in scope priority order, each best first), drop
    near-duplicates of an item already kept (the higher-priority scope wins), keep ``max_items``."""
    kept: list[RecallItem] = []
    for items in results:
        for item in items:
            if len(kept) >= max_items:
                return kept
            if any(item.uuid == k.uuid or near_duplicate(item.fact, k.fact) for k in kept):
                continue
            kept.append(item)
    return kept


HEADER = (
    "<graphiti_memory>\n"
    "Facts and past exchanges remembered from earlier conversations, most relevant first. They may "
    "be stale or superseded: what the user says now wins. Dates say when a fact was true or when "
    "an exchange happened.\n"
)
FOOTER = "</graphiti_memory>"


def _date(item: RecallItem) -> str:
    if item.kind == "episode":
        return f" (said {item.valid_at.date().isoformat()})" if item.valid_at else ""
    if item.valid_at and item.invalid_at:
        return f" (valid {item.valid_at.date().isoformat()} to {item.invalid_at.date().isoformat()})"
    if item.valid_at:
        return f" (since {item.valid_at.date().isoformat()})"
    return ""


def render_line(item: RecallItem) -> str:
    scope = f"[{item.scope}] " if item.scope else ""
    return f"- {scope}{item.fact.strip()}{_date(item)}\n"


def fit_budget(items: Sequence[RecallItem], token_budget: int, count_tokens: Callable[[str], int]) -> tuple[list[RecallItem], str]:
    """The longest prefix of ``items`` whose rendered section fits ``token_budget`` tokens, and
    that section ("" when not even one item fits)."""
    used = count_tokens(HEADER) + count_tokens(FOOTER)
    kept: list[RecallItem] = []
    lines: list[str] = []
    for item in items:
        line = render_line(item)
        cost = count_tokens(line)
        if used + cost > token_budget:
            break
        used += cost
        kept.append(item)
        lines.append(line)
    if not kept:
        return [], ""
    section = HEADER + "".join(lines) + FOOTER
    # token counts of concatenations are not additive: shrink until the real count fits
    while kept and count_tokens(section) > token_budget:
        kept.pop()
        lines.pop()
        section = HEADER + "".join(lines) + FOOTER if kept else ""
    return kept, section
