"""The Kubernetes manifests: every resource validated against the Kubernetes
JSON schemas (``kubernetes-validate``, strict: unknown fields are errors) for
the oldest and newest versions we support, kustomize rendering by kubectl's
built-in kustomize, and the properties the deployment relies on."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import kubernetes_validate
import pytest
import yaml
from pydantic import ValidationError

from feature_store.constants import control_topic, dead_letter_topic, events_topic
from feature_store.errors import ConfigurationError
from feature_store.settings import Settings
from tests.deploy.deployfiles import (
    CHART,
    K8S,
    PENDING_SECTIONS,
    ROOT,
    SHUTDOWN_MARGIN_S,
    kubectl_command,
    kustomizations,
    listed_resources,
    load_documents,
    run_tool,
    trainer_shutdown_budget_s,
)

K8S_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
"""Oldest Kubernetes the manifests target, and the newest the schemas know."""

STRIMZI_KINDS = {"Kafka", "KafkaNodePool", "KafkaTopic"}
"""Custom resources of the Strimzi operator (kafka.strimzi.io/v1beta2) in the
examples: no schema ships for them, so they get a structural check."""

MANIFESTS = sorted(
    p for p in K8S.rglob("*.yaml")
    if p.name != "kustomization.yaml" and not p.is_relative_to(CHART)  # templates: test_helm
)


def _validate(doc: dict[str, Any], version: str) -> None:
    if doc["apiVersion"] == "kafka.strimzi.io/v1beta2" and doc["kind"] in STRIMZI_KINDS:
        assert doc["metadata"]["name"] and isinstance(doc["spec"], dict)
        if doc["kind"] != "Kafka":
            assert doc["metadata"]["labels"]["strimzi.io/cluster"]
        return
    kubernetes_validate.validate(doc, version, strict=True)


# --- every file, alone ------------------------------------------------------------


def test_the_schema_check_rejects_unknown_fields() -> None:
    doc = load_documents(K8S / "base" / "api-pdb.yaml")[0]
    doc["spec"]["minAvaliable"] = 1
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: str(p.relative_to(K8S)))
def test_manifest_validates_against_kubernetes_schema(path: Path, version: str) -> None:
    docs = load_documents(path)
    assert docs, f"{path} holds no resource"
    for doc in docs:
        _validate(doc, version)


@pytest.mark.parametrize("kustomization", kustomizations(), ids=lambda p: str(p.relative_to(K8S)))
def test_kustomization_lists_every_manifest_beside_it(kustomization: Path) -> None:
    listed = listed_resources(kustomization)
    for path in listed:
        assert path.exists(), f"{kustomization} lists missing {path}"
    beside = {p.resolve() for p in kustomization.parent.glob("*.yaml")} - {kustomization}
    assert beside <= set(listed), f"not listed in {kustomization}: {beside - set(listed)}"


# --- rendered by kustomize --------------------------------------------------------


@pytest.fixture(scope="module")
def kubectl() -> list[str]:
    return kubectl_command()


def _render(kubectl: list[str], directory: Path) -> list[dict[str, Any]]:
    result = run_tool([*kubectl, "kustomize", str(directory)])
    assert result.returncode == 0, result.stderr
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


@pytest.fixture(scope="module")
def base(kubectl: list[str]) -> list[dict[str, Any]]:
    return _render(kubectl, K8S / "base")


@pytest.fixture(scope="module")
def examples(kubectl: list[str]) -> list[dict[str, Any]]:
    return _render(kubectl, K8S / "examples")


@pytest.fixture(scope="module")
def production(kubectl: list[str], tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The production overlay, with a throwaway api-keys.env as an operator writes."""
    tree = tmp_path_factory.mktemp("k8s") / "k8s"
    shutil.copytree(K8S, tree)
    keys = tree / "overlays" / "production" / "api-keys.env"
    keys.write_text("VIDREC_API__API_KEY=test-key\nVIDREC_API__ADMIN_KEY=test-admin\n")
    return _render(kubectl, tree / "overlays" / "production")


def _one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def _container(workload: dict[str, Any]) -> dict[str, Any]:
    containers = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("rendered", ["base", "examples", "production"])
def test_rendered_kustomization_validates(
    rendered: str, version: str, request: pytest.FixtureRequest
) -> None:
    docs = request.getfixturevalue(rendered)
    assert docs
    for doc in docs:
        _validate(doc, version)


