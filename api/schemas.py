"""Response bodies of the REST API: pydantic models built from the store's frozen records.

Nothing here touches the database; the routers fetch records and convert them with the
``from_record`` constructors, so the API never exposes ORM objects or internal fields by
accident.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tuner.objectives import study_metric
from tuner.schedule import schedule_summary
from tuner.store.records import (
    EpochMetrics,
    Page,
    StudyRecord,
    StudyStatus,
    TrialCurve,
    TrialRecord,
    TrialStatus,
)


class Schema(BaseModel):
    model_config = ConfigDict(frozen=True)


# --- errors -------------------------------------------------------------------------------


class ErrorDetail(Schema):
    field: str = Field(description="Dotted path of the offending field ('' if none).")
    loc: list[str | int] = Field(description="Where the field is: body/query/path + keys.")
    message: str
    type: str


class ErrorInfo(Schema):
    code: str = Field(description="Machine-readable: validation_error, not_found, conflict, ...")
    message: str
    details: list[ErrorDetail] = Field(default_factory=list)


class ErrorBody(Schema):
    """The body of every 4xx and 5xx response."""

    error: ErrorInfo


# --- studies ------------------------------------------------------------------------------


class Progress(Schema):
    budget: int = Field(description="Trials the study may run (baselines included).")
    trials_done: int = Field(description="Trials in a finished state.")
    trials_running: int
    trials_remaining: int


class BestTrial(Schema):
    number: int
    value: float | None = Field(
        description="The objective value of the best trial so far; for a result picked on "
        "fresh seeds, its mean over them (see `seeds`, `std`)."
    )
    schedule_summary: str | None = Field(
        None,
        description="The best schedule in one line, e.g. '64@0-3 -> 256@3-8 (lr x0.5)': "
        "batch@start-end epochs per stage, with the stage's LR multiplier where it is not 1.",
    )
    baseline: str | None = Field(
        None, description="The baseline the best trial is (null: a tuned schedule)."
    )
    seeds: int | None = Field(
        None, description="Fresh seeds `value` is the mean over (null: one run)."
    )
    std: float | None = Field(None, description="Standard deviation of `value` over the seeds.")


class StudyOut(Schema):
    """A study as listed: status, progress and best trial so far."""

    id: int
    name: str | None
    owner: str | None
    task: str
    metric: str = Field(
        description="The validation metric the study optimises (objective.metric, else the "
        "task's primary metric: val_accuracy for classification); each trial's "
        "`metric_value` is its final value of it."
    )
    metric_direction: Literal["max", "min"] = Field(
        description="Whether larger (max) or smaller (min) values of `metric` are better, as "
        "the task declares it."
    )
    status: StudyStatus
    cancel_requested: bool
    progress: Progress
    best: BestTrial | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    heartbeat_at: datetime | None
    worker_id: str | None
    attempts: int
    error: str | None = Field(
        description="Why the study failed; for a queued study, why the worker that claimed it "
        "last gave it back without starting it (Ray unreachable), until its next claim."
    )

    @classmethod
    def from_record(cls, study: StudyRecord, schedule_summary: str | None = None) -> StudyOut:
        return cls(**_study_fields(study, schedule_summary))


class StudyDetail(StudyOut):
    """One study in full: its spec and the engine's comparison against the baselines."""

    spec: dict[str, Any]
    summary: dict[str, Any] | None

    @classmethod
    def from_record(cls, study: StudyRecord, schedule_summary: str | None = None) -> StudyDetail:
        return cls(**_study_fields(study, schedule_summary), spec=study.spec, summary=study.summary)


def _study_fields(study: StudyRecord, schedule_summary: str | None) -> dict[str, Any]:
    best = None
    if study.best_trial_number is not None:
        seeds: Mapping[str, Any] = {}
        doc = (study.summary or {}).get("best")
        if isinstance(doc, Mapping) and doc.get("number") == study.best_trial_number:
            found = doc.get("seeds")
            seeds = found if isinstance(found, Mapping) else {}
        best = BestTrial(
            number=study.best_trial_number,
            value=study.best_value,
            schedule_summary=schedule_summary,
            baseline=study.best_trial_baseline,
            seeds=len(seeds["seeds"]) if seeds.get("seeds") else None,
            std=seeds.get("std") if seeds.get("seeds") else None,
        )
    metric, direction = study_metric(study.spec, study.summary)
    return {
        "id": study.id,
        "name": study.name,
        "owner": study.owner,
        "task": study.task,
        "metric": metric,
        "metric_direction": direction,
        "status": study.status,
        "cancel_requested": study.cancel_requested,
        "progress": Progress(
            budget=study.budget,
            trials_done=study.trials_done,
            trials_running=study.trials_running,
            trials_remaining=study.trials_remaining,
        ),
        "best": best,
        "created_at": study.created_at,
        "started_at": study.started_at,
        "finished_at": study.finished_at,
        "heartbeat_at": study.heartbeat_at,
        "worker_id": study.worker_id,
        "attempts": study.attempts,
        "error": study.error,
    }


class PageOut(Schema):
    total: int = Field(description="Items matching the filters, over all pages.")
    limit: int
    offset: int


class StudyPage(PageOut):
    items: list[StudyOut]


# --- trials -------------------------------------------------------------------------------


