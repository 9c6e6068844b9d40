"""An ASGI app (the gateway's, the MCP server's) under uvicorn on a free loopback port, in the
running event loop: one helper for the benches and the tests that talk to a real socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import uvicorn

from engram.stack.embedded import free_port


@contextlib.asynccontextmanager
async def serve_asgi(asgi: Any) -> AsyncIterator[str]:
    """Serve ``asgi`` (lifespan on, no access log) until the block ends; yields its base URL.
    A start-up failure is raised here."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(asgi, host="127.0.0.1", port=port, log_level="warning",
                                           access_log=False, lifespan="on"))
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:
            if task.done():
                task.result()  # start-up failed: raise it
            await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 30)
