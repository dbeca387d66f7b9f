"""SQLAlchemy 2 models of stagetune's tables.

Every table name starts with ``stagetune_`` because Optuna keeps its own ``studies``,
``trials``, ... (and ``alembic_version``) in the same database. Constraint names follow
:data:`NAMING_CONVENTION`, so they are the same on SQLite and PostgreSQL and migrations can
refer to them. These models are internal to :mod:`tuner.store`: the store returns records.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Dialect,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    false,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

TABLE_PREFIX = "stagetune_"
VERSION_TABLE = "stagetune_alembic_version"

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

STUDY_STATUSES = ("queued", "running", "completed", "failed", "cancelled")
TRIAL_STATUSES = ("running", "completed", "stopped", "diverged", "failed")

NAME_MAX = 200
TASK_MAX = 100
WORKER_ID_MAX = 200
BASELINE_MAX = 64
STATUS_MAX = 16
EXPERIMENT_MAX = 200

TRIAL_SORT_INDEXES = (
    "val_accuracy",
    "val_loss",
    "metric_value",
    "wall_time_s",
    "steps",
    "samples",
    "mean_batch_size",
    "epochs_done",
    "started_at",
    "finished_at",
)
"""Trial columns with a ``(study_id, <column>, number)`` index (the sort keys but ``number``)."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp on every backend.

    PostgreSQL stores ``timestamptz``; SQLite has no time zones, so values are stored as naive
    UTC (which also keeps their text comparable) and come back with ``tzinfo=UTC``. Naive
    datetimes are refused: a timestamp without a zone is a bug waiting to happen.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError(f"naive datetime {value!r}: stagetune stores timezone-aware UTC")
        value = value.astimezone(UTC)
        if dialect.name == "sqlite":
            return value.replace(tzinfo=None)
        return value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


def json_type(*, nullable: bool = False) -> TypeEngine[Any]:
    """JSON everywhere, JSONB on PostgreSQL; SQL ``NULL`` (not JSON ``null``) for ``None``."""
    return JSON(none_as_null=nullable).with_variant(JSONB(none_as_null=nullable), "postgresql")


def _in(column: str, values: tuple[str, ...]) -> str:
    return f"{column} IN ({', '.join(repr(v) for v in values)})"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class StudyRow(Base):
    __tablename__ = "stagetune_studies"
    __table_args__ = (
        CheckConstraint(_in("status", STUDY_STATUSES), name="status"),
        CheckConstraint("budget >= 1", name="budget_positive"),
        Index("ix_stagetune_studies_status_created_at", "status", "created_at"),
        Index("ix_stagetune_studies_created_at", "created_at"),
        Index("ix_stagetune_studies_owner_created_at", "owner", "created_at"),
        Index("ix_stagetune_studies_task_created_at", "task", "created_at"),
        # Never reuse the id of a deleted study: API links must not start pointing elsewhere.
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str | None] = mapped_column(String(NAME_MAX))
    owner: Mapped[str | None] = mapped_column(String(NAME_MAX))
    task: Mapped[str] = mapped_column(String(TASK_MAX))
    spec: Mapped[dict[str, Any]] = mapped_column(json_type())
    status: Mapped[str] = mapped_column(String(STATUS_MAX))
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default=false())
    budget: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    heartbeat_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    worker_id: Mapped[str | None] = mapped_column(String(WORKER_ID_MAX))
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)
    # Not a foreign key: trials already reference studies, and a cycle would complicate
    # deletes and SQLite table rebuilds. The store checks the trial belongs to the study.
    best_trial_id: Mapped[int | None] = mapped_column(Integer)
    best_value: Mapped[float | None] = mapped_column(Double)
    summary: Mapped[dict[str, Any] | None] = mapped_column(json_type(nullable=True))


