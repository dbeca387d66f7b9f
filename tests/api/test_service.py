"""Service endpoints (tasks, health, OpenAPI), the one error body for framework errors
(unknown routes, wrong methods, crashes) and the request size limit."""

from __future__ import annotations

import gc
import json
from collections.abc import Iterator
from typing import Any

import anyio
import pytest
from starlette.types import Message, Scope

from api.app import create_app, create_server_app
from tests.api.conftest import (
    SPEC_YAML,
    STUDIES,
    TestClient,
    assert_error,
    error_message,
    make_settings,
    open_client,
)
from tuner import __version__
from tuner.settings import Settings
from tuner.store import StudyStore, migrate
from tuner.tasks import available_tasks


def test_tasks_lists_registered_names_with_their_options(client: TestClient) -> None:
    r = client.get("/api/v1/tasks")
    assert r.status_code == 200
    body = r.json()
    assert body["tasks"] == available_tasks()
    assert "digits" in body["tasks"]
    details = {d["name"]: d for d in body["details"]}
    assert list(details) == body["tasks"]
    # Each task's options: their schema (what a spec may set, with bounds) and defaults.
    digits = details["digits"]
    hidden = digits["options_schema"]["properties"]["hidden_dim"]
    assert (hidden["minimum"], hidden["maximum"]) == (8, 4096)
    assert digits["option_defaults"]["hidden_dim"] == 128
    # cifar10's data_dir has no default: it is required, and the schema says so.
    cifar = details["cifar10"]
    assert "data_dir" in cifar["options_schema"]["required"]
    assert "data_dir" not in cifar["option_defaults"]
    # The metrics each task reports, with their directions: what objective.metric may name.
    assert digits["metrics"] == {"val_accuracy": "max", "val_loss": "min"}
    assert digits["primary_metric"] == "val_accuracy"
    lm = details["tinylm"]
    assert lm["metrics"]["val_perplexity"] == "min"
    assert lm["primary_metric"] == "val_loss"


def test_health_reports_database_and_version(client: TestClient) -> None:
    r = client.get("/api/v1/health")
    assert r.status_code == 200
    assert r.json() == {
        "status": "ok",
        "version": __version__,
        "database": "ok",
        "schema_revision": migrate.head(),
    }


@pytest.mark.postgres
def test_health_is_503_on_a_postgres_database_without_the_schema(pg_url: str) -> None:
    with open_client(make_settings(pg_url)) as client:  # PostgreSQL is migrated explicitly
        r = client.get("/api/v1/health")
    assert r.status_code == 503
    assert "alembic upgrade head" in error_message(r.json(), "schema_outdated")


def test_embedded_sqlite_gets_its_schema_on_start(sqlite_url: str) -> None:
    with open_client(make_settings(sqlite_url)) as client:  # a new, empty SQLite file
        assert client.get("/api/v1/health").status_code == 200
        assert client.post(STUDIES, json={"task": "digits"}).status_code == 201


def test_health_is_503_when_the_database_is_unreachable() -> None:
    settings = make_settings("postgresql+psycopg://postgres@127.0.0.1:1/nowhere?connect_timeout=2")
    with open_client(settings) as client:
        r = client.get("/api/v1/health")
    assert r.status_code == 503
    error = assert_error(r.json(), "unavailable")
    assert "127.0.0.1" not in str(error["message"])  # no connection details leak out


def test_openapi_documents_every_endpoint_and_the_spec(client: TestClient) -> None:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    document = r.json()
    paths = document["paths"]
    expected = {
        ("post", "/api/v1/studies"),
        ("get", "/api/v1/studies"),
        ("get", "/api/v1/studies/{study_id}"),
        ("delete", "/api/v1/studies/{study_id}"),
        ("post", "/api/v1/studies/{study_id}/cancel"),
        ("get", "/api/v1/studies/{study_id}/schedule.yaml"),
        ("get", "/api/v1/studies/{study_id}/trials"),
        ("get", "/api/v1/studies/{study_id}/trials/{number}"),
        ("get", "/api/v1/studies/{study_id}/trials/{number}/metrics"),
        ("get", "/api/v1/studies/{study_id}/trials/{number}/schedule.yaml"),
        ("get", "/api/v1/studies/{study_id}/metrics"),
        ("get", "/api/v1/tasks"),
        ("get", "/api/v1/health"),
    }
    assert {(m, p) for p, ops in paths.items() for m in ops} == expected
    body = paths["/api/v1/studies"]["post"]["requestBody"]["content"]
    assert set(body) >= {"application/json", "application/yaml"}
    # Every $ref in the document resolves (the StudySpec schemas were added to components).
    schemas = document["components"]["schemas"]
    refs = set(_refs(document))
    assert "#/components/schemas/StudySpec" in refs
    for ref in refs:
        assert ref.removeprefix("#/components/schemas/") in schemas, ref
    assert "ErrorBody" in schemas


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref":
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def test_docs_page_is_served(client: TestClient) -> None:
    r = client.get("/docs")
    assert r.status_code == 200
    assert "swagger" in r.text.lower()


