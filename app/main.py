"""The FastAPI application: ``create_app(settings)`` and its lifespan.

No side effects at import time. The lifespan opens the storage
(:func:`~feature_store.runtime.open_resources`, unless the caller passes an
already-open :class:`~feature_store.runtime.Resources`, which it then leaves
open), builds the service (:func:`app.service.open_service`), enters the
optional *extensions* (the embedded trainer, the demo traffic) and closes
everything in reverse order on shutdown.

Errors: every :class:`~feature_store.errors.VidrecError` becomes its
``http_status`` with ``{"error", "message", "field"?}``; FastAPI's request
validation errors (malformed JSON, wrong types, unknown fields) are
translated to :class:`~feature_store.errors.InvalidInput` naming the field
first, so there is one error shape and one handler.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from app import dashboard
from app.api import events, health, recommend, videos
from app.limits import BodySizeLimit
from app.metrics import Metrics, RequestTimer
from app.service import Service, open_service
from feature_store.errors import InvalidInput, VidrecError
from feature_store.events import ID_CHARSET, ID_CHARSET_TEXT
from feature_store.runtime import Resources, open_resources
from feature_store.settings import Settings

log = logging.getLogger(__name__)

Extension = Callable[[Service], AbstractContextManager[Any]]
"""Something to run beside the API for the app's lifetime (embedded trainer, demo)."""


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


async def vidrec_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """The one exception handler: a :class:`VidrecError` as its status and JSON body."""
    if isinstance(exc, RequestValidationError):
        exc = translate_validation_error(exc)
    assert isinstance(exc, VidrecError)
    if exc.http_status >= 500:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
    return JSONResponse(exc.to_dict(), status_code=exc.http_status)


def create_app(
    settings: Settings,
    *,
    resources: Resources | None = None,
    extensions: Sequence[Extension] = (),
) -> FastAPI:
    """A new application for ``settings`` (see the module docstring)."""
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        with ExitStack() as stack:
            res = resources or stack.enter_context(open_resources(settings))
            service = stack.enter_context(open_service(res, metrics))
            for extension in extensions:
                stack.enter_context(extension(service))
            app.state.service = service
            try:
                yield
            finally:
                app.state.service = None

    app = FastAPI(
        title="vidrec",
        version="0.1.0",
        summary="Real-time video recommendations",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.metrics = metrics
    app.state.service = None
    app.add_exception_handler(VidrecError, vidrec_error_handler)
    app.add_exception_handler(RequestValidationError, vidrec_error_handler)
    for router in (recommend.router, events.router, videos.router, health.router):
        app.include_router(router)
    app.include_router(dashboard.router)  # its lifespan runs inside the app's
    default_openapi = app.openapi

    def openapi() -> dict[str, Any]:  # the recommend body is parsed by its route
        if app.openapi_schema is None:
            app.openapi_schema = recommend.add_request_schemas(default_openapi())
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    app.add_middleware(BodySizeLimit, max_bytes=settings.api.max_body_bytes)
    app.add_middleware(RequestTimer, metrics=metrics)  # outermost: times the whole request
    return app
