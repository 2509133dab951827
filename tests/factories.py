"""Test data with sensible valid defaults: override only what a test is about.

Every call gets a fresh ``event_id`` / ``video_id`` and a later ``ts`` /
``uploaded_at`` than the call before, so unrelated records never collide and
records made in order are also ordered in time. Values go through the
pydantic models, so an override that breaks the contract fails here loudly.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from feature_store.catalog.base import Video
from feature_store.events import Event

BASE_TS = 1_700_000_000_000
"""2023-11-14, ms since epoch: recent enough for every limit, fixed for repeatability."""

_sequence = itertools.count(1)


def make_event(**overrides: Any) -> Event:
    """A valid event: user ``u1`` played 30 s of the 60 s video ``v1``."""
    n = next(_sequence)
    fields: dict[str, Any] = {
        "event_id": f"e{n}",
        "user_id": "u1",
        "video_id": "v1",
        "type": "play",
        "ts": BASE_TS + n * 1000,
        "watch_ms": 30_000,
        "duration_ms": 60_000,
    }
    fields.update(overrides)
    return Event.model_validate(fields)


def make_video(**overrides: Any) -> Video:
    """A valid visible 60 s video with a fresh id, uploaded after the previous one."""
    n = next(_sequence)
    fields: dict[str, Any] = {
        "video_id": f"v{n}",
        "creator_id": "c1",
        "category": "music",
        "tags": ("live",),
        "duration_ms": 60_000,
        "uploaded_at": BASE_TS + n * 1000,
    }
    fields.update(overrides)
    return Video.model_validate(fields)


def write_movielens(
    directory: Any, users: int = 60, items: int = 60, per_user: int = 30, seed: int = 0
) -> int:
    """A small ml-100k-format directory (``u.data``, ``u.item``, ``u.user``) with structure.

    Each movie has one of four genres and a quality; each user likes two of
    the genres. A user rates ``per_user`` movies, one every 8 hours, users
    arriving 6 hours apart (so their ratings interleave); ratings >= 4 mostly
    go to the liked genres and to good movies, so a model that learns each
    user's genres beats popularity (every genre is liked by half the users).
    Returns the number of ratings written.
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    genre = rng.integers(0, 4, size=items)
    quality = rng.normal(0, 1, size=items)
    lines = []
    for u in range(1, users + 1):
        liked = rng.choice(4, size=2, replace=False)
        start = 880_000_000 + u * 3600 * 6
        for k, i in enumerate(rng.choice(items, size=per_user, replace=False)):
            taste = 3.0 * (genre[i] in liked) - 1.5 + 0.5 * quality[i] + rng.normal(0, 0.5)
            rating = int(np.clip(np.round(3 + 1.3 * taste), 1, 5))
            ts = start + k * 3600 * 8 + int(rng.integers(0, 3600))
            lines.append(f"{u}\t{i + 1}\t{rating}\t{ts}\n")
    (directory / "u.data").write_text("".join(lines))
    genre_cols = (1, 5, 8, 15)  # action, comedy, drama, sci-fi in ml-100k's flag order
    items_text = []
    for i in range(items):
        flags = ["0"] * 19
        flags[genre_cols[genre[i]]] = "1"
        year = 1950 + int(rng.integers(0, 48))
        items_text.append(f"{i + 1}|Movie {i + 1} ({year})|01-Jan-{year}||http://x|"
                          + "|".join(flags) + "\n")
    (directory / "u.item").write_text("".join(items_text))
    (directory / "u.user").write_text("".join(
        f"{u}|{20 + u % 40}|{'MF'[u % 2]}|student|{10000 + u}\n" for u in range(1, users + 1)
    ))
    return len(lines)


def clustered_vectors(n: int, dim: int = 32, seed: int = 0) -> tuple[list[str], np.ndarray]:
    """``n`` video ids and L2-normalised float32 vectors around ``sqrt(n)`` centres of
    uneven sizes: real embeddings cluster, and uniform noise flatters no index."""
    rng = np.random.default_rng(seed)
    clusters = max(4, int(n**0.5))
    centres = rng.standard_normal((clusters, dim))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)
    weights = rng.lognormal(0.0, 1.0, clusters)
    which = rng.choice(clusters, size=n, p=weights / weights.sum())
    vectors = centres[which] + rng.standard_normal((n, dim)) * (0.6 / dim**0.5)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    return [f"v{i:07d}" for i in range(n)], vectors.astype(np.float32)


class ManualClock:
    """A clock that moves only when a test says so (seconds; pass it as ``clock=``)."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
