"""The REST routers' dependencies as coroutines.

FastAPI runs a plain ``def`` dependency in the thread pool: a round trip between the event
loop and a worker thread (and a GIL hand-over each way) per dependency per request, which
cost ~1 ms of CPU a request under load. These wrappers call :mod:`api.deps`, which neither
blocks nor does I/O, directly on the event loop; the policy stays there.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from api.deps import Credentials, authorize, get_app_settings, get_store
from tuner.store import StudyStore


async def authorized(request: Request, credentials: Credentials) -> None:
    """:func:`api.deps.authorize` for the REST routes."""
    authorize(request, get_app_settings(request), credentials)


async def store_of(request: Request) -> StudyStore:
    """:func:`api.deps.get_store`: the app's store."""
    return get_store(request)


StoreDep = Annotated[StudyStore, Depends(store_of)]
