"""The context builder (seed 004, 6): the prompt sections an agent injects at the start of a turn.

:func:`build_context` is a pure async function over a :class:`ContextRequest`, the layers' default
budgets and a :class:`ContextSources` (where the stored layers come from). Layers, in order:

* ``identity``        -- the request's own ``identity`` text (engram stores no identity).
* ``agent_memory``    -- the workspace's durable memories: episodes promoted with ``engram promote``
  / ``POST /promote`` (decisions, lessons learned, preferences, procedures) in the workspace
  group, newest first. A promotion is stored as an Episodic node named ``promotion:<digest>``
  whose ``source_description`` is ``engram promotion (<kind>)`` (engram/publishing/promote.py,
  services/extractor/pipeline.py): both are matched, so a chat turn never shows up here.
* ``user_context``    -- the memory group's current preferences as ``key: value`` lines, then its
  notes, its favorites and its latest activity log entries, each newest first
  (services/sessions/store.py); cut from the end, so the activity log goes first.
* ``session_summary`` -- the hybrid summaries of the memory group's last closed session segments
  (``ENGRAM_SESSION_CONTEXT_SUMMARIES``, 3), newest first, the oldest cut first to fit.
* ``skills``          -- the request's own ``skills`` text.
* ``recall``          -- recall's answer for ``query`` over the request's scopes (``engram.recall``),
  tagged ``<graphiti_memory>`` as recall renders it.

Each section is ``<tag source="...">`` + content + ``</tag>``; the source note says where the
content came from (request, group ids, counts), never the content. A section is cut to its
budget with cl100k *including* its tags and source note: whole lines for the stored layers,
words for the request's texts, marked with ``…``; it never exceeds the budget. A layer whose
budget is 0, or that has no content (or whose tags alone would not fit), is left out. A source
that fails or outlasts the request's ``timeout_ms`` leaves its layer out and sets ``degraded``;
the other layers are served.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from engram.graph.drivers import as_utc, query_rows
from engram.settings import ContextSettings
from engram.text.tokens import CountTokens
from engram.schemas.memory import (
    ContextLayer,
    ContextRequest,
    ContextResponse,
    ContextSection,
    SessionRecord,
    UserActivity,
    UserFavorite,
    UserNote,
    UserPreference,
    memory_group_for,
)
from engram.schemas.messages import RecallRequest, RecallResponse, RecallScopes
from engram.schemas.subjects import workspace_group

LAYERS: tuple[ContextLayer, ...] = ("identity", "agent_memory", "user_context", "session_summary", "skills", "recall")
TAGS: dict[ContextLayer, str] = {
    "identity": "identity", "agent_memory": "agent_memory", "user_context": "user_context",
    "session_summary": "session_summary", "skills": "skills", "recall": "graphiti_memory",
}
CUT_MARK = "…"
RECALL_MIN_BUDGET = 16
"""RecallRequest.token_budget's lower bound."""
RECALL_SOURCE_RESERVE = 24
"""Tokens of the recall layer's budget kept for the source note in its opening tag: recall is asked
for a section that small, so that it usually fits whole once the note is added."""
AGENT_MEMORY_LIMIT = 50
"""Promoted memories read for the agent_memory layer (newest first; the budget cuts further)."""
NOTES_LIMIT = 200
"""Notes read for the user_context layer (newest first; the budget cuts further)."""
FAVORITES_LIMIT = 50
"""Favorites read for the user_context layer (newest first; the budget cuts further)."""
ACTIVITIES_LIMIT = 10
"""Activity log entries shown in the user_context layer: the latest only (the log is for recency)."""


@dataclass(frozen=True)
class LayerContent:
    """What a source found for a layer: the content (no tags) and where it came from."""

    body: str
    source: str


