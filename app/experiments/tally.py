"""Per-impression outcomes of one event-log partition, folded into per-arm totals.

An **exposure** is one video of one response: the key ``(recommendation_id,
video_id)``, opened by the first event naming it whose response an
experiment's arm ranked (the served log says which: :mod:`app.experiments.feed`).
It counts once it has an ``impression`` event, so every figure is *per
impression*:

- **clicks**: impressions with an engaged event (``click``, ``play``,
  ``progress``, ``finish``, ``like``, ``share``: the one meaning of *engaged*,
  declared in :mod:`feature_store.event_types`);
- **finishes**: impressions with a ``finish``;
- **watch**: the largest ``watch_ms`` of the impression's events with watch
  time (``play``, ``progress`` and ``finish``; a progress event reports the
  running total, so a sum would count the same seconds again), 0 without any.

Events count while their log time is at most the response's log time plus
``experiments.attribution_window_ms``; later ones are ignored (``late``). An
engagement that comes before its impression (clients batch and reorder) is
held and counts when the impression arrives.

Totals are sufficient statistics, updated by differences as events arrive
(no second pass): impressions, clicks and finishes (counts, for Wilson
intervals), and the sum and the sum of squares of the watch per impression,
in ms and ms² (exact integers, for the mean's normal interval). Each
partition's totals are checkpointed with the offset and log time they
cover; after a restart the feed re-reads one attribution window before the
checkpoint without counting (``live=False``) to rebuild the open exposures,
then counts from the checkpoint's offset: every event counts once, and the
result is what an uninterrupted run computes (unless the open exposures
exceeded their cap: the oldest are closed early, counted in ``evicted``).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from feature_store.event_types import MEANINGS, EventType, of_types
from feature_store.events import Event

ENGAGED = of_types("engaged")
"""What makes an impression's click: an engaged event (:mod:`feature_store.event_types`)."""
WATCHED = frozenset(kind for kind, m in MEANINGS.items() if m.watch != "none")
"""Events whose ``watch_ms`` is a playback's watch time, final or running."""
SHOWN = of_types("shows")


@dataclass(slots=True)
class Totals:
    """One arm's sufficient statistics (see the module docstring)."""

    impressions: int = 0
    clicks: int = 0
    finishes: int = 0
    watch_ms: int = 0
    """Sum over impressions of the watch, ms."""
    watch_sq: int = 0
    """Sum over impressions of the squared watch, ms²."""

    def as_list(self) -> list[int]:
        return [self.impressions, self.clicks, self.finishes, self.watch_ms, self.watch_sq]

    @classmethod
    def from_list(cls, values: list[Any]) -> Totals:
        return cls(*(int(v) for v in values[:5]))

    def add(self, other: Totals) -> None:
        self.impressions += other.impressions
        self.clicks += other.clicks
        self.finishes += other.finishes
        self.watch_ms += other.watch_ms
        self.watch_sq += other.watch_sq


@dataclass(slots=True)
class _Exposure:
    experiment: str
    arm: str
    expires: int
    """Log time (ms) after which its events no longer count."""
    shown: bool = False
    clicked: bool = False
    finished: bool = False
    watch: int = 0


@dataclass(frozen=True, slots=True)
class ArmTag:
    """What the served log says of a response: its arm, when and for whom."""

    experiment: str
    arm: str
    log_ts: int
    user_id: str


