"""What the store returns: frozen dataclasses and status enums (never ORM objects).

Every record is built from a fresh query, so its ``dict`` fields (spec, schedule, ...) are
private copies: changing one changes nothing in the database.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class StudyStatus(StrEnum):
    """A study's life cycle: queued -> running -> completed | failed | cancelled.

    A queued study can also go straight to cancelled.
    """

    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_finished(self) -> bool:
        return self in FINISHED_STUDY_STATUSES


FINISHED_STUDY_STATUSES: frozenset[StudyStatus] = frozenset(
    {StudyStatus.COMPLETED, StudyStatus.FAILED, StudyStatus.CANCELLED}
)


class TrialStatus(StrEnum):
    """A trial's life cycle: running -> completed | stopped | diverged | failed.

    ``stopped``: ended early by the scheduler (e.g. ASHA) or a cancelled study;
    ``diverged``: the loss became non-finite; ``failed``: an error or a lost worker.
    """

    RUNNING = "running"
    COMPLETED = "completed"
    STOPPED = "stopped"
    DIVERGED = "diverged"
    FAILED = "failed"

    @property
    def is_finished(self) -> bool:
        return self is not TrialStatus.RUNNING


FINISHED_TRIAL_STATUSES: frozenset[TrialStatus] = frozenset(
    s for s in TrialStatus if s is not TrialStatus.RUNNING
)


@dataclass(frozen=True, slots=True)
class StudyRecord:
    """One study, with its progress (trial counts, best trial so far)."""

    id: int
    name: str | None
    owner: str | None
    task: str
    spec: dict[str, Any]
    """The validated study spec, as plain JSON."""
    status: StudyStatus
    cancel_requested: bool
    budget: int
    """Number of trials the study may run (baselines included)."""
    created_at: datetime
    """All timestamps are timezone-aware UTC."""
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    worker_id: str | None
    """The worker that claimed the study last (kept after it finishes)."""
    attempts: int
    """How many times the study was claimed: more than 1 means a worker took it over."""
    error: str | None
    """Why the study failed; for a queued study, why the worker that claimed it last gave it
    back without starting it (Ray unreachable), until the next claim."""
    best_trial_id: int | None
    best_trial_number: int | None
    best_value: float | None
    summary: dict[str, Any] | None
    """The engine's comparison of the best schedule against the baselines."""
    trials_done: int
    """Trials in a finished state (completed, stopped, diverged or failed)."""
    trials_running: int
    best_trial_baseline: str | None = None
    """The baseline the best trial is (``None``: a tuned trial, or no best yet)."""

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def trials_remaining(self) -> int:
        """Budget not yet spent by finished or running trials (never negative)."""
        return max(0, self.budget - self.trials_done - self.trials_running)


@dataclass(frozen=True, slots=True)
class TrialRecord:
    """One trial: the schedule it trained and its final metrics (``None`` until known)."""

    id: int
    study_id: int
    number: int
    """Unique within the study; baselines and tuned trials share the numbering."""
    baseline: str | None
    """The baseline's name (``"small_batch"``, ``"smith"``, ...) or ``None`` for a tuned trial."""
    schedule: dict[str, Any]
    params: dict[str, Any]
    status: TrialStatus
    stop_reason: str | None
    started_at: datetime
    finished_at: datetime | None
    epochs_done: int
    """Number of epochs with recorded metrics (unless ``finish_trial`` set it explicitly)."""
    val_accuracy: float | None
    val_loss: float | None
    steps: int | None
    samples: int | None
    wall_time_s: float | None
    mean_batch_size: float | None
    objective_values: dict[str, float | None] | None
    restarts: int = 0
    """How many times the trial was started again after its first start: a study resumed
    after its worker was lost (taken over, or released and claimed again) re-runs its
    unfinished trials from the first epoch, and Tune retries a trial that raised."""
    restart_reason: str | None = None
    """Why the trial was last started again (``None`` if it never was)."""
    schedule_summary: str | None = None
    """The schedule in one line (``"64@0-3 -> 256@3-8"``) as computed when the trial was
    written; ``None`` for an invalid schedule or a trial written by an older version."""
    metric_value: float | None = None
    """The final value of the study's metric (``objective.metric``), whatever the objective;
    ``None`` for a trial written by an older version (its ``val_accuracy`` then)."""

    def metric(self, name: str) -> float | None:
        """The trial's final value of the study's metric ``name``: :attr:`metric_value`, or
        for a trial stored before that column its validation accuracy or loss (the metrics
        those studies could have)."""
        if self.metric_value is not None:
            return self.metric_value
        if name == "val_accuracy":
            return self.val_accuracy
        if name == "val_loss":
            return self.val_loss
        return None

    @property
    def is_baseline(self) -> bool:
        return self.baseline is not None

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished


