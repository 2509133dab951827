"""The model registry: exported versions on disk and the pointer to the active one.

Layout under the registry root (a local directory or a shared volume)::

    versions/<version>/model.onnx
    versions/<version>/manifest.json
    versions/<version>/<artifact>  the manifest's ``artifacts`` (e.g. the retrieval towers)
    ACTIVE                      {"version": ..., "by": ..., "previous": [...],
                                 "history": [{"version": ..., "by": ...}, ...]} (atomic)

Trainers *publish* versions; operators (or the trainer's auto-promote)
*activate* them; the server polls :meth:`ModelRegistry.active` and
hot-swaps.

**What a rollback undoes.** Each activation is recorded with who made it:
``operator`` (a promotion, an experiment's winner, an export an operator
asked for) or ``trainer`` (a trainer keeping its own active family current,
``within_family``). A rollback undoes the newest *operator* activation: it
goes back to the version that was active before it, past the exports the
promoted family's trainer activated since (they only kept that decision
current). Without an operator activation in the history it steps back one
version. So after an experiment's winner (a retrain family) was promoted and
its trainer has activated three exports since, a rollback serves the family
that was active before the promotion again, and the retrain's next export is
not activated (it is no longer the active family). Consecutive trainer
activations of one family are kept as one step back (the newest below the
active version): the history stays short however often a trainer exports,
and an operator's decision does not fall off it.

Guarantees:

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
from typing import Any, Literal

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


ActivatedBy = Literal["operator", "trainer"]
"""Who made an activation: an operator's decision, or a trainer following its active family."""


@dataclass(frozen=True)
class Activation:
    """One entry of the pointer's history: a version and who activated it."""

    version: str
    by: ActivatedBy


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
        """Make ``version`` the one served; the old one goes on the rollback history.

        With ``within_family``, only when no version is active or the active one
        is of that family (a trainer's auto-activation: it never takes serving
        away from a family an operator promoted); recorded as made by the
        ``trainer``, otherwise by an ``operator``. Returns whether it activated.
        """
        self.manifest(version)  # raises NotFound
        by: ActivatedBy = "operator" if within_family is None else "trainer"
        with self._lock:
            chain = self._read_chain()
            if chain and chain[0].version == version:
                return True
            if within_family is not None and chain and self._family(
                chain[0].version
            ) != within_family:
                return False
            self._write_chain(self._compact([Activation(version, by), *chain]))
            return True

    def rollback(self) -> str:
        """Undo the newest operator activation (else step back one version); returns
        the version now active (see the module docstring)."""
        with self._lock:
            chain = self._existing(self._read_chain())
            index = _rollback_index(chain)
            if index is None:
                raise Conflict("no previous version to roll back to")
            self._write_chain(chain[index:])
            return chain[index].version

    def rollback_target(self) -> str | None:
        """The version :meth:`rollback` would activate now (None: nothing to go back to)."""
        chain = self._existing(self._read_chain())
        index = _rollback_index(chain)
        return None if index is None else chain[index].version

    def prune(self, keep: int) -> list[str]:
        """Delete all but the newest ``keep`` versions, sparing the active and rollback ones."""
        pointer = self._read_pointer()
        protected = {
            pointer.get("version"), *pointer.get("previous", [])[:1], self.rollback_target()
        }
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

    def _read_chain(self) -> list[Activation]:
        """The active version, then the ones before it, newest first.

        A pointer written before activations were recorded (no ``history``)
        reads as operator activations: a rollback then steps back one
        version, as it always did.
        """
        pointer = self._read_pointer()
        current = pointer.get("version")
        if not current:
            return []
        history = pointer.get("history")
        if not isinstance(history, list):
            history = [{"version": v, "by": "operator"} for v in pointer.get("previous", [])]
        return [
            Activation(str(current), _by(pointer.get("by"))),
            *(Activation(str(h["version"]), _by(h.get("by"))) for h in history),
        ]

    def _write_chain(self, chain: list[Activation]) -> None:
        current, *history = chain
        self._write_pointer({
            "version": current.version,
            "by": current.by,
            "previous": [a.version for a in history],  # what readers of the old format read
            "history": [asdict(a) for a in history],
        })

    def _existing(self, chain: list[Activation]) -> list[Activation]:
        """The chain without versions deleted since (the active one always stays)."""
        return chain[:1] + [a for a in chain[1:] if (self.versions_dir / a.version).is_dir()]

    def _compact(self, chain: list[Activation]) -> list[Activation]:
        """Keep one step of each run of one family's trainer activations, at most
        ``_ROLLBACK_DEPTH`` behind the active version."""
        kept = chain[:2]
        for entry in chain[2:]:
            newer = kept[-1]
            run = entry.by == newer.by == "trainer" and (
                self._family(entry.version) == self._family(newer.version)
            )
            if not run:
                kept.append(entry)
        return kept[: _ROLLBACK_DEPTH + 1]

    def _write_pointer(self, data: dict[str, Any]) -> None:
        atomic_json(self.root / ACTIVE_FILE, data)


def _by(value: object) -> ActivatedBy:
    return "trainer" if value == "trainer" else "operator"


def _rollback_index(chain: list[Activation]) -> int | None:
    """Where a rollback lands in ``chain``: past the newest operator activation, else one back."""
    decision = next((i for i, a in enumerate(chain) if a.by == "operator"), None)
    if decision is not None and decision + 1 < len(chain):
        return decision + 1
    return 1 if len(chain) > 1 else None


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
