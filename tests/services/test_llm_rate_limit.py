"""Every service that calls an LLM shares the deployment's rate limit through its own NATS
connection (engram/models/rate_limit.py): with ENGRAM_LLM_PROVIDER=openai, the extractor, the
summary-gate and the sessions stage build their client with the broker's connection, so once the
broker is connected a reservation goes through the engram_llm_limits KV bucket."""

from __future__ import annotations

import nats
import pytest

from engram.models.delegating import innermost
from engram.models.rate_limit import SharedRateLimiter
from engram.runtime.service import make_broker
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.services.extractor.app import Extractor
from engram.services.sessions.app import SessionCloser
from engram.services.summary_gate.app import SummaryGate


@pytest.mark.parametrize(("service", "cls"), [("extractor", Extractor), ("summary-gate", SummaryGate),
                                              ("sessions", SessionCloser)])
async def test_the_service_llm_reserves_through_the_shared_bucket(
        service: str, cls: type, clean_nats: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("ENGRAM_LLM_PROVIDER", "openai")
    monkeypatch.setenv("ENGRAM_LLM_BASE_URL", "http://127.0.0.1:9/v1")  # never called here
    monkeypatch.setenv("ENGRAM_LLM_REQUESTS_PER_MINUTE", "600")
    admin = await nats.connect(clean_nats)
    await ensure_topology(admin.jetstream(), Topology(partitions=1, duplicate_window_s=60, ack_wait_s=30))
    settings = EngramSettings(nats_url=clean_nats, data_dir=tmp_path, partitions=1)
    broker = make_broker(settings, service=service)
    stage = cls(settings, broker)
    limiter = innermost(stage.llm).rate_limit
    assert isinstance(limiter, SharedRateLimiter) and limiter.limits.requests is not None
    await broker.connect()
    try:
        assert (await limiter.acquire()).shared  # through the broker's connection, not this process alone
        kv = await admin.jetstream().key_value("engram_llm_limits")
        assert (await kv.get(limiter.key)).value
    finally:
        await broker.stop()
        await admin.close()
