"""Shared fixtures: one local Ray instance per test session, and real databases.

Database fixtures give each test a fresh, empty database: a SQLite file under ``tmp_path``
or a newly created PostgreSQL database on the local server (dropped afterwards). Tests that
take ``db_url`` run once against each backend.

The session caches generated task data (``workers.tasks.disk_cache``) in a directory of its
own, removed at its end: every process the tests start inherits ``STAGETUNE_CACHE_DIR``, so
mnist1d is generated once per session, and nothing is written to the user's cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_SERVER_URL = os.environ.get(
    "STAGETUNE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


_SESSION_CACHE: str | None = None


def pytest_configure(config: pytest.Config) -> None:
    global _SESSION_CACHE
    if "STAGETUNE_CACHE_DIR" not in os.environ:
        _SESSION_CACHE = tempfile.mkdtemp(prefix="stagetune-test-cache-")
        os.environ["STAGETUNE_CACHE_DIR"] = _SESSION_CACHE


def pytest_unconfigure(config: pytest.Config) -> None:
    if _SESSION_CACHE is not None:
        shutil.rmtree(_SESSION_CACHE, ignore_errors=True)


def _pg_conninfo(sqlalchemy_url: str) -> str:
    return sqlalchemy_url.replace("postgresql+psycopg://", "postgresql://", 1)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """A local Ray instance with 2 CPUs, started once for the whole test session."""
    import ray

    if not ray.is_initialized():
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
        )
    yield
    ray.shutdown()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'stagetune.db'}"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh PostgreSQL database on the local server, dropped after the test."""
    import psycopg

    name = f"stagetune_test_{uuid.uuid4().hex[:12]}"
    server = _pg_conninfo(PG_SERVER_URL)
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, _ = PG_SERVER_URL.rpartition("/")
    yield f"{base}/{name}"
    with psycopg.connect(server, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest) -> str:
    """Each test that takes this runs against SQLite and against PostgreSQL."""
    if request.param == "sqlite":
        return str(request.getfixturevalue("sqlite_url"))
    return str(request.getfixturevalue("pg_url"))