@dataclass(frozen=True, slots=True)
class EpochMetrics:
    """The metrics one trial reported for one epoch; unknown keys are kept in ``extra``."""

    trial_id: int
    epoch: int
    val_accuracy: float | None
    val_loss: float | None
    train_loss: float | None
    epoch_time_s: float | None
    samples_per_s: float | None
    steps: int | None
    samples: int | None
    batch_size: int | None
    lr: float | None
    noise_scale: float | None
    extra: dict[str, Any]


@dataclass(frozen=True, slots=True)
class TrialCurve:
    """One trial's learning curve: who it is and its per-epoch metrics, by epoch."""

    trial_id: int
    number: int
    baseline: str | None
    status: TrialStatus
    epochs: tuple[EpochMetrics, ...]


@dataclass(frozen=True, slots=True)
class EpochOrigin:
    """Where one stored epoch of a trial came from: ``replayed`` from a shared prefix the
    trial forked from (``forked_epochs`` long), copied from the trial it ``cloned_from``
    (PBT), else trained by the trial itself; ``probe`` is the cooldown probe's value of the
    study's metric after it, if one ran."""

    epoch: int
    replayed: bool = False
    forked_epochs: int = 0
    cloned_from: int | None = None
    probe: float | None = None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    """One page of a listing: ``items`` and the ``total`` matching the filters."""

    items: tuple[T, ...]
    total: int
    limit: int
    offset: int

    @property
    def has_more(self) -> bool:
        return self.offset + len(self.items) < self.total


@dataclass(frozen=True, slots=True)
class StudyLeftovers:
    """What a deleted study left outside its rows, for a worker to remove
    (:meth:`~tuner.store.storage.StudyStore.delete_study` records it): the study's Ray Tune
    experiment directory and its neighbours on the storage path (``experiment``, see
    :func:`experiment_name`) and its Optuna studies in the database (``optuna_studies``)."""

    id: int
    study_id: int
    experiment: str
    optuna_studies: tuple[str, ...]
    requested_at: datetime
    attempts: int
    """Removals tried so far that left something behind, or that found none of the files of a
    study that ran (a worker tries again later)."""
    error: str | None
    """Why the last attempt left something behind (or found nothing)."""
    started_at: datetime | None = None
    """When the study first ran (``None``: it never ran, or it was deleted before deletes
    recorded this): one that ran left files on the storage path of the worker that ran it, so
    a worker that finds none on its own path keeps the record a while for that one."""


def optuna_study_name(study_id: int) -> str:
    """The name of a study's Optuna study, kept in the same database as the study."""
    return f"stagetune-study-{study_id}"


def optuna_study_names(study_id: int, summary: dict[str, Any] | None) -> list[str]:
    """Names a study's Optuna study may have: the one the engine wrote into its summary
    (``optuna_study``), then the one derived from its id (a study still running has no
    summary yet)."""
    names: list[str] = []
    recorded = (summary or {}).get("optuna_study")
    if isinstance(recorded, str) and recorded:
        names.append(recorded)
    derived = optuna_study_name(study_id)
    if derived not in names:
        names.append(derived)
    return names


def experiment_name(study_id: int, created_at: datetime) -> str:
    """The Ray Tune experiment directory of a study (under the Ray storage path):
    ``study-<id>-<8 hex digits of a hash of its id and creation time>``; the seed runs,
    reserves and stage-boundary states sit beside it as ``<name>.seeds``, ``<name>.reserves``
    and ``<name>.prefixes``. The id alone is not unique across databases: a study 1 of a new
    database (the old file deleted, another ``STAGETUNE_DATABASE_URL``) would otherwise resume
    another database's study 1 from the same storage path and report that study's trials as
    its own. Every worker computes the same name from the database row, so a take-over finds
    the directory."""
    if created_at.tzinfo is None:
        raise ValueError(f"naive datetime {created_at!r}: a study's creation time is UTC")
    created = created_at.astimezone(UTC).isoformat()
    token = hashlib.sha256(f"{study_id}:{created}".encode()).hexdigest()[:8]
    return f"study-{study_id}-{token}"
