"""Serving figures over time, sampled from the service's own Prometheus metrics.

A background thread reads the app's :class:`~app.metrics.Metrics` registry
every ``dashboard.sample_every_s`` (no extra work on the request path) and
turns cumulative counters into rates over the last ``rate_window_s``:

- requests/s: recommend calls (the ``total`` stage's count);
- events/s: events accepted by ``POST /v1/events``;
- fallback and degraded rates: fallbacks / requests over the window;
- p50 and p99 per stage (candidates, features, pull, onnx, total) in ms,
  estimated from the histogram's bucket deltas by linear interpolation
  within a bucket (so a quantile is exact only to its bucket; above the
  largest finite bucket it reads as that bound).

It also refreshes the sparse tables' stats every ``table_stats_every_s``
(a Redis table counts its rows with SCAN; not something to do per page poll).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry

from feature_store.runtime.worker import periodic
from feature_store.settings import DashboardSettings
from feature_store.sparse.base import SparseTable

log = logging.getLogger(__name__)

STAGES = ("candidates", "features", "pull", "onnx", "total")
"""Recommend stages in request order (the scorer's ``onnx`` is the score stage)."""


@dataclass
class Counts:
    """Cumulative counters read at one instant."""

    t: float
    buckets: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    """Per stage: (upper bound, cumulative count), ascending."""
    fallbacks: dict[str, float] = field(default_factory=dict)
    events_accepted: float = 0.0


def read_counts(registry: CollectorRegistry) -> Counts:
    counts = Counts(time.monotonic())
    for metric in registry.collect():
        if metric.name == "vidrec_recommend_stage_seconds":
            for sample in metric.samples:
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    counts.buckets.setdefault(sample.labels["stage"], []).append(
                        (bound, sample.value)
                    )
        elif metric.name == "vidrec_fallbacks":
            for sample in metric.samples:
                if sample.name.endswith("_total"):
                    counts.fallbacks[sample.labels["reason"]] = sample.value
        elif metric.name == "vidrec_events":
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels.get("result") == "accepted":
                    counts.events_accepted = sample.value
    for rows in counts.buckets.values():
        rows.sort()
    return counts


def quantile(deltas: list[tuple[float, float]], q: float) -> float | None:
    """The ``q`` quantile of a histogram given cumulative (bound, count) deltas; None if empty."""
    total = deltas[-1][1] if deltas else 0.0
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, cumulative in deltas:
        if cumulative >= rank:
            if bound == float("inf"):
                return lower
            inside = cumulative - below
            return lower + (bound - lower) * ((rank - below) / inside if inside > 0 else 1.0)
        lower, below = bound, cumulative
    return lower


def serving_point(old: Counts, new: Counts) -> dict[str, Any]:
    """Rates and quantiles between two readings (see the module docstring)."""
    span = max(new.t - old.t, 1e-9)
    point: dict[str, Any] = {"ts_ms": int(time.time() * 1000)}
    before = {stage: dict(rows) for stage, rows in old.buckets.items()}
    requests = 0.0
    for stage, rows in new.buckets.items():
        prior = before.get(stage, {})
        deltas = [(bound, count - prior.get(bound, 0.0)) for bound, count in rows]
        for name, q in (("p50", 0.5), ("p99", 0.99)):
            value = quantile(deltas, q)
            point[f"{name}_{stage}_ms"] = None if value is None else round(value * 1000, 3)
        if stage == "total":
            requests = deltas[-1][1] if deltas else 0.0
    fallbacks = {
        reason: value - old.fallbacks.get(reason, 0.0) for reason, value in new.fallbacks.items()
    }
    point["requests_per_s"] = requests / span
    point["events_per_s"] = (new.events_accepted - old.events_accepted) / span
    point["fallback_rate"] = sum(fallbacks.values()) / requests if requests else None
    point["degraded_rate"] = fallbacks.get("degraded", 0.0) / requests if requests else None
    point["fallbacks"] = fallbacks
    return point


class Sampler:
    """The sampling thread and what it has gathered (see the module docstring)."""

    def __init__(
        self,
        registry: CollectorRegistry,
        tables: dict[str, SparseTable],
        settings: DashboardSettings,
    ) -> None:
        self.registry = registry
        self.tables = tables
        self.settings = settings
        self.points: deque[dict[str, Any]] = deque(maxlen=settings.history_points)
        self.table_stats: dict[str, dict[str, Any]] = {}
        self.table_error: str | None = None
        self._readings: deque[Counts] = deque()
        self._tables_at = 0.0
        self._lock = threading.Lock()
        self._worker = periodic("vidrec-dashboard", settings.sample_every_s, self.sample)

    def start(self) -> None:
        self.sample()
        self._worker.start()

    def close(self) -> None:
        self._worker.stop()

    def sample(self) -> None:
        counts = read_counts(self.registry)
        readings = self._readings
        readings.append(counts)
        while len(readings) > 2 and readings[1].t <= counts.t - self.settings.rate_window_s:
            readings.popleft()
        if len(readings) >= 2:
            point = serving_point(readings[0], counts)
            with self._lock:
                self.points.append(point)
        if counts.t - self._tables_at >= self.settings.table_stats_every_s or not self._tables_at:
            self._tables_at = counts.t
            self.refresh_tables()

    def refresh_tables(self) -> None:
        stats: dict[str, dict[str, Any]] = {}
        try:
            for name, table in self.tables.items():
                s = table.stats()
                stats[name] = {
                    "dim": table.spec.dim,
                    "optimizer": table.spec.optimizer,
                    "rows": s.rows,
                    "admissions": s.admissions,
                    "expirations": s.expirations,
                    "bytes": s.bytes,
                }
        except Exception as exc:  # a backend outage shows on the page, not as a crash
            self.table_error = f"{type(exc).__name__}: {exc}"
            return
        self.table_stats, self.table_error = stats, None

    def since(self, since_ms: int) -> list[dict[str, Any]]:
        with self._lock:
            return [p for p in self.points if p["ts_ms"] > since_ms]

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self.points[-1] if self.points else None