class ContextSources(Protocol):
    """Where the stored layers come from; each returns None when there is nothing (no scope, no data)."""

    async def agent_memory(self, request: ContextRequest) -> LayerContent | None: ...

    async def user_context(self, request: ContextRequest) -> LayerContent | None: ...

    async def session_summary(self, request: ContextRequest) -> LayerContent | None: ...

    async def recall(self, request: ContextRequest, budget: int, timeout_ms: int) -> LayerContent | None: ...


# --- rendering and cutting ------------------------------------------------------------------

def _attribute(source: str) -> str:
    return re.sub(r'["<>\n\r]+', " ", source).strip()


def wrap(tag: str, source: str, body: str) -> str:
    """The section as injected: ``<tag source="...">``, the body, ``</tag>``."""
    body = body.strip("\n")
    return f'<{tag} source="{_attribute(source)}">\n{body}\n</{tag}>' if body else ""


def _snap(body: str, n: int, whole_lines: bool) -> str:
    """``body[:n]`` backed off to the last line end (``whole_lines``) or word boundary."""
    cut = body[:n]
    if n >= len(body):
        return cut
    # Whole lines, unless that would throw away more than half of what fits (one long first
    # line): then words, like the request's texts.
    if whole_lines and "\n" in cut and cut.rindex("\n") >= n // 2:
        return cut[: cut.rindex("\n")].rstrip()
    if not body[n].isspace():
        space = max(cut.rfind(" "), cut.rfind("\n"), cut.rfind("\t"))
        if space > 0:
            cut = cut[:space]
    return cut.rstrip()


def fit_section(tag: str, source: str, body: str, budget: int, count: CountTokens,
                whole_lines: bool = True) -> tuple[str, int, bool]:
    """``(text, tokens, truncated)``: the wrapped section cut so that ``tokens <= budget``
    (cl100k of the whole text, tags included); ``("", 0, False)`` when nothing fits."""
    body = body.strip("\n")
    if budget <= 0 or not body.strip():
        return "", 0, False
    full = wrap(tag, source, body)
    tokens = count(full)
    if tokens <= budget:
        return full, tokens, False
    if whole_lines:
        fitted = _fit_lines(tag, source, body, budget, count)
        if fitted is not None:
            return fitted

    def fits(n: int) -> bool:
        cut = body[:n].rstrip()
        return bool(cut) and count(wrap(tag, source, cut + CUT_MARK)) <= budget

    # Gallop to an upper bound (a token is rarely more than 8 characters), then bisect: each count
    # is over at most twice the text that fits, not over a 200k-character skills text.
    lo, hi = 0, min(len(body), 8 * budget + 64)
    while hi < len(body) and fits(hi):
        lo, hi = hi, min(len(body), 2 * hi)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    cut = _snap(body, lo, whole_lines)
    # Token counts are not monotonic in the text's length: shrink until the real count fits.
    # A cut with no letter or digit left ("-…") says nothing: the layer is left out instead.
    while cut and any(ch.isalnum() for ch in cut):
        text = wrap(tag, source, cut + CUT_MARK)
        tokens = count(text)
        if tokens <= budget:
            return text, tokens, True
        cut = _snap(cut, len(cut) - 1, whole_lines)
    return "", 0, False


def _fit_lines(tag: str, source: str, body: str, budget: int, count: CountTokens) -> tuple[str, int, bool] | None:
    """Whole lines, best first, up to the budget: each line counted once (the sum is close: a newline mostly merges
    into the line end's token) and
    the sum checked with one count of the result (lines are dropped from the end while the real
    count is over). Two or three counts of the section instead of the bisection's ~15 (the
    user_context layer of bench/sessions.py: 12 ms -> 3 ms). None when the whole lines that fit
    leave more than half the budget unused (a long line next): the caller cuts inside it."""
    lines = body.split("\n")
    overhead = count(wrap(tag, source, "x" + CUT_MARK)) - count("x" + CUT_MARK)
    used, kept = overhead + count(CUT_MARK), 0
    for line in lines:
        cost = count(line)  # the newline mostly merges into the line end's token (".\n"): not counted
        if used + cost > budget:
            break
        used += cost
        kept += 1
    if budget - used > budget // 2:
        return None  # a long line cut off more than half of what fits: cut inside it (the caller)
    while kept:
        cut = "\n".join(lines[:kept]).rstrip()
        if not any(ch.isalnum() for ch in cut):
            return None
        text = wrap(tag, source, cut + CUT_MARK)
        tokens = count(text)
        if tokens <= budget:
            return text, tokens, True
        kept -= 1
    return None


