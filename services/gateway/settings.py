"""Gateway settings, from ENGRAM_GATEWAY_* environment variables."""

from __future__ import annotations

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ENGRAM_GATEWAY_", extra="ignore")

    api_key: SecretStr | None = Field(
        None, description="When set, every data endpoint needs it in `x-api-key` or `Authorization: Bearer`; "
        "/healthcheck, /healthz, /readyz, /metrics and the OpenAPI docs stay open.",
    )
    recall_timeout_ms: int = Field(2000, ge=10, le=60_000, description="Recall's time budget for /search and /get-memory.")
    admin_timeout_s: float = Field(30.0, gt=0, description="Wait for graph reads and deletes (episodes, edges, groups).")
    publish_timeout_s: float = Field(5.0, gt=0, description="Wait for JetStream's acknowledgement of each message.")

    @field_validator("api_key")
    @classmethod
    def _empty_is_unset(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value() else None
