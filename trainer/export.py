"""Export the dense network to ONNX and publish it as a registry version.

The exported graph is the same :class:`~trainer.model.WideDeep` module the
trainer steps (wrapped in :class:`~trainer.model.Heads`: one output per
ranking head, named by :data:`feature_store.models.model_io.HEAD_OUTPUTS`), traced
with the input and output names of :mod:`feature_store.models.model_io`; the
batch size ``B`` and every table's ``N_t`` are dynamic axes, so one file
serves any batch. The sparse rows are *inputs*, not weights: the server
pulls them from the same tables at request time, so a version stays
current as embeddings keep training.

Exporters: ``torchscript`` (torch's legacy tracer, ~0.2 s for this model,
deprecated by torch but present in 2.13) is the default because the export
runs between training batches; ``dynamo`` (torch.export, ~4 s) is the
supported path going forward and gives the same graph semantics. Both are
checked for parity against torch by the tests.
"""

from __future__ import annotations

import copy
import threading
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from feature_store.features.columns import MultiValued
from feature_store.features.schema import FeatureSchema
from feature_store.models import model_io
from feature_store.models.registry import Manifest, ModelRegistry
from trainer.model import Heads, WideDeep

ONNX_EXPORT_LOCK = threading.Lock()
"""Held around every ``torch.onnx.export`` of this process. torch's exporter keeps
global state (``GLOBALS.in_onnx_export``): two trainers of one process (the live one
and a retrain family, in ``vidrec up``) exporting at the same moment made one of them
fail with ``AssertionError: GLOBALS.in_onnx_export must be False``."""

Exporter = Literal["torchscript", "dynamo"]
OPSET = 17


def example_inputs(
    schema: FeatureSchema,
    batch: int,
    rng: np.random.Generator,
    rows_per_table: int | None = None,
    wide_rows: int | None = None,
) -> list[Tensor]:
    """Random inputs of the right shapes and index ranges (padding included); the
    sequence columns have ``batch - 1`` rows (``S``), read through a random ``seq_row``,
    so an export never takes ``S`` for ``B``."""
    sequences = max(1, batch - 1)
    tensors: list[Tensor] = []
    sizes: dict[str, int] = {}
    for table, dim in schema.table_dims().items():
        n = rows_per_table if rows_per_table is not None else int(rng.integers(1, 3 * batch + 2))
        sizes[table] = n
        tensors.append(torch.from_numpy(rng.normal(0, 0.1, (n, dim)).astype(np.float32)))
    for col in schema.embedded:
        n = sizes[col.table_name()]
        rows = sequences if model_io.per_request(col) else batch
        shape = (rows, col.max_len) if isinstance(col, MultiValued) else (rows,)
        tensors.append(torch.from_numpy(rng.integers(0, n + 1, size=shape).astype(np.int64)))
    n_wide = wide_rows if wide_rows is not None else int(rng.integers(1, 4 * batch + 2))
    tensors.append(torch.from_numpy(rng.normal(0, 0.1, (n_wide, 1)).astype(np.float32)))
    tensors.append(
        torch.from_numpy(rng.integers(0, n_wide, size=(batch, schema.wide_width)).astype(np.int64))
    )
    tensors.append(
        torch.from_numpy(rng.uniform(0, 5, (batch, len(schema.dense))).astype(np.float32))
    )
    if model_io.has_sequences(schema):
        tensors.append(torch.from_numpy(rng.integers(0, sequences, size=batch)))
    return tensors


def dynamic_axes(schema: FeatureSchema, outputs: Sequence[str]) -> dict[str, dict[int, str]]:
    """The legacy exporter's dynamic axes: ``B`` rows, ``S`` sequences, ``N_t`` table rows."""
    axes: dict[str, dict[int, str]] = {name: {0: "B"} for name in model_io.input_names(schema)}
    for col in schema.embedded:
        if model_io.per_request(col):
            axes[model_io.index_input(col.name)] = {0: "S"}
    for table in schema.table_dims():
        axes[model_io.embedding_input(table)] = {0: f"N_{table}"}
    axes[model_io.WIDE_WEIGHTS] = {0: "N_wide"}
    for output in outputs:
        axes[output] = {0: "B"}
    return axes


