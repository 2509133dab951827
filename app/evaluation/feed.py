"""Positive-only logs: leave-one-out hold-out and the feed a video site would have logged.

Public interaction logs (MovieLens read as implicit feedback, micro-video
logs) record what users watched, not what they were shown. Two things are
built from such a log here:

**Views.** A view is one user's rows on one video within
``follow_up_ms`` (the trainer's join window) of the view's first row: a
``finish`` followed by a ``like`` is one view. Every view of a positive-only
log is an interaction.

**Leave-one-out** (:func:`hold_out_last`): for every user with at least two
views, the last view is held out (never produced to the event log); at its
moment the service is asked to rank its video among ``candidates`` videos
sampled uniformly from the catalog among those the user never touched (no
row at all, at any time). The protocol of NCF (He et al., 2017) and the
sequential recommenders after it: 1 + 99 candidates, HR@10 and NDCG@10.

**Feed** (:func:`as_feed`, ``--negatives N``): each view is preceded by
its impression :data:`IMPRESSION_LEAD_MS` before its first row, and by ``N``
impressions, at the same moment, of videos sampled uniformly among those
the user never touched; nothing follows those, so the trainer's joiner
times them out into negatives, as a feed's unwatched impressions are. All
impressions of a page share the view's context (a model must not tell the
watched one by a missing field).

Sampling is uniform over the catalog (or, without one, over the videos the
log names), seeded, and never picks a video the user touched anywhere in
the log: an impression the user "did not watch" must not be one they watched
later. Nor is one unwatched video shown twice to the same user.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from feature_store.errors import InvalidInput
from feature_store.event_types import MEANINGS, EventType
from feature_store.events import Event

IMPRESSION_LEAD_MS = 300
"""How long before a view's first row its impression is logged (ms)."""
POSITIVE_TYPES = frozenset(kind for kind, m in MEANINGS.items() if m.verdict == "positive")
"""Row types of a positive-only log: each is a positive under any label policy (its
verdict is ``positive``, :mod:`feature_store.event_types`: a ``play`` would need a watch
ratio, and ``impression``/``skip``/``dislike`` are not interactions)."""


@dataclass(frozen=True)
class HeldOut:
    """One user's held-out last view."""

    user: str
    video: str
    ts: int
    """Moment the service is asked (ms): when the view's impression would be logged."""
    candidates: tuple[str, ...]
    """The held-out video and the sampled ones, in a seeded random order (ties in a
    model's scores then favour no one)."""


def check_positive_only(events: Sequence[Event], what: str) -> None:
    """Refuse a log with rows that are not interactions, naming the first one."""
    for e in events:
        if e.type not in POSITIVE_TYPES:
            raise InvalidInput(
                "type", f"{what} needs a positive-only log (rows of type "
                f"{', '.join(sorted(POSITIVE_TYPES))}); event {e.event_id} is {e.type.value!r}"
            )


def views(events: Sequence[Event], follow_up_ms: int) -> list[list[int]]:
    """Indices of each view's rows, views in the order of their first row."""
    out: list[list[int]] = []
    open_view: dict[tuple[str, str], tuple[int, int]] = {}
    """(user, video) -> (index into ``out``, first row's ts) of the latest view."""
    for i, e in enumerate(events):
        key = (e.user_id, e.video_id)
        last = open_view.get(key)
        if last is not None and e.ts - last[1] <= follow_up_ms:
            out[last[0]].append(i)
        else:
            open_view[key] = (len(out), e.ts)
            out.append([i])
    return out


