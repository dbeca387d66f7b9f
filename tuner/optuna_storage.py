"""Optuna's storage in the service database: the one module that opens it, and the names of
what stagetune records on Optuna studies and trials.

The engine's searcher (:mod:`tuner.engine_search`) writes through :func:`open_storage`; the
dashboard's parameter importance (``api.dashboard_data``) reads through
:func:`open_existing`, which never creates tables; optuna-dashboard reads the same tables.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any, Final

import optuna
import sqlalchemy

from tuner.store.engine import SQLITE_BUSY_TIMEOUT_S, SQLITE_FILE_PRAGMAS
from tuner.store.records import StudyRecord, optuna_study_names

__all__ = [
    "CANDIDATE_ATTR",
    "INFEASIBLE_ATTR",
    "NUMBER_ATTR",
    "OBJECTIVE_ATTR",
    "PARENT_ATTR",
    "PREFIX_STAGES_ATTR",
    "SCHEDULE_ATTR",
    "STAGE_ROUND_ATTR",
    "open_existing",
    "open_storage",
    "study_names",
]

log = logging.getLogger(__name__)

#: Trial user attribute: the stagetune trial number.
NUMBER_ATTR: Final = "stagetune_number"
#: Trial user attribute: the schedule document the trial trained.
SCHEDULE_ATTR: Final = "stagetune_schedule"
#: Trial user attribute: a tuned trial the engine built (e.g. "noise_scale").
CANDIDATE_ATTR: Final = "stagetune_candidate"
#: Trial user attribute: the schedule broke the objective's constraint and was not trained.
INFEASIBLE_ATTR: Final = "stagetune_infeasible"
#: Trial user attributes of prefix reuse: the parent trial number and the stages kept.
PARENT_ATTR: Final = "stagetune_parent"
PREFIX_STAGES_ATTR: Final = "stagetune_prefix_stages"
#: Trial user attribute of the stage-wise search: the round (stage index) the trial searched.
STAGE_ROUND_ATTR: Final = "stagetune_stage_round"
#: Study user attribute: the objective values' names.
OBJECTIVE_ATTR: Final = "stagetune_objective"


def study_names(study: StudyRecord) -> list[str]:
    """Names the study's Optuna study may have (:func:`tuner.store.records.optuna_study_names`)."""
    return optuna_study_names(study.id, study.summary)


def open_existing(url: str) -> optuna.storages.RDBStorage | None:
    """Optuna's storage at ``url`` for reading, or ``None`` when the database has no Optuna
    tables yet (the engine creates them when it samples its first schedule). The caller
    disposes of ``storage.engine``."""
    probe = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    try:
        tables = set(sqlalchemy.inspect(probe).get_table_names())
    finally:
        probe.dispose()
    if not {"studies", "trials", "version_info"} <= tables:
        return None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.storages.RDBStorage(url, skip_table_creation=True, skip_compatibility_check=True)


def open_storage(url: str, engine_kwargs: Mapping[str, Any]) -> optuna.storages.RDBStorage:
    """Optuna's RDB storage for the engine (its tables created if missing); on SQLite with the
    store's file settings (:data:`tuner.store.engine.SQLITE_FILE_PRAGMAS`: WAL journal,
    ``synchronous=NORMAL``) and busy timeout, which make each write several times cheaper."""
    kwargs = dict(engine_kwargs)
    sqlite = url.startswith("sqlite")
    if sqlite:
        kwargs.setdefault("connect_args", {"timeout": SQLITE_BUSY_TIMEOUT_S})
    _ensure_optuna_schema(url, kwargs)
    storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
    if sqlite:

        @sqlalchemy.event.listens_for(storage.engine, "connect")
        def _pragmas(dbapi_connection: Any, _record: Any) -> None:
            cursor = dbapi_connection.cursor()
            for pragma in SQLITE_FILE_PRAGMAS:
                cursor.execute(f"PRAGMA {pragma}")
            cursor.close()

        storage.engine.dispose()  # connections opened so far lack the pragmas
    return storage


#: Attempts at creating Optuna's tables while another process creates them.
_SCHEMA_RACE_ATTEMPTS: Final = 6


#: Databases whose Optuna tables this process has seen (checked once per process).
_OPTUNA_SCHEMA_READY: set[str] = set()


def _ensure_optuna_schema(url: str, engine_kwargs: Mapping[str, Any]) -> None:
    """Create Optuna's tables if they are missing, trying again while another process is
    creating them.

    Opening an Optuna storage creates its tables (check, then ``CREATE``), so two
    dispatchers starting their first studies on a fresh database at the same moment both
    create them; the loser failed (PostgreSQL: a unique violation in ``pg_type``; SQLite:
    "already exists") and its study with it. Once the winner is done the tables exist, and
    another attempt only finds them. The attempts open no connection pool (``NullPool``),
    so a failed one leaves no connection behind. A dispatcher runs many studies: only its
    first pays for this extra opening (40-110 ms); were the tables dropped later, opening the
    storage would create them again, as before.
    """
    if url in _OPTUNA_SCHEMA_READY:
        return
    kwargs: dict[str, Any] = {"poolclass": sqlalchemy.pool.NullPool}
    if "connect_args" in engine_kwargs:
        kwargs["connect_args"] = engine_kwargs["connect_args"]
    for attempt in range(1, _SCHEMA_RACE_ATTEMPTS + 1):
        try:
            optuna.storages.RDBStorage(url, engine_kwargs=kwargs).engine.dispose()
            _OPTUNA_SCHEMA_READY.add(url)
            return
        except sqlalchemy.exc.DBAPIError as exc:
            raced = isinstance(exc, sqlalchemy.exc.IntegrityError) or "already exists" in str(
                exc.orig
            )
            if not raced or attempt == _SCHEMA_RACE_ATTEMPTS:
                raise
            log.info("Optuna's tables are being created by another process; trying again")
            time.sleep(0.2 * attempt)
