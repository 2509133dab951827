"""Nearest neighbours of a user vector among the video vectors: exact when small, IVF above.

Which index, and why, is in ``docs/retrieval.md`` (*The index*), from the
``bench.bench_ann`` table in ``docs/benchmarks.md``. In short: faiss
IVF-Flat (inverted lists over k-means centroids, the vectors kept exact in
the lists), because at 10^6 vectors it met recall@100 >= 0.95 at the lowest
tail latency, builds in seconds rather than minutes, and builds the same
index every time from the same vectors (the HNSW libraries insert from
several threads in whatever order they run). Below ``ann.exact_below``
vectors the index is a plain inner-product scan: as fast there, and exact.

A :class:`VideoIndex` is immutable where the search reads it (the built
vectors and the faiss index); what changes between builds lives in one
small state object that every change replaces whole, so a search reads a
consistent view without a lock:

- ``remove`` clears the videos' bits in the alive bitmap (faiss skips them
  inside the search, so ``k`` results still come back) and drops them from
  the pending vectors; the next build leaves them out.
- ``upsert`` puts new and changed vectors in a pending set searched exactly
  beside the index (a changed video's built vector is masked), until the
  next build folds them in (:mod:`app.candidates.ann_rebuild` decides when).

``save``/``load`` write and read numpy arrays (``allow_pickle=False``) and a
JSON header, never a pickle or a library's own file format; ``load`` builds
the faiss index from the saved centroids, so the restored index is the one
that was saved, not a retrained one.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, replace
from itertools import repeat
from pathlib import Path
from typing import Any, Literal

import numpy as np

from feature_store.atomic import atomic_binary, atomic_json
from feature_store.errors import InvalidInput
from feature_store.settings import AnnSettings

IndexKind = Literal["exact", "ivf-flat"]
FORMAT_VERSION = 1
"""Version of the saved layout (``index.json`` + arrays); another version is refused."""
HEADER = "index.json"
KMEANS_ITERATIONS = 20
"""Lloyd iterations of the IVF training (faiss's default is 25; 20 converged as well
on the bench's clustered vectors)."""

_BIT = np.array([1 << i for i in range(8)], dtype=np.uint8)


def _faiss() -> Any:
    import faiss  # imported when an IVF index is built: small catalogs never need it

    return faiss


def check_vectors(ids: Sequence[str], vectors: Any, dim: int | None = None) -> np.ndarray:
    """``vectors`` as a C-contiguous float32 (n, dim) array, or :class:`InvalidInput`."""
    try:
        array = np.ascontiguousarray(vectors, dtype=np.float32)
    except (TypeError, ValueError) as exc:
        raise InvalidInput("vectors", f"not a numeric array: {exc}") from exc
    if array.ndim != 2 or array.shape[1] == 0:
        raise InvalidInput("vectors", f"must be a 2-D (videos, dim) array, got {array.shape}")
    if dim is not None and array.shape[1] != dim:
        raise InvalidInput("vectors", f"dimension {array.shape[1]}, the index has {dim}")
    if len(ids) != len(array):
        raise InvalidInput("ids", f"{len(ids)} ids for {len(array)} vectors")
    bad = ~np.isfinite(array).all(axis=1)
    if bad.any():
        first = int(np.flatnonzero(bad)[0])
        raise InvalidInput(
            f"vectors[{first}]",
            f"NaN or infinite value (video {ids[first]!r}; {int(bad.sum())} such rows)",
        )
    for i, video_id in enumerate(ids):
        if not isinstance(video_id, str) or not video_id:
            raise InvalidInput(f"ids[{i}]", "must be a non-empty string")
    if len(set(ids)) != len(ids):
        raise InvalidInput("ids", "duplicate video ids")
    return array


def _check_query(query: Any, dim: int, k: int) -> np.ndarray:
    if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
        raise InvalidInput("k", f"must be a positive integer, got {k!r}")
    try:
        q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidInput("query", f"not a numeric vector: {exc}") from exc
    if q.shape != (dim,):
        raise InvalidInput("query", f"dimension {q.size}, the index has {dim}")
    if not np.isfinite(q).all():
        raise InvalidInput("query", "NaN or infinite value")
    return q


@dataclass(frozen=True)
class _State:
    """What changes between builds; replaced whole by every change (see the module doc)."""

    alive: np.ndarray
    """bool per built vector: False once removed or superseded by a pending vector."""
    bitmap: np.ndarray
    """``alive`` packed little-endian, the layout of faiss's ``IDSelectorBitmap``."""
    pending_ids: tuple[str, ...]
    pending: np.ndarray
    """(m, dim) float32: vectors added or changed since the build, searched exactly."""
    pending_pos: dict[str, int]
    changes: int
    """Vectors added, updated or removed since the build (what triggers a rebuild)."""


def _top(scores: np.ndarray, k: int) -> np.ndarray:
    """Positions of the ``k`` highest finite scores, best first (ties: lower position)."""
    finite = int(np.isfinite(scores).sum())
    k = min(k, finite)
    if k == 0:
        return np.empty(0, dtype=np.int64)
    part = np.argpartition(-scores, k - 1)[:k] if k < len(scores) else np.arange(len(scores))
    order = np.lexsort((part, -scores[part]))
    return part[order]


class VideoIndex:
    """Inner-product nearest neighbours of a query among video vectors (module doc).

    Searches may run on any number of threads at once; changes (``upsert``,
    ``remove``) must come one at a time (:class:`~app.candidates.ann_rebuild.LiveIndex`
    serialises them), since each reads the state it replaces.
    """

    def __init__(
        self,
        ids: np.ndarray,
        vectors: np.ndarray,
        settings: AnnSettings,
        *,
        built_at: float,
        centroids: np.ndarray | None,
        version: str | None = None,
    ) -> None:
        """Use :meth:`build` or :meth:`load`; ``ids`` sorted and unique, ``vectors`` checked."""
        self.settings = settings
        self.ids = ids
        self.vectors = vectors
        self.dim = int(vectors.shape[1])
        self.built_at = built_at
        """Unix seconds when the built part was built (a loaded index keeps the saved time)."""
        self.version = version
        """Model version the vectors came from, when the caller named one."""
        self.centroids = centroids
        self._pos = {video_id: i for i, video_id in enumerate(ids.tolist())}
        self._faiss_index = self._ivf(centroids) if centroids is not None else None
        alive = np.ones(len(ids), dtype=bool)
        self._state = _State(
            alive=alive,
            bitmap=np.packbits(alive, bitorder="little"),
            pending_ids=(),
            pending=np.empty((0, self.dim), dtype=np.float32),
            pending_pos={},
            changes=0,
        )

    # -- building --------------------------------------------------------------

    @classmethod
    def build(
        cls,
        ids: Sequence[str],
        vectors: Any,
        settings: AnnSettings | None = None,
        *,
        version: str | None = None,
        built_at: float | None = None,
    ) -> VideoIndex:
        """An index over ``vectors`` (row i is video ``ids[i]``); the same input (in any
        order) and settings (default: ``AnnSettings()``) give the identical index."""
        settings = settings or AnnSettings()
        array = check_vectors(ids, vectors)
        order = np.argsort(np.asarray(ids, dtype=str), kind="stable")
        sorted_ids = np.asarray(ids, dtype=str)[order]
        array = np.ascontiguousarray(array[order])
        centroids = cls._train(array, settings) if len(array) >= settings.exact_below else None
        return cls(
            sorted_ids,
            array,
            settings,
            built_at=time.time() if built_at is None else built_at,
            centroids=centroids,
            version=version,
        )

    @staticmethod
    def nlist(n: int, settings: AnnSettings) -> int:
        """Inverted lists for ``n`` vectors: ``lists_per_sqrt * sqrt(n)``, at least 39
        training vectors each (fewer and k-means has too little to place them)."""
        return max(1, min(int(settings.lists_per_sqrt * math.sqrt(n)), n // 39))

    @staticmethod
    def _train(vectors: np.ndarray, settings: AnnSettings) -> np.ndarray:
        """k-means centroids on a seeded sample (deterministic: fixed seed, sorted rows)."""
        faiss = _faiss()
        n, dim = vectors.shape
        nlist = VideoIndex.nlist(n, settings)
        take = min(n, settings.train_per_list * nlist)
        rng = np.random.default_rng(settings.seed)
        sample = vectors[np.sort(rng.choice(n, size=take, replace=False))] if take < n else vectors
        kmeans = faiss.Kmeans(
            dim,
            nlist,
            niter=KMEANS_ITERATIONS,
            seed=settings.seed,
            spherical=False,
            max_points_per_centroid=settings.train_per_list + 1,
            verbose=False,
        )
        faiss.omp_set_num_threads(settings.build_threads)
        kmeans.train(np.ascontiguousarray(sample))
        return np.ascontiguousarray(kmeans.centroids, dtype=np.float32)

    def _ivf(self, centroids: np.ndarray) -> Any:
        """The faiss IVF-Flat index of the built vectors over given centroids (ids = rows)."""
        faiss = _faiss()
        quantizer = faiss.IndexFlatIP(self.dim)
        quantizer.add(centroids)
        index = faiss.IndexIVFFlat(quantizer, self.dim, len(centroids), faiss.METRIC_INNER_PRODUCT)
        index.is_trained = True
        faiss.omp_set_num_threads(self.settings.build_threads)
        index.add(self.vectors)
        self._quantizer = quantizer  # the IVF index points at it: keep it alive
        return index

    # -- reading -----------------------------------------------------------------

    @property
    def kind(self) -> IndexKind:
        return "exact" if self._faiss_index is None else "ivf-flat"

    @property
    def size(self) -> int:
        """Videos a search can return (built and alive, plus pending)."""
        state = self._state
        return int(state.alive.sum()) + len(state.pending_ids)

    @property
    def changes(self) -> int:
        """Vectors added, updated or removed since the build."""
        return self._state.changes

    @property
    def pending(self) -> int:
        """Vectors searched exactly beside the built index until the next build."""
        return len(self._state.pending_ids)

    def age_s(self, now: float | None = None) -> float:
        """Seconds since the built part was built."""
        return max(0.0, (time.time() if now is None else now) - self.built_at)

    def __contains__(self, video_id: object) -> bool:
        state = self._state
        if video_id in state.pending_pos:
            return True
        pos = self._pos.get(video_id)  # type: ignore[arg-type]
        return pos is not None and bool(state.alive[pos])

    def search(
        self, query: Any, k: int, exclude: Collection[str] = ()
    ) -> tuple[list[str], np.ndarray]:
        """The ``k`` videos of highest inner product with ``query`` that are neither removed
        nor in ``exclude``, best first: their ids and float32 scores (fewer when fewer
        videos qualify). Raises :class:`InvalidInput` naming ``query`` or ``k``."""
        q = _check_query(query, self.dim, k)
        state = self._state
        excluded = [p for p in map(self._pos.get, exclude) if p is not None] if exclude else []
        built_ids, built_scores = self._search_built(q, k, state, excluded)
        if not state.pending_ids:
            return built_ids, built_scores
        scores = state.pending @ q
        for video_id in exclude:
            p = state.pending_pos.get(video_id)
            if p is not None:
                scores[p] = -np.inf
        top = _top(scores, k)
        ids = built_ids + [state.pending_ids[p] for p in top.tolist()]
        merged = np.concatenate([built_scores, scores[top]])
        best = _top_with_ids(merged, ids, k)
        return [ids[i] for i in best], merged[best]

    def _search_built(
        self, q: np.ndarray, k: int, state: _State, excluded: list[int]
    ) -> tuple[list[str], np.ndarray]:
        if len(self.ids) == 0:
            return [], np.empty(0, dtype=np.float32)
        if self._faiss_index is None:
            scores = self.vectors @ q
            scores[~state.alive] = -np.inf
            if excluded:
                scores[excluded] = -np.inf
            top = _top(scores, k)
            return self.ids[top].tolist(), scores[top]
        faiss = _faiss()
        bitmap = state.bitmap
        if excluded:
            bitmap = bitmap.copy()
            where = np.asarray(excluded, dtype=np.int64)
            np.bitwise_and.at(bitmap, where >> 3, ~_BIT[where & 7])
        selector = faiss.IDSelectorBitmap(len(self.ids), faiss.swig_ptr(bitmap))
        params = faiss.SearchParametersIVF(nprobe=self.settings.nprobe, sel=selector)
        scores, rows = self._faiss_index.search(q[None, :], k, params=params)
        found = rows[0] >= 0
        return self.ids[rows[0][found]].tolist(), scores[0][found]

    def vectors_of(self, ids: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(len(ids), dim)`` float32 vectors of ``ids`` (zeros where unknown or removed)
        and the bool mask of the ids that have one (affinity of given candidates)."""
        state = self._state
        rows = np.fromiter(map(self._pos.get, ids, repeat(-1)), np.int64, len(ids))
        known = rows >= 0
        rows = np.maximum(rows, 0)
        if len(self.ids):
            known &= state.alive[rows]
            out = np.where(known[:, None], self.vectors[rows], np.float32(0))
        else:
            out = np.zeros((len(ids), self.dim), dtype=np.float32)
        if state.pending_ids:
            for i, video_id in enumerate(ids):
                p = state.pending_pos.get(video_id)
                if p is not None:
                    out[i], known[i] = state.pending[p], True
        return out.astype(np.float32, copy=False), known

    def items(self) -> tuple[list[str], np.ndarray]:
        """Every searchable video's id and vector (what a rebuild starts from)."""
        state = self._state
        keep = np.flatnonzero(state.alive)
        ids = self.ids[keep].tolist() + list(state.pending_ids)
        return ids, np.concatenate([self.vectors[keep], state.pending])

    # -- changing ------------------------------------------------------------------

    def upsert(self, ids: Sequence[str], vectors: Any) -> None:
        """Add new videos' vectors and replace changed ones; searchable at once (exactly,
        beside the built index) and folded in at the next build."""
        array = check_vectors(ids, vectors, self.dim)
        if not len(ids):
            return
        state = self._state
        alive = state.alive
        superseded = [p for p in map(self._pos.get, ids) if p is not None and alive[p]]
        if superseded:
            alive = alive.copy()
            alive[superseded] = False
        pending_ids = list(state.pending_ids)
        pending = [state.pending] if len(pending_ids) else []
        pos = dict(state.pending_pos)
        replaced = [(pos[v], i) for i, v in enumerate(ids) if v in pos]
        if replaced:
            pending[0] = pending[0].copy()
            for old, new in replaced:
                pending[0][old] = array[new]
        fresh = [i for i, v in enumerate(ids) if v not in pos]
        for i in fresh:
            pos[ids[i]] = len(pending_ids)
            pending_ids.append(ids[i])
        pending.append(array[fresh])
        self._state = _State(
            alive=alive,
            bitmap=np.packbits(alive, bitorder="little") if superseded else state.bitmap,
            pending_ids=tuple(pending_ids),
            pending=np.ascontiguousarray(np.concatenate(pending)),
            pending_pos=pos,
            changes=state.changes + len(ids),
        )

    def remove(self, ids: Iterable[str]) -> int:
        """Hide videos from every later search at once; returns how many were searchable.
        Their vectors are dropped at the next build."""
        state = self._state
        gone = [v for v in ids if v in self]
        if not gone:
            return 0
        built = [p for p in map(self._pos.get, gone) if p is not None and state.alive[p]]
        alive = state.alive
        if built:
            alive = alive.copy()
            alive[built] = False
        drop = {state.pending_pos[v] for v in gone if v in state.pending_pos}
        new = state
        if drop:
            keep = [i for i in range(len(state.pending_ids)) if i not in drop]
            kept_ids = tuple(state.pending_ids[i] for i in keep)
            new = replace(
                new,
                pending_ids=kept_ids,
                pending=np.ascontiguousarray(state.pending[keep]),
                pending_pos={v: i for i, v in enumerate(kept_ids)},
            )
        self._state = replace(
            new,
            alive=alive,
            bitmap=np.packbits(alive, bitorder="little") if built else state.bitmap,
            changes=state.changes + len(gone),
        )
        return len(gone)

    # -- persistence -----------------------------------------------------------------

    def save(self, directory: Path | str) -> Path:
        """Write the index under ``directory``: arrays first (named by a fresh generation),
        the header last, each replaced atomically (:mod:`feature_store.atomic`), then the
        previous generation's files are deleted. A crash mid-save leaves the previous
        index loadable."""
        root = Path(directory)
        root.mkdir(parents=True, exist_ok=True)
        state = self._state
        generation = uuid.uuid4().hex[:12]
        arrays = {
            "ids": self.ids,
            "vectors": self.vectors,
            "alive": state.alive,
            "pending_ids": np.asarray(state.pending_ids, dtype=str).reshape(-1),
            "pending": state.pending,
        }
        if self.centroids is not None:
            arrays["centroids"] = self.centroids
        files = {}
        for name, array in arrays.items():
            files[name] = f"{name}-{generation}.npy"
            with atomic_binary(root / files[name]) as out:
                np.save(out, array, allow_pickle=False)
        header = {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "dim": self.dim,
            "built": len(self.ids),
            "built_at": self.built_at,
            "version": self.version,
            "changes": state.changes,
            "files": files,
        }
        atomic_json(root / HEADER, header, indent=1)
        for stale in root.glob("*.npy"):
            if stale.name not in files.values():
                stale.unlink(missing_ok=True)
        return root / HEADER

    @classmethod
    def load(cls, directory: Path | str, settings: AnnSettings) -> VideoIndex:
        """The index :meth:`save` wrote. A missing, foreign or damaged one raises
        :class:`InvalidInput` naming the file or header field (the caller then builds
        from the published vectors instead)."""
        root = Path(directory)
        header = _read_header(root / HEADER)
        files = header["files"]

        def array(name: str, dtype_kind: str, ndim: int) -> np.ndarray:
            path = root / str(files.get(name, ""))
            try:
                out = np.load(path, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:
                raise InvalidInput(f"{HEADER}.files.{name}", f"unreadable {path}: {exc}") from exc
            if out.dtype.kind != dtype_kind or out.ndim != ndim:
                raise InvalidInput(f"{HEADER}.files.{name}", f"unexpected {out.dtype} {out.shape}")
            return out

        dim, built = header["dim"], header["built"]
        ids = array("ids", "U", 1)
        vectors = np.ascontiguousarray(array("vectors", "f", 2), dtype=np.float32)
        alive = array("alive", "b", 1)
        pending_ids = array("pending_ids", "U", 1)
        pending = array("pending", "f", 2)
        if len(ids) != built or vectors.shape != (built, dim) or alive.shape != (built,):
            raise InvalidInput(f"{HEADER}.built", f"arrays do not hold {built} x {dim} vectors")
        if pending.shape != (len(pending_ids), dim):
            raise InvalidInput(f"{HEADER}.files.pending", "does not match pending_ids")
        check_vectors(ids.tolist(), vectors)
        centroids = None
        if header["kind"] == "ivf-flat":
            centroids = np.ascontiguousarray(array("centroids", "f", 2), dtype=np.float32)
            if centroids.shape[1:] != (dim,) or not np.isfinite(centroids).all():
                raise InvalidInput(f"{HEADER}.files.centroids", f"bad shape {centroids.shape}")
        index = cls(
            ids,
            vectors,
            settings,
            built_at=header["built_at"],
            centroids=centroids,
            version=header["version"],
        )
        if len(pending_ids):
            index.upsert(pending_ids.tolist(), pending)
        dead = np.flatnonzero(~alive)
        superseded = set(pending_ids.tolist())
        index.remove([v for v in ids[dead].tolist() if v not in superseded])
        index._state = replace(index._state, changes=int(header["changes"]))
        return index


def _top_with_ids(scores: np.ndarray, ids: list[str], k: int) -> list[int]:
    """Positions of the ``k`` best of two merged result lists: score, then id, so the
    order never depends on which list a video came from."""
    order = sorted(range(len(ids)), key=lambda i: (-float(scores[i]), ids[i]))
    return order[:k]


def _read_header(path: Path) -> dict[str, Any]:
    try:
        header = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InvalidInput(HEADER, f"no saved index at {path}") from exc
    except (OSError, ValueError) as exc:
        raise InvalidInput(HEADER, f"unreadable {path}: {exc}") from exc
    if not isinstance(header, dict):
        raise InvalidInput(HEADER, "not a JSON object")
    if header.get("format") != FORMAT_VERSION:
        raise InvalidInput(f"{HEADER}.format", f"{header.get('format')!r}, not {FORMAT_VERSION}")
    expect: dict[str, type | tuple[type, ...]] = {
        "kind": str,
        "dim": int,
        "built": int,
        "built_at": (int, float),
        "changes": int,
        "files": dict,
    }
    for key, kind in expect.items():
        if not isinstance(header.get(key), kind) or isinstance(header.get(key), bool):
            raise InvalidInput(f"{HEADER}.{key}", f"missing or not {kind}")
    if header["kind"] not in ("exact", "ivf-flat"):
        raise InvalidInput(f"{HEADER}.kind", f"unknown kind {header['kind']!r}")
    if header["dim"] < 1 or header["built"] < 0:
        raise InvalidInput(f"{HEADER}.dim", "must be positive")
    version = header.get("version")
    if version is not None and not isinstance(version, str):
        raise InvalidInput(f"{HEADER}.version", "must be a string or null")
    header["version"] = version
    return header
