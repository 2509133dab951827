"""The FastAPI application: ``create_app(settings)`` and its lifespan.

No side effects at import time. The lifespan opens the storage
(:func:`~feature_store.runtime.resources.open_resources`, unless the caller passes an
already-open :class:`~feature_store.runtime.resources.Resources`, which it then leaves
open), builds the service (:func:`app.service.open_service`, which opens the
in-process trainer when the caller hands one in), enters the optional
*extensions* (the demo traffic) and closes everything in reverse order on
shutdown.

Errors: every :class:`~feature_store.errors.VidrecError` becomes its
``http_status`` with ``{"error", "message", "field"?}``; FastAPI's request
validation errors (malformed JSON, wrong types, unknown fields) are
translated to :class:`~feature_store.errors.InvalidInput` naming the field
first, and so is a body FastAPI could not read at all (not UTF-8); the
router's own answers (an unknown path's 404, a wrong method's 405 with its
``Allow`` header) come in the same shape. So there is one error shape,
documented once (:mod:`app.openapi`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.telemetry import TelemetryConfig
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException

from app import dashboard, docs
from app.admission import Admission, gates
from app.api import events, health, recommend, videos
from app.limits import BodySizeLimit
from app.metrics import Metrics, RequestTimer
from app.openapi import contract
from app.service import DemoView, Service, TrainerOpener, open_service
from feature_store.errors import InvalidInput, NotFound, VidrecError
from feature_store.events import ID_CHARSET, ID_CHARSET_TEXT
from feature_store.runtime import tracing
from feature_store.runtime.resources import Resources, open_resources
from feature_store.settings import Settings

log = logging.getLogger(__name__)

API_DESCRIPTION = """\
Recommendations (`POST /v1/recommend`), events (`POST /v1/events`) and the
catalog (`/v1/videos`) of a vidrec service.

**Keys.** Writes need `api.api_key`, hiding and unhiding `api.admin_key`
(`X-API-Key: <key>` or `Authorization: Bearer <key>`); reads need a key only
when `api.read_key` is set, and then this document says so on each read.

**Errors.** Every error answer is one JSON shape, `ErrorBody`
(`{"error", "message", "field"}`): `field` names the offending input. That
includes an unknown path (404) and a method a path does not take (405, with
`Allow`). A batch write keeps its valid items: 200 when at least one was
kept, 422 when none was, with each rejected item's index and field.

**First minute.** Until the trainer exports its first model,
`model_version` is `null` and scores are 0 (`fallback_reason: no_model`);
`GET /readyz` answers 200 with `"degraded": true` until a model is loaded
(and while Redis or the broker is down): the service can answer. It answers
503 only while the service is starting or stopping.
"""

Extension = Callable[[Service], AbstractContextManager[Any]]
"""Something to run beside the API for the app's lifetime, given the service (the demo)."""


def translate_validation_error(exc: RequestValidationError) -> InvalidInput:
    """FastAPI's first validation error as :class:`InvalidInput` naming the field."""
    errors = exc.errors()
    if not errors:
        return InvalidInput("body", "invalid request")
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ())]
    kind = first.get("type", "")
    if kind == "json_invalid":
        reason = first.get("ctx", {}).get("error", "invalid JSON")
        return InvalidInput("body", f"malformed JSON: {reason}")
    field = ".".join(loc[1:] if loc and loc[0] == "body" else loc) or "body"
    if field == "body" and kind in ("model_attributes_type", "dict_type", "model_type"):
        return InvalidInput("body", "expected a JSON object (Content-Type: application/json)")
    if kind == "extra_forbidden":
        return InvalidInput(field, "unknown field")
    if kind == "missing":
        return InvalidInput(field, "required")
    if (
        kind == "string_pattern_mismatch"
        and first.get("ctx", {}).get("pattern") == ID_CHARSET.pattern
    ):
        return InvalidInput(field, f"only {ID_CHARSET_TEXT} allowed")
    return InvalidInput(field, str(first.get("msg", "invalid value")))


