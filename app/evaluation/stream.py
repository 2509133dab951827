"""A dataset as one event stream in event-time order, and the split of its samples.

Formats (the path is always an argument; vidrec never copies data):

- ``movielens``: a directory with ``u.data``/``u.item`` (ml-100k) or
  ``ratings.csv``/``movies.csv`` (newer releases), mapped to events by
  :mod:`app.evaluation.datasets` (genres, release decade); where ``u.user``
  is present, each event's context carries its user's age group, gender and
  occupation (read as features with ``features.user_attributes``). Read as a
  positive-only log (``implicit``), every rating is one ``finish``;
- ``csv`` / ``parquet``: events in vidrec's schema
  (:mod:`feature_store.event_files`; Parquet needs ``pip install -e ".[eval]"``),
  with an optional catalog file (``--catalog``: CSV, JSON lines or Parquet of
  videos). Rows that break the contract are skipped and counted; a file older
  than ``limits.min_ts_ms`` is shifted as a whole, as MovieLens is.

Ratings are labelled ``rating >= 4``: :func:`rating_label_settings` sets the
trainer's label policy so that exactly one event per rating carries a loss
weight, and its label is that (see the function).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from app.evaluation.datasets import Rating, rating_events, read_movielens
from feature_store.catalog.base import Video
from feature_store.errors import InvalidInput, NotFound
from feature_store.event_files import Rejected, read_events, read_videos
from feature_store.events import Event, EventContext
from feature_store.models.scored import ScoredSamples
from feature_store.settings import EventLimits

Format = Literal["auto", "movielens", "csv", "parquet"]
_DAY_MS = 86_400_000
UNKNOWN = "unknown"
"""Creator and category of a video known only by its id (no catalog)."""


@dataclass
class Stream:
    events: list[Event]
    videos: list[Video]
    kind: Literal["movielens", "events"]
    users: dict[str, EventContext] = field(default_factory=dict)
    """Profile context per user id (age group, gender, occupation), where the data has it."""
    name: str = ""
    """What the dataset is called in reports: ``MovieLens 100K``, the directory or file name."""
    catalog: bool = True
    """The dataset came with its videos (MovieLens, or ``--catalog`` given)."""
    shift_ms: int = 0
    """Added to every timestamp (see :func:`feature_store.event_files.time_shift`)."""
    rejected: Rejected = field(default_factory=Rejected)
    """Rows of the events and catalog files skipped as invalid."""


def detect(path: Path) -> str:
    if path.is_dir() and ((path / "u.data").is_file() or (path / "ratings.csv").is_file()):
        return "movielens"
    if path.is_file() and path.suffix in (".csv", ".parquet"):
        return path.suffix[1:]
    raise InvalidInput("dataset", f"{path}: not a MovieLens directory, events CSV or Parquet")


def dataset_name(path: Path, kind: str) -> str:
    """``MovieLens 100K`` for ml-100k, ``MovieLens <dir>`` for other MovieLens
    directories, the file name for a file of events."""
    if kind == "movielens":
        return "MovieLens 100K" if path.name == "ml-100k" else f"MovieLens {path.name}"
    return path.name


def load_stream(
    path: Path,
    fmt: Format,
    limits: EventLimits,
    limit: int | None = None,
    catalog: Path | None = None,
    implicit: bool = False,
) -> Stream:
    """The dataset's events in event-time order (at most ``limit``) and its catalog.

    ``implicit`` reads MovieLens as a positive-only log (every rating one
    ``finish``); files of events are read as they are.
    """
    path = Path(path)
    if not path.exists():
        raise NotFound(f"dataset {path} does not exist")
    kind = detect(path) if fmt == "auto" else fmt
    if kind == "movielens":
        if catalog is not None:
            raise InvalidInput("catalog", "MovieLens brings its own catalog (u.item / movies.csv)")
        found = read_movielens(path, limits.min_ts_ms, implicit=implicit)
        events, videos = found.events, found.videos
        users = read_ml100k_users(path) if (path / "u.user").is_file() else {}
        if users:
            events = [
                e.model_copy(update={"context": users[e.user_id]}) if e.user_id in users else e
                for e in events
            ]
        stream = Stream(events, videos, "movielens", users, dataset_name(path, kind),
                        shift_ms=found.shift_ms)
    elif kind in ("csv", "parquet"):
        stream = _events_file(path, kind, limits, catalog)
    else:
        raise InvalidInput("format", f"unknown dataset format {fmt!r}")
    if limit is not None:
        stream.events = stream.events[:limit]
    return stream


def _events_file(path: Path, kind: str, limits: EventLimits, catalog: Path | None) -> Stream:
    found = read_events(path, limits, kind)
    stream = Stream(found.events, [], "events", name=dataset_name(path, kind),
                    catalog=catalog is not None, shift_ms=found.shift_ms,
                    rejected=found.rejected)
    if catalog is not None:
        videos, rejected = read_videos(catalog, limits, found.events[0].ts, found.shift_ms)
        stream.videos = videos
        stream.rejected.count += rejected.count
        stream.rejected.examples += rejected.examples
    return stream


def id_only_videos(events: list[Event]) -> list[Video]:
    """A record for every video the events name, carrying nothing but its id.

    The service scores only videos in its catalog; without a catalog these
    let it rank given candidates. Every field but the id is the same for all
    videos (creator and category :data:`UNKNOWN`, uploaded a day before the
    first event), so they carry no signal; the length is the largest
    ``duration_ms`` the events give for the video, else a minute (only
    plays without ``duration_ms`` would read it, and positive-only logs have
    none).
    """
    durations: dict[str, int] = {}
    for e in events:
        durations[e.video_id] = max(durations.get(e.video_id, 0), e.duration_ms or 0)
    uploaded = max(0, min(e.ts for e in events) - _DAY_MS) if events else 0
    return [
        Video(video_id=v, creator_id=UNKNOWN, category=UNKNOWN, duration_ms=d or 60_000,
              uploaded_at=uploaded)
        for v, d in durations.items()
    ]


_AGE_GROUPS = ((18, "under-18"), (25, "18-24"), (35, "25-34"), (45, "35-44"), (50, "45-49"),
               (56, "50-55"))
"""MovieLens 1M's age brackets (upper bound exclusive); 56 and over is ``56+``."""


