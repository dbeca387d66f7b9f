"""Schema management: run stagetune's Alembic migrations from Python.

``upgrade(url)`` is ``alembic upgrade head`` without a shell or an ``alembic.ini``: the
migration scripts are found next to this package (``<repo>/migrations``), whatever the
current directory. The command line works too, from the repository root::

    STAGETUNE_DATABASE_URL=postgresql://user@host/db alembic upgrade head
    alembic -x url=sqlite:///./stagetune-data/stagetune.db upgrade head

Alembic records the revision in ``stagetune_alembic_version`` (Optuna keeps its own
``alembic_version`` in the same database) and only ever looks at ``stagetune_*`` tables.

Migrations run in one transaction that is serialized against other migrators (SQLite:
``BEGIN IMMEDIATE``; PostgreSQL: a transaction-level advisory lock), so several processes
starting at once on a fresh database upgrade it exactly once. On SQLite, foreign-key
enforcement is switched off while migrating (rebuilding a table must not cascade-delete the
rows that reference it) and ``PRAGMA foreign_key_check`` runs before the commit.
"""

from __future__ import annotations

import fcntl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.autogenerate.api import AutogenContext
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text
from sqlalchemy.engine import URL
from sqlalchemy.pool import NullPool

from tuner.errors import InvalidStateError
from tuner.store.engine import display_url, make_engine, normalize_url, write_engine
from tuner.store.models import VERSION_TABLE, Base, UTCDateTime, is_stagetune_table

MIGRATIONS_DIR = Path(__file__).resolve().parents[2] / "migrations"
"""Where the Alembic environment and revision scripts live."""

# An arbitrary constant: PostgreSQL advisory-lock key taken while migrating ("stgtune").
_PG_MIGRATION_LOCK = 0x7374677475_6E65


def include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """Alembic filter: reflect only stagetune's tables (not Optuna's, in the same database)."""
    if type_ == "table":
        return is_stagetune_table(name)
    return True


def include_object(
    obj: Any, name: str | None, type_: str, reflected: bool, compare_to: Any
) -> bool:
    """Alembic filter: compare only stagetune's tables and what belongs to them."""
    if type_ == "table":
        return is_stagetune_table(name)
    table = getattr(obj, "table", None)
    if table is not None:
        return is_stagetune_table(table.name)
    return True


def render_item(type_: str, obj: Any, autogen_context: AutogenContext) -> str | bool:
    """Render the models' ``UTCDateTime`` as a plain ``sa.DateTime(timezone=True)``: revision
    scripts must not import application code that may change later."""
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def context_options() -> dict[str, Any]:
    """The options ``migrations/env.py`` gives Alembic's ``context.configure``."""
    return {
        "target_metadata": Base.metadata,
        "version_table": VERSION_TABLE,
        "include_name": include_name,
        "include_object": include_object,
        "render_item": render_item,
        "render_as_batch": True,
        "compare_type": True,
        # SQLite's DDL is transactional too once SQLAlchemy emits BEGIN (tuner.store.engine),
        # so a failed migration rolls back completely on both backends.
        "transactional_ddl": True,
    }


def schema_diff(url: str | URL) -> list[Any]:
    """What autogenerate would change to make the database match the models (``[]`` when the
    schema is current); Optuna's tables are ignored."""
    engine = make_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts=context_options())
            return list(compare_metadata(context, Base.metadata))
    finally:
        engine.dispose()


def script_location() -> Path:
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise InvalidStateError(
            f"stagetune's migration scripts are missing (looked in {MIGRATIONS_DIR}); "
            "install stagetune from its source tree (pip install -e .)"
        )
    return MIGRATIONS_DIR


def alembic_config(url: str | URL | None = None) -> Config:
    """An Alembic ``Config`` for stagetune's migrations, optionally bound to ``url``."""
    config = Config()
    config.set_main_option("script_location", str(script_location()))
    if url is not None:
        config.attributes["url"] = normalize_url(url)
    return config


