"""The ``LLMClient`` graphiti talks to: dispatch on ``response_model.__name__`` to the
handlers in :mod:`.prompts`, and token accounting.

A handler error is logged (without the prompt) and answered with a minimal instance
(``self.failures`` counts them; they should stay 0); a response model with no handler gets a
minimal instance too (``self.unhandled``).

Token accounting: every call appends a :class:`CallRecord` (prompt name, response model,
prompt tokens of all messages as sent, completion tokens of the JSON answer) to
``self.calls`` and feeds graphiti's ``self.token_tracker``. Tokens are counted with
``engram.text.tokens.token_counter()`` (real cl100k via tiktoken, offline) when that
module is importable; otherwise, and when that counter itself falls back, with
``ceil(len(text) / 4)`` (``self.token_counting`` says which).
"""

from __future__ import annotations

import contextvars
import json
import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import DEFAULT_MAX_TOKENS, LLMConfig, ModelSize
from graphiti_core.prompts.models import Message
from pydantic import BaseModel

from engram.models.rules_llm.minimal import minimal_instance
from engram.models.rules_llm.prompts import HANDLERS, Limits
from engram.models.rules_llm.text import MAX_ENTITIES, MAX_ENTITIES_PER_MESSAGE, MAX_FACT_CHARS

logger = logging.getLogger("engram.rules_llm")

CountTokens = Callable[[str], int]



@dataclass(frozen=True)
class CallRecord:
    """One answered call: the graphiti prompt name (when the caller gave one), the response
    model's name, and the tokens a real LLM would have read and written."""

    prompt_name: str | None
    response_model: str | None
    prompt_tokens: int
    completion_tokens: int


_PROMPT_NAME: contextvars.ContextVar[str | None] = contextvars.ContextVar("engram_rules_prompt_name", default=None)


def _estimate_tokens(text: str) -> int:
    return -(-len(text) // 4)


def _default_token_counter() -> tuple[CountTokens, str]:
    try:
        from engram.text.tokens import token_counter

        counter = token_counter()
        if callable(counter):
            name = getattr(counter, "__name__", "")
            return counter, ("cl100k" if name == "count_cl100k" else "chars/4")
    except Exception as exc:  # not importable here, or its set-up failed
        logger.debug("token_counter unavailable (%s); estimating tokens as characters/4", exc)
    return _estimate_tokens, "chars/4"


class RulesExtractorClient(LLMClient):
    """Deterministic, model-free answers to graphiti-core's extraction prompts.

    Not a language model: see the module docstring for what it extracts and its limits.
    ``calls`` lists every answered call with token counts, ``unhandled`` counts response
    models answered with a minimal instance, ``failures`` counts handler errors (answered
    with a minimal instance too; they should stay 0).
    """

    MODEL_NAME = "engram-rules-extractor"

    def __init__(
        self,
        config: LLMConfig | None = None,
        cache: bool = False,
        *,
        max_entities_per_message: int = MAX_ENTITIES_PER_MESSAGE,
        max_entities: int = MAX_ENTITIES,
        max_fact_chars: int = MAX_FACT_CHARS,
        count_tokens: CountTokens | None = None,
    ) -> None:
        if config is None:
            config = LLMConfig(model=self.MODEL_NAME, small_model=self.MODEL_NAME, temperature=0)
        super().__init__(config, cache)
        self.max_entities_per_message = max_entities_per_message
        self.max_entities = max_entities
        self.max_fact_chars = max_fact_chars
        self.calls: list[CallRecord] = []
        self.unhandled: Counter[str] = Counter()
        self.failures: Counter[str] = Counter()
        self._count_tokens = count_tokens
        self.token_counting = "custom" if count_tokens is not None else "unset"

    # -- LLMClient --------------------------------------------------------------------------
    async def generate_response(
        self,
        messages: list[Message],
        response_model: type[BaseModel] | None = None,
        max_tokens: int | None = None,
        model_size: ModelSize = ModelSize.medium,
        group_id: str | None = None,
        prompt_name: str | None = None,
        *,
        attribute_extraction: bool = False,
        model: str | None = None,
    ) -> dict[str, Any]:
        # remember the prompt name for the CallRecord: the base class does not pass it down
        token = _PROMPT_NAME.set(prompt_name)
        try:
            return await super().generate_response(
                messages,
                response_model=response_model,
                max_tokens=max_tokens,
                model_size=model_size,
                group_id=group_id,
                prompt_name=prompt_name,
                attribute_extraction=attribute_extraction,
                model=model,
            )
        finally:
            _PROMPT_NAME.reset(token)

    async def _generate_response(
        self,
        messages: list[Message],
        response_model: type[BaseModel] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        model_size: ModelSize = ModelSize.medium,
        *,
        model: str | None = None,
    ) -> dict[str, Any]:
        result = self.respond(messages, response_model)
        counter = self._counter()
        prompt_tokens = sum(counter(m.content) for m in messages)
        completion_tokens = counter(json.dumps(result, ensure_ascii=False))
        prompt_name = _PROMPT_NAME.get()
        self.calls.append(CallRecord(prompt_name, response_model.__name__ if response_model else None, prompt_tokens, completion_tokens))
        self.token_tracker.record(prompt_name or (response_model.__name__ if response_model else None), prompt_tokens, completion_tokens)
        return result

    def _counter(self) -> CountTokens:
        if self._count_tokens is None:
            self._count_tokens, self.token_counting = _default_token_counter()
        return self._count_tokens

    # -- dispatch -----------------------------------------------------------------------------
    def respond(self, messages: list[Message], response_model: type[BaseModel] | None) -> dict[str, Any]:
        """The answer to one prompt (synchronous; no bookkeeping of tokens)."""
        name = response_model.__name__ if response_model is not None else None
        handler = HANDLERS.get(name or "")
        if response_model is None or handler is None:
            self.unhandled[name or "None"] += 1
            return minimal_instance(response_model) if response_model is not None else {}
        prompt = "\n".join(m.content for m in messages if m.role != "system") or "\n".join(m.content for m in messages)
        try:
            data = handler(prompt, Limits(self.max_entities_per_message, self.max_entities, self.max_fact_chars))
            return response_model.model_validate(data).model_dump(mode="json")
        except Exception:
            logger.exception("rules extractor failed on %s; answering with an empty instance", name)
            self.failures[name or "None"] += 1
            return minimal_instance(response_model)
