"""Public datasets replayed into the event log (``vidrec replay DATASET``).

The dataset path is always an argument: vidrec never ships or copies data.

**MovieLens** (``ml-100k``: ``u.data``, ``u.item``, ``u.user``; or the newer
``ratings.csv`` + ``movies.csv``). Ratings are not views, so each rating
becomes the feedback events a video site would have seen, all at the rating's
time (ms offsets 0, 1, 2, 3 keep them ordered):

=========  ============================================================
rating     events (after an ``impression``)
=========  ============================================================
>= 4.5     ``play`` with watch ratio 1.0, ``finish``, ``like``
>= 4       ``play`` with watch ratio 0.9, ``finish``
>= 2.5     ``play`` with watch ratio 0.3 (ambiguous under the default
           label policy: no sample and no history entry; a negative,
           and a ``short`` history entry, under the evaluation's
           ``rating >= 4`` policy)
>= 1.5     ``play`` with watch ratio 0.05 (a short play: negative)
< 1.5      ``skip``, ``dislike``
=========  ============================================================

A half-star 3.5 (ml-latest) is below 4, so it maps like a 3: "liked" means
``rating >= 4`` exactly, in replays and in ``vidrec eval`` alike.

Every movie is a video of 100 minutes (MovieLens has no lengths); its
category is its first genre, its tags all of its genres, its "creator"
the decade of its release (MovieLens names no studio; the decade is a coarse
stand-in), its title the title without the year, and its upload time its
release date (ml-100k's ``u.item``; January 1st of the title's year for
ml-latest), shifted like the ratings and never later than a day before its
first rating (a movie without a date: a day before the first rating of all).
Event ids are ``ml-<user>-<item>-<k>``, so a replay twice is deduplicated by
the trainer.

Order: event time; ratings are ordered by ``(ts, user, item)`` (ids compared
as numbers) and their events then stably sorted by time, so equal times keep
that order. Time shift:
MovieLens 100k predates 2000, below the events' ``min_ts_ms`` limit, so
every timestamp is shifted by the same amount so that the first rating
lands one day after ``min_ts_ms`` (when it is earlier), and clipped so that
the last one is not in the future; the relative timing is unchanged.

**Files of events** (CSV or Parquet, :mod:`feature_store.event_files`):
replayed sorted by ``ts`` (stable), shifted like MovieLens when older than
the limit; rows that break the contract are skipped and reported.
"""

from __future__ import annotations

import csv
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

from feature_store.catalog.base import MAX_TITLE_CHARS, Video
from feature_store.errors import InvalidInput, NotFound
from feature_store.event_files import file_format, read_events, time_shift
from feature_store.events import Event, EventType

if TYPE_CHECKING:
    from feature_store.runtime.resources import Resources

log = logging.getLogger(__name__)

MOVIE_MS = 100 * 60 * 1000
"""Length given to every movie (ms)."""
_DAY_MS = 86_400_000
_CHUNK = 10_000
_ML100K_GENRES = (
    "unknown", "action", "adventure", "animation", "childrens", "comedy", "crime",
    "documentary", "drama", "fantasy", "film-noir", "horror", "musical", "mystery",
    "romance", "sci-fi", "thriller", "war", "western",
)


@dataclass(frozen=True)
class Rating:
    user: str
    item: str
    rating: float
    ts_ms: int


def _tag(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.:@/+=-]+", "-", text.strip().lower()).strip("-") or "unknown"


def rating_events(r: Rating, shift_ms: int) -> list[Event]:
    """The events standing for one rating (see the module doc's table)."""
    ts = r.ts_ms + shift_ms
    uid, vid = f"ml{r.user}", f"ml{r.item}"
    base = f"ml-{r.user}-{r.item}"

    def ev(k: int, kind: EventType, ratio: float | None = None) -> Event:
        watch = int(ratio * MOVIE_MS) if ratio is not None else 0
        return Event(
            event_id=f"{base}-{k}", user_id=uid, video_id=vid, type=kind, ts=ts + k,
            watch_ms=watch, duration_ms=MOVIE_MS if ratio is not None else None,
        )

    out = [ev(0, EventType.IMPRESSION)]
    if r.rating >= 4.5:
        out += [ev(1, EventType.PLAY, 1.0), ev(2, EventType.FINISH, 1.0), ev(3, EventType.LIKE)]
    elif r.rating >= 4.0:
        out += [ev(1, EventType.PLAY, 0.9), ev(2, EventType.FINISH, 0.9)]
    elif r.rating >= 2.5:
        out.append(ev(1, EventType.PLAY, 0.3))
    elif r.rating >= 1.5:
        out.append(ev(1, EventType.PLAY, 0.05))
    else:
        out += [ev(1, EventType.SKIP), ev(2, EventType.DISLIKE)]
    return out


