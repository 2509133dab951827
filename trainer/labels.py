"""The label policy: which video feedback events become training samples.

A sample is one (user, video) moment with a label, 1 (the user valued the
video) or 0 (they did not). The label is read off the event type's *verdict*,
declared in :mod:`feature_store.event_types`, with the configurable
thresholds of :class:`~feature_store.settings.FeatureSettings`:

================  ========================================================
verdict           sample
================  ========================================================
positive          positive (finish, like, share)
negative          negative (skip, dislike)
watch             (play) positive if watch ratio >= ``positive_watch_ratio``
                  (0.5); negative if < ``short_watch_ratio`` (0.1); between
                  the two ambiguous; without a known duration, no sample
none              no sample (click, progress: they only resolve a pending
                  impression)
shown             (impression) joined: waits up to ``join_window_ms`` (event
                  time) for any response that *resolves* it (every type but
                  the impression) of the same (user, video); if none comes it
                  becomes a negative, else it yields no sample of its own
                  (the response carries the label)
================  ========================================================

Each labelled event is one sample, so a play to the end followed by a like
gives two positives: stronger engagement weighs more. ``sample_weights``
maps an event type to a loss weight (default 1 for every type).

**Heads.** The table above is the primary (``engagement``) head's label
(:attr:`Sample.label`). A sample carries one label per ranking head
(:data:`feature_store.heads.HEADS`: each head's ``label`` reads the event
type's verdict and the watch ratio), NaN where its event says nothing about
that head (the head's loss ignores it); with the declared heads:

==============  ============  ======================  ===========
verdict         engagement    watch                   negative
==============  ============  ======================  ===========
positive        1             --                      0
watch (play)    as above;     quantile of its watch   0
                ambiguous:    ratio in its duration
                --            bucket (needs a
                              duration)
negative        0             --                      1
impression      0             --                      0
(timed out)
==============  ============  ======================  ===========

An ambiguous play (between the two ratios) is a sample for the watch head
only; every other sample is what it was before heads. The watch target is
described in :mod:`trainer.watch`; it is computed in log order once the
batch's moments are known, so a retried batch does not count a play twice.

The joiner is an online join keyed by (user, video), bounded to
``joiner_max_entries`` pending impressions. Its clock is event time, per
partition (a user's events are ordered within their partition, and
partitions may be consumed at different paces): an impression expires when
its partition's newest event is ``join_window_ms`` past it. When the bound
is reached, the oldest pending impression resolves early as a negative
(counted in ``evicted``) rather than growing memory. :meth:`Joiner.flush_idle`
expires everything older than the window by wall clock when the stream is
idle, so impressions at the end of a stream are not held forever.

**Point in time.** A sample's features are the state as of the moment the
video was *shown*: its impression, or the engagement itself when no
impression precedes it. The joiner asks its caller for the feature values
of those moments (:meth:`Joiner.observe`'s ``featurise``: the batch's
pre-batch state, or the values the service logged when it served the
video), keeps them with the remembered impression, and every sample the
impression later carries (the engagement's label, or its own timeout
negative) trains on them. So a negative that times out 60 s later is not
featurised from a state that already holds the impression itself and the
user's later watches, which would let a feature like the video's recency or
the user's history length read the label.

Every later event of the same (user, video) inherits the context fields
(position, surface, device...) it lacks from the latest impression, joined or
not, and its feature values, for as long as that impression is remembered
(the ``joiner_max_entries`` most recent impressions, about 0.5 KB each with
the default schema): clients often send the context only with the
impression, and a positive without a position next to a negative with one
would let the model read the label off a missing field. A pending impression
forgotten because newer ones filled the memory resolves early as a negative
(``evicted``).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from feature_store.event_types import MEANINGS, EventType, of_types, valued
from feature_store.events import Event, EventContext
from feature_store.heads import HEAD_NAMES, HEADS, Outcome
from feature_store.settings import FeatureSettings, TrainerSettings
from trainer.watch import WatchQuantiles

_SHOWS = of_types("shows")
"""Impressions: remembered, joined, and timed out into negatives."""
_RESOLVES = of_types("resolves")
"""Responses that answer a pending impression (it then yields no negative of its own)."""


Packed = npt.NDArray[np.uint64]
"""One row of feature values (:class:`~feature_store.features.values.FeatureValues`)."""



class Moments(NamedTuple):
    """What the joiner's caller knows of shown moments, aligned with the positions asked."""

    values: npt.NDArray[np.uint64]
    """``(n, W)`` feature values as of each moment."""
    scores: npt.NDArray[np.float64]
    """``(n,)`` the model's prediction at each moment (the served score when the service
    logged one); NaN where none was made: the training step's forward pass scores it."""


