"""The application factory: ``create_app(settings=None, store=None) -> FastAPI``.

A server process builds it with :func:`create_server_app` (``stagetune serve``, or
``uvicorn --factory api.app:create_server_app``), with settings from the environment. The
app keeps its settings and store on ``app.state`` (see :mod:`api.deps`). A store the app
creates itself is closed on shutdown, and on SQLite (the embedded default) its schema is
created or upgraded on start-up; a PostgreSQL database is migrated explicitly
(``alembic upgrade head``). A store passed in belongs to the caller.
"""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from api.dashboard import router as dashboard_router
from api.errors import install_error_handlers
from api.limits import BodySizeLimitMiddleware
from api.openapi import install_openapi
from api.routes import API_PREFIX, api_router
from tuner import __version__
from tuner.settings import Settings, get_settings
from tuner.store import StudyStore
from tuner.store.engine import is_sqlite

DESCRIPTION = (
    "Auto-tune variable batch-size schedules for data-parallel PyTorch training. "
    f"The REST API lives under `{API_PREFIX}`. When tokens are configured, writes (and, with "
    "protect_reads, reads) need `Authorization: Bearer <token>`. Every error has the body "
    '`{"error": {"code": ..., "message": ..., "details": [...]}}`.'
)


def create_app(settings: Settings | None = None, store: StudyStore | None = None) -> FastAPI:
    """Build the stagetune web app (REST API, OpenAPI docs at ``/docs``)."""
    settings = settings or get_settings()
    owns_store = store is None
    app_store = store or StudyStore(settings.resolved_database_url)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if owns_store and is_sqlite(app_store.url):
            await run_in_threadpool(app_store.ensure_schema)
        try:
            yield
        finally:
            if owns_store:
                app_store.close()

    app = FastAPI(
        title="stagetune",
        version=__version__,
        description=DESCRIPTION,
        docs_url="/docs",
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.store = app_store

    install_error_handlers(app)
    app.add_middleware(BodySizeLimitMiddleware, max_bytes=settings.max_request_bytes)
    install_openapi(app, settings)

    # Routers. Others (the dashboard) are included here the same way.
    app.include_router(api_router)
    app.include_router(dashboard_router)
    return app


def create_server_app(settings: Settings | None = None) -> FastAPI:
    """:func:`create_app` for a process that does nothing but serve it (``stagetune serve``,
    ``uvicorn --factory api.app:create_server_app``).

    The objects built until then (modules, routes, schemas: some 130,000) live as long as
    the process, so they are moved out of the garbage collector's view (:func:`gc.freeze`).
    Otherwise every full collection walks them all, about 50 ms in which no request is
    answered; at 8 concurrent clients those pauses made most of the p99 of
    ``bench/api_load.py``. Full collections then take 3-6 ms.
    """
    app = create_app(settings)
    gc.collect()
    gc.freeze()
    return app
