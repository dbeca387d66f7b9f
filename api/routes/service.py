"""Service endpoints: the task catalogue and the health check."""

from __future__ import annotations

import logging

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import StoreDep
from api.errors import ApiError
from api.schemas import HealthOut, TasksOut, error_responses
from tuner import __version__
from tuner.tasks import available_tasks

log = logging.getLogger(__name__)

router = APIRouter(tags=["service"])
health_router = APIRouter(tags=["service"])


@router.get(
    "/tasks", response_model=TasksOut, summary="Registered tasks", responses=error_responses(401)
)
def list_tasks() -> TasksOut:
    """The task names a study spec may use (read from package metadata; nothing is imported)."""
    return TasksOut(tasks=available_tasks())


@health_router.get(
    "/health",
    response_model=HealthOut,
    summary="Health check",
    responses=error_responses(503),
)
def health(store: StoreDep) -> HealthOut:
    """200 when the database answers, 503 (error body) otherwise. Never needs a token."""
    try:
        with store.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure to reach the database is "unreachable"
        log.warning("health check: database unreachable: %s", exc)
        raise ApiError(503, "the database is unreachable", code="unavailable") from None
    return HealthOut(status="ok", version=__version__, database="ok")
