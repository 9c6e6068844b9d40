"""Static checks of the deployment files (no Docker engine or cluster needed).

docker-compose.yml against the compose-spec schema and against the code (services, settings,
ports), the Dockerfile, the Kubernetes manifests (references, probes, KEDA triggers vs. the
topology), the Prometheus config and rules, and the Grafana dashboard: every metric a query
uses must be one the code registers (or the NATS exporter exports).
"""

from __future__ import annotations

import fnmatch
import importlib.resources
import json
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOCKERFILE = DEPLOY / "docker" / "Dockerfile"
K8S = DEPLOY / "k8s"
PROMETHEUS_CONFIG = DEPLOY / "prometheus" / "prometheus.yml"
ALERTS = DEPLOY / "prometheus" / "alerts.yml"
GRAFANA = DEPLOY / "grafana"
DASHBOARDS = GRAFANA / "dashboards"
DATASOURCES = GRAFANA / "provisioning" / "datasources"
DASHBOARD_PROVIDERS = GRAFANA / "provisioning" / "dashboards"

# Series of prometheus-nats-exporter with -jsz=all (collector/jsz.go upstream).
NATS_EXPORTER_JSZ_METRICS = {
    "jetstream_server_jetstream_disabled",
    "jetstream_server_total_streams",
    "jetstream_server_total_consumers",
    "jetstream_server_total_messages",
    "jetstream_server_total_message_bytes",
    "jetstream_server_max_memory",
    "jetstream_server_max_storage",
    "jetstream_stream_total_messages",
    "jetstream_stream_total_bytes",
    "jetstream_stream_first_seq",
    "jetstream_stream_last_seq",
    "jetstream_stream_consumer_count",
    "jetstream_consumer_delivered_consumer_seq",
    "jetstream_consumer_delivered_stream_seq",
    "jetstream_consumer_num_ack_pending",
    "jetstream_consumer_num_redelivered",
    "jetstream_consumer_num_waiting",
    "jetstream_consumer_num_pending",
    "jetstream_consumer_ack_floor_stream_seq",
    "jetstream_consumer_ack_floor_consumer_seq",
}
# Series Prometheus makes itself for every target.
PROMETHEUS_SYNTHETIC = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


# --- helpers ---------------------------------------------------------------------------------
@cache
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def services() -> dict[str, dict[str, Any]]:
    return compose()["services"]


def service_names() -> list[str]:
    from engram.cli.commands import SERVICE_MODULES, Service

    return [s.value for s in Service if s in SERVICE_MODULES]


def environment(svc: dict[str, Any]) -> dict[str, str]:
    env = svc.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {k: "" if v is None else str(v) for k, v in env.items()}


@cache
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for line in DOCKERFILE.read_text().splitlines():
        stripped = line.strip()
        if not buf and (not stripped or stripped.startswith("#")):
            continue
        if buf and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction
        if stripped.endswith("\\"):
            buf += stripped[:-1] + " "
            continue
        buf += stripped
        instr, _, args = buf.partition(" ")
        out.append((instr.upper(), args.strip()))
        buf = ""
    assert not buf, "Dockerfile ends inside a continued line"
    return out


def dockerfile(instr: str) -> list[str]:
    return [args for i, args in dockerfile_instructions() if i == instr]


def uses_engram_image(svc: dict[str, Any]) -> bool:
    build = svc.get("build")
    if isinstance(build, dict) and (ROOT / build.get("context", ".") / build.get("dockerfile", "Dockerfile")).resolve() == DOCKERFILE:
        return True
    return str(svc.get("image", "")).split(":")[0].rsplit("/", 1)[-1] == "engram"


def engram_services() -> dict[str, dict[str, Any]]:
    """Long-running engram services (not the one-shot `engram topology` job)."""
    return {name: svc for name, svc in services().items() if uses_engram_image(svc) and command_of(svc) != ["topology"]}


def command_of(svc: dict[str, Any]) -> list[str]:
    cmd = svc.get("command")
    if cmd is None:  # the image's default CMD
        return json.loads(dockerfile("CMD")[-1])
    return cmd.split() if isinstance(cmd, str) else list(cmd)


def container_ports(svc: dict[str, Any]) -> set[int]:
    ports: set[int] = set()
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            ports.add(int(p["target"]))
        else:
            ports.add(int(str(p).split("/")[0].rsplit(":", 1)[-1]))
    return ports


def bind_mounts(svc: dict[str, Any]) -> Iterator[tuple[str, str]]:
    """(host source, container target) of bind mounts (relative or absolute host paths)."""
    for v in svc.get("volumes", []):
        if isinstance(v, dict):
            if v.get("type") == "bind":
                yield v["source"], v["target"]
            continue
        parts = str(v).split(":")
        if len(parts) >= 2 and parts[0].startswith((".", "/", "~")):
            yield parts[0], parts[1]


