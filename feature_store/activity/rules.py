"""How events update histories and counters: pure functions shared by every backend.

The backends only store; every decision about what an event means lives
here, so the memory and Redis stores cannot drift apart.

Counters (per video, by event type):

==========  ====================================================
impression  ``impressions`` + 1
click       ``clicks`` + 1
play        ``plays`` + 1, ``watch_ms`` + ``event.watch_ms``
progress    nothing (see below)
finish      ``finishes`` + 1, ``watch_ms`` + ``event.watch_ms``
like        ``likes`` + 1
share       ``shares`` + 1
skip        ``skips`` + 1
dislike     ``dislikes`` + 1
==========  ====================================================

Every event also raises ``last_ts`` to its ``ts`` (never lowers it).

Progress events carry the *total* watched so far, not a delta, and a store
that sees them one batch at a time cannot know how much of that total it has
already counted. So they add nothing to the counters; the play or finish
that closes the session reports the watch time. They still feed the
history, where only the ratio matters and the best one is kept.

History (per user, newest first, at most ``history_length`` entries, each
video once): a video enters when

- a play, progress or finish event reaches ``features.positive_watch_ratio``; the
  ratio is ``watch_ms`` over ``event.duration_ms``, else over the catalog's
  duration passed in ``durations_ms``; a finish counts as 1.0 whatever its
  ``watch_ms``; a play or progress with no known duration is not judged
  and adds nothing;
- or it is liked or shared (ratio 1.0).

An entry that enters again keeps the best ratio seen and takes the later
``ts``; entries are ordered by ``ts`` (newest first), so a fresh re-watch
moves to the front while a late-arriving old event does not jump ahead of
newer watches. Impressions, clicks, skips and dislikes never add and never
remove.

Within one batch events apply in ``ts`` order (stable for equal times), and
an ``event_id`` seen twice in the batch counts once. Duplicates across
batches are the caller's to drop (the event log's consumer commits offsets
only after the batch is recorded).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter

from feature_store.activity.base import HistoryEntry, VideoStats
from feature_store.events import Event, EventType

COUNTER_OF: dict[EventType, str] = {
    EventType.IMPRESSION: "impressions",
    EventType.CLICK: "clicks",
    EventType.PLAY: "plays",
    EventType.FINISH: "finishes",
    EventType.LIKE: "likes",
    EventType.SHARE: "shares",
    EventType.SKIP: "skips",
    EventType.DISLIKE: "dislikes",
}
"""The counter each event type increments; progress increments none."""

ADDS_WATCH_MS = frozenset({EventType.PLAY, EventType.FINISH})
"""Event types whose ``watch_ms`` is added to the video's ``watch_ms``."""

COUNTER_FIELDS: tuple[str, ...] = (*COUNTER_OF.values(), "watch_ms")
"""Every additive field of :class:`VideoStats` (``last_ts`` is a maximum)."""

_WATCH_TYPES = frozenset({EventType.PLAY, EventType.PROGRESS, EventType.FINISH})
_FULL_TYPES = frozenset({EventType.FINISH, EventType.LIKE, EventType.SHARE})


@dataclass
class StatsDelta:
    """What one batch adds to one video's counters."""

    increments: dict[str, int] = field(default_factory=dict)
    """Counter name → amount to add; only non-zero amounts."""
    last_ts: int = 0
    """Latest event time of the batch for this video, ms."""


_BY_TS = attrgetter("ts")


def in_order(events: Iterable[Event]) -> list[Event]:
    """Events by ``ts`` (stable), each ``event_id`` once: the order a batch applies in."""
    seen: set[str] = set()
    unique = []
    for event in events:
        if event.event_id not in seen:
            seen.add(event.event_id)
            unique.append(event)
    unique.sort(key=_BY_TS)
    return unique


def stats_deltas(events: Iterable[Event]) -> dict[str, StatsDelta]:
    """Per video, what ``events`` add to its counters (see the module table)."""
    deltas: dict[str, StatsDelta] = {}
    counter_of = COUNTER_OF
    for event in events:
        delta = deltas.get(event.video_id)
        if delta is None:
            delta = deltas[event.video_id] = StatsDelta()
        if event.ts > delta.last_ts:
            delta.last_ts = event.ts
        increments = delta.increments
        counter = counter_of.get(event.type)
        if counter is not None:
            increments[counter] = increments.get(counter, 0) + 1
        if event.watch_ms and event.type in ADDS_WATCH_MS:
            increments["watch_ms"] = increments.get("watch_ms", 0) + event.watch_ms
    return deltas


def apply_delta(stats: VideoStats, delta: StatsDelta) -> VideoStats:
    """``stats`` with ``delta`` added (for backends that store whole records).

    Builds the record from a copy of the fields rather than ``model_copy``,
    whose generic copy machinery cost more than validating ten ints (it ran
    for every video of every batch).
    """
    values = stats.__dict__.copy()
    for name, amount in delta.increments.items():
        values[name] += amount
    if delta.last_ts > values["last_ts"]:
        values["last_ts"] = delta.last_ts
    return VideoStats(**values)


def history_ratio(event: Event, durations_ms: Mapping[str, int], threshold: float) -> float | None:
    """The ratio with which ``event`` enters its user's history, or None if it does not."""
    if event.type in _FULL_TYPES:
        return 1.0
    if event.type not in _WATCH_TYPES:
        return None
    ratio = event.watch_ratio(durations_ms.get(event.video_id))
    if ratio is None or ratio < threshold:
        return None
    return ratio


def merge_history(
    history: Sequence[HistoryEntry],
    events: Iterable[Event],
    *,
    durations_ms: Mapping[str, int],
    threshold: float,
    length: int,
) -> list[HistoryEntry]:
    """One user's history after ``events`` (theirs, in :func:`in_order` order).

    Linear in ``length`` per qualifying event: histories hold at most a
    thousand entries, so a list beats any cleverer structure.
    """
    qualifying = [
        (event, ratio)
        for event in events
        if (ratio := history_ratio(event, durations_ms, threshold)) is not None
    ]
    if not qualifying:  # most users of a batch: impressions and short plays only
        return list(history[:length])
    entries = list(history)
    ids = [entry.video_id for entry in entries]  # parallel to entries: list.index in C
    for event, ratio in qualifying:
        video_id, ts = event.video_id, event.ts
        if video_id in ids:
            i = ids.index(video_id)
            old = entries[i]
            del entries[i], ids[i]
            ratio = max(ratio, old.watch_ratio)
            ts = max(ts, old.ts)
        if not entries or entries[0].ts <= ts:  # the usual case: the newest entry
            at = 0
        else:
            at = next((i for i, entry in enumerate(entries) if entry.ts <= ts), len(entries))
        entries.insert(at, HistoryEntry(video_id=video_id, watch_ratio=ratio, ts=ts))
        ids.insert(at, video_id)
    del entries[length:]
    return entries


def by_user(events: Iterable[Event]) -> dict[str, list[Event]]:
    """Events grouped per user, keeping their order."""
    groups: dict[str, list[Event]] = {}
    for event in events:
        groups.setdefault(event.user_id, []).append(event)
    return groups
