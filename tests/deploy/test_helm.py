"""The Helm chart (``k8s/helm/vidrec``): linted and rendered by Helm itself, every
object valid against the Kubernetes schemas, and with default values the same
objects as the kustomize base (``k8s/base``), so the two install paths cannot
drift apart.

Helm comes from a ``helm`` on ``PATH`` or, without one, from the
``helm-python-sdk`` wheel of the test extra (Helm's Go library: the same lint
and template engine); without either these tests skip.
"""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from tests.deploy.deployfiles import (
    CHART,
    K8S,
    Helm,
    HelmError,
    helm_tool,
    kubectl_command,
    run_tool,
)
from tests.deploy.test_k8s import K8S_VERSIONS

HELM_ONLY_LABELS = (
    "app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version",
    "helm.sh/chart",
)
"""Labels Helm's conventions add (a release's identity), absent from the kustomize base."""

SAME_AS_BASE = {"image": {"tag": "latest"}}
"""The base pins ``vidrec:latest``; the chart's default tag is its appVersion."""


@pytest.fixture(scope="module")
def helm() -> Helm:
    return helm_tool()


def render(helm: Helm, values: dict[str, Any], **kwargs: Any) -> list[dict[str, Any]]:
    return helm.template(CHART, values, **kwargs)


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def container(workload: dict[str, Any]) -> dict[str, Any]:
    containers: list[dict[str, Any]] = workload["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_helm_lint_is_clean(helm: Helm, version: str) -> None:
    assert helm.lint(CHART, {}, version) == []
    production = {"apiKeys": {"existingSecret": "keys"}, "registry": {"storageClassName": "nfs"}}
    assert helm.lint(CHART, production, version) == []


VARIANTS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "cpu only, no autoscaling": {"api": {"gpus": 0, "autoscaling": {"enabled": False}}},
    "external keys and registry": {
        "apiKeys": {"existingSecret": "vidrec-keys"}, "registry": {"existingClaim": "models"},
    },
    "storage classes and two trainers": {
        "registry": {"storageClassName": "nfs-client"},
        "trainer": {"replicas": 2, "storage": {"storageClassName": "ssd"}},
        "settings": {"VIDREC_TRAINER__GROUP_SYNC": "true"},
    },
}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_rendered_objects_validate_against_kubernetes_schema(
    helm: Helm, variant: str, version: str
) -> None:
    docs = render(helm, VARIANTS[variant])
    assert docs
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)


