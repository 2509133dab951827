"""The operators' dashboard at ``/dashboard`` (see :mod:`app.dashboard.router`)."""

from app.dashboard.router import router

__all__ = ["router"]
