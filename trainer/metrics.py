"""Prequential (test-then-train) metrics of the online trainer.

Every batch is scored by the current model *before* it trains on it; those
scores are an honest out-of-sample estimate, like a held-out set that moves
with the stream. The trainer's own training forward pass provides them (the
parameters have not moved yet), so evaluation costs no extra pass.

Kept over a sliding window of the last ``metrics_window`` samples:

- ``auc``: ROC AUC of the model's scores (ties count half);
- ``logloss``: mean binary cross-entropy (weighted);
- ``baseline_auc`` / ``baseline_logloss``: a popularity baseline scored the
  same way on the same samples: each video's Beta(1, 1)-smoothed positive
  rate from the samples *before* this batch (what "recommend what people
  liked" would predict). The model earns its keep by beating it;
- ``positive_rate`` of the window.

Those are the primary (engagement) head's (samples with its label). Each
other head (:data:`feature_store.heads.HEADS`) has its own window of the
samples labelled for it, with the same kind of popularity baseline (each
video's smoothed mean label before the batch), and the figures of its
declared ``metric`` (:data:`feature_store.heads.METRIC_FIGURES`), keyed
``{head}_{figure}``:

- ``auc``: ``_auc`` / ``_baseline_auc``, ``_rate``, ``_samples`` (the
  explicit-negative head: ``negative_auc``...);
- ``rank``: ``_spearman`` / ``_baseline_spearman`` (rank correlation of the
  prediction and the target) and ``_mae`` / ``_baseline_mae``, ``_samples``
  (the watch head: ``watch_spearman``...).

The heads' scores are the training step's pre-update forward pass; the
engagement head's are the score as shown where one was made (see
:attr:`trainer.labels.Sample.score`).

And from the loop: events/s (consumed, over the last ``rate_window_s``),
samples/s, batch latency (ms), unique keys per batch, consumer lag; and the
served-log join's outcomes (``vidrec_trainer_served_join_total{outcome}``,
counted by :mod:`trainer.served`).

:class:`TrainerMetrics` exposes all of it as Prometheus metrics in a
registry the caller chooses (the service passes its own; default: a private
one) and as a dict, the point appended to the metrics time series.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from feature_store.heads import HEAD_NAMES, HEADS, PRIMARY
from feature_store.models.quality import log_loss, mean_abs_error, roc_auc, spearman

Floats = npt.NDArray[np.float64]


class _Ring:
    """Fixed-capacity float ring buffer (numpy), oldest overwritten first."""

    def __init__(self, capacity: int) -> None:
        self.data = np.zeros(capacity, dtype=np.float64)
        self.capacity = capacity
        self.size = 0
        self.head = 0

    def extend(self, values: Floats) -> None:
        values = values[-self.capacity :]
        n = len(values)
        first = min(n, self.capacity - self.head)
        self.data[self.head : self.head + first] = values[:first]
        self.data[: n - first] = values[first:]
        self.head = (self.head + n) % self.capacity
        self.size = min(self.capacity, self.size + n)

    def values(self) -> Floats:
        if self.size < self.capacity:
            return self.data[: self.size]
        return np.concatenate([self.data[self.head :], self.data[: self.head]])


class PopularityBaseline:
    """Per-video smoothed positive rate, learnt prequentially from the same samples."""

    def __init__(self, max_videos: int = 1_000_000) -> None:
        self.max_videos = max_videos
        self._counts: dict[str, list[float]] = {}

    def predict(self, video_ids: Sequence[str]) -> Floats:
        counts = self._counts
        out = np.empty(len(video_ids), dtype=np.float64)
        for i, video in enumerate(video_ids):
            c = counts.get(video)
            out[i] = 0.5 if c is None else (c[0] + 1.0) / (c[1] + 2.0)
        return out

    def update(self, video_ids: Sequence[str], labels: Floats) -> None:
        counts = self._counts
        if len(counts) > self.max_videos:
            counts.clear()  # bounded memory; the baseline relearns quickly
        for video, label in zip(video_ids, labels.tolist(), strict=True):
            c = counts.get(video)
            if c is None:
                counts[video] = [label, 1.0]
            else:
                c[0] += label
                c[1] += 1.0


class HeadWindow:
    """One head's prequential predictions, labels and popularity baseline over a window."""

    def __init__(self, window: int) -> None:
        self.scores = _Ring(window)
        self.labels = _Ring(window)
        self.baseline = _Ring(window)
        self.popularity = PopularityBaseline()

    def observe(self, video_ids: Sequence[str], scores: Floats, labels: Floats) -> None:
        self.baseline.extend(self.popularity.predict(video_ids))
        self.popularity.update(video_ids, labels)
        self.scores.extend(scores)
        self.labels.extend(labels)

    def values(self) -> tuple[Floats, Floats, Floats]:
        return self.scores.values(), self.labels.values(), self.baseline.values()