class TrialRow(Base):
    __tablename__ = "stagetune_trials"
    __table_args__ = (
        UniqueConstraint("study_id", "number"),
        CheckConstraint(_in("status", TRIAL_STATUSES), name="status"),
        CheckConstraint("number >= 0", name="number_nonnegative"),
        Index("ix_stagetune_trials_study_id_status", "study_id", "status"),
        # One (study_id, key, number) index per sort key of StudyStore.list_trials (the
        # number itself has the unique constraint): a page of ids is read from the index in
        # order (ties by number) instead of sorting the study's rows. See TRIAL_SORT_INDEXES.
        *(
            Index(f"ix_stagetune_trials_study_id_{key}_number", "study_id", key, "number")
            for key in TRIAL_SORT_INDEXES
        ),
        {"sqlite_autoincrement": True},
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[int] = mapped_column(ForeignKey("stagetune_studies.id", ondelete="CASCADE"))
    number: Mapped[int] = mapped_column(Integer)
    baseline: Mapped[str | None] = mapped_column(String(BASELINE_MAX))
    schedule: Mapped[dict[str, Any]] = mapped_column(json_type())
    params: Mapped[dict[str, Any]] = mapped_column(json_type())
    status: Mapped[str] = mapped_column(String(STATUS_MAX))
    stop_reason: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime())
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    epochs_done: Mapped[int] = mapped_column(Integer, server_default="0")
    val_accuracy: Mapped[float | None] = mapped_column(Double)
    val_loss: Mapped[float | None] = mapped_column(Double)
    steps: Mapped[int | None] = mapped_column(BigInteger)
    samples: Mapped[int | None] = mapped_column(BigInteger)
    wall_time_s: Mapped[float | None] = mapped_column(Double)
    mean_batch_size: Mapped[float | None] = mapped_column(Double)
    objective_values: Mapped[dict[str, Any] | None] = mapped_column(json_type(nullable=True))
    # The schedule in one line ("64@0-3 -> 256@3-8"), computed when the trial is written so
    # that listings do not validate every schedule again; NULL for an invalid schedule and
    # for trials written before this column existed (readers compute it then).
    schedule_summary: Mapped[str | None] = mapped_column(Text)
    # How many times the trial was started again after its first start (a resumed or
    # taken-over study re-runs its unfinished trials from the first epoch), and why the
    # last re-run happened.
    restarts: Mapped[int] = mapped_column(Integer, server_default="0")
    restart_reason: Mapped[str | None] = mapped_column(Text)
    # The final value of the study's metric (``objective.metric``: val_accuracy, val_loss,
    # val_psnr, ...), whatever the objective; NULL for trials written before this column.
    metric_value: Mapped[float | None] = mapped_column(Double)


class TrialMetricRow(Base):
    __tablename__ = "stagetune_trial_metrics"
    __table_args__ = (CheckConstraint("epoch >= 0", name="epoch_nonnegative"),)

    # The primary key (trial_id, epoch) is the unique constraint and the read index at once.
    trial_id: Mapped[int] = mapped_column(
        ForeignKey("stagetune_trials.id", ondelete="CASCADE"), primary_key=True
    )
    epoch: Mapped[int] = mapped_column(Integer, primary_key=True)
    val_accuracy: Mapped[float | None] = mapped_column(Double)
    val_loss: Mapped[float | None] = mapped_column(Double)
    train_loss: Mapped[float | None] = mapped_column(Double)
    epoch_time_s: Mapped[float | None] = mapped_column(Double)
    samples_per_s: Mapped[float | None] = mapped_column(Double)
    steps: Mapped[int | None] = mapped_column(BigInteger)
    samples: Mapped[int | None] = mapped_column(BigInteger)
    batch_size: Mapped[int | None] = mapped_column(Integer)
    lr: Mapped[float | None] = mapped_column(Double)
    noise_scale: Mapped[float | None] = mapped_column(Double)
    extra: Mapped[dict[str, Any]] = mapped_column(json_type())


class StudyLeftoversRow(Base):
    """What a deleted study left behind (files on the Ray storage path, Optuna studies) until
    a worker has removed it. Not a foreign key: the study row is gone."""

    __tablename__ = "stagetune_study_leftovers"
    __table_args__ = (Index("ix_stagetune_study_leftovers_requested_at", "requested_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    study_id: Mapped[int] = mapped_column(Integer)
    experiment: Mapped[str] = mapped_column(String(EXPERIMENT_MAX))
    optuna_studies: Mapped[list[str]] = mapped_column(json_type())
    requested_at: Mapped[datetime] = mapped_column(UTCDateTime())
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    attempts: Mapped[int] = mapped_column(Integer, server_default="0")
    error: Mapped[str | None] = mapped_column(Text)


def is_stagetune_table(name: str | None) -> bool:
    """Whether a table name is one of ours (used to keep Optuna's tables out of migrations)."""
    return name is not None and name.startswith(TABLE_PREFIX) and name != VERSION_TABLE
