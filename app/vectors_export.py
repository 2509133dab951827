"""``vidrec export-vectors``: the two-tower vectors and the user tower's inputs, as Parquet.

For offline use (analysis, a warehouse, another model, nearest-neighbour
tools): the active version's (or ``--version``'s) towers, written into a
directory:

- ``videos.parquet``: ``video_id`` (string), ``vector`` (fixed-size list of
  ``dim`` float32, L2-normalised): the video vectors as the version exported
  them (every visible catalog video at export time), the ones the service
  searches;
- ``users.parquet`` (with a users file, one id per line): ``user_id``,
  ``history_length`` (the watches the features saw), ``pooled`` (fixed-size
  list of ``width`` float32: the user tower's input, each user column's
  tower rows pulled from the sparse tables now and pooled as a request
  pools them) and ``vector`` (the tower's output for it, ``dim`` float32,
  L2-normalised: ``vector @ video vector`` is the affinity the ranking uses);
- ``manifest.json``: the version, its family, its towers (columns, widths),
  when and with which request context the users' inputs were computed.

The users' inputs are computed as of the export, with a neutral request
context (no device, country or surface: the tower's context columns read as
missing) at ``ts`` = now. A user the service has never seen gets the
inputs of an empty history. Ids that are no valid user id are skipped and
counted.

The sparse rows are read from the version's family's tables: with the
embedded backends, from the snapshot under the data directory (run it while
``vidrec up`` is stopped, as for ``vidrec replay``); with Redis, live.
Parquet needs pyarrow (``pip install 'vidrec[parquet]'``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort

from app.cache import RowReader
from app.scoring.retrieval import towers_of, user_inputs
from feature_store.errors import InvalidInput, NotFound
from feature_store.events import EventContext, check_id
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from feature_store.features.schema import FeatureSchema
from feature_store.models.registry import Manifest
from feature_store.models.retrieval_io import (
    POOLED,
    USER_TOWER_FILE,
    VECTOR,
    VIDEO_IDS_FILE,
    VIDEO_VECTORS_FILE,
)
from feature_store.runtime.resources import Resources

log = logging.getLogger(__name__)

USERS_PER_BATCH = 1000
"""Users whose inputs are pulled, pooled and run through the tower together."""


@dataclass
class VectorsExport:
    """What :func:`export_vectors` wrote."""

    version: str
    directory: Path
    videos: int
    users: int = 0
    skipped_users: int = 0
    """Lines of the users file that are no valid user id."""


def _arrow() -> Any:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InvalidInput(
            "format", "writing Parquet needs pyarrow: pip install 'vidrec[parquet]'"
        ) from exc
    return pa, pq


def _vectors(pa: Any, matrix: npt.NDArray[np.float32]) -> Any:
    """A ``(n, d)`` matrix as an Arrow fixed-size list column of float32."""
    flat = pa.array(np.ascontiguousarray(matrix, dtype=np.float32).reshape(-1))
    return pa.FixedSizeListArray.from_arrays(flat, matrix.shape[1])


def read_user_ids(path: Path, max_id_length: int) -> tuple[list[str], int]:
    """The valid ids of a users file (one per line, blanks ignored) and how many were not."""
    if not path.is_file():
        raise NotFound(f"{path} does not exist")
    ids: list[str] = []
    skipped = 0
    for line in path.read_text(encoding="utf-8").splitlines():
        user = line.strip()
        if not user:
            continue
        try:
            check_id("user_id", user, max_id_length)
        except InvalidInput:
            skipped += 1
            continue
        ids.append(user)
    return ids, skipped


def export_vectors(
    resources: Resources,
    manifest: Manifest,
    out_dir: Path,
    users_file: Path | None = None,
    now_ms: int | None = None,
) -> VectorsExport:
    """Write ``manifest``'s video vectors (and the users' tower inputs) under ``out_dir``."""
    pa, pq = _arrow()
    registry, version = resources.registry, manifest.version
    towers = towers_of(manifest, resources.schema)
    paths = {n: registry.artifact_path(version, n)
             for n in (USER_TOWER_FILE, VIDEO_VECTORS_FILE, VIDEO_IDS_FILE)}
    if towers is None or any(p is None for p in paths.values()):
        raise InvalidInput("version", f"{version} has no two-tower model (retrieval.enabled)")
    out_dir.mkdir(parents=True, exist_ok=True)
    vectors = np.load(paths[VIDEO_VECTORS_FILE])  # type: ignore[arg-type]
    ids = [i for i in paths[VIDEO_IDS_FILE].read_text().split("\n") if i]  # type: ignore[union-attr]
    pq.write_table(pa.table({"video_id": pa.array(ids, pa.string()),
                             "vector": _vectors(pa, vectors)}), out_dir / "videos.parquet")
    result = VectorsExport(version, out_dir, videos=len(ids))
    now = int(time.time() * 1000) if now_ms is None else now_ms
    if users_file is not None:
        users, result.skipped_users = read_user_ids(
            users_file, resources.settings.limits.max_id_length)
        session = ort.InferenceSession(str(paths[USER_TOWER_FILE]),
                                       providers=["CPUExecutionProvider"])
        extractor = FeatureExtractor(FeatureSchema(columns=towers.user))
        batches = list(_user_batches(resources, towers, extractor, session, users, now))
        columns = {
            "user_id": pa.array(users, pa.string()),
            "history_length": pa.array(np.concatenate([b[0] for b in batches])
                                       if batches else [], pa.int32()),
            "pooled": _vectors(pa, _stack([b[1] for b in batches], towers.width(towers.user))),
            "vector": _vectors(pa, _stack([b[2] for b in batches], towers.dim)),
        }
        pq.write_table(pa.table(columns), out_dir / "users.parquet")
        result.users = len(users)
    (out_dir / "manifest.json").write_text(json.dumps({
        "version": version, "family": manifest.family, "towers": towers.describe(),
        "videos": result.videos, "users": result.users, "skipped_users": result.skipped_users,
        "exported_at_ms": now, "user_context": EventContext().model_dump(mode="json"),
    }, indent=2))
    log.info("export-vectors %s: %d videos, %d users (%d ids skipped) in %s", version,
             result.videos, result.users, result.skipped_users, out_dir)
    return result


def _stack(parts: Sequence[npt.NDArray[np.float32]], width: int) -> npt.NDArray[np.float32]:
    return np.concatenate(parts) if parts else np.zeros((0, width), np.float32)


def _user_batches(
    resources: Resources, towers: Any, extractor: FeatureExtractor,
    session: ort.InferenceSession, users: Sequence[str], now_ms: int,
) -> Iterator[tuple[npt.NDArray[np.int32], npt.NDArray[np.float32], npt.NDArray[np.float32]]]:
    """(history lengths, pooled inputs, vectors) of ``users``, a batch at a time."""
    pull = RowReader(resources.tables, None)
    for start in range(0, len(users), USERS_PER_BATCH):
        chunk = users[start : start + USERS_PER_BATCH]
        histories = resources.activity.histories(list(chunk))
        rows = [FeatureRow(user_id=u, video_id="", ts_ms=now_ms, history=tuple(h))
                for u, h in zip(chunk, histories, strict=True)]
        pooled = user_inputs(towers, extractor, rows, pull)
        (vectors,) = session.run([VECTOR], {POOLED: pooled})
        lengths = np.array([len(h) for h in histories], np.int32)
        yield lengths, pooled, np.asarray(vectors, np.float32)