def _auc_figures(scores: Floats, labels: Floats, base: Floats) -> dict[str, float]:
    return {
        "auc": roc_auc(scores, labels),
        "baseline_auc": roc_auc(base, labels),
        "rate": float(labels.mean()) if len(labels) else float("nan"),
        "samples": float(len(labels)),
    }


def _rank_figures(scores: Floats, targets: Floats, base: Floats) -> dict[str, float]:
    return {
        "spearman": spearman(scores, targets),
        "baseline_spearman": spearman(base, targets),
        "mae": mean_abs_error(scores, targets),
        "baseline_mae": mean_abs_error(base, targets),
        "samples": float(len(targets)),
    }


_FIGURES: dict[str, Callable[[Floats, Floats, Floats], dict[str, float]]] = {
    "auc": _auc_figures, "rank": _rank_figures,
}
"""Each :data:`~feature_store.heads.Metric`'s figures (:data:`~feature_store.heads.
METRIC_FIGURES`) from a window's predictions, labels and popularity baseline."""
_GAUGED = {"auc": ("auc",), "rank": ("spearman", "mae")}
"""The figures of each metric exported as ``vidrec_trainer_head_metric`` gauges."""


class TrainerMetrics:
    """Sliding-window prequential metrics, loop rates, and their Prometheus gauges."""

    def __init__(
        self,
        window: int,
        registry: CollectorRegistry | None = None,
        rate_window_s: float = 10.0,
    ) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self._scores = _Ring(window)
        self._labels = _Ring(window)
        self._weights = _Ring(window)
        self._baseline = _Ring(window)
        self.popularity = PopularityBaseline()
        self.heads = {head.name: HeadWindow(window) for head in HEADS[1:]}
        """The other heads' windows (the primary head's are the fields above)."""
        self.head_samples = dict.fromkeys(HEAD_NAMES, 0)
        """Samples each head has trained on in all (checkpointed, and exported with the
        version: a server leaves a head that never trained out of its fusion)."""
        self.rate_window_s = rate_window_s
        self._batches: deque[tuple[float, int, int]] = deque()  # (t, events, samples)
        self._latency_ms: deque[float] = deque(maxlen=200)
        self.events_total = 0
        self.samples_total = 0
        self.batches_total = 0
        self.unique_keys = 0
        """Unique sparse keys (all tables) of the last batch."""
        self.unique_keys_total = 0
        self.lag = 0
        r = self.registry
        self.g_auc = Gauge("vidrec_trainer_auc", "Prequential AUC over the window", registry=r)
        self.g_logloss = Gauge(
            "vidrec_trainer_logloss", "Prequential log loss over the window", registry=r
        )
        self.g_base_auc = Gauge(
            "vidrec_trainer_baseline_auc", "Popularity baseline's prequential AUC", registry=r
        )
        self.g_head = Gauge(
            "vidrec_trainer_head_metric",
            "Prequential figure of a ranking head over the window (watch: spearman, "
            "negative: auc)",
            ["head", "metric"],
            registry=r,
        )
        self.g_rate = Gauge("vidrec_trainer_events_per_second", "Events consumed per s", registry=r)
        self.g_keys = Gauge(
            "vidrec_trainer_unique_keys", "Unique sparse keys in the last batch", registry=r
        )
        self.g_lag = Gauge(
            "vidrec_trainer_consumer_lag", "Records behind the log's end", registry=r
        )
        self.c_events = Counter("vidrec_trainer_events", "Events consumed and trained", registry=r)
        self.c_samples = Counter("vidrec_trainer_samples", "Labelled samples trained", registry=r)
        self.c_dupes = Counter(
            "vidrec_trainer_duplicates", "Redelivered events skipped by dedupe", registry=r
        )
        self.c_served_join = Counter(
            "vidrec_trainer_served_join",
            "Events naming a recommendation, by what the served-log join made of them "
            "(joined, missing, late, unknown, other_schema: trainer/served.py)",
            ["outcome"],
            registry=r,
        )
        self.h_latency = Histogram(
            "vidrec_trainer_batch_seconds",
            "Wall time of one training step",
            buckets=(0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0),
            registry=r,
        )

    def observe_scores(
        self,
        video_ids: Sequence[str],
        scores: Floats,
        labels: Floats,
        weights: Floats,
        heads: Floats | None = None,
        targets: Floats | None = None,
    ) -> None:
        """Record a batch's pre-update scores; updates the baselines afterwards.

        ``scores`` and ``labels`` are the engagement head's (NaN labels: none,
        left out); ``heads`` and ``targets``, ``(n, H)`` in HEADS order, the
        other heads' predictions and labels (NaN: no label for that head).
        """
        all_ids = list(video_ids)
        known = ~np.isnan(labels)
        self.head_samples[PRIMARY.name] += int(known.sum())
        if not known.all():
            video_ids = [v for v, k in zip(all_ids, known.tolist(), strict=True) if k]
            scores, labels, weights = scores[known], labels[known], weights[known]
        self._baseline.extend(self.popularity.predict(video_ids))
        self.popularity.update(video_ids, labels)
        self._scores.extend(scores)
        self._labels.extend(labels)
        self._weights.extend(weights)
        if heads is None or targets is None:
            return
        for column, spec in enumerate(HEADS):
            window = self.heads.get(spec.name)
            if window is None or column >= targets.shape[1]:
                continue
            has = ~np.isnan(targets[:, column])
            self.head_samples[spec.name] += int(has.sum())
            if has.any():
                ids = [v for v, k in zip(all_ids, has.tolist(), strict=True) if k]
                window.observe(ids, heads[has, column], targets[has, column])

    def observe_batch(
        self, events: int, samples: int, duplicates: int, unique_keys: int, seconds: float
    ) -> None:
        now = time.monotonic()
        self._batches.append((now, events, samples))
        while self._batches and self._batches[0][0] < now - self.rate_window_s:
            self._batches.popleft()
        self._latency_ms.append(seconds * 1000.0)
        self.events_total += events
        self.samples_total += samples
        self.batches_total += 1
        self.unique_keys = unique_keys
        self.unique_keys_total += unique_keys
        self.c_events.inc(events)
        self.c_samples.inc(samples)
        if duplicates:
            self.c_dupes.inc(duplicates)
        self.h_latency.observe(seconds)
        self.g_keys.set(unique_keys)

    def restore_totals(self, state: dict[str, Any]) -> None:
        """The totals a checkpoint's state holds (events, samples, batches, per head)."""
        self.events_total = int(state.get("events_total", 0))
        self.samples_total = int(state.get("samples_total", 0))
        self.batches_total = int(state.get("batches_total", 0))
        for head, count in state.get("head_samples", {}).items():
            if head in self.head_samples:
                self.head_samples[head] = int(count)

    def set_lag(self, lag: int) -> None:
        self.lag = lag
        self.g_lag.set(lag)

    def rates(self) -> tuple[float, float]:
        """(events/s, samples/s) over the rate window."""
        if len(self._batches) < 2:
            return 0.0, 0.0
        span = self._batches[-1][0] - self._batches[0][0]
        if span <= 0:
            return 0.0, 0.0
        events = sum(b[1] for b in list(self._batches)[1:])
        samples = sum(b[2] for b in list(self._batches)[1:])
        return events / span, samples / span

    def window(self) -> dict[str, float]:
        """AUC, log loss and the baseline's, over the sliding window."""
        scores, labels = self._scores.values(), self._labels.values()
        weights, base = self._weights.values(), self._baseline.values()
        return {
            "auc": roc_auc(scores, labels),
            "logloss": log_loss(scores, labels, weights),
            "baseline_auc": roc_auc(base, labels),
            "baseline_logloss": log_loss(base, labels, weights),
            "positive_rate": float(labels.mean()) if len(labels) else float("nan"),
            "window_samples": float(len(labels)),
            **self.head_window(),
        }

    def head_window(self) -> dict[str, float]:
        """The other heads' figures over their windows (each head's
        :attr:`~feature_store.heads.HeadSpec.metric`, keys ``{head}_{figure}``)."""
        out: dict[str, float] = {}
        for spec in HEADS[1:]:
            scores, labels, base = self.heads[spec.name].values()
            found = _FIGURES[spec.metric](scores, labels, base)
            out.update({f"{spec.name}_{figure}": value for figure, value in found.items()})
        return out

    def snapshot(self) -> dict[str, Any]:
        """The current point: window metrics, rates, latency, keys, lag, totals."""
        point: dict[str, Any] = self.window()
        events_s, samples_s = self.rates()
        latencies = np.array(self._latency_ms) if self._latency_ms else np.zeros(1)
        point.update(
            events_per_s=events_s,
            samples_per_s=samples_s,
            batch_ms_mean=float(latencies.mean()),
            batch_ms_p95=float(np.percentile(latencies, 95)),
            unique_keys=self.unique_keys,
            lag=self.lag,
            events_total=self.events_total,
            samples_total=self.samples_total,
            batches_total=self.batches_total,
        )
        for gauge, key in ((self.g_auc, "auc"), (self.g_logloss, "logloss")):
            if point[key] == point[key]:  # not NaN
                gauge.set(point[key])
        if point["baseline_auc"] == point["baseline_auc"]:
            self.g_base_auc.set(point["baseline_auc"])
        for spec in HEADS[1:]:
            for figure in _GAUGED[spec.metric]:
                value = point[f"{spec.name}_{figure}"]
                if value == value:
                    self.g_head.labels(spec.name, figure).set(value)
        self.g_rate.set(events_s)
        return point

