"""Export: schedule YAML with provenance from the store, the published schema, re-targeting."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.regression_task import TASK_NAME, LinearRegression, regression_task
from tuner.errors import InvalidStateError, NotFoundError
from tuner.export import (
    ExportValidationError,
    export_schedule,
    export_yaml,
    render_yaml,
    schedule_schema,
    validate_document,
)
from tuner.retarget import RetargetError, retarget
from tuner.schedule import Schedule, Stage
from tuner.store import StudyStore, TrialStatus

__all__ = ["regression_task"]  # the fixture, used here

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "schedule.yaml"
N = 4096
WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=UTC)
SPEC: dict[str, Any] = {
    "task": "mnist1d",
    "name": "export-test",
    "task_options": {"num_samples": 4000},
    "seed": 5,
    "objective": {"kind": "accuracy", "max_mean_batch_size": 256},
    "resources": {"workers": 2, "micro_batch": 32},
}


def tuned() -> Schedule:
    return Schedule(
        stages=(
            Stage(0, 3, 64, warmup_epochs=1.0),
            Stage(
                3,
                8,
                256,
                lr_multiplier=0.5,
                warmup_epochs=0.5,
                decay="cosine",
                decay_final_factor=0.2,
            ),
            Stage(
                8, 12, 1024, lr_multiplier=0.25, decay="step", step_every_epochs=2.0, step_gamma=0.5
            ),
        ),
        base_lr=0.05,
        base_batch_size=64,
        label_smoothing=0.1,
        warmup_start_lr=0.005,
    )


@pytest.fixture
def store(sqlite_url: str) -> Iterator[StudyStore]:
    s = StudyStore.from_url(sqlite_url, create=True)
    yield s
    s.close()


def seed_study(store: StudyStore, *, best: bool = True) -> tuple[int, int]:
    """A running study with a completed tuned trial (number 1) and a baseline (number 0)."""
    study = store.create_study("mnist1d", SPEC, budget=4, name="export-test")
    store.claim_study("worker-1", stale_after_s=60)
    base = store.create_trial(
        study.id, 0, Schedule.constant(64, 12, base_lr=0.05).to_dict(), {}, baseline="small"
    )
    store.finish_trial(base.id, TrialStatus.COMPLETED, final={"val_accuracy": 0.7})
    trial = store.create_trial(study.id, 1, tuned().to_dict(), {"seed": 1234})
    store.finish_trial(
        trial.id,
        TrialStatus.COMPLETED,
        final={
            "val_accuracy": 0.8125,
            "val_loss": 0.61,
            "steps": tuned().total_steps(N),
            "samples": tuned().samples_seen(N),
            "wall_time_s": 42.5,
            "mean_batch_size": tuned().mean_batch_size(N),
        },
    )
    if best:
        store.set_best(study.id, trial.id, 0.8125)
    return study.id, trial.id


# ------------------------------------------------------------------------------ export


def test_export_of_the_best_trial_carries_provenance_and_round_trips(store: StudyStore) -> None:
    study_id, _ = seed_study(store)
    schedule = export_schedule(store, study_id, exported_at=WHEN)
    prov = schedule.provenance
    assert prov is not None
    assert prov["study_id"] == study_id
    assert prov["study_name"] == "export-test"
    assert prov["task"] == "mnist1d"
    assert prov["task_options"] == {"num_samples": 4000}
    assert prov["objective"] == {"kind": "accuracy", "max_mean_batch_size": 256}
    assert prov["trial_number"] == 1
    assert prov["seed"] == 1234
    assert prov["metrics"]["val_accuracy"] == 0.8125
    # The study's metric: validation accuracy (an accuracy study; its trial was stored without
    # metric_value, so its val_accuracy stands in).
    assert (prov["metrics"]["metric"], prov["metrics"]["metric_value"]) == ("val_accuracy", 0.8125)
    assert prov["metrics"]["steps"] == tuned().total_steps(N)
    assert prov["metrics"]["wall_time_s"] == 42.5
    assert prov["metrics"]["mean_batch_size"] == pytest.approx(tuned().mean_batch_size(N))
    assert prov["tuned_on"] == {"world_size": 2, "micro_batch": 32}
    assert prov["exported_at"] == "2026-03-04T05:06:07Z"
    assert prov["stagetune_version"]
    assert schedule.placement is not None
    assert (schedule.placement.world_size, schedule.placement.micro_batch) == (2, 32)

    text = export_yaml(store.get_study(study_id), store.get_trial(study_id, 1), exported_at=WHEN)
    assert text.startswith("# stagetune schedule (format version 1)")
    back = Schedule.from_yaml(text)
    assert back == schedule
    assert back.stages == tuned().stages
    assert back.provenance == schedule.provenance
    validate_document(yaml.safe_load(text), export=True)

    baseline = export_schedule(store, study_id, trial_number=0)
    assert baseline.provenance is not None
    assert baseline.provenance["baseline"] == "small"
    assert baseline.summary() == "64@0-12"


def test_export_errors_say_what_is_missing(store: StudyStore) -> None:
    study_id, _ = seed_study(store, best=False)
    with pytest.raises(InvalidStateError, match=r"no best trial yet.*--trial N"):
        export_schedule(store, study_id)
    with pytest.raises(NotFoundError, match="no trial number 9"):
        export_schedule(store, study_id, trial_number=9)
    with pytest.raises(NotFoundError, match="study 999"):
        export_schedule(store, 999)
    store.create_trial(study_id, 2, tuned().to_dict(), {})
    with pytest.raises(InvalidStateError, match="still running"):
        export_schedule(store, study_id, trial_number=2)


def _regression_study(
    store: StudyStore, objective: dict[str, Any], *, summary: dict[str, Any] | None = None
) -> int:
    """A finished study of the regression task with one completed trial (number 0), its
    final validation loss 0.12 and MSE 0.24; ``metric_value`` is the study metric's."""
    spec = {"task": TASK_NAME, "seed": 3, "objective": objective, "resources": {"workers": 1}}
    study = store.create_study(TASK_NAME, spec, budget=1, name="regression")
    store.claim_study("worker-1", stale_after_s=60)
    metric = objective.get("metric", "val_mse")
    trial = store.create_trial(study.id, 0, tuned().to_dict(), {"seed": 3})
    store.finish_trial(
        trial.id,
        TrialStatus.COMPLETED,
        final={
            "val_loss": 0.12,
            "metric_value": {"val_loss": 0.12, "val_mse": 0.24}[metric],
            "steps": tuned().total_steps(N),
            "wall_time_s": 3.5,
            "mean_batch_size": tuned().mean_batch_size(N),
        },
    )
    store.set_best(study.id, trial.id, 0.12)
    if summary is not None:
        store.finish_study(study.id, "completed", summary=summary, worker_id="worker-1")
    return study.id