def touched_by_user(events: Sequence[Event]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for e in events:
        out.setdefault(e.user_id, set()).add(e.video_id)
    return out


class Sampler:
    """Uniform draws from ``pool`` minus a user's touched videos (seeded)."""

    def __init__(self, pool: Sequence[str], seed: int) -> None:
        self.pool = sorted(set(pool))
        self._members = frozenset(self.pool)
        self.rng = np.random.default_rng(seed)

    def untouched(self, touched: set[str], n: int) -> list[str]:
        """``n`` distinct videos not in ``touched`` (fewer if the pool runs out)."""
        free = len(self.pool) - len(touched & self._members)  # iterates the smaller set
        if free <= 4 * n:  # a small remainder: draw from it explicitly
            rest = [v for v in self.pool if v not in touched]
            if len(rest) <= n:
                return [rest[i] for i in self.rng.permutation(len(rest)).tolist()]
            return [rest[i] for i in self.rng.choice(len(rest), size=n, replace=False).tolist()]
        chosen: dict[str, None] = {}
        while len(chosen) < n:
            for i in self.rng.integers(0, len(self.pool), size=2 * n).tolist():
                video = self.pool[i]
                if video not in touched and video not in chosen:
                    chosen[video] = None
                    if len(chosen) == n:
                        break
        return list(chosen)

    def shuffled(self, items: Sequence[str]) -> tuple[str, ...]:
        return tuple(items[i] for i in self.rng.permutation(len(items)).tolist())


def hold_out_last(
    events: Sequence[Event],
    follow_up_ms: int,
    sampler: Sampler,
    candidates: int,
    max_users: int | None = None,
) -> tuple[list[Event], list[HeldOut]]:
    """The log without each held-out last view, and the held-out views (see the module doc).

    ``max_users`` holds out only that many users (sampled); the others' last
    views stay in the log.
    """
    grouped = views(events, follow_up_ms)
    last: dict[str, int] = {}
    count: dict[str, int] = {}
    for n, rows in enumerate(grouped):
        user = events[rows[0]].user_id
        last[user] = n
        count[user] = count.get(user, 0) + 1
    eligible = sorted(u for u, c in count.items() if c >= 2)
    if max_users is not None and len(eligible) > max_users:
        picks = sampler.rng.choice(len(eligible), size=max_users, replace=False)
        eligible = sorted(eligible[i] for i in picks.tolist())
    touched = touched_by_user(events)
    held: list[HeldOut] = []
    dropped: set[int] = set()
    for user in eligible:
        rows = grouped[last[user]]
        first = events[rows[0]]
        others = sampler.untouched(touched[user], candidates)
        held.append(HeldOut(
            user, first.video_id, first.ts - IMPRESSION_LEAD_MS,
            sampler.shuffled([first.video_id, *others]),
        ))
        dropped.update(rows)
    held.sort(key=lambda h: h.ts)
    return [e for i, e in enumerate(events) if i not in dropped], held


def _derived_id(base: str, suffix: str, max_length: int) -> str:
    """``base + suffix``, or a digest of ``base`` plus ``suffix`` when that is too long."""
    if len(base) + len(suffix) <= max_length:
        return base + suffix
    return hashlib.blake2b(base.encode(), digest_size=16).hexdigest() + suffix


def as_feed(
    events: Sequence[Event],
    negatives: int,
    sampler: Sampler,
    touched: dict[str, set[str]],
    follow_up_ms: int,
    max_id_length: int,
) -> list[Event]:
    """``events`` with each view's impression and ``negatives`` unwatched impressions
    before it (see the module doc), in time order.

    A user is never shown the same unwatched video twice (a feed does not re-show what a
    user scrolled past; and a second impression of one (user, video) would replace the
    first in the trainer's joiner): once a user's untouched videos run out, their pages
    get fewer negatives.
    """
    out: list[Event] = list(events)
    excluded = {user: set(videos) for user, videos in touched.items()}
    for rows in views(events, follow_up_ms):
        first = events[rows[0]]
        at = first.ts - IMPRESSION_LEAD_MS
        unwatched = sampler.untouched(excluded[first.user_id], negatives)
        excluded[first.user_id].update(unwatched)
        page = [(first.video_id, ".i")] + [(v, f".n{k}") for k, v in enumerate(unwatched)]
        for j in sampler.rng.permutation(len(page)).tolist():
            video, suffix = page[j]
            out.append(Event(
                event_id=_derived_id(first.event_id, suffix, max_id_length),
                user_id=first.user_id, video_id=video, type=EventType.IMPRESSION, ts=at,
                context=first.context,
            ))
    out.sort(key=lambda e: e.ts)  # stable: a page's impressions keep their shuffled order
    return out
