"""LLM call and token accounting, always on: a wrapper around any graphiti LLMClient.

Counts every call by stage and graphiti prompt name in Prometheus
(``engram_llm_calls_total{stage,prompt}``, ``engram_llm_tokens_total{stage,prompt,direction}``)
and per wrapper instance (``calls`` / ``tokens``, used for per-episode accounting).

Tokens are counted with a real cl100k tokenizer (offline, see services/extractor/chunking.py):
input = the text of the messages graphiti built (including the JSON schema graphiti's base client
appends for non-OpenAI clients), output = the JSON of the structured response. Providers that
report usage themselves may differ by a few tokens of chat framing.
"""

from __future__ import annotations

import json
from typing import Any

from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import ModelSize
from prometheus_client import Counter, Histogram
from pydantic import BaseModel

LLM_CALLS = Counter("engram_llm_calls_total", "LLM calls by pipeline stage and graphiti prompt.", ["stage", "prompt"])
LLM_TOKENS = Counter(
    "engram_llm_tokens_total", "LLM tokens by stage, prompt and direction (input|output).",
    ["stage", "prompt", "direction"],
)
LLM_SECONDS = Histogram(
    "engram_llm_call_seconds", "LLM call latency by stage.", ["stage"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)


def _count_tokens() -> Any:
    from services.extractor.chunking import token_counter

    return token_counter()


class AccountingLLMClient(LLMClient):
    """Delegates every call to ``inner`` and accounts for it; holds no other state."""

    def __init__(self, inner: LLMClient, stage: str) -> None:
        super().__init__(inner.config, cache=False)
        self.inner = inner
        self.stage = stage
        self.tracer = inner.tracer
        self.token_tracker = inner.token_tracker
        self.calls: dict[str, int] = {}
        self.tokens: dict[str, dict[str, int]] = {}
        self._count = _count_tokens()

    async def generate_response(  # type: ignore[override]
        self,
        messages: list[Any],
        response_model: type[BaseModel] | None = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        group_id: str | None = None,
        prompt_name: str | None = None,
        **kwargs: Any,
    ) -> dict[str, Any]:
        prompt = prompt_name or (response_model.__name__ if response_model is not None else "unnamed")
        with LLM_SECONDS.labels(stage=self.stage).time():
            response = await self.inner.generate_response(
                messages, response_model, max_tokens, model_size, group_id, prompt_name, **kwargs
            )
        n_in = self._count("\n".join(str(getattr(m, "content", m)) for m in messages))
        n_out = self._count(json.dumps(response, default=str))
        self.calls[prompt] = self.calls.get(prompt, 0) + 1
        per = self.tokens.setdefault(prompt, {"input": 0, "output": 0})
        per["input"] += n_in
        per["output"] += n_out
        LLM_CALLS.labels(stage=self.stage, prompt=prompt).inc()
        LLM_TOKENS.labels(stage=self.stage, prompt=prompt, direction="input").inc(n_in)
        LLM_TOKENS.labels(stage=self.stage, prompt=prompt, direction="output").inc(n_out)
        return response

    async def _generate_response(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # pragma: no cover
        return await self.inner._generate_response(*args, **kwargs)  # noqa: SLF001
