"""Gateway settings, from ENGRAM_GATEWAY_* environment variables."""

from __future__ import annotations

import ipaddress

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
    search_all_max_groups: int = Field(
        100, ge=1, le=10_000,
        description="POST /search without group_ids searches every group holding a node (as upstream does), "
        "one recall request per group; with more groups than this it answers 400 and asks for group_ids.",
    )
    idle_timeout_s: float = Field(
        10.0, gt=0, le=86_400,
        description="Sessions written through POST /messages complete their open turn after this many seconds "
        "without a new message (ChatMessage.idle_timeout_s), instead of the turn-detector's 120 s: REST clients "
        "send no session close. A reply posted later than this becomes a turn of its own.",
    )

    retry_window_s: float = Field(
        60.0, ge=1, le=600,
        description="POST /messages without an Idempotency-Key: an identical request (same group and body) within "
        "this many seconds of the first is a retry and stores nothing new; later, its messages without uuid and "
        "timestamp are stored again (\"yes\" said twice). Also the window of MCP add_memory calls without uuid.",
    )

    allow_no_auth: bool = Field(
        False, description="Let the gateway serve without ENGRAM_GATEWAY_API_KEY on a non-loopback ENGRAM_HTTP_HOST "
        "(anyone who reaches the port can read and delete memories). Without it, such a gateway refuses to start.",
    )

    @field_validator("api_key")
    @classmethod
    def _empty_is_unset(cls, value: SecretStr | None) -> SecretStr | None:
        return value if value is not None and value.get_secret_value() else None


def is_loopback(host: str) -> bool:
    """``host`` (an address to bind, or a name) only listens on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def refuse_open_exposure(http_host: str, gateway: GatewaySettings) -> None:
    """Raise when the gateway would serve without an API key on an address others can reach."""
    if gateway.api_key is None and not gateway.allow_no_auth and not is_loopback(http_host):
        raise RuntimeError(
            f"the gateway would serve without an API key on {http_host}: set ENGRAM_GATEWAY_API_KEY, bind "
            "ENGRAM_HTTP_HOST=127.0.0.1, or set ENGRAM_GATEWAY_ALLOW_NO_AUTH=true to serve it open on purpose"
        )
