"""Serving's numpy view of the videos it scores: catalog fields, feature keys, counters.

A 500-candidate request would otherwise touch 500 catalog records and 500
counter objects several times (read, filter, hash, compare), each pass a
Python loop over scattered objects: about a millisecond in all. Here each
video seen gets a *row* in a set of arrays (feature keys and their codes,
upload time and duration, hidden flag, category, counters and the dense
values derived from them), so a request is one dict pass from ids to rows
(:meth:`VideoTable.lookup`) and the rest is fancy indexing.

Freshness. A row's catalog fields and its counters each have a deadline
(monotonic seconds, :attr:`VideoSource.clock`) after which they are read again from the stores:

- in-process stores keep a :class:`~feature_store.changelog.ChangeLog`
  (``catalog.changes``, ``activity.stats_changes``); the table follows it at
  every lookup and marks the rows of changed ids stale, so copies never
  expire by time (deadline infinity) and are never stale either;
- Redis stores have no log: catalog fields are kept
  :data:`~app.cache.CATALOG_TTL_S` (writes through this process are logged in
  ``CachedReads.forgotten`` and followed like a store's log), counters
  ``api.hot_row_cache_ttl_ms``: the same staleness bounds as the service's
  read cache (:mod:`app.cache`).

A changed record whose feature fields (those the schema's sources declare,
plus the filters' category and duration) differ gets a fresh row; the old
one is left unreferenced until the table is emptied at :data:`CACHE_MAX`
rows. One table per thread (the
:class:`~app.scoring.features.RequestFeatureExtractor` that owns it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import repeat
from operator import attrgetter, is_, itemgetter
from typing import Any

import numpy as np
import numpy.typing as npt

from app.candidates.retrieval import CandidateFilter
from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.catalog.base import Video
from feature_store.changelog import ChangeLog
from feature_store.features.dense import AFFINITY_FIELDS, STAT_FIELDS, history_counts, stats_matrix
from feature_store.features.extract import Indices
from feature_store.features.keys import Keys
from feature_store.sparse.steps import Steps, stepped

CACHE_MAX = 200_000
"""Rows before the table is emptied (a crude bound on memory: ~100 MB)."""

_video_id = attrgetter("video_id")

FILTER_FIELDS = ("category", "duration_ms")
"""Catalog fields a request's filters read from the rows (``hidden`` is refreshed always)."""

Describe = Callable[[Video], tuple[list[int], dict[str, Keys]]]
"""A video's categorical keys (one per video column) and multi-valued keys (per column)."""
Derive = Callable[[npt.NDArray[np.float64], npt.NDArray[np.float64]], npt.NDArray[np.float32]]
"""Dense values cached per video from its numeric-field rows (``number_fields`` order) and
counter rows."""


@dataclass(frozen=True)
class VideoSource:
    """Where a :class:`VideoTable` reads videos and counters, and how long copies are good."""

    get_videos: Callable[[Sequence[str]], list[Video | None]]
    get_stats: Callable[[Sequence[str]], npt.NDArray[np.float64]]
    """Counters of ids as a matrix (``STAT_FIELDS`` columns, e.g.
    :meth:`~feature_store.activity.base.ActivityStore.video_stats_matrix`)."""
    record_ttl_s: float
    """How long catalog fields are reused (infinity when a change log covers them)."""
    stats_ttl_s: float
    """How long counters are reused (infinity when a change log covers them; 0: never)."""
    record_logs: tuple[ChangeLog, ...] = ()
    stats_logs: tuple[ChangeLog, ...] = ()
    clock: Callable[[], float] = time.monotonic
    """Monotonic seconds the deadlines are kept in (tests pass a clock they move by hand)."""
    get_stats_steps: Callable[[Sequence[str]], Steps[npt.NDArray[np.float64]]] | None = None
    """:attr:`get_stats` as steps, where the store has them (Redis): see
    :meth:`VideoTable.stats_steps`."""