def _normalized(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` without what Helm adds by convention: its labels and the restart checksums."""
    doc = copy.deepcopy(doc)
    doc["metadata"].pop("labels", None)
    spec = doc.get("spec", {})
    for selector in (spec.get("selector", {}).get("matchLabels"), spec.get("selector")):
        if isinstance(selector, dict):
            for label in HELM_ONLY_LABELS:
                selector.pop(label, None)
    template = spec.get("template", {}).get("metadata", {})
    for label in HELM_ONLY_LABELS:
        template.get("labels", {}).pop(label, None)
    annotations = template.get("annotations", {})
    for key in [k for k in annotations if k.startswith("checksum/")]:
        del annotations[key]
    if not annotations:
        template.pop("annotations", None)
    return doc


def test_default_values_render_the_kustomize_base(helm: Helm) -> None:
    result = run_tool([*kubectl_command(), "kustomize", str(K8S / "base")])
    assert result.returncode == 0, result.stderr
    import yaml

    base = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(result.stdout) if d}
    chart = {(d["kind"], d["metadata"]["name"]): d for d in render(helm, SAME_AS_BASE)}
    assert set(chart) == set(base)
    for key, doc in chart.items():
        assert _normalized(doc) == _normalized(base[key]), key
        labels = doc["metadata"]["labels"]
        assert labels["app.kubernetes.io/managed-by"] == "Helm"
        assert labels["app.kubernetes.io/part-of"] == "vidrec"


def test_settings_or_keys_changes_restart_the_pods(helm: Helm) -> None:
    """kubectl apply leaves pods on old settings; the chart's checksums roll them."""
    def checksums(values: dict[str, Any]) -> dict[str, str]:
        api = one(render(helm, values), "Deployment", "vidrec-api")
        return dict(api["spec"]["template"]["metadata"]["annotations"])

    before = checksums({})
    assert checksums({"settings": {"VIDREC_KAFKA__PARTITIONS": "12"}}) != before
    assert checksums({"apiKeys": {"apiKey": "k" * 32, "adminKey": "a" * 32}}) != before


def test_values_select_what_renders(helm: Helm) -> None:
    cpu = render(helm, VARIANTS["cpu only, no autoscaling"])
    api = one(cpu, "Deployment", "vidrec-api")
    assert "nvidia.com/gpu" not in container(api)["resources"]["requests"]
    assert "tolerations" not in api["spec"]["template"]["spec"]
    assert not [d for d in cpu if d["kind"] == "HorizontalPodAutoscaler"]

    external = render(helm, VARIANTS["external keys and registry"])
    assert not [d for d in external if d["kind"] in ("Secret", "PersistentVolumeClaim")]
    api = one(external, "Deployment", "vidrec-api")
    assert container(api)["envFrom"][1] == {"secretRef": {"name": "vidrec-keys"}}
    volumes = {v["name"]: v for v in api["spec"]["template"]["spec"]["volumes"]}
    assert volumes["registry"]["persistentVolumeClaim"]["claimName"] == "models"

    scaled = render(helm, VARIANTS["storage classes and two trainers"])
    assert one(scaled, "PersistentVolumeClaim", "vidrec-registry")["spec"][
        "storageClassName"] == "nfs-client"
    trainer = one(scaled, "StatefulSet", "vidrec-trainer")
    assert trainer["spec"]["replicas"] == 2
    assert trainer["spec"]["volumeClaimTemplates"][0]["spec"]["storageClassName"] == "ssd"
    settings = one(scaled, "ConfigMap", "vidrec-settings")["data"]
    assert settings["VIDREC_TRAINER__GROUP_SYNC"] == "true"
    assert settings["VIDREC_REDIS__URL"] == "redis://redis:6379/0"  # defaults kept beside it


def test_a_second_release_gets_its_own_names_and_selectors(helm: Helm) -> None:
    docs = render(helm, {}, release="canary")
    api = one(docs, "Deployment", "canary-vidrec-api")
    assert api["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"] == "canary"
    assert one(docs, "Service", "canary-vidrec-api")["spec"]["selector"][
        "app.kubernetes.io/instance"] == "canary"
    assert container(api)["envFrom"][0] == {"configMapRef": {"name": "canary-vidrec-settings"}}


@pytest.mark.parametrize(
    ("values", "says"),
    [
        ({"api": {"replicas": "two"}}, "/api/replicas"),
        ({"api": {"replica": 2}}, "replica"),  # a typo is refused, not ignored
        ({"settings": {"REDIS_URL": "redis://x"}}, "REDIS_URL"),
        ({"settings": {"VIDREC_KAFKA__PARTITIONS": 8}}, "VIDREC_KAFKA__PARTITIONS"),
    ],
)
def test_bad_values_are_refused_naming_them(
    helm: Helm, values: dict[str, Any], says: str
) -> None:
    with pytest.raises(HelmError, match=says):
        render(helm, values)
    assert helm.lint(CHART, values, K8S_VERSIONS[0])


def test_install_notes_warn_about_missing_keys(helm: Helm) -> None:
    if helm.binary is not None:
        pytest.skip("notes are read through Helm's library")
    assert "no API keys were given" in helm.notes(CHART, {})
    given = helm.notes(CHART, {"apiKeys": {"existingSecret": "keys"}})
    assert "no API keys" not in given and "model_version: null" in given
