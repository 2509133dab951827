"""The served log's record as a reader holds it (the wire formats are beside it)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from feature_store.events import EventContext

HARD_MAX_ITEMS = 10_000
"""Items a decoder accepts in one record, whatever ``served_log.max_items`` says."""


class ServedItem(NamedTuple):
    """One served item (a tuple: up to ``max_items`` are built per response)."""

    video_id: str
    position: int
    """Rank in the response, 0 first."""
    score: float
    """The model's score when it was served."""
    source: str
    """The candidate source that proposed it."""


class ServedArm(NamedTuple):
    """The experiment arm that ranked a response."""

    experiment: str
    arm: str


@dataclass(frozen=True)
class ServedRecord:
    """One logged response (see the module docstring)."""

    recommendation_id: str
    user_id: str
    ts_ms: int
    """The moment the features were computed at (the request's clock), ms since epoch."""
    model_version: str | None
    schema_hash: str
    context: EventContext
    items: tuple[ServedItem, ...]
    request_values: npt.NDArray[np.uint64]
    """``(R,)`` the slots every item shares (the layout's ``request_slots``)."""
    item_values: npt.NDArray[np.uint64]
    """``(K, I)`` the other slots, per item in ``items`` order (``item_slots``)."""
    arm: ServedArm | None = None
    """The experiment arm whose model ranked it (None: the active version, no experiment)."""

    def position_of(self, video_id: str) -> int | None:
        """Index in ``items`` of ``video_id``, None if it was not served here."""
        for i, item in enumerate(self.items):
            if item.video_id == video_id:
                return i
        return None
