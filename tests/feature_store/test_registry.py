"""The model registry never shows a partial version and keeps what it must."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from feature_store.errors import Conflict, NotFound
from feature_store.models.registry import Manifest, ModelRegistry


def publish(registry: ModelRegistry, n: int, payload: bytes = b"onnx") -> str:
    version = f"main-{n:04d}"
    registry.publish(
        lambda path: path.write_bytes(payload),
        Manifest(
            version=version,
            family="main",
            created_at_ms=int(time.time() * 1000) + n,
            schema_hash="abc",
            table_dims={"user": 16},
            metrics={"auc": 0.7},
        ),
    )
    return version


def test_publish_activate_rollback(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    assert registry.active() is None
    first, second = publish(registry, 1), publish(registry, 2)
    assert registry.list_versions() == [first, second]
    registry.activate(first)
    registry.activate(second)
    assert registry.active() == second
    assert registry.manifest(second).metrics == {"auc": 0.7}
    assert registry.model_path(second).read_bytes() == b"onnx"
    assert registry.rollback() == first
    assert registry.active() == first
    with pytest.raises(Conflict):
        registry.rollback()


def test_failed_export_leaves_nothing_visible(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)

    def half_written(path: Path) -> None:
        path.write_bytes(b"half")
        raise RuntimeError("exporter crashed")

    with pytest.raises(RuntimeError):
        registry.publish(
            half_written,
            Manifest(version="bad", family="main", created_at_ms=1, schema_hash="x", table_dims={}),
        )
    assert registry.list_versions() == []
    assert list((tmp_path / "versions").iterdir()) == []


def test_unknown_version_is_not_found(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    with pytest.raises(NotFound):
        registry.activate("nope")


@pytest.mark.parametrize("name", ["../main-0001", "main-0001/../../x", "a\x00b", "main-0001\n"])
def test_a_name_that_is_no_version_name_is_not_found(tmp_path: Path, name: str) -> None:
    """An operator's name never reaches the file system as a path (nor a NUL byte, a 500)."""
    registry = ModelRegistry(tmp_path / "registry")
    publish(registry, 1)
    (tmp_path / "x").mkdir()
    with pytest.raises(NotFound, match="not a model version name"):
        registry.activate(name)
    with pytest.raises(NotFound):
        registry.model_path(name)


def test_prune_keeps_newest_and_never_the_active(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    versions = [publish(registry, n) for n in range(6)]
    registry.activate(versions[0])
    deleted = registry.prune(keep=2)
    assert versions[0] not in deleted
    assert set(registry.list_versions()) == {versions[0], versions[4], versions[5]}


def test_pointer_is_shared_between_registry_objects(tmp_path: Path) -> None:
    writer, reader = ModelRegistry(tmp_path), ModelRegistry(tmp_path)
    version = publish(writer, 1)
    writer.activate(version)
    assert reader.active() == version


def test_automatic_activation_stays_within_the_active_family(tmp_path: Path) -> None:
    """A trainer's exports are activated only while its family is the active one."""
    registry = ModelRegistry(tmp_path)

    def export(family: str, n: int) -> str:
        version = f"{family}-20260101T0000{n:02d}-00000"
        registry.publish(lambda path: path.write_bytes(b"onnx"), Manifest(
            version=version, family=family, created_at_ms=n, schema_hash="abc", table_dims={}))
        return version

    live = export("main", 1)
    assert registry.activate(live, within_family="main")  # nothing active yet
    retrain = export("r2026", 2)
    assert not registry.activate(retrain, within_family="r2026")  # main is the active family
    assert registry.active() == live
    assert registry.latest_of("r2026") == retrain and registry.latest_of("main") == live
    registry.activate(retrain)  # an operator promotes it (or an experiment's winner)
    assert not registry.activate(export("main", 3), within_family="main")
    newer = export("r2026", 4)
    assert registry.activate(newer, within_family="r2026")  # the promoted family follows
    assert registry.active() == newer and registry.latest_of("main") == "main-20260101T000003-00000"


def test_rollback_undoes_the_newest_operator_activation(tmp_path: Path) -> None:
    """A promoted family's trainer keeps it current; a rollback undoes the promotion."""
    registry = ModelRegistry(tmp_path)

    def export(family: str, n: int) -> str:
        version = f"{family}-20260101T0000{n:02d}-00000"
        registry.publish(lambda path: path.write_bytes(b"onnx"), Manifest(
            version=version, family=family, created_at_ms=n, schema_hash="abc", table_dims={}))
        return version

    mains = [export("main", n) for n in range(3)]
    for version in mains:
        assert registry.activate(version, within_family="main")
    assert registry.rollback_target() == mains[1]  # no decision: one step back
    winner = export("r1", 10)
    registry.activate(winner)  # an operator promotes it (an experiment's winner)
    follow = [export("r1", n) for n in range(11, 25)]  # more than the history's depth
    for version in follow:
        assert registry.activate(version, within_family="r1")
    assert registry.rollback_target() == mains[2]
    assert registry.rollback() == mains[2]
    assert not registry.activate(export("r1", 30), within_family="r1")  # it stays out
    assert registry.activate(export("main", 31), within_family="main")  # main follows
    assert registry.rollback() == mains[2]  # one step back again
    with pytest.raises(Conflict):  # mains[1] was one of main's run: kept as one step
        registry.rollback()


def test_a_pointer_written_before_activations_were_recorded_steps_back(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    first, second, third = (publish(registry, n) for n in range(3))
    old = {"version": third, "previous": [second, first]}
    (tmp_path / "ACTIVE").write_text(json.dumps(old))
    assert registry.rollback_target() == second
    assert registry.rollback() == second and registry.rollback() == first
