"""services/extractor/told_later.py: a change told later but dated earlier ends the fact it
contradicts (graphiti's date rule alone ended the new fact); everything else is graphiti's rule."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from graphiti_core.edges import EntityEdge
from graphiti_core.utils.maintenance import edge_operations

from engram.services.extractor.told_later import telling

SAID = datetime(2026, 3, 2, 10, 0, tzinfo=timezone.utc)  # "Maya lives in Lisbon" (dated when said)
TOLD = SAID + timedelta(days=7)  # "Maya moved to Porto last month"
LAST_MONTH = datetime(2026, 2, 1, tzinfo=timezone.utc)


def edge(fact: str, valid_at: datetime, invalid_at: datetime | None = None) -> EntityEdge:
    return EntityEdge(group_id="g", source_node_uuid="a", target_node_uuid="b", name="LIVES_IN", fact=fact,
                      episodes=[], created_at=TOLD, valid_at=valid_at, invalid_at=invalid_at)


def rule(new: EntityEdge, candidates: list[EntityEdge]) -> list[EntityEdge]:
    return edge_operations._apply_temporal_invalidation(new, candidates)  # what resolve_extracted_edges calls


def test_a_change_told_later_but_dated_earlier_ends_the_fact_in_force() -> None:
    lisbon, porto = edge("Maya lives in Lisbon.", SAID), edge("Maya moved to Porto last month.", LAST_MONTH)
    with telling(TOLD):
        ended = rule(porto, [lisbon])
    assert ended == [lisbon]
    assert lisbon.invalid_at == TOLD and lisbon.expired_at is not None  # ended when the move was told
    assert porto.invalid_at is None and porto.expired_at is None and porto.valid_at == LAST_MONTH


def test_graphitis_rule_everywhere_else() -> None:
    # no episode being told (graphiti's own add_episode): the new fact is ended, as graphiti does
    lisbon, porto = edge("Maya lives in Lisbon.", SAID), edge("Maya moved to Porto last month.", LAST_MONTH)
    assert rule(porto, [lisbon]) == []
    assert porto.invalid_at == SAID and lisbon.invalid_at is None
    # a history ingested out of order: the contradicted fact starts after the episode was told
    later, old = edge("Maya lives in Lisbon.", TOLD + timedelta(days=30)), edge("Maya lives in Porto.", LAST_MONTH)
    with telling(TOLD):
        assert rule(old, [later]) == []
    assert old.invalid_at == later.valid_at and later.invalid_at is None
    # the usual order: the older fact is ended at the new fact's start
    lisbon, porto = edge("Maya lives in Lisbon.", SAID), edge("Maya moved to Porto.", TOLD)
    with telling(TOLD):
        assert rule(porto, [lisbon]) == [lisbon]
    assert lisbon.invalid_at == TOLD and porto.invalid_at is None
    # a contradicted fact that already ended is left to graphiti's rule
    ended_before = edge("Maya lived in Lisbon.", SAID, invalid_at=SAID + timedelta(days=1))
    porto = edge("Maya moved to Porto last month.", LAST_MONTH)
    with telling(TOLD):
        rule(porto, [ended_before])
    assert ended_before.invalid_at == SAID + timedelta(days=1)
