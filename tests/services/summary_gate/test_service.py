"""summary-gate service against real NATS JetStream and FalkorDB, fed by the real turn-detector
and extractor (rules LLM, hashing embedder): first summaries, contradictions and the guard,
deferred refreshes flushed by the server schedule, restarts, duplicates, counters, dead letters
and audits. The pure gate rules are tested in test_gate.py."""

from __future__ import annotations

import asyncio
import json
import typing


from engram.schemas import SummaryEvent, subjects
from engram.schemas.messages import SummaryReason
from engram.services.summary_gate.gate import GateSettings
from tests.services.summary_gate.helpers import EchoLLM, ParaphraseLLM, counter, group_of, mention, new_session, pipeline
from tests.services.turn_detector.helpers import read_all, wait_for

REASONS: tuple[str, ...] = typing.get_args(SummaryReason)


def decisions(events: list[SummaryEvent], name: str | None = None) -> list[tuple[str, str]]:
    return [(e.decision, e.reason) for e in events if name is None or e.node_name == name]


# --------------------------------------------------------------------------- 1. first summaries
async def test_new_entities_get_a_first_summary_and_gate_state(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgnew")
    group = group_of(session)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as p:
        await p.say(session, "I work at Microsoft and I use pytest.")
        await p.close(session)
        await p.settle()

        events = await p.events(group)
        assert {e.node_name for e in events} == {"Alice", "Microsoft", "pytest"}
        assert all((e.decision, e.reason) == ("refreshed", "new_entity") for e in events), events
        assert all(e.group_id == group and e.episode_id for e in events)
        # Alice has two facts, Microsoft and pytest one each: at most compose_max_facts (2), so
        # each summary is its facts, composed without an LLM call (batch_size 0)
        sizes = {e.node_name: e.batch_size for e in events}
        assert sizes == {"Alice": 0, "Microsoft": 0, "pytest": 0}, sizes
        assert p.refresh_calls() == 0

        alice = await p.node(group, "Alice")
        assert alice["summary"] == "Alice works at Microsoft and Alice uses pytest."
        for name in ("Alice", "Microsoft", "pytest"):
            node = await p.node(group, name)
            meta = node["gate"]
            assert meta is not None, f"{name}: no _graphiti_meta"
            assert json.loads(node["meta"])["v"] == 1
            assert meta.fact_hash and meta.summary_embedding and len(meta.summary_embedding) == 256
            assert meta.last_summary_ts is not None and meta.last_summary_ts.isoformat() == "2026-01-01T12:00:00+00:00"
            assert meta.pending is None and node["due"] is None
            assert len(meta.applied) == 1


async def test_an_entity_that_is_only_the_object_of_its_facts_is_summarised_from_them(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgobj")
    group = group_of(session)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as p:
        await p.say(session, "I work at Microsoft.")
        await p.close(session)
        await p.settle()
        [event] = [e for e in await p.events(group) if e.node_name == "Microsoft"]
        assert (event.decision, event.reason) == ("refreshed", "new_entity")
        assert event.active_facts == 1  # Alice -[WORKS_AT]-> Microsoft
        assert (await p.node(group, "Microsoft"))["summary"] == "Alice works at Microsoft."


# --------------------------------------------------------------------------- 2. contradictions
async def test_contradiction_refreshes_with_polarity_and_drops_the_old_fact(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgpol")
    group = group_of(session)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as p:
        await p.say(session, "I work at Microsoft.")
        await p.say(session, "I work at Google now.")  # completes the first turn
        await p.settle()
        assert (await p.node(group, "Alice"))["summary"] == "Alice works at Microsoft."

        await p.close(session)
        await p.settle()
        events = await p.events(group)
        assert decisions(events, "Alice") == [("refreshed", "new_entity"), ("refreshed", "polarity")]
        [polarity] = [e for e in events if e.reason == "polarity" and e.node_name == "Alice"]
        assert polarity.active_facts == 1
        # the extractor really invalidated the old fact (so the gate saw a contradiction, not a guess)
        invalid = await p.query(group, "MATCH ()-[e:RELATES_TO]->() WHERE e.invalid_at IS NOT NULL RETURN e.fact AS f")
        assert [r["f"] for r in invalid] == ["Alice works at Microsoft."]

        summary = (await p.node(group, "Alice"))["summary"]
        assert "Alice works at Google now." in summary
        assert "microsoft" not in summary.lower()


async def test_guard_replaces_a_summary_that_repeats_an_invalidated_fact(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgguard")
    group = group_of(session)
    llm = EchoLLM()
    guarded = counter("engram_summary_guarded_total", cause="invalidated_fact")
    # compose_max_facts=0: every refresh asks the (misbehaving) LLM, even for one-fact nodes
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate_llm=llm,
                        gate=GateSettings(compose_max_facts=0)) as p:
        await p.say(session, "I work at Microsoft.")
        await p.say(session, "I work at Google now.")
        await p.settle()
        assert (await p.node(group, "Alice"))["summary"] == "Alice works at Microsoft."
        assert counter("engram_summary_guarded_total", cause="invalidated_fact") == guarded
        answered = len(llm.answers)

        await p.close(session)
        await p.settle()
        events = await p.events(group)
        assert decisions(events, "Alice")[-1] == ("refreshed", "polarity")
        # the model did repeat the retracted fact ...
        assert any("Alice works at Microsoft." in s["summary"] for a in llm.answers[answered:] for s in a["summaries"])
        # ... and the stored summary is the facts-only one
        assert (await p.node(group, "Alice"))["summary"] == "Alice works at Google now."
        assert counter("engram_summary_guarded_total", cause="invalidated_fact") >= guarded + 1


async def test_guard_replaces_a_summary_that_restates_an_invalidated_fact_in_other_words(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """Issue 10, item 5: the summariser restates the retracted fact in other words ("Alice is
    employed by Microsoft." after "Alice works at Microsoft." was invalidated): no verbatim
    match, caught by meaning (default hashing embedder); the same rewording of the NEW fact alone
    is kept."""
    for restate in (True, False):
        session = new_session("sgpara")
        group = group_of(session)
        llm = ParaphraseLLM(restate=restate)
        before = counter("engram_summary_guarded_total", cause="invalidated_paraphrase")
        async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate_llm=llm,
                            gate=GateSettings(compose_max_facts=0)) as p:
            await p.say(session, "I work at Microsoft.")
            await p.say(session, "I work at Google now.")
            await p.settle()
            first = len(llm.answers)  # Alice's first summary: Microsoft was true then
            await p.close(session)
            await p.settle()
            assert decisions(await p.events(group), "Alice")[-1] == ("refreshed", "polarity")
            answered = [s["summary"] for a in llm.answers[first:] for s in a["summaries"]]
            assert "Alice is employed by Google now." in " ".join(answered)
            summary = (await p.node(group, "Alice"))["summary"]
            after = counter("engram_summary_guarded_total", cause="invalidated_paraphrase")
            if restate:
                # the model did restate it, not verbatim ...
                assert any("Alice is employed by Microsoft." in a for a in answered)
                assert not any("Alice works at Microsoft." in a for a in answered)
                # ... and the stored summary is the facts-only one
                assert summary == "Alice works at Google now."
                assert after == before + 1
            else:
                assert summary == "Alice is employed by Google now."  # the model's own words, kept
                assert after == before


# --------------------------------------------------------------------------- 3. deferred refresh
async def test_deferred_refresh_is_flushed_by_the_server_schedule(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgburst")
    group = group_of(session)
    gate = GateSettings(burst_quiet_s=1, burst_min_episodes=2, burst_window_s=86400)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate=gate) as p:
        await p.say(session, "I use pytest.")
        await p.say(session, "I use Docker.")  # completes the first turn
        await p.settle()  # (so the gate decides each turn before the next is extracted)
        await p.close(session)  # nothing is published after this

        async def flushed() -> list[SummaryEvent]:
            return [e for e in await p.events(group) if e.node_name == "Alice" and e.decision == "refreshed"
                    and e.reason == "burst"]

        [flush] = await wait_for(flushed, 30) or [None]
        assert flush is not None, decisions(await p.events(group))
        await p.settle()
        events = await p.events(group)
        assert decisions(events, "Alice") == [
            ("refreshed", "new_entity"), ("deferred", "burst"), ("refreshed", "burst"),
        ]
        [deferred] = [e for e in events if e.decision == "deferred"]
        assert flush.episode_id == deferred.episode_id and flush.active_facts == 2
        assert (flush.decided_at - deferred.decided_at).total_seconds() < 6.0

        # the flush came from the server-side schedule, fired into the group's delta subject
        ticks = [d for d in await p.deltas(group) if d.get("type") == "summary_tick"]
        assert [(t["node_uuid"], t["token"]) for t in ticks] == [(deferred.node_uuid, deferred.episode_id)]

        alice = await p.node(group, "Alice")
        assert alice["due"] is None and alice["gate"].pending is None
        assert alice["summary"] == "Alice uses Docker. Alice uses pytest."  # active facts, newest first


# --------------------------------------------------------------------------- 3b. staleness sweep
async def test_a_skipped_change_is_swept_into_the_summary_with_no_further_delta(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    """Issue 10, item 4: the last change of a quiet node was skipped as low drift; the staleness
    sweep (a server-side schedule, SLA of wall time since the skip) refreshes it although no
    delta ever reaches the node again. A node with nothing pending gets no sweep."""
    session = new_session("sgsweep")
    group = group_of(session)
    sla = 3.0
    # drift_threshold 2.0 (the maximum cosine distance): every change after the first summary is
    # a low-drift skip; episodes 1 s apart stay inside the episode-time SLA
    gate = GateSettings(staleness_sla_s=sla, drift_threshold=2.0)
    swept_before = counter("engram_summary_refreshed_total", reason="staleness_sweep")
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate=gate) as p:
        await p.say(session, "I use pytest.", at=0)
        await p.say(session, "I use Docker.", at=1)
        await p.settle()
        await p.close(session)  # nothing is published for Alice after this
        await p.settle()
        pytest_node = await p.node(group, "pytest")
        await p.publish_delta(mention(group, pytest_node, "pytest", "mention-p", 0))  # summary current: no sweep
        await p.settle()
        events = await p.events(group)
        assert decisions(events, "Alice") == [("refreshed", "new_entity"), ("skipped", "low_drift")]
        assert (await p.node(group, "Alice"))["summary"] == "Alice uses pytest."

        async def swept() -> list[SummaryEvent]:
            return [e for e in await p.events(group) if e.reason == "staleness_sweep"]

        [sweep] = await wait_for(swept, 30) or [None]
        assert sweep is not None, decisions(await p.events(group))
        await asyncio.sleep(sla + 2)  # long enough for any other node's sweep to fire too
        await p.settle()
        events = await p.events(group)
        assert decisions(events, "Alice") == [
            ("refreshed", "new_entity"), ("skipped", "low_drift"), ("refreshed", "staleness_sweep"),
        ]
        [skip] = [e for e in events if e.node_name == "Alice" and e.decision == "skipped"]
        # measured on the wall clock from the skip (whole-second schedule: up to 1 s later)
        assert sla <= (sweep.decided_at - skip.decided_at).total_seconds() < sla + 4
        assert sweep.episode_id == skip.episode_id and sweep.active_facts == 2
        alice = await p.node(group, "Alice")
        assert alice["summary"] == "Alice uses Docker. Alice uses pytest."
        assert alice["gate"].stale is None and alice["gate"].summary_fact_hash == alice["gate"].fact_hash

        # nothing pending elsewhere: pytest (a mention, summary current) and Docker (new) are not swept
        assert decisions(events, "pytest") == [("refreshed", "new_entity"), ("skipped", "unchanged_hash")]
        assert decisions(events, "Docker") == [("refreshed", "new_entity")]
        ticks = [(d["node_uuid"], d["kind"]) for d in await p.deltas(group) if d.get("type") == "summary_tick"]
        assert ticks == [(alice["uuid"], "staleness")]
        assert counter("engram_summary_refreshed_total", reason="staleness_sweep") == swept_before + 1


# --------------------------------------------------------------------------- 4. restart, duplicates
STEPS = ["I use pytest.", "I use Docker.", "I use Terraform.", "I use Kubernetes.", "I work at Microsoft.",
         "I work at Google now."]
RESTART_AFTER = 3  # turns 0-2 decided by the first gate (Alice then holds a deferral of 2 deltas)


def trail(events: list[SummaryEvent]) -> list[tuple]:
    return [(e.node_name, e.decision, e.reason, e.active_facts, e.batch_size,
             None if e.drift is None else round(e.drift, 9)) for e in events]


async def test_restart_keeps_decisions_and_duplicates_cost_nothing(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    gate = GateSettings(burst_min_episodes=2, burst_window_s=86400, burst_quiet_s=600, max_deferred_deltas=2)
    straight, restarted = new_session("sgone"), new_session("sgtwo")
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate=gate) as p:
        for text in STEPS:
            await p.say(straight, text)
            await p.settle()
        await p.close(straight)
        await p.settle()

        for i, text in enumerate(STEPS):
            if i == RESTART_AFTER:
                await p.stop_gate()
                await p.start_gate()
            await p.say(restarted, text)
            await p.settle()
        await p.close(restarted)
        await p.settle()

        expected = await p.events(group_of(straight))
        assert decisions(expected, "Alice") == [
            ("refreshed", "new_entity"), ("deferred", "burst"), ("deferred", "burst"), ("refreshed", "cap_reached"),
            ("deferred", "burst"), ("refreshed", "polarity"),
        ]
        got = await p.events(group_of(restarted))
        assert trail(got) == trail(expected)

        # the same NodeDelta again under a new Nats-Msg-Id: seen as applied, no event, no LLM call
        first = next(d for d in await p.deltas(group_of(restarted)) if d.get("node_name") == "Alice")
        dup = counter("engram_summary_gate_messages_total", kind="delta", outcome="duplicate")
        calls, llm_calls = p.refresh_calls(), len(p.gate_llm.calls)  # type: ignore[attr-defined]
        await p.js.publish(subjects.delta(group_of(restarted)), json.dumps(first).encode(),
                           headers={subjects.HDR_MSG_ID: "again-1"})
        await p.settle()
        assert counter("engram_summary_gate_messages_total", kind="delta", outcome="duplicate") == dup + 1
        assert trail(await p.events(group_of(restarted))) == trail(got)
        assert (p.refresh_calls(), len(p.gate_llm.calls)) == (calls, llm_calls)  # type: ignore[attr-defined]


# --------------------------------------------------------------------------- 5. counters
async def test_counters_match_the_events(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgcount")
    group = group_of(session)
    gate = GateSettings(burst_quiet_s=1, burst_min_episodes=2, burst_window_s=120)

    def sample() -> dict[tuple[str, str], float]:
        out = {("deferred", "burst"): counter("engram_summary_deferred_total")}
        for r in REASONS:
            out[("refreshed", r)] = counter("engram_summary_refreshed_total", reason=r)
            out[("skipped", r)] = counter("engram_summary_skipped_total", reason=r)
        return out

    before = sample()
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate=gate) as p:
        turns = [("I use pytest.", 0), ("I use Docker.", 60),  # Alice: 2nd episode within 120 s -> deferred
                 ("I work at Microsoft.", 1200), ("I work at Google now.", 1800)]  # the last: polarity
        for text, at in turns:
            await p.say(session, text, at=at)
            await p.settle()
        await p.close(session)
        await p.settle()
        alice = await p.node(group, "Alice")
        await p.publish_delta(mention(group, alice, "Alice", "mention-1", 40))  # unchanged facts -> skipped

        async def done() -> bool:  # the flush tick fired and was handled (flushed or stale)
            ticks = [d for d in await p.deltas(group) if d.get("type") == "summary_tick"]
            return bool(ticks) and any(e.decision == "skipped" for e in await p.events(group)) and await p.quiet()

        assert await wait_for(done, 30)
        await p.settle()
        events = await p.events(group)
    after = sample()

    seen: dict[tuple[str, str], int] = {}
    for e in events:
        seen[(e.decision, e.reason)] = seen.get((e.decision, e.reason), 0) + 1
    assert {"refreshed", "skipped", "deferred"} <= {d for d, _ in seen}, seen
    assert {k: after[k] - before[k] for k in after if after[k] != before[k]} == seen


# --------------------------------------------------------------------------- 6. dead letters
async def test_malformed_delta_is_dead_lettered_and_the_consumer_carries_on(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgbad")
    group = group_of(session)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as p:
        await p.say(session, "I use pytest.")
        await p.close(session)
        await p.settle()
        alice = await p.node(group, "Alice")

        bad = [b"{not json", b'{"schema_version": 1, "group_id": "x"}', b'{"type": "summary_tick", "token": 1}']
        for i, payload in enumerate(bad):
            await p.js.publish(subjects.delta(group), payload, headers={subjects.HDR_MSG_ID: f"bad-{i}"})
        await p.publish_delta(mention(group, alice, "Alice", "after-bad", 30))

        async def carried_on() -> list[SummaryEvent]:
            return [e for e in await p.events(group) if e.episode_id == "after-bad"]

        [after] = await wait_for(carried_on, 30) or [None]
        assert after is not None and (after.decision, after.reason) == ("skipped", "unchanged_hash")
        letters = await read_all(p.js, subjects.STREAM_DLQ, subjects.dlq("summary_gate"))
        assert sorted(m.data for m in letters) == sorted(bad)
        for m in letters:
            assert m.headers[subjects.HDR_DLQ_STAGE] == "summary_gate"
            assert m.headers[subjects.HDR_DLQ_REASON] == "schema"
            assert m.headers[subjects.HDR_DLQ_SUBJECT] == subjects.delta(group)


async def test_an_entity_named_summary_tick_is_summarised_not_dead_lettered(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgname")
    group = group_of(session)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as p:
        await p.say(session, "I renamed `summary_tick` to `flush_tick` in app.py.")
        await p.close(session)
        await p.settle()
        assert "summary_tick" in {d.get("node_name") for d in await p.deltas(group)}  # the extractor found it
        assert await read_all(p.js, subjects.STREAM_DLQ, subjects.dlq("summary_gate")) == []
        assert "summary_tick" in {e.node_name for e in await p.events(group)}


# --------------------------------------------------------------------------- 7. audit
async def test_every_skip_is_audited_at_full_sample_rate(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgaudit")
    group = group_of(session)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate=GateSettings(audit_sample_rate=1.0)) as p:
        await p.say(session, "I use pytest and Docker.", at=0)
        await p.say(session, "I use pytest with Docker.", at=3600)
        await p.settle()
        await p.close(session)
        await p.settle()
        alice, pytest_node = await p.node(group, "Alice"), await p.node(group, "pytest")
        await p.publish_delta(mention(group, alice, "Alice", "mention-a", 7200))
        await p.publish_delta(mention(group, pytest_node, "pytest", "mention-p", 7200))
        await p.settle()

        events = await p.events(group)
        skips = {(e.node_uuid, e.episode_id): e for e in events if e.decision == "skipped"}
        audits = {(a.node_uuid, a.episode_id): a for a in await p.audits(group)}
        assert len(skips) >= 2 and set(audits) == set(skips), (decisions(events), list(audits))
        for key, audit in audits.items():
            assert (audit.reason, audit.drift, audit.node_name) == (skips[key].reason, skips[key].drift,
                                                                   skips[key].node_name)
            assert len(audit.active_facts) == skips[key].active_facts
        mine = audits[(alice["uuid"], "mention-a")]
        assert mine.reason == "unchanged_hash"
        facts = await p.query(group, "MATCH (a:Entity {uuid: $u})-[e:RELATES_TO]->() WHERE e.invalid_at IS NULL "
                                     "RETURN DISTINCT e.fact AS f", u=alice["uuid"])
        assert mine.active_facts and sorted(set(mine.active_facts)) == sorted(r["f"] for r in facts)
        assert mine.kept_summary == alice["summary"] != ""


async def test_a_node_with_more_facts_than_compose_max_facts_asks_the_llm(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    session = new_session("sgllm")
    group = group_of(session)
    async with pipeline(clean_nats, falkordb_server.url, tmp_path, gate=GateSettings(compose_max_facts=1)) as p:
        await p.say(session, "I work at Microsoft and I use pytest.")
        await p.close(session)
        await p.settle()
        sizes = {e.node_name: e.batch_size for e in await p.events(group)}
        assert sizes == {"Alice": 1, "Microsoft": 0, "pytest": 0}, sizes  # Alice: 2 facts > 1
        assert p.refresh_calls() == 1
