"""API keys: who may write, administer, and (optionally) read.

Three roles, checked by FastAPI dependencies on each route:

- ``write`` (``POST /v1/events``, ``PUT /v1/videos``): ``api.api_key`` or the admin key;
- ``admin`` (hide, unhide): ``api.admin_key`` only;
- ``read`` (recommend, ``GET /v1/videos``, status): open unless ``api.read_key`` is
  set, then that key or any stronger one.

A key travels as ``X-API-Key: <key>`` or ``Authorization: Bearer <key>``.
Comparisons are constant-time. Health, readiness and metrics stay open (they
are for the orchestrator and the scraper). The OpenAPI document declares a
key exactly where one is asked for (:mod:`app.openapi` reads the role of
each route's :class:`RoleCheck`).
"""

from __future__ import annotations

import secrets
from typing import Annotated, Literal

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from feature_store.errors import Unauthorized
from feature_store.settings import ApiSettings

Role = Literal["read", "write", "admin"]

API_KEY_HEADER = APIKeyHeader(
    name="X-API-Key", scheme_name="ApiKey", auto_error=False,
    description="A key as `X-API-Key: <key>`. Which key a route takes: its description.",
)
BEARER = HTTPBearer(
    scheme_name="Bearer", auto_error=False,
    description="The same key as `Authorization: Bearer <key>`.",
)
"""The two ways a key travels; FastAPI declares them on every route that reads them,
and :mod:`app.openapi` removes them from reads that need no key."""


def _keys_for(role: Role, settings: ApiSettings) -> list[str] | None:
    """Keys that grant ``role``; None when the role needs no key."""
    admin = settings.admin_key.get_secret_value()
    write = settings.api_key.get_secret_value()
    if role == "admin":
        return [admin]
    if role == "write":
        return [write, admin]
    if settings.read_key is None:
        return None
    return [settings.read_key.get_secret_value(), write, admin]


class RoleCheck:
    """A route dependency that raises :class:`Unauthorized` without a key granting ``role``.

    A class rather than a closure so that the OpenAPI document
    (:mod:`app.openapi`) can read which role a route needs and declare its
    security only where a key is actually asked for.
    """

    def __init__(self, role: Role) -> None:
        self.role = role

    def needs_key(self, settings: ApiSettings) -> bool:
        """Whether, under ``settings``, this role needs a key at all."""
        return _keys_for(self.role, settings) is not None

    async def __call__(
        self,
        request: Request,
        api_key: Annotated[str | None, Security(API_KEY_HEADER)],
        bearer: Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)],
    ) -> None:
        settings: ApiSettings = request.app.state.settings.api
        allowed = _keys_for(self.role, settings)
        if allowed is None:
            return
        given = api_key or (bearer.credentials if bearer is not None else None)
        if given is None:
            raise Unauthorized(f"{self.role} access needs an API key (X-API-Key or Bearer)")
        if not any(secrets.compare_digest(given.encode(), key.encode()) for key in allowed):
            raise Unauthorized(f"this API key does not grant {self.role} access")


def require(role: Role) -> RoleCheck:
    """The dependency checking ``role`` (``dependencies=[Depends(require("write"))]``)."""
    return RoleCheck(role)
