"""Hostile or careless input to the REST API: every bad request gets a 4xx with a clear message
(the JSON error body naming the field or the problem), fast, and writes nothing (row counts of
every stagetune table before and after). On SQLite and on PostgreSQL.

Also: with a token configured, no write route (discovered from the app's routes, so a new one
is covered the day it lands) is reachable without it, a wrong one, or a malformed header.

Path policy (see docs/reliability.md): a task is named, never located: task names are checked
against the registered ones. Task options are checked at submission against the options model
the task publishes (unknown options are a 422). Path-valued task options (cifar10 ``data_dir``)
must not let an API user make a worker read arbitrary paths: the API refuses, with a 422 naming
the option, a path that leaves the server's datasets root (``STAGETUNE_DATASETS_DIR``): an
absolute path outside it, ``..``, ``~``, URLs, NUL bytes, a symlink inside the root pointing
out; a relative path inside the root, or an absolute one, is accepted. Free-text fields (study
name, owner) are labels only: never used as paths, so path-like text is stored as text.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from api.app import create_app
from api.spec_input import MAX_NESTING
from tests.reliability.helpers import (
    SPEC,
    STUDIES,
    api_server,
    api_settings,
    row_counts,
    seed_study,
)
from tuner.settings import get_settings
from tuner.spec import MAX_SPEC_CHARS
from tuner.store import StudyStore

with warnings.catch_warnings():
    # starlette suggests the httpx2 package, which this project does not install.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

YAML = "application/yaml"
JSON = "application/json"
TOKEN = "rel-token-0123456789"
SLOW_S = 6.0
"""Most CPU time (this process's, ``time.process_time``: the app runs in it) that answering
any rejected request may take. A guard against pathological parsing (10-40 s before the
spec-input fix), not a speed target: about 1 s here when quiet. CPU time, not wall time: `make
test` runs these tests at idle priority beside the training tests, and one such run took 9.8 s
of wall time for the largest body while it waited for a CPU."""


@dataclass(frozen=True)
class Bad:
    id: str
    body: bytes
    content_type: str | None = YAML
    status: int = 422
    mentions: str = ""
    """Text the error message must contain (case-insensitive): the field or the problem."""
    query: dict[str, str] = field(default_factory=dict)
    xfail: str | None = None


def y(text: str) -> bytes:
    return text.encode()


def j(value: Any) -> bytes:
    return json.dumps(value).encode()


def spec(**kw: Any) -> dict[str, Any]:
    return {"task": "digits", **kw}


def nested(depth: int, inner: Any) -> Any:
    """``inner`` inside ``depth`` levels of lists."""
    for _ in range(depth):
        inner = [inner]
    return inner


DEEP = f"at most {MAX_NESTING} levels"


BAD: list[Bad] = [
    # malformed documents
    Bad("yaml-syntax", y("task: digits\n  bad: ["), mentions="not valid YAML"),
    Bad("yaml-two-documents", y("task: digits\n---\ntask: mnist1d\n"), mentions="YAML"),
    Bad("yaml-list", y("- task: digits\n"), mentions="mapping"),
    Bad("yaml-scalar", y("digits"), mentions="mapping"),
    Bad("yaml-python-tag", y("!!python/object/apply:os.system ['true']"), mentions="YAML"),
    Bad("yaml-alias", y("a: &x [1, 2]\nb: *x\ntask: digits\n"), mentions="alias"),
    Bad("json-syntax", b'{"task": "digits",', JSON, mentions="not valid JSON"),
    Bad("json-array", b'["digits"]', JSON, mentions="mapping"),
    Bad("empty", b"", mentions="empty"),
    Bad("whitespace", b"  \n\t", mentions="empty"),
    Bad("not-utf8", b"task: digits\nname: \xff\xfe", mentions="UTF-8"),
    Bad("xml", y("<task>digits</task>"), "application/xml", 415, "Content-Type"),
    Bad("form", y("task=digits"), "application/x-www-form-urlencoded", 415, "Content-Type"),
    # wrong types
    Bad("task-list", y("task: [digits]"), mentions="task"),
    Bad("task-number", j({"task": 7}), JSON, mentions="task"),
    Bad("trials-text", y("task: digits\nbudget: {trials: many}"), mentions="budget.trials"),
    Bad(
        "trials-json-bool",
        j(spec(baselines=False, budget={"trials": True})),
        JSON,
        mentions="budget.trials",
    ),
    Bad(
        "trials-yaml-bool",
        y("task: digits\nbaselines: false\nbudget: {trials: yes}"),
        mentions="budget.trials",
    ),
    Bad("seed-float", j(spec(seed=1.5)), JSON, mentions="seed"),
    Bad("name-mapping", y("task: digits\nname: {a: 1}"), mentions="name"),
    Bad("name-date", y("task: digits\nname: 2020-01-01"), mentions="name"),
    Bad("epochs-text", y("task: digits\nschedule: {total_epochs: ten}"), mentions="total_epochs"),
    Bad("workers-list", y("task: digits\nresources: {workers: [1]}"), mentions="workers"),
    Bad("objective-kind", y("task: digits\nobjective: {kind: fastest}"), mentions="objective"),
    Bad("unknown-field", y("task: digits\nschedul: {total_epochs: 3}"), mentions="schedul"),
    Bad(
        "options-binary",
        y("task: digits\ntask_options: {x: !!binary aGk=}"),
        mentions="task_options",
    ),
    Bad("options-key-int", y("task: digits\ntask_options: {1: 2}"), mentions="task_options"),
    # absurd values
    Bad(
        "epochs-1e12",
        y("task: digits\nschedule: {total_epochs: 1000000000000}"),
        mentions="total_epochs",
    ),
    Bad("batch-0", y("task: digits\nspace: {batch_size: {min: 0}}"), mentions="batch_size.min"),
    Bad(
        "base-batch-0",
        y("task: digits\nschedule: {base_batch_size: 0}"),
        mentions="base_batch_size",
    ),
    Bad(
        "batch-2^40",
        y(f"task: digits\nspace: {{batch_size: {{max: {2**40}}}}}"),
        mentions="batch_size.max",
    ),
    Bad("lr-negative", y("task: digits\nschedule: {base_lr: -0.1}"), mentions="base_lr"),
    Bad("lr-zero", y("task: digits\nschedule: {base_lr: 0}"), mentions="base_lr"),
    Bad("lr-nan", y("task: digits\nschedule: {base_lr: .nan}"), mentions="base_lr"),
    Bad("lr-inf", y("task: digits\nschedule: {base_lr: .inf}"), mentions="base_lr"),
    Bad("lr-1e300", j(spec(schedule={"base_lr": 1e300})), JSON, mentions="base_lr"),
    Bad(
        "stages-1e6", y("task: digits\nspace: {stages: {min: 1, max: 1000000}}"), mentions="stages"
    ),
    Bad(
        "trials-1e12", y("task: digits\nbudget: {trials: 1000000000000}"), mentions="budget.trials"
    ),
    Bad("trials-0", y("task: digits\nbudget: {trials: 0}"), mentions="budget.trials"),
    Bad("workers-1e6", y("task: digits\nresources: {workers: 1000000}"), mentions="workers"),
    Bad("seed-1e30", j(spec(seed=10**30)), JSON, mentions="seed"),
    Bad("seed-negative", j(spec(seed=-1)), JSON, mentions="seed"),
    Bad(
        "seed-5000-digits-json",
        b'{"task": "digits", "seed": ' + b"9" * 5000 + b"}",
        JSON,
        mentions="digits",
    ),
    Bad("seed-5000-digits-yaml", b"task: digits\nseed: " + b"9" * 5000, mentions="digits"),
    Bad("name-10k", j(spec(name="n" * 10_000)), JSON, mentions="name"),
    Bad("options-20k", j(spec(task_options={"x": "o" * 20_000})), JSON, mentions="task_options"),
    Bad("options-nan", b'{"task": "digits", "task_options": {"a": NaN}}', JSON, mentions="NaN"),
    Bad("options-infinity", b'{"task": "digits", "seed": -Infinity}', JSON, mentions="Infinity"),
    Bad("owner-10k", y("task: digits"), query={"owner": "o" * 10_000}, mentions="owner"),
    Bad("owner-nul", y("task: digits"), query={"owner": "a\x00b"}, mentions="owner"),
    # nesting bombs (small bodies, deep structures)
    Bad("json-depth-100k", b"[" * 100_000 + b"]" * 100_000, JSON, mentions=DEEP),
    Bad("json-depth-33", j(spec(task_options={"a": nested(32, ["]]]"])})), JSON, mentions=DEEP),
    Bad("yaml-flow-depth-600", b"[" * 600 + b"]" * 600, mentions=DEEP),
    Bad("yaml-flow-depth-100k", b"[" * 100_000 + b"]" * 100_000, mentions=DEEP),
    Bad(
        "yaml-options-depth-600",
        b"task: digits\ntask_options: " + b"{a: " * 600 + b"1" + b"}" * 600,
        mentions=DEEP,
    ),
    Bad("yaml-block-sequence-depth-50k", b"- " * 50_000 + b"x", mentions=DEEP),
    Bad(
        "yaml-block-mapping-depth-600",
        y("".join(" " * i + "a:\n" for i in range(600)) + " " * 600 + "b: 1\n"),
        mentions=DEEP,
    ),
    # unknown tasks and path-like strings
    Bad("task-unknown", y("task: nope"), mentions="unknown task"),
    Bad("task-traversal", y("task: ../../etc/passwd"), mentions="unknown task"),
    Bad("task-absolute", y("task: /etc/passwd"), mentions="unknown task"),
    Bad("task-import-path", y("task: 'workers.tasks.digits:TASK'"), mentions="unknown task"),
    Bad("task-os-system", y("task: 'os:system'"), mentions="unknown task"),
    Bad(
        "cifar10-data-dir-traversal",
        j({"task": "cifar10", "task_options": {"data_dir": "../../etc/passwd"}}),
        JSON,
        mentions="data_dir",
    ),
    Bad(
        "cifar10-data-dir-absolute",
        j({"task": "cifar10", "task_options": {"data_dir": "/etc"}}),
        JSON,
        mentions="data_dir",
    ),
    Bad(
        "cifar10-data-dir-home",
        j({"task": "cifar10", "task_options": {"data_dir": "~root/.ssh"}}),
        JSON,
        mentions="data_dir",
    ),
    Bad(
        "cifar10-data-dir-url",
        j({"task": "cifar10", "task_options": {"data_dir": "file:///etc"}}),
        JSON,
        mentions="data_dir",
    ),
    Bad(
        "digits-unknown-path-option",
        j(spec(task_options={"data_dir": "/etc"})),
        JSON,
        mentions="data_dir",
    ),
    Bad(
        "digits-unknown-option",
        j(spec(task_options={"bogus": 1})),
        JSON,
        mentions="bogus",
    ),
    Bad(
        "cifar10-data-dir-hidden-traversal",
        j({"task": "cifar10", "task_options": {"data_dir": "cifar/../../../etc"}}),
        JSON,
        mentions="task_options.data_dir",
    ),
    Bad(
        "cifar10-data-dir-s3",
        y("task: cifar10\ntask_options: {data_dir: 's3://bucket/cifar'}"),
        mentions="task_options.data_dir",
    ),
    Bad(
        "cifar10-data-dir-nul",
        j({"task": "cifar10", "task_options": {"data_dir": "cifar\x00/etc"}}),
        JSON,
        mentions="task_options.data_dir",
    ),
    Bad(
        "cifar10-data-dir-missing",
        y("task: cifar10"),
        mentions="task_options.data_dir: is required",
    ),
    Bad(
        "cifar10-data-dir-number",
        j({"task": "cifar10", "task_options": {"data_dir": 7}}),
        JSON,
        mentions="task_options.data_dir",
    ),
    # size
    Bad(
        "body-50MB",
        b"task: digits\n#" + b"x" * (50 * 1024 * 1024),
        status=413,
        mentions="too large",
    ),
    Bad(
        "spec-over-max-chars",
        y(f"task: digits\nname: [{','.join('1' * (MAX_SPEC_CHARS // 2))}]\n"),
        status=413,
        mentions="too large",
    ),
]


@dataclass
class Api:
    client: TestClient
    store: StudyStore


@pytest.fixture(scope="module")
def api(module_db_url: str) -> Iterator[Api]:
    """An open API (no token) on a database with one seeded study, shared by this module."""
    with StudyStore(module_db_url) as store:
        seed_study(store, trials=3, epochs=2)
        app = create_app(settings=api_settings(module_db_url), store=store)
        with TestClient(app, raise_server_exceptions=False) as client:
            yield Api(client, store)


def assert_error_body(r: httpx.Response, status: int, mentions: str = "") -> dict[str, Any]:
    assert r.status_code == status, r.text[:500]
    assert r.headers["content-type"].startswith("application/json"), r.headers
    body = r.json()
    assert set(body) == {"error"}, body
    error: dict[str, Any] = body["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["code"], str)
    assert error["code"]
    assert isinstance(error["message"], str)
    assert error["message"]
    assert "internal" not in error["message"].lower(), error
    if mentions:
        assert mentions.lower() in error["message"].lower(), error["message"]
    return error


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(
            b, id=b.id, marks=[pytest.mark.xfail(strict=True, reason=b.xfail)] if b.xfail else []
        )
        for b in BAD
    ],
)
def test_bad_spec_is_rejected_clearly_and_writes_nothing(api: Api, bad: Bad) -> None:
    before = row_counts(api.store.engine)
    headers = {"Content-Type": bad.content_type} if bad.content_type else {}
    started = time.process_time()
    r = api.client.post(STUDIES, content=bad.body, headers=headers, params=bad.query)
    elapsed = time.process_time() - started
    error = assert_error_body(r, bad.status, bad.mentions)
    if bad.status == 413:
        assert error["code"] == "request_too_large", error
    assert elapsed < SLOW_S, f"took {elapsed:.1f} s of CPU to reject"
    assert row_counts(api.store.engine) == before


def test_path_like_names_are_labels_only(api: Api, tmp_path: Path) -> None:
    """Free text is never a path: a study named like a path is stored as text, and the ids
    in URLs are integers, so nothing of the name reaches the file system."""
    name = "../../etc/passwd"
    r = api.client.post(
        STUDIES,
        content=json.dumps({**SPEC, "name": name}),
        headers={"Content-Type": JSON},
        params={"owner": "/root/.ssh/id_rsa"},
    )
    assert r.status_code == 201, r.text
    study = r.json()
    assert (study["name"], study["owner"]) == (name, "/root/.ssh/id_rsa")
    for path in ("../../etc/passwd", "..%2F..%2Fetc%2Fpasswd", "%2e%2e/%2e%2e/etc/passwd"):
        r = api.client.get(f"{STUDIES}/{path}")
        assert 400 <= r.status_code < 500, (path, r.status_code)
        assert "root:" not in r.text


@pytest.fixture
def datasets_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A datasets root (``STAGETUNE_DATASETS_DIR``) holding ``cifar``, and a directory
    ``outside`` it with a symlink ``root/escape`` pointing there."""
    root = tmp_path / "datasets"
    (root / "cifar").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    monkeypatch.setenv("STAGETUNE_DATASETS_DIR", str(root))
    get_settings.cache_clear()
    yield root
    get_settings.cache_clear()


def post_json(api: Api, body: dict[str, Any]) -> httpx.Response:
    r: httpx.Response = api.client.post(
        STUDIES, content=json.dumps(body), headers={"Content-Type": JSON}
    )
    return r


def test_data_dir_inside_the_datasets_root_is_accepted(api: Api, datasets_root: Path) -> None:
    """A path relative to the root, or absolute inside it, is queued as given (the worker
    resolves it against its own root when it loads the data)."""
    for data_dir in ("cifar", "cifar/not-there-yet", str(datasets_root / "cifar")):
        body = {"task": "cifar10", "task_options": {"data_dir": data_dir, "depth": 8}}
        r = post_json(api, body)
        assert r.status_code == 201, r.text
        stored = api.store.get_study(r.json()["id"]).spec
        assert stored["task_options"] == {"data_dir": data_dir, "depth": 8}


@pytest.mark.parametrize(
    ("data_dir", "rule"),
    [
        ("escape", "through a symlink"),
        ("escape/cifar", "through a symlink"),
        ("{root}/escape", "through a symlink"),
        ("{root}/../outside", "'..' component"),
        ("{outside}", "outside the datasets root"),
    ],
)
def test_data_dir_leaving_the_datasets_root_is_refused(
    api: Api, datasets_root: Path, data_dir: str, rule: str
) -> None:
    value = data_dir.format(root=datasets_root, outside=datasets_root.parent / "outside")
    before = row_counts(api.store.engine)
    r = post_json(api, {"task": "cifar10", "task_options": {"data_dir": value}})
    error = assert_error_body(r, 422, "task_options.data_dir")
    assert rule in error["message"]
    assert "STAGETUNE_DATASETS_DIR" in error["message"]
    if "symlink" in rule:  # where the link points is not disclosed
        assert str(datasets_root.parent / "outside") not in error["message"]
    assert any(d.get("field") == "task_options.data_dir" for d in error["details"]), error
    assert row_counts(api.store.engine) == before


def test_largest_accepted_body_is_answered_quickly(sqlite_url: str) -> None:
    """A body just under the size limit that is expensive to parse (a ~1 MB YAML list of
    numbers) is answered in seconds, not minutes: parse cost must be bounded (it is over
    ``MAX_SPEC_CHARS``: a 413 before any parsing). (SQLite only: parsing happens before any
    database work.)"""
    numbers = ",".join(str(i) for i in range(150_000))
    body = f"task: digits\nname: [{numbers}]\n".encode()
    assert 900_000 < len(body) < 1_000_000
    with StudyStore(sqlite_url, create=True) as store:
        app = create_app(settings=api_settings(sqlite_url), store=store)
        with TestClient(app, raise_server_exceptions=False) as client:
            started = time.process_time()
            r = client.post(STUDIES, content=body, headers={"Content-Type": YAML})
            elapsed = time.process_time() - started
        assert 400 <= r.status_code < 500, r.text[:300]
        assert sum(row_counts(store.engine).values()) == 0
    assert elapsed < SLOW_S, f"a {len(body):,}-byte YAML body took {elapsed:.1f} s of CPU to reject"


@pytest.mark.parametrize("content_type", [YAML, JSON])
def test_costliest_spec_under_the_size_limit_is_answered_quickly(
    sqlite_url: str, content_type: str
) -> None:
    """The worst body that does get parsed: just under ``MAX_SPEC_CHARS``, all of it a flat
    list of numbers (the most tokens per byte). Rejected (``name`` must be text) in seconds."""
    numbers: list[str] = []
    size = 0
    while size < MAX_SPEC_CHARS - 200:
        numbers.append(str(len(numbers) % 10))
        size += 2
    if content_type == YAML:
        body = f"task: digits\nname: [{','.join(numbers)}]\n".encode()
    else:
        body = f'{{"task": "digits", "name": [{",".join(numbers)}]}}'.encode()
    assert MAX_SPEC_CHARS - 300 < len(body) <= MAX_SPEC_CHARS
    with StudyStore(sqlite_url, create=True) as store:
        app = create_app(settings=api_settings(sqlite_url), store=store)
        with TestClient(app, raise_server_exceptions=False) as client:
            started = time.process_time()
            r = client.post(STUDIES, content=body, headers={"Content-Type": content_type})
            elapsed = time.process_time() - started
        assert_error_body(r, 422, "name")
        assert sum(row_counts(store.engine).values()) == 0
    assert elapsed < SLOW_S, f"a {len(body):,}-byte body took {elapsed:.1f} s of CPU to reject"


# -- auth ---------------------------------------------------------------------------------

WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def write_routes() -> list[tuple[str, str]]:
    """Every (method, path) of the app that changes state, from its routes (documented or not)."""
    app = create_app(settings=api_settings("sqlite://", tokens=[TOKEN]))
    try:
        found = {
            (method, route.path)
            for route in iter_route_contexts(app.routes)
            if route.path is not None
            for method in (route.methods or set()) & WRITE_METHODS
        }
    finally:
        app.state.store.close()
    return sorted(found, key=lambda r: (r[1], r[0]))


BAD_AUTH: dict[str, dict[str, str] | dict[str, bytes]] = {
    "none": {},
    "wrong-token": {"Authorization": "Bearer not-the-token"},
    "token-prefix": {"Authorization": f"Bearer {TOKEN[:-1]}"},
    "token-suffix": {"Authorization": f"Bearer {TOKEN}x"},
    "empty-bearer": {"Authorization": "Bearer "},
    "bare-scheme": {"Authorization": "Bearer"},
    "no-scheme": {"Authorization": TOKEN},
    "basic": {"Authorization": f"Basic {TOKEN}"},
    "two-tokens": {"Authorization": f"Bearer {TOKEN} {TOKEN}"},
    "other-header": {"X-API-Token": TOKEN},
    "non-ascii": {"Authorization": "Bearer t\xf6ken".encode("latin-1")},
}


def fill_path(path: str, study_id: int) -> str:
    values = {"study_id": str(study_id), "number": "0"}
    out = path
    for name, value in values.items():
        out = out.replace("{" + name + "}", value)
    assert "{" not in out, f"no test value for a path parameter of {path}: extend fill_path"
    return out


@pytest.fixture(scope="module")
def guarded(module_db_url: str) -> Iterator[Api]:
    """The API with a token configured (reads open), shared by this module."""
    with StudyStore(module_db_url) as store:
        app = create_app(
            settings=api_settings(module_db_url, tokens=[TOKEN, "second"]), store=store
        )
        with TestClient(app, raise_server_exceptions=False) as client:
            yield Api(client, store)


@pytest.mark.parametrize("route", write_routes(), ids=lambda r: f"{r[0]} {r[1]}")
def test_no_write_route_is_reachable_without_the_token(
    guarded: Api, route: tuple[str, str]
) -> None:
    method, template = route
    study_id = guarded.store.create_study("digits", SPEC, 4, name="guarded").id
    url = fill_path(template, study_id)
    body = y("task: digits\nbaselines: false\nbudget: {trials: 2}\n") if method == "POST" else None
    before = row_counts(guarded.store.engine)
    for variant, headers in BAD_AUTH.items():
        query = {"token": TOKEN, "access_token": TOKEN, "api_key": TOKEN}
        r = guarded.client.request(
            method, url, content=body, headers={"Content-Type": YAML, **headers}, params=query
        )
        error = assert_error_body(r, 401)
        assert error["code"] == "unauthorized", (variant, error)
        assert r.headers.get("WWW-Authenticate", "").startswith("Bearer"), variant
        assert row_counts(guarded.store.engine) == before, variant
        assert guarded.store.get_study(study_id).status == "queued", variant
    # The same request with the token goes through: the route was reachable, only auth stopped it.
    r = guarded.client.request(
        method,
        url,
        content=body,
        headers={"Content-Type": YAML, "Authorization": f"Bearer {TOKEN}"},
    )
    assert 200 <= r.status_code < 300, r.text


def test_every_write_route_is_found() -> None:
    """The discovery above must see the write routes we know of (guards against a refactor
    that hides routes from ``iter_route_contexts``)."""
    found = set(write_routes())
    assert {("POST", STUDIES), ("DELETE", f"{STUDIES}/{{study_id}}")} <= found, found


#: Reads that stay open with ``protect_reads`` (probes, the API description, static files).
OPEN_READS = {
    "/openapi.json",
    "/docs",
    "/docs/oauth2-redirect",
    "/api/v1/health",
    "/dashboard/static/{name}",
}


def test_protected_reads_need_the_token_on_every_data_route(module_db_url: str) -> None:
    """With ``protect_reads``, every GET route that serves data (API and dashboard, found from
    the app's routes) answers 401 without the token and 200 with it."""
    with StudyStore(module_db_url) as store:
        study_id = store.create_study("digits", SPEC, 4, name="protected").id
        settings = api_settings(module_db_url, tokens=[TOKEN], protect_reads=True)
        app = create_app(settings=settings, store=store)
        reads = sorted(
            route.path
            for route in iter_route_contexts(app.routes)
            if route.path is not None and "GET" in (route.methods or set())
        )
        with TestClient(app, raise_server_exceptions=False) as client:
            checked = 0
            for template in reads:
                if template in OPEN_READS:
                    continue
                if "{number}" in template:
                    continue  # a trial needs a running study; the route shape is the same
                url = fill_path(template, study_id)
                assert client.get(url).status_code == 401, url
                r = client.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
                assert r.status_code in (200, 409), (url, r.status_code, r.text[:200])
                checked += 1
            assert checked >= 5, reads


# -- real server: huge bodies ---------------------------------------------------------------


def test_huge_bodies_on_a_real_server_are_413_and_the_server_lives(tmp_path: Path) -> None:
    """50 MB with a declared length, and 50 MB streamed without one, against uvicorn: 413,
    nothing written, and the server answers the next request."""
    url = f"sqlite:///{tmp_path / 'huge.db'}"
    with api_server(url, tmp_path / "server.log") as server, StudyStore(url) as store:
        before = row_counts(store.engine)
        declared = b"task: digits\n#" + b"x" * (50 * 1024 * 1024)

        def streamed() -> Iterator[bytes]:
            yield b"task: digits\n#"
            for _ in range(50):
                yield b"x" * (1024 * 1024)

        for content in (declared, streamed()):
            r = httpx.post(
                f"{server.base_url}{STUDIES}",
                content=content,
                headers={"Content-Type": YAML},
                timeout=60,
            )
            assert_error_body(r, 413, "too large")
        assert row_counts(store.engine) == before
        r = httpx.post(
            f"{server.base_url}{STUDIES}", content=b"task: digits\n", headers={"Content-Type": YAML}
        )
        assert r.status_code == 201, r.text
