"""Every LLM fault mode of the simulator (bench/llm_simulator.py) against the real extractor: real
NATS + FalkorDB, engram's OpenAI-compatible client (the real ``openai`` SDK) talking HTTP to the
simulator. Each fault must end in a retry that succeeds (the episode is in the graph, once) or a
dead letter whose headers name the reason (the original episode bytes, replayable); never in
neither, never in both.

Time: the client's timeout and retry counts are small here (seconds), and graphiti's own retry
of unparsable answers waits 5-10 s before its second attempt (tenacity, graphiti-core 0.31.1);
the cases that go through it take that long.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import nats
import pytest
from graphiti_core.driver.falkordb_driver import FalkorDriver

from bench.llm_simulator import (
    EMBEDDINGS,
    Fault,
    LLMSimulator,
    empty,
    hang,
    invalid_json,
    rate_limit,
    schema_violation,
    server_error,
    slow,
    truncated,
)
from engram.runtime.dlq import replay_dead_letters
from engram.models.factory import EmbedderSettings
from engram.models.openai_compat import llm_stats
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.schemas import Episode, EpisodeMessage, subjects
from engram.services.extractor import app as ex_app
from tests.services.turn_detector.helpers import read_all, wait_for
from tests.support.llm import simulator_client

CONTENT = "user(Ada): I moved the API from Flask to FastAPI and pinned pydantic in pyproject.toml.\n" \
          "assistant: Good call, FastAPI validates requests with pydantic."
AT = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


@dataclass
class Outcome:
    in_graph: int  # Episodic nodes with the episode's uuid
    letters: list[Any]  # dead letters of the extractor
    seconds: float

    @property
    def reason(self) -> str | None:
        return self.letters[0].headers[subjects.HDR_DLQ_REASON] if self.letters else None

    @property
    def detail(self) -> str:
        return self.letters[0].headers.get(subjects.HDR_DLQ_DETAIL, "") if self.letters else ""


@dataclass
class Harness:
    nc: Any
    driver: FalkorDriver
    group_id: str
    llm: Any

    @property
    def js(self) -> Any:
        return self.nc.jetstream()

    def episode(self, content: str = CONTENT) -> Episode:
        turn = f"t-{uuid.uuid4().hex[:8]}"
        return Episode(
            episode_id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"faults/{self.group_id}/{turn}")), group_id=self.group_id,
            scope="session", turn_id=turn, session_id="faults", reference_time=AT, content=content,
            messages=[EpisodeMessage(message_id=f"{turn}-m", role="user", name="Ada", timestamp=AT)],
        )

    async def in_graph(self, episode: Episode) -> int:
        records, _, _ = await self.driver.execute_query(
            "MATCH (e:Episodic {uuid: $uuid}) RETURN count(e) AS n", uuid=episode.episode_id)
        return int(records[0]["n"]) if records else 0

    async def run(self, episode: Episode, timeout: float = 90.0) -> Outcome:
        """Publish ``episode`` and wait until it is settled (:meth:`settle`)."""
        await self.js.publish(subjects.episode(episode.group_id), episode.model_dump_json().encode(),
                              headers={subjects.HDR_MSG_ID: episode.episode_id})
        return await self.settle(episode, timeout)

    async def settle(self, episode: Episode, timeout: float = 90.0) -> Outcome:
        """Wait until ``episode`` is in the graph or dead-lettered and the extractor's durables
        have nothing pending or unacked."""
        started = time.monotonic()

        async def settled() -> Outcome | None:
            infos = await self.js.consumers_info(subjects.STREAM_EPISODES)
            idle = all(c.num_pending == 0 and c.num_ack_pending == 0 for c in infos if c.name.startswith("extractor"))
            letters = [m for m in await read_all(self.js, subjects.STREAM_DLQ, settle=0.05)
                       if m.headers.get(subjects.HDR_DLQ_STAGE) == "extractor"]
            n = await self.in_graph(episode)
            if idle and (n or letters):
                return Outcome(n, letters, time.monotonic() - started)
            return None

        outcome = await wait_for(settled, timeout, interval=0.2)
        assert outcome is not None, f"episode neither in the graph nor dead-lettered after {timeout} s"
        return outcome


@contextlib.asynccontextmanager
async def extractor(sim: LLMSimulator, nats_url: str, graph_url: str, tmp_path: Path, *, timeout_s: float = 5.0,
                    max_retries: int = 2, max_deliveries: int = 2, embed_on_sim: bool = False) -> AsyncIterator[Harness]:
    llm = simulator_client(sim, timeout_s=timeout_s, max_retries=max_retries)
    settings = EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=tmp_path, partitions=1,
                              turn=TurnDetectorSettings(max_deliveries=max_deliveries))
    embedder = EmbedderSettings(provider="openai", base_url=sim.base_url, model="sim-embed", dim=256) if embed_on_sim else None
    service = ex_app.build(settings, llm=llm, embedder_settings=embedder)
    await service.start()
    group_id = f"faults_{uuid.uuid4().hex[:10]}"
    host, port = graph_url.split("://", 1)[1].rsplit(":", 1)
    driver = FalkorDriver(host=host, port=int(port), database=group_id)
    nc = await nats.connect(nats_url)
    try:
        yield Harness(nc, driver, group_id, llm)
    finally:
        await nc.close()
        await service.stop()
        await driver.close()


def assert_in_graph_once(outcome: Outcome) -> None:
    assert outcome.in_graph == 1 and not outcome.letters, (outcome.in_graph, outcome.reason, outcome.detail)


def assert_dead_lettered(outcome: Outcome, reason: str, episode: Episode) -> None:
    assert outcome.in_graph == 0, "dead-lettered and in the graph"
    assert len(outcome.letters) == 1, [m.headers for m in outcome.letters]
    assert outcome.reason == reason, (outcome.reason, outcome.detail)
    assert Episode.model_validate_json(outcome.letters[0].data) == episode  # the original bytes: replayable


# ---------------------------------------------------------------- transient faults: a retry succeeds

# mode -> (faults served to the next requests, how the call recovers within the same delivery:
# "sdk" = the OpenAI SDK's own retry, "reask" = engram asks again at once (invalid answer),
# "tighter_cap" = engram's one stricter retry with half the cap (finish_reason=length))
TRANSIENT: dict[str, tuple[list[Fault], str]] = {
    "rate_limit_429_retry_after": ([rate_limit(retry_after_s=1.0)] * 2, "sdk"),
    "server_error_500": ([server_error(500)], "sdk"),
    "server_error_502": ([server_error(502)], "sdk"),
    "server_error_503": ([server_error(503)], "sdk"),
    "hang_past_the_client_timeout": ([hang(30.0)], "sdk"),
    "invalid_json": ([invalid_json()], "reask"),
    "truncated_finish_reason_length": ([truncated()], "tighter_cap"),
    "schema_violating_json": ([schema_violation()], "reask"),
    "empty_answer": ([empty()], "reask"),
}


@pytest.mark.parametrize("mode", sorted(TRANSIENT))
async def test_a_transient_llm_fault_is_retried_and_the_episode_reaches_the_graph_once(
    mode: str, sim: LLMSimulator, clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    async with extractor(sim, clean_nats, falkordb_server.url, tmp_path, timeout_s=2.0) as h:
        faults, recovery = TRANSIENT[mode]
        sim.schedule(*faults)
        episode = h.episode()
        outcome = await h.run(episode)
        assert_in_graph_once(outcome)
        assert sim.pending == 0, "the scheduled faults were not all served"
        faulted = [s for s in sim.served if s.kind != "ok"]
        assert len(faulted) == len(faults)
        stats = llm_stats(h.llm)
        assert stats is not None and stats.failed == 0, "a call failed: the episode needed a redelivery"
        assert stats.http_requests == stats.calls + len(faults)  # exactly one more request per fault
        assert stats.invalid_recovered == (1 if recovery == "reask" else 0)
        assert stats.truncation_recovered == (1 if recovery == "tighter_cap" else 0)
        if mode == "rate_limit_429_retry_after":  # Retry-After honoured: the next request waited for it
            first, after = sim.served.index(faulted[0]), sim.served.index(faulted[-1])
            assert sim.served[first + 1].at - faulted[0].at >= 0.95
            assert sim.served[after + 1].at - faulted[-1].at >= 0.95


# ---------------------------------------------------------------- persistent faults: dead letter with a reason

# mode -> (the fault of every request, dead-letter reason, a fragment of its detail, deliveries).
# Rate limits also go through graphiti's backoff (4 attempts, 5-120 s random waits): one
# delivery only, or the case takes minutes.
PERSISTENT: dict[str, tuple[Fault, str, str, int]] = {
    "rate_limit_429_forever": (rate_limit(retry_after_s=0.2), "llm_unavailable", "RateLimitError (HTTP 429)", 1),
    "server_error_503_forever": (server_error(503), "llm_unavailable", "InternalServerError (HTTP 503)", 2),
    "hang_forever": (hang(3600.0), "llm_unavailable", "APITimeoutError", 2),
    "invalid_json_forever": (invalid_json(), "llm_output_invalid", "not JSON, 2 attempt(s)", 2),
    "empty_answer_forever": (empty(), "llm_output_invalid", "was empty, 2 attempt(s)", 2),
    "truncated_forever": (truncated(), "llm_output_truncated", "finish_reason=length", 2),
    "schema_violating_json_forever": (schema_violation(), "llm_output_invalid", "in violation of the response model", 2),
}


@pytest.mark.parametrize("mode", sorted(PERSISTENT))
async def test_a_persistent_llm_fault_dead_letters_the_episode_with_its_reason(
    mode: str, sim: LLMSimulator, clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    fault, reason, detail, deliveries = PERSISTENT[mode]
    async with extractor(sim, clean_nats, falkordb_server.url, tmp_path, timeout_s=1.0, max_retries=1,
                         max_deliveries=deliveries) as h:
        sim.default = fault
        episode = h.episode()
        outcome = await h.run(episode, timeout=180)
        assert_dead_lettered(outcome, reason, episode)
        assert detail in outcome.detail, outcome.detail
        expected_deliveries = 1 if reason == "llm_output_truncated" else deliveries  # truncation: at once
        assert f"after {expected_deliveries} deliveries" in outcome.detail, outcome.detail
        assert not any(text in outcome.detail for text in ("Sure!", "not a list", "FastAPI", "pydantic")), \
            "the model's answer (content) leaked into the dead letter"
        # the model is back: `engram dlq replay` (replay_dead_letters) stores the episode, once
        sim.default = Fault()
        assert await replay_dead_letters(h.nc, "extractor") == 1
        assert_in_graph_once(await h.settle(episode))


async def test_a_slow_model_within_the_timeout_costs_no_retry(
    sim: LLMSimulator, clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    async with extractor(sim, clean_nats, falkordb_server.url, tmp_path, timeout_s=5.0) as h:
        sim.default = slow(1.0)
        outcome = await h.run(h.episode())
        assert_in_graph_once(outcome)
        stats = llm_stats(h.llm)
        assert stats is not None and stats.calls >= 1  # one since issue 25 item 6 (local dating)
        assert stats.http_requests == stats.calls == sim.count("slow")  # one request per call: no timeout, no retry
        assert stats.failed == 0
        assert outcome.seconds >= stats.calls * 1.0  # the calls did wait


async def test_embeddings_from_the_same_server_survive_its_faults(
    sim: LLMSimulator, clean_nats: str, falkordb_server: Any, tmp_path: Path,
) -> None:
    """``ENGRAM_EMBEDDER_PROVIDER=openai`` on the simulator's base URL: a 429 and a 503 on
    /v1/embeddings are retried by the SDK; a server whose embeddings stay down dead-letters the
    episode after its deliveries with reason ``embedder_unavailable`` (was ``processing_failed``)."""
    async with extractor(sim, clean_nats, falkordb_server.url, tmp_path, embed_on_sim=True) as h:
        sim.schedule(rate_limit(0.2, path=EMBEDDINGS), server_error(503, path=EMBEDDINGS))
        assert_in_graph_once(await h.run(h.episode()))
        assert sim.count("rate_limit", path=EMBEDDINGS) == sim.count("server_error", path=EMBEDDINGS) == 1
        assert sim.count("ok", path=EMBEDDINGS) >= 1  # a turn's embeddings are one request (issue 25, item 5)
        sim.embeddings_default = server_error(503, path=EMBEDDINGS)
        # new entities and facts: the extractor keeps the first turn's vectors, so the same turn
        # again would need no embedding but its own text's (which a turn may be stored without)
        episode = h.episode("user(Ada): We switched billing from Postgres to SQLite.\n"
                            "assistant: SQLite keeps the billing service simple.")
        outcome = await h.run(episode)
        assert_dead_lettered(outcome, "embedder_unavailable", episode)
        assert "EmbedderUnavailable after 2 deliveries" in outcome.detail
        assert "InternalServerError (HTTP 503)" in outcome.detail
