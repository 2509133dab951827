"""The serving process's video index: searched without waiting, rebuilt in the background.

:class:`LiveIndex` holds the current :class:`~app.candidates.ann.VideoIndex`
and swaps in a new one when a build finishes; a search reads the reference
once and never takes a lock, so a rebuild (seconds at 10^6 vectors) never
delays a request. A build starts in one background thread when

- a new model version's vectors arrive (:meth:`LiveIndex.publish`), or
- enough vectors changed since the last build (``ann.rebuild_changed_fraction``
  of the index, or ``ann.max_pending`` waiting to be folded in): the changed
  ones are searched exactly beside the index meanwhile, which costs a little
  on every query.

Changes made while a build runs are journalled and replayed onto the new
index before the swap, so none is lost. Removed (hidden) videos are
remembered until their vectors are upserted again, so a later version's
vectors cannot bring them back. After each swap the index is saved (when a
directory is given) and restored from there at the next start.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from app.candidates.ann import VideoIndex, check_vectors
from feature_store.errors import Conflict, VidrecError
from feature_store.settings import AnnSettings

log = logging.getLogger(__name__)

_CURRENT = object()
"""Build request: rebuild from the current index's own vectors."""


class LiveIndex:
    """The current index of a serving process (see the module docstring)."""

    def __init__(self, settings: AnnSettings, directory: Path | str | None = None) -> None:
        self.settings = settings
        self.directory = Path(directory) if directory is not None else None
        """Where each new index is saved and the next start restores it from (None: never)."""
        self._index: VideoIndex | None = None
        self._lock = threading.Lock()
        """Serialises changes and swaps (never taken by a search)."""
        self._removed: set[str] = set()
        self._journal: list[tuple[str, Any]] | None = None
        self._wanted: Any = None
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self.builds = 0
        """Builds swapped in since start."""
        self.last_error: str | None = None
        """Why the last build or restore failed (the previous index kept serving)."""
        self.last_build_s: float | None = None
        """Seconds the last build took (train + add)."""
        if self.directory is not None and (self.directory / "index.json").exists():
            self._restore()

    def _restore(self) -> None:
        assert self.directory is not None
        try:
            self._index = VideoIndex.load(self.directory, self.settings)
        except VidrecError as exc:
            self.last_error = f"restore from {self.directory}: {exc.message}"
            log.warning("ann: %s; waiting for published vectors", self.last_error)

    # -- reading ---------------------------------------------------------------------

    @property
    def index(self) -> VideoIndex | None:
        """The index searches use now (None until the first build or restore)."""
        return self._index

    @property
    def rebuilding(self) -> bool:
        return not self._idle.is_set()

    def search(
        self, query: Any, k: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], np.ndarray]:
        """:meth:`VideoIndex.search` on the current index; nothing before the first build."""
        index = self._index
        if index is None:
            return [], np.empty(0, dtype=np.float32)
        return index.search(query, k, exclude)

    def vectors_of(self, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`VideoIndex.vectors_of` on the current index (none known before a build)."""
        index = self._index
        if index is None:
            return np.zeros((len(ids), 0), dtype=np.float32), np.zeros(len(ids), dtype=bool)
        return index.vectors_of(ids)

    def items(self) -> tuple[list[str], np.ndarray]:
        """Every searchable video's id and vector, in id order."""
        index = self._index
        if index is None:
            return [], np.empty((0, 0), dtype=np.float32)
        return index.items()

    def status(self, now: float | None = None) -> dict[str, Any]:
        """What ``/v1/status`` reports as ``retrieval.index``."""
        index = self._index
        out: dict[str, Any] = {
            "kind": None,
            "size": 0,
            "built_at": None,
            "age_s": None,
            "version": None,
            "pending": 0,
            "changes": 0,
            "rebuilding": self.rebuilding,
            "builds": self.builds,
            "last_build_s": self.last_build_s,
            "last_error": self.last_error,
        }
        if index is not None:
            out.update(
                kind=index.kind,
                size=index.size,
                built_at=index.built_at,
                age_s=round(index.age_s(now), 3),
                version=index.version,
                pending=index.pending,
                changes=index.changes,
            )
        return out

    # -- changing ----------------------------------------------------------------------

    def publish(
        self, ids: Sequence[str], vectors: Any, version: str | None = None, *, wait: bool = False
    ) -> bool:
        """A new version's vectors: build from them in the background and swap (the
        current index keeps serving until then). ``wait``: return once it is swapped in
        (a model loader that must not serve a new user tower against old video vectors).
        Returns False when ``version`` is the one already served (e.g. restored at start)
        or already asked for. Raises :class:`InvalidInput` on bad vectors."""
        array = check_vectors(ids, vectors)
        with self._lock:
            index = self._index
            if version is not None and index is not None and index.version == version:
                return False
            wanted = self._wanted
            asked = version is not None and isinstance(wanted, tuple) and wanted[2] == version
            if not asked:
                self._request((list(ids), array, version))
        if wait:
            self.wait()
        return not asked

    def upsert(self, ids: Sequence[str], vectors: Any) -> None:
        """New or changed vectors, searchable at once; a video upserted after a remove is
        searchable again. Raises :class:`InvalidInput` on bad vectors."""
        with self._lock:
            index = self._index
            if index is None:
                raise Conflict("the video index is not built yet: publish vectors first")
            index.upsert(ids, vectors)
            self._removed.difference_update(ids)
            if self._journal is not None:
                self._journal.append(("upsert", (list(ids), np.asarray(vectors, np.float32))))
            self._maybe_rebuild(index)

    def remove(self, ids: Iterable[str]) -> int:
        """Hide videos from every later search at once, and from every later build."""
        gone = list(ids)
        with self._lock:
            self._removed.update(gone)
            if self._journal is not None:
                self._journal.append(("remove", gone))
            index = self._index
            if index is None:
                return 0
            count = index.remove(gone)
            self._maybe_rebuild(index)
            return count

    def rebuild(self) -> None:
        """Fold the pending changes into a new build now (in the background)."""
        with self._lock:
            if self._index is not None:
                self._request(_CURRENT)

    def _maybe_rebuild(self, index: VideoIndex) -> None:
        threshold = max(1, int(self.settings.rebuild_changed_fraction * index.size))
        if index.changes >= threshold or index.pending >= self.settings.max_pending:
            if self._wanted is None and self._idle.is_set():
                self._request(_CURRENT)

    def _request(self, wanted: Any) -> None:
        """Ask for a build (caller holds the lock); a newer version replaces an older ask."""
        if self._wanted is None or wanted is not _CURRENT:
            self._wanted = wanted
        if self._idle.is_set():
            self._idle.clear()
            self._thread = threading.Thread(target=self._run, name="ann-rebuild", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            with self._lock:
                wanted, self._wanted = self._wanted, None
                if wanted is None:
                    self._journal = None
                    self._idle.set()
                    return
                self._journal = []
                source = self._source(wanted)
            start = time.perf_counter()
            try:
                ids, vectors, version = source
                new = VideoIndex.build(ids, vectors, self.settings, version=version)
            except Exception as exc:  # a background thread: report, keep the old index
                self.last_error = f"build: {exc}"
                log.exception("ann: build failed; the previous index keeps serving")
                continue
            build_s = time.perf_counter() - start
            with self._lock:
                self._replay(new)
                self._index = new
                self.builds += 1
                self.last_build_s = build_s
                self.last_error = None
            self._save(new)

    def _source(self, wanted: Any) -> tuple[list[str], np.ndarray, str | None]:
        """(ids, vectors, version) to build from; removed videos left out."""
        if wanted is _CURRENT:
            assert self._index is not None
            ids, vectors = self._index.items()
            version = self._index.version
        else:
            ids, vectors, version = wanted
        if self._removed:
            keep = [i for i, v in enumerate(ids) if v not in self._removed]
            ids, vectors = [ids[i] for i in keep], vectors[keep]
        return ids, vectors, version

    def _replay(self, new: VideoIndex) -> None:
        """Apply the changes journalled while ``new`` was built (caller holds the lock)."""
        for op, arg in self._journal or ():
            if op == "upsert":
                new.upsert(*arg)
            else:
                new.remove(arg)
        self._journal = []

    def _save(self, index: VideoIndex) -> None:
        if self.directory is None:
            return
        try:
            index.save(self.directory)
        except OSError as exc:
            self.last_error = f"save to {self.directory}: {exc}"
            log.error("ann: %s", self.last_error)

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until no build runs or is asked for (tests, shutdown); False on timeout."""
        return self._idle.wait(timeout_s)

    def close(self, timeout_s: float = 60.0) -> None:
        """Drop queued builds and wait for a running one to finish."""
        with self._lock:
            self._wanted = None
        self.wait(timeout_s)

    def __enter__(self) -> LiveIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
