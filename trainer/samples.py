"""From a batch of events to labelled feature rows, with batched store reads.

One catalog read (``get_many``), one history read (``histories``) and one
counters read (``video_stats``) per batch, whatever its size: per-event
round trips would cap throughput at a few thousand events per second against
Redis.

No leakage: features come from the user's history and the video's counters
as they stood *before the batch* (the batch's own events are recorded into
the activity store only after the model trained on it), so a sample never
sees its own outcome. Within one batch every sample sees the same
pre-batch state, which is at most ``max_wait_ms`` (or one batch) stale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from feature_store.activity.base import ActivityStore, HistoryEntry, VideoStats
from feature_store.catalog.base import CatalogStore, Video
from feature_store.events import Event
from feature_store.features.columns import FeatureRow
from trainer.labels import Sample


@dataclass
class LabelledRows:
    """Feature rows with their labels and loss weights, aligned."""

    rows: list[FeatureRow]
    labels: npt.NDArray[np.float32]
    weights: npt.NDArray[np.float32]
    video_ids: list[str]


class Lookup:
    """The batch's catalog records, read once (used by labels and features)."""

    def __init__(self, catalog: CatalogStore, events: Sequence[Event]) -> None:
        ids = list(dict.fromkeys(e.video_id for e in events))
        self.videos: dict[str, Video | None] = dict(zip(ids, catalog.get_many(ids), strict=True))
        self.durations: dict[str, int] = {
            vid: v.duration_ms for vid, v in self.videos.items() if v is not None
        }


def build_rows(
    samples: Sequence[Sample],
    lookup: Lookup,
    catalog: CatalogStore,
    activity: ActivityStore,
    history_limit: int,
) -> LabelledRows:
    """Feature rows for ``samples`` from the stores' pre-batch state."""
    users = list(dict.fromkeys(s.event.user_id for s in samples))
    videos = list(dict.fromkeys(s.event.video_id for s in samples))
    missing = [v for v in videos if v not in lookup.videos]
    if missing:  # timed-out impressions from earlier batches
        lookup.videos.update(zip(missing, catalog.get_many(missing), strict=True))
    histories: dict[str, tuple[HistoryEntry, ...]] = {
        u: tuple(h[:history_limit]) for u, h in zip(users, activity.histories(users), strict=True)
    }
    stats: dict[str, VideoStats] = dict(zip(videos, activity.video_stats(videos), strict=True))
    catalog_of = lookup.videos
    rows = [
        FeatureRow(
            user_id=s.event.user_id,
            video_id=s.event.video_id,
            ts_ms=s.event.ts,
            video=catalog_of.get(s.event.video_id),
            context=s.context,
            history=histories[s.event.user_id],
            stats=stats[s.event.video_id],
        )
        for s in samples
    ]
    labels = np.fromiter((s.label for s in samples), np.float32, len(samples))
    weights = np.fromiter((s.weight for s in samples), np.float32, len(samples))
    return LabelledRows(rows, labels, weights, [s.event.video_id for s in samples])
