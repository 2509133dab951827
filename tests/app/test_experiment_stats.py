"""Per-arm figures: the intervals against published values, the tally against hand counts."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.experiments.stats import mean_interval, newcombe, wilson
from app.experiments.tally import ArmTag, PartitionTally, Totals
from tests.factories import make_event

TAG = ArmTag("e1", "b", log_ts=1_000, user_id="u1")
WINDOW = 60_000


def test_wilson_matches_published_values() -> None:
    # Newcombe (1998), table I: 81/263 -> 0.2553 to 0.3662; 0/10 -> 0 to 0.2775.
    p, low, high = wilson(81, 263)  # type: ignore[misc]
    assert p == pytest.approx(81 / 263)
    assert (round(low, 4), round(high, 4)) == (0.2553, 0.3662)
    _, low, high = wilson(0, 10)  # type: ignore[misc]
    assert low == 0.0 and round(high, 4) == 0.2775
    assert wilson(0, 0) is None


def test_newcombe_difference_matches_the_paper() -> None:
    # Newcombe (1998), table II, example (a): 56/70 - 48/80 -> 0.0524 to 0.3339 (method 10).
    diff, low, high = newcombe(wilson(56, 70), wilson(48, 80))  # type: ignore[misc]
    assert diff == pytest.approx(0.2)
    assert (round(low, 4), round(high, 4)) == (0.0524, 0.3339)


def test_mean_interval_is_the_normal_interval_of_the_sample() -> None:
    values = [0, 0, 10, 20, 30, 40, 0, 5]
    mean, low, high = mean_interval(sum(values), sum(v * v for v in values), len(values))  # type: ignore[misc]
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))
    assert mean == pytest.approx(13.125)
    assert high - mean == pytest.approx(1.959963984540054 * sd / math.sqrt(len(values)))
    assert mean - low == pytest.approx(high - mean)


def run(events: list[Any], tally: PartitionTally | None = None, live: bool = True) -> Totals:
    tally = tally or PartitionTally(WINDOW, 1000)
    for event, log_ts in events:
        tally.apply(event, log_ts, TAG, live)
    return tally.totals.get("e1", {}).get("b", Totals())


def ev(kind: str, video: str = "v1", **fields: Any) -> Any:
    return make_event(type=kind, video_id=video, recommendation_id="r1", **fields)


def test_tally_counts_per_impression_as_described() -> None:
    events = [
        (ev("impression", "v1"), 2_000),
        (ev("play", "v1", watch_ms=10_000), 3_000),
        (ev("progress", "v1", watch_ms=25_000), 4_000),  # a running total: watch is 25 s
        (ev("play", "v1", watch_ms=5_000), 4_500),  # less than seen: no change
        (ev("finish", "v1", watch_ms=0), 5_000),
        (ev("finish", "v1", watch_ms=0), 5_100),  # a second finish counts once
        (ev("impression", "v2"), 2_000),  # shown, nothing else
        (ev("click", "v3"), 2_000),  # before its impression: counts once it comes
        (ev("play", "v3", watch_ms=7_000), 2_100),
        (ev("impression", "v3"), 2_200),
        (ev("play", "v4", watch_ms=9_000), 3_000),  # never shown: counts for nothing
        (ev("impression", "v5"), 2_000),
        (ev("finish", "v5", watch_ms=60_000), 1_000 + WINDOW + 1),  # after the window: late
    ]
    totals = run(events)
    assert totals == Totals(
        impressions=4, clicks=2, finishes=1,
        watch_ms=25_000 + 7_000, watch_sq=25_000**2 + 7_000**2,
    )


def test_a_warm_up_rebuilds_open_impressions_without_counting_them() -> None:
    events = [
        (ev("impression", "v1"), 2_000), (ev("play", "v1", watch_ms=3_000), 2_500),
        (ev("impression", "v2"), 2_600),
        (ev("play", "v2", watch_ms=4_000), 3_000), (ev("finish", "v1"), 3_100),
    ]
    whole = run(events)
    # Checkpoint after 3 records, "crash", restore, re-read them without counting.
    first = PartitionTally(WINDOW, 1000)
    run(events[:3], first)
    restored = PartitionTally(WINDOW, 1000)
    restored.restore(first.state())
    run(events[:3], restored, live=False)
    assert run(events[3:], restored) == whole
