"""The cold start's reference scores, reused across requests for a short while.

A new video (under ``rerank.new_video_impressions`` impressions) is scored
twice per request: for the user and for an anonymous user with no id and no
history (:mod:`app.cold_start`: the model's lift is the difference). The
second score does not depend on who asks, only on the video's row, the
model, the fusion of its heads and the request's context. On a catalog of
mostly new videos it doubled a 500-candidate request's feature rows, pulls
and ONNX rows: about 1 ms of a 5 ms recommend (``bench/bench_serving.py``,
``docs/benchmarks.md``).

So each serving thread keeps the anonymous score of each video row it
computed, per (model version, fusion, context), for ``ttl_s``, and a request
scores only the new videos without a fresh one. Staleness: a reference is at
most ``ttl_s`` old (``api.hot_row_cache_ttl_ms``, the bound every counter
and sparse row read through the service's cache already has), so a video's
new counters or embedding row reach its reference within that; a changed
catalog record gets a new row (:mod:`app.scoring.video_table`), so it is
never scored from its old fields. 0 turns the reuse off.

What the staleness may not do: move a user with no events. Their model lift
must be 0 (they score the prior), so the recommender makes such a user their
own reference instead of reading a kept score, which other users' training
may have left behind (``app/recommender.py``).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable

import numpy as np
import numpy.typing as npt

from app.scoring.video_table import VideoTable
from feature_store.features.extract import Indices

KEYS = 8
"""(model, fusion, context) combinations kept per thread, least recently used dropped:
a few contexts (devices, surfaces) recur, and a new model version makes the old
one's scores useless. Each holds 12 bytes per row of the thread's video table: under
20 MB a thread at the table's 200,000 rows (``video_table.CACHE_MAX``)."""


class _Scores:
    """One key's scores per table row and the monotonic second each stays good until."""

    def __init__(self, capacity: int) -> None:
        self.score = np.zeros(capacity, dtype=np.float32)
        self.until = np.full(capacity, -math.inf)

    def fit(self, capacity: int) -> None:
        if capacity > len(self.until):
            extra = capacity - len(self.until)
            self.score = np.concatenate([self.score, np.zeros(extra, dtype=np.float32)])
            self.until = np.concatenate([self.until, np.full(extra, -math.inf)])


class ReferenceCache:
    """Anonymous scores per video row of one thread's :class:`VideoTable`; see the module doc."""

    def __init__(self, ttl_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self.clock = clock
        self._keys: OrderedDict[Hashable, _Scores] = OrderedDict()
        self._rows_of: object = None
        """The table's id-to-row dict when the scores were kept: a new one (the table was
        emptied) means the rows now hold other videos."""

    def get(
        self, table: VideoTable, key: Hashable, rows: Indices
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.bool_]]:
        """Per row, the kept score and whether it is still good (False: score it)."""
        kept = self._kept(table, key)
        if kept is None:
            return np.zeros(len(rows), dtype=np.float32), np.zeros(len(rows), dtype=np.bool_)
        return kept.score[rows], kept.until[rows] > self.clock()

    def put(self, table: VideoTable, key: Hashable, rows: Indices,
            scores: npt.NDArray[np.float32]) -> None:
        """Keep ``scores`` of ``rows`` for ``ttl_s``."""
        if self.ttl_s <= 0 or not len(rows):
            return
        kept = self._kept(table, key)
        if kept is None:
            kept = self._keys[key] = _Scores(len(table.hidden))
            while len(self._keys) > KEYS:
                self._keys.popitem(last=False)
        kept.fit(len(table.hidden))
        kept.score[rows] = scores
        kept.until[rows] = self.clock() + self.ttl_s

    def _kept(self, table: VideoTable, key: Hashable) -> _Scores | None:
        if self._rows_of is not table.row_of:
            self._keys.clear()
            self._rows_of = table.row_of
        kept = self._keys.get(key)
        if kept is not None:
            self._keys.move_to_end(key)
            kept.fit(len(table.hidden))
        return kept
