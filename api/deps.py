"""The dependencies every router uses, as ``Annotated`` aliases.

``create_app`` puts the settings and the store on ``app.state``; the dependencies below read
them from there, so each app instance (tests build several) has its own.

* ``SettingsDep``: the :class:`~tuner.settings.Settings` of the app.
* ``StoreDep``: the app's :class:`~tuner.store.StudyStore`.
* ``Authorized``: the token check for this request's method (writes always when tokens are set,
  reads only with ``protect_reads``). The REST router applies it to every route; other routers
  (the dashboard) add it the same way: ``APIRouter(dependencies=[Depends(authorize)])``.
* ``WriteAuth``: the token check for a write, whatever the method (for endpoints that change
  state through a GET-less form, say).

They are coroutines although nothing in them waits: FastAPI runs a plain ``def`` dependency in
the thread pool, a round trip between the event loop and a worker thread per dependency per
request (about 1 ms of CPU a request under load). None of them blocks or does I/O.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials

from api.auth import bearer_scheme, check_credentials, needs_token
from tuner.settings import Settings
from tuner.store import StudyStore


async def get_app_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_store(request: Request) -> StudyStore:
    store: StudyStore = request.app.state.store
    return store


SettingsDep = Annotated[Settings, Depends(get_app_settings)]
StoreDep = Annotated[StudyStore, Depends(get_store)]
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


async def authorize(request: Request, settings: SettingsDep, credentials: Credentials) -> None:
    """Require a valid bearer token if this request's method needs one (see :mod:`api.auth`)."""
    if needs_token(settings, request.method):
        check_credentials(settings, credentials)


async def authorize_write(settings: SettingsDep, credentials: Credentials) -> None:
    """Require a valid bearer token whenever tokens are configured."""
    if settings.tokens:
        check_credentials(settings, credentials)


Authorized = Annotated[None, Depends(authorize)]
WriteAuth = Annotated[None, Depends(authorize_write)]