def video_source(
    catalog: Any,
    activity: Any,
    record_ttl_s: float,
    stats_ttl_s: float,
    forgotten: ChangeLog | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> VideoSource:
    """A source over the stores, using their change logs where they keep one."""
    record_log: ChangeLog | None = getattr(catalog, "changes", None)
    stats_log: ChangeLog | None = getattr(activity, "stats_changes", None)
    return VideoSource(
        get_videos=catalog.get_many,
        get_stats=activity.video_stats_matrix,
        get_stats_steps=getattr(activity, "video_stats_matrix_steps", None),
        record_ttl_s=math.inf if record_log is not None else record_ttl_s,
        stats_ttl_s=math.inf if stats_log is not None else stats_ttl_s,
        record_logs=tuple(log for log in (record_log, forgotten) if log is not None),
        stats_logs=(stats_log,) if stats_log is not None else (),
        clock=clock,
    )


class Codes:
    """Small integer codes for the distinct keys of one video column.

    A code is given when a video carrying the key gets a row, so a request
    finds its distinct keys with a marker array over codes (:meth:`distinct`)
    rather than by sorting 64-bit keys. Codes are never reused: the table
    that owns them is emptied, codes included, at :data:`CACHE_MAX` rows.
    """

    def __init__(self) -> None:
        self.code_of: dict[int, int] = {}
        self.keys = np.zeros(256, dtype=np.uint64)
        """Code to key."""

    def code(self, key: int) -> int:
        code = self.code_of.get(key)
        if code is None:
            code = self.code_of[key] = len(self.code_of)
            if code == len(self.keys):
                self.keys = np.concatenate([self.keys, np.zeros_like(self.keys)])
            self.keys[code] = key
        return code

    def distinct(self, codes: npt.NDArray[np.int32]) -> tuple[Keys, Indices]:
        """The distinct keys among ``codes`` (in code order) and each code's position in them."""
        n = len(self.code_of)
        mark = np.zeros(n, dtype=np.bool_)
        mark[codes] = True
        present = np.flatnonzero(mark)
        position = np.empty(n, dtype=np.int64)
        position[present] = np.arange(len(present))
        return self.keys[present], position[codes]


class VideoTable:
    """Per-video rows (see the module docstring). Not thread-safe: one per thread.

    Video ids get no codes (``coders[j] is None``): every video has its own,
    and a request's candidates are distinct already.
    """

    def __init__(
        self,
        coded: list[bool],
        multi_lens: dict[str, int],
        n_dense: int,
        describe: Describe,
        derive: Derive,
        number_fields: Sequence[str] = (),
        feature_fields: Sequence[str] = (),
    ) -> None:
        self.coded = coded
        self.multi_lens = multi_lens
        self.n_dense = n_dense
        self.describe = describe
        self.derive = derive
        self.number_fields = tuple(number_fields)
        """Numeric catalog fields kept per row (``numbers``), as dense sources declare them."""
        fingerprint = tuple(dict.fromkeys((*feature_fields, *FILTER_FIELDS)))
        self._fingerprint = attrgetter(*fingerprint)
        """The catalog fields the features (per their sources' declarations) and the
        filters read: a record differing in any gets a fresh row."""
        self._numbers = attrgetter(*self.number_fields) if self.number_fields else None
        self._seen: dict[int, int] = {}
        """Sequence number reached in each change log followed (by ``id(log)``)."""
        self.clear()

    def clear(self, capacity: int = 1024) -> None:
        n_categorical = len(self.coded)
        self.row_of: dict[str, int] = {}
        self.videos: list[Video] = []
        self.fingerprints: list[tuple[object, ...]] = []
        self.stats_of: list[VideoStats | None] = []
        self.categorical = np.zeros((capacity, n_categorical), dtype=np.uint64)
        self.codes = np.zeros((capacity, n_categorical), dtype=np.int32)
        self.coders = [Codes() if coded else None for coded in self.coded]
        self.multi = {
            n: np.zeros((capacity, k), dtype=np.uint64) for n, k in self.multi_lens.items()
        }
        self.multi_codes = {
            n: np.zeros((capacity, k), dtype=np.int32) for n, k in self.multi_lens.items()
        }
        self.multi_coders = {n: Codes() for n in self.multi_lens}
        self.multi_len = {n: np.zeros(capacity, dtype=np.int64) for n in self.multi_lens}
        self.numbers = np.zeros((capacity, len(self.number_fields)), dtype=np.float64)
        """Per row, the numeric catalog fields dense sources read (``number_fields``)."""
        self.duration = np.zeros(capacity, dtype=np.float64)
        """Length in ms, for the request's longest-duration filter."""
        self.hidden = np.zeros(capacity, dtype=np.bool_)
        self.category = np.zeros(capacity, dtype=np.int32)
        """Category code (:attr:`category_code`), for the request's category filter."""
        self.category_code: dict[str, int] = {}
        self.creator = np.zeros(capacity, dtype=np.int32)
        """Creator code (:attr:`creator_code`), for the user's affinity to it."""
        self.creator_code: dict[str, int] = {}
        self.stats = np.zeros((capacity, len(STAT_FIELDS)), dtype=np.float64)
        self.dense = np.zeros((capacity, self.n_dense), dtype=np.float32)
        self.record_until = np.full(capacity, -math.inf)
        self.stats_until = np.full(capacity, -math.inf)

    def _grow(self) -> None:
        def doubled(array: npt.NDArray[Any], fill: float = 0) -> npt.NDArray[Any]:
            return np.concatenate([array, np.full_like(array, fill)])

        for name in (
            "categorical", "codes", "numbers", "duration", "hidden", "category", "creator",
            "stats", "dense",
        ):
            setattr(self, name, doubled(getattr(self, name)))
        self.record_until = doubled(self.record_until, -math.inf)
        self.stats_until = doubled(self.stats_until, -math.inf)
        for n in self.multi:
            self.multi[n] = doubled(self.multi[n])
            self.multi_codes[n] = doubled(self.multi_codes[n])
            self.multi_len[n] = doubled(self.multi_len[n])

    def add(self, video: Video) -> int:
        """A new row for ``video`` (its counters still to set); ``row_of`` points at it."""
        row = len(self.videos)
        if row == len(self.hidden):
            self._grow()
        categorical, multi = self.describe(video)
        self.videos.append(video)
        self.stats_of.append(None)
        self.fingerprints.append(self._fingerprint(video))
        self.row_of[video.video_id] = row
        self.categorical[row] = categorical
        self.codes[row] = [
            coder.code(key) if coder is not None else 0
            for coder, key in zip(self.coders, categorical, strict=True)
        ]
        if self._numbers is not None:
            numbers = self._numbers(video)
            self.numbers[row] = numbers if len(self.number_fields) > 1 else (numbers,)
        self.duration[row] = video.duration_ms
        self.hidden[row] = video.hidden
        self.category[row] = self.category_code.setdefault(video.category, len(self.category_code))
        self.creator[row] = self.creator_code.setdefault(video.creator_id, len(self.creator_code))
        for n, keys in multi.items():
            coder = self.multi_coders[n]
            self.multi[n][row, : len(keys)] = keys
            self.multi_codes[n][row, : len(keys)] = [coder.code(k) for k in keys.tolist()]
            self.multi_len[n][row] = len(keys)
        self.record_until[row] = -math.inf
        self.stats_until[row] = -math.inf
        return row

    def _set_record(self, row: int | None, video: Video) -> int:
        """``video``'s row: ``row`` updated if its feature fields are the same, else a new one."""
        if row is None or (
            self.videos[row] is not video and self.fingerprints[row] != self._fingerprint(video)
        ):
            return self.add(video)
        self.videos[row] = video  # the same record: next time the identity check holds
        self.hidden[row] = video.hidden
        return row

    def _set_stats(self, rows: Indices, stats: Sequence[VideoStats]) -> None:
        """Store counters for ``rows`` and recompute the dense values derived from them."""
        self._set_stats_matrix(rows, stats_matrix(stats))
        for row, s in zip(rows.tolist(), stats, strict=True):
            self.stats_of[row] = s

    def _set_stats_matrix(self, rows: Indices, matrix: npt.NDArray[np.float64]) -> None:
        """:meth:`_set_stats` from a counters matrix (``STAT_FIELDS`` columns); the rows'
        counters objects become unknown (:meth:`set_stats` then compares by value)."""
        self.stats[rows] = matrix
        for row in rows.tolist():
            self.stats_of[row] = None
        if self.n_dense:
            self.dense[rows] = self.derive(self.numbers[rows], matrix)

    # --- rows for given records and counters (the caller read them) ------

    def rows_of(self, videos: Sequence[Video]) -> Indices:
        """The rows of these records: reused while a record is the same object or equal."""
        if len(self.videos) + len(videos) > CACHE_MAX:
            self.clear()
        row_of, cached = self.row_of, self.videos
        rows = list(map(row_of.get, map(_video_id, videos), repeat(-1, len(videos))))
        if rows and -1 not in rows:
            known = itemgetter(*rows)(cached) if len(rows) > 1 else (cached[rows[0]],)
            if all(map(is_, known, videos)):  # the usual case: same records as last time
                return np.fromiter(rows, np.int64, len(rows))
        for i, (row, video) in enumerate(zip(rows, videos, strict=True)):
            # Redis hands out new objects: compare the fields features read, not the object.
            rows[i] = self._set_record(None if row < 0 else row, video)
        return np.fromiter(rows, np.int64, len(rows))

    def set_stats(self, rows: Indices, stats: Sequence[VideoStats]) -> None:
        """Counters for ``rows``, recomputing only those whose counters object changed."""
        row_list = rows.tolist()
        if not row_list:
            return
        cached = self.stats_of
        known = itemgetter(*row_list)(cached) if len(row_list) > 1 else (cached[row_list[0]],)
        if all(map(is_, known, stats)):
            return
        # Another object with the same counters is no change; comparing costs only on a mismatch.
        changed = []
        for i, (k, s) in enumerate(zip(known, stats, strict=True)):
            if k is not s:
                if k != s:
                    changed.append(i)
                else:
                    cached[row_list[i]] = s  # next time the identity check holds
        if changed:
            self._set_stats(rows[changed], [stats[i] for i in changed])

    # --- rows for ids, read through a source -----------------------------

    def lookup(self, video_ids: Sequence[str], source: VideoSource) -> Indices:
        """The row of each id (-1: not in the catalog), fresh per ``source``'s rules.

        Costs one dict pass over the ids; the stores are read only for ids
        without a row, rows marked stale by a change log, and rows past their
        deadline (each in one bulk read).
        """
        n = len(video_ids)
        if len(self.videos) + n > CACHE_MAX:
            self.clear()
        self._follow(source)
        now = source.clock()
        rows = np.fromiter(map(self.row_of.get, video_ids, repeat(-1, n)), np.int64, n)
        stale = rows < 0
        known = np.flatnonzero(~stale)
        stale[known] = self.record_until[rows[known]] < now
        if stale.any():
            at = np.flatnonzero(stale).tolist()
            until = now + source.record_ttl_s
            fetched = source.get_videos([video_ids[i] for i in at])
            for i, video in zip(at, fetched, strict=True):
                if video is None:  # unknown (or gone): not kept, asked again next time
                    rows[i] = -1
                    self.row_of.pop(video_ids[i], None)
                    continue
                row = self._set_record(self.row_of.get(video.video_id), video)
                self.record_until[row] = until
                rows[i] = row
        present = rows[rows >= 0]
        due = present[self.stats_until[present] < now]
        if len(due):
            due = np.unique(due)  # an id given twice is read once
            matrix = source.get_stats([self.videos[row].video_id for row in due.tolist()])
            self._set_stats_matrix(due, matrix)
            self.stats_until[due] = now + source.stats_ttl_s
        return rows

    def stats_steps(self, video_ids: Sequence[str], source: VideoSource) -> Steps[None] | None:
        """The read :meth:`lookup` would make of the counters of ``video_ids`` that have a
        row past its counters' deadline, as steps that store what they read (None: none
        due). Run in a request's first round (its history's), so with Redis the counters
        cost no round trip of their own; :meth:`lookup` then finds them fresh. Ids
        without a row, and rows a change log marks stale, are left to :meth:`lookup`; so is
        everything when the source has no steps (the memory stores: an early read there
        saves nothing, and the request would look its ids up twice)."""
        if source.get_stats_steps is None:
            return None
        now = source.clock()
        rows = np.fromiter(
            map(self.row_of.get, video_ids, repeat(-1, len(video_ids))), np.int64, len(video_ids)
        )
        present = rows[rows >= 0]
        due = np.unique(present[self.stats_until[present] < now])
        if not len(due):
            return None
        return self._stats_into(due, source, now)

    def _stats_into(self, due: Indices, source: VideoSource, now: float) -> Steps[None]:
        ids = [self.videos[row].video_id for row in due.tolist()]
        matrix = yield from stepped(source, "get_stats", ids)  # get_stats_steps
        self._set_stats_matrix(due, matrix)
        self.stats_until[due] = now + source.stats_ttl_s

    def _follow(self, source: VideoSource) -> None:
        """Mark stale the rows of ids the source's change logs name since last time."""
        for logs, deadline in (
            (source.record_logs, self.record_until),
            (source.stats_logs, self.stats_until),
        ):
            for log in logs:
                seq, changed = log.since(self._seen.get(id(log), 0))
                self._seen[id(log)] = seq
                if changed is None:
                    deadline[:] = -math.inf
                elif changed:
                    rows = [r for r in map(self.row_of.get, changed) if r is not None]
                    deadline[rows] = -math.inf

    def affinity(self, history: Sequence[HistoryEntry], rows: Indices) -> npt.NDArray[np.float64]:
        """The user's affinity counts (:data:`AFFINITY_FIELDS`) for the videos of ``rows``:
        the history counted once, then spread over the rows by their category and creator
        codes (the dense features' counts, and the cold start's own evidence)."""
        out = np.zeros((len(rows), len(AFFINITY_FIELDS)))
        if not history:
            return out
        counts = history_counts(history)
        for j, (codes, of_row) in enumerate(
            ((self.category_code, self.category), (self.category_code, self.category),
             (self.creator_code, self.creator), (self.creator_code, self.creator))
        ):
            per_code = np.zeros(len(codes) + 1)
            for value, count in counts[j].items():
                code = codes.get(value)
                if code is not None:
                    per_code[code] = count
            out[:, j] = per_code[of_row[rows]]
        return out

    def passing(self, rows: Indices, keep: CandidateFilter) -> npt.NDArray[np.bool_]:
        """Which ``rows`` (from :meth:`lookup`) are known, visible and pass ``keep``."""
        ok = rows >= 0
        at = np.where(ok, rows, 0)
        ok &= ~self.hidden[at]
        if keep.seen:
            seen = [r for r in map(self.row_of.get, keep.seen) if r is not None]
            if seen:
                ok &= ~np.isin(at, seen)
        if keep.categories is not None:
            codes = [c for c in map(self.category_code.get, keep.categories) if c is not None]
            ok &= np.isin(self.category[at], codes)
        if keep.max_duration_ms is not None:
            ok &= self.duration[at] <= keep.max_duration_ms
        return ok