def test_unknown_route_and_wrong_method_have_the_error_body(client: TestClient) -> None:
    r = client.get("/api/v1/nothing-here")
    assert r.status_code == 404
    assert "/api/v1/nothing-here" in str(error_message(r.json(), "not_found"))
    r = client.put(STUDIES, content="x")
    assert r.status_code == 405
    assert_error(r.json(), "method_not_allowed")


class BrokenStore(StudyStore):
    def list_studies(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom: secret internals")


def test_crash_is_500_with_the_error_body_and_no_internals(url: str) -> None:
    with (
        BrokenStore(url) as store,
        TestClient(
            create_app(settings=make_settings(url), store=store), raise_server_exceptions=False
        ) as client,
    ):
        r = client.get(STUDIES)
    assert r.status_code == 500
    error = assert_error(r.json(), "internal_error")
    assert "secret" not in str(error["message"])


# -- request size limit ---------------------------------------------------------------------


@pytest.fixture
def small_client(url: str) -> Iterator[TestClient]:
    with open_client(make_settings(url, max_request_bytes=2000)) as c:
        yield c


def padded_spec(size: int) -> bytes:
    body = SPEC_YAML.encode()
    return body + b"#" * (size - len(body) - 1) + b"\n"


def test_body_over_the_limit_is_413_and_creates_nothing(
    small_client: TestClient, store: StudyStore
) -> None:
    r = small_client.post(STUDIES, content=padded_spec(2001), headers={"Content-Type": "text/yaml"})
    assert r.status_code == 413
    assert "2000 bytes" in str(error_message(r.json(), "request_too_large"))
    assert store.list_studies().total == 0
    r = small_client.post(STUDIES, content=padded_spec(2000), headers={"Content-Type": "text/yaml"})
    assert r.status_code == 201


def test_streamed_body_without_length_is_counted(
    small_client: TestClient, store: StudyStore
) -> None:
    def chunks() -> Iterator[bytes]:
        yield SPEC_YAML.encode()
        for _ in range(10):
            yield b"#" * 500 + b"\n"

    r = small_client.post(STUDIES, content=chunks(), headers={"Content-Type": "text/yaml"})
    assert r.status_code == 413
    assert_error(r.json(), "request_too_large")
    assert store.list_studies().total == 0


def test_declared_length_over_the_limit_is_refused_before_reading(url: str) -> None:
    """The app answers 413 without receiving a single body chunk."""
    app = create_app(settings=make_settings(url, max_request_bytes=1000))
    received: list[object] = []
    sent: list[Message] = []

    async def receive() -> Message:
        received.append(True)
        return {"type": "http.request", "body": b"x" * 1000, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    scope: Scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": STUDIES,
        "raw_path": STUDIES.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-length", str(10**9).encode()), (b"host", b"test")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    anyio.run(app, scope, receive, send)
    assert received == []
    assert sent[0]["status"] == 413
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert json.loads(body)["error"]["code"] == "request_too_large"


def test_the_server_app_serves_with_its_startup_heap_frozen(sqlite_url: str) -> None:
    gc.unfreeze()
    try:
        app = create_server_app(Settings(database_url=sqlite_url))
        # What the process built so far is out of the collector's view (full collections
        # would walk it all, tens of milliseconds in which no request is answered).
        assert gc.get_freeze_count() > 10_000
    finally:
        gc.unfreeze()
    with TestClient(app) as client:
        assert client.get("/api/v1/health").json()["database"] == "ok"
        assert client.get("/api/v1/studies").json()["total"] == 0