# --- the builder ----------------------------------------------------------------------------

def budgets_for(request: ContextRequest, defaults: ContextSettings) -> dict[ContextLayer, int]:
    given = request.budgets
    return {layer: (getattr(given, layer) if getattr(given, layer) is not None else getattr(defaults, layer))
            for layer in LAYERS}


async def build_context(request: ContextRequest, *, defaults: ContextSettings, sources: ContextSources,
                        count: CountTokens) -> ContextResponse:
    """The layered context for ``request`` (see the module docstring). Never raises for a
    source's failure: that layer is left out, ``degraded`` is set and ``reason`` names the
    layer and the exception type."""
    started = time.perf_counter()
    budgets = budgets_for(request, defaults)
    timeout_s = request.timeout_ms / 1000
    contents: dict[ContextLayer, LayerContent | None] = {
        "identity": LayerContent(request.identity, "request") if request.identity else None,
        "skills": LayerContent(request.skills, "request") if request.skills else None,
    }
    # Recall gets most of the time: it answers (maybe degraded) before this request gives up on it.
    recall_timeout_ms = max(10, int(request.timeout_ms * 0.8))
    pending: dict[ContextLayer, Callable[[], Awaitable[LayerContent | None]]] = {
        "agent_memory": lambda: sources.agent_memory(request),
        "user_context": lambda: sources.user_context(request),
        "session_summary": lambda: sources.session_summary(request),
        "recall": lambda: sources.recall(request, budgets["recall"], recall_timeout_ms),
    }
    wanted = [layer for layer in pending
              if budgets[layer] > 0 and (layer != "recall" or (request.query and budgets[layer] >= RECALL_MIN_BUDGET))]
    results = await asyncio.gather(*(asyncio.wait_for(pending[layer](), timeout_s) for layer in wanted),
                                   return_exceptions=True)
    failures: list[str] = []
    for layer, result in zip(wanted, results):
        if isinstance(result, BaseException):
            if not isinstance(result, Exception):
                raise result  # cancellation and the like are not a source's failure
            why = "timeout" if isinstance(result, (asyncio.TimeoutError, TimeoutError)) else type(result).__name__
            failures.append(f"{layer}: {why}")
            contents[layer] = None
        else:
            contents[layer] = result
    sections: list[ContextSection] = []
    for layer in LAYERS:
        content = contents.get(layer)
        if content is None or budgets[layer] <= 0:
            continue
        whole_lines = layer not in ("identity", "skills")
        text, tokens, truncated = fit_section(TAGS[layer], content.source, content.body, budgets[layer], count,
                                              whole_lines=whole_lines)
        if text:
            sections.append(ContextSection(layer=layer, tag=TAGS[layer], source=_attribute(content.source),
                                           text=text, tokens=tokens, budget=budgets[layer], truncated=truncated))
    prompt = "\n\n".join(s.text for s in sections)
    return ContextResponse(
        sections=sections, prompt=prompt, tokens=count(prompt) if prompt else 0, degraded=bool(failures),
        reason="degraded: " + ", ".join(failures) if failures else None,
        took_ms=round((time.perf_counter() - started) * 1000, 2),
    )


# --- rendering the stored layers --------------------------------------------------------------

_SPEAKER = re.compile(r"^user(?: \([^)\n]*\))?: ")
_PROMOTION_KIND = re.compile(r"^engram promotion \((.+)\)$")


def _n(count: int, one: str, many: str | None = None) -> str:
    return f"{count} {one if count == 1 else (many or one + 's')}"


