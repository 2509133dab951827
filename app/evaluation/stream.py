"""A dataset as one event stream in event-time order, and the split of its samples.

Formats (the path is always an argument; vidrec never copies data):

- ``movielens``: a directory with ``u.data``/``u.item`` (ml-100k) or
  ``ratings.csv``/``movies.csv`` (newer releases), mapped to events by
  :mod:`feature_store.datasets` (genres, release decade); where ``u.user``
  is present, each event's context carries its user's age group, gender and
  occupation (read as features with ``features.user_attributes``);
- ``csv`` / ``parquet``: events in vidrec's schema (``event_id, user_id,
  video_id, type, ts`` and optionally ``watch_ms, duration_ms``). Parquet
  needs ``pyarrow``.

Ratings are labelled ``rating >= 4``: :func:`rating_label_settings` sets the
trainer's label policy so that exactly one event per rating carries a loss
weight, and its label is that (see the function).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from feature_store.catalog.base import Video
from feature_store.component import ScoredSamples
from feature_store.datasets import movielens_events, read_events_csv
from feature_store.errors import InvalidInput, NotFound
from feature_store.events import Event, EventContext, EventType

Format = Literal["auto", "movielens", "csv", "parquet"]


@dataclass
class Stream:
    events: list[Event]
    videos: list[Video]
    kind: Literal["movielens", "events"]
    users: dict[str, EventContext] = field(default_factory=dict)
    """Profile context per user id (age group, gender, occupation), where the data has it."""


def detect(path: Path) -> str:
    if path.is_dir() and ((path / "u.data").is_file() or (path / "ratings.csv").is_file()):
        return "movielens"
    if path.is_file() and path.suffix in (".csv", ".parquet"):
        return path.suffix[1:]
    raise InvalidInput("dataset", f"{path}: not a MovieLens directory, events CSV or Parquet")


def load_stream(path: Path, fmt: Format, min_ts_ms: int, limit: int | None = None) -> Stream:
    """The dataset's events in event-time order (at most ``limit``) and its catalog."""
    path = Path(path)
    if not path.exists():
        raise NotFound(f"dataset {path} does not exist")
    kind = detect(path) if fmt == "auto" else fmt
    if kind == "movielens":
        events, videos = movielens_events(path, min_ts_ms)
        users = read_ml100k_users(path) if (path / "u.user").is_file() else {}
        if users:
            events = [
                e.model_copy(update={"context": users[e.user_id]}) if e.user_id in users else e
                for e in events
            ]
        stream = Stream(events, videos, "movielens", users)
    elif kind == "csv":
        stream = Stream(list(read_events_csv(path)), [], "events")
    elif kind == "parquet":
        stream = Stream(sorted(_read_parquet(path), key=lambda e: e.ts), [], "events")
    else:
        raise InvalidInput("format", f"unknown dataset format {fmt!r}")
    if limit is not None:
        stream.events = stream.events[:limit]
    return stream


_AGE_GROUPS = ((18, "under-18"), (25, "18-24"), (35, "25-34"), (45, "35-44"), (50, "45-49"),
               (56, "50-55"))
"""MovieLens 1M's age brackets (upper bound exclusive); 56 and over is ``56+``."""


def age_group(age: int) -> str:
    return next((name for bound, name in _AGE_GROUPS if age < bound), "56+")


def read_ml100k_users(directory: Path) -> dict[str, EventContext]:
    """``u.user`` (``id|age|gender|occupation|zip``) as profile context per user id.

    The user ids match :mod:`feature_store.datasets` (``ml<id>``). Zip codes
    are not used (no column reads them).
    """
    users = {}
    with open(directory / "u.user", encoding="latin-1") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("|")
            if len(parts) < 4 or not parts[1].isdigit():
                continue
            users[f"ml{parts[0]}"] = EventContext(
                age_group=age_group(int(parts[1])), gender=parts[2][:16] or None,
                occupation=parts[3][:32] or None,
            )
    return users


def _read_parquet(path: Path) -> Iterable[Event]:
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise InvalidInput("format", "reading Parquet needs pyarrow (pip install pyarrow)") from exc
    for row in pq.read_table(path).to_pylist():
        yield _event(row)


def _event(row: Mapping[str, Any]) -> Event:
    return Event(
        event_id=str(row["event_id"]), user_id=str(row["user_id"]),
        video_id=str(row["video_id"]), type=EventType(row["type"]), ts=int(row["ts"]),
        watch_ms=int(row.get("watch_ms") or 0),
        duration_ms=int(row["duration_ms"]) if row.get("duration_ms") else None,
    )


def rating_label_settings() -> dict[str, Any]:
    """Trainer settings under which each MovieLens rating is one sample labelled ``>= 4``.

    :mod:`feature_store.datasets` turns a rating into an impression then a
    ``play`` (watch ratio 1.0 / 0.9 / 0.3 / 0.05 for 5 / 4 / 3 / 2 stars) or
    a ``skip`` (1 star), followed by ``finish``/``like``/``dislike``. With
    both watch-ratio thresholds at 0.5 the play (or skip) is labelled exactly
    ``rating >= 4`` (the default policy leaves 3 stars unlabelled); the
    follow-up events get loss weight 0, so each rating weighs once. The
    impression is joined by its play and yields nothing.
    """
    return {  # with features.positive_watch_ratio at its default, 0.5
        "short_play_ratio": 0.5,
        "sample_weights": {"finish": 0.0, "like": 0.0, "dislike": 0.0, "share": 0.0},
    }


_DIGITS = re.compile(r"(\d+)")


def _natural(text: str) -> tuple[Any, ...]:
    """``ml12`` before ``ml100``: ids compared as numbers where they are."""
    return tuple(int(p) if p.isdigit() else p for p in _DIGITS.split(text))


@dataclass
class Split:
    """The offline comparison's rows, by label-carrying event id."""

    train: list[str]
    valid: list[str]
    test: list[str]
    test_start_ts: int
    """Event time of the first test row (ms)."""
    test_rows: set[str] = field(default_factory=set)


def split_samples(samples: ScoredSamples, test_fraction: float = 0.2) -> Split:
    """Weighted samples sorted by (ts, user, video): the first 80% train (its last
    eighth validation), the last 20% test."""
    order = sorted(
        (i for i in range(len(samples.event_ids)) if samples.weights[i] > 0),
        key=lambda i: (
            int(samples.ts_ms[i]), _natural(samples.user_ids[i]), _natural(samples.video_ids[i])
        ),
    )
    ids = [samples.event_ids[i] for i in order]
    head = len(ids) - int(round(len(ids) * test_fraction))
    fit = head - head // 8
    test_start = int(samples.ts_ms[order[head]]) if head < len(order) else 0
    return Split(ids[:fit], ids[fit:head], ids[head:], test_start, set(ids[head:]))
