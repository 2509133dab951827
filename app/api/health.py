"""Liveness, readiness, Prometheus metrics and a human-readable status."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

import onnxruntime as ort
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.api.dependencies import ServiceDep
from app.auth import require
from app.openapi import errors
from app.schemas import Readiness
from app.service import Service

router = APIRouter(tags=["operations"])

CHECK_TIMEOUT_S = 2.0
"""Longest a readiness probe waits for one backend before calling it down."""

_checks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="vidrec-readyz")


def _probe(fn: Any) -> str | None:
    """None if ``fn()`` returns within the timeout, else the reason it failed."""
    future = _checks.submit(fn)
    try:
        future.result(timeout=CHECK_TIMEOUT_S)
    except FutureTimeout:
        return f"no answer within {CHECK_TIMEOUT_S} s"
    except Exception as exc:  # any failure means "not ready", with its reason
        return f"{type(exc).__name__}: {exc}"
    return None


@router.get("/healthz")
def healthz() -> dict[str, str]:
    """Alive: the process answers HTTP. Touches no backend."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    responses={
        200: {"model": Readiness, "description": "Ready: every check is ok."},
        503: {"model": Readiness, "description": "Not ready: `checks` says which failed."},
    },
)
def readyz(request: Request) -> JSONResponse:
    """Ready: Redis (when used) and the event log answer, and a model is loaded and warmed."""
    service: Service | None = getattr(request.app.state, "service", None)
    if service is None:
        return JSONResponse({"ready": False, "checks": {"service": "starting"}}, 503)
    resources = service.resources
    checks: dict[str, str] = {}
    if resources.redis_client is not None:
        checks["redis"] = _probe(resources.redis_client.ping) or "ok"
    checks["signals"] = _probe(service.signals.ping) or "ok"
    checks["event_log"] = _probe(resources.event_log.end_offsets) or "ok"
    model = service.model
    checks["model"] = (
        f"{model.version} on {model.provider}"
        if model
        else f"no model loaded ({service.holder.last_error or 'no active version in the registry'})"
    )
    ready = model is not None and all(v == "ok" for k, v in checks.items() if k != "model")
    return JSONResponse({"ready": ready, "checks": checks}, 200 if ready else 503)


@router.get(
    "/metrics",
    response_class=PlainTextResponse,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **errors(503),
    },
)
def metrics(service: ServiceDep) -> Response:
    """Prometheus text format."""
    return Response(service.metrics.render(), media_type="text/plain; version=0.0.4")


@router.get("/v1/status", dependencies=[Depends(require("read"))], responses=errors(503))
def status(service: ServiceDep) -> dict[str, Any]:
    """Model, execution provider, trainer and store state, for people and dashboards."""
    resources = service.resources
    model = service.model
    out: dict[str, Any] = {
        "uptime_s": round(time.time() - service.started_at, 3),
        "model": None,
        "model_failures": dict(service.holder.failed),
        "active_version": _safe(resources.registry.active),
        "available_providers": ort.get_available_providers(),
        "backends": {
            "event_log": resources.settings.event_log.backend,
            "sparse": resources.settings.sparse.backend,
            "stores": resources.settings.stores.backend,
            "signals": type(service.signals).__name__,
        },
        "catalog_videos": _safe(resources.catalog.count),
        "popular_list": len(service.popular.items),
    }
    if model is not None:
        out["model"] = {
            "version": model.version,
            "provider": model.provider,
            "loaded_at_ms": model.loaded_at_ms,
            "load_seconds": round(model.load_seconds, 4),
            "warmup_seconds": round(model.warmup_seconds, 4),
            "buckets": list(model.buckets),
            "family": model.manifest.family,
            "metrics": model.manifest.metrics,
            "training_position": model.manifest.training_position,
        }
    trainer = resources.extras.get("trainer")
    if trainer is not None:
        out["trainer"] = _safe(trainer.status)
    return out


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # status must render even when a backend is down
        return {"error": f"{type(exc).__name__}: {exc}"}
