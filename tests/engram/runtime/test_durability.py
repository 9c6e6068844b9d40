"""Acknowledged means on disk (issue 16 item 6): every deployment runs JetStream with
``sync_interval: always`` and FalkorDB with ``appendfsync always``, and the embedded servers
really run that way (read back from the running processes, not from our own config text)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import urllib.request
from pathlib import Path

import pytest
import yaml

from engram.stack.embedded import nats_config, nats_server_binary, start_falkordb, start_nats
from engram.settings import EngramSettings

ROOT = Path(__file__).resolve().parents[3]


def jetstream_config(proc) -> dict:  # noqa: ANN001
    with urllib.request.urlopen(f"{proc.extra['monitoring_url']}/varz", timeout=5) as resp:
        return json.load(resp)["jetstream"]["config"]


def redis_config_get(url: str, key: str) -> str:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"*3\r\n$6\r\nCONFIG\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key.encode()))
        reply = s.recv(256).decode()
    return reply.split("\r\n")[-2]  # *2 $len key $len value


def test_the_embedded_nats_server_fsyncs_before_each_ack(tmp_path: Path) -> None:
    proc = start_nats(tmp_path)
    try:
        assert jetstream_config(proc).get("sync_always") is True
    finally:
        proc.stop()


def test_the_sync_interval_is_a_setting(tmp_path: Path) -> None:
    proc = start_nats(tmp_path, sync_interval="2m")
    try:
        config = jetstream_config(proc)
        assert not config.get("sync_always")
        assert config["sync_interval"] == 120 * 10**9
    finally:
        proc.stop()
    assert EngramSettings().nats_sync_interval == "always"
    with pytest.raises(ValueError):
        EngramSettings(nats_sync_interval="sometimes")
    with pytest.raises(ValueError):
        nats_config(tmp_path, sync_interval="always }\nauthorization {")


def test_an_included_config_is_resolved_from_the_generated_one(tmp_path: Path) -> None:
    """The authorization block engram up includes lives in another directory than the generated
    config; nats-server resolves includes relative to the including file."""
    other = tmp_path / "auth"
    other.mkdir()
    (other / "a.conf").write_text("max_payload: 65536\n")
    proc = start_nats(tmp_path / "data", config=other / "a.conf")
    try:
        with urllib.request.urlopen(f"{proc.extra['monitoring_url']}/varz", timeout=5) as resp:
            assert json.load(resp)["max_payload"] == 65536
        assert jetstream_config(proc).get("sync_always") is True
    finally:
        proc.stop()


def test_the_embedded_falkordb_fsyncs_every_write(tmp_path: Path) -> None:
    proc = start_falkordb(tmp_path)
    try:
        assert redis_config_get(proc.url, "appendonly") == "yes"
        assert redis_config_get(proc.url, "appendfsync") == "always"
    finally:
        proc.stop()
    relaxed = start_falkordb(tmp_path / "relaxed", appendfsync="everysec")
    try:
        assert redis_config_get(relaxed.url, "appendfsync") == "everysec"
    finally:
        relaxed.stop()


def test_compose_and_k8s_run_durable_servers(monkeypatch: pytest.MonkeyPatch) -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    nats_conf = (ROOT / "deploy" / "nats" / "nats.conf").read_text()
    assert re.search(r"^\s*sync_interval:\s*always\s*$", nats_conf, re.M)
    assert "/etc/nats/nats.conf" in compose["nats"]["command"]
    assert "--appendfsync always" in compose["falkordb"]["environment"]["REDIS_ARGS"]
    k8s = (ROOT / "deploy" / "k8s" / "nats" / "nats.yaml").read_text()
    assert re.search(r"^\s*sync_interval:\s*always\s*$", k8s, re.M)
    # the compose config is valid for nats-server itself (with the passwords it reads)
    for name in re.findall(r"\$(ENGRAM_NATS_PASSWORD_\w+)", (ROOT / "deploy" / "nats" / "auth.conf").read_text()):
        monkeypatch.setenv(name, "x" * 24)
    out = subprocess.run([nats_server_binary(), "-t", "-c", str(ROOT / "deploy" / "nats" / "nats.conf")],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr[-2000:]
