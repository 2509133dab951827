"""Export to the registry: whole versions only, activation, pruning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from feature_store.features.schema import default_schema
from feature_store.models.registry import ModelRegistry
from trainer import export as export_module
from trainer.export import publish
from trainer.model import WideDeep

SCHEMA = default_schema()


def _publish(
    registry: ModelRegistry, model: WideDeep, activate: bool = True, keep: int = 10
) -> str:
    return publish(
        registry,
        model,
        SCHEMA,
        family="main",
        training_position={"positions": {"0": 12}, "events_total": 12},
        metrics={"auc": 0.7, "logloss": float("nan")},
        activate=activate,
        keep=keep,
    )


def test_publish_writes_model_and_manifest_and_activates(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    version = _publish(registry, WideDeep(SCHEMA))
    assert registry.active() == version
    manifest = registry.manifest(version)
    assert manifest.schema_hash == SCHEMA.schema_hash()
    assert manifest.table_dims == SCHEMA.table_dims()
    assert manifest.training_position["events_total"] == 12
    assert manifest.metrics == {"auc": 0.7}  # NaN is left out, not written as invalid JSON
    assert registry.model_path(version).stat().st_size > 0


def test_failed_export_leaves_no_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = ModelRegistry(tmp_path)
    first = _publish(registry, WideDeep(SCHEMA))

    def broken(*args: object, **kwargs: object) -> None:
        Path(str(args[2])).write_bytes(b"partial")
        raise RuntimeError("exporter crashed")

    monkeypatch.setattr(export_module, "export_onnx", broken)
    with pytest.raises(RuntimeError):
        _publish(registry, WideDeep(SCHEMA))
    assert registry.list_versions() == [first]
    assert registry.active() == first
    assert not [p for p in registry.versions_dir.iterdir() if p.name.startswith(".")]


def test_prune_keeps_the_active_version(tmp_path: Path) -> None:
    registry = ModelRegistry(tmp_path)
    model = WideDeep(SCHEMA)
    active = _publish(registry, model, activate=True)
    for _ in range(4):
        with torch.no_grad():
            model.bias.add_(0.1)
        _publish(registry, model, activate=False, keep=2)
    versions = registry.list_versions()
    assert active in versions
    assert registry.active() == active
    assert len(versions) == 3  # the newest two plus the active one
