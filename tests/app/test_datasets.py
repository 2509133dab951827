"""MovieLens and CSV readers, the rating mapping, and ``vidrec replay``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.evaluation.datasets import Rating, movielens_events, rating_events, time_shift
from feature_store.events import EventType
from feature_store.runtime.resources import open_resources
from feature_store.settings import Settings

ML100K = Path(__file__).resolve().parents[3] / "shared" / "datasets" / "ml-100k"
MIN_TS = 946_684_800_000


def write_tiny_ml100k(directory: Path) -> None:
    """Three users, three movies, with a tie in time to exercise the tie-break."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "u.data").write_text(
        "2\t1\t5\t881250949\n"
        "1\t2\t1\t881250949\n"  # same second as the line above: user 1 sorts first
        "1\t1\t3\t881250950\n"
        "3\t3\t4\t881250960\n"
        "3\t2\t2\t881250970\n"
    )
    flags = ["0"] * 19
    action = flags.copy()
    action[1] = "1"
    comedy = flags.copy()
    comedy[5] = comedy[8] = "1"
    (directory / "u.item").write_text(
        f"1|Toy Story (1995)|01-Jan-1995||http://x|{'|'.join(comedy)}\n"
        f"2|GoldenEye (1995)|01-Jan-1995||http://x|{'|'.join(action)}\n"
        f"3|Old Movie (1950)|01-Jan-1950||http://x|{'|'.join(flags)}\n"
    )
    (directory / "u.user").write_text("1|24|M|technician|85711\n2|53|F|other|94043\n")


@pytest.mark.parametrize(
    ("rating", "types"),
    [
        (5.0, ["impression", "play", "finish", "like"]),
        (4.5, ["impression", "play", "finish", "like"]),
        (4.0, ["impression", "play", "finish"]),
        (3.5, ["impression", "play"]),  # half stars below 4 are not "liked"
        (3.0, ["impression", "play"]),
        (2.0, ["impression", "play"]),
        (1.0, ["impression", "skip", "dislike"]),
    ],
)
def test_rating_mapping(rating: float, types: list[str]) -> None:
    events = rating_events(Rating("1", "2", rating, 1_000_000_000_000), 0)
    assert [e.type.value for e in events] == types
    assert [e.ts for e in events] == [1_000_000_000_000 + k for k in range(len(types))]
    plays = [e for e in events if e.type == EventType.PLAY]
    if rating in (3.0, 3.5):
        assert plays[0].watch_ratio() == pytest.approx(0.3)
    if rating == 2.0:
        assert plays[0].watch_ratio() == pytest.approx(0.05)
    if rating >= 4.0:
        assert (plays[0].watch_ratio() or 0.0) >= 0.9


def test_shift_moves_old_data_past_the_minimum_and_keeps_spacing() -> None:
    shift = time_shift(881_250_949_000, 881_250_970_000, MIN_TS, now_ms=1_800_000_000_000)
    assert 881_250_949_000 + shift == MIN_TS + 86_400_000
    assert time_shift(1_600_000_000_000, 1_700_000_000_000, MIN_TS) == 0


def test_order_is_event_time_then_user_then_item(tmp_path: Path) -> None:
    write_tiny_ml100k(tmp_path)
    events, videos = movielens_events(tmp_path, MIN_TS)
    firsts = [(e.user_id, e.video_id) for e in events if e.type == EventType.IMPRESSION]
    expected = [("ml1", "ml2"), ("ml2", "ml1"), ("ml1", "ml1"), ("ml3", "ml3"), ("ml3", "ml2")]
    assert firsts == expected
    assert [e.ts for e in events] == sorted(e.ts for e in events)
    by_id = {v.video_id: v for v in videos}
    assert by_id["ml1"].category == "comedy" and by_id["ml1"].tags == ("comedy", "drama")
    assert by_id["ml3"].creator_id == "decade-1950s"


def test_vidrec_replay_writes_catalog_and_events(tmp_path: Path) -> None:
    data = tmp_path / "ml"
    write_tiny_ml100k(data)
    env = {**os.environ, "VIDREC_DATA_DIR": str(tmp_path / "state")}
    subprocess.run(
        [sys.executable, "-m", "app.cli", "replay", str(data)], check=True, env=env, timeout=120
    )
    settings = Settings(data_dir=tmp_path / "state")
    with open_resources(settings) as resources:
        assert resources.catalog.count() == 3
        consumer = resources.event_log.consumer("check")
        consumed = []
        while batch := consumer.poll(100, timeout_s=0.5):
            consumed += batch
        consumer.close()
    ids = sorted(c.event.event_id for c in consumed)
    assert len(ids) == 4 + 3 + 2 + 3 + 2  # ratings 5, 1, 3, 4, 2
    assert ids[0] == "ml-1-1-0"


@pytest.mark.skipif(not (ML100K / "u.data").is_file(), reason="ml-100k not present")
def test_real_ml100k_maps_every_rating() -> None:
    events, videos = movielens_events(ML100K, MIN_TS)
    assert len(videos) == 1682
    assert sum(e.type == EventType.IMPRESSION for e in events) == 100_000
    assert events[0].ts == MIN_TS + 86_400_000


def test_rating_at_least_4_is_exactly_the_evaluations_positive_label() -> None:
    """Under ``vidrec eval``'s label policy one event per rating carries a weight, and its
    label is ``rating >= 4``: 3.5 is negative, 4 positive (half stars of ml-latest)."""
    from app.evaluation.stream import rating_label_settings
    from feature_store.settings import FeatureSettings, TrainerSettings
    from trainer.labels import LabelPolicy

    labels = rating_label_settings()
    policy = LabelPolicy(TrainerSettings(**labels["trainer"]),
                         FeatureSettings(**labels["features"]))
    for stars in (0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0):
        events = rating_events(Rating("1", "2", stars, 1_000_000_000_000), 0)
        weighted = [
            (policy.label(e), policy.weight(e.type)) for e in events
            if policy.label(e) is not None and policy.weight(e.type) > 0
        ]
        assert weighted == [(1.0 if stars >= 4 else 0.0, 1.0)], stars


def test_vidrec_replay_shifts_an_old_events_csv_and_reports_bad_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A CSV from 1996 is replayed shifted past ``limits.min_ts_ms``, not dead-lettered;
    a bad row is skipped with a message naming its line and field, the others kept."""
    from app.evaluation.datasets import replay_dataset

    old = 830_000_000_000  # 1996-04-20
    lines = ["event_id,user_id,video_id,type,ts,watch_ms,duration_ms"]
    lines += [f"e{i},u{i % 3},v{i % 5},finish,{old + i * 60_000},30000,30000" for i in range(9)]
    lines.append("e9,u1,v1,finish,not-a-time,,")
    path = tmp_path / "old.csv"
    path.write_text("\n".join(lines) + "\n")
    settings = Settings(data_dir=tmp_path / "state")
    with open_resources(settings) as resources:
        with caplog.at_level("WARNING"):
            assert replay_dataset(path, resources) == 9
        consumer = resources.event_log.consumer("check")
        consumed = []
        while batch := consumer.poll(100, timeout_s=0.5):
            consumed += batch
        consumer.close()
    times = [c.event.ts for c in consumed]
    assert len(times) == 9 and min(times) == MIN_TS + 86_400_000
    assert times == sorted(times) and times[1] - times[0] == 60_000  # spacing kept
    assert "shifted by" in caplog.text and "old.csv:11: ts:" in caplog.text