def _sorted(ratings: Iterable[Rating]) -> list[Rating]:
    def key(r: Rating) -> tuple[int, int | str, int | str]:
        return (r.ts_ms, _num(r.user), _num(r.item))

    return sorted(ratings, key=key)


def _num(value: str) -> int | str:
    return int(value) if value.isdigit() else value


# --- MovieLens readers ----------------------------------------------------


def _decade(year: int | None) -> str:
    return f"decade-{year // 10 * 10}s" if year else "decade-unknown"


def read_ml100k(directory: Path) -> tuple[list[Rating], list[Video], dict[str, int]]:
    """Ratings, movies and their release dates (ms, by video id) of an ml-100k directory."""
    releases: dict[str, int] = {}
    ratings = []
    with open(directory / "u.data", encoding="latin-1") as fh:
        for line in fh:
            parts = line.split()
            if len(parts) >= 4:
                ratings.append(Rating(parts[0], parts[1], float(parts[2]), int(parts[3]) * 1000))
    videos = []
    with open(directory / "u.item", encoding="latin-1") as fh:
        for line in fh:
            parts = line.rstrip("\n").split("|")
            if len(parts) < 5:
                continue
            flags = parts[5:]
            genres = [g for g, f in zip(_ML100K_GENRES, flags, strict=False) if f == "1"] or [
                "unknown"
            ]
            released = _parse_date(parts[2])
            videos.append(_video(parts[0], genres, released, title=parts[1]))
            release = _release_ms(released, None)
            if release is not None:
                releases[videos[-1].video_id] = release
    return ratings, videos, releases



_YEAR = re.compile(r"\s*\(\d{4}\)\s*$")
"""A MovieLens title's trailing year, which ``uploaded_at`` already says."""

def _parse_date(text: str) -> datetime | None:
    try:
        return datetime.strptime(text.strip(), "%d-%b-%Y")
    except ValueError:
        return None


def _video(
    item: str,
    genres: list[str],
    released: datetime | None,
    year: int | None = None,
    title: str = "",
) -> Video:
    """A movie as a catalog record; its title without the trailing ``(year)``."""
    year = released.year if released else year
    return Video(
        title=_YEAR.sub("", title)[:MAX_TITLE_CHARS],
        video_id=f"ml{item}",
        creator_id=_decade(year),
        category=_tag(genres[0])[:64],
        tags=tuple(dict.fromkeys(_tag(g)[:64] for g in genres))[:16],
        duration_ms=MOVIE_MS,
        uploaded_at=0,  # set from the release and the ratings' shift by the caller
    )


def read_ml_latest(directory: Path) -> tuple[list[Rating], list[Video], dict[str, int]]:
    """Ratings, movies and their release years (ms of January 1st, by video id)."""
    releases: dict[str, int] = {}
    ratings = []
    with open(directory / "ratings.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            ratings.append(
                Rating(row["userId"], row["movieId"], float(row["rating"]),
                       int(row["timestamp"]) * 1000)
            )
    videos = []
    with open(directory / "movies.csv", newline="", encoding="utf-8") as fh:
        for row in csv.DictReader(fh):
            match = re.search(r"\((\d{4})\)\s*$", row.get("title", ""))
            listed = row.get("genres", "").split("|")
            genres = [g for g in listed if g and g != "(no genres listed)"]
            year = int(match.group(1)) if match else None
            videos.append(
                _video(row["movieId"], genres or ["unknown"], None, year, row.get("title", ""))
            )
            release = _release_ms(None, year)
            if release is not None:
                releases[videos[-1].video_id] = release
    return ratings, videos, releases


def detect_format(path: Path) -> str:
    """``movielens`` for a MovieLens directory, else the events file's format."""
    if path.is_dir() and ((path / "u.data").is_file() or (path / "ratings.csv").is_file()):
        return "movielens"
    if path.is_file():
        return file_format(path)
    raise InvalidInput("dataset", f"{path}: not a MovieLens directory or a file of events")


