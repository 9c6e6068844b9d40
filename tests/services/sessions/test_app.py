"""The sessions service's close stage end to end on real NATS JetStream and FalkorDB: a
SessionSegmentClosed published on engram.session.closed.<session> becomes an EngramSession, the
user's preferences and notes in the memory group. One named test per row of seed 004's error
table (section 7) -- except "a closed session id sent again starts a new segment", which is the
turn-detector's (tests/services/turn_detector) -- with the rules model or a failing double as
the LLM (a hosted LLM cannot run here)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import nats
from nats.js import JetStreamContext
from prometheus_client import REGISTRY

from engram.graph.drivers import query_rows
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.runtime.topology import Topology
from engram.schemas import subjects
from engram.schemas.memory import EMPTY_SUMMARY, FALLBACK_SUMMARY, SessionSegmentClosed
from engram.services.sessions import app as sessions_app
from engram.services.sessions.store import MemoryStore
from tests.services.sessions.helpers import ENGLISH, T0, TOOL_ONLY, TURKISH, CountingLLM, segment
from tests.services.turn_detector.helpers import read_all, wait_for


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@dataclass
class Harness:
    apps: list
    js: JetStreamContext
    store: MemoryStore
    settings: EngramSettings

    def group(self, event: SessionSegmentClosed) -> str:
        return self.apps[0].sessions.group_of(event)

    async def publish(self, event: SessionSegmentClosed | bytes, msg_id: str | None = None,
                      session: str = "s") -> None:
        data = event if isinstance(event, bytes) else event.model_dump_json().encode()
        sid = session if isinstance(event, bytes) else event.session_id
        mid = msg_id or (f"raw-{hash(data)}" if isinstance(event, bytes) else event.segment_id)
        await self.js.publish(subjects.session_closed(sid), data, headers={subjects.HDR_MSG_ID: mid},
                              stream=subjects.STREAM_SESSIONS)

    async def drained(self) -> bool:
        info = await self.js.consumer_info(subjects.STREAM_SESSIONS, Topology.SESSIONS_DURABLE)
        return info.num_pending == 0 and info.num_ack_pending == 0

    async def closed(self, event: SessionSegmentClosed, timeout: float = 20.0):  # noqa: ANN201
        group = self.group(event)

        async def done():  # noqa: ANN202
            records = [r for r in await self.store.last_sessions(group, 50) if r.segment_id == event.segment_id]
            return records and await self.drained() and records[0]

        record = await wait_for(done, timeout=timeout)
        assert record, f"segment {event.segment_id} was not closed"
        return record


@contextlib.asynccontextmanager
async def service(nats_url: str, graph_url: str, tmp_path: Path, llm: CountingLLM, *, replicas: int = 1,
                  busy_retry_s: float = 0.5) -> AsyncIterator[Harness]:
    settings = EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp_path,
                              turn=TurnDetectorSettings(max_deliveries=2))
    apps = [sessions_app.build(settings, llm=llm, busy_retry_s=busy_retry_s) for _ in range(replicas)]
    for app in apps:
        await app.start()
    nc = await nats.connect(nats_url)
    try:
        yield Harness(apps, nc.jetstream(), apps[0].sessions.store, settings)
    finally:
        await nc.close()
        for app in apps:
            await app.stop()


async def test_a_published_segment_closes_into_the_users_group(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    llm = CountingLLM()
    closed_before = sample("engram_sessions_closed_total", reason="token_limit")
    calls_before = sample("engram_llm_calls_total", stage="sessions", prompt="sessions.summary")
    async with service(clean_nats, falkordb_server.url, tmp_path, llm) as h:
        event = segment("e2e1", ENGLISH, user="alice@example.com")
        await h.publish(event)
        record = await h.closed(event)
        group = h.group(event)
        assert group == subjects.user_group("engram", "alice@example.com")
        assert (record.summary_source, record.close_reason, record.token_count, record.language) == (
            "rules", "token_limit", 30_000, "en")
        assert record.summary.split("\n")[1].startswith("- TOPICS: ") and "- DECISIONS: " in record.summary
        prefs = {(p.key, p.value, p.source, p.session_id) for p in await h.store.preferences(group)}
        assert ("favorite_editor", "Neovim", "extraction", "e2e1") in prefs
        assert ("language", "English", "extraction", "e2e1") in prefs
        notes = await h.store.notes(group)
        assert {n.source for n in notes} == {"extraction"}
        assert "The user's favourite editor is Neovim." in [n.text for n in notes]
        # nothing in the session's own group: the user scope is the memory group
        assert not await h.store.graphs.exists(subjects.session_group("engram", "e2e1"), max_age_s=0)
    assert llm.by_prompt == {"sessions.summary": 1, "sessions.facts": 1}
    assert sample("engram_sessions_closed_total", reason="token_limit") == closed_before + 1
    assert sample("engram_llm_calls_total", stage="sessions", prompt="sessions.summary") == calls_before + 1


async def test_summary_failure_uses_fallback_text(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    fallback_before = sample("engram_sessions_close_steps_total", step="summary", outcome="fallback")
    async with service(clean_nats, falkordb_server.url, tmp_path, CountingLLM(fail=("sessions.summary",))) as h:
        event = segment("sumfail", ENGLISH, user="bob")
        await h.publish(event)
        record = await h.closed(event)
        assert record.summary == FALLBACK_SUMMARY.format(reason="token limit") == (
            "Session closed due to token limit (summary unavailable).")
        assert record.summary_source == "fallback"
        # the facts step was not blocked by the failed summary
        assert await h.store.preferences(h.group(event))
    assert sample("engram_sessions_close_steps_total", step="summary", outcome="fallback") == fallback_before + 1


async def test_facts_failure_session_still_closes(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    failed_before = sample("engram_sessions_close_steps_total", step="facts", outcome="failed")
    async with service(clean_nats, falkordb_server.url, tmp_path, CountingLLM(fail=("sessions.facts",))) as h:
        event = segment("factfail", ENGLISH, user="carol")
        await h.publish(event)
        record = await h.closed(event)
        assert record.summary_source == "rules" and "- TOPICS: " in record.summary
        group = h.group(event)
        assert await h.store.preferences(group, include_history=True) == [] and await h.store.notes(group) == []
    assert sample("engram_sessions_close_steps_total", step="facts", outcome="failed") == failed_before + 1


async def test_invalid_json_facts_gives_no_facts(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    invalid_before = sample("engram_sessions_close_steps_total", step="facts", outcome="invalid")
    async with service(clean_nats, falkordb_server.url, tmp_path, CountingLLM(garbage=("sessions.facts",))) as h:
        event = segment("factjson", ENGLISH, user="dave")
        await h.publish(event)
        record = await h.closed(event)
        assert record.summary_source == "rules"
        group = h.group(event)
        assert await h.store.preferences(group, include_history=True) == [] and await h.store.notes(group) == []
    assert sample("engram_sessions_close_steps_total", step="facts", outcome="invalid") == invalid_before + 1


async def test_empty_or_tool_only_conversation_makes_no_llm_call(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    llm = CountingLLM()
    async with service(clean_nats, falkordb_server.url, tmp_path, llm) as h:
        tool_only = segment("toolonly", TOOL_ONLY, user="erin", reason="idle")
        empty = segment("toolonly", [], segment=1, user="erin", reason="explicit")
        await h.publish(tool_only)
        await h.publish(empty)
        first, second = await h.closed(tool_only), await h.closed(empty)
        assert (first.summary, first.summary_source) == (EMPTY_SUMMARY.format(reason="inactivity"), "empty")
        assert (second.summary, second.summary_source) == (EMPTY_SUMMARY.format(reason="an explicit close"), "empty")
    assert llm.by_prompt == {}


async def test_two_concurrent_closes_make_one_summary(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """Two replicas get the same segment at once (published twice under different ids, as a
    re-publish outside the dedupe window would be): one claims it and calls the LLM, the other
    finds it claimed, backs off, and on redelivery finds it closed."""
    gate = asyncio.Event()
    llm = CountingLLM(gate=gate)
    busy_before = sample("engram_sessions_close_messages_total", outcome="busy")
    duplicate_before = sample("engram_sessions_close_messages_total", outcome="duplicate")
    async with service(clean_nats, falkordb_server.url, tmp_path, llm, replicas=2) as h:
        event = segment("twice", ENGLISH, user="frank")
        await h.publish(event, msg_id="first")
        await h.publish(event, msg_id="second")

        async def second_backed_off() -> bool:
            return (llm.by_prompt.get("sessions.summary") == 1
                    and sample("engram_sessions_close_messages_total", outcome="busy") > busy_before)

        assert await wait_for(second_backed_off), (llm.by_prompt, "no busy back-off seen")
        gate.set()
        await h.closed(event)
        await wait_for(lambda: _async(sample("engram_sessions_close_messages_total", outcome="duplicate")
                                      > duplicate_before))
        assert await wait_for(h.drained)
        rows = await query_rows(await h.store.graphs.driver(h.group(event)), "MATCH (s:EngramSession) RETURN s.uuid AS u")
        assert len(rows) == 1
    assert llm.by_prompt == {"sessions.summary": 1, "sessions.facts": 1}


async def _async(value: bool) -> bool:
    return value


async def test_previous_summaries_are_chained_and_turkish_stays_turkish(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    llm = CountingLLM()
    async with service(clean_nats, falkordb_server.url, tmp_path, llm) as h:
        # an earlier session of the same user with nothing to summarise: its text is no context
        empty = segment("turkce-tools", TOOL_ONLY, user="ayse").model_copy(update={"closed_at": T0})
        await h.publish(empty)
        await h.closed(empty)
        first = segment("turkce", TURKISH, user="ayse")
        await h.publish(first)
        one = await h.closed(first)
        assert one.language == "tr" and "Kullanıcı şunu söyledi" in one.summary
        second = segment("turkce", TURKISH[:2], segment=1, user="ayse")
        await h.publish(second)
        await h.closed(second)
        summary_prompts = [text for name, text in llm.prompts if name == "sessions.summary"]
        assert '<PREVIOUS_SUMMARIES>\n[]' in summary_prompts[0]
        assert json.dumps([one.summary], ensure_ascii=False) in summary_prompts[1]
        group = h.group(first)
        assert [(r.session_id, r.segment) for r in await h.store.last_sessions(group, 5)] == [
            ("turkce", 1), ("turkce", 0), ("turkce-tools", 0)]
        notes = [n.text for n in await h.store.notes(group)]
        assert "Ben yazılım mühendisiyim ve Django projesi üzerinde çalışıyorum." in notes
        assert {(p.key, p.value) for p in await h.store.preferences(group)} >= {("language", "Türkçe")}


async def test_a_segment_published_again_after_its_close_makes_no_llm_call(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    llm = CountingLLM()
    async with service(clean_nats, falkordb_server.url, tmp_path, llm) as h:
        event = segment("again", ENGLISH, user="gina")
        await h.publish(event)
        record = await h.closed(event)
        await h.publish(event, msg_id="again-later")  # outside the dedupe window, say
        await asyncio.sleep(0.5)
        assert await wait_for(h.drained)
        assert (await h.closed(event)) == record
    assert llm.by_prompt == {"sessions.summary": 1, "sessions.facts": 1}


async def test_a_bad_payload_is_dead_lettered(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    async with service(clean_nats, falkordb_server.url, tmp_path, CountingLLM()) as h:
        await h.publish(b'{"session_id": "bad", "segment": -1}', session="bad")
        letters = await wait_for(lambda: read_all(h.js, subjects.STREAM_DLQ, subjects.dlq("sessions"), settle=0.1))
        assert letters and letters[0].headers[subjects.HDR_DLQ_REASON] == "schema"
        assert "segment" in letters[0].headers[subjects.HDR_DLQ_DETAIL]
        assert await wait_for(h.drained)


async def test_a_close_that_fails_to_store_is_retried_at_once_and_stores_facts_once(
        clean_nats, falkordb_server, tmp_path, monkeypatch) -> None:  # noqa: ANN001
    """The graph refuses the record once: the claim is given back, the redelivery (after the
    retry delay, not the 300 s lease) closes the segment, and the facts stored by the first try
    are not stored twice."""
    real = MemoryStore.save_session
    failures = []

    async def flaky(self, group, record, **kw):  # noqa: ANN001, ANN003, ANN202
        if not failures:
            failures.append(record.segment_id)
            raise ConnectionError("graph down")
        return await real(self, group, record, **kw)

    monkeypatch.setattr(MemoryStore, "save_session", flaky)
    llm = CountingLLM()
    async with service(clean_nats, falkordb_server.url, tmp_path, llm) as h:
        event = segment("retry", ENGLISH, user="hana")
        await h.publish(event)
        record = await h.closed(event, timeout=15)
        assert failures == [event.segment_id] and record.summary_source == "rules"
        group = h.group(event)
        history = await h.store.preferences(group, include_history=True)
        assert len(history) == len({p.key for p in history}) == 4  # each preference once, none replaced
        notes = await h.store.notes(group)
        assert len(notes) == len({n.text for n in notes}) == 2
    assert llm.by_prompt == {"sessions.summary": 2, "sessions.facts": 2}  # the steps ran again


async def test_a_close_that_outlasts_the_lease_keeps_its_claim(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """A slow LLM holds a close for three leases: the worker renews its claim, so the other
    replica keeps backing off instead of taking the segment over (one summary call)."""
    gate = asyncio.Event()
    llm = CountingLLM(gate=gate)
    async with service(clean_nats, falkordb_server.url, tmp_path, llm, replicas=2, busy_retry_s=0.2) as h:
        for app in h.apps:
            app.sessions.lease_s = 0.6  # the durable's ack wait (300 s) in the service
        event = segment("slow", ENGLISH, user="ivan")
        await h.publish(event, msg_id="first")
        await h.publish(event, msg_id="second")
        assert await wait_for(lambda: _async(llm.by_prompt.get("sessions.summary") == 1))
        await asyncio.sleep(1.8)
        assert llm.by_prompt.get("sessions.summary") == 1, "the claim was taken over while its worker lived"
        gate.set()
        await h.closed(event)
        assert await wait_for(h.drained)
    assert llm.by_prompt == {"sessions.summary": 1, "sessions.facts": 1}


async def test_a_segment_waits_for_its_sessions_previous_segment_to_chain_its_summary(
        clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """Closes run concurrently; the next segment of a session being closed waits for it, so its
    summary chains the previous one (not a race lost under load)."""
    gate = asyncio.Event()
    llm = CountingLLM(gate=gate)
    waits_before = sample("engram_sessions_previous_segment_waits_total")
    async with service(clean_nats, falkordb_server.url, tmp_path, llm, busy_retry_s=0.5) as h:
        first = segment("chain", ENGLISH, user="bea")
        await h.publish(first)
        assert await wait_for(lambda: asyncio.sleep(0, llm.by_prompt.get("sessions.summary")), timeout=20)
        second = segment("chain", ENGLISH[:2], segment=1, user="bea")
        await h.publish(second)
        assert await wait_for(lambda: asyncio.sleep(
            0, sample("engram_sessions_previous_segment_waits_total") > waits_before), timeout=20)
        # the first close is held: the second made no LLM call yet
        assert llm.by_prompt == {"sessions.summary": 1, "sessions.facts": 1}
        gate.set()
        one = await h.closed(first)
        await h.closed(second)
        summary_prompts = [text for name, text in llm.prompts if name == "sessions.summary"]
        assert len(summary_prompts) == 2 and json.dumps([one.summary], ensure_ascii=False) in summary_prompts[1]


async def test_a_segment_whose_previous_one_is_not_picked_up_yet_waits_once(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """Two slots may pull segments 0 and 1 at once: 1 finds no record of 0 yet. Its first delivery
    waits (0 is about to be claimed); a later one goes on (0 may live in another group, or be lost)."""
    llm = CountingLLM()
    async with service(clean_nats, falkordb_server.url, tmp_path, llm) as h:
        second = segment("early", ENGLISH[:2], segment=1, user="cem")
        sessions = h.apps[0].sessions
        outcome = await sessions.close(second, first_delivery=True)
        assert isinstance(outcome, sessions_app.Busy) and llm.by_prompt == {}
        assert await sessions.close(second, first_delivery=False) == "closed"
