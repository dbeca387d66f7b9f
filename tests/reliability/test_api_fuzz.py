"""Fuzzing the REST API from its own OpenAPI document (schemathesis), on SQLite and PostgreSQL.

Every operation the app documents is driven with generated requests in three modes:

* ``positive``: requests valid against the schema (path ids mostly point nowhere: 404s);
* ``negative``: requests that violate the schema (wrong types, out-of-range ids, bad enums,
  malformed bodies): they must be rejected with a 4xx;
* ``seeded``: valid requests whose path parameters are pinned to a seeded study and trial, so
  real data (a running study with completed, diverged and running trials and their metrics)
  goes through the response models.

Checks on every response: no 5xx, the status code is documented for the operation, the
content type is the documented one, the body matches the documented schema (error bodies
included), documented headers conform, and (negative mode) schema-violating data is rejected.
The app runs with a token configured and every generated request carries it, so auth is not
what rejects the requests; the auth rules themselves are tested in ``test_bad_input.py``.

Budget: ``CASES`` generated cases per operation and mode (at least 100), on each backend.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import schemathesis
from fastapi import FastAPI
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from api.app import create_app
from tests.reliability.helpers import SeededStudy, api_settings, seed_study
from tuner.settings import Settings
from tuner.store import StudyStore

CASES = 100
TOKEN = "fuzz-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
    negative_data_rejection,
]

#: Operations whose documentation is known to be wrong, with the fix the owner must make.
#: Each entry marks the affected modes xfail(strict=True): the test fails once it is fixed,
#: and the entry must then be removed.
KNOWN_DOC_BUGS: dict[str, str] = {}


def _documented_operations() -> list[tuple[str, str, bool, bool]]:
    """(method, path, has path parameters, has any input) of every documented operation."""
    app = create_app(settings=Settings(_env_file=None, database_url="sqlite://"))  # type: ignore[call-arg]
    try:
        document: dict[str, Any] = app.openapi()
    finally:
        app.state.store.close()
    found = []
    for path, item in document["paths"].items():
        for method, operation in item.items():
            params = operation.get("parameters", [])
            has_path = any(p["in"] == "path" for p in params)
            has_input = bool(params) or "requestBody" in operation
            found.append((method.upper(), path, has_path, has_input))
    return sorted(found, key=lambda t: (t[1], t[0]))


def _cases() -> Iterator[Any]:
    for method, path, has_path, has_input in _documented_operations():
        label = f"{method} {path}"
        modes = ["positive"]
        if has_input:
            modes.append("negative")
        if has_path:
            modes.append("seeded")
        for mode in modes:
            marks = []
            if label in KNOWN_DOC_BUGS and mode != "negative":
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_DOC_BUGS[label]))
            yield pytest.param(method, path, mode, id=f"{label} {mode}", marks=marks)


@dataclass
class Target:
    app: FastAPI
    store: StudyStore
    seeded: SeededStudy


@pytest.fixture(scope="module")
def target(module_db_url: str) -> Iterator[Target]:
    """The app on a fresh database holding one seeded running study (and a token configured).

    One database per backend for the whole module: the fuzzer's writes (new queued studies,
    cancels, deletes) cannot remove the seeded study, which is running (delete is refused).
    """
    with StudyStore(module_db_url) as store:
        seeded = seed_study(store, trials=4, epochs=3)
        app = create_app(settings=api_settings(module_db_url, tokens=[TOKEN]), store=store)
        yield Target(app, store, seeded)


@pytest.mark.parametrize(("method", "path", "mode"), list(_cases()))
def test_operation_conforms_to_its_schema(
    target: Target, method: str, path: str, mode: str
) -> None:
    schema = schemathesis.openapi.from_asgi("/openapi.json", target.app)
    operation = schema[path][method]
    path_parameters: dict[str, Any] | None = None
    if mode == "seeded":
        path_parameters = {}
        if "{study_id}" in path:
            path_parameters["study_id"] = target.seeded.study_id
        if "{number}" in path:
            # A finished trial: its schedule can be downloaded and its metrics are complete.
            path_parameters["number"] = 0
    strategy = operation.as_strategy(
        generation_mode=GenerationMode.NEGATIVE if mode == "negative" else GenerationMode.POSITIVE,
        headers=dict(AUTH),
        path_parameters=path_parameters,
    )
    statuses: Counter[int] = Counter()

    @settings(
        max_examples=CASES,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(case=strategy)
    def fuzz(case: schemathesis.Case[Any]) -> None:
        response = case.call_and_validate(checks=CHECKS)
        statuses[response.status_code] += 1

    started = time.monotonic()
    fuzz()
    elapsed = time.monotonic() - started
    total = sum(statuses.values())
    print(f"{method} {path} [{mode}]: {total} cases in {elapsed:.1f} s, {dict(statuses)}")
    assert statuses, "no request was sent"
    if mode == "seeded" and method == "GET":
        # The pinned ids exist, so real data must have gone through the response model.
        assert any(200 <= s < 300 for s in statuses), dict(statuses)