@dataclass
class PartitionTally:
    """One partition's open exposures and totals (see the module docstring)."""

    window_ms: int
    max_open: int
    offset: int | None = None
    """Next offset to count: everything before it is in ``totals`` (None: count all)."""
    log_ts: int = 0
    """Log time of the last counted record (the warm-up after a restart starts a window
    before it)."""
    totals: dict[str, dict[str, Totals]] = field(default_factory=dict)
    """experiment -> arm -> totals."""
    open: OrderedDict[tuple[str, str], _Exposure] = field(default_factory=OrderedDict)
    late: int = 0
    evicted: int = 0

    def apply(self, event: Event, log_ts: int, tag: ArmTag, live: bool) -> None:
        """One event of a response ``tag`` names; counts into the totals when ``live``."""
        assert event.recommendation_id is not None
        key = (event.recommendation_id, event.video_id)
        exposure = self.open.get(key)
        if exposure is None:
            exposure = _Exposure(tag.experiment, tag.arm, tag.log_ts + self.window_ms)
            if log_ts > exposure.expires:
                self.late += 1
                return
            self.open[key] = exposure
            if len(self.open) > self.max_open:
                self.open.popitem(last=False)
                self.evicted += 1
        elif log_ts > exposure.expires:
            self.late += 1
            return
        totals = self._totals(exposure) if live else None
        self._update(exposure, event, totals)

    def _totals(self, exposure: _Exposure) -> Totals:
        arms = self.totals.setdefault(exposure.experiment, {})
        found = arms.get(exposure.arm)
        if found is None:
            found = arms[exposure.arm] = Totals()
        return found

    @staticmethod
    def _update(exposure: _Exposure, event: Event, totals: Totals | None) -> None:
        kind = event.type
        counted = totals is not None and exposure.shown
        if kind in SHOWN and not exposure.shown:
            exposure.shown = True
            if totals is not None:  # what came before it counts now
                totals.impressions += 1
                totals.clicks += exposure.clicked
                totals.finishes += exposure.finished
                totals.watch_ms += exposure.watch
                totals.watch_sq += exposure.watch * exposure.watch
            return
        if kind in ENGAGED and not exposure.clicked:
            exposure.clicked = True
            if counted:
                totals.clicks += 1  # type: ignore[union-attr]
        if kind is EventType.FINISH and not exposure.finished:
            exposure.finished = True
            if counted:
                totals.finishes += 1  # type: ignore[union-attr]
        if kind in WATCHED and event.watch_ms > exposure.watch:
            before, exposure.watch = exposure.watch, event.watch_ms
            if counted:
                totals.watch_ms += exposure.watch - before  # type: ignore[union-attr]
                totals.watch_sq += exposure.watch**2 - before**2  # type: ignore[union-attr]

    def expire(self, now_log_ts: int) -> None:
        """Forget exposures whose window closed before ``now_log_ts`` (oldest opened first;
        one still open behind them waits: its events are judged by ``expires`` anyway)."""
        while self.open:
            first = next(iter(self.open.values()))
            if first.expires >= now_log_ts:
                return
            self.open.popitem(last=False)

    # --- checkpoints -------------------------------------------------------------

    def state(self, keep: set[str] | None = None) -> dict[str, Any]:
        """The checkpoint: offset, log time and totals (of the ``keep`` experiments)."""
        return {
            "offset": self.offset,
            "log_ts": self.log_ts,
            "totals": {
                exp: {arm: t.as_list() for arm, t in arms.items()}
                for exp, arms in self.totals.items()
                if keep is None or exp in keep
            },
        }

    def restore(self, state: dict[str, Any]) -> None:
        offset = state.get("offset")
        self.offset = int(offset) if offset is not None else None
        self.log_ts = int(state.get("log_ts") or 0)
        self.totals = {
            str(exp): {str(arm): Totals.from_list(v) for arm, v in arms.items()}
            for exp, arms in (state.get("totals") or {}).items()
        }


def merged(states: list[dict[str, Any]]) -> dict[str, dict[str, Totals]]:
    """The totals of several partitions' checkpoints, added up per experiment and arm."""
    out: dict[str, dict[str, Totals]] = {}
    for state in states:
        for exp, arms in (state.get("totals") or {}).items():
            for arm, values in arms.items():
                out.setdefault(exp, {}).setdefault(arm, Totals()).add(Totals.from_list(values))
    return out
