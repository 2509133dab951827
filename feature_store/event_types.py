"""Event types and what each one means: the one declaration every module reads.

Each type of :class:`EventType` has one :class:`Meaning` in :data:`MEANINGS`,
and nothing else in the code names an event type to decide what it means:

==========  ========  =======  ==========  ========  =======  ========  ====
type        verdict   watch    counter     trending  engaged  resolves  rank
==========  ========  =======  ==========  ========  =======  ========  ====
impression  none      none     impressions 0         no       no        --
click       none      none     clicks      0.5       yes      yes       --
play        watch     session  plays       1         yes      yes       2
progress    none      running  --          0         yes      yes       --
finish      positive  session  finishes    2         yes      yes       3
like        positive  none     likes       3         yes      yes       4
share       positive  none     shares      4         yes      yes       5
skip        negative  none     skips       0         no       yes       1
dislike     negative  none     dislikes    0         no       yes       6
==========  ========  =======  ==========  ========  =======  ========  ====

Who reads what:

- ``verdict`` (:attr:`Meaning.verdict`): whether the event says the user
  valued the video. The ranking heads' labels (``trainer/labels.py``), the
  history's actions (``feature_store/activity/rules.py``), co-visitation and
  the creator feedback (:func:`valued`); *chosen* events (a play or a
  positive act, :attr:`Meaning.chosen`) are the towers' positives
  (``trainer/retrieval.py``) and what cold start counts as a video's engaged
  views (``app/cold_start.py``).
- ``watch``: what its ``watch_ms`` is. ``session``: the watch time of a
  playback, added to the video's ``watch_ms`` counter; ``running``: the total
  so far of a playback still running (a heartbeat: never added, the play or
  finish that closes the session reports it, but its ratio may still enter
  the history); ``none``: no watch time. The experiments tally takes the
  largest ``watch_ms`` of any watch event.
- ``counter``: the :class:`~feature_store.activity.base.VideoStats` field it
  adds one to (checked there at import).
- ``trending``: its weight in trending (``feature_store/signals/base.py``).
- ``engaged``: the user started the video or acted for it. One meaning for
  every reader: it clears a served-without-engagement entry
  (``feature_store/signals/feedback``) and counts as an impression's click in
  the experiments tally (``app/experiments/tally.py``). A skip or a dislike
  is a response, not an engagement.
- ``resolves``: it answers a pending impression of the same (user, video),
  which then yields no timeout negative (``trainer/labels.py``): every
  response, engaged or negative.
- ``shows``: the video was shown (an impression): the moment whose features
  every later sample of the pair trains on.
- ``rank``: the strength of the history action it leaves (a stronger action
  replaces a weaker one of the same video); ``None`` for types that leave no
  action of their own (a play's is ``play``, which a progress beat past the
  positive ratio leaves too).

A new event type is one member of :class:`EventType` and one entry of
:data:`MEANINGS` (a new counter also needs its ``VideoStats`` field).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

Verdict = Literal["positive", "negative", "watch", "none"]
"""``positive``: the user valued the video; ``negative``: they did not; ``watch``: judged
by its watch ratio (valued from ``features.positive_watch_ratio``, not below
``features.short_watch_ratio``, undecided between the two or without a duration);
``none``: says nothing of it."""

Watch = Literal["session", "running", "none"]
"""What ``watch_ms`` is: a playback's watch time, the running total of one, or nothing."""


class EventType(StrEnum):
    IMPRESSION = "impression"
    """The video was shown to the user."""
    CLICK = "click"
    PLAY = "play"
    """Playback ran; ``watch_ms`` says how long."""
    PROGRESS = "progress"
    """Periodic heartbeat during playback; ``watch_ms`` is the total so far."""
    FINISH = "finish"
    LIKE = "like"
    SHARE = "share"
    SKIP = "skip"
    DISLIKE = "dislike"


