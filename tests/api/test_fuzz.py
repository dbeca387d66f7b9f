"""Property-based fuzzing of the whole REST API from its own OpenAPI document (schemathesis):
whatever a client sends, the API answers with a documented status, never a 500, and a body
matching the documented schema (the one error shape included)."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from tests.api.conftest import make_settings, seed_running_study
from tuner.store import StudyStore
from tuner.store.migrate import upgrade

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]

_DB_DIR = tempfile.TemporaryDirectory(prefix="stagetune-fuzz-")
DB_URL = f"sqlite:///{Path(_DB_DIR.name) / 'fuzz.db'}"
APP = create_app(settings=make_settings(DB_URL))
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@pytest.fixture(scope="module", autouse=True)
def seeded_database() -> Iterator[None]:
    upgrade(DB_URL)
    with StudyStore(DB_URL) as store:
        seed_running_study(store)  # study 1 with trials 0-3, so paths can hit real data
    yield
    APP.state.store.close()
    _DB_DIR.cleanup()


@pytest.mark.slow
@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_api_conforms_to_its_openapi(case: Any) -> None:
    case.call_and_validate(checks=CHECKS)
