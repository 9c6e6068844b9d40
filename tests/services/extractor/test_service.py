"""extractor service against real NATS JetStream and FalkorDB: turns in, graph and NodeDeltas out,
idempotent on redelivered episodes, bad episodes dead-lettered."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import pytest

from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import Episode, NodeDelta, subjects
from engram.services.extractor import app as ex_app
from engram.services.turn_detector import app as td_app
from tests.services.turn_detector.helpers import close, msg, publish, read_all, wait_for


@contextlib.asynccontextmanager
async def pipeline(nats_url: str, graph_url: str, tmp_path: Path) -> AsyncIterator[tuple]:
    settings = EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(max_deliveries=2))
    llm = RulesExtractorClient()
    detector, extractor = td_app.build(settings), ex_app.build(settings, llm=llm)
    await detector.start()
    await extractor.start()
    nc = await nats.connect(nats_url)
    try:
        yield nc.jetstream(), llm, extractor
    finally:
        await nc.close()
        await extractor.stop()
        await detector.stop()


async def deltas(js) -> list[NodeDelta]:  # noqa: ANN001
    return [NodeDelta.model_validate_json(m.data) for m in await read_all(js, subjects.STREAM_DELTAS)]


async def _extractors_idle(js) -> bool:  # noqa: ANN001
    infos = await js.consumers_info(subjects.STREAM_EPISODES)
    mine = [c for c in infos if c.name.startswith("extractor")]
    return bool(mine) and all(c.num_pending == 0 and c.num_ack_pending == 0 for c in mine)


async def test_turns_become_graph_facts_and_node_deltas(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as (js, llm, _):
        await publish(js, msg("x1", "u1", "user", "I moved the API from Flask to FastAPI and pinned pydantic==2.14 in pyproject.toml.", 0, name="Ada"))
        await publish(js, msg("x1", "a1", "assistant", "Good call: FastAPI uses pydantic for validation.", 1))
        await close(js, "x1")

        async def got():  # noqa: ANN202
            return await deltas(js) if await _extractors_idle(js) and await deltas(js) else None

        out = await wait_for(got, 30)
        assert out, "no NodeDelta published"
        names = {d.node_name for d in out}
        assert {"FastAPI", "pyproject.toml"} <= names, names
        assert all(d.group_id == "engram_session_x1" for d in out)
        assert any(d.new_facts and d.new_facts[0].embedding for d in out)
        assert llm.calls, "the rules extractor was never asked"


async def test_redelivered_episode_costs_no_llm_call_and_duplicates_no_delta(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as (js, llm, _):
        await publish(js, msg("x2", "u1", "user", "Caroline went to the LGBTQ support group in Boston.", 0, name="Caroline"))
        await publish(js, msg("x2", "a1", "assistant", "That sounds powerful, Caroline!", 1, name="Melanie"))
        await close(js, "x2")
        first = await wait_for(lambda: _settled(js), 30)
        assert first
        calls = len(llm.calls)
        # Re-publish the same episode under a new Nats-Msg-Id: the server accepts it, the
        # extractor must find it in the graph and only re-publish (deduplicated) deltas.
        stored = (await read_all(js, subjects.STREAM_EPISODES))[0]
        episode = Episode.model_validate_json(stored.data)
        await js.publish(subjects.episode(episode.group_id), stored.data, headers={"Nats-Msg-Id": "again-1"})
        await wait_for(lambda: _settled(js, episodes=2), 30)
        assert len(llm.calls) == calls
        assert len(await deltas(js)) == len(first)


async def _settled(js, episodes: int = 1) -> list[NodeDelta] | None:  # noqa: ANN001
    stream = await js.stream_info(subjects.STREAM_EPISODES)
    if stream.state.messages < episodes or not await _extractors_idle(js):
        return None
    return await deltas(js) or None


async def test_malformed_episode_is_dead_lettered(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    async with pipeline(clean_nats, falkordb_server.url, tmp_path) as (js, _, _):
        await js.publish(subjects.episode("engram_session_bad"), b'{"not": "an episode"}', headers={"Nats-Msg-Id": "bad-ep"})

        async def letters():  # noqa: ANN202
            return await read_all(js, subjects.STREAM_DLQ) or None

        got = await wait_for(letters, 20)
        assert got and got[0].headers[subjects.HDR_DLQ_STAGE] == "extractor"
        assert got[0].headers[subjects.HDR_DLQ_REASON] == "schema"
        assert got[0].headers[subjects.HDR_DLQ_SUBJECT] == "engram.episode.engram_session_bad"


async def test_neo4j_without_uri_fails_at_start_with_a_clear_error(clean_nats, tmp_path) -> None:  # noqa: ANN001
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, graph_backend="neo4j", neo4j_uri=None)
    service = ex_app.build(settings)
    with pytest.raises(RuntimeError, match="needs ENGRAM_NEO4J_URI"):
        await service.start()
    await service.broker.stop()


async def test_two_replicas_keep_each_groups_episodes_in_order(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    # Concurrency 1: with 2 partitions, one replica of concurrency >= 2 can hold both partitions'
    # episodes and legitimately do all the work (replicas pull only when they have a free slot).
    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=2,
                              extractor_concurrency=1)
    replicas = [ex_app.build(settings, llm=RulesExtractorClient()) for _ in range(2)]
    handled: list[tuple[int, str, str]] = []  # (replica, group, turn id) in the order processing started
    for i, r in enumerate(replicas):
        real = r.extractor._process  # type: ignore[attr-defined]

        async def traced(episode, _real=real, _i=i):  # noqa: ANN001, ANN202
            handled.append((_i, episode.group_id, episode.turn_id))
            return await _real(episode)

        r.extractor._process = traced  # type: ignore[attr-defined]
        await r.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    groups = [f"engram_session_o{g}" for g in range(6)]
    try:
        for k in range(4):
            for g, group in enumerate(groups):
                ep = Episode(episode_id=f"00000000-0000-4000-8000-{g:06d}{k:06d}", group_id=group, scope="session",
                             turn_id=f"o{g}:m{k}", session_id=f"o{g}", reference_time="2026-01-01T00:00:00Z",
                             content=f"user (Ada): Step {k}: Ada deployed service{g} with Terraform.", messages=[])
                await js.publish(subjects.episode(group), ep.model_dump_json().encode(), headers={"Nats-Msg-Id": ep.episode_id})
        done = await wait_for(lambda: _all_handled(js, handled, 24), 60)
        assert done, f"only {len(handled)} of 24 episodes handled"
        for g, group in enumerate(groups):
            assert [t for _, grp, t in handled if grp == group] == [f"o{g}:m{k}" for k in range(4)]
        assert {i for i, _, _ in handled} == {0, 1}, "both replicas should have worked"
    finally:
        await nc.close()
        for r in replicas:
            await r.stop()


async def _all_handled(js, handled: list, n: int) -> bool:  # noqa: ANN001
    return len(handled) >= n and await _extractors_idle(js)


async def test_an_episode_that_keeps_failing_is_retried_then_dead_lettered(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    from engram.models.rules_llm import RulesExtractorClient as Rules

    class BrokenLLM(Rules):
        async def _generate_response(self, *args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            raise RuntimeError("model server down")

    settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=2,
                              turn=TurnDetectorSettings(max_deliveries=2))
    extractor = ex_app.build(settings, llm=BrokenLLM())
    await extractor.start()
    nc = await nats.connect(clean_nats)
    try:
        js = nc.jetstream()
        await publish(js, msg("x9", "u1", "user", "I moved the API from Flask to FastAPI.", 0, name="Ada"))
        detector = td_app.build(settings)
        await detector.start()
        await close(js, "x9")

        async def dead() -> list:  # noqa: ANN202
            return [m for m in await read_all(js, subjects.STREAM_DLQ)] or None

        letters = await wait_for(dead, 60)
        await detector.stop()
        assert letters and letters[0].headers[subjects.HDR_DLQ_REASON] == "processing_failed"
        assert letters[0].headers[subjects.HDR_DLQ_STAGE] == "extractor"
        assert "RuntimeError after 2 deliveries" in letters[0].headers[subjects.HDR_DLQ_DETAIL]
        assert Episode.model_validate_json(letters[0].data).session_id == "x9"  # the original bytes
    finally:
        await nc.close()
        await extractor.stop()
