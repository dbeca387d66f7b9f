"""Alembic environment of stagetune's own tables (``stagetune_*``).

The database URL comes from, in order: the connection or URL passed by
``tuner.store.migrate`` in ``config.attributes``, ``-x url=...`` on the command line, the
``STAGETUNE_DATABASE_URL`` environment variable, ``sqlalchemy.url`` in ``alembic.ini``.
Tables that are not ours (Optuna's ``studies``, ``trials``, ... in the same database) are
invisible to autogenerate (``include_name`` / ``include_object`` in
``tuner.store.migrate``), and the version table is ``stagetune_alembic_version``.
"""

from __future__ import annotations

import os
from logging.config import fileConfig

from alembic import context
from sqlalchemy import Connection

from tuner.store.engine import DATABASE_URL_ENV, normalize_url
from tuner.store.migrate import context_options, migration_connection

config = context.config
if config.config_file_name is not None:  # the command line: log as alembic.ini says
    fileConfig(config.config_file_name, disable_existing_loggers=False)


def _url() -> str:
    given = config.attributes.get("url") or context.get_x_argument(as_dictionary=True).get("url")
    url = given or os.environ.get(DATABASE_URL_ENV) or config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit(
            f"no database given: set {DATABASE_URL_ENV} or pass -x url=... "
            "(e.g. alembic -x url=sqlite:///./stagetune-data/stagetune.db upgrade head)"
        )
    return str(url)


def _run(connection: Connection) -> None:
    context.configure(connection=connection, **context_options())
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_offline() -> None:
    context.configure(
        url=normalize_url(_url()),
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
        **context_options(),
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    with migration_connection(_url()) as conn:
        _run(conn)


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
