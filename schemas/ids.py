"""Deterministic ids that several parts must compute alike.

An episode's id is a name-based UUID (v5) of its group and turn: the turn-detector names every
episode it emits with it, and ``engram promote`` names a promoted note the same way, so a
replayed turn or a repeated promotion lands on the same graph episode (idempotent writes).
"""

from __future__ import annotations

import uuid

EPISODE_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://engram.dev/episode")


def episode_id_for(group_id: str, turn_id: str) -> str:
    """The episode id of turn ``turn_id`` in group ``group_id`` (a UUID string, stable across runs)."""
    return str(uuid.uuid5(EPISODE_NAMESPACE, f"{group_id}/{turn_id}"))
