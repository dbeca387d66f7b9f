"""The REST routers; :data:`api_router` is everything under ``/api/v1``.

Every route but the health check goes through :func:`api.deps.authorize` (token for writes,
and for reads with ``protect_reads``).
"""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, Depends

from api.deps import authorize
from api.routes import service, studies, trials

API_PREFIX: Final = "/api/v1"

_protected = APIRouter(dependencies=[Depends(authorize)])
_protected.include_router(studies.router)
_protected.include_router(trials.router)
_protected.include_router(service.router)

api_router = APIRouter(prefix=API_PREFIX)
api_router.include_router(_protected)
api_router.include_router(service.health_router)

__all__ = ["API_PREFIX", "api_router"]
