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
moved by two lifts, both log-odds differences that are 0 for a user with no
events, so such a user scores the prior:

- **the model's lift**: how much more (or less) the model expects this user
  to engage than an anonymous user with no history, in the same context.
  What the network scores a row it never trained is no reason to rank a
  video above what the user's history supports (three just-uploaded videos
  once scored 0.92 for every user: the anonymous user scored them 0.92 too,
  so their lift is 0); what it reads of *this* user (their bias, their
  recent actions attended by the candidate, their crosses with its tags and
  title) is personal;
- **the user's own lift**: their own evidence about the video's category and
  creator, the counts behind the ``category_engaged_log``... dense features
  (:meth:`~app.scoring.video_table.VideoTable.affinity`: ``a`` positive and
  ``b`` negative history entries of the category, ``a_k`` and ``b_k`` of the
  creator, ``A`` and ``B`` of the whole history). A hierarchical
  Beta-binomial over the user's *share* of positive entries: overall
  ``u = (A + 1) / (A + B + 2)``; in the category, shrunk toward ``u`` by
  ``s = rerank.own_evidence_strength`` pseudo-entries,
  ``u_c = (s * u + a) / (s + a + b)``; for the creator, shrunk toward
  ``u_c``, ``u_k = (s * u_c + a_k) / (s + a_k + b_k)``; the lift is
  ``logit(u_k) - logit(u)``: how much more the user takes to this category
  and creator than to what they watch in general. A creator's entries count
  at both levels (the category's share includes its creators', as in any
  nested shrinkage), so a liked creator in a liked category lifts most.

Why this form, by measurement (``bench/cold_start_variants.py`` over the
rows of ``bench/bench_personal.py``'s *new videos by taste* probe: one new
video per category scored for the 60 most active demo users, against the
world's true play probabilities, mean 0.21; means of four 5-minute runs on
Kafka + Redis, ``docs/benchmarks.md``, *Personal feeds*). The model's lift
alone put the user's favourite first for 0.84 of them (pairs of categories
ordered right 0.672, cross-entropy 0.479); with the own lift, ``s = 2``:
0.975 (0.726, 0.382).

- *shares, not rates*: the history holds the entries a user acted on (a
  play, a skip), not the impressions they let pass, so ``a / (a + b)`` is
  not an engagement rate; used as one to update the prior moved by the
  model's lift, ``(s * q + a) / (s + a + b)``, it ordered pairs better
  (0.766) but inflated the scores (mean 0.34 against 0.29, cross-entropy
  0.401; on a replay of the demo world, 0.58 where 0.42 played), and new
  videos compete with established ones on score outside the exploration
  budget. The ratio of shares is unit-free; the prior keeps the calibration;
- *both lifts, summed*: the model reads the same counts, so the sum counts
  the category twice where the model learnt it, but the model's lift
  carries what the counts cannot (the user's bias, tags, the sequence):
  without it, or fading it as the counts grow (weight ``s / (s + a + b)``),
  the favourite came first for 0.93 of the users (cross-entropy 0.377 and
  0.382). The own lift holds where the model's is timid: a cat11 lover (six
  liked cat11 videos, three skipped cat10 ones) once scored a new cat11
  video 0.146 and a new cat10 one 0.194 (Kafka + Redis under load);
- ``s = 2``: of 1, 2, 4, 8 and 16, 1 and 2 came within 0.01 of each other
  (4 and up worse) on the probe and on the replay (the counts alone
  predicting the next play); 2 lets one entry move a category less (one
  like alone: own lift 0.56, against 0.92 at 1).

As the video's exposure ``n`` grows toward ``N`` the score moves linearly
(in log-odds) from that personal prior to the model's own score, which by
then has trained on the video::

    w = n / N
    logit(score) = (1 - w) * (logit(posterior mean) + lift + own) + w * logit(model)
    lift = logit(model) - logit(model for an anonymous user)

Without the anonymous score (a caller that cannot compute it) the model's
lift is 0; without a history the own lift is 0.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from app.scoring.video_table import VideoTable
from feature_store.activity.base import HistoryEntry
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


def own_lift(counts: Floats, engaged: float, rejected: float, strength: float) -> Floats:
    """The user's own lift per row of affinity counts (``AFFINITY_FIELDS`` columns), given
    their positive and negative entries overall (module doc)."""
    overall = (engaged + 1.0) / (engaged + rejected + 2.0)
    a, b, a_k, b_k = counts.T
    category = (strength * overall + a) / (strength + a + b)
    creator = (strength * category + a_k) / (strength + a_k + b_k)
    return logit(creator) - logit(np.asarray(overall))


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
    own: Floats = field(default_factory=lambda: np.zeros(0))
    """The user's own lift of each (log-odds; module doc)."""

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
        self,
        table: VideoTable,
        rows: Indices,
        uploaded_ms: Floats,
        now_ms: int,
        history: Sequence[HistoryEntry] = (),
    ) -> NewVideos:
        """Which of ``rows`` (table rows of the candidates, uploaded at ``uploaded_ms``) are
        new, with their posteriors and the own lift of ``history`` (the user's)."""
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
        own = np.zeros(len(positions))
        if history:
            engaged = sum(entry.positive for entry in history)
            own = own_lift(
                table.affinity(history, rows[positions]), engaged, len(history) - engaged,
                self.settings.own_evidence_strength,
            )
        return NewVideos(positions, m * r + e, m * (1 - r) + (n - e), e, fresh, n, own)

    def blend(self, new: NewVideos, model: Reals, anonymous: Reals | None) -> Floats:
        """The new videos' scores (see the module docstring): ``model`` and ``anonymous``
        are the model's scores for this user and for an anonymous one, per new video."""
        w = np.minimum(1.0, new.exposure / self.settings.new_video_impressions)
        personal = logit(model)
        lift = personal - logit(anonymous) if anonymous is not None else 0.0
        return sigmoid((1.0 - w) * (logit(new.mean) + lift + new.own) + w * personal)

    def slots(self, count: int) -> int:
        """Exploration slots of a ``count``-item response: the budget's share, rounded at
        random so that the average over responses is exactly the budget."""
        share = self.settings.exploration_budget * count
        whole = int(share)
        return whole + int(self.rng().random() < share - whole)

    def draw(self, new: NewVideos) -> Floats:
        """One Thompson draw per new video from its posterior."""
        return self.rng().beta(new.alpha, new.beta)
