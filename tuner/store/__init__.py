"""Persistence of studies, trials and per-epoch metrics (SQLite or PostgreSQL).

Public API: :class:`StudyStore` and the records it returns. Schema management lives in
:mod:`tuner.store.migrate`, engine creation in :mod:`tuner.store.engine`.
"""

from __future__ import annotations

from tuner.store.engine import DATABASE_URL_ENV, DEFAULT_DATABASE_URL, make_engine, normalize_url
from tuner.store.records import (
    FINISHED_STUDY_STATUSES,
    FINISHED_TRIAL_STATUSES,
    EpochMetrics,
    EpochOrigin,
    Page,
    StudyLeftovers,
    StudyRecord,
    StudyStatus,
    TrialCurve,
    TrialRecord,
    TrialStatus,
    experiment_name,
    optuna_study_name,
    optuna_study_names,
)
from tuner.store.storage import (
    FINAL_KEYS,
    MAX_PAGE_SIZE,
    METRIC_FLOAT_KEYS,
    METRIC_INT_KEYS,
    TRIAL_SORT_KEYS,
    StudyStore,
)

__all__ = [
    "DATABASE_URL_ENV",
    "DEFAULT_DATABASE_URL",
    "FINAL_KEYS",
    "FINISHED_STUDY_STATUSES",
    "FINISHED_TRIAL_STATUSES",
    "MAX_PAGE_SIZE",
    "METRIC_FLOAT_KEYS",
    "METRIC_INT_KEYS",
    "TRIAL_SORT_KEYS",
    "EpochMetrics",
    "EpochOrigin",
    "Page",
    "StudyLeftovers",
    "StudyRecord",
    "StudyStatus",
    "StudyStore",
    "TrialCurve",
    "TrialRecord",
    "TrialStatus",
    "experiment_name",
    "make_engine",
    "normalize_url",
    "optuna_study_name",
    "optuna_study_names",
]
