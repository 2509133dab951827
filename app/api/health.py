"""Liveness, readiness, Prometheus metrics and a human-readable status."""

from __future__ import annotations

import os
import time
from typing import Any

import onnxruntime as ort
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from app.api.dependencies import ServiceDep
from app.auth import require
from app.openapi import errors
from app.schemas import Liveness, Readiness
from app.scoring.onnx_model import index_status
from app.service import Service
from feature_store.factors.base import FactorStore

router = APIRouter(tags=["operations"])


@router.get(
    "/healthz",
    responses={
        200: {"model": Liveness, "description": "Alive."},
        503: {"model": Liveness, "description": "Stuck: one scoring ran `api.liveness_stuck_s`."},
    },
)
async def healthz(request: Request) -> JSONResponse:
    """Alive: the event loop answers, and no scoring is stuck. Touches no backend.

    ``async``, answered on the event loop, which never scores nor ingests
    (:mod:`app.admission`): it answers at once however busy the scoring
    thread and the ingest threads are, and whatever Redis or the broker do,
    so an overload or an outage never restarts the process. 503 only when
    one scoring has run ``api.liveness_stuck_s`` (60 s; a scoring takes
    milliseconds and every backend call has a timeout): a deadlock only a
    restart ends.
    """
    service: Service | None = getattr(request.app.state, "service", None)
    if service is not None:
        busy_s = service.scoring.busy_for_s()
        if busy_s >= service.resources.settings.api.liveness_stuck_s:
            return JSONResponse({"status": "stuck", "scoring_busy_s": round(busy_s, 1)}, 503)
    return JSONResponse({"status": "ok"})


@router.get(
    "/readyz",
    responses={
        200: {"model": Readiness, "description": "Can answer (`degraded` says whether fully)."},
        503: {"model": Readiness, "description": "Still starting (or stopping)."},
    },
)
async def readyz(request: Request) -> JSONResponse:
    """Ready means *can answer*: 200 once the service has started, degraded or not.

    With Redis or the broker down the service still answers (recommendations
    from the in-memory popular list, 503 with ``Retry-After`` on event
    posts), so a pod stays in rotation: taking every pod out would turn a
    degraded answer into no answer. What is down is in the body
    (``degraded``, ``checks``) and in ``vidrec_dependency_up``. The states
    are the circuit breakers' (:mod:`feature_store.runtime.breaker`): reading them
    touches no backend, so this answers at once whatever the dependencies do.
    """
    service: Service | None = getattr(request.app.state, "service", None)
    if service is None:
        return JSONResponse({"ready": False, "checks": {"service": "starting"}}, 503)
    states = {name: breaker.state() for name, breaker in service.dependencies().items()}
    checks = {
        name: "ok" if state["state"] == "up" else f"down: {state.get('error')}"
        for name, state in states.items()
    }
    model = service.model
    checks["model"] = (
        f"{model.version} on {model.provider}"
        if model
        else f"no model loaded ({service.holder.last_error or 'no active version in the registry'})"
    )
    degraded = model is None or any(s["state"] != "up" for s in states.values())
    body = {"ready": True, "degraded": degraded, "checks": checks, "dependencies": states,
            "process": os.getpid()}
    return JSONResponse(body, 200)


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
        "dependencies": {n: b.state() for n, b in service.dependencies().items()},
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
    out["retrieval"] = {"index": index_status(model)}
    out["sequence"] = sequence_status(model)
    out["factorization"] = _safe(lambda: factorization_status(resources.factors))
    if service.trainer is not None:
        out["trainer"] = _safe(service.trainer.status)
    return out


def sequence_status(model: Any) -> dict[str, Any] | None:
    """The served version's sequence tower: videos it has a vector for, views it reads,
    refits behind its weights (None: the version has none)."""
    if model is None or model.sequence is None:
        return None
    described = model.manifest.extra.get("sequence", {})
    return {"videos": len(model.sequence.codes), "max_len": model.sequence.max_len,
            "fits": described.get("fits"), "weight": model.sequence.weight}


def factorization_status(factors: FactorStore) -> dict[str, Any] | None:
    """The live factorisation's newest fit as this process reads it: its version, the
    videos it has a factor for and their width (None: no fit yet)."""
    items, _ = factors.read("")
    if items is None:
        return None
    return {"version": items.version, "videos": len(items.ids), "dim": items.dim}


def _safe(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:  # status must render even when a backend is down
        return {"error": f"{type(exc).__name__}: {exc}"}