Featurise = Callable[[list[int]], Moments]
"""Given positions in the observed batch, what is known of those moments."""

Key = tuple[str, str]


class Sample(NamedTuple):
    """One labelled (user, video) moment with its point-in-time features.

    A named tuple rather than a dataclass: hundreds are made per batch, and
    a tuple is built several times faster than a frozen dataclass.
    """

    event: Event
    """The event that carries the label (a timed-out impression for its negative)."""
    label: float
    weight: float
    context: EventContext
    """Context of the moment: the event's own, completed by its impression's."""
    values: Packed
    """Feature values as of the moment the video was shown (see the module doc)."""
    score: float
    """The model's prediction when the video was shown, NaN if none was made then.

    The prequential metrics use it rather than the score of the step that
    trains the sample: a negative trains a minute after it was shown, by a
    model that has since learnt from the same session's positives, and
    scoring it then would bias the metric (measured on a feed whose
    engagement is chance: AUC 0.48 instead of 0.50)."""
    others: tuple[float, ...] = ()
    """The labels of the heads after the primary one (``HEADS[1:]``, in order), NaN
    where the event says nothing of a head; empty: none of them."""

    def head(self, name: str) -> float:
        """This sample's label for head ``name`` (NaN: none)."""
        position = HEAD_NAMES.index(name)
        if position == 0:
            return self.label
        return self.others[position - 1] if self.others else _NAN


Labels = tuple[float, ...]
"""Every head's label of one event (:data:`~feature_store.heads.HEADS` order), NaN where it
says nothing of that head."""

_NAN = math.nan
_QUANTILE_HEADS = [i for i, h in enumerate(HEADS) if h.target == "watch_quantile"]
"""Positions of the heads whose label (a watch ratio) trains as its quantile."""
_TIMED_OUT: dict[EventType, Labels] = {
    kind: tuple(head.label(Outcome(meaning, False, None)) for head in HEADS)
    for kind, meaning in MEANINGS.items()
    if meaning.shows
}
"""Every head's label of an impression that timed out: not valued, no watch."""


class Shown(NamedTuple):
    """A remembered impression: when, where, what its features and its score were."""

    impression: Event
    partition: int
    values: Packed
    score: float


class LabelPolicy:
    """Maps one event to a label, or ``None`` for no sample; see the module doc."""

    def __init__(self, settings: TrainerSettings, features: FeatureSettings) -> None:
        self.positive_ratio = features.positive_watch_ratio
        self.short_ratio = features.short_watch_ratio
        self.weights = {EventType(k): float(v) for k, v in settings.sample_weights.items()}
        self.watch = WatchQuantiles(
            settings.watch_duration_buckets_s, settings.watch_quantile_memory
        )
        """The watch head's per-duration-bucket quantile estimate (checkpointed)."""

    def labels(self, event: Event, duration_ms: int | None = None) -> Labels | None:
        """Per-head labels of ``event``, the watch head's as the raw ratio (see
        :meth:`watch_target`); None when no head has one. Read off the event type's
        verdict (:mod:`feature_store.event_types`)."""
        verdict = MEANINGS[event.type].verdict
        if verdict == "none":
            return None
        ratio = event.watch_ratio(duration_ms) if verdict == "watch" else None
        if verdict == "watch" and ratio is None:
            return None
        judged = valued(event.type, ratio, self.positive_ratio, self.short_ratio)
        outcome = Outcome(MEANINGS[event.type], judged, ratio)
        return tuple(head.label(outcome) for head in HEADS)

    def watch_target(self, event: Event, ratio: float, duration_ms: int | None) -> float:
        """The watch head's target of a play of ``ratio``; counts the play (stateful)."""
        duration = event.duration_ms or duration_ms or 0
        return self.watch.target(ratio, duration)

    def label(self, event: Event, duration_ms: int | None = None) -> float | None:
        """The engagement head's label of ``event``: 1, 0, or None for no sample."""
        ratio = event.watch_ratio(duration_ms)
        judged = valued(event.type, ratio, self.positive_ratio, self.short_ratio)
        return None if judged is None else float(judged)

    def weight(self, kind: EventType) -> float:
        return self.weights.get(kind, 1.0)


