"""Least privilege on NATS (engram/runtime/auth.py) against a real nats-server started with the generated
authorization config: each service user can use only its own subjects, anonymous clients are
refused. The whole pipeline under auth is tested through `engram up` (test_up_with_auth below)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import pytest

from engram.runtime import auth
from engram.stack.embedded import ManagedProcess, start_nats
from engram.settings import EngramSettings
from engram.runtime.topology import Topology, ensure_topology
from engram.schemas import subjects


def test_permissions_come_from_the_contract_and_the_topology() -> None:
    settings = EngramSettings(partitions=3)
    extractor = auth.permissions_for("extractor", settings)
    assert "engram.delta.*" in extractor["publish"]["allow"]
    # one shared durable whatever the partitions: per-group order lives in engram/runtime/group_order.py
    assert [s for s in extractor["publish"]["allow"] if s.startswith("$JS.API.CONSUMER.MSG.NEXT.")] == [
        "$JS.API.CONSUMER.MSG.NEXT.ENGRAM_EPISODES.extractor"]
    assert f"$KV.{subjects.KV_GROUP_ORDER}.>" in extractor["publish"]["allow"]
    publishers_of = {svc: auth.permissions_for(svc, settings)["publish"]["allow"] for svc in auth.USERS}
    assert [svc for svc, allowed in publishers_of.items() if subjects.GRAPH_GROUP_DELETE in allowed] == ["gateway", "mcp"]
    assert sorted(svc for svc, allowed in publishers_of.items() if "engram.in.message.*" in allowed) == [
        "gateway", "mcp", "publisher"]
    # nobody but the admin may create or delete streams
    for allowed in publishers_of.values():
        assert not [s for s in allowed if ".STREAM.CREATE" in s or ".STREAM.DELETE" in s or ".STREAM.UPDATE" in s]
    with pytest.raises(ValueError, match="unknown service"):
        auth.permissions_for("mallory")


def test_the_compose_config_is_generated() -> None:
    assert auth.main(["--check"]) == 0, "regenerate with `python -m engram.runtime.auth`"
    assert "$ENGRAM_NATS_PASSWORD_EXTRACTOR" in auth.COMPOSE_CONF.read_text()


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ManagedProcess, dict[str, str]]]:
    data = tmp_path_factory.mktemp("nats-auth")
    config = auth.write_embedded_conf(data, EngramSettings())
    assert config.stat().st_mode & 0o777 == 0o600
    assert auth.passwords_file(data).stat().st_mode & 0o777 == 0o600
    assert (data / "auth").stat().st_mode & 0o777 == 0o700
    proc = start_nats(data, config=config)
    yield proc, auth.embedded_passwords(data)
    proc.stop()


class Client:
    """A connection as one user, collecting the server's permission errors."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.nc: nats.NATS | None = None

    async def connect(self, url: str, user: str, password: str, **options: str) -> "Client":
        async def on_error(exc: Exception) -> None:
            self.errors.append(str(exc))

        self.nc = await nats.connect(url, user=user, password=password, error_cb=on_error,
                                     allow_reconnect=False, connect_timeout=2, **options)
        return self


async def _as(proc: ManagedProcess, passwords: dict[str, str], who: str) -> Client:
    if who == "admin":
        return await Client().connect(proc.url, auth.ADMIN_USER, passwords[who])
    # as the services connect: their own inbox prefix (the only inboxes they may subscribe to)
    options = {"inbox_prefix": auth.inbox_prefix(who)} if who in auth.SERVICES else {}
    return await Client().connect(proc.url, auth.user_name(who), passwords[who], **options)


