"""The Dockerfile, parsed: stages, the non-root user, the health check, and a
build context that holds what it copies."""

from __future__ import annotations

import fnmatch
import re

import pytest

from tests.deploy.deployfiles import (
    DOCKERFILE,
    DOCKERIGNORE,
    K8S,
    ROOT,
    Dockerfile,
    Stage,
    load_documents,
    parse_dockerfile,
)


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


@pytest.fixture(scope="module")
def final(dockerfile: Dockerfile) -> Stage:
    return dockerfile.stages[-1]


def _resolve(dockerfile: Dockerfile, stage: Stage) -> str:
    """The final stage's base image, through stage names and global ARGs."""
    names = {s.name: s for s in dockerfile.stages if s.name}
    while stage.base in names:
        stage = names[stage.base]
    return re.sub(r"\$\{(\w+)\}", lambda m: dockerfile.args.get(m.group(1), ""), stage.base)


def test_is_multi_stage_on_a_cuda_runtime_base(dockerfile: Dockerfile, final: Stage) -> None:
    assert len(dockerfile.stages) >= 2
    base = _resolve(dockerfile, final)
    assert base.startswith("nvidia/cuda:"), base
    # onnxruntime-gpu needs the CUDA and cuDNN runtime libraries, not the devel image.
    assert "cudnn" in base and "runtime" in base and "devel" not in base
    # The final image gets the built environment, not the compilers of the build stage.
    assert any(args.startswith("--from=") for args in final.all("COPY"))
    assert not any("build-essential" in run for run in final.all("RUN"))


def test_runs_as_a_non_root_user_that_the_kubernetes_pods_match(final: Stage) -> None:
    users = final.all("USER")
    assert users, "the final stage sets no USER: the container would run as root"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    # The pods pin the same numeric uid (runAsNonRoot needs a numeric one to check).
    uid = next(int(arg.split("=")[1]) for arg in final.all("ARG") if arg.startswith("UID="))
    assert uid != 0
    for path in (K8S / "base").glob("*.yaml"):
        for doc in load_documents(path):
            pod = doc.get("spec", {}).get("template", {}).get("spec")
            if pod:
                assert pod["securityContext"]["runAsUser"] == uid, path.name
                assert pod["securityContext"]["runAsNonRoot"] is True


def test_health_check_probes_healthz_of_the_served_port(final: Stage) -> None:
    checks = final.all("HEALTHCHECK")
    assert len(checks) == 1
    assert "CMD" in checks[0] and "NONE" not in checks[0].split()
    assert "/healthz" in checks[0] and ":8000" in checks[0]
    assert "8000" in " ".join(final.all("EXPOSE"))


def test_default_command_serves_and_train_is_one_argument_away(final: Stage) -> None:
    assert final.all("ENTRYPOINT") == ['["vidrec"]']
    cmd = final.all("CMD")[-1]
    assert cmd.startswith('["serve"') and '"0.0.0.0"' in cmd and '"8000"' in cmd


def test_registry_lives_under_the_data_dir(final: Stage) -> None:
    env = " ".join(final.all("ENV"))
    assert "VIDREC_DATA_DIR=/data" in env
    assert any("/data/registry" in run for run in final.all("RUN"))


def _ignored(path: str, patterns: list[str]) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, pattern) or fnmatch.fnmatch(path.split("/")[0], pattern):
            ignored = not negate
    return ignored


def test_build_context_keeps_what_the_dockerfile_copies(dockerfile: Dockerfile) -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    copied: list[str] = []
    for stage in dockerfile.stages:
        for args in stage.all("COPY"):
            if args.startswith("--from="):
                continue
            copied.extend(w for w in args.split()[:-1] if not w.startswith("--"))
    assert {"pyproject.toml", "README.md", "app", "trainer", "feature_store"} <= set(copied)
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not _ignored(source, patterns), f".dockerignore drops {source}"
    for heavy in (".venv", ".git", "vidrec-data", "tests"):
        assert _ignored(heavy, patterns), f".dockerignore sends {heavy} to the daemon"
