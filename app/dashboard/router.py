"""Routes of the operators' dashboard, under ``/dashboard``.

- ``GET /dashboard``: the page (static HTML, CSS and JS shipped in the
  package under ``app/static/dashboard``; no CDN, no front-end server). It
  holds no data: everything comes from the JSON routes below, behind the
  admin or viewer key (:mod:`app.dashboard.access`).
- ``GET /dashboard/api/session``: checks a key, answers the role (the login).
- ``GET /dashboard/api/overview?since_ms=``: every area in one poll; the
  chart series only past ``since_ms`` so a poll carries new points only.
- ``GET /dashboard/api/users/{user_id}``: history beside recommendations.
- ``POST /dashboard/api/actions/{action}``: admin only, audited
  (:mod:`app.dashboard.actions`); one route per action, each with its own
  body; ``GET /dashboard/api/commands/{id}``: the trainer's acks of one
  command so far (the page shows progress with it).
- ``GET /dashboard/api/audit``: the audit log, one row per action.
- ``GET /dashboard/api/experiments``: the experiments with per-arm figures
  (:mod:`app.dashboard.experiments`; also in the overview).

The router's lifespan (merged into the app's by FastAPI, so it runs once
the service is up) starts the serving sampler and opens the audit log and
the control channel; it closes the sampler on shutdown.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from importlib import resources as package_files
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import Response

from app.dashboard import views
from app.dashboard.access import Operator, admin, viewer
from app.dashboard.actions import (
    Action,
    ActionRequest,
    ActionRunner,
    ExportRequest,
    PromoteRequest,
    RetrainRequest,
    RetrainStopRequest,
    TrainerActionRequest,
)
from app.dashboard.audit import AuditLog, open_audit_log, recent
from app.dashboard.experiments import (
    ExperimentConcludeRequest,
    ExperimentStartRequest,
    ExperimentStopRequest,
    experiments_view,
)
from app.dashboard.sampling import Sampler
from app.openapi import errors
from app.service import DemoView, Service
from feature_store.errors import BackendUnavailable, NotFound
from feature_store.ops.control import ControlChannel
from feature_store.ops.timeseries import MetricsSeries

_STATIC = {"dashboard.css": "text/css", "dashboard.js": "text/javascript", "charts.js":
           "text/javascript", "favicon.svg": "image/svg+xml"}


@dataclass
class Dashboard:
    """What the routes share, on ``app.state.dashboard``."""

    service: Service
    sampler: Sampler
    audit: AuditLog
    channel: ControlChannel
    actions: ActionRunner
    demo: DemoView | None = None
    """The demo's simulated users while ``vidrec up --demo`` runs them (from the app's
    lifespan, which opened them)."""
    clock: views.CheckpointClock = field(default_factory=views.CheckpointClock)

    @property
    def series(self) -> MetricsSeries:
        """The live trainer's series: embedded, the very object it writes; else read from
        Redis (or the data directory) where the trainer writes it."""
        return self.service.resources.trainer_series


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    service: Service | None = app.state.service
    if service is None:  # the app's lifespan failed before the service existed
        yield
        return
    resources = service.resources
    settings = resources.settings
    sampler = Sampler(app.state.metrics.registry, resources.tables, settings.dashboard)
    audit_log = open_audit_log(resources)
    channel = resources.control
    runner = ActionRunner(
        service, channel, audit_log, settings.dashboard.ack_timeout_s,
        settings.dashboard.max_pending_actions,
    )
    app.state.dashboard = Dashboard(
        service, sampler, audit_log, channel, runner, demo=getattr(app.state, "demo", None)
    )
    sampler.start()
    try:
        yield
    finally:
        sampler.close()
        app.state.dashboard = None


router = APIRouter(prefix="/dashboard", tags=["dashboard"], lifespan=lifespan)


def get_dashboard(request: Request) -> Dashboard:
    dashboard: Dashboard | None = getattr(request.app.state, "dashboard", None)
    if dashboard is None:
        raise BackendUnavailable("the dashboard is starting or stopping")
    return dashboard


Board = Annotated[Dashboard, Depends(get_dashboard)]
Viewer = Annotated[Operator, Depends(viewer)]
Admin = Annotated[Operator, Depends(admin)]


def _asset(name: str) -> bytes:
    return (package_files.files("app") / "static" / "dashboard" / name).read_bytes()


@router.get("", include_in_schema=False)
def page() -> Response:
    """The page; it asks for a key before showing anything."""
    return Response(_asset("index.html"), media_type="text/html; charset=utf-8",
                    headers={"Cache-Control": "no-store"})


@router.get("/static/{name}", include_in_schema=False)
def asset(name: str) -> Response:
    if name not in _STATIC:
        raise NotFound(f"no dashboard asset {name!r}")
    return Response(_asset(name), media_type=_STATIC[name])


@router.get("/api/session")
def session(request: Request, operator: Viewer) -> dict[str, Any]:
    """The role this key grants (the login form calls this)."""
    settings = request.app.state.settings.dashboard
    return {"role": operator.role, "name": operator.name, "refresh_ms": settings.refresh_ms}


@router.get("/api/overview", dependencies=[Depends(viewer)], responses=errors(503))
def overview(dashboard: Board, since_ms: Annotated[int, Query(ge=0)] = 0) -> dict[str, Any]:
    """Training, serving, model versions, sparse tables and the audit log."""
    service = dashboard.service
    settings = service.resources.settings.dashboard
    audit = _audit(dashboard, settings.audit_shown)
    return views.finite({
        "retrains": views.retrains(service, audit["entries"], since_ms),
        "training": views.training(
            service, dashboard.series, settings, since_ms, dashboard.clock
        ),
        "serving": views.serving(service, dashboard.sampler, since_ms, dashboard.demo),
        "models": views.models(service),
        "tables": views.tables(dashboard.sampler),
        "audit": audit,
        "experiments": experiments_view(service),
    })


def _audit(dashboard: Dashboard, limit: int) -> dict[str, Any]:
    try:
        return {"entries": recent(dashboard.audit, limit)}
    except BackendUnavailable as exc:
        return {"entries": [], "error": exc.message}


@router.get("/api/audit", dependencies=[Depends(viewer)], responses=errors(503))
def audit(dashboard: Board, limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> dict[str, Any]:
    return _audit(dashboard, limit)


@router.get("/api/users/{user_id}", dependencies=[Depends(viewer)], responses=errors(503))
def user(
    user_id: str, dashboard: Board, count: Annotated[int, Query(ge=1, le=100)] = 20
) -> dict[str, Any]:
    """A user's recent history beside what the service recommends now."""
    return views.finite(views.user_insight(dashboard.service, user_id, count))


