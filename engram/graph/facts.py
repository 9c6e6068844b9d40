"""Which new fact ended an old one: the one rule the extractor's NodeDeltas and the memory
explorer share (graphiti stores that a fact was invalidated, not by which fact)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol


class DatedFact(Protocol):
    """What the rule reads of a fact: a graphiti EntityEdge, or a stored fact as recall returns it."""

    uuid: str
    source_node_uuid: str
    target_node_uuid: str
    valid_at: datetime | None
    invalid_at: datetime | None


def same_instant(a: datetime | None, b: datetime | None) -> bool:
    try:
        return a is not None and b is not None and a == b
    except TypeError:  # naive vs aware: never equal for our purposes
        return False


def infer_invalidated_by(invalidated: DatedFact, candidates: Sequence[DatedFact]) -> str | None:
    """The fact among ``candidates`` (the invalidating episode's) that most plausibly ended
    ``invalidated``, or None.

    1. a fact with the same endpoints (either direction); several: the one whose ``valid_at``
       equals ``invalidated.invalid_at``, else the first;
    2. otherwise the single fact sharing an endpoint whose ``valid_at`` equals
       ``invalidated.invalid_at``.
    """
    pair = {invalidated.source_node_uuid, invalidated.target_node_uuid}
    others = [f for f in candidates if f.uuid != invalidated.uuid]
    same_pair = [f for f in others if {f.source_node_uuid, f.target_node_uuid} == pair]
    if same_pair:
        dated = [f for f in same_pair if same_instant(f.valid_at, invalidated.invalid_at)]
        return (dated or same_pair)[0].uuid
    shared = [f for f in others
              if pair & {f.source_node_uuid, f.target_node_uuid} and same_instant(f.valid_at, invalidated.invalid_at)]
    return shared[0].uuid if len(shared) == 1 else None