@dataclass(frozen=True)
class Meaning:
    """What one event type means (see the module docstring)."""

    type: EventType
    verdict: Verdict
    watch: Watch
    counter: str | None
    """The counter it adds one to; None: none."""
    trending: float
    """Weight in trending (dimensionless; 0: not counted)."""
    engaged: bool
    resolves: bool
    shows: bool = False
    rank: int | None = None
    """Strength of the history action named after the type (None: it leaves none)."""

    @property
    def chosen(self) -> bool:
        """The user chose the video: a play, or an act that values it."""
        return self.verdict in ("positive", "watch")

    @property
    def enters_history(self) -> bool:
        """It may leave a history entry (by its verdict, or by a watch ratio)."""
        return self.verdict != "none" or self.watch != "none"


MEANINGS: dict[EventType, Meaning] = {
    m.type: m
    for m in (
        Meaning(EventType.IMPRESSION, "none", "none", "impressions", 0.0, engaged=False,
                resolves=False, shows=True),
        Meaning(EventType.CLICK, "none", "none", "clicks", 0.5, engaged=True, resolves=True),
        Meaning(EventType.PLAY, "watch", "session", "plays", 1.0, engaged=True, resolves=True,
                rank=2),
        Meaning(EventType.PROGRESS, "none", "running", None, 0.0, engaged=True,
                resolves=True),
        Meaning(EventType.FINISH, "positive", "session", "finishes", 2.0, engaged=True,
                resolves=True, rank=3),
        Meaning(EventType.LIKE, "positive", "none", "likes", 3.0, engaged=True, resolves=True,
                rank=4),
        Meaning(EventType.SHARE, "positive", "none", "shares", 4.0, engaged=True,
                resolves=True, rank=5),
        Meaning(EventType.SKIP, "negative", "none", "skips", 0.0, engaged=False, resolves=True,
                rank=1),
        Meaning(EventType.DISLIKE, "negative", "none", "dislikes", 0.0, engaged=False,
                resolves=True, rank=6),
    )
}
"""Every event type's meaning (see the module docstring)."""


def _check() -> None:
    missing = [kind.value for kind in EventType if kind not in MEANINGS]
    if missing:
        raise ValueError(f"event types {missing} have no entry in MEANINGS")
    for m in MEANINGS.values():
        if m.verdict in ("positive", "negative") and m.rank is None:
            raise ValueError(f"event type {m.type.value!r}: a verdict needs a history rank")


_check()


def of_types(test: str) -> frozenset[EventType]:
    """The event types whose :class:`Meaning` attribute ``test`` is true."""
    return frozenset(kind for kind, m in MEANINGS.items() if getattr(m, test))


COUNTERS: tuple[str, ...] = tuple(m.counter for m in MEANINGS.values() if m.counter)
"""Every per-type counter, in declaration order."""

COUNTER_OF: dict[EventType, str] = {
    kind: m.counter for kind, m in MEANINGS.items() if m.counter is not None
}
"""The counter each event type adds one to."""

ADDS_WATCH_MS = frozenset(kind for kind, m in MEANINGS.items() if m.watch == "session")
"""Types whose ``watch_ms`` adds to the video's ``watch_ms`` counter."""

CHOSEN_COUNTERS: tuple[str, ...] = tuple(
    m.counter for m in MEANINGS.values() if m.chosen and m.counter
)
"""The counters of chosen events (``plays``, ``finishes``, ``likes``, ``shares``)."""


def valued(kind: EventType, ratio: float | None, positive_ratio: float,
           short_ratio: float) -> bool | None:
    """Whether an event of ``kind`` with watch ratio ``ratio`` (None: unknown) says the
    user valued the video: True, False, or None when it says nothing (no verdict, an
    unknown ratio, or one between ``short_ratio`` and ``positive_ratio``)."""
    verdict = MEANINGS[kind].verdict
    if verdict == "positive":
        return True
    if verdict == "negative":
        return False
    if verdict == "watch" and ratio is not None:
        if ratio >= positive_ratio:
            return True
        if ratio < short_ratio:
            return False
    return None