@contextmanager
def migration_connection(target: str | URL | Engine) -> Iterator[Connection]:
    """A connection in a transaction that holds the migration lock (see module doc).

    ``target`` is a URL (a private engine is created and disposed) or an engine made by
    :func:`tuner.store.engine.make_engine` (used as is, e.g. for an in-memory database).
    """
    if isinstance(target, Engine):
        with _sqlite_file_lock(target.url), _migration_transaction(target, own=False) as conn:
            yield conn
        return
    with _sqlite_file_lock(normalize_url(target)):
        engine = make_engine(target, poolclass=NullPool)
        with _migration_transaction(engine, own=True) as conn:
            yield conn


@contextmanager
def _sqlite_file_lock(url: URL) -> Iterator[None]:
    """Serialize migrations of one SQLite file across threads and processes of this host.

    Opening a fresh SQLite database switches it to WAL, which needs an exclusive lock that
    SQLite's busy timeout does not always wait for; migrators queue on a lock file instead.
    """
    database = url.database if url.get_backend_name() == "sqlite" else None
    if not database or database == ":memory:" or database.startswith("file:"):
        yield
        return
    lock_path = Path(database).with_name(Path(database).name + ".migrate-lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def _migration_transaction(engine: Engine, own: bool) -> Iterator[Connection]:
    sqlite = engine.dialect.name == "sqlite"
    try:
        with write_engine(engine).connect() as conn:
            raw = conn.connection.dbapi_connection
            if sqlite:
                # Must run outside a transaction, where SQLite would ignore it.
                raw.execute("PRAGMA foreign_keys = OFF")  # type: ignore[union-attr]
            try:
                with conn.begin():  # SQLite: BEGIN IMMEDIATE (write_engine)
                    if not sqlite:
                        conn.execute(
                            text("SELECT pg_advisory_xact_lock(:key)"),
                            {"key": _PG_MIGRATION_LOCK},
                        )
                    yield conn
                    if sqlite:
                        broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                        if broken:
                            raise InvalidStateError(
                                f"migration left {len(broken)} rows with dangling foreign "
                                f"keys (first: {tuple(broken[0])}); nothing was changed"
                            )
            finally:
                if sqlite:
                    raw.execute("PRAGMA foreign_keys = ON")  # type: ignore[union-attr]
    finally:
        if own:
            engine.dispose()


def upgrade(url: str | URL, revision: str = "head") -> None:
    """Upgrade the database at ``url`` to ``revision`` (default: the newest)."""
    _run(url, command.upgrade, revision)


def upgrade_engine(engine: Engine, revision: str = "head") -> None:
    """:func:`upgrade` through an existing engine (the store's own, e.g. in-memory SQLite)."""
    _run(engine, command.upgrade, revision)


def _run(target: str | URL | Engine, fn: Callable[[Config, str], None], revision: str) -> None:
    config = alembic_config(None if isinstance(target, Engine) else target)
    with migration_connection(target) as conn:
        config.attributes["connection"] = conn
        fn(config, revision)


def downgrade(url: str | URL, revision: str) -> None:
    """Downgrade the database at ``url`` to ``revision`` (``"base"`` drops every table)."""
    _run(url, command.downgrade, revision)


def current(url: str | URL) -> str | None:
    """The revision the database at ``url`` is at, or ``None`` if it was never migrated."""
    engine = make_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return context.get_current_revision()
    finally:
        engine.dispose()


def head() -> str:
    """The newest revision of stagetune's schema."""
    script = ScriptDirectory.from_config(alembic_config())
    newest = script.get_current_head()
    if newest is None:  # pragma: no cover - the repository ships at least one revision
        raise InvalidStateError("stagetune has no migration scripts")
    return newest


def revisions() -> list[str]:
    """Every revision, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    return [rev.revision for rev in reversed(list(script.walk_revisions()))]


def check_current(url: str | URL) -> None:
    """Raise ``InvalidStateError`` unless the database at ``url`` is at the newest revision."""
    at, newest = current(url), head()
    if at != newest:
        where = "has no stagetune schema" if at is None else f"is at revision {at}"
        raise InvalidStateError(
            f"the database {display_url(url)} {where}, but this stagetune needs {newest}; "
            "run `alembic upgrade head` (with STAGETUNE_DATABASE_URL set) to upgrade it"
        )
