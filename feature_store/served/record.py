"""The served log's record as a reader holds it (the wire formats are beside it)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple, overload

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


class ServedItems(Sequence[ServedItem]):
    """A response's served items, held column by column; reads as a sequence of
    :class:`ServedItem`.

    Why columns: the in-process log keeps the newest records as objects, and 20
    item tuples per response were 20 objects the garbage collector walked at every
    full collection (a served log of 6,000 responses made the serving process's
    full collections 100 ms and more, stalling every request in flight). Tuples of
    strings and numpy arrays are not walked."""

    __slots__ = ("video_ids", "positions", "scores", "sources")

    def __init__(
        self,
        video_ids: Iterable[str],
        positions: Iterable[int] | npt.NDArray[np.int64],
        scores: Iterable[float] | npt.NDArray[np.float64],
        sources: Iterable[str],
    ) -> None:
        self.video_ids: tuple[str, ...] = tuple(video_ids)
        self.positions: npt.NDArray[np.int64] = np.asarray(positions, dtype=np.int64)
        """Rank of each item in the response, 0 first."""
        self.scores: npt.NDArray[np.float64] = np.asarray(scores, dtype=np.float64)
        self.sources: tuple[str, ...] = tuple(sources)
        k = len(self.video_ids)
        if not len(self.positions) == len(self.scores) == len(self.sources) == k:
            raise ValueError("served items: as many positions, scores and sources as videos")

    @classmethod
    def of(cls, items: Iterable[ServedItem]) -> ServedItems:
        """The columns of ``items`` (a ``ServedItems`` is returned as it is)."""
        if isinstance(items, ServedItems):
            return items
        rows = list(items)
        return cls([i.video_id for i in rows], [i.position for i in rows],
                   [i.score for i in rows], [i.source for i in rows])

    def __len__(self) -> int:
        return len(self.video_ids)

    @overload
    def __getitem__(self, index: int) -> ServedItem: ...

    @overload
    def __getitem__(self, index: slice) -> ServedItems: ...

    def __getitem__(self, index: int | slice) -> ServedItem | ServedItems:
        if isinstance(index, slice):
            return ServedItems(self.video_ids[index], self.positions[index],
                               self.scores[index], self.sources[index])
        return ServedItem(self.video_ids[index], int(self.positions[index]),
                          float(self.scores[index]), self.sources[index])

    def __iter__(self) -> Iterator[ServedItem]:
        return map(ServedItem, self.video_ids, self.positions.tolist(), self.scores.tolist(),
                   self.sources)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence):
            return NotImplemented
        return tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"ServedItems({list(self)!r})"


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
    items: ServedItems
    """The served items in response order (a sequence of :class:`ServedItem` given here
    is kept as columns)."""
    request_values: npt.NDArray[np.uint64]
    """``(R,)`` the slots every item shares (the layout's ``request_slots``)."""
    item_values: npt.NDArray[np.uint64]
    """``(K, I)`` the other slots, per item in ``items`` order (``item_slots``)."""
    arm: ServedArm | None = None
    """The experiment arm whose model ranked it (None: the active version, no experiment)."""

    def __post_init__(self) -> None:
        if not isinstance(self.items, ServedItems):
            object.__setattr__(self, "items", ServedItems.of(self.items))

    def position_of(self, video_id: str) -> int | None:
        """Index in ``items`` of ``video_id``, None if it was not served here."""
        try:
            return self.items.video_ids.index(video_id)
        except ValueError:
            return None
