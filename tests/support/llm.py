"""The LLM simulator (bench/llm_simulator.py) as the tests use it: engram's real OpenAI-compatible
client pointed at it. The ``sim`` fixture (a simulator on a random loopback port) is in
tests/conftest.py."""

from __future__ import annotations

from typing import Any

from bench.llm_simulator import LLMSimulator
from engram.models.factory import LLMSettings, build_llm


def simulator_client(sim: LLMSimulator, *, timeout_s: float, max_retries: int) -> Any:
    """engram's OpenAI client on the simulator, unthrottled (the tests time faults, not quotas)."""
    return build_llm(LLMSettings(provider="openai", base_url=sim.base_url, model="sim", requests_per_second=1000,
                                 timeout_s=timeout_s, max_retries=max_retries))