def _day(value: datetime | None) -> str:
    return value.date().isoformat() if value else ""


def _one_line(text: str) -> str:
    return " ".join(text.split())


def render_promotions(rows: list[dict[str, Any]]) -> str:
    """Promoted episodes (newest first) as ``- [decision, 2026-11-24] text`` lines."""
    lines = []
    for row in rows:
        content = _SPEAKER.sub("", (row.get("content") or "").strip())
        if not content:
            continue
        kind = _PROMOTION_KIND.match(row.get("source_description") or "")
        label = ", ".join(x for x in ((kind.group(1) if kind else "memory"), _day(row.get("valid_at"))) if x)
        lines.append(f"- [{label}] {_one_line(content)}")
    return "\n".join(lines)


def render_user_context(preferences: list[UserPreference], notes: list[UserNote],
                        favorites: list[UserFavorite] = (), activities: list[UserActivity] = ()) -> str:
    """Current preferences as ``key: value`` lines, then the notes, the favorites and the
    activity log (``- <day> <kind>: <text>``), each newest first."""
    parts = []
    current = [p for p in preferences if p.current]
    if current:
        parts.append("Preferences:\n" + "\n".join(f"- {p.key}: {_one_line(p.value)}" for p in current))
    if notes:
        ordered = sorted(notes, key=lambda n: n.created_at, reverse=True)
        parts.append("Notes:\n" + "\n".join(f"- {_one_line(n.text)}" for n in ordered))
    if favorites:
        ordered_f = sorted(favorites, key=lambda f: f.added_at, reverse=True)
        parts.append("Favorites:\n" + "\n".join(
            f"- {_one_line(f.item)}" + (f" ({f.kind})" if f.kind else "") for f in ordered_f))
    if activities:
        ordered_a = sorted(activities, key=lambda a: a.occurred_at, reverse=True)
        parts.append("Recent activity:\n" + "\n".join(
            f"- {_day(a.occurred_at)} {a.kind}: {_one_line(a.text)}" for a in ordered_a))
    return "\n".join(parts)


def render_sessions(records: list[SessionRecord]) -> LayerContent:
    """The last sessions' summaries, newest first: one alone as it is, several each under a line
    naming its session and day (whole lines are cut from the end: the oldest go first)."""
    if len(records) == 1:
        return render_session(records[0])
    # the heading opens the summary's first line: a cut after one line still says something
    body = "\n\n".join(f"[session {r.session_id} segment {r.segment}, closed {_day(r.closed_at)}, {r.close_reason}] "
                        f"{r.summary.strip()}" for r in records)
    newest = records[0]
    return LayerContent(body=body, source=f"last {len(records)} sessions, newest closed "
                                          f"{newest.closed_at.isoformat(timespec='minutes')}")


def render_session(record: SessionRecord) -> LayerContent:
    closed = record.closed_at.isoformat(timespec="minutes")
    return LayerContent(
        body=record.summary.strip(),
        source=f"session {record.session_id} segment {record.segment}, closed {closed} ({record.close_reason}, "
               f"summary {record.summary_source})",
    )


def recall_body(response: RecallResponse) -> str:
    """Recall's prompt section without its own ``<graphiti_memory>`` tags (they are re-added
    with the source note)."""
    section = response.prompt_section.strip()
    section = re.sub(r"^<graphiti_memory>\n?", "", section)
    return re.sub(r"\n?</graphiti_memory>$", "", section)


def recall_request(request: ContextRequest, budget: int, timeout_ms: int) -> RecallRequest:
    scopes = request.scopes
    return RecallRequest(query=request.query, scopes=RecallScopes(session=scopes.session, workspace=scopes.workspace,
                                                                  user=scopes.user),
                         token_budget=max(RECALL_MIN_BUDGET, budget - RECALL_SOURCE_RESERVE), timeout_ms=timeout_ms)


