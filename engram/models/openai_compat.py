"""The OpenAI-compatible LLM client engram builds for ``ENGRAM_LLM_PROVIDER=openai``.

graphiti's ``OpenAIGenericClient`` with four defaults changed for real, often local, models
(llama.cpp / xllamacpp, Ollama, vLLM; measured with Qwen2.5-Coder-1.5B on a single-slot server,
where one edge-extraction call generated > 5,000 tokens and a dedupe call queued for 98 s):

1. **Per-prompt ``max_tokens`` caps** (:data:`PROMPT_MAX_TOKENS`) instead of one global 8,192
   (graphiti itself asks 16,384 for edge extraction): a model that loops stops after a bounded
   number of tokens, i.e. seconds or minutes on a local server, not a quarter of an hour.
   The prompt is graphiti's ``prompt_name`` (or, without one, the prompt its response model
   belongs to). ``ENGRAM_LLM_MAX_TOKENS_BY_PROMPT`` overrides a prompt or a prompt group; a
   prompt with no cap gets ``ENGRAM_LLM_MAX_TOKENS``. A smaller ``max_tokens`` asked by the
   caller is honoured.
2. **``finish_reason=length`` is detected** before the body is parsed (graphiti would see a
   JSONDecodeError and retry the same request four times). The call is retried once with half
   the cap, a stricter instruction and, under ``json_schema``, ``maxItems`` on every list of
   the schema (at temperature 0 the same prompt would loop the same way); if that is cut too,
   :class:`LLMOutputTruncated` is raised. It names its dead-letter reason
   (``llm_output_truncated``): the extractor dead-letters the episode at once instead of
   redelivering a call that fails the same way (engram/runtime/service.py ``retry_or_dead_letter``);
   ``engram dlq replay`` sends it again after the cap is raised.
3. **Structured output**: ``json_schema`` response format where the server supports it,
   ``json_object`` plus the schema in the prompt, or the schema in the prompt alone
   (``ENGRAM_LLM_STRUCTURED_OUTPUT``). ``auto`` (default) starts with ``json_schema`` and, when
   the server refuses a request with 400/422, tries the next mode; the first mode that works
   sticks for the life of the client.
4. **Invalid answers are asked again at once**: an answer that is not JSON, is empty, or does not
   validate against the response model raises :class:`LLMOutputInvalid` (a ``ValueError``), not
   graphiti's ``JSONDecodeError``/``EmptyResponseError``, which graphiti's tenacity policy would
   retry four times with random 5-120 s waits (measured against the simulator: one non-JSON
   answer cost the episode 5.6 s). Instead the call is re-asked once, immediately, with a note
   that the previous answer was not valid JSON for the schema (at temperature 0 the unchanged
   prompt would likely repeat it). Invalid twice: :class:`LLMOutputInvalid` reaches the service,
   which redelivers the message and, at ``max_deliveries``, dead-letters it with reason
   ``llm_output_invalid``. A schema-violating answer used to pass through unvalidated and fail
   later inside graphiti as a bare ``ValidationError`` (dead letter ``processing_failed``).
5. **An unreachable model names itself**: a call that still fails after the SDK's retries (429,
   5xx, 408/409, timeouts, connection errors; plus graphiti's backoff on rate limits) raises
   :class:`LLMUnavailable`, so the dead letter after ``max_deliveries`` says ``llm_unavailable``
   with the cause's type and HTTP status instead of ``processing_failed``.
6. **Timeout**: see ``LLMSettings.timeout_s`` (engram/models/factory.py): 600 s for local base
   URLs, 120 s otherwise. The OpenAI SDK's own retries (429 with Retry-After, 5xx, connection
   errors, timeouts) stay on, as do graphiti's retries of unparsable JSON. Every HTTP request,
   retries included, waits for the deployment's rate limit (engram/models/rate_limit.py, hooks
   on the SDK's HTTP client: :func:`make_sdk_client`).

Accounting: :attr:`OpenAICompatibleClient.stats` (per client, read by bench/extraction_cost.py)
and Prometheus ``engram_llm_truncated_total{prompt,attempt}``,
``engram_llm_request_retries_total{prompt}``, ``engram_llm_failed_calls_total{prompt,error}``,
``engram_llm_structured_output_fallbacks_total{from_mode,to_mode}``,
``engram_llm_invalid_answers_total{prompt,attempt}``. The LLM fault simulator used to test all of
this against the real services is bench/llm_simulator.py (docs/reliability.md, "LLM faults"). Only prompt names, sizes
and exception types are logged: never message content.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import typing
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from typing import Any, Literal
from urllib.parse import urlsplit

import openai
from graphiti_core.llm_client.client import get_extraction_language_instruction
from graphiti_core.llm_client.config import DEFAULT_MAX_TOKENS, LLMConfig, ModelSize
from graphiti_core.llm_client.errors import RateLimitError
from graphiti_core.llm_client.openai_generic_client import OpenAIGenericClient
from graphiti_core.prompts.models import Message
from prometheus_client import Counter
from pydantic import BaseModel, ValidationError

from engram.compat import apply_attribute_extraction_preamble, clean_llm_input, generate_with_retry, strip_code_fences

log = logging.getLogger("engram.llm")

StructuredOutput = Literal["auto", "json_schema", "json_object", "prompt"]
MODES: tuple[str, ...] = ("json_schema", "json_object", "prompt")

# Output caps per graphiti prompt (and engram's summary prompt). How they were chosen: the
# largest output of the offline rules model (cl100k tokens of the JSON answer) on LoCoMo
# conv-26, conv-30 and conv-41, all sessions through engram's extraction, plus conv-26's first
# 10 sessions through upstream per-message add_episode (bench/extraction_cost.py prints the
# per-prompt maxima: "max out"), times 8 for a real model's longer names and facts and for
# denser turns, rounded up to a power of two, at least 512. Measured maxima -> cap:
#   extract_nodes_and_edges.extract_message 327 -> 4096, extract_edges.edge 220 -> 2048,
#   extract_nodes.extract_message 118 -> 1024, extract_edges.extract_timestamps_batch 66 -> 1024,
#   dedupe_nodes.nodes 52 -> 512, dedupe_edges.resolve_edge 19 -> 512,
#   extract_edges.extract_timestamps 12 -> 512.
# Summaries are capped from their prompts' own length limits instead (the rules model writes
# no graphiti summaries): graphiti asks <= 1,000 chars (~250 tokens) per entity; engram's
# summary gate refreshes <= 8 nodes of <= 800 chars per call (8 x 200 tokens + JSON ~ 1,800).
# A 1.5B model looping on the edge prompt passed 5,000 tokens: every cap here stops it sooner.
PROMPT_MAX_TOKENS: dict[str, int] = {
    "extract_nodes_and_edges.extract_message": 4096,
    "extract_edges.edge": 2048,
    "extract_nodes.extract_message": 1024,
    "extract_nodes.extract_text": 1024,
    "extract_nodes.extract_json": 1024,
    "extract_nodes.classify_nodes": 1024,
    "extract_nodes.extract_attributes": 1024,
    "extract_edges.extract_attributes": 1024,
    "extract_edges.extract_timestamps_batch": 1024,
    "extract_edges.extract_timestamps": 512,
    "dedupe_nodes": 512,  # a group name: every dedupe_nodes.* prompt
    "dedupe_edges": 512,
    "extract_nodes.extract_summary": 512,
    "extract_nodes.extract_summaries_batch": 4096,
    "extract_nodes.extract_entity_summaries_from_episodes": 4096,
    "summarize_nodes": 1024,
    "summarize_sagas": 2048,
    "summary_gate.refresh": 2048,
}
RETRY_MAX_ITEMS = 25  # lists in the schema of a retried (truncated) call: a loop cannot outlast it
RETRY_MIN_TOKENS = 256
STRICTER = (
    "\n\nIMPORTANT: your previous answer to this request was cut off at {cap} tokens because it was too "
    "long or repeated itself. Answer again, shorter: at most {items} items in any list, each item once, "
    "short names and facts, and nothing outside the JSON object."
)

REASK = (
    "\n\nIMPORTANT: your previous answer to this request was not a valid JSON object of the requested "
    "format ({problem}). Answer again with only that JSON object: every required field, the right types, "
    "nothing before or after it."
)

LLM_TRUNCATED = Counter(
    "engram_llm_truncated_total",
    "LLM answers cut by max_tokens (finish_reason=length), by prompt and attempt (first|retry).",
    ["prompt", "attempt"],
)
LLM_REQUEST_RETRIES = Counter(
    "engram_llm_request_retries_total",
    "HTTP requests beyond the first of one LLM call (SDK retries, invalid JSON, truncation, format fallback).",
    ["prompt"],
)
LLM_INVALID = Counter(
    "engram_llm_invalid_answers_total",
    "LLM answers that were not JSON, empty, or violated the response model, by prompt and attempt (first|retry).",
    ["prompt", "attempt"],
)
LLM_FAILED = Counter("engram_llm_failed_calls_total", "LLM calls that raised, by prompt and error type.", ["prompt", "error"])
LLM_FALLBACKS = Counter(
    "engram_llm_structured_output_fallbacks_total",
    "Structured-output mode changes after the server refused a mode (auto).",
    ["from_mode", "to_mode"],
)


class LLMOutputTruncated(Exception):
    """The model's answer was cut by ``max_tokens`` (``finish_reason=length``), even on the retry.

    ``dead_letter_reason``: services dead-letter the message at once with this reason (a
    redelivery would repeat the same two capped generations)."""

    dead_letter_reason = "llm_output_truncated"

    def __init__(self, prompt: str, max_tokens: int, attempts: int) -> None:
        self.prompt, self.max_tokens, self.attempts = prompt, max_tokens, attempts
        super().__init__(f"LLM answer to {prompt} cut at max_tokens={max_tokens} (finish_reason=length), "
                         f"{attempts} attempt(s); raise ENGRAM_LLM_MAX_TOKENS_BY_PROMPT for it and replay")


class LLMOutputInvalid(ValueError):
    """The model's answer was not JSON, was empty, or did not validate against the response model.

    ``problem`` names what was wrong (field paths and error types, never the answer's text).
    ``failure_reason``: the dead-letter reason once the message's deliveries are used up (a
    redelivery may meet a model that answers well again, e.g. after a restart or with sampling)."""

    failure_reason = "llm_output_invalid"

    def __init__(self, prompt: str, problem: str, attempts: int = 1) -> None:
        self.prompt, self.problem, self.attempts = prompt, problem, attempts
        super().__init__(f"LLM answer to {prompt} was {problem}, {attempts} attempt(s)")


class LLMUnavailable(Exception):
    """An LLM call failed after the client's own retries: rate limited, server errors, timeouts or
    no connection. ``failure_reason``: the dead-letter reason once the deliveries are used up."""

    failure_reason = "llm_unavailable"

    def __init__(self, prompt: str, cause: BaseException) -> None:
        self.prompt = prompt
        cause = cause.__cause__ if isinstance(cause, RateLimitError) and cause.__cause__ is not None else cause
        status = getattr(cause, "status_code", None)
        self.cause = type(cause).__name__ + (f" (HTTP {status})" if status else "")
        super().__init__(f"LLM call {prompt} failed after the client's retries: {self.cause}")


def is_unavailable(exc: BaseException) -> bool:
    """An error the OpenAI SDK retries itself (and graphiti on rate limits): the model server is
    overloaded, failing or unreachable, not refusing the request."""
    if isinstance(exc, RateLimitError | openai.APIConnectionError):  # APITimeoutError is a connection error
        return True
    status = getattr(exc, "status_code", None)
    return isinstance(exc, openai.APIStatusError) and status is not None and (status >= 500 or status in (408, 409, 429))


def _validation_problem(exc: ValidationError) -> str:
    """Field paths and error types only: pydantic's messages quote the input (the model's text)."""
    errors = exc.errors(include_input=False, include_url=False)
    where = "; ".join(f"{'.'.join(map(str, e['loc'])) or '(root)'}: {e['type']}" for e in errors[:5])
    return f"in violation of the response model ({len(errors)} error(s): {where})"


@dataclass
class CallStats:
    """Per-client counts (one logical call = one generate_response)."""

    calls: int = 0
    failed: int = 0  # raised to the caller
    retried: int = 0  # needed more than one HTTP request
    http_requests: int = 0
    truncated: int = 0  # answers cut by max_tokens, first attempts and retries alike
    truncation_recovered: int = 0  # truncated once, then answered within the tighter cap
    invalid: int = 0  # answers not JSON, empty or violating the response model, first attempts and re-asks alike
    invalid_recovered: int = 0  # invalid once, then valid when asked again
    structured_fallbacks: int = 0
    truncated_by_prompt: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def count_truncation(self, prompt: str) -> None:
        self.truncated += 1
        self.truncated_by_prompt[prompt] = self.truncated_by_prompt.get(prompt, 0) + 1


@dataclass(frozen=True)
class _Attempt:
    mode: str
    strict: bool


_ATTEMPT: ContextVar[_Attempt] = ContextVar("engram_llm_attempt", default=_Attempt("json_schema", False))
_REQUESTS: ContextVar[list[int] | None] = ContextVar("engram_llm_requests", default=None)


async def _count_request(request: Any) -> None:  # httpx event hook: runs in the calling task
    counter = _REQUESTS.get()
    if counter is not None:
        counter[0] += 1


def is_local_url(url: str | None) -> bool:
    """A base URL that points at this machine or a private network: loopback, private and
    link-local addresses, ``localhost``, ``*.local``/``*.internal``/``*.svc`` names and
    single-label names (docker-compose / Kubernetes service names such as ``ollama``)."""
    if not url:
        return False
    host = (urlsplit(url if "://" in url else f"http://{url}").hostname or "").lower()
    if not host:
        return False
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or "." not in host or host.endswith(
            (".localhost", ".local", ".internal", ".svc", ".cluster.local", ".lan", ".home.arpa")
        )
    return ip.is_loopback or ip.is_private or ip.is_link_local


def _prompt_by_model() -> dict[str, str]:
    from graphiti_core.prompts.lib import BUILTIN_PROMPT_SPECS

    by_model: dict[str, str] = {"EntitySummaries": "summary_gate.refresh"}
    for name, spec in BUILTIN_PROMPT_SPECS.items():
        model = getattr(spec, "response_model", None)
        if model is not None:
            by_model.setdefault(model.__name__, name)
    return by_model


_PROMPT_BY_MODEL: dict[str, str] | None = None


def prompt_key(prompt_name: str | None, response_model: type[BaseModel] | None) -> str:
    """graphiti's prompt name; without one, the first graphiti prompt answered by
    ``response_model`` (or the model's name)."""
    global _PROMPT_BY_MODEL
    if prompt_name:
        return prompt_name
    if response_model is None:
        return "unnamed"
    if _PROMPT_BY_MODEL is None:
        _PROMPT_BY_MODEL = _prompt_by_model()
    return _PROMPT_BY_MODEL.get(response_model.__name__, response_model.__name__)


def max_tokens_for(prompt: str, requested: int | None, overrides: dict[str, int], default: int) -> int:
    """The cap for ``prompt``: an override of the prompt or its group, else the table's entry for
    the prompt or its group, else ``default``; never more than a cap the caller asked for."""
    group = prompt.split(".", 1)[0]
    cap = overrides.get(prompt) or overrides.get(group) or PROMPT_MAX_TOKENS.get(prompt) or PROMPT_MAX_TOKENS.get(group)
    cap = cap or default
    return min(cap, requested) if requested else cap


def with_max_items(schema: Any, max_items: int) -> Any:
    """A copy of a JSON schema with ``maxItems`` on every array that has none."""
    if isinstance(schema, dict):
        out = {k: with_max_items(v, max_items) for k, v in schema.items()}
        if out.get("type") == "array" and "maxItems" not in out:
            out["maxItems"] = max_items
        return out
    if isinstance(schema, list):
        return [with_max_items(v, max_items) for v in schema]
    return schema


class OpenAICompatibleClient(OpenAIGenericClient):
    """See the module docstring. ``client`` is an ``openai.AsyncOpenAI`` whose httpx client has
    :func:`_count_request` as a request hook (build it with :func:`make_sdk_client`)."""

    def __init__(
        self,
        config: LLMConfig,
        client: Any,
        *,
        default_max_tokens: int,
        max_tokens_by_prompt: dict[str, int] | None = None,
        structured_output: StructuredOutput = "auto",
        rate_limit: Any = None,
    ) -> None:
        """``rate_limit``: the SharedRateLimiter ``client``'s HTTP requests wait for (kept here to
        be found, e.g. by tests: the waiting is done by the HTTP client's hooks, make_sdk_client)."""
        mode = "json_schema" if structured_output == "auto" else structured_output
        # The parent only knows json_schema/json_object; "prompt" is handled here.
        super().__init__(config, client=client, max_tokens=default_max_tokens,
                         structured_output_mode="json_object" if mode == "prompt" else mode)  # type: ignore[arg-type]
        self.structured_output: StructuredOutput = structured_output
        self.mode = mode
        self.max_tokens_by_prompt = dict(max_tokens_by_prompt or {})
        self.stats = CallStats()
        self.rate_limit = rate_limit

    async def generate_response(  # type: ignore[override]
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
    ) -> dict[str, typing.Any]:
        prompt = prompt_key(prompt_name, response_model)
        cap = max_tokens_for(prompt, max_tokens, self.max_tokens_by_prompt, self.max_tokens)
        apply_attribute_extraction_preamble(self, messages, attribute_extraction)
        messages[0].content += get_extraction_language_instruction(group_id)
        requests = [0]
        token = _REQUESTS.set(requests)
        self.stats.calls += 1
        try:
            with self.tracer.start_span("llm.generate") as span:
                span.add_attributes({"llm.provider": "openai", "model.size": model_size.value,
                                     "max_tokens": cap, "prompt.name": prompt})
                try:
                    return await self._answer(messages, response_model, cap, model_size, model, prompt)
                except Exception as exc:
                    span.set_status("error", type(exc).__name__)
                    self.stats.failed += 1
                    LLM_FAILED.labels(prompt=prompt, error=type(exc).__name__).inc()
                    if is_unavailable(exc):
                        raise LLMUnavailable(prompt, exc) from exc
                    raise
        finally:
            _REQUESTS.reset(token)
            self.stats.http_requests += requests[0]
            if requests[0] > 1:
                self.stats.retried += 1
                LLM_REQUEST_RETRIES.labels(prompt=prompt).inc(requests[0] - 1)

    async def _answer(self, messages: list[Message], response_model: type[BaseModel] | None, cap: int,
                      model_size: ModelSize, model: str | None, prompt: str) -> dict[str, Any]:
        """One call; on ``finish_reason=length`` one stricter retry with half the cap."""
        try:
            return await self._valid_answer(messages, response_model, cap, model_size, model, prompt, strict=False)
        except LLMOutputTruncated:
            self.stats.count_truncation(prompt)
            LLM_TRUNCATED.labels(prompt=prompt, attempt="first").inc()
        tighter = max(cap // 2, min(cap, RETRY_MIN_TOKENS))
        log.warning("LLM answer to %s cut at max_tokens=%d; retrying once with max_tokens=%d and a stricter "
                    "instruction", prompt, cap, tighter)
        retry = [Message(role=m.role, content=m.content) for m in messages]
        retry[0].content += STRICTER.format(cap=cap, items=RETRY_MAX_ITEMS)
        try:
            result = await self._valid_answer(retry, response_model, tighter, model_size, model, prompt, strict=True)
        except LLMOutputTruncated:
            self.stats.count_truncation(prompt)
            LLM_TRUNCATED.labels(prompt=prompt, attempt="retry").inc()
            raise LLMOutputTruncated(prompt, tighter, attempts=2) from None
        self.stats.truncation_recovered += 1
        return result

    async def _valid_answer(self, messages: list[Message], response_model: type[BaseModel] | None, cap: int,
                            model_size: ModelSize, model: str | None, prompt: str, *, strict: bool) -> dict[str, Any]:
        """An answer that parses and validates; an invalid one is asked again once, at once, with a
        note of what was wrong (see the module docstring, 4)."""
        try:
            return await self._in_a_supported_mode(messages, response_model, cap, model_size, model, strict=strict)
        except LLMOutputInvalid as exc:
            self.stats.invalid += 1
            LLM_INVALID.labels(prompt=prompt, attempt="first").inc()
            problem = exc.problem
        log.warning("LLM answer to %s was %s; asking again once", prompt, problem)
        again = [Message(role=m.role, content=m.content) for m in messages]
        again[0].content += REASK.format(problem=problem)
        try:
            result = await self._in_a_supported_mode(again, response_model, cap, model_size, model, strict=strict)
        except LLMOutputInvalid as exc:
            self.stats.invalid += 1
            LLM_INVALID.labels(prompt=prompt, attempt="retry").inc()
            raise LLMOutputInvalid(prompt, exc.problem, attempts=2) from None
        self.stats.invalid_recovered += 1
        return result

    async def _in_a_supported_mode(self, messages: list[Message], response_model: type[BaseModel] | None,
                                   cap: int, model_size: ModelSize, model: str | None, *, strict: bool) -> dict[str, Any]:
        """Asks in the current structured-output mode; under ``auto`` a 400/422 moves on to the
        next mode, and the first one that works becomes the client's mode."""
        start = MODES.index(self.mode)
        modes = MODES[start:] if self.structured_output == "auto" else (self.mode,)
        refused: Exception | None = None
        for mode in modes:
            attempt = [Message(role=m.role, content=m.content) for m in messages]
            if response_model is not None and mode != "json_schema":
                schema = response_model.model_json_schema()
                if strict:
                    schema = with_max_items(schema, RETRY_MAX_ITEMS)
                attempt[-1].content += f"\n\nRespond with a JSON object in the following format:\n\n{json.dumps(schema)}"
            token = _ATTEMPT.set(_Attempt(mode, strict))
            try:
                result = await generate_with_retry(self, attempt, response_model, max_tokens=cap,
                                                   model_size=model_size, model=model)
            except (openai.BadRequestError, openai.UnprocessableEntityError) as exc:
                refused = refused or exc
                if mode != modes[-1]:
                    log.warning("LLM server refused structured output %s (HTTP %s); trying %s",
                                mode, exc.status_code, modes[modes.index(mode) + 1])
                continue
            finally:
                _ATTEMPT.reset(token)
            if mode != self.mode:
                LLM_FALLBACKS.labels(from_mode=self.mode, to_mode=mode).inc()
                self.stats.structured_fallbacks += 1
                log.warning("LLM structured output: using %s from now on (the server refused %s)", mode, self.mode)
                self.mode = mode
            return result
        assert refused is not None
        raise refused

    def _response_format(self, mode: str, response_model: type[BaseModel] | None, strict: bool) -> dict[str, Any] | None:
        if mode == "prompt":
            return None
        if response_model is None or mode == "json_object":
            return {"type": "json_object"}
        schema = response_model.model_json_schema()
        return {"type": "json_schema", "json_schema": {
            "name": response_model.__name__,
            "schema": with_max_items(schema, RETRY_MAX_ITEMS) if strict else schema,
        }}

    async def _generate_response(
        self,
        messages: list[Message],
        response_model: type[BaseModel] | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        model_size: ModelSize = ModelSize.medium,
        *,
        model: str | None = None,
    ) -> dict[str, typing.Any]:
        attempt = _ATTEMPT.get()
        chat = [{"role": m.role, "content": clean_llm_input(self, m.content)} for m in messages if m.role in ("system", "user")]
        kwargs: dict[str, Any] = {}
        response_format = self._response_format(attempt.mode, response_model, attempt.strict)
        if response_format is not None:
            kwargs["response_format"] = response_format
        use_small = model_size == ModelSize.small and self.small_model
        try:
            response = await self.client.chat.completions.create(
                model=model or (self.small_model if use_small else self.model) or "gpt-4.1-mini",
                messages=chat, temperature=self.temperature, max_tokens=max_tokens, **kwargs,
            )
        except openai.RateLimitError as exc:
            raise RateLimitError from exc
        choice = response.choices[0]
        if choice.finish_reason == "length":
            # Checked before parsing: a cut answer is invalid JSON, and graphiti would retry
            # a JSONDecodeError four times with the same cap.
            raise LLMOutputTruncated("?", max_tokens, attempts=1)
        content = choice.message.content or ""
        if not content.strip():
            raise LLMOutputInvalid("?", "empty")
        try:
            answer = json.loads(strip_code_fences(self, content))
        except ValueError:
            raise LLMOutputInvalid("?", "not JSON") from None
        if response_model is not None:
            try:
                response_model.model_validate(answer)
            except ValidationError as exc:
                raise LLMOutputInvalid("?", _validation_problem(exc)) from None
        return answer


def make_sdk_client(*, api_key: str, base_url: str | None, timeout_s: float, max_retries: int,
                    rate_limit: Any = None) -> openai.AsyncOpenAI:
    """The OpenAI SDK client with its own retries and a request counter hook (for ``stats``).
    ``rate_limit``: an engram/models/rate_limit.py SharedRateLimiter every HTTP request waits for
    (retries too: the provider counts them) and that sees every 429."""
    hooks: dict[str, list[Any]] = {"request": [_count_request], "response": []}
    if rate_limit is not None:
        for event, extra in rate_limit.http_hooks().items():
            hooks[event] += extra
    http = openai.DefaultAsyncHttpxClient(event_hooks=hooks)
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, timeout=timeout_s, max_retries=max_retries,
                              http_client=http)


def llm_stats(client: Any) -> CallStats | None:
    """The :class:`CallStats` of the OpenAICompatibleClient inside wrapper clients, if any."""
    while client is not None:
        stats = getattr(client, "stats", None)
        if isinstance(stats, CallStats):
            return stats
        client = getattr(client, "inner", None)
    return None