def test_export_of_a_loss_study_records_its_metric_and_value(
    store: StudyStore, regression_task: LinearRegression
) -> None:
    study_id = _regression_study(store, {"kind": "accuracy", "metric": "val_loss"})
    schedule = export_schedule(store, study_id, exported_at=WHEN)
    prov = schedule.provenance
    assert prov is not None
    assert prov["objective"] == {"kind": "accuracy", "metric": "val_loss"}  # the spec's
    metrics = prov["metrics"]
    assert (metrics["metric"], metrics["metric_value"]) == ("val_loss", 0.12)
    assert (metrics["val_accuracy"], metrics["val_loss"]) == (None, 0.12)
    document = yaml.safe_load(render_yaml(schedule))
    validate_document(document, export=True)
    assert Schedule.from_dict(document).provenance == prov


def test_export_names_the_task_primary_metric_or_the_summary_metric(
    store: StudyStore, regression_task: LinearRegression
) -> None:
    # No objective.metric and no summary yet (a running study): the task's primary metric.
    running = _regression_study(store, {"kind": "accuracy"})
    metrics = export_schedule(store, running).provenance["metrics"]  # type: ignore[index]
    assert (metrics["metric"], metrics["metric_value"]) == ("val_mse", 0.24)
    # A finished study: the metric the engine wrote in its summary.
    summary = {"objective": {"kind": "accuracy", "metric": "val_mse", "metric_direction": "min"}}
    done = _regression_study(store, {"kind": "accuracy"}, summary=summary)
    metrics = export_schedule(store, done).provenance["metrics"]  # type: ignore[index]
    assert (metrics["metric"], metrics["metric_value"]) == ("val_mse", 0.24)
    validate_document(export_schedule(store, done).to_dict(), export=True)


# ------------------------------------------------------------------------------ schema


def test_schema_accepts_the_example_and_every_export() -> None:
    if EXAMPLE.exists():
        validate_document(yaml.safe_load(EXAMPLE.read_text(encoding="utf-8")))
    validate_document(tuned().to_dict())


