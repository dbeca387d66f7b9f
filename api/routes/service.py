"""Service endpoints: the task catalogue and the health check."""

from __future__ import annotations

import logging
from functools import lru_cache

from fastapi import APIRouter
from fastapi.encoders import jsonable_encoder

from api.deps import StoreDep
from api.errors import ApiError
from api.schemas import HealthOut, TaskInfo, TasksOut, error_responses
from tuner import __version__
from tuner.store import migrate
from tuner.tasks import available_tasks, metric_declaration, options_model

log = logging.getLogger(__name__)

router = APIRouter(tags=["service"])
health_router = APIRouter(tags=["service"])


@router.get(
    "/tasks", response_model=TasksOut, summary="Registered tasks", responses=error_responses(401)
)
def list_tasks() -> TasksOut:
    """The task names a study spec may use (read from package metadata), each with the JSON
    schema and defaults of its `task_options` and the validation metrics it reports (from the
    options models tasks publish, which import neither torch nor the task's code)."""
    names = available_tasks()
    return TasksOut(tasks=names, details=[_task_info(name) for name in names])


@lru_cache(maxsize=64)
def _task_info(name: str) -> TaskInfo:
    model = options_model(name)
    metrics, primary = metric_declaration(name, model)
    if model is None:
        return TaskInfo(
            name=name,
            options_schema=None,
            option_defaults={},
            metrics=metrics,
            primary_metric=primary,
        )
    defaults = {
        key: field.get_default(call_default_factory=True)
        for key, field in model.model_fields.items()
        if not field.is_required()
    }
    return TaskInfo(
        name=name,
        options_schema=model.model_json_schema(),
        option_defaults=jsonable_encoder(defaults),
        metrics=metrics,
        primary_metric=primary,
    )


@lru_cache(maxsize=1)
def _schema_head() -> str:
    return migrate.head()


@health_router.get(
    "/health",
    response_model=HealthOut,
    summary="Health check",
    responses=error_responses(503),
)
def health(store: StoreDep) -> HealthOut:
    """200 when the database answers and its schema is current; 503 (error body) otherwise.
    Never needs a token."""
    try:
        revision = migrate.current(store.url)
    except Exception as exc:  # any failure to reach the database is "unreachable"
        log.warning("health check: database unreachable: %s", exc)
        raise ApiError(503, "the database is unreachable", code="unavailable") from None
    newest = _schema_head()
    if revision != newest:
        where = "has no stagetune schema" if revision is None else f"is at revision {revision}"
        raise ApiError(
            503,
            f"the database {where}, but this stagetune needs {newest}; run `alembic upgrade "
            "head` (or `deploy/stagetune-role migrate`) with STAGETUNE_DATABASE_URL set",
            code="schema_outdated",
        )
    return HealthOut(status="ok", version=__version__, database="ok", schema_revision=revision)
