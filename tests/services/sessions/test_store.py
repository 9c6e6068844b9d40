"""services/sessions/store.py against a real FalkorDB (and a real Neo4j 5 where one is reachable:
testcontainers or ENGRAM_TEST_NEO4J_URI, see tests/services/extractor/test_neo4j.py; skipped
otherwise): session claims and records, preference history (the latest value wins, earlier
values stay queryable, remove), note dedupe, groups kept apart."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone

import pytest

from engram.graph.drivers import GraphDrivers, query_rows
from engram.settings import EngramSettings
from engram.schemas.memory import SessionRecord
from engram.services.sessions.store import MemoryStore, normal_note, session_uuid
from tests.services.extractor.test_neo4j import neo4j_target  # noqa: F401 - the Neo4j fixture

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=timezone.utc)


def new_group(prefix: str = "engram_user_st") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


@pytest.fixture(params=["falkordb", "neo4j"])
async def store(request, tmp_path) -> AsyncIterator[MemoryStore]:  # noqa: ANN001
    if request.param == "neo4j":
        target = request.getfixturevalue("neo4j_target")  # skips where no Neo4j can be reached
        settings = EngramSettings(graph_backend="neo4j", neo4j_uri=target.uri, neo4j_user=target.user,
                                  neo4j_password=target.password, neo4j_database=target.database, data_dir=tmp_path)
    else:
        settings = EngramSettings(graph_url=request.getfixturevalue("falkordb_server").url, data_dir=tmp_path)
    graphs = GraphDrivers(settings)
    yield MemoryStore(graphs)
    await graphs.close()


def record(segment: int, closed_at: datetime, summary: str = "s") -> SessionRecord:
    return SessionRecord(session_id="s1", segment=segment, segment_id=f"s1-0-{segment}", summary=summary,
                         summary_source="llm", close_reason="token_limit", token_count=30_000, message_count=40,
                         opened_at=closed_at - timedelta(hours=1), closed_at=closed_at, language="en")


async def test_readers_of_an_unknown_group_create_no_graph(store: MemoryStore) -> None:
    group = new_group()
    assert await store.last_sessions(group, 3) == []
    assert await store.preferences(group, include_history=True) == []
    assert await store.notes(group) == []
    assert await store.remove_preference(group, "language") is None
    assert await store.delete_note(group, "x") is False
    if store.graphs.settings.graph_backend == "falkordb":  # Neo4j: one database, no graph per group
        assert not await store.graphs.exists(group, max_age_s=0)


async def test_last_sessions_newest_first_and_only_closed(store: MemoryStore) -> None:
    group = new_group()
    for seg, hours in ((0, 0), (2, 2), (1, 1)):
        assert await store.save_session(group, record(seg, T0 + timedelta(hours=hours), f"summary {seg}"))
    claim = await store.claim_session(group, session_id="s1", segment=3, segment_id="s1-0-3", lease_s=60)
    assert claim.outcome == "claimed"  # claimed, not closed: not listed
    got = await store.last_sessions(group, 2)
    assert [(r.segment, r.summary) for r in got] == [(2, "summary 2"), (1, "summary 1")]
    assert got[0] == record(2, T0 + timedelta(hours=2), "summary 2")
    # the first close wins: a second save of a closed segment changes nothing
    assert not await store.save_session(group, record(2, T0 + timedelta(hours=2), "other"))
    assert (await store.last_sessions(group, 1))[0].summary == "summary 2"


async def test_claims_closed_busy_and_a_lease_that_ran_out(store: MemoryStore) -> None:
    group = new_group()
    args = dict(session_id="s1", segment=0, segment_id="s1-0-0", lease_s=60)
    first = await store.claim_session(group, now=T0, **args)
    assert first.outcome == "claimed"
    other = await store.claim_session(group, now=T0 + timedelta(seconds=30), **args)
    assert other.outcome == "busy" and other.claimed_at == T0
    again = await store.claim_session(group, token=first.token, now=T0 + timedelta(seconds=30), **args)
    assert again.outcome == "claimed"  # the holder itself
    late = await store.claim_session(group, now=T0 + timedelta(seconds=200), **args)
    assert late.outcome == "claimed"  # the first holder's lease ran out
    # the first holder may no longer write over the new one
    assert not await store.save_session(group, record(0, T0), token=first.token)
    assert await store.save_session(group, record(0, T0), token=late.token)
    assert (await store.claim_session(group, **args)).outcome == "closed"
    rows = await query_rows(await store.graphs.driver(group),
                            "MATCH (s:EngramSession) WHERE s.group_id = $g RETURN s.uuid AS u", g=group)
    assert [r["u"] for r in rows] == [session_uuid(group, "s1-0-0")]


async def test_a_renewed_claim_is_not_taken_over(store: MemoryStore) -> None:
    group = new_group()
    args = dict(session_id="s1", segment=0, segment_id="s1-0-0", lease_s=60)
    first = await store.claim_session(group, now=T0, **args)
    assert await store.renew_claim(group, "s1-0-0", first.token, now=T0 + timedelta(seconds=50))
    assert (await store.claim_session(group, now=T0 + timedelta(seconds=90), **args)).outcome == "busy"
    late = await store.claim_session(group, now=T0 + timedelta(seconds=111), **args)
    assert late.outcome == "claimed"  # not renewed again: its lease ran out
    assert not await store.renew_claim(group, "s1-0-0", first.token)  # the old holder lost it


async def test_concurrent_claims_give_exactly_one_claim(store: MemoryStore) -> None:
    group = new_group()
    claims = await asyncio.gather(*(
        store.claim_session(group, session_id="s1", segment=0, segment_id="s1-0-0", lease_s=60) for _ in range(8)
    ))
    assert sorted(c.outcome for c in claims) == ["busy"] * 7 + ["claimed"]


async def test_released_claim_can_be_taken_at_once(store: MemoryStore) -> None:
    group = new_group()
    args = dict(session_id="s1", segment=0, segment_id="s1-0-0", lease_s=600)
    first = await store.claim_session(group, **args)
    await store.release_session(group, "s1-0-0", first.token)
    assert (await store.claim_session(group, **args)).outcome == "claimed"


async def test_preference_history_latest_wins_earlier_values_queryable(store: MemoryStore) -> None:
    group = new_group()
    await store.set_preference(group, "Language", "English", source="conversation", at=T0)
    await store.set_preference(group, "theme", "dark", source="extraction", session_id="s1", at=T0)
    latest = await store.set_preference(group, "language ", "Türkçe", source="extraction", at=T0 + timedelta(hours=1))
    assert (latest.key, latest.value, latest.current, latest.source) == ("language", "Türkçe", True, "extraction")
    current = await store.preferences(group)
    assert [(p.key, p.value) for p in current] == [("language", "Türkçe"), ("theme", "dark")]
    history = await store.preferences(group, include_history=True)
    assert [(p.key, p.value, p.current, p.ended_by) for p in history] == [
        ("language", "Türkçe", True, None),
        ("language", "English", False, "replaced"),
        ("theme", "dark", True, None),
    ]
    assert history[1].ended_at == T0 + timedelta(hours=1) and history[1].set_at == T0
    assert history[2].session_id == "s1"


async def test_setting_the_same_value_again_changes_nothing(store: MemoryStore) -> None:
    group = new_group()
    first = await store.set_preference(group, "theme", "dark", source="conversation", at=T0)
    again = await store.set_preference(group, "theme", "dark", source="extraction", at=T0 + timedelta(hours=1))
    assert again == first
    assert len(await store.preferences(group, include_history=True)) == 1


async def test_remove_preference_keeps_it_in_the_history(store: MemoryStore) -> None:
    group = new_group()
    await store.set_preference(group, "theme", "dark", source="conversation", at=T0)
    removed = await store.remove_preference(group, "Theme", at=T0 + timedelta(minutes=5))
    assert removed is not None and (removed.current, removed.ended_by) == (False, "removed")
    assert await store.preferences(group) == []
    assert await store.remove_preference(group, "theme") is None
    [old] = await store.preferences(group, include_history=True)
    assert (old.value, old.ended_by, old.ended_at) == ("dark", "removed", T0 + timedelta(minutes=5))
    # setting it again after a remove starts a new current value
    await store.set_preference(group, "theme", "dark", source="conversation", at=T0 + timedelta(hours=1))
    assert [(p.value, p.current) for p in await store.preferences(group, include_history=True)] == [
        ("dark", True), ("dark", False)]


async def test_concurrent_sets_of_one_key_leave_one_current_value(store: MemoryStore) -> None:
    group = new_group()
    await asyncio.gather(*(store.set_preference(group, "editor", f"v{i}", source="conversation") for i in range(6)))
    current = await store.preferences(group)
    assert len(current) == 1
    assert len(await store.preferences(group, include_history=True)) == 6


async def test_equal_notes_are_stored_once_and_notes_list_newest_first(store: MemoryStore) -> None:
    group = new_group()
    first = await store.add_note(group, "Works on a Django project.", source="conversation", at=T0)
    dup = await store.add_note(group, "  works on a django   project ", source="extraction",
                               at=T0 + timedelta(hours=1))
    assert dup == first and dup.source == "conversation"
    second = await store.add_note(group, "Yazılım mühendisi.", source="extraction", session_id="s1",
                                  at=T0 + timedelta(hours=2))
    assert [n.text for n in await store.notes(group)] == ["Yazılım mühendisi.", "Works on a Django project."]
    assert [n.uuid for n in await store.notes(group, limit=1)] == [second.uuid]
    assert await store.delete_note(group, first.uuid)
    assert not await store.delete_note(group, first.uuid)
    assert [n.text for n in await store.notes(group)] == ["Yazılım mühendisi."]
    assert normal_note("Yazılım Mühendisi!") == "yazılım mühendisi"


async def test_groups_are_kept_apart(store: MemoryStore) -> None:
    a, b = new_group(), new_group()
    await store.set_preference(a, "theme", "dark", source="conversation")
    await store.add_note(a, "note", source="conversation")
    await store.save_session(a, record(0, T0))
    assert await store.preferences(b) == [] and await store.notes(b) == [] and await store.last_sessions(b) == []


async def test_activity_log_is_newest_first_deduped_by_id_and_bounded(store: MemoryStore) -> None:
    group = new_group()
    store.activities_kept = 3
    first = await store.log_activity(group, "RAG search:  Python tutorials", kind="search", source="conversation",
                                     occurred_at=T0, activity_id="req-1")
    assert first.text == "RAG search: Python tutorials" and first.kind == "search" and first.occurred_at == T0
    retried = await store.log_activity(group, "RAG search: Python tutorials", kind="search", source="conversation",
                                       occurred_at=T0 + timedelta(seconds=5), activity_id="req-1")
    assert retried == first  # the retried request is logged once, the first entry unchanged
    # Without an id, the same entry (kind, text, session, time) is logged once; another time is another entry.
    for minutes in (1, 1, 2, 3):
        await store.log_activity(group, "opened the Django docs", kind="visit", source="conversation",
                                 occurred_at=T0 + timedelta(minutes=minutes))
    listed = await store.activities(group)
    # 4 distinct entries were logged, 3 are kept: the oldest (the search at T0) was deleted.
    assert [(a.kind, a.occurred_at) for a in listed] == [
        ("visit", T0 + timedelta(minutes=3)), ("visit", T0 + timedelta(minutes=2)), ("visit", T0 + timedelta(minutes=1))]
    assert [a.kind for a in await store.activities(group, kind="search")] == []
    assert len(await store.activities(group, limit=2)) == 2
    assert await store.delete_activity(group, listed[0].uuid)
    assert not await store.delete_activity(group, listed[0].uuid)
    assert not await store.delete_activity(new_group(), listed[1].uuid)  # another group's uuid is not found
    assert [a.uuid for a in await store.activities(group)] == [listed[1].uuid, listed[2].uuid]
    assert await store.activities(new_group()) == []  # reading an unknown group creates nothing


async def test_favorites_are_stored_once_per_kind_and_item_newest_first(store: MemoryStore) -> None:
    group = new_group()
    doc = await store.add_favorite(group, "Django ORM  cheatsheet", kind="doc", source="conversation", at=T0)
    again = await store.add_favorite(group, "django orm cheatsheet!", kind="doc", source="extraction",
                                     at=T0 + timedelta(hours=1))
    assert again == doc  # case, spacing and punctuation aside: the stored one, unchanged
    repo = await store.add_favorite(group, "Django ORM cheatsheet", kind="repo", source="conversation",
                                    at=T0 + timedelta(hours=2))
    assert repo.uuid != doc.uuid  # another kind is another favorite
    assert [f.uuid for f in await store.favorites(group)] == [repo.uuid, doc.uuid]
    assert await store.remove_favorite(group, doc.uuid)
    assert not await store.remove_favorite(group, doc.uuid)
    assert [f.item for f in await store.favorites(group)] == ["Django ORM cheatsheet"]
    assert await store.favorites(new_group()) == []
