"""LLM call and token accounting, always on: a wrapper around any graphiti LLMClient.

Counts every call by stage and graphiti prompt name in Prometheus
(``engram_llm_calls_total{stage,prompt}``, ``engram_llm_tokens_total{stage,prompt,direction}``)
and per wrapper instance (``calls`` / ``tokens``, used for per-episode accounting).

Tokens are counted with a real cl100k tokenizer (offline, see engram/text/tokens.py):
input = the text of the messages graphiti built (including the JSON schema graphiti's base client
appends for non-OpenAI clients), output = the JSON of the structured response. Providers that
report usage themselves may differ by a few tokens of chat framing.
"""

from __future__ import annotations

import json
from contextvars import ContextVar
from typing import Any

from opentelemetry import trace

from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import ModelSize
from pydantic import BaseModel
from prometheus_client import Counter, Histogram

from engram.models.delegating import DelegatingLLMClient, Forward
from engram.observability.graphiti_tracing import llm_span
from engram.text.tokens import token_counter

LLM_CALLS = Counter("engram_llm_calls_total", "LLM calls by pipeline stage and graphiti prompt.", ["stage", "prompt"])
LLM_TOKENS = Counter(
    "engram_llm_tokens_total", "LLM tokens by stage, prompt and direction (input|output).",
    ["stage", "prompt", "direction"],
)
LLM_SECONDS = Histogram(
    "engram_llm_call_seconds", "LLM call latency by stage.", ["stage"],
    buckets=(0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
)

_CALL_SPAN: ContextVar[Any] = ContextVar("engram_llm_call_span", default=None)  # the call's span, for its token counts


class AccountingLLMClient(DelegatingLLMClient):
    """Delegates every call to ``inner`` and accounts for it."""

    def __init__(self, inner: LLMClient, stage: str) -> None:
        super().__init__(inner)
        self.stage = stage
        self.calls: dict[str, int] = {}
        self.tokens: dict[str, dict[str, int]] = {}
        self.max_output: dict[str, int] = {}  # largest answer per prompt (how the max_tokens caps were chosen)
        self._count = token_counter()

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
        """One ``engram.llm.call`` span per call when tracing is on (engram/observability/tracing.py): stage,
        prompt name, model and token counts; never the prompt or the answer."""
        prompt = prompt_name or (response_model.__name__ if response_model is not None else "unnamed")
        model = kwargs.get("model") or (self.config.small_model if model_size == ModelSize.small else self.config.model)
        innermost = self.inner
        while isinstance(innermost, DelegatingLLMClient):
            innermost = innermost.inner
        attributes = {"engram.stage": self.stage, "prompt.name": prompt, "llm.model": model,
                      "model.size": model_size.value, "llm.client": type(innermost).__name__}
        with llm_span(self.tracer, attributes) as span:
            token = _CALL_SPAN.set(span)
            try:
                return await super().generate_response(messages, response_model, max_tokens, model_size, group_id,
                                                       prompt_name, **kwargs)
            except Exception as exc:
                if span is not None:
                    span.set_attribute("exception.type", type(exc).__name__)
                    span.set_status(trace.StatusCode.ERROR)
                raise
            finally:
                _CALL_SPAN.reset(token)

    async def around(self, forward: Forward, messages: list[Any], prompt: str) -> dict[str, Any]:
        span = _CALL_SPAN.get()
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
        if span is not None:
            span.set_attributes({"llm.tokens.input": n_in, "llm.tokens.output": n_out})
        return response
