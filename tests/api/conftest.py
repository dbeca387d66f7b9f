"""Fixtures of the REST tests: a migrated database (SQLite and PostgreSQL), a store to seed it,
and clients of ``create_app(settings=Settings(database_url=...))``.

Settings are built with every API option explicit (and no ``.env`` file), so a developer's
environment cannot change what the tests see.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import SecretStr

from api.app import create_app
from tuner.schedule import Schedule, Stage
from tuner.settings import Settings
from tuner.spec import StudySpec
from tuner.store import StudyStore, TrialStatus
from tuner.store.migrate import upgrade

with warnings.catch_warnings():
    # starlette asks for the httpx2 package, which this project does not install.
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient as TestClient

STUDIES = "/api/v1/studies"

SPEC_YAML = """\
task: digits
name: seeded
schedule: {total_epochs: 4}
budget: {trials: 6, seed_runs: 0}
"""

ClientFactory = Callable[..., Any]


def make_settings(
    database_url: str,
    *,
    tokens: list[str] | None = None,
    protect_reads: bool = False,
    max_request_bytes: int = 1_000_000,
) -> Settings:
    return Settings(
        _env_file=None,  # type: ignore[call-arg]
        database_url=database_url,
        api_tokens=[SecretStr(t) for t in tokens or []],
        api_token=None,
        protect_reads=protect_reads,
        max_request_bytes=max_request_bytes,
    )


@pytest.fixture
def url(db_url: str) -> str:
    """A fresh database at the newest schema, on SQLite and on PostgreSQL."""
    upgrade(db_url)
    return db_url


@pytest.fixture
def store(url: str) -> Iterator[StudyStore]:
    """A store on the same database as the app, to seed and inspect it."""
    with StudyStore(url) as s:
        yield s


@contextmanager
def open_client(settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(settings=settings)) as client:
        yield client


@pytest.fixture
def client(url: str) -> Iterator[TestClient]:
    with open_client(make_settings(url)) as c:
        yield c


def schedule_dict(*batches: int, epochs_per_stage: int = 2) -> dict[str, Any]:
    stages = tuple(
        Stage(
            start_epoch=i * epochs_per_stage,
            end_epoch=(i + 1) * epochs_per_stage,
            batch_size=b,
        )
        for i, b in enumerate(batches)
    )
    return Schedule(stages=stages, base_lr=0.1, base_batch_size=batches[0]).to_dict()


def new_study(store: StudyStore, name: str = "seeded", task: str = "digits", **kw: Any) -> int:
    spec = StudySpec.from_yaml(SPEC_YAML.replace("name: seeded", f"name: {name}")).model_copy(
        update={"task": task}
    )
    return store.create_study(task, spec.to_dict(), spec.budget.trials, name=spec.name, **kw).id


@dataclass(frozen=True)
class Seeded:
    study_id: int
    best_number: int
    running_number: int


def seed_running_study(store: StudyStore, worker_id: str = "seed-worker") -> Seeded:
    """A running study with trials 0-3: 0 completed (acc 0.8), 1 completed (acc 0.9, best),
    2 diverged, 3 still running; two epochs of metrics each (one for trial 3)."""
    study_id = new_study(store)
    claimed = store.claim_study(worker_id, 60)
    assert claimed is not None
    assert claimed.id == study_id
    accuracies = {0: 0.8, 1: 0.9, 2: None}
    for number, batches in enumerate([(32, 64), (32, 128), (64, 256), (32, 32)]):
        trial = store.create_trial(
            study_id,
            number,
            schedule_dict(*batches),
            {"seed": number},
            baseline="small_batch" if number == 0 else None,
        )
        for epoch in range(2 if number < 3 else 1):
            store.add_epoch_metrics(
                trial.id,
                epoch,
                {
                    "val_accuracy": 0.5 + 0.1 * epoch + 0.01 * number,
                    "val_loss": 1.0 - 0.1 * epoch,
                    "batch_size": batches[0],
                    "lr": 0.1,
                    "custom_key": number,
                },
            )
        if number < 3:
            status = TrialStatus.DIVERGED if number == 2 else TrialStatus.COMPLETED
            final: dict[str, Any] = {"val_accuracy": accuracies[number], "steps": 100 + number}
            store.finish_trial(trial.id, status, final=final)
            if number == 1:
                store.set_best(study_id, trial.id, 0.9)
    return Seeded(study_id=study_id, best_number=1, running_number=3)


def assert_error(body: dict[str, object], code: str) -> dict[str, object]:
    """The body has the one error shape of the API; returns its ``error`` object."""
    assert set(body) == {"error"}
    error = body["error"]
    assert isinstance(error, dict)
    assert set(error) == {"code", "message", "details"}
    assert error["code"] == code
    assert isinstance(error["message"], str)
    assert error["message"]
    assert isinstance(error["details"], list)
    return error


def error_message(body: dict[str, object], code: str) -> str:
    return str(assert_error(body, code)["message"])


def field_errors(body: dict[str, object]) -> dict[str, str]:
    """``field path -> reason`` of a 422 body."""
    error = assert_error(body, "validation_error")
    details = error["details"]
    assert isinstance(details, list)
    return {d["field"]: d["message"] for d in details}