def known_settings() -> set[str]:
    from engram.settings import EngramSettings, TurnDetectorSettings

    names = {f"ENGRAM_{n.upper()}" for n in EngramSettings.model_fields if n != "turn"}
    names |= {f"ENGRAM_TURN_{n.upper()}" for n in TurnDetectorSettings.model_fields}
    from engram.services.gateway.settings import GatewaySettings

    names |= {f"ENGRAM_GATEWAY_{n.upper()}" for n in GatewaySettings.model_fields}
    from engram.services.mcp.settings import McpSettings

    names |= {f"ENGRAM_MCP_{n.upper()}" for n in McpSettings.model_fields}
    return names


def check_settings(env: dict[str, str], where: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Every ENGRAM_* variable is a real setting, and the values validate as settings."""
    from engram.settings import EngramSettings

    unknown = sorted(k for k in env if k.startswith("ENGRAM_") and k not in known_settings())
    assert not unknown, f"{where}: not engram settings (typo?): {unknown}"
    assert env.get("GRAPHITI_TELEMETRY_ENABLED") == "false", f"{where}: set GRAPHITI_TELEMETRY_ENABLED=false"
    with monkeypatch.context() as m:
        for key in [k for k in os.environ if k.startswith("ENGRAM_")]:
            m.delenv(key)
        for key, value in env.items():
            m.setenv(key, value)
        settings = EngramSettings()
    assert settings.http_host == "0.0.0.0", f"{where}: ENGRAM_HTTP_HOST must be 0.0.0.0 in containers"
    assert settings.http_port > 0, f"{where}: ENGRAM_HTTP_PORT must be fixed (0 means a random port)"
    return settings


@cache
def k8s_docs() -> list[tuple[Path, dict[str, Any]]]:
    docs = []
    # deploy/k8s itself; nats/ is a kustomization of its own (tests/deploy/test_k8s_schemas.py)
    for path in sorted(K8S.glob("*.y*ml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                docs.append((path, doc))
    return docs


def k8s_objects(kind: str | None = None) -> list[dict[str, Any]]:
    return [d for _, d in k8s_docs() if d.get("kind") != "Kustomization" and (kind is None or d.get("kind") == kind)]


def k8s_object(kind: str, name: str) -> dict[str, Any] | None:
    return next((o for o in k8s_objects(kind) if o["metadata"]["name"] == name), None)


def workloads() -> list[dict[str, Any]]:
    return [o for o in k8s_objects() if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet", "Job")]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def config_map_data() -> dict[str, str]:
    cm = k8s_object("ConfigMap", "engram-config")
    assert cm is not None, "deploy/k8s must define ConfigMap engram-config"
    return {k: str(v) for k, v in cm.get("data", {}).items()}


def secret_keys(name: str) -> set[str]:
    sec = k8s_object("Secret", name)
    assert sec is not None, f"Secret {name} is referenced but not defined in deploy/k8s"
    return set(sec.get("data", {})) | set(sec.get("stringData", {}))


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """Effective env of a container as far as it is knowable statically (secrets: '<secret>')."""
    env: dict[str, str] = {}
    for src in container.get("envFrom", []):
        if "configMapRef" in src:
            cm = k8s_object("ConfigMap", src["configMapRef"]["name"])
            env.update({k: str(v) for k, v in (cm or {}).get("data", {}).items()})
    for item in container.get("env", []):
        env[item["name"]] = str(item["value"]) if "value" in item else "<from-ref>"
    return env


def probe_port(container: dict[str, Any], port: int | str) -> int:
    if isinstance(port, int):
        return port
    named = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    assert port in named, f"container {container['name']}: probe port {port!r} is not a named container port"
    return named[port]


# --- registered metrics and PromQL -------------------------------------------------------------
@cache
def registered_metrics() -> tuple[frozenset[str], bool]:
    """Sample names the code can expose, and whether FastStream's were registered exactly."""
    os.environ.setdefault("GRAPHITI_TELEMETRY_ENABLED", "false")
    import engram.runtime.dlq  # noqa: F401 - registers engram_dlq_messages_total
    import engram.services.turn_detector.metrics  # noqa: F401 - registers engram_turn_detector_*
    import engram.services.extractor.app  # noqa: F401 - registers engram_extractor_* and engram_llm_*
    import engram.services.summary_gate.app  # noqa: F401 - registers engram_summary_*
    import engram.services.recall.app  # noqa: F401 - registers engram_recall_*
    import engram.services.gateway.app  # noqa: F401 - registers engram_gateway_*
    import engram.services.sessions.app  # noqa: F401 - registers engram_sessions_*, engram_memory_*, engram_context_*
    from prometheus_client import REGISTRY

    faststream_exact = True
    try:  # the broker's PrometheusMiddleware registers engram_faststream_* (no connection made)
        from engram.runtime.service import make_broker
        from engram.settings import EngramSettings

        make_broker(EngramSettings(nats_url="nats://127.0.0.1:4222"), service="deploy-test")
    except Exception:  # noqa: BLE001 - fall back to allowing the engram_faststream_ prefix
        faststream_exact = False

    names: set[str] = set()
    for family in REGISTRY.collect():
        base = family.name
        if family.type == "counter":
            names |= {base, f"{base}_total", f"{base}_created"}
        elif family.type in ("histogram", "gaugehistogram"):
            names |= {f"{base}_bucket", f"{base}_count", f"{base}_sum", f"{base}_created"}
        elif family.type == "summary":
            names |= {base, f"{base}_count", f"{base}_sum", f"{base}_created"}
        else:
            names.add(base)
        names |= {s.name for s in family.samples}
    return frozenset(names), faststream_exact


_PROMQL_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_PROMQL_LABEL_BLOCKS = re.compile(r"\{[^{}]*\}")
_PROMQL_IDENT = re.compile(r"(?<![\w:$.])([a-zA-Z_:][a-zA-Z0-9_:]*)(?![\w:])")
_PROMQL_KEYWORDS = {
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
    "offset", "sum", "avg", "min", "max", "count", "stddev", "stdvar", "topk", "bottomk", "quantile",
    "count_values", "group", "rate", "irate", "increase", "delta", "idelta", "deriv", "absent",
    "absent_over_time", "histogram_quantile", "label_replace", "label_join", "clamp_min", "clamp_max",
    "avg_over_time", "max_over_time", "min_over_time", "sum_over_time", "count_over_time",
    "last_over_time", "changes", "resets", "vector", "scalar", "time", "abs", "ceil", "floor",
    "round", "sort", "sort_desc", "inf", "nan", "e",
}


def promql_metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression (a light lexer: no label names, strings or functions)."""
    text = _PROMQL_STRINGS.sub('""', expr)
    text = _PROMQL_LABEL_BLOCKS.sub("{}", text)
    text = re.sub(r"\[[^\]]*\]", "[]", text)  # range selectors: [5m], [$__rate_interval]
    text = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", " ", text)
    names = set()
    for m in _PROMQL_IDENT.finditer(text):
        name = m.group(1)
        rest = text[m.end():].lstrip()
        if name.lower() in _PROMQL_KEYWORDS or re.fullmatch(r"\d+[smhdwy]", name):
            continue
        if rest.startswith("(") and not name.startswith(("engram_", "jetstream_")):
            continue  # an unknown function call, not a metric
        names.add(name)
    return names


def unknown_metrics(expr: str) -> set[str]:
    registered, faststream_exact = registered_metrics()
    bad = set()
    for name in promql_metric_names(expr):
        if name.startswith("engram_faststream_") and not faststream_exact:
            continue
        if name.startswith("engram_"):
            if name not in registered:
                bad.add(name)
        elif name.startswith("jetstream_"):
            if name not in NATS_EXPORTER_JSZ_METRICS:
                bad.add(name)
        elif name not in PROMETHEUS_SYNTHETIC:
            bad.add(name)
    return bad


def check_promql_shape(expr: str, where: str) -> None:
    pairs = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for ch in _PROMQL_STRINGS.sub('""', expr):
        if ch in "([{":
            stack.append(ch)
        elif ch in pairs:
            assert stack and stack.pop() == pairs[ch], f"{where}: unbalanced {ch!r} in {expr!r}"
    assert not stack, f"{where}: unclosed {stack} in {expr!r}"
    from engram.schemas import subjects

    from engram.runtime.topology import Topology

    streams = {cfg.name for cfg in Topology(partitions=1, duplicate_window_s=1, ack_wait_s=1).streams()}
    for stream in re.findall(r'stream_name\s*=\s*"([^"]*)"', expr):
        assert stream in streams, f"{where}: unknown stream {stream!r} (known: {sorted(streams)})"


@cache
def dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for p in panels:
        yield p
        yield from all_panels(p.get("panels", []))


def dashboard_exprs() -> Iterator[tuple[str, str]]:
    for fname, dash in dashboards().items():
        for panel in all_panels(dash["panels"]):
            for t in panel.get("targets", []):
                if "expr" in t:
                    yield f"{fname}: panel {panel.get('title')!r}", t["expr"]


@cache
def alert_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(ALERTS.read_text())
    return [rule for group in doc["groups"] for rule in group["rules"]]


# --- docker-compose.yml ------------------------------------------------------------------------
def test_compose_validates_against_the_compose_spec() -> None:
    schema_file = importlib.resources.files("check_jsonschema") / "builtin_schemas/vendor/compose-spec.json"
    schema = json.loads(schema_file.read_text())
    validator_cls = jsonschema.validators.validator_for(schema)
    validator_cls.check_schema(schema)
    errors = sorted(validator_cls(schema).iter_errors(compose()), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    assert "version" not in compose(), "compose-spec files have no version: key"


def test_compose_depends_on_names_existing_services_with_healthchecks() -> None:
    has_image_healthcheck = bool(dockerfile("HEALTHCHECK"))
    for name, svc in services().items():
        deps = svc.get("depends_on", {})
        items = {d: {} for d in deps} if isinstance(deps, list) else deps
        for dep, spec in items.items():
            assert dep in services(), f"{name} depends on unknown service {dep}"
            if (spec or {}).get("condition") == "service_healthy":
                target = services()[dep]
                assert "healthcheck" in target or (uses_engram_image(target) and has_image_healthcheck), (
                    f"{name} waits for {dep} to be healthy, but {dep} has no healthcheck"
                )
                assert not set(target.get("profiles", [])) - set(svc.get("profiles", [])), (
                    f"{name} depends on {dep}, which only starts with profiles {target.get('profiles')}"
                )


def test_compose_bind_mounts_and_build_files_exist() -> None:
    for name, svc in services().items():
        for source, _ in bind_mounts(svc):
            assert not source.startswith(("/", "~")), f"{name}: bind mount {source} is outside the repo"
            assert (ROOT / source).exists(), f"{name}: bind-mounted {source} does not exist"
        build = svc.get("build")
        if isinstance(build, dict):
            context = ROOT / build.get("context", ".")
            assert context.is_dir(), f"{name}: build context {context} missing"
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), f"{name}: Dockerfile missing"


def test_compose_engram_services_run_known_services(monkeypatch: pytest.MonkeyPatch) -> None:
    ours = engram_services()
    assert "turn-detector" in ours, "docker-compose.yml must run the turn-detector"
    known = service_names()
    for name, svc in ours.items():
        cmd = command_of(svc)
        assert cmd[:1] == ["serve"] and len(cmd) == 2, f"{name}: command must be `serve <service>`, got {cmd}"
        assert cmd[1] in known, f"{name}: `engram serve {cmd[1]}` is not a service (known: {known})"
        env = environment(svc)
        settings = check_settings(env, f"compose service {name}", monkeypatch)
        assert settings.nats_url and settings.nats_url.startswith("nats://"), f"{name}: ENGRAM_NATS_URL"
        host = settings.nats_url.split("://", 1)[1].split(":")[0].split("@")[-1]
        assert host in services(), f"{name}: ENGRAM_NATS_URL points at {host}, not a compose service"
        if settings.graph_url:
            ghost = settings.graph_url.split("://", 1)[1].split("@")[-1].split(":")[0]  # after a :password@
            assert ghost in services(), f"{name}: ENGRAM_GRAPH_URL points at {ghost}, not a compose service"
        assert settings.http_port in container_ports(svc), f"{name}: ENGRAM_HTTP_PORT {settings.http_port} is not published"
        assert "nats" in (svc.get("depends_on") or {}), f"{name} must wait for nats"


def test_compose_engram_serve_strings_anywhere_name_known_services() -> None:
    known = service_names()
    for found in re.findall(r"engram\s+serve\s+([\w-]+)", COMPOSE_FILE.read_text()):
        assert found in known, f"docker-compose.yml runs `engram serve {found}`, not a service"


def test_compose_nats_and_falkordb() -> None:
    nats = services()["nats"]
    image, _, tag = nats["image"].partition(":")
    assert image == "nats"
    major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", tag).groups())  # type: ignore[union-attr]
    assert (major, minor) >= (2, 12), "the turn-detector needs nats-server >= 2.12 (message schedules)"
    cmd = nats["command"] if isinstance(nats["command"], list) else nats["command"].split()
    assert "-js" in cmd and "-sd" in cmd, "NATS needs JetStream on, with a store dir"
    monitor = cmd[cmd.index("-m") + 1]
    assert f":{monitor}/healthz" in " ".join(nats["healthcheck"]["test"]), "NATS healthcheck: monitoring /healthz"
    store = cmd[cmd.index("-sd") + 1]
    assert any(str(v).split(":")[1] == store for v in nats["volumes"]), "the JetStream store dir must be a volume"
    falkor = services()["falkordb"]
    assert falkor["image"].startswith("falkordb/falkordb:")
    assert "ping" in " ".join(falkor["healthcheck"]["test"])
    assert falkor.get("volumes"), "FalkorDB data must be on a volume"
    for name in ("nats", "falkordb", "turn-detector"):
        assert not services()[name].get("profiles"), f"{name} must start with a plain `docker compose up`"
    for name in ("prometheus", "grafana", "nats-exporter"):
        assert "observability" in services()[name].get("profiles", []), f"{name} belongs to the observability profile"
    exporter = services()["nats-exporter"]
    args = exporter["command"] if isinstance(exporter["command"], list) else exporter["command"].split()
    assert "-jsz=all" in args and any(a.startswith(f"http://nats:{monitor}") for a in args)


def test_prometheus_scrapes_every_engram_service_on_its_port() -> None:
    cfg = yaml.safe_load(PROMETHEUS_CONFIG.read_text())
    targets: dict[str, tuple[int, dict[str, str]]] = {}
    for job in cfg["scrape_configs"]:
        assert job.get("job_name"), "every scrape config needs a job_name"
        for group in job.get("static_configs", []):
            for t in group["targets"]:
                host, port = t.rsplit(":", 1)
                if host != "localhost":
                    assert host in services(), f"job {job['job_name']}: target {t} is not a compose service"
                targets[host] = (int(port), group.get("labels", {}))
    for name, svc in engram_services().items():
        assert name in targets, f"prometheus.yml does not scrape compose service {name}"
        port, labels = targets[name]
        assert port == int(environment(svc)["ENGRAM_HTTP_PORT"]), f"{name} is scraped on the wrong port"
        assert labels.get("service") == name, f"{name}: the scrape target needs label service={name}"
    assert "nats-exporter" in targets
    # rule files are mounted into the prometheus container
    mounts = {target: source for source, target in bind_mounts(services()["prometheus"])}
    rule_sources = set()
    for rule_file in cfg.get("rule_files", []):
        assert rule_file in mounts, f"rule file {rule_file} is not mounted into the prometheus container"
        rule_sources.add((ROOT / mounts[rule_file]).resolve())
    assert ALERTS.resolve() in rule_sources, "prometheus.yml does not load deploy/prometheus/alerts.yml"
    config_mount = next(a for a in services()["prometheus"]["command"] if a.startswith("--config.file="))
    assert (ROOT / mounts[config_mount.split("=", 1)[1]]).resolve() == PROMETHEUS_CONFIG.resolve()


# --- Dockerfile ----------------------------------------------------------------------------------
def test_dockerfile_builds_the_package_as_a_non_root_engram_entrypoint() -> None:
    args = {}
    for value in dockerfile("ARG"):
        name, _, default = value.partition("=")
        args[name] = default
    froms = [re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), f).split()[0] for f in dockerfile("FROM")]
    assert froms and froms[-1] == "python:3.11-slim", f"runtime base must be python:3.11-slim, got {froms}"
    assert all(f == "python:3.11-slim" for f in froms), froms

    assert any(re.search(r"pip install\b.*-c requirements\.lock\s+\.(\s|$)", r) for r in dockerfile("RUN")), (
        "the image must install the project with `pip install -c requirements.lock .`"
    )
    user = dockerfile("USER")
    assert user and user[-1].split(":")[0] not in ("root", "0"), "the image must run as a non-root user"
    assert re.fullmatch(r"\d+(:\d+)?", user[-1]), "numeric USER (Kubernetes runAsNonRoot needs it)"

    assert json.loads(dockerfile("ENTRYPOINT")[-1]) == ["engram"]
    cmd = json.loads(dockerfile("CMD")[-1])
    assert cmd[0] == "serve" and cmd[1] in service_names(), f"default CMD {cmd}"
    health = dockerfile("HEALTHCHECK")
    assert health and "/healthz" in health[-1] and "python" in health[-1] and "curl" not in health[-1]

    env = " ".join(dockerfile("ENV"))
    assert "ENGRAM_HTTP_HOST=0.0.0.0" in env and "GRAPHITI_TELEMETRY_ENABLED=false" in env


def test_dockerfile_copies_existing_files_and_every_package() -> None:
    copied: set[str] = set()
    for value in dockerfile("COPY"):
        parts = value.split()
        if any(p.startswith("--from") for p in parts):
            continue
        sources = [p for p in parts[:-1] if not p.startswith("--")]
        for src in sources:
            if any(c in src for c in "*?["):
                continue  # optional glob (e.g. README.md*)
            assert (ROOT / src).exists(), f"Dockerfile copies {src}, which is not in the build context"
            copied.add(src.rstrip("/"))
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = {"pyproject.toml", "requirements.lock"}
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        top = pattern.rstrip("*").rstrip(".")
        if (ROOT / top).is_dir():
            needed.add(top)
    missing = needed - copied
    assert not missing, f"the image build misses {sorted(missing)} (pyproject packages/metadata)"


# --- Kubernetes --------------------------------------------------------------------------------
def test_k8s_documents_are_well_formed_and_listed() -> None:
    assert k8s_docs(), "no manifests under deploy/k8s"
    for path, doc in k8s_docs():
        where = path.relative_to(ROOT)
        assert doc.get("apiVersion") and doc.get("kind"), f"{where}: apiVersion/kind missing"
        if doc["kind"] == "Kustomization":
            continue
        assert (doc.get("metadata") or {}).get("name"), f"{where}: {doc['kind']} without metadata.name"
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    resources = kust.get("resources", [])
    for res in resources:
        assert (K8S / res).exists(), f"kustomization resource {res} does not exist"
    manifests = {p.name for p in K8S.glob("*.y*ml")} - {"kustomization.yaml"}
    assert manifests <= set(resources), f"manifests not in kustomization.yaml: {sorted(manifests - set(resources))}"
    kinds = {o["kind"] for o in k8s_objects()}
    for kind in ("Namespace", "ConfigMap", "Secret", "Deployment", "Service", "ScaledObject", "PodDisruptionBudget"):
        assert kind in kinds, f"deploy/k8s defines no {kind}"
    seen = set()
    for o in k8s_objects():
        key = (o["kind"], o["metadata"]["name"])
        assert key not in seen, f"duplicate {key}"
        seen.add(key)


def test_k8s_config_map_holds_valid_engram_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    data = config_map_data()
    settings = check_settings({**data, "ENGRAM_NATS_URL": "nats://nats:4222"}, "ConfigMap engram-config", monkeypatch)
    assert "ENGRAM_NATS_URL" not in data, "ENGRAM_NATS_URL belongs to the Secret (it may carry credentials)"
    assert settings.partitions >= 1
    secret = k8s_object("Secret", "engram-nats")
    assert secret is not None and "stringData" in secret, "the Secret template uses stringData placeholders"
    assert {"ENGRAM_NATS_URL", "nats.creds"} <= set(secret["stringData"])


def test_k8s_references_resolve_to_objects_in_the_folder() -> None:
    for w in workloads():
        spec = pod_spec(w)
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in spec.get("initContainers", []) + spec["containers"]:
            where = f"{w['kind']}/{w['metadata']['name']} container {c['name']}"
            for src in c.get("envFrom", []):
                if "configMapRef" in src:
                    assert k8s_object("ConfigMap", src["configMapRef"]["name"]), f"{where}: no ConfigMap {src}"
                if "secretRef" in src:
                    assert k8s_object("Secret", src["secretRef"]["name"]), f"{where}: no Secret {src}"
            for item in c.get("env", []):
                ref = item.get("valueFrom", {})
                if "configMapKeyRef" in ref:
                    cm = k8s_object("ConfigMap", ref["configMapKeyRef"]["name"])
                    assert cm and ref["configMapKeyRef"]["key"] in cm.get("data", {}), f"{where}: {item['name']}"
                if "secretKeyRef" in ref:
                    assert ref["secretKeyRef"]["key"] in secret_keys(ref["secretKeyRef"]["name"]), f"{where}: {item['name']}"
            for mount in c.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{where}: mounts undefined volume {mount['name']}"
        for vol in volumes.values():
            if "secret" in vol:
                keys = secret_keys(vol["secret"]["secretName"])
                for it in vol["secret"].get("items", []):
                    assert it["key"] in keys, f"volume {vol['name']}: Secret has no key {it['key']}"
            if "configMap" in vol:
                cm = k8s_object("ConfigMap", vol["configMap"]["name"])
                assert cm, f"volume {vol['name']}: no ConfigMap {vol['configMap']['name']}"


def test_k8s_turn_detector_deployment() -> None:
    dep = k8s_object("Deployment", "turn-detector")
    assert dep is not None
    partitions = int(config_map_data()["ENGRAM_PARTITIONS"])
    assert 2 <= dep["spec"]["replicas"] <= partitions
    spec = pod_spec(dep)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert spec["securityContext"]["runAsNonRoot"] is True
    known = service_names()
    for c in spec["containers"]:
        args = c.get("args") or c.get("command") or []
        assert args[:1] == ["serve"] and args[1] in known, f"{c['name']}: `engram {' '.join(args)}` is not a service"
        env = container_env(c)
        assert env.get("ENGRAM_HTTP_HOST") == "0.0.0.0"
        assert env.get("ENGRAM_NATS_URL"), "ENGRAM_NATS_URL must be set (from the Secret)"
        http_port = int(env["ENGRAM_HTTP_PORT"])
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            if probe in c:
                assert probe_port(c, c[probe]["httpGet"]["port"]) == http_port, f"{probe} on the wrong port"
        assert {"requests", "limits"} <= set(c["resources"]), "set resource requests and limits"
        sc = c.get("securityContext", {})
        assert sc.get("allowPrivilegeEscalation") is False and sc.get("readOnlyRootFilesystem") is True
        ann = dep["spec"]["template"]["metadata"].get("annotations", {})
        assert ann.get("prometheus.io/scrape") == "true"
        assert int(ann["prometheus.io/port"]) == http_port and ann.get("prometheus.io/path", "/metrics") == "/metrics"

    svc = k8s_object("Service", "turn-detector")
    assert svc is not None and svc["spec"]["selector"].items() <= pod_labels.items(), "Service selects no pod"
    container = spec["containers"][0]
    for port in svc["spec"]["ports"]:
        probe_port(container, port.get("targetPort", port["port"]))
    pdb = k8s_object("PodDisruptionBudget", "turn-detector")
    assert pdb is not None and pdb["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_k8s_keda_scales_on_every_input_partition() -> None:
    from engram.runtime.topology import Topology
    from engram.schemas import subjects

    so = k8s_object("ScaledObject", "turn-detector")
    assert so is not None and so["apiVersion"].startswith("keda.sh/")
    target = so["spec"]["scaleTargetRef"]
    assert k8s_object(target.get("kind", "Deployment"), target["name"]), "ScaledObject targets no Deployment here"
    partitions = int(config_map_data()["ENGRAM_PARTITIONS"])
    assert so["spec"]["minReplicaCount"] == 1
    assert so["spec"]["maxReplicaCount"] == partitions, "replicas beyond the partition count cannot help"
    consumers = set()
    for trig in so["spec"]["triggers"]:
        assert trig["type"] == "nats-jetstream"
        md = trig["metadata"]
        assert md["stream"] == subjects.STREAM_IN and md["account"] == "$G"
        assert re.fullmatch(r"[\w.-]+:\d+", md["natsServerMonitoringEndpoint"]), "host:port, no scheme"
        assert int(md["lagThreshold"]) > 0
        consumers.add(md["consumer"])
    assert consumers == {Topology.turn_detector_durable(p) for p in range(partitions)}, (
        "one trigger per turn-detector durable of ENGRAM_IN"
    )


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_k8s_kustomize_builds() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    built = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert len(built) == len(k8s_objects())
    for doc in built:
        if doc["kind"] != "Namespace":
            assert doc["metadata"].get("namespace") == "engram", f"{doc['kind']} {doc['metadata']['name']}"


# --- Prometheus rules ------------------------------------------------------------------------------
def test_alert_rules_are_complete() -> None:
    rules = alert_rules()
    names = [r["alert"] for r in rules]
    assert len(names) == len(set(names)), "duplicate alert names"
    for r in rules:
        where = f"alert {r.get('alert')}"
        assert r.get("expr") and "for" in r, f"{where}: needs expr and for"
        assert re.fullmatch(r"\d+[smh]", str(r["for"])), f"{where}: bad for {r['for']}"
        assert r.get("labels", {}).get("severity") in ("critical", "warning", "info"), f"{where}: severity"
        assert r.get("annotations", {}).get("summary"), f"{where}: annotations.summary"
        check_promql_shape(r["expr"], where)

    def having(pattern: str) -> list[dict[str, Any]]:
        return [r for r in rules if re.search(pattern, r["expr"])]

    assert having(r'up\{[^}]*service="turn-detector"'), "no turn-detector down alert"
    assert having(r"engram_dlq_messages_total"), "no dead-letter alert"
    lag = having(r'jetstream_consumer_num_pending\{[^}]*stream_name="ENGRAM_IN"')
    assert lag and lag[0]["for"] == "10m", "consumer lag on ENGRAM_IN, for 10m"
    assert having(r"num_redelivered|engram_turn_detector_retries_total"), "no redelivery alert"
    assert having(r"histogram_quantile\(0\.95,[\s\S]*engram_turn_detector_handle_seconds_bucket"), "no p95 alert"
    assert having(r'engram_pipeline_freshness_seconds_bucket\{stage="graph"\}'), "no freshness p95 alert"


def test_promql_uses_only_registered_metrics() -> None:
    exprs = [(f"alert {r['alert']}", r["expr"]) for r in alert_rules()] + list(dashboard_exprs())
    assert len(exprs) > 10
    problems = {where: sorted(bad) for where, expr in exprs if (bad := unknown_metrics(expr))}
    assert not problems, f"metrics nobody exports: {problems}"


def test_the_metric_check_can_fail() -> None:
    assert unknown_metrics('sum(rate(engram_turn_detector_mesages_total[5m]))') == {"engram_turn_detector_mesages_total"}
    assert unknown_metrics("jetstream_consumer_pending") == {"jetstream_consumer_pending"}
    assert unknown_metrics('histogram_quantile(0.9, sum by (le) (rate(engram_turn_detector_handle_seconds_bucket[5m])))') == set()
    assert unknown_metrics("engram_turn_detector_handle_seconds_total") == {"engram_turn_detector_handle_seconds_total"}
    assert promql_metric_names('sum by (stage, reason) (increase(engram_dlq_messages_total{stage="x"}[$__rate_interval]))') == {
        "engram_dlq_messages_total"
    }


# --- Grafana ---------------------------------------------------------------------------------------
def test_grafana_provisioning_matches_the_compose_mounts() -> None:
    ds_docs = [yaml.safe_load(p.read_text()) for p in DATASOURCES.glob("*.y*ml")]
    uids = {ds["uid"] for doc in ds_docs for ds in doc["datasources"]}
    assert uids, "no provisioned datasource"
    providers = [pr for p in DASHBOARD_PROVIDERS.glob("*.y*ml") for pr in yaml.safe_load(p.read_text())["providers"]]
    mounts = {target: (ROOT / source).resolve() for source, target in bind_mounts(services()["grafana"])}
    for pr in providers:
        path = pr["options"]["path"].rstrip("/")
        assert mounts.get(path) == DASHBOARDS.resolve(), f"provider path {path} is not where dashboards are mounted"
    assert mounts.get("/etc/grafana/provisioning/datasources") == DATASOURCES.resolve()
    assert mounts.get("/etc/grafana/provisioning/dashboards") == DASHBOARD_PROVIDERS.resolve()
    env = environment(services()["grafana"])
    assert env.get("GF_AUTH_ANONYMOUS_ENABLED") == "true" and env.get("GF_AUTH_ANONYMOUS_ORG_ROLE") == "Viewer"
    for fname, dash in dashboards().items():
        for panel in all_panels(dash["panels"]):
            refs = [panel.get("datasource")] + [t.get("datasource") for t in panel.get("targets", [])]
            for ref in refs:
                if isinstance(ref, dict) and ref.get("type") == "prometheus":
                    assert ref.get("uid") in uids, f"{fname}: panel {panel['title']!r} uses datasource {ref}"


def test_grafana_dashboard() -> None:
    assert "engram-pipeline.json" in dashboards()
    for fname, dash in dashboards().items():
        assert dash.get("uid") and dash.get("title"), fname
        assert 36 <= dash["schemaVersion"] <= 41, f"{fname}: schemaVersion {dash['schemaVersion']}"
        panels = list(all_panels(dash["panels"]))
        ids = [p["id"] for p in panels]
        assert len(ids) == len(set(ids)), f"{fname}: duplicate panel ids"
        for p in panels:
            assert {"x", "y", "w", "h"} <= set(p.get("gridPos", {})), f"{fname}: panel {p.get('title')} has no gridPos"
            if p["type"] != "row":
                assert p.get("targets"), f"{fname}: panel {p.get('title')} has no query"
                refs = [t["refId"] for t in p["targets"]]
                assert len(refs) == len(set(refs)), f"{fname}: panel {p['title']} repeats a refId"
        for where, expr in dashboard_exprs():
            check_promql_shape(expr, where)

    exprs = " ".join(e for _, e in dashboard_exprs())
    wanted = {
        "messages by outcome": r"by \(outcome\)[\s\S]*engram_turn_detector_messages_total",
        "turns by completed_by": r"by \(completed_by\)[\s\S]*engram_turn_detector_turns_total",
        "episodes by scope": r"by \(scope\)[\s\S]*engram_turn_detector_episodes_total",
        "dead letters by stage/reason": r"by \(stage, reason\)[\s\S]*engram_dlq_messages_total",
        "secrets by kind": r"by \(kind\)[\s\S]*engram_secrets_scrubbed_total",
        "p50": r"histogram_quantile\(0\.5,[^;]*engram_turn_detector_handle_seconds_bucket",
        "p95": r"histogram_quantile\(0\.95,[^;]*engram_turn_detector_handle_seconds_bucket",
        "p99": r"histogram_quantile\(0\.99,[^;]*engram_turn_detector_handle_seconds_bucket",
        "pending per durable": r'by \(consumer_name\) \(jetstream_consumer_num_pending\{stream_name="ENGRAM_IN"\}',
        "redeliveries": r"jetstream_consumer_num_redelivered",
        "freshness p95 by stage": r"histogram_quantile\(0\.95, sum by \(le, stage\)[^;]*engram_pipeline_freshness_seconds_bucket",
        "backlog by stage": r"by \(stage\)[\s\S]*engram_stage_backlog_messages",
    }
    missing = [what for what, pattern in wanted.items() if not re.search(pattern, exprs)]
    assert not missing, f"dashboard lacks panels for: {missing}"


def test_dockerfile_glob_copies_have_a_real_source() -> None:
    # A glob COPY source that matches nothing is fine only when another source of the same
    # COPY exists (BuildKit fails a COPY with no source at all).
    for value in dockerfile("COPY"):
        parts = [p for p in value.split()[:-1] if not p.startswith("--")]
        globs = [p for p in parts if any(c in p for c in "*?[")]
        if globs:
            plain = [p for p in parts if p not in globs]
            matched = [g for g in globs if fnmatch.filter(os.listdir(ROOT), g)]
            assert plain or matched, f"COPY {value}: no source would exist"
