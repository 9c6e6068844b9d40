"""A graph database outage is waited out, not dead-lettered (issue 16 item 2: a 30 s FalkorDB outage
in bench/chaos.py dead-lettered the head episode of busy partitions, so the graph lost them)."""

from __future__ import annotations

import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import nats

from engram.stack.embedded import free_port, start_falkordb
from engram.models.factory import EmbedderSettings
from engram.models.rules_llm import RulesExtractorClient
from engram.runtime.service import backend_unavailable
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import Episode, EpisodeMessage, subjects
from engram.services.extractor import app as ex_app
from tests.services.turn_detector.helpers import read_all, wait_for

AT = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def episode(group: str, n: int) -> Episode:
    turn = f"t{n}"
    return Episode(
        episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"outage/{group}/{turn}")), group_id=group, scope="session",
        turn_id=turn, session_id="outage", reference_time=AT,
        content=f"user (Ada): I moved the staging database to Frankfurt in step {n}.",
        messages=[EpisodeMessage(message_id=f"{turn}-m", role="user", name="Ada", timestamp=AT)],
    )


def test_what_counts_as_the_backend_being_down() -> None:
    import redis.exceptions

    assert backend_unavailable(redis.exceptions.ConnectionError("Error 111 connecting"))
    assert backend_unavailable(redis.exceptions.ConnectionError("No connection available."))
    try:  # wrapped, as graphiti re-raises inside its own handlers
        try:
            raise ConnectionRefusedError(111, "refused")
        except OSError as inner:
            raise RuntimeError("query failed") from inner
    except RuntimeError as outer:
        assert backend_unavailable(outer)
    assert not backend_unavailable(ValueError("a bad episode"))


async def test_an_episode_waits_for_the_graph_instead_of_being_dead_lettered(clean_nats: str, tmp_path: Path) -> None:
    port = free_port()
    graph = start_falkordb(tmp_path / "falkordb", port=port)
    settings = EngramSettings(nats_url=clean_nats, graph_url=graph.url, data_dir=tmp_path, partitions=1,
                              turn=TurnDetectorSettings(max_deliveries=2))
    service = ex_app.build(settings, llm=RulesExtractorClient(), embedder_settings=EmbedderSettings(provider="hashing"))
    await service.start()
    nc = await nats.connect(clean_nats)
    js = nc.jetstream()
    group = f"outage_{uuid.uuid4().hex[:8]}"

    async def in_graph(ep: Episode) -> bool:
        from falkordb.asyncio import FalkorDB

        db = FalkorDB(host="127.0.0.1", port=port)
        try:
            result = await db.select_graph(group).query("MATCH (e:Episodic {uuid: $u}) RETURN count(e)",
                                                        {"u": ep.episode_id})
            return result.result_set[0][0] == 1
        finally:
            await db.aclose()

    async def publish(ep: Episode) -> None:
        await js.publish(subjects.episode(group), ep.model_dump_json().encode(), headers={subjects.HDR_MSG_ID: ep.episode_id})

    try:
        first, second = episode(group, 1), episode(group, 2)
        await publish(first)
        assert await wait_for(lambda: in_graph(first), 60), "the first episode never reached the graph"
        graph.stop()
        await publish(second)
        started = time.monotonic()
        # past max_deliveries (2: delays 1 s, 2 s): before the fix it was dead-lettered by now
        while time.monotonic() - started < 6:
            assert not await read_all(js, subjects.STREAM_DLQ, settle=0.05), "dead-lettered while the graph was down"
            await wait_for(lambda: _false(), 0.5)
        graph = start_falkordb(tmp_path / "falkordb", port=port)
        assert await wait_for(lambda: in_graph(second), 60), "the episode did not reach the graph after the outage"
        assert not await read_all(js, subjects.STREAM_DLQ, settle=0.05)
    finally:
        await nc.close()
        await service.stop()
        graph.stop()


async def _false() -> bool:
    return False
