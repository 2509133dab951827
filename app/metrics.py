"""Prometheus metrics of one service instance, on its own registry.

Each :func:`app.main.create_app` gets a fresh :class:`Metrics` (no global
collectors), so tests can build many apps in one process. Exposed at
``GET /metrics``. Latencies are in seconds, as Prometheus expects.

A part running in the same process with a registry of its own (the embedded
trainer of ``vidrec up``, whose ``vidrec_trainer_*`` series ``vidrec train``
serves on ``trainer.metrics_port``) is shown on the same page while it runs:
:meth:`Metrics.including` adds its registry to what ``/metrics`` renders.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.types import ASGIApp, Receive, Scope, Send

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.004,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
"""Seconds; dense around the 4 ms p50 and 10 ms p99 goals."""


class Metrics:
    """Every metric the service exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._included: list[CollectorRegistry] = []
        r = self.registry
        self.request_seconds = Histogram(
            "vidrec_request_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.stage_seconds = Histogram(
            "vidrec_recommend_stage_seconds",
            "Recommend latency by stage (candidates, features, pull, onnx, total)",
            ["stage"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._stages: dict[str, Histogram] = {}
        """:attr:`stage_seconds`'s child per stage (:meth:`observe_stage`)."""
        self.candidates = Histogram(
            "vidrec_recommend_candidates",
            "Candidates scored per request",
            buckets=(0, 10, 50, 100, 200, 300, 400, 500, 1000),
            registry=r,
        )
        self.fallbacks = Counter(
            "vidrec_fallbacks_total",
            "Recommendations served by a fallback, by reason",
            ["reason"],
            registry=r,
        )
        self.events = Counter(
            "vidrec_events_total",
            "Events received, by result (accepted, rejected)",
            ["result"],
            registry=r,
        )
        self.unknown_recommendation_ids = Counter(
            "vidrec_unknown_recommendation_ids",
            "Events naming a recommendation_id this service never issued (kept without it)",
            registry=r,
        )
        self.shed = Counter(
            "vidrec_shed",
            "Requests shed by route and reason (limit: refused at admission, 503; deadline: "
            "past their deadline, a recommend answered degraded, an event post 503)",
            ["route", "reason"],
            registry=r,
        )
        self.in_flight = Gauge(
            "vidrec_in_flight",
            "Requests of a gated route in flight (admitted, not answered yet)",
            ["route"],
            registry=r,
        )
        self.model_info = Gauge(
            "vidrec_model_info",
            "1 for the model version being served and its provider",
            ["version", "provider"],
            registry=r,
        )
        self.model_swaps = Counter(
            "vidrec_model_swaps_total", "Model versions loaded and swapped in", registry=r
        )
        self.model_load_failures = Counter(
            "vidrec_model_load_failures_total", "Model versions that failed to load", registry=r
        )
        self.model_warmup_seconds = Gauge(
            "vidrec_model_warmup_seconds", "Warm-up time of the serving model", registry=r
        )
        self.served_log_records = Counter(
            "vidrec_served_log_records",
            "Model-ranked responses for the served log, by outcome (written; dropped: the "
            "writer's queue was full; failed: the log was unavailable)",
            ["outcome"],
            registry=r,
        )
        self.dependency_up = Gauge(
            "vidrec_dependency_up",
            "1 while a dependency (redis, event_log) answers, 0 while it is known down",
            ["dependency"],
            registry=r,
        )

    def observe_stage(self, stage: str, seconds: float) -> None:
        # Each stage's child kept: ``labels()`` validates and looks it up under a lock,
        # six times a request. The series are never removed, so the child stays current.
        child = self._stages.get(stage)
        if child is None:
            child = self._stages[stage] = self.stage_seconds.labels(stage)
        child.observe(seconds)

    def set_model(self, version: str, provider: str, warmup_seconds: float) -> None:
        self.model_info.clear()
        self.model_info.labels(version, provider).set(1)
        self.model_swaps.inc()
        self.model_warmup_seconds.set(warmup_seconds)

    @contextmanager
    def including(self, registry: CollectorRegistry) -> Iterator[None]:
        """Render ``registry`` with the service's own series while the block runs.

        Kept apart rather than registered into :attr:`registry`: the part may
        stop and a new one start in the same app (a lifespan run twice), and
        its collectors' names must not collide with the earlier ones'.
        """
        self._included.append(registry)
        try:
            yield
        finally:
            self._included.remove(registry)

    def render(self) -> bytes:
        return b"".join(generate_latest(r) for r in [self.registry, *self._included])


UNMATCHED = "unmatched"
"""Route label of every request that matched no route (404s for unknown paths)."""
ROUTE_HINT = "vidrec.route"
"""Scope key: the route of a request answered before routing (a refusal at admission)."""


class RequestTimer:
    """ASGI middleware observing ``vidrec_request_seconds`` per route.

    The label is the template of the route that answered (``/v1/recommend``,
    ``/v1/videos/{video_id}``), or :data:`UNMATCHED`: only the app's own
    templates become labels, so ids in paths, and unknown paths sent by
    anyone, cannot grow the number of series.
    """

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.histogram = metrics.request_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        try:
            await self.app(scope, receive, send)
        finally:
            route = getattr(scope.get("route"), "path", None) or scope.get(ROUTE_HINT)
            label = route if isinstance(route, str) else UNMATCHED
            self.histogram.labels(label).observe(time.perf_counter() - started)