class Joiner:
    """Remembered impressions keyed by (user, video), bounded, expiring by event time.

    One LRU of shown moments (:class:`Shown`, the newest impression per pair)
    and, per partition, the insertion-ordered keys of those still pending:
    within a partition events arrive in log order, so expiry pops from the
    front and stops at the first live entry (amortised O(expired) per batch).
    """

    def __init__(self, policy: LabelPolicy, window_ms: int, max_entries: int) -> None:
        self.policy = policy
        self.window_ms = window_ms
        self.max_entries = max_entries
        self._shown: OrderedDict[Key, Shown] = OrderedDict()
        self._pending: dict[int, OrderedDict[Key, None]] = {}
        self._size = 0
        """Pending impressions (over every partition)."""
        self._watermark: dict[int, int] = {}
        self.evicted = 0
        """Pending impressions resolved early because newer ones filled the memory."""
        self.expired = 0
        """Impressions that timed out into negatives."""
        self.own_moments = 0
        """Labelled events featurised at their own moment (no remembered impression)."""

    def __len__(self) -> int:
        return self._size

    def observe(
        self,
        events: list[Event],
        partitions: list[int],
        durations: dict[str, int],
        featurise: Featurise,
    ) -> list[Sample]:
        """Samples produced by ``events`` (in log order) and by the impressions they expire.

        ``durations`` gives catalog lengths (ms) for plays without
        ``duration_ms``. ``featurise`` is called once, with the positions of
        the events whose own moment is a shown moment: every impression, and
        every labelled event that no remembered impression precedes.
        """
        labels = [
            None if e.type in _SHOWS else self.policy.labels(e, durations.get(e.video_id))
            for e in events
        ]
        own = self._own_moments(events, labels)
        moments = featurise(own) if own else None
        # Only now (featurise may raise, and the caller retries) does the watch
        # estimate count this batch's plays, in log order.
        for i, labelled in enumerate(labels):
            if labelled is None:
                continue
            for j in _QUANTILE_HEADS:
                if labelled[j] == labelled[j]:
                    event = events[i]
                    target = self.policy.watch_target(
                        event, labelled[j], durations.get(event.video_id)
                    )
                    labelled = labels[i] = (*labelled[:j], target, *labelled[j + 1 :])
        row_of = {position: row for row, position in enumerate(own)}
        samples: list[Sample] = []
        weight_of = self.policy.weight
        watermark = self._watermark
        for i, (event, partition, label) in enumerate(zip(events, partitions, labels, strict=True)):
            key = (event.user_id, event.video_id)
            pending = self._pending.get(partition)
            if pending is None:
                pending = self._pending[partition] = OrderedDict()
            if event.type in _SHOWS:
                assert moments is not None
                row = row_of[i]
                self._remember(
                    key,
                    Shown(event, partition, moments.values[row], float(moments.scores[row])),
                    samples,
                )
            else:
                if key in pending and event.type in _RESOLVES:
                    # answered: the impression carries no label of its own
                    del pending[key]
                    self._size -= 1
                if label is not None:
                    engagement, others = label[0], label[1:]
                    shown = self._shown.get(key)
                    if shown is None:
                        assert moments is not None
                        self.own_moments += 1
                        row = row_of[i]
                        samples.append(Sample(
                            event, engagement, weight_of(event.type), event.context,
                            moments.values[row], float(moments.scores[row]), others,
                        ))
                    else:
                        context = merge_context(event.context, shown.impression.context)
                        samples.append(Sample(
                            event, engagement, weight_of(event.type), context, shown.values,
                            shown.score, others,
                        ))
            if event.ts > watermark.get(partition, 0):
                watermark[partition] = event.ts
        samples += self._expire()
        return samples

    def _own_moments(self, events: list[Event], labels: list[Labels | None]) -> list[int]:
        """Positions of impressions, and of labelled events no remembered impression precedes."""
        shown_here: set[Key] = set()
        out = []
        for i, (event, label) in enumerate(zip(events, labels, strict=True)):
            key = (event.user_id, event.video_id)
            if event.type in _SHOWS:
                shown_here.add(key)
                out.append(i)
            elif label is not None and key not in shown_here and key not in self._shown:
                out.append(i)
        return out

    def _remember(self, key: Key, shown: Shown, samples: list[Sample]) -> None:
        """Remember ``shown`` as the newest impression of ``key``, pending; evict past the bound."""
        old = self._shown.pop(key, None)
        if old is not None and key in self._pending[old.partition]:
            del self._pending[old.partition][key]  # shown again: the newest impression waits
            self._size -= 1
        self._shown[key] = shown
        self._pending[shown.partition][key] = None
        self._size += 1
        while len(self._shown) > self.max_entries:
            old_key, old = self._shown.popitem(last=False)
            if old_key in self._pending[old.partition]:
                del self._pending[old.partition][old_key]
                self._size -= 1
                self.evicted += 1
                samples.append(self._negative(old))

    def _expire(self, now_ms: int = 0) -> list[Sample]:
        out: list[Sample] = []
        for partition, pending in self._pending.items():
            limit = max(self._watermark.get(partition, 0), now_ms) - self.window_ms
            while pending:
                key = next(iter(pending))
                shown = self._shown[key]
                if shown.impression.ts >= limit:
                    break
                del pending[key]
                out.append(self._negative(shown))
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

    def _negative(self, shown: Shown) -> Sample:
        impression = shown.impression
        weight = self.policy.weight(impression.type)
        labels = _TIMED_OUT[impression.type]
        return Sample(
            impression, labels[0], weight, impression.context, shown.values, shown.score,
            labels[1:],
        )

    # --- checkpointing ------------------------------------------------------

    def state(self) -> tuple[dict[str, Any], npt.NDArray[np.uint64]]:
        """JSON-able remembered impressions and watermarks, and their ``(n, W)`` values."""
        entries = list(self._shown.items())
        shown = [
            [s.partition, s.impression.model_dump(mode="json", exclude_none=True),
             None if np.isnan(s.score) else s.score]
            for key, s in entries
        ]
        values = (
            np.stack([s.values for _, s in entries]) if entries else np.zeros((0, 0), np.uint64)
        )
        state = {
            "shown": shown,
            "pending_order": {
                str(p): [list(k) for k in pending] for p, pending in self._pending.items()
            },
            "watermark": {str(k): v for k, v in self._watermark.items()},
            "evicted": self.evicted,
            "expired": self.expired,
            "own_moments": self.own_moments,
        }
        return state, values

    def load_state(self, state: dict[str, Any], values: npt.NDArray[np.uint64]) -> None:
        """Restore what :meth:`state` returned (a checkpoint without values restores nothing
        pending: a trainer before point-in-time features kept no values)."""
        self._shown = OrderedDict()
        self._pending = {}
        self._size = 0
        for row, (partition, data, score) in enumerate(state.get("shown", [])):
            event = Event.model_validate(data)
            key = (event.user_id, event.video_id)
            shown_score = math.nan if score is None else float(score)
            self._shown[key] = Shown(event, int(partition), values[row], shown_score)
        for partition, keys in state.get("pending_order", {}).items():
            pending = self._pending.setdefault(int(partition), OrderedDict())
            for user, video in keys:
                if (user, video) in self._shown:
                    pending[(user, video)] = None
                    self._size += 1
        self._watermark = {int(k): int(v) for k, v in state.get("watermark", {}).items()}
        self.evicted = int(state.get("evicted", 0))
        self.expired = int(state.get("expired", 0))
        self.own_moments = int(state.get("own_moments", 0))


def merge_context(own: EventContext, shown: EventContext | None) -> EventContext:
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