async def _eventually(condition, timeout: float = 10.0) -> None:  # noqa: ANN001
    """Wait for an asynchronous error callback (the server's -ERR reaches the client on its own)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def _received(admin: Client, subject: str, publisher: Client, publish_to: str) -> list[bytes]:
    """What the admin receives on ``subject`` when ``publisher`` publishes to ``publish_to``. The
    publisher then publishes a marker on its own output subject: NATS keeps one connection's order,
    so once the marker is in, anything the first publish delivered is in too (no sleeping)."""
    marker_subject = subjects.delta("marker")
    # Neither subscription has a callback: nats-py runs each callback subscription in its own task,
    # so a marker's callback could run before the payload's. The client's reader queues messages in
    # the order the server sent them, so once the marker is queued, so is the payload.
    sub = await admin.nc.subscribe(subject)
    marker_sub = await admin.nc.subscribe(marker_subject)
    await admin.nc.flush()
    await publisher.nc.publish(publish_to, b"payload")
    # The marker again every second until it arrives: a marker sent right after a refused publish
    # was sometimes never delivered (1 run in 4; the server's -ERR and the next PUB cross), and a
    # later marker on the same connection still follows the first publish.
    for attempt in range(11):
        await publisher.nc.publish(marker_subject, b"marker")
        await publisher.nc.flush()
        try:
            await marker_sub.next_msg(timeout=1.0)
            break
        except nats.errors.TimeoutError:
            assert attempt < 10, f"the marker never arrived after a publish to {publish_to}"
    got: list[bytes] = []
    while sub.pending_msgs:
        got.append((await sub.next_msg(timeout=1.0)).data)
    for s in (sub, marker_sub):
        await s.unsubscribe()
    return got


async def _delivered(admin: Client, subject: str, publisher: Client, publish_to: str, tries: int = 3) -> list[bytes]:
    """:func:`_received` for an allowed publish, published again (up to ``tries``) when it did not
    arrive: in 2 full-suite CI runs the first allowed publish of this module never reached the
    admin though the marker after it did (not reproduced alone in 15 runs; cause not found). Core
    NATS delivers at most once; what is checked is that an allowed publish is delivered and a
    refused one never is."""
    for _ in range(tries):
        got = await _received(admin, subject, publisher, publish_to)
        if got:
            return got
    return []


async def test_a_service_cannot_publish_outside_its_subjects(secured_nats) -> None:  # noqa: ANN001
    proc, passwords = secured_nats
    admin = await _as(proc, passwords, "admin")
    extractor = await _as(proc, passwords, "extractor")
    try:
        # its own output goes through ...
        assert await _delivered(admin, "engram.delta.g1", extractor, "engram.delta.g1") == [b"payload"], (
            extractor.errors, admin.errors)
        # ... a group delete or a forged chat message does not
        for forbidden in (subjects.GRAPH_GROUP_DELETE, subjects.in_message("x"), subjects.episode("g1"),
                          subjects.CTL_FORGET_SESSIONS):
            assert await _received(admin, forbidden, extractor, forbidden) == []
            await _eventually(lambda: f'nats: permissions violation for publish to "{forbidden}"' in extractor.errors)
        # nor can it listen to what others are asked, or to replies meant for others
        for eavesdrop in (subjects.RECALL, "_INBOX.>", f"{auth.inbox_prefix('gateway')}.>"):
            await extractor.nc.subscribe(eavesdrop)
            await extractor.nc.flush()
            await _eventually(lambda: any(
                "permissions violation for subscription" in e and eavesdrop.lower() in e.lower()
                for e in extractor.errors))
            assert any("permissions violation for subscription" in e and eavesdrop.lower() in e.lower()
                       for e in extractor.errors), (
                eavesdrop, extractor.errors)
    finally:
        await extractor.nc.close()
        await admin.nc.close()


async def test_jetstream_rights_are_per_stream_and_durable(secured_nats) -> None:  # noqa: ANN001
    proc, passwords = secured_nats
    admin = await _as(proc, passwords, "admin")
    await ensure_topology(admin.nc.jetstream(), Topology.from_settings(EngramSettings()))
    detector = await _as(proc, passwords, "turn-detector")
    extractor = await _as(proc, passwords, "extractor")
    try:
        ack = await detector.nc.jetstream().publish(subjects.episode("g1"), b"{}", stream=subjects.STREAM_EPISODES)
        assert ack.stream == subjects.STREAM_EPISODES
        js = extractor.nc.jetstream(timeout=1.0)
        # its own durable: pull the episode and ack it
        psub = await js.pull_subscribe_bind(Topology.EXTRACTOR_DURABLE, stream=subjects.STREAM_EPISODES)
        [msg] = await psub.fetch(1, timeout=2)
        await msg.ack_sync()
        # its group order: read the episode again by subject, keep the group's record
        again = await js.get_msg(subjects.STREAM_EPISODES, seq=1, subject="engram.episode.*.g1", next=True)
        assert again.seq == ack.seq
        kv = await js.key_value(subjects.KV_GROUP_ORDER)
        await kv.create("extractor.g.g1", b"{}")
        # not the turn-detector's input, not a new stream, not another service's durable
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.get_msg(subjects.STREAM_IN, seq=1)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.add_stream(name="STOLEN", subjects=["stolen.>"])
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.consumer_info(subjects.STREAM_IN, "turn_detector_p0")
        assert any("$js.api.stream.create.stolen" in e.lower() for e in extractor.errors), extractor.errors
    finally:
        for c in (detector, extractor, admin):
            await c.nc.close()


async def test_request_reply_only_between_the_allowed_users(secured_nats) -> None:  # noqa: ANN001
    """The gateway may ask recall to delete a group and recall may answer it (allow_responses);
    the sessions service may ask recall to recall, but not to delete."""
    proc, passwords = secured_nats
    recall = await _as(proc, passwords, "recall")
    gateway = await _as(proc, passwords, "gateway")
    sessions = await _as(proc, passwords, "sessions")
    try:
        async def answer(msg) -> None:  # noqa: ANN001
            await msg.respond(b"done")

        for subject in (subjects.GRAPH_GROUP_DELETE, subjects.RECALL):
            await recall.nc.subscribe(subject, cb=answer)
        await recall.nc.flush()
        assert (await gateway.nc.request(subjects.GRAPH_GROUP_DELETE, b"{}", timeout=10)).data == b"done"
        assert (await sessions.nc.request(subjects.RECALL, b"{}", timeout=10)).data == b"done"
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await sessions.nc.request(subjects.GRAPH_GROUP_DELETE, b"{}", timeout=1)
        assert not recall.errors and not gateway.errors
    finally:
        for c in (recall, gateway, sessions):
            await c.nc.close()


async def test_anonymous_and_wrong_password_are_refused(secured_nats) -> None:  # noqa: ANN001
    proc, passwords = secured_nats
    for options in ({}, {"user": auth.user_name("extractor"), "password": passwords["extractor"] + "x"},
                    {"user": auth.user_name("extractor"), "password": passwords["recall"]}):
        with pytest.raises((nats.errors.Error, OSError)):
            nc = await nats.connect(proc.url, allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0,
                                    **options)
            await nc.close()


def test_passwords_are_kept_across_restarts(tmp_path: Path) -> None:
    first = auth.embedded_passwords(tmp_path)
    assert auth.embedded_passwords(tmp_path) == first
    assert len(set(first.values())) == len(first)  # one secret each
    assert json.loads(auth.passwords_file(tmp_path).read_text()) == first


# --- the whole pipeline under auth: `engram up` ----------------------------------------------------
@pytest.mark.slow
def test_up_runs_every_service_as_its_own_user(tmp_path: Path) -> None:
    """`engram up` (auth on by default): every service connects as its user, a chat turn goes through
    turn-detector, extractor, summary-gate and recall, the gateway's writes and group delete and the
    sessions service's notes work, `engram doctor --smoke` passes, and the server logs no permission
    violation. Anonymous clients of NATS and FalkorDB are refused; no password reaches a log."""
    import subprocess
    import sys
    import time
    import urllib.request

    from engram.stack.embedded import redis_ping
    from tests.engram.cli.test_cli_up import Up, run

    data = tmp_path / "engram"
    up = Up(data)
    try:
        rt = up.runtime
        assert rt["nats_auth"] and rt["graph_auth"]
        passwords = json.loads(Path(rt["auth_file"]).read_text())
        assert not [who for who, secret in passwords.items() if secret in json.dumps(rt)]
        for path in (data / "auth").iterdir():
            assert path.stat().st_mode & 0o777 == 0o600, path

        async def connections() -> dict[str, str]:
            with urllib.request.urlopen(f"{rt['nats_monitoring_url']}/connz?auth=true", timeout=5) as resp:
                return {c.get("name"): c.get("authorized_user") for c in json.load(resp)["connections"]}

        assert asyncio.run(connections()) == {f"engram-{s}": f"engram-{s}" for s in auth.SERVICES}
        with pytest.raises((nats.errors.Error, OSError)):
            asyncio.run(nats.connect(rt["nats_url"], allow_reconnect=False, connect_timeout=2, max_reconnect_attempts=0))
        host, port = rt["graph_url"].removeprefix("falkor://").split(":")
        assert redis_ping(host, int(port)) == (False, "password required")

        chat = tmp_path / "chat.jsonl"
        chat.write_text("".join(json.dumps(line) + "\n" for line in [
            {"session_id": "s1", "role": "user", "content": "Should billing keep using Postgres?",
             "timestamp": "2026-01-05T10:00:00Z"},
            {"session_id": "s1", "role": "assistant", "content": "Billing stays on Postgres 15.",
             "timestamp": "2026-01-05T10:00:05Z"}]))
        assert "published 2" in run("ingest", str(chat), "--workspace", "w", data_dir=data).stdout
        deadline = time.monotonic() + 60
        while "Postgres 15" not in (out := run("recall", "Which database?", "--session", "s1", data_dir=data,
                                                check=False)).stdout:
            assert time.monotonic() < deadline, out.stdout + out.stderr
            time.sleep(1)
        run("memory", "note", "prefers dark mode", "--user", "ada", data_dir=data)
        assert "prefers dark mode" in run("memory", "notes", "--user", "ada", data_dir=data).stdout

        gateway = rt["services"]["gateway"]["url"]

        def http(method: str, path: str, body: dict | None = None) -> dict:
            req = urllib.request.Request(gateway + path, method=method, headers={"content-type": "application/json"},
                                         data=json.dumps(body).encode() if body is not None else None)
            with urllib.request.urlopen(req, timeout=30) as resp:
                return json.load(resp)

        assert http("POST", "/messages", {"group_id": "g9", "messages": [
            {"content": "I use vim", "role_type": "user", "role": "ada"}]})["success"]
        deadline = time.monotonic() + 60
        while not http("POST", "/search", {"query": "vim", "group_ids": ["g9"]})["facts"]:
            assert time.monotonic() < deadline
            time.sleep(1)
        # a promotion goes straight into ENGRAM_EPISODES: the gateway's user may publish there
        assert http("POST", "/promote", {"kind": "decision", "text": "We deploy with ansible.", "key": "w9"})["episode_uuid"]
        assert http("DELETE", "/group/g9")["success"]  # recall erases the group's messages too
        assert http("POST", "/search", {"query": "vim", "group_ids": ["g9"]})["facts"] == []

        # an agent's publisher user: chat messages in, nothing else
        async def as_publisher() -> list[str]:
            errors: list[str] = []

            async def on_error(exc: Exception) -> None:
                errors.append(str(exc))

            nc = await nats.connect(rt["nats_url"], user="engram-publisher", password=passwords["publisher"],
                                    error_cb=on_error)
            ack = await nc.jetstream().publish(subjects.in_message("s2"), b"{}", headers={"Nats-Msg-Id": "p-1"})
            assert ack.stream == subjects.STREAM_IN
            await nc.publish(subjects.GRAPH_GROUP_DELETE, b'{"group_id": "engram_workspace_x"}')
            await nc.flush()
            await _eventually(lambda: any("permissions violation" in e for e in errors))
            await nc.close()
            return errors

        assert any("permissions violation" in e for e in asyncio.run(as_publisher()))

        doctor = subprocess.run([sys.executable, "-m", "engram.cli", "doctor", "--smoke", "--data-dir", str(data)],
                                capture_output=True, text=True, timeout=180, env=_cli_env())
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert ":***@" in doctor.stdout and passwords["falkordb"] not in doctor.stdout
    finally:
        assert up.stop() == 0, up.log_tail()
    violations = [line for line in (data / "logs" / "nats.log").read_text().splitlines() if "Violation" in line]
    assert len(violations) == 1 and "engram-publisher" in violations[0], violations  # the one provoked above
    logs = [*(data / "logs").iterdir(), data.parent / f"{data.name}-up.log"]
    for path in logs:
        text = path.read_text(errors="replace")
        assert not [who for who, secret in passwords.items() if secret in text], path


def _cli_env() -> dict[str, str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
    return {**env, "GRAPHITI_TELEMETRY_ENABLED": "false",
            "ENGRAM_EMBEDDER_PROVIDER": os.environ.get("ENGRAM_EMBEDDER_PROVIDER", "hashing")}


def test_compose_env_file_gets_every_secret_compose_requires(tmp_path: Path) -> None:
    import re

    env = tmp_path / ".env"
    env.write_text("ENGRAM_BIND=0.0.0.0\nFALKORDB_PASSWORD=mine\n")
    added = auth.write_env_file(env)
    assert "FALKORDB_PASSWORD" not in added and "ENGRAM_NATS_PASSWORD_PUBLISHER" in added
    values = dict(line.split("=", 1) for line in env.read_text().splitlines())
    assert values["FALKORDB_PASSWORD"] == "mine" and values["ENGRAM_BIND"] == "0.0.0.0"
    assert env.stat().st_mode & 0o777 == 0o600
    assert auth.write_env_file(env) == []  # a second run keeps everything
    compose = (auth.REPO / "docker-compose.yml").read_text()
    required = set(re.findall(r"\$\{(\w+):\?", compose))
    assert required <= set(values), required - set(values)
    # the nats config reads exactly the passwords compose hands the nats container
    assert set(re.findall(r"\$(ENGRAM_NATS_PASSWORD_\w+)", auth.COMPOSE_CONF.read_text())) == {
        v for v in required if v.startswith("ENGRAM_NATS_PASSWORD_")}


async def test_the_compose_config_takes_passwords_from_the_environment(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """deploy/nats/auth.conf as the nats container runs it: $ENGRAM_NATS_PASSWORD_* from the environment."""
    env_file = tmp_path / ".env"
    auth.write_env_file(env_file)
    values = dict(line.split("=", 1) for line in env_file.read_text().splitlines())
    for name, value in values.items():
        monkeypatch.setenv(name, value)  # the child nats-server inherits them
    proc = start_nats(tmp_path, config=auth.COMPOSE_CONF)
    try:
        ok = await Client().connect(proc.url, auth.user_name("extractor"), values["ENGRAM_NATS_PASSWORD_EXTRACTOR"])
        await ok.nc.close()
        with pytest.raises((nats.errors.Error, OSError)):
            await Client().connect(proc.url, auth.user_name("extractor"), values["ENGRAM_NATS_PASSWORD_RECALL"])
    finally:
        proc.stop()


def test_the_k8s_nats_cluster_config_includes_the_users(tmp_path: Path) -> None:
    """deploy/k8s/nats: nats.conf (nats.yaml) + the generated auth.conf (auth.yaml), as the pod sees
    them side by side in /etc/nats, parse with `nats-server -t`, passwords from the nats-users Secret."""
    import os
    import subprocess

    import yaml

    from engram.stack.embedded import nats_server_binary

    docs = [d for f in ("nats.yaml", "auth.yaml")
            for d in yaml.safe_load_all((auth.K8S_AUTH.parent / f).read_text()) if d]
    config_maps = {d["metadata"]["name"]: d["data"] for d in docs if d["kind"] == "ConfigMap"}
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == "nats-users")
    (tmp_path / "nats.conf").write_text(config_maps["nats-config"]["nats.conf"])
    (tmp_path / "auth.conf").write_text(config_maps["nats-auth"]["auth.conf"])
    env = {**os.environ, "POD_NAME": "nats-0", **{k: auth.new_password() for k in secret["stringData"]}}
    out = subprocess.run([nats_server_binary(), "-t", "-c", str(tmp_path / "nats.conf")], env=env,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stdout + out.stderr
    assert set(secret["stringData"]) == {auth.env_var(n) for n in ("admin", *auth.USERS)}
    # without the passwords the server refuses the config
    missing = {k: v for k, v in env.items() if k != auth.env_var("extractor")}
    out = subprocess.run([nats_server_binary(), "-t", "-c", str(tmp_path / "nats.conf")], env=missing,
                         capture_output=True, text=True, timeout=30)
    assert out.returncode != 0
