"""NodeDeltas from an extraction result (services/extractor/deltas.py). Pure: no DB, no LLM."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from graphiti_core.edges import EntityEdge
from graphiti_core.nodes import EntityNode

from engram.schemas import Episode, EpisodeMessage, NodeDelta
from engram.schemas.messages import MESSAGE_ID_PATTERN
from engram.services.extractor.deltas import (
    NEGATION_CUES,
    build_node_deltas,
    delta_message_id,
    has_negation_cue,
    infer_invalidated_by,
)
from engram.services.extractor.pipeline import ExtractionResult

T0 = datetime(2024, 5, 1, 10, 0, tzinfo=timezone.utc)
T1 = T0 + timedelta(days=1)
GROUP = "g_deltas"


def episode(episode_id: str = "ep-2", at: datetime = T1) -> Episode:
    return Episode(
        episode_id=episode_id,
        group_id=GROUP,
        scope="session",
        turn_id="s1:m1",
        session_id="s1",
        reference_time=at,
        content="user(Alice): I quit Microsoft and work at Google now.",
        messages=[EpisodeMessage(message_id="m1", role="user", name="Alice", timestamp=at)],
    )


def node(uuid: str, name: str) -> EntityNode:
    return EntityNode(uuid=uuid, name=name, group_id=GROUP, labels=["Entity"], summary="", created_at=T0)


def edge(uuid: str, src: str, dst: str, fact: str, valid_at: datetime | None = T1, **kw) -> EntityEdge:
    return EntityEdge(
        uuid=uuid,
        source_node_uuid=src,
        target_node_uuid=dst,
        name="RELATES_TO",
        fact=fact,
        group_id=GROUP,
        episodes=["ep-2"],
        created_at=T1,
        valid_at=valid_at,
        fact_embedding=[0.5, 0.5],
        **kw,
    )


ALICE, MSFT = node("n-alice", "Alice"), node("n-msft", "Microsoft")
GOOGLE, BOB = node("n-google", "Google"), node("n-bob", "Bob")
OLD = edge("e-old", "n-alice", "n-msft", "Alice works at Microsoft.", valid_at=T0, invalid_at=T1, expired_at=T1)
NEW = edge("e-new", "n-alice", "n-google", "Alice works at Google.")


def result(**kw) -> ExtractionResult:
    base = dict(episode_id="ep-2", group_id=GROUP, nodes=[ALICE, GOOGLE])
    base.update(kw)
    return ExtractionResult(**base)


def by_name(deltas: list[NodeDelta]) -> dict[str, NodeDelta]:
    return {d.node_name: d for d in deltas}


def test_one_delta_per_mentioned_node_with_its_new_facts() -> None:
    extra = edge("e-bob", "n-bob", "n-google", "Bob works at Google.")
    res = result(nodes=[ALICE, GOOGLE, BOB], new_edges=[NEW, extra], resolved_edges=[NEW, extra])
    deltas = by_name(build_node_deltas(episode(), res))
    assert set(deltas) == {"Alice", "Google", "Bob"}
    assert [f.uuid for f in deltas["Alice"].new_facts] == ["e-new"]
    assert [f.uuid for f in deltas["Google"].new_facts] == ["e-new", "e-bob"]
    assert [f.uuid for f in deltas["Bob"].new_facts] == ["e-bob"]
    assert deltas["Alice"].new_facts[0].fact == "Alice works at Google."
    assert deltas["Alice"].new_facts[0].embedding == [0.5, 0.5]
    for d in deltas.values():
        assert (d.group_id, d.episode_id, d.episode_time) == (GROUP, "ep-2", T1)
        assert not d.invalidated_facts and not d.polarity_flip


def test_mentioned_node_without_facts_still_gets_an_empty_delta() -> None:
    deltas = by_name(build_node_deltas(episode(), result(nodes=[ALICE, BOB], new_edges=[])))
    assert set(deltas) == {"Alice", "Bob"}
    assert deltas["Bob"].new_facts == [] and deltas["Bob"].invalidated_facts == []


def test_reused_duplicate_edges_are_not_new_facts() -> None:
    dup = edge("e-dup", "n-alice", "n-google", "Alice likes Google.")
    deltas = by_name(build_node_deltas(episode(), result(resolved_edges=[NEW, dup], new_edges=[NEW])))
    assert [f.uuid for f in deltas["Alice"].new_facts] == ["e-new"]


def test_invalidation_uses_graphitis_mapping_and_reaches_unmentioned_endpoints() -> None:
    res = result(
        context_nodes=[MSFT],
        resolved_edges=[NEW],
        new_edges=[NEW],
        invalidated_edges=[OLD],
        invalidated_by={"e-old": ["e-new"]},
    )
    deltas = by_name(build_node_deltas(episode(), res))
    assert set(deltas) == {"Alice", "Google", "Microsoft"}
    for name in ("Alice", "Microsoft"):
        [inv] = deltas[name].invalidated_facts
        assert (inv.uuid, inv.fact, inv.invalidated_by) == ("e-old", "Alice works at Microsoft.", "e-new")
        assert deltas[name].polarity_flip
    assert deltas["Google"].invalidated_facts == [] and not deltas["Google"].polarity_flip


def test_invalidated_by_inferred_from_same_endpoints() -> None:
    quit_fact = edge("e-quit", "n-msft", "n-alice", "Alice left Microsoft.")
    res = result(nodes=[ALICE, MSFT], resolved_edges=[quit_fact], new_edges=[quit_fact], invalidated_edges=[OLD])
    [inv] = by_name(build_node_deltas(episode(), res))["Microsoft"].invalidated_facts
    assert inv.invalidated_by == "e-quit"


def test_invalidated_by_inferred_from_shared_endpoint_and_dates() -> None:
    # graphiti sets invalid_at of the invalidated edge to valid_at of the invalidating one
    assert infer_invalidated_by(OLD, [NEW]) == "e-new"
    other = edge("e-other", "n-alice", "n-bob", "Alice met Bob.")
    assert infer_invalidated_by(OLD, [NEW, other]) is None  # two candidates: undetermined
    assert infer_invalidated_by(OLD, [edge("e-later", "n-alice", "n-google", "x", valid_at=T1 + timedelta(hours=1))]) is None
    assert infer_invalidated_by(OLD, []) is None


def test_negation_cue_in_new_fact_flips_polarity_of_its_nodes() -> None:
    neg = edge("e-neg", "n-alice", "n-google", "Alice no longer uses Google Docs.")
    deltas = by_name(build_node_deltas(episode(), result(nodes=[ALICE, GOOGLE, BOB], new_edges=[neg])))
    assert deltas["Alice"].polarity_flip and deltas["Google"].polarity_flip
    assert not deltas["Bob"].polarity_flip
    assert deltas["Alice"].invalidated_facts == []


@pytest.mark.parametrize("cue", NEGATION_CUES)
def test_every_cue_is_detected(cue: str) -> None:
    assert has_negation_cue(f"Alice {cue} Berlin")
    assert has_negation_cue(f"ALICE {cue.upper()} BERLIN")


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Bob doesn\u2019t drink coffee", True),
        ("Alice switched from vim to emacs", True),
        ("Alice moved  away from Paris", True),
        ("Alice uses Python instead of Go", True),
        ("Alice took notes", False),
        ("Nothing changed for Alice", False),
        ("Alice quite likes tea", False),
        ("Alice knows Python", False),
        ("", False),
        (None, False),
    ],
)
def test_negation_cue_word_boundaries(text: str | None, expected: bool) -> None:
    assert has_negation_cue(text) is expected


def test_new_node_flag() -> None:
    deltas = by_name(build_node_deltas(episode(), result(new_node_uuids=["n-google"], new_edges=[NEW])))
    assert deltas["Google"].is_new_node and not deltas["Alice"].is_new_node


def test_deltas_are_sorted_and_unique() -> None:
    res = result(nodes=[GOOGLE, ALICE, GOOGLE], context_nodes=[ALICE, BOB])
    assert [d.node_name for d in build_node_deltas(episode(), res)] == ["Alice", "Bob", "Google"]


def test_delta_message_id_is_deterministic_and_valid() -> None:
    deltas = build_node_deltas(episode(), result(new_edges=[NEW]))
    again = build_node_deltas(episode(), result(new_edges=[NEW]))
    ids = [delta_message_id(d) for d in deltas]
    assert ids == [delta_message_id(d) for d in again]
    assert len(set(ids)) == len(ids) == 2
    assert all(re.fullmatch(MESSAGE_ID_PATTERN, i) for i in ids)
    assert ids[0] == "ep-2:n-alice"
    other_episode = build_node_deltas(episode("ep-3"), result(new_edges=[NEW]))
    assert not set(ids) & {delta_message_id(d) for d in other_episode}


def test_delta_message_id_falls_back_to_a_hash_for_odd_ids() -> None:
    odd = NodeDelta(group_id=GROUP, node_uuid="n with spaces", node_name="x", episode_id="e" * 250, episode_time=T1)
    mid = delta_message_id(odd)
    assert re.fullmatch(MESSAGE_ID_PATTERN, mid) and mid.startswith("delta-")
    assert mid == delta_message_id(odd.model_copy())
