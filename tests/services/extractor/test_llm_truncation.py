"""An episode whose LLM answer is cut by max_tokens (finish_reason=length) twice is dead-lettered
at once with reason ``llm_output_truncated`` (not redelivered: the same capped calls would be cut
again), against real NATS + FalkorDB and a real openai client talking to a scripted server."""

from __future__ import annotations

import nats

from engram.models.factory import LLMSettings, build_llm
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import Episode, subjects
from engram.services.extractor import app as ex_app
from engram.services.turn_detector import app as td_app
from tests.engram.models.openai_fake import FakeOpenAI, running
from tests.services.turn_detector.helpers import close, msg, publish, read_all, wait_for


async def test_truncated_llm_output_is_dead_lettered_with_its_reason(clean_nats, falkordb_server, tmp_path) -> None:  # noqa: ANN001
    with running(FakeOpenAI()) as fake:
        fake.script = ["length"] * 20
        llm = build_llm(LLMSettings(provider="openai", base_url=fake.base_url, model="m", requests_per_second=1000))
        settings = EngramSettings(nats_url=clean_nats, graph_url=falkordb_server.url, data_dir=tmp_path, partitions=2,
                                  turn=TurnDetectorSettings(max_deliveries=3))
        extractor, detector = ex_app.build(settings, llm=llm), td_app.build(settings)
        await extractor.start()
        await detector.start()
        nc = await nats.connect(clean_nats)
        try:
            js = nc.jetstream()
            await publish(js, msg("t1", "u1", "user", "I moved the API from Flask to FastAPI.", 0, name="Ada"))
            await close(js, "t1")

            async def dead() -> list | None:
                return list(await read_all(js, subjects.STREAM_DLQ)) or None

            letters = await wait_for(dead, 60)
            assert letters, "nothing dead-lettered"
            headers = letters[0].headers
            assert headers[subjects.HDR_DLQ_REASON] == "llm_output_truncated"
            assert headers[subjects.HDR_DLQ_STAGE] == "extractor"
            assert "after 1 deliveries" in headers[subjects.HDR_DLQ_DETAIL]  # at once, not after 3
            assert Episode.model_validate_json(letters[0].data).session_id == "t1"  # original bytes, replayable
            assert len(fake.requests) == 2  # the call and its one tighter retry
            assert fake.requests[1]["max_tokens"] == fake.requests[0]["max_tokens"] // 2
        finally:
            await nc.close()
            await detector.stop()
            await extractor.stop()
