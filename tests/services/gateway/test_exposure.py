"""The gateway refuses to serve without an API key on an address other machines can reach."""

from __future__ import annotations

import pytest

from engram.settings import EngramSettings
from engram.services.gateway import app as gw_app
from engram.services.gateway.settings import GatewaySettings, is_loopback


def _settings(host: str) -> EngramSettings:
    return EngramSettings(nats_url="nats://127.0.0.1:1", http_host=host)  # build() does not connect


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "gateway.internal"])
def test_no_key_on_a_reachable_address_refuses_to_start(host: str) -> None:
    with pytest.raises(RuntimeError, match="ENGRAM_GATEWAY_API_KEY"):
        gw_app.build(_settings(host), GatewaySettings(api_key=None))


@pytest.mark.parametrize("gateway", [GatewaySettings(api_key="k3y"), GatewaySettings(allow_no_auth=True)])
def test_a_key_or_an_explicit_allow_starts_it(gateway: GatewaySettings) -> None:
    assert gw_app.build(_settings("0.0.0.0"), gateway).name == "gateway"


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_needs_no_key(host: str) -> None:
    assert is_loopback(host)
    assert gw_app.build(_settings(host), GatewaySettings(api_key=None)).name == "gateway"


def test_the_allow_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENGRAM_GATEWAY_ALLOW_NO_AUTH", "true")
    assert GatewaySettings().allow_no_auth
