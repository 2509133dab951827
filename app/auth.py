"""API keys: who may write, administer, and (optionally) read.

Three roles, checked by FastAPI dependencies on each route:

- ``write`` (``POST /v1/events``, ``PUT /v1/videos``): ``api.api_key`` or the admin key;
- ``admin`` (hide, unhide): ``api.admin_key`` only;
- ``read`` (recommend, ``GET /v1/videos``, status): open unless ``api.read_key`` is
  set, then that key or any stronger one.

A key travels as ``X-API-Key: <key>`` or ``Authorization: Bearer <key>``.
Comparisons are constant-time. Health, readiness and metrics stay open (they
are for the orchestrator and the scraper).
"""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from fastapi import Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer

from feature_store.errors import Unauthorized
from feature_store.settings import ApiSettings

Role = Literal["read", "write", "admin"]

_api_key_header = APIKeyHeader(name="X-API-Key", auto_error=False)
_bearer = HTTPBearer(auto_error=False)


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


def require(role: Role) -> Callable[..., Awaitable[None]]:
    """A dependency that raises :class:`Unauthorized` without a key granting ``role``."""

    async def check(
        request: Request,
        api_key: Annotated[str | None, Security(_api_key_header)],
        bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
    ) -> None:
        settings: ApiSettings = request.app.state.settings.api
        allowed = _keys_for(role, settings)
        if allowed is None:
            return
        given = api_key or (bearer.credentials if bearer is not None else None)
        if given is None:
            raise Unauthorized(f"{role} access needs an API key (X-API-Key or Bearer)")
        if not any(secrets.compare_digest(given.encode(), key.encode()) for key in allowed):
            raise Unauthorized(f"this API key does not grant {role} access")

    return check
