"""Base for LLMClient wrappers (accounting, rate limiting): forward every call to ``inner``."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import ModelSize
from pydantic import BaseModel

Forward = Callable[[], Awaitable[dict[str, Any]]]


def innermost(client: LLMClient) -> LLMClient:
    """The client under every wrapper: what really answers (the offline rules model or a model)."""
    while isinstance(client, DelegatingLLMClient):
        client = client.inner
    return client


class DelegatingLLMClient(LLMClient):
    """Subclasses override :meth:`around` to act before/after the forwarded call."""

    def __init__(self, inner: LLMClient) -> None:
        super().__init__(inner.config, cache=False)
        self.inner = inner
        self.tracer = inner.tracer
        self.token_tracker = inner.token_tracker

    def set_tracer(self, tracer: Any) -> None:
        """Also the wrapped client's: graphiti's own llm.generate span is made there."""
        super().set_tracer(tracer)
        self.inner.set_tracer(tracer)

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
        async def forward() -> dict[str, Any]:
            return await self.inner.generate_response(
                messages, response_model, max_tokens, model_size, group_id, prompt_name, **kwargs
            )

        prompt = prompt_name or (response_model.__name__ if response_model is not None else "unnamed")
        return await self.around(forward, messages, prompt)

    async def around(self, forward: Forward, messages: list[Any], prompt: str) -> dict[str, Any]:
        return await forward()

    async def _generate_response(
        self,
        messages: list[Any],
        response_model: type[BaseModel] | None = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        *,
        model: str | None = None,
    ) -> dict[str, Any]:
        """graphiti's abstract LLMClient method (the subclass contract, see engram/compat.py);
        :meth:`generate_response` never calls it, it forwards through ``inner``'s public call."""
        overrides = {"model": model} if model is not None else {}
        return await self.inner.generate_response(messages, response_model, max_tokens, model_size, **overrides)