# --- the service's sources ------------------------------------------------------------------

Q_PROMOTIONS = (
    "MATCH (e:Episodic) WHERE e.group_id = $group_id AND e.name STARTS WITH 'promotion:' "
    "AND e.source_description STARTS WITH 'engram promotion (' "
    "RETURN e.content AS content, e.source_description AS source_description, e.valid_at AS valid_at "
    "ORDER BY e.valid_at DESC, e.created_at DESC LIMIT $limit"
)

AskRecall = Callable[[RecallRequest, float], Awaitable[RecallResponse]]
"""Send a RecallRequest on ``engram.recall`` and wait at most the given seconds for the reply."""


class StoredSources:
    """The layers from the graph (through services/sessions/store.py's MemoryStore) and recall."""

    def __init__(self, store: Any, prefix: str, ask_recall: AskRecall, summaries: int = 1) -> None:  # store: MemoryStore
        self.store = store
        self.prefix = prefix
        self.ask_recall = ask_recall
        self.summaries = summaries  # ENGRAM_SESSION_CONTEXT_SUMMARIES: sessions chained in session_summary

    def _memory_group(self, request: ContextRequest) -> str | None:
        s = request.scopes
        return memory_group_for(self.prefix, user=s.user, workspace=s.workspace, session=s.session)

    async def agent_memory(self, request: ContextRequest) -> LayerContent | None:
        if not request.scopes.workspace:
            return None
        group = workspace_group(self.prefix, request.scopes.workspace)
        graphs = self.store.graphs
        if not await graphs.exists(group):  # reading must not create the workspace's graph
            return None
        rows = await query_rows(await graphs.driver(group), Q_PROMOTIONS, group_id=group, limit=AGENT_MEMORY_LIMIT)
        for row in rows:
            row["valid_at"] = as_utc(row.get("valid_at"))
        body = render_promotions(rows)
        return LayerContent(body, f"workspace group {group}: {_n(len(rows), 'promoted memory', 'promoted memories')}") if body else None

    async def user_context(self, request: ContextRequest) -> LayerContent | None:
        group = self._memory_group(request)
        if group is None:
            return None
        preferences, notes, favorites, activities = await asyncio.gather(
            self.store.preferences(group), self.store.notes(group, NOTES_LIMIT),
            self.store.favorites(group, FAVORITES_LIMIT), self.store.activities(group, ACTIVITIES_LIMIT))
        body = render_user_context(preferences, notes, favorites, activities)
        current = sum(1 for p in preferences if p.current)
        counts = [_n(current, "preference"), _n(len(notes), "note")]
        counts += [_n(len(favorites), "favorite")] if favorites else []
        counts += [_n(len(activities), "activity", "activities")] if activities else []
        return LayerContent(body, f"group {group}: {', '.join(counts)}") if body else None

    async def session_summary(self, request: ContextRequest) -> LayerContent | None:
        group = self._memory_group(request)
        if group is None:
            return None
        records = [r for r in await self.store.last_sessions(group, self.summaries) if r.summary.strip()]
        if not records:
            return None
        content = render_sessions(records)
        return LayerContent(content.body, f"group {group}: {content.source}")

    async def recall(self, request: ContextRequest, budget: int, timeout_ms: int) -> LayerContent | None:
        scopes = request.scopes
        if not request.query or not (scopes.session or scopes.workspace or scopes.user):
            return None
        response = await self.ask_recall(recall_request(request, budget, timeout_ms), timeout_ms / 1000 + 0.5)
        if response.degraded:
            raise RecallDegraded(response.reason or "degraded")
        body = recall_body(response)
        if not body:
            return None
        facts = sum(1 for i in response.items if i.kind == "fact")
        return LayerContent(body, f"recall: {_n(facts, 'fact')}, {_n(len(response.items) - facts, 'past turn')}")


class RecallDegraded(RuntimeError):
    """Recall answered, but failed open (timeout or backend error): the layer counts as failed."""