def test_base_holds_the_deployment(base: list[dict[str, Any]]) -> None:
    kinds = {(d["kind"], d["metadata"]["name"]) for d in base}
    assert kinds == {
        ("ConfigMap", "vidrec-settings"),
        ("Secret", "vidrec-api-keys"),
        ("PersistentVolumeClaim", "vidrec-registry"),
        ("Deployment", "vidrec-api"),
        ("Service", "vidrec-api"),
        ("HorizontalPodAutoscaler", "vidrec-api"),
        ("PodDisruptionBudget", "vidrec-api"),
        ("StatefulSet", "vidrec-trainer"),
        ("Service", "vidrec-trainer"),
    }


def test_api_probes_readyz_and_healthz_on_its_port(base: list[dict[str, Any]]) -> None:
    api = _container(_one(base, "Deployment", "vidrec-api"))
    ports = {p["name"]: p["containerPort"] for p in api["ports"]}
    assert ports == {"http": 8000}
    assert api["args"][0] == "serve" and "8000" in api["args"]
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert api["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_api_requests_a_gpu(base: list[dict[str, Any]]) -> None:
    resources = _container(_one(base, "Deployment", "vidrec-api"))["resources"]
    # An extended resource must be requested and limited alike.
    assert resources["requests"]["nvidia.com/gpu"] == resources["limits"]["nvidia.com/gpu"] == "1"


def test_hpa_pdb_and_service_select_the_api(base: list[dict[str, Any]]) -> None:
    deployment = _one(base, "Deployment", "vidrec-api")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    hpa = _one(base, "HorizontalPodAutoscaler", "vidrec-api")["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "vidrec-api",
    }
    assert 1 <= hpa["minReplicas"] < hpa["maxReplicas"]
    pdb = _one(base, "PodDisruptionBudget", "vidrec-api")["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    # The PDB may never block every eviction: fewer pods must always be allowed.
    assert pdb.get("maxUnavailable", 0) >= 1 or pdb["minAvailable"] < hpa["minReplicas"]
    service = _one(base, "Service", "vidrec-api")["spec"]
    assert service["selector"].items() <= pod_labels.items()
    trainer = _one(base, "StatefulSet", "vidrec-trainer")
    trainer_labels = trainer["spec"]["template"]["metadata"]["labels"]
    assert not service["selector"].items() <= trainer_labels.items()


def test_trainer_stops_gracefully_and_is_checked_by_heartbeat(
    base: list[dict[str, Any]],
) -> None:
    trainer = _one(base, "StatefulSet", "vidrec-trainer")
    pod = trainer["spec"]["template"]["spec"]
    assert pod["terminationGracePeriodSeconds"] >= (trainer_shutdown_budget_s() + SHUTDOWN_MARGIN_S)
    container = _container(trainer)
    assert container["args"] == ["train"]
    # Exec probes (no port); what they check is tested in test_trainer_probe.
    assert container["livenessProbe"]["exec"]["command"][:2] == ["python", "-c"]
    assert container["startupProbe"]["exec"] == container["livenessProbe"]["exec"]
    assert trainer["spec"]["serviceName"] == "vidrec-trainer"
    _one(base, "Service", "vidrec-trainer")


def test_workloads_reference_what_the_base_defines(base: list[dict[str, Any]]) -> None:
    names = {(d["kind"], d["metadata"]["name"]) for d in base}
    settings = _one(base, "ConfigMap", "vidrec-settings")["data"]
    registry = _one(base, "PersistentVolumeClaim", "vidrec-registry")
    assert registry["spec"]["accessModes"] == ["ReadWriteMany"]
    for kind, name in (("Deployment", "vidrec-api"), ("StatefulSet", "vidrec-trainer")):
        workload = _one(base, kind, name)
        container = _container(workload)
        refs = [
            ("ConfigMap", s["configMapRef"]["name"])
            if "configMapRef" in s
            else ("Secret", s["secretRef"]["name"])
            for s in container["envFrom"]
        ]
        assert refs == [("ConfigMap", "vidrec-settings"), ("Secret", "vidrec-api-keys")]
        assert set(refs) <= names
        volumes = {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        registry_volume = volumes[mounts[f"{settings['VIDREC_DATA_DIR']}/registry"]]
        assert registry_volume["persistentVolumeClaim"]["claimName"] == "vidrec-registry"
        assert container["securityContext"]["allowPrivilegeEscalation"] is False


def test_secret_holds_no_real_keys(base: list[dict[str, Any]]) -> None:
    secret = _one(base, "Secret", "vidrec-api-keys")
    values = {**secret.get("stringData", {}), **secret.get("data", {})}
    assert set(values) == {"VIDREC_API__API_KEY", "VIDREC_API__ADMIN_KEY"}
    assert all(value == "" for value in values.values())
    # The overlay's real keys file stays out of git.
    ignore = (K8S / "overlays" / "production" / ".gitignore").read_text()
    assert "api-keys.env" in ignore.split()
    tracked = subprocess.run(
        ["git", "ls-files", "k8s"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    assert not any(Path(p).name == "api-keys.env" for p in tracked)


def test_placeholder_keys_keep_production_from_starting(
    base: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cluster given no real keys fails closed instead of serving unauthenticated."""
    secret = _one(base, "Secret", "vidrec-api-keys")["stringData"]
    for key, value in {**_one(base, "ConfigMap", "vidrec-settings")["data"], **secret}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises((ConfigurationError, ValidationError), match="api_key"):
        Settings()


def test_production_overlay_supplies_the_keys(production: list[dict[str, Any]]) -> None:
    secret = _one(production, "Secret", "vidrec-api-keys")
    assert set(secret["data"]) == {"VIDREC_API__API_KEY", "VIDREC_API__ADMIN_KEY"}
    assert "stringData" not in secret  # replaced, not merged with the empty base
    assert {d["metadata"].get("namespace") for d in production if d["kind"] != "Namespace"} == {
        "vidrec"
    }


def test_settings_configmap_is_a_valid_production_settings_tree(
    base: list[dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    data = _one(base, "ConfigMap", "vidrec-settings")["data"]
    sections = {key.removeprefix("VIDREC_").split("__")[0].lower() for key in data}
    assert sections <= set(Settings.model_fields) | PENDING_SECTIONS
    for key, value in data.items():
        monkeypatch.setenv(key, value)
    # Real keys stand in for the Secret's placeholders, as in a real cluster.
    monkeypatch.setenv("VIDREC_API__API_KEY", secrets.token_hex(32))
    monkeypatch.setenv("VIDREC_API__ADMIN_KEY", secrets.token_hex(32))
    settings = Settings()
    assert settings.environment == "production"
    assert settings.event_log.backend == "kafka"
    assert settings.sparse.backend == "redis" and settings.stores.backend == "redis"
    # The sparse tables pipeline keys across hash slots: no Redis Cluster.
    assert settings.redis.cluster is False


def test_examples_match_what_the_settings_point_at(
    base: list[dict[str, Any]], examples: list[dict[str, Any]]
) -> None:
    data = _one(base, "ConfigMap", "vidrec-settings")["data"]
    namespace = data["VIDREC_EVENT_LOG__TOPIC_NAMESPACE"]
    topics = {d["metadata"]["name"]: d["spec"] for d in examples if d["kind"] == "KafkaTopic"}
    assert set(topics) == {
        events_topic(namespace),
        dead_letter_topic(namespace),
        control_topic(namespace),
    }
    assert topics[events_topic(namespace)]["partitions"] == int(data["VIDREC_KAFKA__PARTITIONS"])
    assert topics[control_topic(namespace)]["partitions"] == 1
    kafka = next(d for d in examples if d["kind"] == "Kafka")
    assert data["VIDREC_KAFKA__BOOTSTRAP_SERVERS"] == (
        f"{kafka['metadata']['name']}-kafka-bootstrap:9092"
    )
    assert all(
        t["replicas"] == int(data["VIDREC_KAFKA__REPLICATION_FACTOR"]) for t in topics.values()
    )
    redis_url = urlparse(data["VIDREC_REDIS__URL"])
    redis_service = _one(examples, "Service", redis_url.hostname or "")
    assert redis_service["spec"]["ports"][0]["port"] == redis_url.port
    conf = _one(examples, "ConfigMap", "redis-config")["data"]["redis.conf"].split("\n")
    assert "appendonly yes" in conf
