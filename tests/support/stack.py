"""engram's services in-process on one event loop in a background thread, against the suite's real
NATS JetStream and FalkorDB, for the tests that hypothesis or schemathesis drive (tests/fuzz,
tests/services/test_isolation.py, tests/services/test_memory_isolation.py).

Why a thread: hypothesis and schemathesis drive synchronous test functions, while the services
need a running event loop. The tests hand coroutines to :meth:`ServiceStack.run`; the services
keep running between examples, as they would in production.

Always the turn-detector, the extractor (the offline rules model, the hashing embedder) and
recall; the summary-gate and the sessions service when given a model for their prompts; the
gateway under uvicorn on a loopback port when asked (``url``, and ``http``, an httpx client on it).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import httpx
import nats
import uvicorn
from graphiti_core.llm_client.client import LLMClient

from engram.stack.embedded import free_port
from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from engram.services.extractor import app as ex_app
from engram.services.gateway import app as gw_app
from engram.services.gateway.settings import GatewaySettings
from engram.services.recall import app as recall_app
from engram.services.sessions import app as sessions_app
from engram.services.summary_gate import app as sg_app
from engram.services.turn_detector import app as td_app

T = TypeVar("T")


class ServiceStack:
    """The services on one loop in a background thread; :meth:`run` runs a coroutine there.

    ``summary_gate_llm`` / ``sessions_llm``: also run that service, answering its prompts with
    this client. ``fresh_streams``: delete every stream first (another test's backlog is not
    this one's)."""

    def __init__(self, settings: EngramSettings, *, gateway: bool = False, summary_gate_llm: LLMClient | None = None,
                 sessions_llm: LLMClient | None = None, fresh_streams: bool = False) -> None:
        self.settings = settings
        self.with_gateway = gateway
        self.summary_gate_llm = summary_gate_llm
        self.sessions_llm = sessions_llm
        self.fresh_streams = fresh_streams
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engram-stack", daemon=True)
        self.services: list[Any] = []
        self.nc: Any = None
        self.url = ""
        self.http: httpx.AsyncClient | None = None
        self._server: uvicorn.Server | None = None
        self._server_task: asyncio.Task[None] | None = None

    def run(self, coro: Awaitable[T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def start(self) -> ServiceStack:
        self.thread.start()
        self.run(self._start(), timeout=180)
        return self

    def stop(self) -> None:
        try:
            self.run(self._stop(), timeout=120)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(30)

    async def _start(self) -> None:
        s = self.settings
        if self.fresh_streams:
            nc = await nats.connect(s.nats_url)
            js = nc.jetstream()
            for info in await js.streams_info():
                await js.delete_stream(info.config.name)
            await nc.close()
        self.services = [td_app.build(s), ex_app.build(s, llm=RulesExtractorClient())]
        if self.summary_gate_llm is not None:
            self.services.append(sg_app.build(s, llm=self.summary_gate_llm))
        self.services.append(recall_app.build(s))
        if self.sessions_llm is not None:
            self.services.append(sessions_app.build(s, llm=self.sessions_llm))
        for service in self.services:
            await service.start()
        self.nc = await nats.connect(s.nats_url)
        if self.with_gateway:
            port = free_port()
            self._server = uvicorn.Server(uvicorn.Config(gw_app.build(s, GatewaySettings()).asgi(), host="127.0.0.1",
                                                         port=port, log_level="warning", access_log=False,
                                                         lifespan="on"))
            self._server_task = asyncio.create_task(self._server.serve())
            while not self._server.started:
                if self._server_task.done():
                    self._server_task.result()
                await asyncio.sleep(0.02)
            self.url = f"http://127.0.0.1:{port}"
            self.http = httpx.AsyncClient(base_url=self.url, timeout=30)

    async def _stop(self) -> None:
        if self.http is not None:
            await self.http.aclose()
        if self._server is not None and self._server_task is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._server_task, 30)
        if self.nc is not None:
            await self.nc.close()
        for service in reversed(self.services):
            await service.stop()


class IsolationStack(ServiceStack):
    """The isolation tests' stack: the gateway, a group prefix of the test's own, fresh streams,
    and turns that end on the next user message or the close, never on an idle gap that a loaded
    machine can open between two publishes."""

    def __init__(self, nats_url: str, graph_url: str, data_dir: Path, prefix: str, *,
                 sessions_llm: LLMClient | None = None) -> None:
        super().__init__(EngramSettings(nats_url=nats_url, graph_url=graph_url, data_dir=data_dir, partitions=2,
                                        group_prefix=prefix, turn=TurnDetectorSettings(idle_timeout_s=3600)),
                         gateway=True, sessions_llm=sessions_llm, fresh_streams=True)
