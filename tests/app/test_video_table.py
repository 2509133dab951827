"""Serving's per-video rows: the same features as training, kept fresh by change logs or TTLs."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from app.candidates.retrieval import CandidateFilter
from app.scoring.features import RequestFeatureExtractor
from app.scoring.video_table import VideoSource, video_source
from feature_store.activity.base import NO_STATS, VideoStats
from feature_store.activity.memory import MemoryActivity
from feature_store.catalog.base import Video
from feature_store.catalog.memory import MemoryCatalog
from feature_store.events import EventContext
from feature_store.features import FeatureExtractor, FeatureRow, default_schema
from feature_store.features.dense import stats_matrix
from feature_store.settings import FeatureSettings
from feature_store.sparse.steps import Steps, at_once
from tests.factories import ManualClock, make_event, make_video
from tests.feature_checks import assert_same_features

SCHEMA = default_schema()
TS = 1_700_000_900_000


def want_features(catalog: MemoryCatalog, activity: MemoryActivity, ids: Sequence[str]) -> object:
    videos = catalog.get_many(ids)
    stats = activity.video_stats(ids)
    rows = [
        FeatureRow("u1", v.video_id, TS, v, EventContext(), (), s)  # type: ignore[union-attr]
        for v, s in zip(videos, stats, strict=True)
    ]
    return FeatureExtractor(SCHEMA).extract(rows)


def stores(n: int = 6) -> tuple[MemoryCatalog, MemoryActivity, VideoSource]:
    catalog = MemoryCatalog()
    catalog.upsert(
        [
            make_video(video_id=f"t{i}", category=f"k{i % 2}", creator_id=f"c{i % 3}")
            for i in range(n)
        ]
    )
    activity = MemoryActivity(FeatureSettings())
    return catalog, activity, video_source(catalog, activity, record_ttl_s=0, stats_ttl_s=0)


def test_rows_follow_the_memory_stores_change_logs() -> None:
    catalog, activity, source = stores()
    assert source.record_ttl_s == source.stats_ttl_s == math.inf  # the logs say what changed
    extractor = RequestFeatureExtractor(SCHEMA)
    table = extractor.table
    ids = [f"t{i}" for i in range(6)]

    def check() -> None:
        rows = table.lookup(ids, source)
        got = extractor.extract_rows("u1", TS, EventContext(), [], rows)
        assert_same_features(got, want_features(catalog, activity, ids), SCHEMA)  # type: ignore[arg-type]

    check()
    # Counters change: the dense values derived from them follow.
    activity.record(
        [make_event(video_id="t2", type="play", watch_ms=9_000, ts=TS - 5) for _ in range(4)]
        + [make_event(video_id="t4", type="like", ts=TS - 4)]
    )
    check()
    # A record's feature fields change: a fresh row with the new keys.
    old_row = table.row_of["t3"]
    catalog.upsert([make_video(video_id="t3", category="new", creator_id="c9", tags=("z",))])
    check()
    assert table.row_of["t3"] != old_row
    # Hiding keeps the row (features unchanged) but the filter drops it.
    catalog.set_hidden("t1", True)
    rows = table.lookup(ids, source)
    assert table.passing(rows, CandidateFilter()).tolist() == [True, False, True, True, True, True]
    catalog.set_hidden("t1", False)
    rows = table.lookup(ids, source)
    assert table.passing(rows, CandidateFilter()).all()


def test_unknown_ids_and_filters() -> None:
    catalog, activity, source = stores()
    table = RequestFeatureExtractor(SCHEMA).table
    ids = ["t0", "nope", "t1", "t2", "t3"]
    rows = table.lookup(ids, source)
    assert rows[1] == -1 and (rows[[0, 2, 3, 4]] >= 0).all()
    everything = CandidateFilter()
    assert table.passing(rows, everything).tolist() == [True, False, True, True, True]
    seen = CandidateFilter(seen=frozenset({"t2", "never-seen-here"}))
    assert table.passing(rows, seen).tolist() == [True, False, True, False, True]
    k1 = CandidateFilter(categories=frozenset({"k1", "no-such-category"}))
    assert table.passing(rows, k1).tolist() == [False, False, True, False, True]
    longest = catalog.get("t0").duration_ms  # type: ignore[union-attr]
    short = CandidateFilter(max_duration_ms=longest)
    want = [v is not None and v.duration_ms <= longest for v in catalog.get_many(ids)]
    assert table.passing(rows, short).tolist() == want
    # A video added later is found (unknown ids are not remembered).
    catalog.upsert([make_video(video_id="nope")])
    assert table.lookup(ids, source)[1] >= 0


def test_a_reader_too_far_behind_rereads_everything() -> None:
    catalog, activity, source = stores()
    catalog.changes.capacity = 2
    extractor = RequestFeatureExtractor(SCHEMA)
    ids = [f"t{i}" for i in range(6)]
    extractor.table.lookup(ids, source)
    catalog.upsert([make_video(video_id=f"t{i}", category="moved") for i in range(6)])
    catalog.upsert([make_video(video_id="t0", category="moved")])  # the log keeps only the last
    rows = extractor.table.lookup(ids, source)
    got = extractor.extract_rows("u1", TS, EventContext(), [], rows)
    assert_same_features(got, want_features(catalog, activity, ids), SCHEMA)  # type: ignore[arg-type]


class CountingStore:
    """A store without change logs (as in Redis), counting the ids it is asked for."""

    def __init__(self, videos: list[Video]) -> None:
        self.videos = {v.video_id: v for v in videos}
        self.stats: dict[str, VideoStats] = {}
        self.asked_videos = 0
        self.asked_stats = 0

    def get_many(self, ids: Sequence[str]) -> list[Video | None]:
        self.asked_videos += len(ids)
        return [self.videos.get(i) for i in ids]

    def video_stats_matrix(self, ids: Sequence[str]) -> np.ndarray:
        self.asked_stats += len(ids)
        return stats_matrix([self.stats.get(i, NO_STATS) for i in ids])

    def video_stats_matrix_steps(self, ids: Sequence[str]) -> Steps[np.ndarray]:
        """As Redis has it: the read as steps (here one step)."""
        return at_once(lambda: self.video_stats_matrix(ids))


def test_without_change_logs_copies_expire_after_their_ttl() -> None:
    store = CountingStore([make_video(video_id=f"r{i}") for i in range(4)])
    clock = ManualClock()
    source = video_source(store, store, record_ttl_s=0.3, stats_ttl_s=0.1, clock=clock)
    assert (source.record_ttl_s, source.stats_ttl_s) == (0.3, 0.1)
    table = RequestFeatureExtractor(SCHEMA).table
    ids = [f"r{i}" for i in range(4)]
    table.lookup(ids, source)
    assert (store.asked_videos, store.asked_stats) == (4, 4)
    table.lookup(ids, source)
    assert (store.asked_videos, store.asked_stats) == (4, 4)  # within both TTLs: no reads
    store.stats["r1"] = VideoStats(plays=5, last_ts=TS)
    store.videos["r2"] = store.videos["r2"].model_copy(update={"hidden": True})
    clock.advance(0.15)
    rows = table.lookup(ids, source)
    assert (store.asked_videos, store.asked_stats) == (4, 8)  # counters re-read, records not yet
    assert table.stats[rows[1]].tolist() == stats_matrix([store.stats["r1"]])[0].tolist()
    assert table.passing(rows, CandidateFilter()).all()  # the hide is not seen before its TTL
    clock.advance(0.2)
    rows = table.lookup(ids, source)
    assert store.asked_videos == 8
    assert table.passing(rows, CandidateFilter()).tolist() == [True, True, False, True]


def test_counters_due_are_read_by_steps_beside_other_reads_and_lookup_reads_none() -> None:
    """:meth:`VideoTable.stats_steps`: the counters a lookup would read (known rows past
    their TTL), read where a request's first round runs them; the lookup then reads
    nothing. Unknown ids are left to the lookup; none due: no steps."""
    from feature_store.sparse.steps import run

    store = CountingStore([make_video(video_id=f"s{i}") for i in range(4)])
    clock = ManualClock()
    source = video_source(store, store, record_ttl_s=10, stats_ttl_s=0.1, clock=clock)
    table = RequestFeatureExtractor(SCHEMA).table
    table.lookup(["s0", "s1", "s2"], source)
    assert (store.asked_videos, store.asked_stats) == (3, 3)
    assert table.stats_steps(["s0", "s1", "s3"], source) is None  # fresh, and s3 unknown
    store.stats["s1"] = VideoStats(plays=7, last_ts=TS)
    clock.advance(0.2)
    steps = table.stats_steps(["s0", "s1", "s3", "s1"], source)
    assert steps is not None
    run([steps])
    assert store.asked_stats == 5  # s0 and s1, once each
    rows = table.lookup(["s0", "s1", "s3"], source)
    assert (store.asked_videos, store.asked_stats) == (4, 6)  # s3 only: its record, its counters
    assert table.stats[rows[1]].tolist() == stats_matrix([store.stats["s1"]])[0].tolist()


def test_a_zero_ttl_reads_every_time() -> None:
    store = CountingStore([make_video(video_id="z0")])
    source = video_source(store, store, record_ttl_s=0, stats_ttl_s=0)
    table = RequestFeatureExtractor(SCHEMA).table
    for _ in range(3):
        table.lookup(["z0"], source)
    assert (store.asked_videos, store.asked_stats) == (3, 3)


def test_rows_survive_the_table_growing_and_being_emptied(monkeypatch: object) -> None:
    import app.scoring.video_table as video_table

    catalog = MemoryCatalog()
    catalog.upsert([make_video(video_id=f"g{i}", category=f"k{i % 5}") for i in range(3000)])
    activity = MemoryActivity(FeatureSettings())
    source = video_source(catalog, activity, 0, 0)
    extractor = RequestFeatureExtractor(SCHEMA)
    ids = [f"g{i}" for i in range(3000)]  # past the initial capacity of 1,024 rows
    rows = extractor.table.lookup(ids, source)
    got = extractor.extract_rows("u1", TS, EventContext(), [], rows)
    assert_same_features(got, want_features(catalog, activity, ids), SCHEMA)  # type: ignore[arg-type]
    monkeypatch.setattr(video_table, "CACHE_MAX", 4000)  # type: ignore[attr-defined]
    more = ids[:1500]
    rows = extractor.table.lookup(more, source)  # 3000 + 1500 > 4000: emptied first
    assert len(extractor.table.videos) == 1500
    got = extractor.extract_rows("u1", TS, EventContext(), [], rows)
    assert_same_features(got, want_features(catalog, activity, more), SCHEMA)  # type: ignore[arg-type]
    assert np.array_equal(rows, np.arange(1500))
