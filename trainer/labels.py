"""The label policy: which video feedback events become training samples.

A sample is one (user, video) moment with a label, 1 (the user valued the
video) or 0 (they did not). The policy, with its configurable thresholds in
:class:`~feature_store.settings.TrainerSettings`:

==============  ==========================================================
event           sample
==============  ==========================================================
finish          positive
like, share     positive
play            positive if watch ratio >= ``positive_watch_ratio`` (0.5);
                negative if < ``short_play_ratio`` (0.1); between the two,
                or without a known duration, no sample (ambiguous)
skip, dislike   negative
impression      joined: waits up to ``join_window_ms`` (event time) for any
                engagement (click, play, progress, finish, like, share,
                skip, dislike) of the same (user, video); if none comes it
                becomes a negative, else it yields no sample of its own (the
                engagement carries the label)
click, progress no sample (they only resolve a pending impression)
==============  ==========================================================

Each labelled event is one sample, so a play to the end followed by a like
gives two positives: stronger engagement weighs more. ``sample_weights``
maps an event type to a loss weight (default 1 for every type).

The joiner is an online join keyed by (user, video), bounded to
``joiner_max_entries`` pending impressions. Its clock is event time, per
partition (a user's events are ordered within their partition, and
partitions may be consumed at different paces): an impression expires when
its partition's newest event is ``join_window_ms`` past it. When the bound
is reached, the oldest pending impression resolves early as a negative
(counted in ``evicted``) rather than growing memory. :meth:`Joiner.flush_idle`
expires everything older than the window by wall clock when the stream is
idle, so impressions at the end of a stream are not held forever.

Every later event of the same (user, video) inherits the context fields
(position, surface, device...) it lacks from the latest impression, joined or
not, for as long as that impression is remembered (``joiner_max_entries``
most recent): clients often send the context only with the impression, and
a positive without a position next to a negative with one would let the
model read the label off a missing field.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, NamedTuple

from feature_store.events import Event, EventContext, EventType
from feature_store.settings import TrainerSettings

_IMPRESSION = EventType.IMPRESSION
_POSITIVE = frozenset({EventType.FINISH, EventType.LIKE, EventType.SHARE})
_NEGATIVE = frozenset({EventType.SKIP, EventType.DISLIKE})


class Sample(NamedTuple):
    """One labelled (user, video) moment, before feature lookup.

    A named tuple rather than a dataclass: hundreds are made per batch, and
    a tuple is built several times faster than a frozen dataclass.
    """

    event: Event
    """The event that carries the label (a timed-out impression for its negative)."""
    label: float
    weight: float
    context: EventContext
    """Context to featurise: the event's own, or its impression's if it had none."""


class LabelPolicy:
    """Maps one event to a label, or ``None`` for no sample; see the module doc."""

    def __init__(self, settings: TrainerSettings) -> None:
        self.positive_ratio = settings.positive_watch_ratio
        self.short_ratio = settings.short_play_ratio
        self.weights = {EventType(k): float(v) for k, v in settings.sample_weights.items()}

    def label(self, event: Event, duration_ms: int | None = None) -> float | None:
        kind = event.type
        if kind in _POSITIVE:
            return 1.0
        if kind in _NEGATIVE:
            return 0.0
        if kind == EventType.PLAY:
            ratio = event.watch_ratio(duration_ms)
            if ratio is None:
                return None
            if ratio >= self.positive_ratio:
                return 1.0
            if ratio < self.short_ratio:
                return 0.0
        return None

    def weight(self, kind: EventType) -> float:
        return self.weights.get(kind, 1.0)


class Joiner:
    """Pending impressions keyed by (user, video), bounded, expiring by event time.

    One insertion-ordered dict per partition: within a partition events
    arrive in log order, so expiry pops from the front and stops at the first
    live entry (amortised O(expired), not O(pending), per batch).
    """

    def __init__(self, policy: LabelPolicy, window_ms: int, max_entries: int) -> None:
        self.policy = policy
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._pending: dict[int, OrderedDict[tuple[str, str], Event]] = {}
        self._size = 0
        self._watermark: dict[int, int] = {}
        self._contexts: OrderedDict[tuple[str, str], EventContext] = OrderedDict()
        """Context of the latest impression per pair (LRU, ``max_entries``)."""
        self.evicted = 0
        """Impressions resolved early because the joiner was full."""
        self.expired = 0
        """Impressions that timed out into negatives."""

    def __len__(self) -> int:
        return self._size

    def observe(
        self,
        events: list[Event],
        partitions: list[int],
        durations: dict[str, int],
    ) -> list[Sample]:
        """Samples produced by ``events`` (in log order) and by the impressions they expire.

        ``durations`` gives catalog lengths (ms) for plays without ``duration_ms``.
        """
        samples: list[Sample] = []
        label_of = self.policy.label
        weight_of = self.policy.weight
        watermark = self._watermark
        for event, partition in zip(events, partitions, strict=True):
            pending = self._pending.get(partition)
            if pending is None:
                pending = self._pending[partition] = OrderedDict()
            key = (event.user_id, event.video_id)
            if event.type is _IMPRESSION:
                contexts = self._contexts
                contexts.pop(key, None)
                contexts[key] = event.context
                if len(contexts) > self.max_entries:
                    contexts.popitem(last=False)
                if pending.pop(key, None) is None:
                    self._size += 1
                pending[key] = event  # shown again: the newest impression waits
                if self._size > self.max_entries:
                    samples.append(self._negative(self._pop_oldest()))
                    self.evicted += 1
            else:
                if pending.pop(key, None) is not None:
                    self._size -= 1
                label = label_of(event, durations.get(event.video_id))
                if label is not None:
                    context = _merge(event.context, self._contexts.get(key))
                    samples.append(Sample(event, label, weight_of(event.type), context))
            if event.ts > watermark.get(partition, 0):
                watermark[partition] = event.ts
        samples += self._expire()
        return samples

    def _pop_oldest(self) -> Event:
        fronts = [(next(iter(d.values())).ts, p) for p, d in self._pending.items() if d]
        _, partition = min(fronts)
        self._size -= 1
        return self._pending[partition].popitem(last=False)[1]

    def _expire(self, now_ms: int = 0) -> list[Sample]:
        out: list[Sample] = []
        for partition, pending in self._pending.items():
            limit = max(self._watermark.get(partition, 0), now_ms) - self.window_ms
            while pending:
                key, event = next(iter(pending.items()))
                if event.ts >= limit:
                    break
                del pending[key]
                out.append(self._negative(event))
        self._size -= len(out)
        self.expired += len(out)
        return out

    def flush_idle(self, now_ms: int) -> list[Sample]:
        """Expire impressions older than the window by wall clock (stream idle).

        The wall clock is used for this sweep only and does not move the
        event-time watermarks: a replay of old events after an idle spell
        must still join its impressions by their own times.
        """
        return self._expire(now_ms)

    def _negative(self, impression: Event) -> Sample:
        return Sample(impression, 0.0, self.policy.weight(EventType.IMPRESSION), impression.context)

    # --- checkpointing ------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """JSON-able pending impressions and watermarks, for the checkpoint."""
        return {
            "pending": [
                [partition, event.model_dump(mode="json", exclude_none=True)]
                for partition, pending in self._pending.items()
                for event in pending.values()
            ],
            "watermark": {str(k): v for k, v in self._watermark.items()},
            "contexts": [
                [user, video, ctx.model_dump(exclude_none=True)]
                for (user, video), ctx in self._contexts.items()
            ],
            "evicted": self.evicted,
            "expired": self.expired,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        self._pending = {}
        self._size = 0
        for partition, data in state.get("pending", []):
            event = Event.model_validate(data)
            pending = self._pending.setdefault(int(partition), OrderedDict())
            pending[(event.user_id, event.video_id)] = event
            self._size += 1
        self._watermark = {int(k): int(v) for k, v in state.get("watermark", {}).items()}
        self._contexts = OrderedDict(
            ((user, video), EventContext(**ctx)) for user, video, ctx in state.get("contexts", [])
        )
        self.evicted = int(state.get("evicted", 0))
        self.expired = int(state.get("expired", 0))


def _merge(own: EventContext, shown: EventContext | None) -> EventContext:
    """``own`` with its missing fields taken from the impression's context.

    Decided on the set fields, not with ``==``: pydantic's equality costs
    microseconds, and this runs for every labelled event.
    """
    if shown is None or own is shown:
        return own
    given = own.model_fields_set
    if not given:
        return shown
    if given >= _ALL_CONTEXT_FIELDS:
        return own
    return EventContext(**{**shown.model_dump(exclude_none=True),
                           **own.model_dump(exclude_none=True)})


_ALL_CONTEXT_FIELDS = frozenset(EventContext.model_fields)
