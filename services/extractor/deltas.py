"""NodeDeltas: what one episode changed on each entity it touched (for the summary service).

Pure functions over the extraction result, no database and no LLM:

* :func:`build_node_deltas` -- one :class:`~schemas.NodeDelta` per touched entity: every
  entity the episode mentions, plus the endpoints of facts the episode invalidated (an
  invalidation reaches entities the episode never named: "Alice works at Google" expires
  "Alice works at Microsoft", and Microsoft's summary is stale too).

  - ``new_facts``: the episode's new edges (not re-used duplicates) touching the entity;
  - ``invalidated_facts``: edges this episode invalidated touching the entity, with
    ``invalidated_by`` = the invalidating edge's uuid. Taken from graphiti's own mapping
    (``resolve_extracted_edges(invalidated_by=...)``) when the result carries it, otherwise
    inferred: first an edge of the episode with the same two endpoints (either direction),
    then the single edge of the episode that shares an endpoint and whose ``valid_at``
    equals the invalidated edge's ``invalid_at`` (graphiti sets exactly that). ``None``
    when neither rule gives one answer;
  - ``is_new_node``: the entity was created by this episode;
  - ``polarity_flip``: an invalidation touched the entity, or a new fact touching it carries
    a negation cue (:data:`NEGATION_CUES`, whole words, case-insensitive, curly apostrophes
    normalised).

* :func:`delta_message_id` -- deterministic ``Nats-Msg-Id`` from (episode_id, node_uuid), so a
  re-published delta is dropped by the stream's duplicate window.

Partial: the negation cue list is English only and lexical ("not bad" flips polarity,
"gave up smoking" does not); invalidations are whatever graphiti's resolve_edge step decided;
the inferred ``invalidated_by`` (used when deltas are rebuilt from the stored graph) can be
``None`` where the first run knew the answer.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Protocol

from graphiti_core.edges import EntityEdge
from graphiti_core.nodes import EntityNode

from engram.graph.facts import infer_invalidated_by
from engram.schemas import Episode, FactRef, InvalidatedFact, NodeDelta
from engram.schemas.messages import MESSAGE_ID_PATTERN

NEGATION_CUES: tuple[str, ...] = (
    "not",
    "no longer",
    "never",
    "stopped",
    "quit",
    "isn't",
    "doesn't",
    "don't",
    "won't",
    "can't",
    "cannot",
    "instead of",
    "switched",
    "moved away",
)

_CUE_RE = re.compile(
    r"(?<![\w'])(?:" + "|".join(re.escape(c).replace(r"\ ", r"\s+") for c in NEGATION_CUES) + r")(?![\w'])",
    re.IGNORECASE,
)
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
_MSG_ID_RE = re.compile(MESSAGE_ID_PATTERN)
_DELTA_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://engram.dev/node-delta")


class ExtractionLike(Protocol):
    """What :func:`build_node_deltas` reads (``pipeline.ExtractionResult`` has all of it)."""

    nodes: list[EntityNode]
    context_nodes: list[EntityNode]
    new_node_uuids: list[str]
    resolved_edges: list[EntityEdge]
    new_edges: list[EntityEdge]
    invalidated_edges: list[EntityEdge]
    invalidated_by: dict[str, list[str]]


def has_negation_cue(text: str | None) -> bool:
    """Whether ``text`` contains one of :data:`NEGATION_CUES` as whole words."""
    if not text:
        return False
    return _CUE_RE.search(text.translate(_APOSTROPHES)) is not None


def _touches(edge: EntityEdge, node_uuid: str) -> bool:
    return node_uuid in (edge.source_node_uuid, edge.target_node_uuid)


def _invalidator(
    invalidated: EntityEdge, mapping: Mapping[str, list[str]], episode_edges: Sequence[EntityEdge]
) -> str | None:
    known = mapping.get(invalidated.uuid)
    if known:
        return known[0]
    return infer_invalidated_by(invalidated, episode_edges)


def _unique(nodes: Iterable[EntityNode]) -> list[EntityNode]:
    seen: dict[str, EntityNode] = {}
    for node in nodes:
        seen.setdefault(node.uuid, node)
    return list(seen.values())


def touched_nodes(result: ExtractionLike) -> list[EntityNode]:
    """Mentioned entities plus endpoints of invalidated facts that we have a node for.

    Sorted by (name, uuid) so a first run and a rebuild from the graph give the same order.
    """
    nodes = _unique([*result.nodes, *result.context_nodes])
    return sorted(nodes, key=lambda n: (n.name.casefold(), n.uuid))


def build_node_deltas(episode: Episode, result: ExtractionLike) -> list[NodeDelta]:
    """One NodeDelta per touched entity of ``episode`` (see the module docstring)."""
    new_nodes = set(result.new_node_uuids)
    episode_edges = _unique_edges([*result.resolved_edges, *result.new_edges])
    new_edges = _unique_edges(result.new_edges)
    invalidated_edges = _unique_edges(result.invalidated_edges)

    deltas: list[NodeDelta] = []
    for node in touched_nodes(result):
        new_facts = [
            FactRef(uuid=e.uuid, fact=e.fact, embedding=list(e.fact_embedding) if e.fact_embedding else None)
            for e in new_edges
            if _touches(e, node.uuid)
        ]
        invalidated = [
            InvalidatedFact(
                uuid=e.uuid, fact=e.fact, invalidated_by=_invalidator(e, result.invalidated_by, episode_edges)
            )
            for e in invalidated_edges
            if _touches(e, node.uuid)
        ]
        polarity = bool(invalidated) or any(has_negation_cue(f.fact) for f in new_facts)
        deltas.append(
            NodeDelta(
                group_id=episode.group_id,
                node_uuid=node.uuid,
                node_name=node.name,
                episode_id=episode.episode_id,
                episode_time=episode.reference_time,
                is_new_node=node.uuid in new_nodes,
                new_facts=new_facts,
                invalidated_facts=invalidated,
                polarity_flip=polarity,
                first_published_at=episode.first_published_at,
            )
        )
    return deltas


def _unique_edges(edges: Iterable[EntityEdge]) -> list[EntityEdge]:
    seen: dict[str, EntityEdge] = {}
    for edge in edges:
        seen.setdefault(edge.uuid, edge)
    return list(seen.values())


def delta_message_id(delta: NodeDelta) -> str:
    """Deterministic Nats-Msg-Id of a delta: ``<episode_id>:<node_uuid>``.

    Falls back to a uuid5 of the pair when that would not be a valid message id (characters
    outside MESSAGE_ID_PATTERN or longer than 256), so any ids give a valid header.
    """
    readable = f"{delta.episode_id}:{delta.node_uuid}"
    if _MSG_ID_RE.fullmatch(readable):
        return readable
    return "delta-" + str(uuid.uuid5(_DELTA_NAMESPACE, f"{delta.episode_id}\x00{delta.node_uuid}"))
