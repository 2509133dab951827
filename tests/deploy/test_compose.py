"""docker-compose.yml, validated and normalised by Docker Compose v2 itself
(``docker compose config``, which needs no engine), then checked for what a
user of ``docker compose up`` relies on."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path
from typing import Any

import pytest

from feature_store.constants import control_topic, dead_letter_topic, events_topic
from feature_store.settings import Settings
from tests.deploy.deployfiles import (
    COMPOSE_FILE,
    PENDING_SECTIONS,
    SHUTDOWN_MARGIN_S,
    compose_command,
    run_tool,
    trainer_shutdown_budget_s,
)

VIDREC_SERVICES = ("trainer", "api", "api-cpu")


@pytest.fixture(scope="module")
def compose() -> list[str]:
    return compose_command()


@pytest.fixture(scope="module")
def config(compose: list[str]) -> dict[str, Any]:
    """The file as Compose resolves it (anchors merged, defaults interpolated),
    with every profile enabled so that ``api-cpu`` is included."""
    result = run_tool(
        [*compose, "-f", str(COMPOSE_FILE), "--profile", "cpu", "config", "--format", "json"]
    )
    assert result.returncode == 0, result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def _seconds(duration: str) -> float:
    """Compose's normalised durations: ``2m0s``, ``30s``, ``1m30s``."""
    units = {"h": 3600, "m": 60, "s": 1}
    return sum(float(n) * units[u] for n, u in re.findall(r"([\d.]+)([hms])", duration))


def test_validator_rejects_an_invalid_file(compose: list[str], tmp_path: Path) -> None:
    """The check below means something: an unknown key is refused."""
    bad = tmp_path / "compose.yaml"
    bad.write_text("services:\n  api:\n    image: vidrec\n    gpus_please: all\n")
    result = run_tool([*compose, "-f", str(bad), "config", "-q"], cwd=tmp_path)
    assert result.returncode != 0
    assert "gpus_please" in result.stderr


def test_compose_file_validates(compose: list[str]) -> None:
    result = run_tool([*compose, "-f", str(COMPOSE_FILE), "config", "-q"])
    assert result.returncode == 0, result.stderr


def test_default_up_starts_the_whole_stack(compose: list[str]) -> None:
    result = run_tool([*compose, "-f", str(COMPOSE_FILE), "config", "--services"])
    assert result.returncode == 0, result.stderr
    assert set(result.stdout.split()) == {"kafka", "kafka-init", "redis", "trainer", "api"}


def test_every_long_running_service_has_a_health_check(config: dict[str, Any]) -> None:
    for name in ("kafka", "redis", "trainer", "api", "api-cpu"):
        check = config["services"][name].get("healthcheck", {})
        assert check.get("test") and not check.get("disable"), name
    api_check = " ".join(config["services"]["api"]["healthcheck"]["test"])
    assert "/healthz" in api_check
    # The trainer has no port: its check is the heartbeat probe of test_trainer_probe.
    assert config["services"]["trainer"]["healthcheck"]["test"][:3] == ["CMD", "python", "-c"]


def test_api_reserves_a_gpu_and_the_cpu_variant_does_not(config: dict[str, Any]) -> None:
    devices = config["services"]["api"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] and d["driver"] == "nvidia" for d in devices)
    assert "deploy" not in config["services"]["api-cpu"] or not config["services"]["api-cpu"][
        "deploy"
    ].get("resources")
    assert config["services"]["api-cpu"]["profiles"] == ["cpu"]
    for name in ("api", "api-cpu"):
        assert config["services"][name]["command"][0] == "serve"
        ports = config["services"][name]["ports"]
        assert [p["target"] for p in ports] == [8000]


def test_redis_persists_with_aof_on_a_volume(config: dict[str, Any]) -> None:
    redis = config["services"]["redis"]
    command = redis["command"]
    assert command[command.index("--appendonly") + 1] == "yes"
    mounts = {m["target"]: m for m in redis["volumes"]}
    assert mounts["/data"]["type"] == "volume" and mounts["/data"]["source"] == "redis-data"


def test_kafka_is_a_single_kraft_node(config: dict[str, Any]) -> None:
    env = config["services"]["kafka"]["environment"]
    assert set(env["KAFKA_PROCESS_ROLES"].split(",")) == {"broker", "controller"}
    assert not any("ZOOKEEPER" in key for key in env)
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    # KRaft formats its storage with this id: a UUID in unpadded base64url.
    assert len(base64.urlsafe_b64decode(env["CLUSTER_ID"] + "==")) == 16
    mounts = {m["target"]: m["source"] for m in config["services"]["kafka"]["volumes"]}
    assert mounts[env["KAFKA_LOG_DIRS"]] == "kafka-data"


def test_init_creates_the_topics_vidrec_uses_before_vidrec_starts(
    config: dict[str, Any],
) -> None:
    init = config["services"]["kafka-init"]
    assert init["restart"] == "no"
    script = " ".join(init["command"])
    namespace = config["services"]["trainer"]["environment"]["VIDREC_EVENT_LOG__TOPIC_NAMESPACE"]
    for topic in (events_topic(namespace), dead_letter_topic(namespace), control_topic(namespace)):
        assert f"--topic {topic} " in script, topic
    assert (
        init["environment"]["PARTITIONS"]
        == config["services"]["trainer"]["environment"]["VIDREC_KAFKA__PARTITIONS"]
    )
    for name in VIDREC_SERVICES:
        depends = config["services"][name]["depends_on"]
        assert depends["kafka-init"]["condition"] == "service_completed_successfully"
        assert depends["redis"]["condition"] == "service_healthy"


def test_trainer_and_api_share_the_model_registry(config: dict[str, Any]) -> None:
    for name in VIDREC_SERVICES:
        service = config["services"][name]
        data_dir = service["environment"]["VIDREC_DATA_DIR"]
        mounts = {m["target"]: m["source"] for m in service["volumes"]}
        assert mounts[f"{data_dir}/registry"] == "model-registry", name
    trainer_mounts = {m["target"]: m["source"] for m in config["services"]["trainer"]["volumes"]}
    assert trainer_mounts["/data"] == "trainer-data"
    assert {"model-registry", "redis-data", "kafka-data", "trainer-data"} <= set(config["volumes"])


def test_trainer_gets_its_shutdown_budget_before_sigkill(config: dict[str, Any]) -> None:
    grace = _seconds(config["services"]["trainer"]["stop_grace_period"])
    assert grace >= trainer_shutdown_budget_s() + SHUTDOWN_MARGIN_S


@pytest.mark.parametrize("service", VIDREC_SERVICES)
def test_service_environment_is_a_valid_settings_tree(
    config: dict[str, Any], service: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = config["services"][service]["environment"]
    sections = {key.removeprefix("VIDREC_").split("__")[0].lower() for key in env}
    assert sections <= set(Settings.model_fields) | PENDING_SECTIONS
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = Settings()
    assert settings.sparse.backend == "redis" and settings.stores.backend == "redis"
    assert settings.event_log.backend == "kafka"
    assert settings.redis.url.startswith("redis://redis:")
    assert settings.kafka.bootstrap_servers == "kafka:9092"
