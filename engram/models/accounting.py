"""LLM call and token accounting, always on: a wrapper around any graphiti LLMClient.

Counts every call by stage and graphiti prompt name in Prometheus
(``engram_llm_calls_total{stage,prompt}``, ``engram_llm_tokens_total{stage,prompt,direction}``)
and per wrapper instance (``calls`` / ``tokens``, used for per-episode accounting).

Tokens are counted with a real cl100k tokenizer (offline, see engram/tokens.py):
input = the text of the messages graphiti built (including the JSON schema graphiti's base client
appends for non-OpenAI clients), output = the JSON of the structured response. Providers that
report usage themselves may differ by a few tokens of chat framing.
"""

from __future__ import annotations

import json
from typing import Any

from graphiti_core.llm_client.client import LLMClient
from prometheus_client import Counter, Histogram

from engram.models.delegating import DelegatingLLMClient, Forward
from engram.tokens import token_counter

LLM_CALLS = Counter("engram_llm_calls_total", "LLM calls by pipeline stage and graphiti prompt.", ["stage", "prompt"])
LLM_TOKENS = Counter(
    "engram_llm_tokens_total", "LLM tokens by stage, prompt and direction (input|output).",
    ["stage", "prompt", "direction"],
)
LLM_SECONDS = Histogram(
    "engram_llm_call_seconds", "LLM call latency by stage.", ["stage"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)


class AccountingLLMClient(DelegatingLLMClient):
    """Delegates every call to ``inner`` and accounts for it."""

    def __init__(self, inner: LLMClient, stage: str) -> None:
        super().__init__(inner)
        self.stage = stage
        self.calls: dict[str, int] = {}
        self.tokens: dict[str, dict[str, int]] = {}
        self.max_output: dict[str, int] = {}  # largest answer per prompt (how the max_tokens caps were chosen)
        self._count = token_counter()

    async def around(self, forward: Forward, messages: list[Any], prompt: str) -> dict[str, Any]:
        with LLM_SECONDS.labels(stage=self.stage).time():
            response = await forward()
        n_in = self._count("\n".join(str(getattr(m, "content", m)) for m in messages))
        n_out = self._count(json.dumps(response, default=str))
        self.calls[prompt] = self.calls.get(prompt, 0) + 1
        per = self.tokens.setdefault(prompt, {"input": 0, "output": 0})
        per["input"] += n_in
        per["output"] += n_out
        self.max_output[prompt] = max(self.max_output.get(prompt, 0), n_out)
        LLM_CALLS.labels(stage=self.stage, prompt=prompt).inc()
        LLM_TOKENS.labels(stage=self.stage, prompt=prompt, direction="input").inc(n_in)
        LLM_TOKENS.labels(stage=self.stage, prompt=prompt, direction="output").inc(n_out)
        return response
