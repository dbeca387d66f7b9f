"""Alembic migrations of stagetune's tables, on SQLite and PostgreSQL, next to Optuna's."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import optuna
import pytest
from sqlalchemy import inspect

from tuner.errors import InvalidStateError
from tuner.store import StudyStore, migrate
from tuner.store.engine import make_engine
from tuner.store.models import VERSION_TABLE, Base

REPO = Path(__file__).resolve().parents[1]
OUR_TABLES = {table.name for table in Base.metadata.sorted_tables}


def tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


@contextmanager
def optuna_storage(url: str) -> Iterator[optuna.storages.RDBStorage]:
    storage = optuna.storages.RDBStorage(url)
    try:
        yield storage
    finally:
        storage.engine.dispose()


def optuna_version(url: str) -> str | None:
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT version_num FROM alembic_version").scalar()
    finally:
        engine.dispose()


def test_our_tables_are_prefixed_and_versioned_apart_from_optuna() -> None:
    expected = {
        "stagetune_studies",
        "stagetune_trials",
        "stagetune_trial_metrics",
        "stagetune_study_leftovers",
    }
    assert expected == OUR_TABLES
    assert VERSION_TABLE == "stagetune_alembic_version"


def test_upgrade_head_on_an_empty_database_matches_the_models(db_url: str) -> None:
    assert migrate.current(db_url) is None
    migrate.upgrade(db_url)
    assert migrate.current(db_url) == migrate.head()
    assert tables(db_url) == OUR_TABLES | {VERSION_TABLE}
    assert migrate.schema_diff(db_url) == []
    migrate.check_current(db_url)
    migrate.upgrade(db_url)  # again: nothing to do
    assert migrate.current(db_url) == migrate.head()


def test_every_revision_upgrades_from_the_previous_one(db_url: str) -> None:
    revisions = migrate.revisions()
    assert revisions[-1] == migrate.head()
    for revision in revisions:
        migrate.upgrade(db_url, revision)
        assert migrate.current(db_url) == revision
    assert migrate.schema_diff(db_url) == []
    # ... and back down to nothing, and up again.
    migrate.downgrade(db_url, "base")
    assert migrate.current(db_url) is None
    assert tables(db_url) & OUR_TABLES == set()
    migrate.upgrade(db_url)
    assert migrate.schema_diff(db_url) == []


def test_optuna_tables_in_the_same_database_are_left_alone(db_url: str) -> None:
    with optuna_storage(db_url) as storage:
        optuna.create_study(study_name="before", storage=storage).optimize(
            lambda t: t.suggest_float("x", 0, 1), n_trials=2
        )
    optuna_tables = tables(db_url)
    assert {"studies", "trials", "alembic_version"} <= optuna_tables
    optuna_rev = optuna_version(db_url)

    migrate.upgrade(db_url)
    assert migrate.schema_diff(db_url) == []  # Optuna's tables are not "extra" tables to us
    assert tables(db_url) == optuna_tables | OUR_TABLES | {VERSION_TABLE}
    assert optuna_version(db_url) == optuna_rev

    with StudyStore(db_url) as store:
        store.create_study("synthetic", {"x": 1}, 2)
        assert store.list_studies().total == 1
    with optuna_storage(db_url) as storage:
        loaded = optuna.load_study(study_name="before", storage=storage)
        assert len(loaded.trials) == 2
        optuna.create_study(study_name="after", storage=storage)

    migrate.downgrade(db_url, "base")
    assert tables(db_url) == optuna_tables | {VERSION_TABLE}  # Alembic keeps it, empty
    assert migrate.current(db_url) is None
    assert optuna_version(db_url) == optuna_rev


def test_optuna_can_start_after_our_schema(db_url: str) -> None:
    migrate.upgrade(db_url)
    with optuna_storage(db_url) as storage:
        optuna.create_study(study_name="s", storage=storage)
    assert migrate.schema_diff(db_url) == []
    assert migrate.current(db_url) == migrate.head()


def test_concurrent_upgrades_of_a_fresh_database_all_succeed(db_url: str) -> None:
    errors: list[BaseException] = []
    barrier = threading.Barrier(3)

    def run() -> None:
        try:
            barrier.wait()
            migrate.upgrade(db_url)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert errors == []
    assert migrate.current(db_url) == migrate.head()


def test_check_current_explains_how_to_upgrade(sqlite_url: str) -> None:
    with pytest.raises(InvalidStateError, match=r"has no stagetune schema.*alembic upgrade head"):
        migrate.check_current(sqlite_url)


def test_migrations_run_from_any_working_directory(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    migrate.upgrade(sqlite_url)
    assert migrate.current(sqlite_url) == migrate.head()


@pytest.mark.parametrize("how", ["env", "x-arg"])
def test_alembic_command_line_upgrades_head(db_url: str, how: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "STAGETUNE_DATABASE_URL"}
    args = [sys.executable, "-m", "alembic"]
    if how == "env":
        env["STAGETUNE_DATABASE_URL"] = db_url
    else:
        args += ["-x", f"url={db_url}"]
    done = subprocess.run(
        [*args, "upgrade", "head"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert migrate.current(db_url) == migrate.head()
    assert migrate.schema_diff(db_url) == []


def test_alembic_command_line_without_a_database_says_what_to_set() -> None:
    env = {k: v for k, v in os.environ.items() if k != "STAGETUNE_DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-m", "alembic", "upgrade", "head"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "STAGETUNE_DATABASE_URL" in done.stderr
