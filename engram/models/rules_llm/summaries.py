"""Entity summaries for engram's summary-gate prompt (``EntitySummaries``).

Each entity's ``facts`` in the order given (newest first), de-duplicated, joined as sentences
and cut at a sentence boundary to ``max_chars``; ``no_longer_true`` facts are never used and
the previous summary is ignored, so the summary is exactly the active facts. The prompt
contract is in services/summary_gate/summarize.py.
"""

from __future__ import annotations

import re
from typing import Any


def _summary_key(text: Any) -> str:
    return re.sub(r"\W+", " ", str(text)).strip().casefold()


def _cut_sentences(text: str, max_chars: int) -> str:
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    head = text[:max_chars]
    stop = head.rfind(". ")
    return head[: stop + 1] if stop > 0 else head.rstrip()


def summarize_entities(entities: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One ``{"id", "summary"}`` per entity of the summary-gate prompt's ``<ENTITIES>`` list."""
    out = []
    for entity in entities:
        retracted = {_summary_key(f) for f in entity.get("no_longer_true", [])}
        seen: set[str] = set()
        parts: list[str] = []
        for fact in entity.get("facts", []):
            key = _summary_key(fact)
            if key and key not in seen and key not in retracted:
                seen.add(key)
                parts.append(str(fact).strip().rstrip(".") + ".")
        out.append({"id": entity["id"], "summary": _cut_sentences(" ".join(parts), int(entity.get("max_chars", 800)))})
    return out
