"""Grounded entity summaries: one LLM call refreshes up to ``batch_size`` entities.

The prompt shows each entity's ACTIVE facts (newest first, capped), its previous summary, the
facts that are no longer true, and a small window of recent episodes that mention it. It asks
for summaries that state only active facts. A guard then checks every answer: a summary that
repeats a no-longer-true fact verbatim (cause ``invalidated_fact``), restates one in other
words (``invalidated_paraphrase``: embedding similarity, see guard.py), or is empty, is
replaced by a summary composed from the active facts alone (counted in
``engram_summary_guarded_total``), so an invalidated fact does not survive into a stored
summary, whatever the model does -- up to the detector's measured recall (docs/architecture.md).

Prompt contract (also read by engram/models/rules_llm/summaries.py, the offline default): the user
message holds ``<ENTITIES>`` with a JSON list of ``{"id", "name", "facts", "previous_summary",
"no_longer_true", "recent_episodes", "max_chars"}``; the answer is ``EntitySummaries``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

from graphiti_core.embedder.client import EmbedderClient
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.prompts.models import Message
from prometheus_client import Counter
from pydantic import BaseModel, Field

from engram.services.summary_gate.guard import normal, restated_by_meaning, verbatim
from engram.services.summary_gate.store import NodeView

log = logging.getLogger("engram.summary_gate")
PROMPT_NAME = "summary_gate.refresh"
GUARDED = Counter(
    "engram_summary_guarded_total",
    "Refreshed summaries replaced by a facts-only summary, by cause.",
    ["cause"],
)


class EntitySummary(BaseModel):
    id: int = Field(description="The entity's id from ENTITIES.")
    summary: str = Field(description="The entity's new summary: active facts only.")


class EntitySummaries(BaseModel):
    summaries: list[EntitySummary]


SYSTEM = (
    "You maintain short, factual summaries of entities in a knowledge graph built from conversations. "
    "Ground every statement in the entity's FACTS. Never state anything listed in NO_LONGER_TRUE, even if "
    "the previous summary said it."
)


_normal = normal  # (bench/summary_gate.py imports it from here)


def cut(text: str, max_chars: int) -> str:
    """``text`` shortened to at most ``max_chars``, at a sentence boundary when there is one."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    stop = max(head.rfind(". "), head.rfind("! "), head.rfind("? "))
    return head[: stop + 1] if stop >= max_chars // 3 else head.rstrip() + "…"


def facts_summary(node: NodeView, max_facts: int, max_chars: int) -> str:
    """A summary composed from the active facts alone (newest first): the guard's fallback."""
    seen: set[str] = set()
    parts: list[str] = []
    for fact in node.facts[:max_facts]:
        key = _normal(fact.fact)
        if key and key not in seen:
            seen.add(key)
            parts.append(fact.fact.strip().rstrip(".") + ".")
    return cut(" ".join(parts), max_chars)


def build_messages(nodes: Sequence[NodeView], *, max_facts: int, max_chars: int) -> list[Message]:
    entities = [
        {
            "id": i,
            "name": node.name,
            "facts": [f.fact for f in node.facts[:max_facts]],
            "previous_summary": node.summary,
            "no_longer_true": node.invalidated,
            "recent_episodes": node.episodes,
            "max_chars": max_chars,
        }
        for i, node in enumerate(nodes)
    ]
    user = (
        "Write a new summary for each entity below.\n"
        "- Use only its FACTS (newest first); the previous summary and recent episodes are context, not sources.\n"
        "- Leave out anything in no_longer_true.\n"
        f"- At most max_chars characters each; plain sentences, no lists.\n\n"
        f"<ENTITIES>\n{json.dumps(entities, ensure_ascii=False)}\n</ENTITIES>"
    )
    return [Message(role="system", content=SYSTEM), Message(role="user", content=user)]


async def guarded(
    node: NodeView, summary: str | None, *, max_facts: int, max_chars: int,
    embedder: EmbedderClient | None = None, threshold: float | None = None,
) -> str:
    """The summary to store for ``node``: the model's, unless it is empty or keeps a retracted
    fact, verbatim or (with an ``embedder`` and a ``threshold``) in other words."""
    text = cut(summary or "", max_chars)
    if not text:
        GUARDED.labels(cause="empty").inc()
        return facts_summary(node, max_facts, max_chars)
    active = [f.fact for f in node.facts]
    if verbatim(text, node.invalidated, active):
        GUARDED.labels(cause="invalidated_fact").inc()
        log.info("summary repeated a no-longer-true fact; using the facts-only summary")
        return facts_summary(node, max_facts, max_chars)
    if embedder is not None and threshold is not None and node.invalidated:
        # compared with the facts the prompt showed (the summary was written from those)
        found = await restated_by_meaning(embedder, text, node.invalidated, active[:max_facts], threshold)
        if found:
            GUARDED.labels(cause="invalidated_paraphrase").inc()
            log.info("summary restated a no-longer-true fact in other words (similarity %.2f, nearest active %.2f); "
                     "using the facts-only summary", found[0].similarity, found[0].nearest_active)
            return facts_summary(node, max_facts, max_chars)
    return text


async def refresh_summaries(
    llm: LLMClient, nodes: Sequence[NodeView], *, max_facts: int, max_chars: int,
    embedder: EmbedderClient | None = None, guard_threshold: float | None = None,
) -> list[str]:
    """New summaries for ``nodes`` (same order) from ONE LLM call. Without ``embedder`` the
    guard checks for verbatim repeats only (the service always passes its embedder)."""
    if not nodes:
        return []
    answer = await llm.generate_response(
        build_messages(nodes, max_facts=max_facts, max_chars=max_chars),
        response_model=EntitySummaries,
        prompt_name=PROMPT_NAME,
    )
    by_id: dict[int, str] = {}
    for item in (answer or {}).get("summaries", []) or []:
        try:
            by_id.setdefault(int(item["id"]), str(item.get("summary") or ""))
        except (KeyError, TypeError, ValueError):
            continue
    return [
        await guarded(node, by_id.get(i), max_facts=max_facts, max_chars=max_chars, embedder=embedder,
                      threshold=guard_threshold)
        for i, node in enumerate(nodes)
    ]
