"""Bearer-token auth: with tokens configured every write needs one (every write route of the
app is checked, discovered from ``app.routes``); reads are open unless ``protect_reads``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.routing import iter_route_contexts
from httpx import Response

from api.app import create_app
from api.auth import WRITE_METHODS, token_matches
from tests.api.conftest import (
    SPEC_YAML,
    STUDIES,
    TestClient,
    assert_error,
    make_settings,
    new_study,
    open_client,
)
from tuner.settings import Settings
from tuner.store import StudyStore

TOKEN = "s3cret-token"
OTHER = "second-token"

# How to make each write route succeed: (method, path template) -> call(client, study_id, auth).
# A write route missing here fails test_every_write_route_is_covered, so none escapes the
# auth checks below.
WriteCall = Callable[[TestClient, int, dict[str, str]], Response]
WRITES: dict[tuple[str, str], tuple[WriteCall, int]] = {
    ("POST", "/api/v1/studies"): (
        lambda c, _, h: c.post(
            STUDIES, content=SPEC_YAML, headers={**h, "Content-Type": "text/yaml"}
        ),
        201,
    ),
    ("POST", "/api/v1/studies/{study_id}/cancel"): (
        lambda c, sid, h: c.post(f"{STUDIES}/{sid}/cancel", headers=h),
        200,
    ),
    ("DELETE", "/api/v1/studies/{study_id}"): (
        lambda c, sid, h: c.delete(f"{STUDIES}/{sid}", headers=h),
        204,
    ),
}


def write_routes(settings: Settings) -> set[tuple[str, str]]:
    app = create_app(settings=settings)
    found = set()
    for route in iter_route_contexts(app.routes):  # included routers are nested in app.routes
        assert route.path is not None
        for method in (route.methods or set()) & WRITE_METHODS:
            found.add((method, route.path))
    return found


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def assert_401(r: Response) -> None:
    assert r.status_code == 401, r.text
    assert r.headers["WWW-Authenticate"].startswith("Bearer")
    assert_error(r.json(), "unauthorized")


def test_every_write_route_is_covered(url: str) -> None:
    assert write_routes(make_settings(url, tokens=[TOKEN])) == set(WRITES)


@pytest.mark.parametrize("route", sorted(WRITES))
def test_writes_need_a_valid_token(url: str, store: StudyStore, route: tuple[str, str]) -> None:
    call, ok_status = WRITES[route]
    study_id = new_study(store)
    with open_client(make_settings(url, tokens=[TOKEN, OTHER])) as client:
        assert_401(call(client, study_id, {}))
        assert_401(call(client, study_id, bearer("wrong")))
        assert_401(call(client, study_id, bearer(TOKEN + "x")))
        assert_401(call(client, study_id, {"Authorization": f"Basic {TOKEN}"}))
        assert_401(call(client, study_id, {"Authorization": TOKEN}))
        # Nothing happened: the study is still there and queued, no other study was created.
        assert store.get_study(study_id).status == "queued"
        assert store.list_studies().total == 1

        r = call(client, study_id, bearer(OTHER if route[0] == "DELETE" else TOKEN))
        assert r.status_code == ok_status, r.text


def test_reads_are_open_unless_protected(url: str, store: StudyStore) -> None:
    study_id = new_study(store)
    reads = [STUDIES, f"{STUDIES}/{study_id}", f"{STUDIES}/{study_id}/trials", "/api/v1/tasks"]
    with open_client(make_settings(url, tokens=[TOKEN])) as client:
        for path in reads:
            assert client.get(path).status_code == 200, path
    with open_client(make_settings(url, tokens=[TOKEN], protect_reads=True)) as client:
        for path in reads:
            assert_401(client.get(path))
            assert client.get(path, headers=bearer(TOKEN)).status_code == 200, path
        # Probes need no token.
        assert client.get("/api/v1/health").status_code == 200


def test_no_token_configured_means_open_api(client: TestClient) -> None:
    r = client.post(STUDIES, content=SPEC_YAML, headers={"Content-Type": "text/yaml"})
    assert r.status_code == 201


def test_tokens_come_from_the_environment(monkeypatch: pytest.MonkeyPatch, url: str) -> None:
    monkeypatch.setenv("STAGETUNE_API_TOKENS", f" {TOKEN} , {OTHER} ")
    monkeypatch.setenv("STAGETUNE_API_TOKEN", "single")
    monkeypatch.setenv("STAGETUNE_DATABASE_URL", url)
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    with open_client(settings) as client:
        for token in (TOKEN, OTHER, "single"):
            r = client.post(f"{STUDIES}", content="task: digits\n", headers=bearer(token))
            assert r.status_code == 201, token
        assert_401(client.post(STUDIES, content="task: digits\n"))


def test_token_comparison() -> None:
    assert token_matches("abc", ["x", "abc"])
    assert not token_matches("abc", [])
    assert not token_matches("ab", ["abc"])
    assert not token_matches("abcd", ["abc"])
    assert not token_matches("", ["abc"])


def secured_operations(document: dict[str, Any]) -> set[str]:
    return {
        f"{method.upper()} {path}"
        for path, item in document["paths"].items()
        for method, operation in item.items()
        if isinstance(operation, dict) and operation.get("security")
    }


@pytest.mark.parametrize(
    ("tokens", "protect_reads", "secured"),
    [
        pytest.param(None, False, "none", id="open"),
        pytest.param([TOKEN], False, "writes", id="tokens"),
        pytest.param([TOKEN], True, "all", id="tokens-protect-reads"),
    ],
)
def test_openapi_declares_the_auth_the_server_asks_for(
    url: str, tokens: list[str] | None, protect_reads: bool, secured: str
) -> None:
    """A generated client or /docs' "Authorize" button asks for a token exactly where one is
    needed: nowhere on an open server, on writes, or on every API route with protected reads."""
    settings = make_settings(url, tokens=tokens, protect_reads=protect_reads)
    with open_client(settings) as client:
        document = client.get("/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"}).json()
    operations = secured_operations(document)
    writes = {f"{method} {path}" for method, path in write_routes(settings)}
    if secured == "none":
        assert operations == set()
        assert "securitySchemes" not in document.get("components", {})
        return
    schemes = document["components"]["securitySchemes"]
    assert [(s["type"], s["scheme"]) for s in schemes.values()] == [("http", "bearer")]
    if secured == "writes":
        assert operations == writes
    else:
        assert writes < operations
        assert "GET /api/v1/studies" in operations
