"""Who may see the dashboard and who may act on it.

- ``admin``: ``api.admin_key``; sees everything and may act;
- ``viewer``: ``dashboard.viewer_key`` when set; sees everything, may not act.

The page's login form keeps the key in ``sessionStorage`` and sends it as
``X-API-Key`` (``Authorization: Bearer`` works too) with every call, plus the
operator's self-declared name in ``X-Operator`` for the audit log; the key
decides the role, the name only labels it. A missing or wrong key is a 401
(:class:`~feature_store.errors.Unauthorized`), a viewer's action a 403.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Request, Security
from fastapi.security import HTTPAuthorizationCredentials

from app.auth import API_KEY_HEADER, BEARER
from feature_store.errors import Forbidden, Unauthorized
from feature_store.settings import Settings

Role = Literal["admin", "viewer"]

_NAME = re.compile(r"[^A-Za-z0-9 ._@-]")


@dataclass(frozen=True)
class Operator:
    role: Role
    name: str
    """Self-declared name from ``X-Operator`` (or the role), for the audit log."""
    address: str

    @property
    def label(self) -> str:
        return f"{self.name} ({self.role})"


def _same(given: str, key: str) -> bool:
    return secrets.compare_digest(given.encode(), key.encode())


def role_of(key: str | None, settings: Settings) -> Role:
    """The role ``key`` grants; raises :class:`Unauthorized` when it grants none."""
    if not key:
        raise Unauthorized("the dashboard needs the admin key or the viewer key")
    if _same(key, settings.api.admin_key.get_secret_value()):
        return "admin"
    viewer = settings.dashboard.viewer_key
    if viewer is not None and _same(key, viewer.get_secret_value()):
        return "viewer"
    raise Unauthorized("this key does not open the dashboard")


KeyHeader = Annotated[str | None, Security(API_KEY_HEADER)]
BearerHeader = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


def viewer(request: Request, api_key: KeyHeader, bearer: BearerHeader) -> Operator:
    """Dependency: any dashboard role."""
    key = api_key or (bearer.credentials if bearer is not None else None)
    role = role_of(key, request.app.state.settings)
    name = _NAME.sub("", request.headers.get("X-Operator", ""))[:64].strip() or role
    address = request.client.host if request.client else "-"
    return Operator(role, name, address)


def admin(request: Request, api_key: KeyHeader, bearer: BearerHeader) -> Operator:
    """Dependency: the admin role only."""
    operator = viewer(request, api_key, bearer)
    if operator.role != "admin":
        raise Forbidden("the viewer key cannot act; log in with the admin key")
    return operator
