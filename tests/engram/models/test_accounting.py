"""LLM accounting: calls and real-tokenizer token counts per stage and prompt, in Prometheus."""

from __future__ import annotations

from graphiti_core.prompts.models import Message
from prometheus_client import REGISTRY
from pydantic import BaseModel

from engram.models.accounting import AccountingLLMClient
from engram.models.rules_llm import RulesExtractorClient


class Answer(BaseModel):
    text: str = ""


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def test_calls_and_tokens_are_counted_per_prompt() -> None:
    client = AccountingLLMClient(RulesExtractorClient(), stage="test_stage")
    before = sample("engram_llm_calls_total", stage="test_stage", prompt="demo.prompt")
    messages = [Message(role="system", content="You are terse."), Message(role="user", content="hello world " * 50)]
    await client.generate_response(messages, response_model=Answer, prompt_name="demo.prompt")
    await client.generate_response(messages, response_model=Answer, prompt_name="demo.prompt")
    assert client.calls == {"demo.prompt": 2}
    tokens = client.tokens["demo.prompt"]
    assert tokens["input"] >= 2 * 100  # "hello world " x 50 is 100 cl100k tokens, twice
    assert tokens["output"] > 0
    assert sample("engram_llm_calls_total", stage="test_stage", prompt="demo.prompt") == before + 2
    assert sample("engram_llm_tokens_total", stage="test_stage", prompt="demo.prompt", direction="input") >= 200
