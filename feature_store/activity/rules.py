"""How events update histories and counters: pure functions shared by every backend.

The backends only store; every decision about how an event updates them
lives here, so the memory and Redis stores cannot drift apart. What each
event type means (its counter, its verdict, its kind of watch time, the
strength of its action) is declared once, in :mod:`feature_store.event_types`;
this module applies those declarations.

Counters (per video): an event adds one to its type's ``counter`` (progress
has none), and its ``watch_ms`` to the video's ``watch_ms`` when its watch
time is a playback's (``watch == "session"``: play, finish). Every event also
raises ``last_ts`` to its ``ts`` (never lowers it).

Progress events carry the *total* watched so far (``watch == "running"``),
not a delta, and a store that sees them one batch at a time cannot know how
much of that total it has already counted. So they add nothing to the
counters; the play or finish that closes the session reports the watch
time. They still feed the history, where only the ratio matters and the
best one is kept.

History (per user, newest first, at most ``history_length`` entries, each
video once): what the user did with a video, positive or negative, with the
video's creator and category as the catalog had them (so a sequence model
reads the user's recent actions in one read, without a catalog lookup per
entry). A video enters when

- an event of a ``positive`` verdict happens (finish, like, share: action
  named after the type, ratio 1.0 whatever its ``watch_ms``), or one of a
  ``negative`` verdict (skip, dislike: ratio 0.0);
- any other event with watch time (play, progress) reaches
  ``features.positive_watch_ratio`` (action ``play``); the ratio is
  ``watch_ms`` over ``event.duration_ms``, else over the catalog's duration;
  one with no known duration is not judged and adds nothing;
- an event judged by its watch (a play; not a progress beat: its total is
  still growing) ends below ``features.short_watch_ratio`` (``short``).

Positive actions (:data:`POSITIVE_ACTIONS`) are what "watched" means to the
co-visitation and creator sources, the pooled history and the towers;
negatives are read by the sequence model, and every entry counts as seen.

An entry that enters again keeps the best ratio seen, takes the later ``ts``
and the stronger action (:data:`ACTION_RANK`: a dislike overrides
everything, a positive overrides a skip or a short play, never the
reverse); entries are ordered by ``ts`` (newest first), so a fresh re-watch
moves to the front while a late-arriving old event does not jump ahead of
newer watches. Impressions, clicks and ambiguous plays (between the two
ratios) never add and never remove.

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
from feature_store.catalog.base import Video
from feature_store.event_types import ADDS_WATCH_MS, COUNTER_OF, COUNTERS, MEANINGS, EventType
from feature_store.events import Event
from feature_store.settings import FeatureSettings

COUNTER_FIELDS: tuple[str, ...] = (*COUNTERS, "watch_ms")
"""Every additive field of :class:`VideoStats` (``last_ts`` is a maximum)."""


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
    counter_of, adds_watch_ms = COUNTER_OF, ADDS_WATCH_MS
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
        if event.watch_ms and event.type in adds_watch_ms:
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


SHORT = "short"
"""The action of a play that ended below ``features.short_watch_ratio``."""
WATCHED = EventType.PLAY.value
"""The action of a watch (play or progress) past ``features.positive_watch_ratio``."""

ACTION_RANK: dict[str, int] = {
    SHORT: 0,
    **{kind.value: m.rank for kind, m in MEANINGS.items() if m.rank is not None},
}
"""Which action an entry keeps when a video is acted on again: the higher one
(:attr:`~feature_store.event_types.Meaning.rank`; a short play is the weakest)."""


@dataclass(frozen=True)
class HistoryRules:
    """The thresholds that decide what enters a history (``features`` settings)."""

    positive_ratio: float = 0.5
    """``features.positive_watch_ratio``: a watch from this ratio is a positive ``play``."""
    short_ratio: float = 0.1
    """``features.short_watch_ratio``: a play that ends below this is a ``short`` negative."""
    length: int = 50
    """``features.history_length``: entries kept per user."""


def history_rules(features: FeatureSettings) -> HistoryRules:
    """The history thresholds of ``features``."""
    return HistoryRules(
        features.positive_watch_ratio, features.short_watch_ratio, features.history_length
    )


def history_action(
    event: Event, durations_ms: Mapping[str, int], rules: HistoryRules
) -> tuple[str, float] | None:
    """The action and ratio with which ``event`` enters its user's history, or None."""
    meaning = MEANINGS[event.type]
    if meaning.verdict == "positive":
        return event.type.value, 1.0
    if meaning.verdict == "negative":
        return event.type.value, 0.0
    if meaning.watch == "none":
        return None
    ratio = event.watch_ratio(durations_ms.get(event.video_id))
    if ratio is None:
        return None
    if ratio >= rules.positive_ratio:
        return WATCHED, ratio
    if meaning.verdict == "watch" and ratio < rules.short_ratio:
        return SHORT, ratio
    return None


def durations_of(videos: Mapping[str, Video | None] | None) -> dict[str, int]:
    """Video lengths in ms of the known ``videos`` (what fills in an event's duration)."""
    return {vid: v.duration_ms for vid, v in (videos or {}).items() if v is not None}


def merge_history(
    history: Sequence[HistoryEntry],
    events: Iterable[Event],
    *,
    videos: Mapping[str, Video | None],
    rules: HistoryRules,
    durations_ms: Mapping[str, int] | None = None,
) -> list[HistoryEntry]:
    """One user's history after ``events`` (theirs, in :func:`in_order` order).

    ``videos``: catalog records of the events' videos (creator, category and,
    unless ``durations_ms`` is given, lengths). Linear in ``length`` per
    qualifying event: histories hold at most a thousand entries, so a list
    beats any cleverer structure.
    """
    durations = durations_of(videos) if durations_ms is None else durations_ms
    qualifying = [
        (event, found)
        for event in events
        if (found := history_action(event, durations, rules)) is not None
    ]
    if not qualifying:  # most users of a batch: impressions and ambiguous plays only
        return list(history[: rules.length])
    entries = list(history)
    ids = [entry.video_id for entry in entries]  # parallel to entries: list.index in C
    for event, (action, ratio) in qualifying:
        video_id, ts = event.video_id, event.ts
        video = videos.get(video_id)
        creator, category = (video.creator_id, video.category) if video else ("", "")
        if video_id in ids:
            i = ids.index(video_id)
            old = entries[i]
            del entries[i], ids[i]
            ratio = max(ratio, old.watch_ratio)
            ts = max(ts, old.ts)
            if ACTION_RANK[old.action] > ACTION_RANK[action]:
                action = old.action
            if not video:
                creator, category = old.creator_id, old.category
        if not entries or entries[0].ts <= ts:  # the usual case: the newest entry
            at = 0
        else:
            at = next((i for i, entry in enumerate(entries) if entry.ts <= ts), len(entries))
        entries.insert(at, HistoryEntry(
            video_id=video_id, watch_ratio=ratio, ts=ts, action=action,
            creator_id=creator, category=category,
        ))
        ids.insert(at, video_id)
    del entries[rules.length :]
    return entries


def by_user(events: Iterable[Event]) -> dict[str, list[Event]]:
    """Events grouped per user, keeping their order."""
    groups: dict[str, list[Event]] = {}
    for event in events:
        groups.setdefault(event.user_id, []).append(event)
    return groups