async def _act(
    action: Action, body: ActionRequest, operator: Operator, dashboard: Dashboard
) -> dict[str, Any]:
    """Run one action; answers once it is done, failed or timed out (the audit entry).

    Waiting holds no thread (:class:`~app.dashboard.actions.ActionRunner`). The
    same ``id`` sent again answers the first outcome; with another action or
    body it is refused (409); beyond ``dashboard.max_pending_actions`` waiting, 429.
    """
    return views.finite(await dashboard.actions.run(action, body, operator))


ACTION_ERRORS = errors(403, 409, 429, 503)
"""Besides 401/413/422: a viewer key acting (403), an id already naming another action
(409), too many actions waiting (429, with ``Retry-After``), the dashboard not up (503).
An action that fails or times out is still a 200, with ``status`` saying so (audited)."""


@router.post("/api/actions/export", responses=ACTION_ERRORS)
async def export(body: ExportRequest, operator: Admin, dashboard: Board) -> dict[str, Any]:
    """Export the target trainer's model now (a new registry version)."""
    return await _act("export", body, operator, dashboard)


@router.post("/api/actions/pause", responses=ACTION_ERRORS)
async def pause(body: TrainerActionRequest, operator: Admin, dashboard: Board) -> dict[str, Any]:
    """Pause the target trainer (it stops consuming; serving goes on)."""
    return await _act("pause", body, operator, dashboard)


@router.post("/api/actions/resume", responses=ACTION_ERRORS)
async def resume(body: TrainerActionRequest, operator: Admin, dashboard: Board) -> dict[str, Any]:
    """Resume a paused trainer."""
    return await _act("resume", body, operator, dashboard)


@router.post("/api/actions/promote", responses=ACTION_ERRORS)
async def promote(body: PromoteRequest, operator: Admin, dashboard: Board) -> dict[str, Any]:
    """Make ``version`` the active one; done once this service serves it."""
    return await _act("promote", body, operator, dashboard)


@router.post("/api/actions/rollback", responses=ACTION_ERRORS)
async def rollback(body: ActionRequest, operator: Admin, dashboard: Board) -> dict[str, Any]:
    """Go back to the previously active version."""
    return await _act("rollback", body, operator, dashboard)


@router.post("/api/actions/retrain", responses=ACTION_ERRORS)
async def retrain(body: RetrainRequest, operator: Admin, dashboard: Board) -> dict[str, Any]:
    """Start a new model family replaying the event log from ``from_ts_ms``."""
    return await _act("retrain", body, operator, dashboard)


@router.post("/api/actions/retrain_stop", responses=ACTION_ERRORS)
async def retrain_stop(
    body: RetrainStopRequest, operator: Admin, dashboard: Board
) -> dict[str, Any]:
    """Stop a retrain family (its exported versions stay in the registry)."""
    return await _act("retrain_stop", body, operator, dashboard)


@router.post("/api/actions/experiment_start", responses=ACTION_ERRORS)
async def experiment_start(
    body: ExperimentStartRequest, operator: Admin, dashboard: Board
) -> dict[str, Any]:
    """Start an experiment: users split between the arms' model families."""
    return await _act("experiment_start", body, operator, dashboard)


@router.post("/api/actions/experiment_stop", responses=ACTION_ERRORS)
async def experiment_stop(
    body: ExperimentStopRequest, operator: Admin, dashboard: Board
) -> dict[str, Any]:
    """Stop the running experiment with no winner: everyone back on the active version."""
    return await _act("experiment_stop", body, operator, dashboard)


@router.post("/api/actions/experiment_conclude", responses=ACTION_ERRORS)
async def experiment_conclude(
    body: ExperimentConcludeRequest, operator: Admin, dashboard: Board
) -> dict[str, Any]:
    """Promote the winner: its arm's version becomes active for everyone; the experiment ends."""
    return await _act("experiment_conclude", body, operator, dashboard)


@router.get("/api/experiments", dependencies=[Depends(viewer)], responses=errors(503))
def experiments(dashboard: Board) -> dict[str, Any]:
    """The running experiment and the newest ended ones, with per-arm figures."""
    return views.finite(experiments_view(dashboard.service))


@router.get(
    "/api/commands/{command_id}", dependencies=[Depends(viewer)], responses=errors(503)
)
def command(command_id: str, dashboard: Board) -> dict[str, Any]:
    """The trainer's acknowledgements of one command so far."""
    acks = dashboard.channel.acks(command_id)
    return {"id": command_id, "acks": [a.__dict__ for a in acks]}