@pytest.mark.parametrize(
    ("change", "where"),
    [
        (lambda d: d.pop("stages"), "stages"),
        (lambda d: d.update(version=2), "version"),
        (lambda d: d.update(speed=1), "speed"),
        (lambda d: d["stages"][1].update(batch_size=0), "stages[1].batch_size"),
        (lambda d: d["stages"][0].update(decay="exponential"), "stages[0].decay"),
        (lambda d: d["stages"][0].update(batchsize=64), "batchsize"),
        (lambda d: d["units"].update(time="steps"), "units.time"),
        (lambda d: d.update(placement={"world_size": 0}), "placement"),
        (lambda d: d.update(provenance={"metrics": {"val_accuracy": "high"}}), "provenance"),
    ],
)
def test_schema_rejects_malformed_documents(change: Any, where: str) -> None:
    document = tuned().to_dict()
    change(document)
    with pytest.raises(ExportValidationError) as info:
        validate_document(document)
    assert where in str(info.value)


def test_schema_takes_provenance_metrics_with_and_without_the_study_metric(
    store: StudyStore,
) -> None:
    study_id, _ = seed_study(store)
    document = export_schedule(store, study_id).to_dict()
    validate_document(document, export=True)
    # Exported before studies named their metric: no metric / metric_value, still valid.
    for key in ("metric", "metric_value"):
        del document["provenance"]["metrics"][key]
    validate_document(document, export=True)
    document["provenance"]["metrics"]["metric"] = "accuracy"  # not val_<name>
    with pytest.raises(ExportValidationError, match=r"provenance\.metrics\.metric"):
        validate_document(document, export=True)


def test_export_validation_requires_the_full_provenance() -> None:
    document = dataclasses.replace(tuned(), provenance={"task": "mnist1d"}).to_dict()
    validate_document(document)  # a free-form provenance is a valid schedule document
    with pytest.raises(ExportValidationError, match="study_id"):
        validate_document(document, export=True)


def test_schema_stage_properties_are_the_stage_fields() -> None:
    schema = schedule_schema()
    stage_props = set(schema["$defs"]["stage"]["properties"])
    assert stage_props == {f.name for f in dataclasses.fields(Stage)}
    required = set(schema["$defs"]["stage"]["required"])
    assert required == {
        f.name
        for f in dataclasses.fields(Stage)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    }
    top = set(schema["properties"]) - {"version", "units"}
    assert top == {f.name for f in dataclasses.fields(Schedule) if f.init}


# ------------------------------------------------------------------------------ re-targeting


@pytest.mark.parametrize(("world", "micro"), [(8, None), (8, 16), (1, None), (1, 48)])
def test_retarget_keeps_global_batch_and_lr_at_every_step(
    store: StudyStore, world: int, micro: int | None
) -> None:
    study_id, _ = seed_study(store)
    exported = export_schedule(store, study_id)
    assert exported.placement is not None
    assert exported.placement.world_size == 2
    source = list(exported.iter_steps(N))

    placed = retarget(exported, world, micro)
    target = list(placed.iter_steps(N))
    assert [(s.step.batch_size, s.step.lr) for s in target] == [
        (s.batch_size, s.lr) for s in source
    ]
    for s in target:
        p = s.placement
        assert len(p.local_batches) == world
        assert all(len(m) == p.accumulation_steps for m in p.micro_batches)
        assert sum(sum(m) for m in p.micro_batches) == s.step.batch_size
        if micro is not None:
            assert p.max_micro_batch <= micro
    # The re-targeted YAML says where it runs now and where it was tuned.
    back = Schedule.from_yaml(placed.to_yaml())
    assert back.stages == exported.stages
    assert back.placement is not None
    assert (back.placement.world_size, back.placement.micro_batch) == (world, micro)
    assert back.provenance is not None
    assert back.provenance["tuned_on"] == {"world_size": 2, "micro_batch": 32}


def test_retarget_reports_every_stage_that_cannot_be_placed() -> None:
    with pytest.raises(RetargetError) as info:
        retarget(tuned(), 48)
    message = str(info.value)
    assert message.startswith("cannot re-target the schedule to 48 workers")
    assert "stage 1 (epochs 0-3)" in message
    assert "stage 2 (epochs 3-8)" in message
    assert "stage 3 (epochs 8-12)" in message
    assert len(info.value.problems) == 3
    # And what would work instead.
    assert info.value.advice == (
        "world sizes up to 48 that work: 32, 16, 8, 4, 2, 1 (the schedule's smallest global "
        "batch is 64; for more workers, tune with larger batches)",
    )
    assert message.endswith(info.value.advice[0])
