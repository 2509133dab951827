"""The trainer's served-log join (``trainer/served.py``): its reader, its watermark, its outcomes.

On the in-process log. A record the service writes after the impression that
names it is waited for and joined; an id with no record is counted missing
once the served log was read past it; a reader that cannot read gives up
(late) and does not hold later batches; records of another user, another
video or another schema are never trusted. The production topology (Kafka,
Redis, separate processes, restarts) is ``tests/production/test_served_join.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

from feature_store.errors import EventLogUnavailable
from feature_store.eventlog.memory import MemoryEventLog
from feature_store.eventlog.streams import stream_spec
from feature_store.events import Event, EventContext
from feature_store.features.extract import FeatureExtractor
from feature_store.features.schema import default_schema
from feature_store.recommendation_ids import RecommendationIds
from feature_store.served import ServedItem, ServedRecord
from feature_store.settings import Settings
from trainer.served import ServedJoin

EXTRACTOR = FeatureExtractor(default_schema())
IDS = RecommendationIds.for_key("test")
R = [IDS.issue(logged=True) for _ in range(6)]
"""Ids of logged responses, as the service issues them."""


def _settings(**served: int) -> Settings:
    return Settings(served_log={"join_lookahead_ms": 300, "join_max_wait_ms": 2_000, **served})


def _record(rec_id: str, user: str, videos: list[str], schema: str | None = None) -> ServedRecord:
    layout = EXTRACTOR.layout
    return ServedRecord(
        recommendation_id=rec_id,
        user_id=user,
        ts_ms=int(time.time() * 1000),
        model_version="main-20260101T000000-00000",
        schema_hash=schema or EXTRACTOR.schema.schema_hash(),
        context=EventContext(device="tv"),
        items=tuple(ServedItem(v, k, 0.5 - k / 100, "covisit") for k, v in enumerate(videos)),
        request_values=np.arange(len(layout.request_slots), dtype=np.uint64),
        item_values=np.full((len(videos), len(layout.item_slots)), 7, dtype=np.uint64),
    )


def _shown(rec_id: str, user: str, video: str) -> Event:
    return Event(event_id=f"{rec_id}-{user}-{video}", user_id=user, video_id=video,
                 type="impression", ts=int(time.time() * 1000), recommendation_id=rec_id)


@pytest.fixture()
def served() -> Iterator[MemoryEventLog]:
    settings = _settings()
    with MemoryEventLog(settings, stream=stream_spec(settings, "served")) as log:
        yield log


def test_a_record_written_after_its_impression_is_waited_for_and_joined(
    served: MemoryEventLog,
) -> None:
    join = ServedJoin(served, _settings(join_lookahead_ms=60_000).served_log, EXTRACTOR)
    served.produce([_record(R[0], "ann", ["v1"])])  # the reader is running and caught up
    join.moments([_shown(R[0], "ann", "v1")])
    late = _record(R[1], "ann", ["v1", "v2"])
    late_writer = threading.Timer(0.3, lambda: served.produce([late]))
    late_writer.start()  # the service's queue delays the record past the impression
    try:
        found, values, scores = join.moments([_shown(R[1], "ann", "v2")])
    finally:
        late_writer.join()
        join.close()
    assert found == [0] and join.counts["joined"] == 2 and join.counts["missing"] == 0
    layout = EXTRACTOR.layout
    assert (values[0, layout.item_slots] == 7).all()
    assert scores[0] == pytest.approx(0.49)  # the served item's score: the prediction as shown


def test_an_id_without_a_record_is_missing_once_the_log_is_read_past_it_a_fallback_never(
    served: MemoryEventLog,
) -> None:
    join = ServedJoin(served, _settings().served_log, EXTRACTOR)
    served.produce([_record(R[0], "bo", ["v1"])])
    try:
        found, _, _ = join.moments([
            _shown(R[0], "bo", "v1"),
            _shown(R[5], "bo", "v1"),  # logged, but the service dropped the record
            _shown(IDS.issue(logged=False), "bo", "v1"),  # a fallback's: nothing to find
        ])
    finally:
        join.close()
    assert found == [0]
    assert {k: join.counts[k] for k in ("joined", "missing", "late")} == {
        "joined": 1, "missing": 1, "late": 0
    }


def test_records_of_another_user_video_or_schema_are_not_trusted(served: MemoryEventLog) -> None:
    join = ServedJoin(served, _settings().served_log, EXTRACTOR)
    served.produce([_record(R[0], "cy", ["v1", "v2"]), _record(R[4], "cy", ["v1"], "0" * 16)])
    try:
        found, _, _ = join.moments([
            _shown(R[0], "cy", "v2"),
            _shown(R[0], "dee", "v1"),  # another user's response
            _shown(R[0], "cy", "v9"),  # not in that response
            _shown(R[4], "cy", "v1"),  # scored with another schema
        ])
    finally:
        join.close()
    assert found == [0]
    assert (join.counts["unknown"], join.counts["other_schema"]) == (2, 1)


class _Unreadable:
    """A served-log reader whose broker is down."""

    def poll(self, max_records: int, timeout_s: float) -> list[object]:
        time.sleep(min(timeout_s, 0.05))
        raise EventLogUnavailable("served topic unreachable")

    def close(self) -> None:
        pass


def test_a_reader_that_cannot_read_gives_up_and_holds_later_batches_no_more(
    served: MemoryEventLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(served, "reader", lambda partitions=None: _Unreadable())
    join = ServedJoin(served, _settings(join_max_wait_ms=2_000).served_log, EXTRACTOR)
    try:
        first = join.moments([_shown(R[0], "ed", "v1")])
        waited = join.waited_s
        second = join.moments([_shown(R[1], "ed", "v1")])
    finally:
        join.close()
    assert first[0] == [] and second[0] == []
    assert join.counts["late"] == 2 and join.counts["missing"] == 0
    assert waited >= 2.0 and join.waited_s - waited < 1.0, "the second batch waited again"
    assert "unreachable" in (join.status()["reader_error"] or "")


def test_a_restarted_trainer_reads_back_a_join_window_before_it_resumes(
    served: MemoryEventLog,
) -> None:
    served.produce([_record(R[i], "fay", ["v1"]) for i in range(5)])
    resumed_at = int(time.time() * 1000)
    join = ServedJoin(served, _settings().served_log, EXTRACTOR)
    join.follow(list(range(served.partition_count())), resumed_at, aligned=True)
    try:
        found, _, _ = join.moments([_shown(R[i], "fay", "v1") for i in range(5)])
    finally:
        join.close()
    assert found == list(range(5))
