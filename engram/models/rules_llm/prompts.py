"""Prompt parsing and dispatch: the blocks of graphiti 0.31's prompts this client reads, and
one handler per response model (:data:`HANDLERS`).

A block is the text between ``<TAG>`` and the first ``</TAG>`` after it (:func:`_block`);
list blocks are JSON or Python literals (:func:`_literal`: graphiti formats some with
``str()``). The tags each handler reads are checked against graphiti's rendered prompts by
tests/engram/models/rules_llm/test_prompt_blocks.py, which fails when graphiti renames or drops
one. A message containing a closing tag such as ``</CURRENT MESSAGES>`` cuts its block short.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engram.models.rules_llm.dates import _parse_datetime, fact_timestamps
from engram.models.rules_llm.dedupe import _labels, resolve_edge, resolve_node
from engram.models.rules_llm.entities import _type_id
from engram.models.rules_llm.episodes import _Doc, _analyse
from engram.models.rules_llm.extraction import ExtractionResult, _extract, _facts_for_given_entities
from engram.models.rules_llm.sessions import session_summary, user_facts
from engram.models.rules_llm.summaries import summarize_entities
from engram.models.rules_llm.text import _norm_key
from engram.text.temporal import ground


def _block(prompt: str, tag: str) -> str | None:
    """Text between ``<tag>`` and the first ``</tag>`` after it (graphiti's prompt layout)."""
    start = prompt.find(f"<{tag}>")
    if start < 0:
        return None
    start += len(tag) + 2
    end = prompt.find(f"</{tag}>", start)
    if end < 0:
        return None
    return prompt[start:end].strip("\n")


def _literal(text: str | None) -> Any:
    """A JSON or Python-literal block (graphiti formats some blocks with str(), some as JSON)."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def _parse_entity_types(block: str | None) -> list[dict[str, Any]]:
    data = _literal(block)
    if isinstance(data, list) and all(isinstance(d, dict) for d in data):
        return data
    # fall back to scanning for ids and names
    out = []
    if block:
        for m in re.finditer(r"'entity_type_id':\s*(\d+),\s*'entity_type_name':\s*'([^']*)'", block):
            out.append({"entity_type_id": int(m.group(1)), "entity_type_name": m.group(2)})
    return out or [{"entity_type_id": 0, "entity_type_name": "Entity"}]


def _json_to_text(content: str) -> str:
    """JSON episodes: string values become sentences ("key: value.")."""
    data = _literal(content)
    if data is None:
        return content
    parts: list[str] = []

    def walk(value: Any, key: str = "") -> None:
        if len(parts) > 200:
            return
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and value.strip():
            parts.append(value.strip().rstrip(".") + ".")

    walk(data)
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------
# Handlers: one per response model, each reads its blocks and answers with a plain dict
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    """The client's caps, passed to the handlers that extract."""

    max_entities_per_message: int
    max_entities: int
    max_fact_chars: int


def _doc_and_types(prompt: str, tags: tuple[str, ...]) -> tuple[_Doc, list[dict[str, Any]], str]:
    content = None
    used = ""
    for tag in tags:
        content = _block(prompt, tag)
        if content is not None:
            used = tag
            break
    if content is None:
        content = ""
    if used == "JSON":
        content = _json_to_text(content)
    types = _parse_entity_types(_block(prompt, "ENTITY TYPES"))
    previous = _block(prompt, "PREVIOUS MESSAGES")
    reference = _parse_datetime(_block(prompt, "REFERENCE_TIME") or "")
    return _analyse(content, previous, reference), types, used


def _run(doc: _Doc, types: list[dict[str, Any]], limits: Limits) -> ExtractionResult:
    present = {str(t.get("entity_type_name", "")) for t in types}
    return _extract(doc, present, max_per_message=limits.max_entities_per_message, max_entities=limits.max_entities, max_fact_chars=limits.max_fact_chars)


def name_known_entities(prompt: str, answer: dict[str, Any]) -> dict[str, Any]:
    """``answer`` (a combined-extraction answer) with each entity that is one of the prompt's
    KNOWN ENTITIES (by the rules of ``resolve_node``, which answered graphiti's node dedupe call)
    renamed to its known name, in the entity list and the facts' endpoints: engram's prompt asks
    for an existing entity's name exactly (services/extractor/extraction_prompt.py)."""
    known = _literal(_block(prompt, "KNOWN ENTITIES") or "")
    if not isinstance(known, list) or not known:
        return answer
    candidates = [{"candidate_id": i, "name": str(n)} for i, n in enumerate(known)]
    renamed: dict[str, str] = {}
    for entity in answer.get("extracted_entities", []):
        i = resolve_node(str(entity.get("name", "")), set(), candidates)
        if i >= 0 and candidates[i]["name"] != entity["name"]:
            renamed[entity["name"]] = candidates[i]["name"]
            entity["name"] = candidates[i]["name"]
    for edge in answer.get("edges", []):
        for end in ("source_entity_name", "target_entity_name"):
            edge[end] = renamed.get(edge.get(end), edge.get(end))
    return answer


def answer_turn_questions(prompt: str, edges: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``edges`` (combined-extraction answer rows) with what engram's prompt also asks of each
    fact (services/extractor/extraction_prompt.py): its dates when the prompt gives a REFERENCE
    TIME, and which KNOWN FACTS it restates or replaces when it lists some. Answered by the same
    rules as graphiti's separate timestamp and resolve_edge prompts, so one call gives what those
    gave; graphiti's prompt has neither block and the rows come back as they were."""
    told = _parse_datetime(_block(prompt, "REFERENCE TIME") or "")
    known = _literal(_block(prompt, "KNOWN FACTS") or "")
    rows = [{"idx": r["id"], "fact": str(r.get("fact", ""))} for r in known if isinstance(r, dict)
            and isinstance(r.get("id"), int)] if isinstance(known, list) else []
    for edge in edges:
        fact = str(edge.get("fact", ""))
        if told is not None:
            edge["valid_at"], edge["invalid_at"] = fact_timestamps(fact, told)
        if rows:
            judged = resolve_edge(fact, rows, [])
            if judged["duplicate_facts"]:
                edge["restates"] = judged["duplicate_facts"][0]
            edge["replaces"] = judged["contradicted_facts"]
    return edges


def answer_turn_context(prompt: str, answer: dict[str, Any]) -> dict[str, Any]:
    """A combined-extraction ``answer`` completed with what engram's prompt also asks (its
    REFERENCE TIME, KNOWN FACTS and KNOWN ENTITIES blocks): :func:`answer_turn_questions` for the
    facts, :func:`name_known_entities` for the entities. The rules model's and the bench's
    reference client's one way to answer them."""
    answer["edges"] = answer_turn_questions(prompt, answer.get("edges", []))
    return name_known_entities(prompt, answer)


def combined(prompt: str, limits: Limits) -> dict[str, Any]:
    doc, types, _ = _doc_and_types(prompt, ("CURRENT MESSAGES",))
    result = _run(doc, types, limits)
    names = {_norm_key(e.name): e.name for e in result.entities}
    return answer_turn_context(prompt, {
        "extracted_entities": [{"name": e.name, "entity_type_id": _type_id(e.category, types)} for e in result.entities],
        "edges": [
            {
                "source_entity_name": names[f.source],
                "target_entity_name": names[f.target],
                "relation_type": f.relation,
                # grounded against its [Episode N] timestamp: the stored fact outlives the
                # day "last Friday" meant (graphiti's timestamp prompt then reads the date back)
                "fact": ground(f.fact, f.reference),
                "episode_indices": sorted(f.episodes),
            }
            for f in result.facts
        ],
    })


def entities(prompt: str, limits: Limits) -> dict[str, Any]:
    doc, types, _ = _doc_and_types(prompt, ("CURRENT MESSAGE", "TEXT", "JSON"))
    result = _run(doc, types, limits)
    return {
        "extracted_entities": [
            {"name": e.name, "entity_type_id": _type_id(e.category, types), "episode_indices": sorted(e.episodes)}
            for e in result.entities
        ]
    }


def edges(prompt: str, limits: Limits) -> dict[str, Any]:
    content = _block(prompt, "CURRENT_MESSAGE") or ""
    reference = _parse_datetime(_block(prompt, "REFERENCE_TIME"))
    given = _literal(_block(prompt, "ENTITIES")) or []
    names: list[tuple[str, list[str]]] = []
    for item in given if isinstance(given, list) else []:
        if isinstance(item, dict) and isinstance(item.get("name"), str):
            labels = item.get("entity_types") or item.get("labels") or []
            names.append((item["name"], [str(x) for x in labels] if isinstance(labels, list) else []))
    doc = _analyse(content, _block(prompt, "PREVIOUS_MESSAGES"), reference)
    facts = _facts_for_given_entities(doc, names, limits.max_fact_chars)
    by_key = {_norm_key(n): n for n, _ in names}
    edges = []
    for f in facts:
        valid_at, invalid_at = fact_timestamps(f.fact, f.reference or reference)
        edges.append(
            {
                "source_entity_name": by_key[f.source],
                "target_entity_name": by_key[f.target],
                "relation_type": f.relation,
                "fact": ground(f.fact, f.reference or reference),
                "valid_at": valid_at,
                "invalid_at": invalid_at,
                "episode_indices": sorted(f.episodes),
            }
        )
    return {"edges": edges}


def node_resolutions(prompt: str, limits: Limits) -> dict[str, Any]:
    extracted = _literal(_block(prompt, "ENTITIES")) or []
    existing = _literal(_block(prompt, "EXISTING ENTITIES")) or []
    existing = [c for c in existing if isinstance(c, dict)] if isinstance(existing, list) else []
    out = []
    for i, item in enumerate(extracted if isinstance(extracted, list) else []):
        if not isinstance(item, dict):
            continue
        name = str(item.get("name", ""))
        try:
            ident = int(item.get("id", i))
        except (TypeError, ValueError):
            ident = i
        dup = resolve_node(name, _labels(item.get("entity_type", item.get("entity_types", []))), existing)
        out.append({"id": ident, "name": name, "duplicate_candidate_id": dup})
    return {"entity_resolutions": out}


def node_duplicate(prompt: str, limits: Limits) -> dict[str, Any]:
    node = _literal(_block(prompt, "NEW ENTITY"))
    existing = _literal(_block(prompt, "EXISTING ENTITIES")) or []
    existing = [c for c in existing if isinstance(c, dict)] if isinstance(existing, list) else []
    if not isinstance(node, dict):
        return {"id": 0, "name": "", "duplicate_candidate_id": -1}
    name = str(node.get("name", ""))
    dup = resolve_node(name, _labels(node.get("entity_type", node.get("entity_types", node.get("labels", [])))), existing)
    return {"id": int(node.get("id", 0) or 0), "name": name, "duplicate_candidate_id": dup}


def _fact_rows(value: Any) -> list[dict[str, Any]]:
    """The ``{"idx", "fact"}`` rows of a dedupe question's list; anything else dropped."""
    return [x for x in value if isinstance(x, dict)] if isinstance(value, list) else []


def edge_duplicate(prompt: str, limits: Limits) -> dict[str, Any]:
    existing = _fact_rows(_literal(_block(prompt, "EXISTING FACTS")))
    candidates = _fact_rows(_literal(_block(prompt, "FACT INVALIDATION CANDIDATES")))
    new_fact = (_block(prompt, "NEW FACT") or "").strip()
    return resolve_edge(new_fact, existing, candidates)


def edge_duplicates(prompt: str, limits: Limits) -> dict[str, Any]:
    """engram's batched dedupe prompt (services/extractor/dedupe_batch.py): one JSON question a
    line in ``<QUESTIONS>``, each answered as :func:`edge_duplicate` answers graphiti's."""
    answers = []
    for line in (_block(prompt, "QUESTIONS") or "").split("\n"):  # not splitlines(): U+2028 may be in a fact
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict) or not isinstance(row.get("id"), int):
            continue
        answers.append({"id": row["id"], **resolve_edge(str(row.get("new_fact", "")), _fact_rows(row.get("existing_facts")),
                                                        _fact_rows(row.get("invalidation_candidates")))})
    return {"answers": answers}


def timestamps(prompt: str, limits: Limits) -> dict[str, Any]:
    fact = _block(prompt, "FACT") or ""
    reference = _parse_datetime(_block(prompt, "REFERENCE TIME"))
    valid_at, invalid_at = fact_timestamps(fact, reference)
    return {"valid_at": valid_at, "invalid_at": invalid_at}


def entity_summaries(prompt: str, limits: Limits) -> dict[str, Any]:
    return {"summaries": summarize_entities(json.loads(_block(prompt, "ENTITIES") or "[]"))}


def batch_timestamps(prompt: str, limits: Limits) -> dict[str, Any]:
    facts = _literal(_block(prompt, "FACTS")) or []
    out = []
    for item in facts if isinstance(facts, list) else []:
        if isinstance(item, dict):
            valid_at, invalid_at = fact_timestamps(str(item.get("fact", "")), _parse_datetime(str(item.get("reference_time") or "")))
        else:
            valid_at, invalid_at = None, None
        out.append({"valid_at": valid_at, "invalid_at": invalid_at})
    return {"timestamps": out}


Handler = Callable[[str, Limits], dict[str, Any]]

# Dispatch on ``response_model.__name__``: graphiti's response models, plus engram's own
# summary-gate model (services/summary_gate/summarize.py) and the session close stage's two.
HANDLERS: dict[str, Handler] = {
    "CombinedExtraction": combined,
    "ExtractedEntities": entities,
    "ExtractedEdges": edges,
    "NodeResolutions": node_resolutions,
    "NodeDuplicate": node_duplicate,
    "EdgeDuplicate": edge_duplicate,
    "EdgeDuplicates": edge_duplicates,  # engram's batched dedupe (services/extractor/dedupe_batch.py)
    "EdgeTimestamps": timestamps,
    "BatchEdgeTimestamps": batch_timestamps,
    "EntitySummaries": entity_summaries,
    # the session close stage (services/sessions/close.py): its own prompt blocks, not graphiti's
    "HybridSessionSummary": lambda prompt, limits: session_summary(_block(prompt, "TRANSCRIPT")),
    "UserFacts": lambda prompt, limits: user_facts(_block(prompt, "TRANSCRIPT")),
}
