"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from app.service import Service
from feature_store.errors import BackendUnavailable


async def get_service(request: Request) -> Service:
    """The app's :class:`Service` (set by the lifespan). Async: no thread-pool hop."""
    service: Service | None = getattr(request.app.state, "service", None)
    if service is None:
        raise BackendUnavailable("the service is starting or stopping")
    return service


ServiceDep = Annotated[Service, Depends(get_service)]
"""A route parameter receiving the app's :class:`Service`."""


async def raw_body(request: Request) -> bytes:
    """The request's body as sent (Starlette keeps it: FastAPI parses the same bytes)."""
    return await request.body()


RawBody = Annotated[bytes, Depends(raw_body)]
"""A route parameter receiving the raw body (to find keys given twice)."""
