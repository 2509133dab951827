"""The trainer's health probe, run for real against a redis-server.

The trainer listens on no port; it proves it is alive by refreshing its
status key in Redis with a TTL (``feature_store.constants.TRAINER_STATUS``).
Kubernetes (liveness and startup probes) and compose (healthcheck) run the
same one-line command, taken here from the files themselves.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
import redis

from feature_store.constants import TRAINER_STATUS
from feature_store.settings import Settings
from tests.deploy.deployfiles import COMPOSE_FILE, K8S, ROOT, load_documents

pytestmark = pytest.mark.redis


def _k8s_probe() -> list[str]:
    docs = load_documents(K8S / "base" / "trainer-statefulset.yaml")
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    command: list[str] = container["livenessProbe"]["exec"]["command"]
    return command


def _compose_probe() -> list[str]:
    services: dict[str, Any] = load_documents(COMPOSE_FILE)[0]["services"]
    test: list[str] = services["trainer"]["healthcheck"]["test"]
    assert test[0] == "CMD"
    return test[1:]


PROBES = {"k8s": _k8s_probe, "compose": _compose_probe}


def _run(command: list[str], redis_url: str) -> int:
    env = {
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "VIDREC_REDIS__URL": redis_url,
    }
    # The image runs `python` from its venv; here, this interpreter.
    argv = [sys.executable if command[0] == "python" else command[0], *command[1:]]
    return subprocess.run(argv, env=env, capture_output=True, timeout=20).returncode


def _heartbeat(redis_url: str, ttl_ms: int) -> None:
    """What the trainer writes: its status as JSON under its group id, with a TTL."""
    group_id = Settings().trainer.group_id
    client = redis.Redis.from_url(redis_url)
    try:
        client.set(f"{TRAINER_STATUS}{group_id}", json.dumps({"state": "running"}), px=ttl_ms)
    finally:
        client.close()


@pytest.mark.parametrize("where", sorted(PROBES))
def test_probe_fails_without_a_heartbeat_and_passes_with_one(where: str, redis_url: str) -> None:
    command = PROBES[where]()
    assert _run(command, redis_url) != 0
    _heartbeat(redis_url, ttl_ms=60_000)
    assert _run(command, redis_url) == 0


@pytest.mark.parametrize("where", sorted(PROBES))
def test_probe_fails_once_the_heartbeat_expired(where: str, redis_url: str) -> None:
    _heartbeat(redis_url, ttl_ms=1)
    client = redis.Redis.from_url(redis_url)
    try:
        # Redis expires lazily on access; wait for the 1 ms TTL to pass.
        while client.pttl(f"{TRAINER_STATUS}{Settings().trainer.group_id}") > 0:
            pass
    finally:
        client.close()
    assert _run(PROBES[where](), redis_url) != 0


def test_probe_fails_when_redis_is_unreachable() -> None:
    assert _run(_k8s_probe(), "redis://127.0.0.1:1/0") != 0