def age_group(age: int) -> str:
    return next((name for bound, name in _AGE_GROUPS if age < bound), "56+")


def read_ml100k_users(directory: Path) -> dict[str, EventContext]:
    """``u.user`` (``id|age|gender|occupation|zip``) as profile context per user id.

    The user ids match :mod:`app.evaluation.datasets` (``ml<id>``). Zip codes
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


def stars_watched(positive_watch_ratio: float) -> float | None:
    """The fewest stars whose mapped play reaches ``positive_watch_ratio`` (from there a
    rating enters the user's watched history); None if none does."""
    for half_stars in range(1, 11):
        stars = half_stars / 2
        ratios = [e.watch_ratio() or 0.0 for e in rating_events(Rating("u", "i", stars, 0), 0)]
        if max(ratios) >= positive_watch_ratio:
            return stars
    return None


def rating_label_settings() -> dict[str, dict[str, Any]]:
    """Settings sections (``trainer``, ``features``) under which each MovieLens rating is
    one sample labelled ``>= 4``.

    :mod:`app.evaluation.datasets` turns a rating into an impression then a
    ``play`` (watch ratio 1.0 / 0.9 / 0.3 / 0.05 for 5 / 4 / 3 / 2 stars) or
    a ``skip`` (1 star), followed by ``finish``/``like``/``dislike``. With
    both watch-ratio thresholds at 0.5 the play (or skip) is labelled exactly
    ``rating >= 4`` (the default policy leaves 3 stars unlabelled); the
    follow-up events get loss weight 0, so each rating weighs once. The
    impression is joined by its play and yields nothing.
    """
    return {  # with features.positive_watch_ratio at its default, 0.5
        "features": {"short_watch_ratio": 0.5},
        "trainer": {
            "sample_weights": {"finish": 0.0, "like": 0.0, "dislike": 0.0, "share": 0.0},
        },
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