class TrialOut(Schema):
    id: int
    study_id: int
    number: int
    baseline: str | None = Field(description="Baseline name, or null for a tuned trial.")
    status: TrialStatus
    stop_reason: str | None
    started_at: datetime
    finished_at: datetime | None
    epochs_done: int
    metric_value: float | None = Field(
        description="The trial's final value of the study's metric (the study's `metric`: "
        "val_accuracy for classification); null until it finishes or when not reported."
    )
    val_accuracy: float | None
    val_loss: float | None
    steps: int | None
    samples: int | None
    wall_time_s: float | None
    mean_batch_size: float | None
    objective_values: dict[str, float | None] | None
    schedule_summary: str | None
    schedule: dict[str, Any]
    params: dict[str, Any]
    restarts: int = Field(
        description="How many times the trial was started again after its first start: a "
        "study resumed after its worker was lost (taken over, or released and claimed again) "
        "re-runs its unfinished trials from the first epoch. 0 for a trial that ran once."
    )
    restart_reason: str | None = Field(
        description="What became of the previous run when the trial was last started "
        "again, and on which claim of the study (null if it never was)."
    )

    @classmethod
    def from_record(cls, trial: TrialRecord, metric: str = "val_accuracy") -> TrialOut:
        """``metric``: the study's (:func:`tuner.objectives.study_metric`), for a trial stored
        before trials kept their metric's value."""
        summary = trial.schedule_summary
        if summary is None:  # an invalid schedule, or a trial stored by an older version
            summary = schedule_summary(trial.schedule)
        return cls(
            id=trial.id,
            study_id=trial.study_id,
            number=trial.number,
            baseline=trial.baseline,
            status=trial.status,
            stop_reason=trial.stop_reason,
            started_at=trial.started_at,
            finished_at=trial.finished_at,
            epochs_done=trial.epochs_done,
            metric_value=trial.metric(metric),
            val_accuracy=trial.val_accuracy,
            val_loss=trial.val_loss,
            steps=trial.steps,
            samples=trial.samples,
            wall_time_s=trial.wall_time_s,
            mean_batch_size=trial.mean_batch_size,
            objective_values=trial.objective_values,
            schedule_summary=summary,
            schedule=trial.schedule,
            params=trial.params,
            restarts=trial.restarts,
            restart_reason=trial.restart_reason,
        )


class TrialPage(PageOut):
    items: list[TrialOut]


class EpochOut(Schema):
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

    @classmethod
    def from_record(cls, m: EpochMetrics) -> EpochOut:
        return cls(
            epoch=m.epoch,
            val_accuracy=m.val_accuracy,
            val_loss=m.val_loss,
            train_loss=m.train_loss,
            epoch_time_s=m.epoch_time_s,
            samples_per_s=m.samples_per_s,
            steps=m.steps,
            samples=m.samples,
            batch_size=m.batch_size,
            lr=m.lr,
            noise_scale=m.noise_scale,
            extra=m.extra,
        )


class TrialMetricsOut(Schema):
    """One trial's per-epoch metrics, in epoch order."""

    study_id: int
    trial_id: int
    number: int
    baseline: str | None
    status: TrialStatus
    epochs: list[EpochOut]


class StudyMetricsOut(PageOut):
    """One page of a study's learning curves: trials in number order, each with its
    per-epoch metrics; ``total`` counts the study's trials."""

    study_id: int
    trials: list[TrialMetricsOut]

    @classmethod
    def from_page(cls, study_id: int, page: Page[TrialCurve]) -> StudyMetricsOut:
        # Validated in one call from plain data: a page holds thousands of epoch rows, and
        # building a model object per row in Python costs several times more.
        return cls.model_validate(
            {
                "study_id": study_id,
                "total": page.total,
                "limit": page.limit,
                "offset": page.offset,
                "trials": [
                    {
                        "study_id": study_id,
                        "trial_id": curve.trial_id,
                        "number": curve.number,
                        "baseline": curve.baseline,
                        "status": curve.status,
                        "epochs": [_epoch_fields(m) for m in curve.epochs],
                    }
                    for curve in page.items
                ],
            }
        )


def _epoch_fields(m: EpochMetrics) -> dict[str, Any]:
    return {
        "epoch": m.epoch,
        "val_accuracy": m.val_accuracy,
        "val_loss": m.val_loss,
        "train_loss": m.train_loss,
        "epoch_time_s": m.epoch_time_s,
        "samples_per_s": m.samples_per_s,
        "steps": m.steps,
        "samples": m.samples,
        "batch_size": m.batch_size,
        "lr": m.lr,
        "noise_scale": m.noise_scale,
        "extra": m.extra,
    }


# --- service ------------------------------------------------------------------------------


class TaskInfo(Schema):
    name: str
    options_schema: dict[str, Any] | None = Field(
        description="JSON schema of the task's `task_options` (null: the task publishes none; "
        "its options are then checked by the worker when the study starts)."
    )
    option_defaults: dict[str, Any] = Field(
        description="The value each option has when a spec leaves it out (options without a "
        "default are required)."
    )
    metrics: dict[str, Literal["max", "min"]] = Field(
        description="The validation metrics the task reports, each with its direction; "
        "`objective.metric` may name any of them."
    )
    primary_metric: str = Field(description="The metric a study optimises by default.")


class TasksOut(Schema):
    tasks: list[str] = Field(description="Registered task names a spec may use.")
    details: list[TaskInfo] = Field(description="Each task's options: schema and defaults.")


class HealthOut(Schema):
    status: Literal["ok"]
    version: str = Field(description="The stagetune version serving.")
    database: Literal["ok"]
    schema_revision: str = Field(description="The database schema's migration revision.")


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries for error statuses, all with the :class:`ErrorBody`."""
    return {status: {"model": ErrorBody} for status in statuses}
