"""Cold start: a calibrated prior for new videos, and Thompson sampling for exploration.

A video's embedding row starts empty (or barely trained), and what the
network scores an empty row is not evidence of anything: three just-uploaded
videos once scored 0.92 for users who never watched their category. Here a
*new* video (exposure below ``rerank.new_video_impressions``) is judged by
its counters instead.

**Exposure and engagement** of a video, from its lifetime counters: ``e`` =
the largest of the counters of chosen events (plays, finishes, likes and
shares: :data:`feature_store.event_types.CHOSEN_COUNTERS`, the events that
can carry the engagement head's positive label; one chosen view often
logs several of them, so their sum would count it several times; the
largest is a lower bound on chosen views), ``n`` = the larger of its
impressions and ``e`` (a client that logs no impressions still shows what
it plays).

**The estimator** (recomputed every ``rerank.prior_refresh_s`` from the
counters this serving thread holds, :mod:`app.scoring.video_table`):

- young videos are those with ``0 < n <= N``; their lifetime counters are
  their counters in their first ``N`` impressions;
- the global new-video rate ``r0 = (sum e + k * r_all) / (sum n + k)`` over
  young videos, shrunk toward the rate of every video held (``r_all``, or
  :data:`DEFAULT_RATE` with no counters at all);
- a category's rate ``r_c = (E_c + k * r0) / (N_c + k)`` over its young
  videos, shrunk toward ``r0`` (``k = rerank.category_shrinkage``
  pseudo-impressions): a category with few young videos gets about ``r0``;
- a video's Beta prior is ``Beta(m * r_c, m * (1 - r_c))`` with
  ``m = rerank.prior_strength``, and its posterior after its own counters
  ``Beta(m * r_c + e, m * (1 - r_c) + n - e)``.

**Outside the exploration budget** a new video scores its posterior mean
moved by **the user's lift**: how much more (or less) the model expects this
user to engage than an anonymous user with no history, in the same context,
as a log-odds difference. What the network scores a row it never trained is
no reason to rank a video above what the user's history supports (three
just-uploaded videos once scored 0.92 for every user: the anonymous user
scored them 0.92 too, so their lift is 0 and they score their prior); but
what the model reads of *this* user against the video's creator, category,
tags and title (their recent actions attended by the candidate, their
crosses) is personal, and a prior must not erase it: a new video of a
category the user loves gets a positive lift, one of a category they skip a
negative one. As the video's exposure ``n`` grows toward ``N`` the score
moves linearly (in log-odds) from that personal prior to the model's own
score, which by then has trained on the video::

    w = n / N
    logit(score) = (1 - w) * (logit(posterior mean) + lift) + w * logit(model)
    lift = logit(model) - logit(model for an anonymous user)

Without the anonymous score (a caller that cannot compute it) the lift is 0.

**Inside the budget** (``rerank.exploration_budget`` of the slots, rounded
at random so the average is exact), new videos uploaded within
``rerank.explore_max_age_s`` compete for the slots by a
draw from their posterior (Thompson sampling): those with little exposure
are uncertain and get tried, those whose early engagement is poor fade as
impressions come in. A winner is placed in the page by its score (as
above), not by its draw, so the top of the page stays what the user's
history supports and exploration takes the slots the budget gives it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.scoring.video_table import VideoTable
from feature_store.event_types import CHOSEN_COUNTERS
from feature_store.features.dense import STAT_FIELDS
from feature_store.features.extract import Indices
from feature_store.settings import RerankSettings

DEFAULT_RATE = 0.1
"""New-video engagement rate assumed before any counters are held."""

_IMPRESSIONS = STAT_FIELDS.index("impressions")
_CHOSEN = [STAT_FIELDS.index(name) for name in CHOSEN_COUNTERS]

Floats = npt.NDArray[np.float64]
Reals = npt.NDArray[np.floating]
"""Scores of any float width (the model's are float32)."""


def logit(p: Reals) -> Floats:
    """Log-odds of probabilities, clipped away from 0 and 1."""
    q = np.clip(np.asarray(p, dtype=np.float64), 1e-6, 1 - 1e-6)
    return np.log(q / (1 - q))


def sigmoid(x: Floats) -> Floats:
    return 1.0 / (1.0 + np.exp(-x))


def exposure(stats: Floats) -> tuple[Floats, Floats]:
    """``(n, e)`` per row of counter rows (``STAT_FIELDS`` columns): see the module doc."""
    chosen = stats[:, _CHOSEN].max(axis=1) if len(stats) else np.zeros(0)
    return np.maximum(stats[:, _IMPRESSIONS], chosen), chosen


@dataclass(frozen=True)
class Rates:
    """New-video engagement rates estimated from one table's counters."""

    overall: float
    """``r0``: every young video's, shrunk toward every video's."""
    by_category: Floats
    """``r_c`` by the table's category code (codes given after the estimate: ``overall``)."""
    young_videos: int
    """Young videos the estimate saw (0: it is only the default)."""


def estimate(table: VideoTable, new_below: int, shrinkage: float) -> Rates:
    """The rates of the module doc from every row of ``table``."""
    rows = len(table.videos)
    n, e = exposure(table.stats[:rows])
    seen = n > 0
    total_n = float(n[seen].sum())
    r_all = float(e[seen].sum()) / total_n if total_n else DEFAULT_RATE
    young = seen & (n <= new_below)
    young_n, young_e = n[young], e[young]
    r0 = (float(young_e.sum()) + shrinkage * r_all) / (float(young_n.sum()) + shrinkage or 1.0)
    codes = table.category[:rows][young]
    size = len(table.category_code)
    n_c = np.bincount(codes, weights=young_n, minlength=size)
    e_c = np.bincount(codes, weights=young_e, minlength=size)
    with np.errstate(invalid="ignore", divide="ignore"):
        r_c = (e_c + shrinkage * r0) / (n_c + shrinkage)
    r_c = np.where(np.isfinite(r_c), r_c, r0)
    return Rates(r0, np.clip(r_c, 1e-6, 1 - 1e-6), int(young.sum()))


@dataclass(frozen=True)
class NewVideos:
    """The new videos among a request's candidates, with their posteriors."""

    positions: Indices
    """Positions (into the candidates) of the new videos."""
    alpha: Floats
    beta: Floats
    chosen: Floats
    """Chosen views of each (``e``); the prior replaces the model's score where it is 0."""
    fresh: npt.NDArray[np.bool_]
    """Uploaded within ``rerank.explore_max_age_s``: may take an exploration slot."""

    exposure: Floats = field(default_factory=lambda: np.zeros(0))
    """Exposure of each (``n``)."""

    @property
    def mean(self) -> Floats:
        return self.alpha / (self.alpha + self.beta)


class ColdStart:
    """Priors and exploration draws for a request's candidates. Thread-safe (the rates
    are per thread, as the video tables are)."""

    def __init__(
        self,
        settings: RerankSettings,
        seed: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``seed``: the exploration draws' (None: fresh each process); ``clock``: seconds
        that time the rates' re-estimation (a replay gives its event time, so that a
        fast machine and a slow one refresh them at the same moments)."""
        self.settings = settings
        self._seed = seed
        self._clock = clock
        self._local = threading.local()

    def rng(self) -> np.random.Generator:
        """This thread's generator (seeded when the settings' owner gave a seed: tests)."""
        rng: np.random.Generator | None = getattr(self._local, "rng", None)
        if rng is None:
            rng = self._local.rng = np.random.default_rng(self._seed)
        return rng

    def rates(self, table: VideoTable) -> Rates:
        """The table's rates, re-estimated every ``prior_refresh_s`` (and when it was emptied)."""
        local = self._local
        now = self._clock()
        cached: Rates | None = getattr(local, "rates", None)
        if (
            cached is None
            or getattr(local, "codes", None) is not table.category_code
            or now >= local.rates_until
        ):
            s = self.settings
            cached = local.rates = estimate(table, s.new_video_impressions, s.category_shrinkage)
            local.codes = table.category_code
            # With no young video seen the rates are only the default: look again soon.
            wait = s.prior_refresh_s if cached.young_videos else min(1.0, s.prior_refresh_s)
            local.rates_until = now + wait
        return cached

    def new_positions(self, table: VideoTable, rows: Indices) -> Indices:
        """Positions (into ``rows``) of the new videos: those :meth:`new_videos` gives,
        known before scoring so that their anonymous scores join the user's run."""
        return self._new(exposure(table.stats[rows])[0])

    def _new(self, exposure_n: Floats) -> Indices:
        return np.flatnonzero(exposure_n < self.settings.new_video_impressions)

    def new_videos(
        self, table: VideoTable, rows: Indices, uploaded_ms: Floats, now_ms: int
    ) -> NewVideos:
        """Which of ``rows`` (table rows of the candidates, uploaded at ``uploaded_ms``) are
        new, with their posteriors."""
        n, e = exposure(table.stats[rows])
        positions = self._new(n)
        if not len(positions):
            empty = np.zeros(0)
            return NewVideos(positions, empty, empty, empty, np.zeros(0, dtype=np.bool_), empty)
        rates = self.rates(table)
        codes = table.category[rows[positions]]
        known = codes < len(rates.by_category)
        r = np.full(len(positions), rates.overall)
        r[known] = rates.by_category[codes[known]]
        m = self.settings.prior_strength
        n, e = n[positions], e[positions]
        fresh = uploaded_ms[positions] >= now_ms - self.settings.explore_max_age_s * 1000
        return NewVideos(positions, m * r + e, m * (1 - r) + (n - e), e, fresh, n)

    def blend(self, new: NewVideos, model: Reals, anonymous: Reals | None) -> Floats:
        """The new videos' scores (see the module docstring): ``model`` and ``anonymous``
        are the model's scores for this user and for an anonymous one, per new video."""
        w = np.minimum(1.0, new.exposure / self.settings.new_video_impressions)
        personal = logit(model)
        lift = personal - logit(anonymous) if anonymous is not None else 0.0
        return sigmoid((1.0 - w) * (logit(new.mean) + lift) + w * personal)

    def slots(self, count: int) -> int:
        """Exploration slots of a ``count``-item response: the budget's share, rounded at
        random so that the average over responses is exactly the budget."""
        share = self.settings.exploration_budget * count
        whole = int(share)
        return whole + int(self.rng().random() < share - whole)

    def draw(self, new: NewVideos) -> Floats:
        """One Thompson draw per new video from its posterior."""
        return self.rng().beta(new.alpha, new.beta)
