"""Every engram service in-process on one event loop in a background thread, against real NATS
JetStream and FalkorDB (the rules model as LLM), for the hostile-input tests.

Why a thread: hypothesis and schemathesis drive synchronous test functions, while the services
need a running event loop. The tests hand coroutines to :meth:`Stack.run`; the services keep
running between examples, as they would in production.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

import nats
import uvicorn

from engram.embedded import free_port
from engram.models.rules_llm import RulesExtractorClient
from engram.settings import EngramSettings, TurnDetectorSettings
from services.extractor import app as ex_app
from services.gateway import app as gw_app
from services.gateway.settings import GatewaySettings
from services.recall import app as recall_app
from services.sessions import app as sessions_app
from services.summary_gate import app as sg_app
from services.turn_detector import app as td_app

T = TypeVar("T")


class LogCapture(logging.Handler):
    """Every log record of every thread, formatted as the services' own handler would (message,
    arguments and traceback): what an operator's log would hold."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s %(message)s"))
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = self.format(record)
        except Exception:  # noqa: BLE001 - a record that cannot be formatted is still a record
            text = f"{record.levelname} {record.name} {record.msg!r} {record.args!r}"
        with self._lock:
            self.lines.append(text)

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines)

    def mark(self) -> int:
        with self._lock:
            return len(self.lines)

    def since(self, mark: int) -> str:
        with self._lock:
            return "\n".join(self.lines[mark:])


class Stack:
    def __init__(self, nats_url: str, graph_url: str, data_dir: Path, *, gateway: bool = False) -> None:
        self.settings = EngramSettings(
            nats_url=nats_url, graph_url=graph_url, data_dir=data_dir, partitions=2,
            # two deliveries before a failing message is dead-lettered (0.5 s / 1 s backoff), a
            # 1 s idle timeout so a session's last turn is flushed without a close
            turn=TurnDetectorSettings(max_deliveries=2, idle_timeout_s=1),
        )
        self.with_gateway = gateway
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="engram-stack", daemon=True)
        self.services: list[Any] = []
        self.nc: Any = None
        self.url = ""
        self._server: uvicorn.Server | None = None
        self._server_task: asyncio.Task[None] | None = None

    def run(self, coro: Awaitable[T], timeout: float = 120.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)  # type: ignore[arg-type]

    def start(self) -> "Stack":
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
        self.services = [
            td_app.build(s),
            ex_app.build(s, llm=RulesExtractorClient()),
            sg_app.build(s, llm=RulesExtractorClient()),
            recall_app.build(s),
            sessions_app.build(s, llm=RulesExtractorClient()),
        ]
        for service in self.services:
            await service.start()
        self.nc = await nats.connect(s.nats_url)
        if self.with_gateway:
            service = gw_app.build(s, GatewaySettings())
            port = free_port()
            self._server = uvicorn.Server(uvicorn.Config(service.asgi(), host="127.0.0.1", port=port,
                                                         log_level="warning", access_log=False, lifespan="on"))
            self._server_task = asyncio.create_task(self._server.serve())
            while not self._server.started:
                if self._server_task.done():
                    self._server_task.result()
                await asyncio.sleep(0.02)
            self.url = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        if self._server is not None and self._server_task is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._server_task, 30)
        if self.nc is not None:
            await self.nc.close()
        for service in reversed(self.services):
            await service.stop()
