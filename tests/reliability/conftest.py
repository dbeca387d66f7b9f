"""Fixtures of the reliability tests (the root conftest's ``db_url``/``pg_url``/``sqlite_url``
and ``ray_session`` are used as they are; these add module-scoped databases)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.reliability.helpers import pg_database
from tuner.store.migrate import upgrade


@pytest.fixture(
    scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def module_db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A migrated database shared by the tests of one module, on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('reliability') / 'stagetune.db'}"
        upgrade(url)
        yield url
        return
    with pg_database("stagetune_rel") as url:
        upgrade(url)
        yield url