@dataclass
class MovieLens:
    """A MovieLens directory as events, with its catalog and the time shift applied."""

    events: list[Event]
    videos: list[Video]
    shift_ms: int
    """Added to every rating's time (see the module doc)."""


def read_movielens(
    directory: Path, min_ts_ms: int, now_ms: int | None = None, implicit: bool = False
) -> MovieLens:
    """All events of a MovieLens directory in replay order, its catalog and the shift.

    ``implicit`` reads it as a positive-only log (:func:`interaction_event`);
    otherwise each rating is mapped per the module doc's table.
    """
    if (directory / "u.data").is_file():
        ratings, videos, releases = read_ml100k(directory)
    else:
        ratings, videos, releases = read_ml_latest(directory)
    ratings = _sorted(ratings)
    if not ratings:
        return MovieLens([], videos, 0)
    shift = time_shift(ratings[0].ts_ms, ratings[-1].ts_ms, min_ts_ms, now_ms)
    videos = _uploaded(videos, releases, ratings, shift)
    to_events = interaction_event if implicit else rating_events
    events = [e for r in ratings for e in to_events(r, shift)]
    events.sort(key=lambda e: e.ts)  # stable: equal times keep (user, item, k) order
    return MovieLens(events, videos, shift)


def _uploaded(
    videos: list[Video], releases: dict[str, int], ratings: list[Rating], shift: int
) -> list[Video]:
    """``videos`` uploaded at their release (``releases``: ms, unshifted) shifted like the
    ratings, at most a day before each one's first rating (see the module doc)."""
    first_rated: dict[str, int] = {}
    for r in ratings:
        first_rated.setdefault(f"ml{r.item}", r.ts_ms)
    fallback = ratings[0].ts_ms + shift - _DAY_MS
    out = []
    for v in videos:
        latest = first_rated.get(v.video_id, ratings[0].ts_ms) + shift - _DAY_MS
        release = releases.get(v.video_id)
        uploaded = fallback if release is None else min(release + shift, latest)
        out.append(v.model_copy(update={"uploaded_at": max(0, uploaded)}))
    return out


def _release_ms(released: datetime | None, year: int | None) -> int | None:
    """A release date (or January 1st of the year) in ms since the epoch, UTC."""
    if released is None and year is not None:
        released = datetime(year, 1, 1)
    return int(released.replace(tzinfo=UTC).timestamp() * 1000) if released else None


def movielens_events(
    directory: Path, min_ts_ms: int, now_ms: int | None = None
) -> tuple[list[Event], list[Video]]:
    """All events of a MovieLens directory in replay order, and its catalog."""
    found = read_movielens(directory, min_ts_ms, now_ms)
    return found.events, found.videos


def interaction_event(r: Rating, shift_ms: int) -> list[Event]:
    """A rating read as implicit feedback: one ``finish``, whatever the stars.

    The reading of the leave-one-out literature (NCF and its successors): a
    rating says the user watched the movie, so every rating is a positive.
    """
    return [Event(
        event_id=f"ml-{r.user}-{r.item}", user_id=f"ml{r.user}", video_id=f"ml{r.item}",
        type=EventType.FINISH, ts=r.ts_ms + shift_ms, watch_ms=MOVIE_MS, duration_ms=MOVIE_MS,
    )]


def replay_dataset(
    path: Path, resources: Resources, fmt: str = "auto", limit: int | None = None
) -> int:
    """Write a dataset's catalog and events (event-time order) to the stores; returns events."""
    path = Path(path)
    if not path.exists():
        raise NotFound(f"dataset {path} does not exist")
    fmt = detect_format(path) if fmt == "auto" else fmt
    limits = resources.settings.limits
    if fmt == "movielens":
        events, videos = movielens_events(path, limits.min_ts_ms)
        resources.catalog.upsert(videos)
    else:
        found = read_events(path, limits, fmt)
        events = found.events
        if found.shift_ms:
            log.warning("%s: every timestamp shifted by %+.1f days (the first was before "
                        "limits.min_ts_ms)", path, found.shift_ms / _DAY_MS)
        if found.rejected.count:
            log.warning("%s: %s", path, found.rejected.describe())
    if limit is not None:
        events = events[:limit]
    for start in range(0, len(events), _CHUNK):
        resources.event_log.produce(events[start : start + _CHUNK])
    log.info("replayed %d events (%s) from %s", len(events), fmt, path)
    return len(events)
