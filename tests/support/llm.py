"""The LLM simulator (bench/llm_simulator.py) as the tests use it: engram's real OpenAI-compatible
client pointed at it. The ``sim`` fixture (a simulator on a random loopback port) is in
tests/conftest.py."""

from __future__ import annotations

from typing import Any

from bench.llm_simulator import LLMSimulator
from engram.models.delegating import DelegatingLLMClient, Forward
from engram.models.factory import LLMSettings, build_llm
from engram.models.rules_llm import RulesExtractorClient


def simulator_client(sim: LLMSimulator, *, timeout_s: float, max_retries: int) -> Any:
    """engram's OpenAI client on the simulator, unthrottled (the tests time faults, not quotas)."""
    return build_llm(LLMSettings(provider="openai", base_url=sim.base_url, model="sim", requests_per_second=1000,
                                 timeout_s=timeout_s, max_retries=max_retries))


class RecordingLLMClient(DelegatingLLMClient):
    """The offline rules model, recording every prompt it is sent: ``prompts`` holds
    (graphiti prompt name, [message contents]) in call order. For tests of what reaches the model."""

    def __init__(self, inner: Any = None) -> None:
        super().__init__(inner or RulesExtractorClient())
        self.prompts: list[tuple[str, list[str]]] = []

    async def around(self, forward: Forward, messages: list[Any], prompt: str) -> dict[str, Any]:
        self.prompts.append((prompt, [m.content for m in messages]))
        return await forward()

    def extraction_prompts(self) -> list[str]:
        """The user messages of graphiti's extraction prompts (those taking custom instructions)."""
        from engram.services.extractor.preprocessing import EXTRACTION_PROMPTS

        return [contents[-1] for name, contents in self.prompts if name in EXTRACTION_PROMPTS]
