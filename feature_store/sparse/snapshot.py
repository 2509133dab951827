"""One on-disk snapshot format for every sparse-table backend.

A snapshot is a directory::

    manifest.json     {"format": "vidrec-sparse-table", "format_version": 1,
                       "table": {"name", "dim", "optimizer"}, "state_width",
                       "rows", "created_at"}   (created_at: Unix seconds)
    keys.npy          uint64  (rows,)
    weights.npy       float32 (rows, dim)
    state.npy         float32 (rows, state_width)   optimizer state, as the optimizer lays it out
    updated_at.npy    float64 (rows,)               Unix seconds of each row's last update

Plain ``.npy`` files are read with ``allow_pickle=False``, so a snapshot
from elsewhere can hold numbers only, never code. Because the format is
shared, a memory table's snapshot can seed Redis and a Redis snapshot can
seed a memory table. ``updated_at`` carries each row's age across, so a row
keeps the expiry it had. Admission counters of keys not yet admitted are not
part of a snapshot: they are short-lived and cheap to rebuild.

Atomicity: the files are written into a temporary sibling directory, flushed
to disk, and renamed over the target. A previous snapshot at the same path is
first renamed aside and deleted after the swap, so a reader sees the old
complete snapshot, then (for the instant between the two renames) none, then
the new complete one, never a half-written one.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from feature_store.atomic import fsync_directory
from feature_store.errors import ConfigurationError, InvalidInput
from feature_store.sparse.base import Keys, Rows, TableSpec

FORMAT = "vidrec-sparse-table"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
_ARRAYS = ("keys", "weights", "state", "updated_at")


@dataclass(frozen=True)
class SnapshotData:
    """The rows of one table as arrays, ready to write or just read."""

    spec: TableSpec
    keys: Keys
    weights: Rows
    state: Rows
    updated_at: npt.NDArray[np.float64]

    def __post_init__(self) -> None:
        n = len(self.keys)
        if self.weights.shape != (n, self.spec.dim):
            raise InvalidInput(
                "snapshot.weights", f"shape {self.weights.shape}, want ({n}, {self.spec.dim})"
            )
        if self.state.ndim != 2 or self.state.shape[0] != n:
            raise InvalidInput("snapshot.state", f"shape {self.state.shape}, want ({n}, width)")
        if self.updated_at.shape != (n,):
            raise InvalidInput("snapshot.updated_at", f"shape {self.updated_at.shape}, want ({n},)")

    @classmethod
    def empty(cls, spec: TableSpec, state_width: int) -> SnapshotData:
        """No rows, with the shapes a table of ``spec`` and ``state_width`` would write."""
        return cls(
            spec,
            np.zeros(0, np.uint64),
            np.zeros((0, spec.dim), np.float32),
            np.zeros((0, state_width), np.float32),
            np.zeros(0, np.float64),
        )

    def live(self, now_s: float, ttl_s: float) -> SnapshotData:
        """The rows not yet expired at ``now_s`` (a snapshot restored later keeps row ages)."""
        keep = self.updated_at + ttl_s > now_s
        if keep.all():
            return self
        return SnapshotData(
            self.spec, self.keys[keep], self.weights[keep], self.state[keep], self.updated_at[keep]
        )


def write_snapshot(directory: Path, data: SnapshotData) -> None:
    """Write ``data`` as a snapshot at ``directory``, atomically replacing any previous one."""
    directory = Path(directory)
    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    tag = uuid.uuid4().hex[:12]
    tmp = parent / f".{directory.name}.tmp-{tag}"
    tmp.mkdir()
    try:
        arrays: dict[str, np.ndarray] = {
            "keys": np.ascontiguousarray(data.keys, dtype=np.uint64),
            "weights": np.ascontiguousarray(data.weights, dtype=np.float32),
            "state": np.ascontiguousarray(data.state, dtype=np.float32),
            "updated_at": np.ascontiguousarray(data.updated_at, dtype=np.float64),
        }
        for name, array in arrays.items():
            with open(tmp / f"{name}.npy", "wb") as fh:
                np.save(fh, array, allow_pickle=False)
                fh.flush()
                os.fsync(fh.fileno())
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "table": {
                "name": data.spec.name,
                "dim": data.spec.dim,
                "optimizer": data.spec.optimizer,
            },
            "state_width": int(data.state.shape[1]),
            "rows": int(len(data.keys)),
            "created_at": time.time(),
        }
        with open(tmp / MANIFEST, "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2)
            fh.flush()
            os.fsync(fh.fileno())
        _swap_in(tmp, directory, tag)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _swap_in(tmp: Path, directory: Path, tag: str) -> None:
    old = directory.parent / f".{directory.name}.old-{tag}"
    had_old = directory.exists()
    if had_old:
        os.replace(directory, old)
    try:
        os.replace(tmp, directory)
    except BaseException:
        if had_old:
            os.replace(old, directory)
        raise
    if had_old:
        shutil.rmtree(old, ignore_errors=True)
    fsync_directory(directory.parent)


def read_manifest(directory: Path) -> dict[str, Any]:
    """The manifest of the snapshot at ``directory``, checked for format and version."""
    path = Path(directory) / MANIFEST
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InvalidInput("snapshot", f"no snapshot at {directory} ({MANIFEST} missing)") from exc
    except (OSError, ValueError) as exc:
        raise InvalidInput("snapshot", f"unreadable manifest {path}: {exc}") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise InvalidInput("snapshot", f"{path} is not a {FORMAT} manifest")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise InvalidInput(
            "snapshot.format_version",
            f"{manifest.get('format_version')!r} is not supported "
            f"(this build reads {FORMAT_VERSION})",
        )
    return manifest


def read_snapshot(directory: Path, expect: TableSpec, state_width: int) -> SnapshotData:
    """Load the snapshot at ``directory`` into a table shaped like ``expect``.

    The dimension and optimizer must match (state of another optimizer cannot
    be reinterpreted); the name may differ, so a table can be seeded from a
    copy of another. Raises ``ConfigurationError`` on a mismatch and
    ``InvalidInput`` on a missing or malformed snapshot.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    table = manifest.get("table", {})
    if table.get("dim") != expect.dim or table.get("optimizer") != expect.optimizer:
        raise ConfigurationError(
            f"snapshot {directory} holds dim={table.get('dim')} "
            f"optimizer={table.get('optimizer')}, table {expect.name!r} has "
            f"dim={expect.dim} optimizer={expect.optimizer}"
        )
    if manifest.get("state_width") != state_width:
        raise ConfigurationError(
            f"snapshot {directory} has state width {manifest.get('state_width')}, "
            f"want {state_width}"
        )
    arrays: dict[str, np.ndarray] = {}
    for name in _ARRAYS:
        try:
            arrays[name] = np.load(directory / f"{name}.npy", allow_pickle=False)
        except (OSError, ValueError) as exc:
            raise InvalidInput(f"snapshot.{name}", f"unreadable {name}.npy: {exc}") from exc
    rows = manifest.get("rows")
    if len(arrays["keys"]) != rows:
        raise InvalidInput(
            "snapshot.rows", f"manifest says {rows} rows, keys.npy holds {len(arrays['keys'])}"
        )
    if arrays["state"].shape[1:] != (state_width,):
        raise InvalidInput(
            "snapshot.state", f"shape {arrays['state'].shape}, width {state_width} expected"
        )
    return SnapshotData(
        spec=expect,
        keys=arrays["keys"].astype(np.uint64, copy=False),
        weights=arrays["weights"].astype(np.float32, copy=False),
        state=arrays["state"].astype(np.float32, copy=False),
        updated_at=arrays["updated_at"].astype(np.float64, copy=False),
    )
