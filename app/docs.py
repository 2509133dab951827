"""Swagger UI at ``/docs`` and ReDoc at ``/redoc``, served whole by the app (no CDN).

FastAPI's own pages load their JavaScript and CSS from a CDN, so on a
machine without internet they are blank. The assets here come from the
``fastapi-offline`` package (a dependency, installed with vidrec), which
ships the Swagger UI and ReDoc bundles; they are served under
``/docs/assets/`` and the pages point there. Nothing the pages load leaves
the service: no fonts from a font service, no validator badge, and a
Content-Security-Policy makes the browser hold the pages to it (ReDoc's
bundle asks for a "by Redocly" logo on a CDN; the policy blocks that
request, and the image hides itself).
"""

from __future__ import annotations

from functools import cache
from importlib import resources as package_files

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, Response

from feature_store.errors import NotFound

ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
"""The files served under ``/docs/assets/``, and their media types."""

DOCS_CSP = "; ".join((
    "default-src 'self'",
    "script-src 'self' 'unsafe-inline'",  # Swagger UI's page starts it with an inline script
    "style-src 'self' 'unsafe-inline'",  # both set styles at run time
    "img-src 'self' data:",
    "font-src 'self' data:",
    "worker-src 'self' blob:",  # ReDoc's search runs in a worker
    "connect-src 'self'",  # "Try it out" calls this service only
))
"""Content-Security-Policy of the two pages: only the service itself."""

ASSET_CACHE_S = 24 * 3600
"""How long a browser may keep an asset, seconds (they change only with the package)."""

router = APIRouter(include_in_schema=False)


def _base(request: Request) -> str:
    """The path prefix the app is served under (``root_path`` behind a proxy)."""
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


def _openapi_url(request: Request) -> str:
    return _base(request) + (request.app.openapi_url or "/openapi.json")


@router.get("/docs")
def swagger_ui(request: Request) -> HTMLResponse:
    """Swagger UI: every operation, with "Try it out"."""
    assets = f"{_base(request)}/docs/assets"
    page = get_swagger_ui_html(
        openapi_url=_openapi_url(request),
        title=f"{request.app.title} API",
        swagger_js_url=f"{assets}/swagger-ui-bundle.js",
        swagger_css_url=f"{assets}/swagger-ui.css",
        swagger_favicon_url=f"{assets}/favicon.png",
        swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": True},
    )
    page.headers["Content-Security-Policy"] = DOCS_CSP
    return page


@router.get("/redoc")
def redoc(request: Request) -> HTMLResponse:
    """ReDoc: the same document as one readable page."""
    assets = f"{_base(request)}/docs/assets"
    page = get_redoc_html(
        openapi_url=_openapi_url(request),
        title=f"{request.app.title} API reference",
        redoc_js_url=f"{assets}/redoc.standalone.js",
        redoc_favicon_url=f"{assets}/favicon.png",
        with_google_fonts=False,
    )
    page.headers["Content-Security-Policy"] = DOCS_CSP
    return page


@router.get("/docs/assets/{name}")
def asset(name: str) -> Response:
    """One of :data:`ASSETS` (anything else is a 404: no path is read from the request)."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFound(f"no documentation asset {name!r}")
    return Response(
        _read(name), media_type=media_type,
        headers={"Cache-Control": f"public, max-age={ASSET_CACHE_S}"},
    )


@cache
def _read(name: str) -> bytes:
    """An asset's bytes, read once per process (2.8 MB for all four)."""
    return (package_files.files("fastapi_offline") / "static" / name).read_bytes()
