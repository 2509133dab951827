"""What the page shows, as plain JSON built from the service's live objects.

Each function reads one area (training, serving, model versions, sparse
tables, one user) and never raises for a backend outage: the area carries an
``error`` string instead, so the rest of the page still renders.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from app.dashboard.sampling import STAGES, Sampler
from app.schemas import RecommendRequest
from app.scoring.onnx_model import index_status
from app.service import DemoView, Service
from feature_store.heads import HEADS
from feature_store.ops.timeseries import MetricsSeries
from feature_store.settings import DashboardSettings

HEAD_FIGURES = [
    {"name": h.name, "about": h.about, "metric": h.metric, "figures": list(h.figures())}
    for h in HEADS[1:]
]
"""The other ranking heads (:data:`feature_store.heads.HEADS`), each with its metric and
the keys of its figures in a trainer metrics point, main figure and baseline first: the
page shows and charts each head from this list."""
TRAINING_FIELDS = (
    "auc", "logloss", "baseline_auc", "baseline_logloss", "positive_rate", "events_per_s",
    "samples_per_s", "batch_ms_mean", "batch_ms_p95", "unique_keys", "lag", "events_total",
    *(key for head in HEAD_FIGURES for key in head["figures"]),
)
"""Fields of a trainer metrics point the page charts or shows."""
VERSION_FIELDS = (
    "auc", "logloss", "baseline_auc", "baseline_logloss", *(h.figures()[0] for h in HEADS[1:])
)
"""The figures of each model version the page lists: the primary head's, and each other
head's main one."""
FIRST_LOOK_MS = 30 * 60 * 1000
"""A page's first poll (``since_ms=0``) gets this much chart history, by the server's clock."""


def _start(since_ms: int) -> int:
    return since_ms or int(time.time() * 1000) - FIRST_LOOK_MS


def finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None, at any depth (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def _guard(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return fn()
    except Exception as exc:  # the page renders every other area
        return {"error": f"{type(exc).__name__}: {exc}"}


def trainer_status(service: Service, series: MetricsSeries | None) -> dict[str, Any] | None:
    """The embedded trainer's own status, else the heartbeat of a separate one."""
    if service.trainer is not None:
        return service.trainer.status()
    return series.status() if series is not None else None


def _sequence_summary(sequence: dict[str, Any] | None) -> dict[str, Any] | None:
    """What the dashboard shows of the sequence tower and the live factorisation (None: no
    tower): refits and the learnt weight; fits, users folded in since the start, the last
    fit's seconds and failures."""
    if not sequence:
        return None
    factors = sequence.get("factorization") or {}
    return {
        "fits": sequence.get("fits"), "weight": sequence.get("weight"),
        "factorization": {k: factors.get(k) for k in
                          ("fits", "fitted_pairs", "users_folded", "last_fit_seconds", "failed")}
        if factors else None,
    }


def display_state(status: dict[str, Any] | None, lag_warning: int) -> str:
    """running, paused, lagging, stopped, failed... or ``unreachable`` without a heartbeat."""
    if status is None:
        return "unreachable"
    state = str(status.get("state", "unknown"))
    lag = (status.get("metrics") or {}).get("lag") or 0
    if state == "running" and lag > lag_warning:
        return "lagging"
    if status.get("paused") and state == "running":
        return "pausing"
    return state


class CheckpointClock:
    """When each trainer's checkpoint number was first seen to change, ms since epoch.

    The trainer's status carries the number of its last checkpoint, not its
    time; the page shows "#N, about T ago" from when this service first saw N
    (exact to a poll, and unknown for the checkpoint in place when it started).
    """

    def __init__(self) -> None:
        self._seen: dict[str, tuple[int, int | None]] = {}

    def observe(self, group: str, seq: int | None) -> int | None:
        if seq is None:
            return None
        known = self._seen.get(group)
        if known is None:
            self._seen[group] = (seq, None)  # in place before we looked: time unknown
            return None
        if known[0] != seq:
            self._seen[group] = (seq, int(time.time() * 1000))
        return self._seen[group][1]


def training(
    service: Service,
    series: MetricsSeries | None,
    settings: DashboardSettings,
    since_ms: int,
    clock: CheckpointClock | None = None,
) -> dict[str, Any]:
    def build() -> dict[str, Any]:
        resources = service.resources
        status = trainer_status(service, series)
        seq = (status or {}).get("checkpoint_seq")
        group = str((status or {}).get("group_id"))
        latest = dict((status or {}).get("metrics") or {})
        ends = resources.event_log.end_offsets()
        positions = {int(p): int(o) for p, o in ((status or {}).get("positions") or {}).items()}
        lag = {str(p): max(0, end - positions.get(p, 0)) for p, end in sorted(ends.items())}
        points = series.read(_start(since_ms), limit=2000) if series is not None else []
        return {
            "state": display_state(status, settings.lag_warning_records),
            "status": status,
            "latest": {k: latest.get(k) for k in TRAINING_FIELDS},
            "lag_per_partition": lag if status is not None else {},
            "dead_letters": resources.event_log.dead_letter_count(),
            "checkpoint_seq": seq,
            "checkpoint_seen_ms": clock.observe(group, seq) if clock is not None else None,
            "last_version": (status or {}).get("last_version"),
            "served_join": (status or {}).get("served"),
            "sequence": _sequence_summary((status or {}).get("sequence")),
            "heads": HEAD_FIGURES,
            "points": [
                {"ts_ms": p.get("ts_ms"), **{k: p.get(k) for k in TRAINING_FIELDS}} for p in points
            ],
        }

    return _guard(build)


def serving(
    service: Service, sampler: Sampler, since_ms: int, demo: DemoView | None = None
) -> dict[str, Any]:
    def build() -> dict[str, Any]:
        model = service.model
        latest = sampler.latest() or {}
        return {
            "provider": model.provider if model else None,
            "version": model.version if model else None,
            "family": model.manifest.family if model else None,
            "load_error": service.holder.last_error,
            "index": index_status(model),
            "stages": [
                {
                    "stage": stage,
                    "p50_ms": latest.get(f"p50_{stage}_ms"),
                    "p99_ms": latest.get(f"p99_{stage}_ms"),
                }
                for stage in STAGES
            ],
            "latest": {k: v for k, v in latest.items() if not k.startswith("p")},
            "demo": demo.figures() if demo is not None else None,
            "points": [
                {k: p.get(k) for k in (
                    "ts_ms", "requests_per_s", "events_per_s", "fallback_rate",
                    "degraded_rate", "p50_total_ms", "p99_total_ms",
                )}
                for p in sampler.since(since_ms)
            ],
        }

    return _guard(build)


def models(service: Service) -> dict[str, Any]:
    def build() -> dict[str, Any]:
        registry = service.resources.registry
        active = registry.active()
        previous = registry.previous()
        target = registry.rollback_target()
        model = service.model
        rows = []
        for version in reversed(registry.list_versions()):
            manifest = registry.manifest(version)
            position = manifest.training_position
            rows.append({
                "version": version,
                "family": manifest.family,
                "created_at_ms": manifest.created_at_ms,
                "events_total": position.get("events_total"),
                "positions": position.get("positions"),
                "group_id": position.get("group_id"),
                "metrics": {
                    k: manifest.metrics.get(k) for k in VERSION_FIELDS
                },
                "active": version == active,
                "served": model is not None and model.version == version,
                "rollback_target": version == target,
            })
        return {
            "active": active,
            "previous": previous,
            "rollback_target": target,
            "served": model.version if model else None,
            "versions": rows,
        }

    return _guard(build)


def tables(sampler: Sampler) -> dict[str, Any]:
    return {"tables": sampler.table_stats, "error": sampler.table_error}


def user_insight(service: Service, user_id: str, count: int) -> dict[str, Any]:
    """A user's recent history beside what the service recommends now (source and score).

    Asks the recommender like any caller would, so the request shows in the
    serving figures too.
    """
    resources = service.resources
    history = resources.activity.history(user_id)
    response = service.recommender.recommend(RecommendRequest(user_id=user_id, count=count))
    ids = [h.video_id for h in history] + [i.video_id for i in response.items]
    videos = dict(zip(ids, resources.catalog.get_many(ids), strict=True))

    def about(video_id: str) -> dict[str, Any]:
        video = videos.get(video_id)
        return {"category": video.category, "creator_id": video.creator_id} if video else {}

    now = int(time.time() * 1000)
    return {
        "user_id": user_id,
        "history": [
            {"video_id": h.video_id, "action": h.action, "watch_ratio": h.watch_ratio,
             "age_s": (now - h.ts) / 1000, **about(h.video_id)}
            for h in history
        ],
        "recommendations": [
            {"video_id": i.video_id, "source": i.source, "score": i.score, **about(i.video_id)}
            for i in response.items
        ],
        "model_version": response.model_version,
        "fallback_reason": response.fallback_reason,
        "degraded": response.degraded,
    }


def _points(series: MetricsSeries | None, since_ms: int) -> list[dict[str, Any]]:
    if series is None:
        return []
    return [
        {"ts_ms": p.get("ts_ms"), **{k: p.get(k) for k in TRAINING_FIELDS}}
        for p in series.read(_start(since_ms), limit=2000)
    ]


def retrains(
    service: Service, started: list[dict[str, Any]], since_ms: int
) -> list[dict[str, Any]]:
    """Retrain families with their progress and metric points.

    Embedded, the manager in this process describes them. With a separate
    trainer process, the families are the ``retrain`` actions of the audit
    log (``started``), read through their metrics series and heartbeat in Redis.
    """
    resources = service.resources
    manager = service.retrain
    out: list[dict[str, Any]] = []
    if manager is not None:
        for family in sorted(manager.families.values(), key=lambda f: f.id):
            try:
                out.append({**family.describe(), "points": _points(family.series, since_ms)})
            except Exception as exc:  # one family's outage must not hide the others
                out.append({"id": family.id, "state": "unreachable", "error": str(exc)})
        return out
    if resources.settings.stores.backend != "redis":
        return out
    from feature_store.ops.timeseries import open_timeseries

    for entry in started:
        result = entry.get("result") or {}
        group = result.get("group_id")
        if entry.get("action") != "retrain" or entry.get("status") != "done" or not group:
            continue
        try:
            series = open_timeseries(resources.settings, resources.redis_client, name=group)
            status = series.status()
            out.append({
                "id": result.get("family"), "group_id": group,
                "from_ts_ms": result.get("from_ts_ms"), "issuer": entry.get("actor"),
                "state": (status or {}).get("state", "unreachable"),
                "last_version": (status or {}).get("last_version"),
                "latest": (status or {}).get("metrics") or {},
                "points": _points(series, since_ms),
            })
        except Exception as exc:  # shown on the page
            out.append({"id": result.get("family"), "state": "unreachable", "error": str(exc)})
    return out
