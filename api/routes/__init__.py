"""The REST routers; :data:`api_router` is everything under ``/api/v1``.

Every route but the health check goes through :func:`api.deps.authorize` (token for writes,
and for reads with ``protect_reads``), and every route refuses a repeated single-valued query
parameter (:func:`api.query.single_valued_query`).

Which routes are coroutines: FastAPI runs a plain ``def`` route in its thread pool and, after
it, validates the response in the pool again; under concurrent requests those threads and the
event loop contend for the GIL, which cost more than the work itself (``bench/api_load.py``: on
2 cores, trials-page p99 128 ms as ``def``, 81 ms as ``async def``). So the reads whose work is
bounded and index-backed (the study list, a study, a page of trials, a trial, one trial's
epochs) are ``async def`` and call the store directly, a few milliseconds on the loop each.
Writes, which may wait for the database's write lock, and reads whose cost grows with the data
(a page of learning curves, the dashboard's data, YAML downloads, the health check's migration
lookup) stay ``def``, in the pool.
"""

from __future__ import annotations

from typing import Final

from fastapi import APIRouter, Depends

from api.deps import authorize
from api.query import single_valued_query
from api.routes import service, studies, trials

API_PREFIX: Final = "/api/v1"

_protected = APIRouter(dependencies=[Depends(authorize)])
_protected.include_router(studies.router)
_protected.include_router(trials.router)
_protected.include_router(service.router)

api_router = APIRouter(prefix=API_PREFIX, dependencies=[Depends(single_valued_query)])
api_router.include_router(_protected)
api_router.include_router(service.health_router)

__all__ = ["API_PREFIX", "api_router"]