def _error_name(status: int) -> str:
    """``MethodNotAllowed`` for 405: the status phrase as an error class name."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        return "HTTPError"
    return "".join(word for word in phrase.title().split() if word.isalnum())


def translate_http_exception(exc: HTTPException) -> VidrecError | JSONResponse:
    """Starlette's and FastAPI's own HTTP errors in the one error shape.

    FastAPI answers a body it could not decode (not UTF-8, say) with a bare
    400; that is a malformed body like any other, so it becomes the same 422
    naming ``body``. The router's 404 and 405 keep their status and headers.
    """
    if exc.status_code == 400 and exc.__cause__ is not None:
        cause = exc.__cause__
        reason = "not UTF-8" if isinstance(cause, UnicodeDecodeError) else type(cause).__name__
        return InvalidInput("body", f"malformed JSON: {reason}")
    if exc.status_code == 404:
        return NotFound(str(exc.detail) if exc.detail != "Not Found" else "no such path")
    body = {"error": _error_name(exc.status_code), "message": str(exc.detail)}
    return JSONResponse(body, status_code=exc.status_code, headers=exc.headers)


async def vidrec_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """The one exception handler: a :class:`VidrecError` as its status and JSON body."""
    if isinstance(exc, RequestValidationError):
        exc = translate_validation_error(exc)
    elif isinstance(exc, HTTPException):
        translated = translate_http_exception(exc)
        if isinstance(translated, JSONResponse):
            return translated
        exc = translated
    assert isinstance(exc, VidrecError)
    if exc.http_status >= 500:
        service = getattr(request.app.state, "service", None)
        what = f"{request.method} {_route_of(request)} answered {exc.http_status}"
        if service is not None:  # during an outage every request fails alike: one line
            service.log_summary.record(what, exc)
        else:
            log.warning("%s: %s", what, exc)
    headers = None
    if exc.retry_after_s is not None:
        headers = {"Retry-After": str(exc.retry_after_s)}
    elif exc.http_status == 503:  # a backend is down: clients back off rather than hammer it
        headers = {"Retry-After": "1"}
    return JSONResponse(exc.to_dict(), status_code=exc.http_status, headers=headers)


def _route_of(request: Request) -> str:
    """The template of the route that answered (no ids), else the bare path."""
    route = getattr(request.scope.get("route"), "path", None)
    return route if isinstance(route, str) else request.url.path


def _telemetry() -> TelemetryConfig:
    """FastAPI's native telemetry: server spans on vidrec's tracer provider when tracing
    is on; everything explicitly off otherwise (FastAPI then skips its per-request checks
    for a globally configured provider)."""
    provider = tracing.provider()
    if provider is None:
        return {"tracing": False, "metrics": False, "logs": False, "auto_configure": False}
    return {
        "tracer_provider": provider, "metrics": False, "logs": False,
        "operation_spans": False, "auto_configure": False,
    }


async def _warm_thread_pool() -> None:
    """Hop to the web server's thread pool once before the first request.

    Event posts (and every other sync route) run there. The first hop imports
    anyio's backend (eleven modules) and starts a worker thread on the event
    loop: done by the first event post under load, it held every request the
    loop had for 140-180 ms on a 2-core machine, the slowest refusals of ``bench/bench_overload.py``
    (docs/benchmarks.md, *Overload*). Here it is done before the port opens, and
    what it builds is frozen with the rest of start-up (``app/server.py``)."""
    await run_in_threadpool(lambda: None)


def create_app(
    settings: Settings,
    *,
    resources: Resources | None = None,
    trainer: TrainerOpener | None = None,
    extensions: Sequence[Extension] = (),
) -> FastAPI:
    """A new application for ``settings`` (see the module docstring)."""
    metrics = Metrics()
    tracing.configure(settings.tracing, "api")  # a no-op when off, or already configured

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with ExitStack() as stack:
            # The service starts (and answers recommendations) with no broker reachable.
            res = resources or stack.enter_context(
                open_resources(settings, wait_for_event_log=False)
            )
            service = stack.enter_context(open_service(res, metrics, trainer))
            entered = [stack.enter_context(extension(service)) for extension in extensions]
            app.state.service = service
            # The lifespan opened the extensions, so it hands out what the dashboard shows
            # of them (the demo's figures); nothing sets fields on the service from outside.
            app.state.demo = next((e for e in entered if isinstance(e, DemoView)), None)
            await _warm_thread_pool()
            try:
                yield
            finally:
                app.state.service = None
                app.state.demo = None

    app = FastAPI(
        title="vidrec",
        version="0.1.0",
        summary="Real-time video recommendations",
        description=API_DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # app.docs serves both pages without a CDN
        redoc_url=None,
        telemetry=_telemetry(),
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.service = None
    app.state.demo = None
    app.add_exception_handler(VidrecError, vidrec_error_handler)
    app.add_exception_handler(RequestValidationError, vidrec_error_handler)
    app.add_exception_handler(HTTPException, vidrec_error_handler)
    routers = (
        recommend.router, events.router, videos.router, health.router, docs.router,
        dashboard.router,  # its lifespan runs inside the app's
    )
    for router in routers:
        app.include_router(router)
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            # The recommend body is parsed by its route, so its schema is added here.
            document = recommend.add_request_schemas(default_openapi())
            app.openapi_schema = contract(document, routers, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodySizeLimit, max_bytes=settings.api.max_body_bytes)
    # Before the body is read: a refusal costs no more than the request line and headers.
    app.add_middleware(
        Admission, gates=gates(settings.api), metrics=metrics,
        retry_after_s=settings.api.shed_retry_after_s,
    )
    app.add_middleware(RequestTimer, metrics=metrics)  # outermost: times the whole request
    return app
