"""The model registry: exported versions on disk and the pointer to the active one.

Layout under the registry root (a local directory or a shared volume)::

    versions/<version>/model.onnx
    versions/<version>/manifest.json
    versions/<version>/<artifact>  the manifest's ``artifacts`` (e.g. the retrieval towers)
    ACTIVE                      {"version": ..., "previous": [...]} (atomic)

Trainers *publish* versions; operators (or the trainer's auto-promote)
*activate* them; the server polls :meth:`ModelRegistry.active` and
hot-swaps. Guarantees:

- A version is built in a hidden ``.tmp-*`` directory and renamed into
  ``versions/`` only once complete (model and manifest fsynced), so a failed
  or partial export is never visible.
- ``ACTIVE`` is replaced with ``os.replace`` of a fsynced temporary file, so
  readers see the old or the new pointer, never a torn one.
- ``prune`` keeps the newest ``keep`` versions and never the active one or
  those in its rollback history.

Version names sort by creation time: ``<family>-<UTC yyyymmddTHHMMSS>-<ms>``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from feature_store.atomic import atomic_json
from feature_store.errors import Conflict, NotFound

MODEL_FILE = "model.onnx"
MANIFEST_FILE = "manifest.json"
ACTIVE_FILE = "ACTIVE"
_ROLLBACK_DEPTH = 10
VERSION_NAME = r"^[A-Za-z0-9_-]{1,200}$"
"""What :meth:`ModelRegistry.new_version_name` makes (a family, a stamp, digits). A name
from outside (an operator's promote) is checked against it before it touches the file
system, so a path (``../x``) or a NUL byte names no version instead of a file."""
_VERSION_NAME = re.compile(VERSION_NAME)


@dataclass(frozen=True)
class Manifest:
    """What a version is and where it came from."""

    version: str
    family: str
    """Sparse-table model namespace whose rows this network was trained with."""
    created_at_ms: int
    schema_hash: str
    """Fingerprint of the feature schema; serving refuses a mismatch."""
    table_dims: dict[str, int]
    training_position: dict[str, Any] = field(default_factory=dict)
    """Committed log position and events trained when exported."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Prequential metrics at export (AUC, logloss, ...)."""
    opset: int = 17
    extra: dict[str, Any] = field(default_factory=dict)
    artifacts: list[str] = field(default_factory=list)
    """Files of the version beside the model (plain names), e.g. the retrieval towers."""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


def _fsync_write(path: Path, data: bytes) -> None:
    with open(path, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


class ModelRegistry:
    """Versions of exported models under ``root``. Safe across processes."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.versions_dir = self.root / "versions"
        self.versions_dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    # --- writing -----------------------------------------------------------

    def new_version_name(self, family: str) -> str:
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
        return f"{family}-{stamp}-{int(now * 1000) % 1000:03d}{os.getpid() % 100:02d}"

    def publish(
        self,
        write_model: Callable[[Path], None],
        manifest: Manifest,
        write_artifacts: Callable[[Path], None] | None = None,
    ) -> Path:
        """Create a version: ``write_model(path)`` writes the ONNX file at ``path``.

        ``write_artifacts(directory)`` writes the files ``manifest.artifacts``
        names into the version's directory. Nothing is visible until the model,
        the artifacts and the manifest are complete; if a writer raises (or an
        artifact is missing), the partial directory is removed.
        """
        final = self.versions_dir / manifest.version
        if final.exists():
            raise Conflict(f"version {manifest.version} already exists")
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=self.versions_dir))
        try:
            write_model(tmp / MODEL_FILE)
            if write_artifacts is not None:
                write_artifacts(tmp)
            for name in [MODEL_FILE, *manifest.artifacts]:
                with open(tmp / _check_artifact(name), "rb") as fh:  # missing: an error
                    os.fsync(fh.fileno())
            _fsync_write(tmp / MANIFEST_FILE, json.dumps(asdict(manifest), indent=2).encode())
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def activate(self, version: str, *, within_family: str | None = None) -> bool:
        """Make ``version`` the one served; the old one goes on the rollback stack.

        With ``within_family``, only when no version is active or the active one
        is of that family (a trainer's auto-activation: it never takes serving
        away from a family an operator promoted). Returns whether it activated.
        """
        self.manifest(version)  # raises NotFound
        with self._lock:
            pointer = self._read_pointer()
            current = pointer.get("version")
            if current == version:
                return True
            if within_family is not None and current and self._family(current) != within_family:
                return False
            previous = [v for v in ([current] if current else []) + pointer.get("previous", [])]
            self._write_pointer({"version": version, "previous": previous[:_ROLLBACK_DEPTH]})
            return True

    def rollback(self) -> str:
        """Re-activate the previous version; returns it."""
        with self._lock:
            pointer = self._read_pointer()
            previous = [v for v in pointer.get("previous", []) if (self.versions_dir / v).is_dir()]
            if not previous:
                raise Conflict("no previous version to roll back to")
            self._write_pointer({"version": previous[0], "previous": previous[1:]})
            return str(previous[0])

    def prune(self, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` versions, sparing the active and rollback ones."""
        pointer = self._read_pointer()
        protected = {pointer.get("version"), *pointer.get("previous", [])[:1]}
        versions = self.list_versions()
        doomed = [v for v in versions[: max(0, len(versions) - keep)] if v not in protected]
        for version in doomed:
            shutil.rmtree(self.versions_dir / version, ignore_errors=True)
        return doomed

    # --- reading -----------------------------------------------------------

    def list_versions(self) -> list[str]:
        """Complete versions, oldest first."""
        names = [
            p.name
            for p in self.versions_dir.iterdir()
            if p.is_dir() and not p.name.startswith(".") and (p / MANIFEST_FILE).is_file()
        ]
        return sorted(names, key=lambda n: (self._created(n), n))

    def _created(self, version: str) -> int:
        try:
            return self.manifest(version).created_at_ms
        except NotFound:
            return 0

    def manifest(self, version: str) -> Manifest:
        _check_name(version)
        path = self.versions_dir / version / MANIFEST_FILE
        try:
            return Manifest.from_dict(json.loads(path.read_text()))
        except FileNotFoundError as exc:
            raise NotFound(f"model version {version!r} does not exist") from exc

    def model_path(self, version: str) -> Path:
        _check_name(version)
        path = self.versions_dir / version / MODEL_FILE
        if not path.is_file():
            raise NotFound(f"model version {version!r} has no model file")
        return path

    def artifact_path(self, version: str, name: str) -> Path | None:
        """Path of a version's artifact ``name``, or None when the version has none."""
        _check_name(version)
        path = self.versions_dir / version / _check_artifact(name)
        return path if path.is_file() else None

    def active(self) -> str | None:
        """The active version, or None before the first activation."""
        version = self._read_pointer().get("version")
        return str(version) if version else None

    def previous(self) -> list[str]:
        return list(self._read_pointer().get("previous", []))

    def _family(self, version: str) -> str | None:
        try:
            return self.manifest(version).family
        except NotFound:
            return family_of(version)

    def latest_of(self, family: str) -> str | None:
        """The newest complete version of ``family`` (by name: no manifest is read)."""
        names = [
            p.name
            for p in self.versions_dir.iterdir()
            if p.name.startswith(family) and family_of(p.name) == family
            and (p / MANIFEST_FILE).is_file()
        ]
        return max(names, default=None)

    def latest(self) -> str | None:
        versions = self.list_versions()
        return versions[-1] if versions else None

    # --- pointer -----------------------------------------------------------

    def _read_pointer(self) -> dict[str, Any]:
        try:
            data = json.loads((self.root / ACTIVE_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}
        return data if isinstance(data, dict) else {}

    def _write_pointer(self, data: dict[str, Any]) -> None:
        atomic_json(self.root / ACTIVE_FILE, data)


_STAMPED = re.compile(r"^(?P<family>[A-Za-z0-9_-]+)-\d{8}T\d{6}-\d+$")
"""A name :meth:`ModelRegistry.new_version_name` made: family, UTC stamp, digits."""


def family_of(version: str) -> str | None:
    """The family a version name carries (None for a name not made by the registry)."""
    match = _STAMPED.match(version)
    return match.group("family") if match else None


def _check_name(version: str) -> None:
    if not _VERSION_NAME.fullmatch(version):
        raise NotFound(f"{version[:200]!r} is not a model version name")


def _check_artifact(name: str) -> str:
    """An artifact is a plain file name inside the version (never a path)."""
    if not _VERSION_NAME.fullmatch(name.replace(".", "_")) or name.startswith("."):
        raise NotFound(f"{name[:200]!r} is not an artifact name")
    return name
