"""MCP server settings, from ENGRAM_MCP_* environment variables."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class McpSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_MCP_", extra="ignore")

    api_key: SecretStr | None = Field(
        None, description="When set, the MCP server's streamable HTTP endpoint (/mcp) needs it in `x-api-key` or "
        "`Authorization: Bearer`; /healthz, /readyz and /metrics stay open. stdio needs none (the host starts it).",
    )
    allow_no_auth: bool = Field(
        False, description="Let the MCP server serve HTTP without ENGRAM_MCP_API_KEY on a non-loopback "
        "ENGRAM_HTTP_HOST (anyone who reaches the port can read and delete memories). Without it, it refuses to start.",
    )
    recall_timeout_ms: int = Field(2000, ge=10, le=60_000, description="Recall's time budget for search_memory_facts and search_nodes.")
    admin_timeout_s: float = Field(30.0, gt=0, description="Wait for graph reads and deletes and the sessions service's answers.")
    publish_timeout_s: float = Field(5.0, gt=0, description="Wait for JetStream's acknowledgement of add_memory and promote.")
    idle_timeout_s: float = Field(
        10.0, gt=0, le=86_400,
        description="A message added with add_memory(source='message') completes its open turn after this many seconds "
        "without a new message in that group (ChatMessage.idle_timeout_s), as the gateway's REST messages do.",
    )

    retry_window_s: float = Field(
        60.0, ge=1, le=600,
        description="add_memory without uuid: an identical call (same group and arguments) within this many seconds "
        "of the first is a retry and stores nothing new; later, the same words are a new memory.",
    )

    @field_validator("api_key")
    @classmethod
    def _empty_is_unset(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value() else None
