"""Feature values of the moments a batch needs, and the training rows of its samples.

One catalog read (``get_many``), one history read (``histories``) and one
counters read (``video_stats``) per batch, whatever its size: per-event
round trips would cap throughput at a few thousand events per second against
Redis.

No leakage: :func:`featurise` reads the user's history and the video's
counters as they stood *before the batch* (the batch's own events are
recorded into the activity store only after the model trained on it), for
the moments the joiner asks about: impressions and engagements with no
remembered impression (:mod:`trainer.labels`). Every sample then trains on
the values of the moment its video was shown, however late its label
arrives. Within one batch every moment sees the same pre-batch state, at
most ``max_wait_ms`` (or one batch) stale, never later than the moment.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from feature_store.activity.base import ActivityStore, HistoryEntry
from feature_store.catalog.base import CatalogStore, Video
from feature_store.events import Event
from feature_store.features.columns import FeatureRow
from feature_store.features.extract import FeatureExtractor
from feature_store.features.values import FeatureValues, ValueLayout
from feature_store.heads import HEADS
from trainer.labels import Sample


class Lookup:
    """The batch's catalog records, read once (used by labels and features)."""

    def __init__(self, catalog: CatalogStore, events: Sequence[Event]) -> None:
        ids = list(dict.fromkeys(e.video_id for e in events))
        self.videos: dict[str, Video | None] = dict(zip(ids, catalog.get_many(ids), strict=True))
        self.durations: dict[str, int] = {
            vid: v.duration_ms for vid, v in self.videos.items() if v is not None
        }


def moment_rows(
    events: Sequence[Event],
    lookup: Lookup,
    activity: ActivityStore,
    history_limit: int,
) -> list[FeatureRow]:
    """Feature rows of each event's (user, video) at the event, from the pre-batch state;
    each history cut to its ``history_limit`` most recent entries (the schema's
    ``history_len``: the service cuts its requests' histories the same way)."""
    users = list(dict.fromkeys(e.user_id for e in events))
    videos = list(dict.fromkeys(e.video_id for e in events))
    histories: dict[str, tuple[HistoryEntry, ...]] = {
        u: tuple(h[:history_limit]) for u, h in zip(users, activity.histories(users), strict=True)
    }
    stats = dict(zip(videos, activity.video_stats(videos), strict=True))
    catalog_of = lookup.videos
    return [
        FeatureRow(
            user_id=e.user_id,
            video_id=e.video_id,
            ts_ms=e.ts,
            video=catalog_of.get(e.video_id),
            context=e.context,
            history=histories[e.user_id],
            stats=stats[e.video_id],
        )
        for e in events
    ]


def featurise(
    extractor: FeatureExtractor,
    events: Sequence[Event],
    lookup: Lookup,
    activity: ActivityStore,
) -> npt.NDArray[np.uint64]:
    """``(len(events), W)`` packed feature values of each event's moment (pre-batch state)."""
    if not events:
        return np.zeros((0, extractor.layout.width), dtype=np.uint64)
    rows = moment_rows(events, lookup, activity, extractor.schema.history_len)
    return extractor.values(rows).packed


_NO_OTHERS = (np.nan,) * (len(HEADS) - 1)
"""The labels after the primary head's of a sample that has none of them."""


@dataclass
class LabelledRows:
    """Samples' feature values with their labels and loss weights, aligned."""

    values: FeatureValues
    labels: npt.NDArray[np.float32]
    """The primary (engagement) head's labels (NaN: a sample for the other heads only)."""
    weights: npt.NDArray[np.float32]
    video_ids: list[str]
    shown_scores: npt.NDArray[np.float64]
    """The model's prediction as each sample's video was shown (NaN: not made then)."""
    targets: npt.NDArray[np.float32]
    """``(n, H)`` every head's label (HEADS order), NaN where the sample has none."""


def labelled_rows(samples: Sequence[Sample], layout: ValueLayout) -> LabelledRows:
    """The training rows of ``samples``, each with the values of its shown moment."""
    return LabelledRows(
        values=FeatureValues.stack(layout, [s.values for s in samples]),
        labels=np.fromiter((s.label for s in samples), np.float32, len(samples)),
        weights=np.fromiter((s.weight for s in samples), np.float32, len(samples)),
        video_ids=[s.event.video_id for s in samples],
        shown_scores=np.fromiter((s.score for s in samples), np.float64, len(samples)),
        targets=np.array(
            [(s.label, *(s.others or _NO_OTHERS)) for s in samples], dtype=np.float32
        ).reshape(len(samples), len(HEADS)),
    )