def export_onnx(
    model: WideDeep, schema: FeatureSchema, path: Path, exporter: Exporter = "torchscript"
) -> None:
    """Write ``model`` as an ONNX file at ``path`` (inputs per ``model_io``)."""
    module = Heads(copy.deepcopy(model).eval().for_requests())  # never disturb the training copy
    names = model_io.input_names(schema)
    example = example_inputs(schema, 4, np.random.default_rng(0), rows_per_table=6, wide_rows=9)
    tables = list(schema.table_dims())
    if exporter == "dynamo":
        _export_dynamo(module, schema, tables, example, names, path)
        return
    axes = dynamic_axes(schema, model_io.OUTPUT_NAMES)
    with ONNX_EXPORT_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the legacy exporter's deprecation notice
        torch.onnx.export(
            module,
            tuple(example),
            str(path),
            input_names=names,
            output_names=model_io.OUTPUT_NAMES,
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )


def _export_dynamo(
    model: Heads,
    schema: FeatureSchema,
    tables: list[str],
    example: list[Tensor],
    names: list[str],
    path: Path,
) -> None:
    from torch.export import Dim

    batch, rows = Dim("B"), Dim("S")
    shapes: list[dict[int, Any]] = [{0: Dim(f"N_{t}")} for t in tables]
    shapes += [{0: rows if model_io.per_request(c) else batch} for c in schema.embedded]
    shapes += [{0: Dim("N_wide")}, {0: batch}, {0: batch}]
    if model_io.has_sequences(schema):
        shapes.append({0: batch})
    with ONNX_EXPORT_LOCK, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model,
            tuple(example),
            input_names=names,
            output_names=model_io.OUTPUT_NAMES,
            dynamic_shapes=(tuple(shapes),),
            opset_version=18,
            dynamo=True,
            external_data=False,
            verbose=False,
        )
        assert program is not None
        program.save(str(path))


def publish(
    registry: ModelRegistry,
    model: WideDeep,
    schema: FeatureSchema,
    *,
    family: str,
    training_position: dict[str, Any],
    metrics: dict[str, float],
    activate: bool | Literal["own_family"],
    keep: int,
    exporter: Exporter = "torchscript",
    extra: dict[str, Any] | None = None,
    artifacts: tuple[list[str], Callable[[Path], None]] | None = None,
) -> str:
    """Export ``model`` as a new version; activate and prune as asked; returns its name.

    ``activate="own_family"`` (the trainer's automatic activation) activates only
    while the active version is of ``family`` (or none is): a family an operator
    promoted instead keeps serving, and its own trainer's exports follow it.

    ``artifacts``: more files for the version (their names, and a writer into the
    version's directory), e.g. the retrieval towers (:mod:`trainer.retrieval_export`).

    The version appears whole or not at all (the registry builds it in a
    hidden directory); pruning never removes the active version.
    """
    version = registry.new_version_name(family)
    while (registry.versions_dir / version).exists():  # two exports in one millisecond
        time.sleep(0.002)
        version = registry.new_version_name(family)
    manifest = Manifest(
        version=version,
        family=family,
        created_at_ms=int(time.time() * 1000),
        schema_hash=schema.schema_hash(),
        table_dims=dict(schema.table_dims()),
        training_position=training_position,
        metrics={k: float(v) for k, v in metrics.items() if v == v},  # drop NaN
        opset=OPSET if exporter == "torchscript" else 18,
        extra={
            "exporter": exporter,
            "hidden": _hidden(model),
            "heads": list(model_io.HEADS),
            **(extra or {}),
        },
        artifacts=list(artifacts[0]) if artifacts is not None else [],
    )
    registry.publish(
        lambda path: export_onnx(model, schema, path, exporter),
        manifest,
        artifacts[1] if artifacts is not None else None,
    )
    if activate:
        registry.activate(version, within_family=family if activate == "own_family" else None)
    registry.prune(keep)
    return version


def _hidden(model: WideDeep) -> list[int]:
    return [m.out_features for m in model.mlp if isinstance(m, torch.nn.Linear)][:-1]


def all_writers(writers: list[Callable[[Path], None]]) -> Callable[[Path], None]:
    """One artifact writer (for :func:`publish`'s ``artifacts``) running ``writers`` in order."""

    def write(directory: Path) -> None:
        for each in writers:
            each(directory)

    return write
