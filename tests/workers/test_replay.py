"""``stagetune replay``: an exported schedule trained again with the trials' code."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from tests.regression_task import TASK, TASK_NAME, LinearRegression, regression_task
from tuner.schedule import PlacementHint, Schedule, Stage
from tuner.store import StudyStore, TrialStatus
from workers.cli import app
from workers.replay import ReplayResult, recorded_metric, replay, replay_config

__all__ = ["regression_task"]  # the fixture, used here

OPTIONS = {"num_train_samples": 1000, "num_val_samples": 500, "num_test_samples": 100, "width": 8}


def schedule() -> Schedule:
    return Schedule(
        stages=(Stage(0, 2, 32, warmup_epochs=0.5), Stage(2, 4, 128, lr_multiplier=0.5)),
        base_lr=0.05,
        base_batch_size=32,
    )


def exported(**provenance: Any) -> Schedule:
    prov = {
        "task": "mnist1d",
        "task_options": OPTIONS,
        "seed": 7,
        "tuned_on": {"world_size": 2, "micro_batch": 16},
        "metrics": {"val_accuracy": 0.5},
        **provenance,
    }
    return Schedule(
        stages=schedule().stages,
        base_lr=0.05,
        base_batch_size=32,
        placement=PlacementHint(2, 16),
        provenance=prov,
    )


def test_replay_defaults_come_from_the_provenance() -> None:
    config, notes = replay_config(exported())
    assert config["task"] == "mnist1d"
    assert config["task_options"] == OPTIONS
    assert (config["seed"], config["workers"], config["micro_batch"]) == (7, 2, 16)
    assert "provenance" not in config["schedule"]
    assert Schedule.from_dict(config["schedule"]).stages == schedule().stages
    assert notes == []


def test_replay_says_when_it_is_not_the_recorded_run() -> None:
    config, notes = replay_config(exported(), "digits", seed=1, workers=1)
    assert config["task_options"] == {}  # mnist1d's options do not apply to digits
    text = " ".join(notes)
    assert "tuned on task 'mnist1d', not 'digits'" in text
    assert "seed 1 differs from the trial's seed 7" in text
    assert "1 workers instead of the 2" in text


def test_replay_compares_after_the_epochs_a_stopped_trial_ran() -> None:
    epochs = tuple({"epoch": e, "val_accuracy": 0.1 * (e + 1)} for e in range(4))
    result = ReplayResult(
        task="mnist1d", task_options={}, seed=0, workers=1, micro_batch=None, epochs=epochs,
        wall_time_s=1.0, recorded_value=0.25, recorded_from="study 1, trial 2",
        recorded_epochs=2,
    )  # fmt: skip
    assert result.metric == "val_accuracy"
    assert result.val_accuracy == result.value == pytest.approx(0.4)
    assert result.difference_points == result.difference == pytest.approx(-5.0)  # 0.2 vs 0.25
    assert result.recorded_val_accuracy == 0.25
    assert result.summary() == (
        "replayed val accuracy 40.00%; after 2 epochs (where the recorded trial stopped) "
        "20.00%, recorded 25.00% (study 1, trial 2): -5.00 points"
    )


def test_replay_compares_the_recorded_metric_in_its_own_units() -> None:
    epochs = tuple(
        {"epoch": e, "val_loss": 0.5 / (e + 1), "val_mse": 1.0 / (e + 1)} for e in range(3)
    )
    result = ReplayResult(
        task=TASK_NAME, task_options={}, seed=0, workers=1, micro_batch=None, epochs=epochs,
        wall_time_s=1.0, recorded_value=0.3, recorded_from="study 4, trial 0", metric="val_mse",
    )  # fmt: skip
    assert result.value == pytest.approx(1 / 3)
    assert result.difference == pytest.approx(1 / 3 - 0.3)  # not in points
    assert (result.val_accuracy, result.recorded_val_accuracy, result.difference_points) == (
        None,
        None,
        None,
    )
    assert result.summary() == (
        "replayed val mse 0.3333, recorded 0.3 (study 4, trial 0): +0.03333 "
        "(in the metric's own units)"
    )
    psnr = dataclasses.replace(
        result, epochs=({"epoch": 0, "val_psnr": 27.31},), recorded_value=27.4, metric="val_psnr"
    )
    assert psnr.summary().endswith(
        "replayed val psnr 27.31 dB, recorded 27.40 dB (study 4, trial 0): -0.09 dB"
    )
    missing = dataclasses.replace(result, recorded_value=None)
    assert missing.difference is None
    assert missing.summary() == "replayed val mse 0.3333, no recorded val mse to compare with"


def test_replay_reads_the_metric_the_provenance_records(
    regression_task: LinearRegression,
) -> None:
    # An export from before studies named their metric: validation accuracy.
    assert recorded_metric(exported()) == "val_accuracy"
    recorded = {"metric": "val_mse", "metric_value": 0.02, "val_accuracy": None, "val_loss": 0.01}
    regression = exported(task=TASK_NAME, task_options={}, metrics=recorded)
    assert recorded_metric(regression) == "val_mse"
    assert recorded_metric(regression, TASK_NAME) == "val_mse"
    # Another task than the recorded one: its own primary metric (nothing is comparable).
    assert recorded_metric(regression, "digits") == "val_accuracy"
    # No recorded metric, and a task without accuracy: the task's primary metric.
    assert recorded_metric(exported(task=TASK_NAME, task_options={}, metrics={})) == "val_mse"
    assert recorded_metric(exported(), TASK_NAME) == "val_mse"
    _, notes = replay_config(regression, "digits")
    assert "metrics are not comparable" in " ".join(notes)


@pytest.mark.slow
@pytest.mark.ray
def test_replay_reproduces_the_recorded_accuracy_of_a_mnist1d_trial(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    from workers.trainable import ScheduleTrainable

    sched = schedule()
    config = {
        "schedule": sched.to_dict(),
        "task": "mnist1d",
        "task_options": OPTIONS,
        "seed": 7,
        "workers": 2,
        "cpus_per_worker": 1.0,
        "gpus_per_worker": 0.0,
        "micro_batch": 16,
        "performance_aware": False,
    }
    # The trial, as Ray Tune runs it (ScheduleTrainable.step() per epoch).
    trainable = ScheduleTrainable(config)
    try:
        results = [trainable.train()]
        while not results[-1]["done"]:
            results.append(trainable.train())
    finally:
        trainable.stop()
    last = results[-1]
    assert last["val_accuracy"] > 0.15  # it learned something (chance is 0.10)

    # Recorded in a study like the engine records it, then exported with provenance.
    store = StudyStore.from_url(sqlite_url, create=True)
    try:
        spec = {"task": "mnist1d", "task_options": OPTIONS, "seed": 7,
                "resources": {"workers": 2, "micro_batch": 16}}  # fmt: skip
        study = store.create_study("mnist1d", spec, budget=1)
        store.claim_study("w", stale_after_s=60)
        trial = store.create_trial(study.id, 0, sched.to_dict(), {})
        store.finish_trial(
            trial.id,
            TrialStatus.COMPLETED,
            final={
                "val_accuracy": last["val_accuracy"],
                "steps": last["steps"],
                "samples": last["samples"],
                "wall_time_s": last["wall_time_s"],
            },
        )
        store.set_best(study.id, trial.id, last["val_accuracy"])
    finally:
        store.close()
    path = tmp_path / "best.yaml"
    runner = CliRunner()
    exported_run = runner.invoke(
        app, ["export", str(study.id), "--database-url", sqlite_url, "--out", str(path)]
    )
    assert exported_run.exit_code == 0, exported_run.output

    replayed = runner.invoke(
        app, ["replay", str(path), "--task", "mnist1d", "--seed", "7", "--tolerance", "1"]
    )
    assert replayed.exit_code == 0, (replayed.stdout, replayed.stderr, replayed.exception)
    match = re.search(r"recorded ([\d.]+)% \(study \d+, trial 0\): ([+-][\d.]+) points",
                      replayed.stdout)  # fmt: skip
    assert match, replayed.stdout
    assert float(match.group(1)) == pytest.approx(100 * last["val_accuracy"], abs=0.006)
    assert abs(float(match.group(2))) <= 1.0
    assert "epoch 3: batch 128" in replayed.stderr


@pytest.mark.slow
@pytest.mark.ray
def test_replay_of_a_regression_study_compares_its_metric(
    ray_session: None, regression_task: LinearRegression, sqlite_url: str, tmp_path: Path
) -> None:
    """A study of the regression task's primary metric (val_mse, minimised): the trial as a
    replay trains it, recorded and exported, then replayed from the CLI with the task file."""
    import ray.cloudpickle

    # Ray's workers cannot import the tests package: they get the task by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[TASK.__module__])  # type: ignore[no-untyped-call]
    sched = Schedule(
        stages=(Stage(0, 2, 16, warmup_epochs=0.5), Stage(2, 3, 32, lr_multiplier=0.5)),
        base_lr=0.05,
        base_batch_size=16,
    )
    trial_run = replay(
        dataclasses.replace(sched, provenance={"task": TASK_NAME, "seed": 7}),
        seed=7,
        workers=1,
        tasks=(TASK,),
    )
    assert trial_run.metric == "val_mse"
    assert {"val_loss", "val_mse"} <= set(trial_run.epochs[-1])
    assert "val_accuracy" not in trial_run.epochs[-1]
    mse, loss = trial_run.value, trial_run.epochs[-1]["val_loss"]
    assert mse is not None
    assert mse < 0.5  # it learned (the targets' variance is about 6.5)
    assert loss == pytest.approx(mse / 2)

    store = StudyStore.from_url(sqlite_url, create=True)
    try:
        spec = {"task": TASK_NAME, "seed": 7, "resources": {"workers": 1}}
        study = store.create_study(TASK_NAME, spec, budget=1)
        store.claim_study("w", stale_after_s=60)
        trial = store.create_trial(study.id, 0, sched.to_dict(), {})
        last = trial_run.epochs[-1]
        store.finish_trial(
            trial.id,
            TrialStatus.COMPLETED,
            final={"metric_value": mse, "val_loss": loss, "steps": last["steps"]},
        )
        store.set_best(study.id, trial.id, mse)
    finally:
        store.close()
    path = tmp_path / "best.yaml"
    runner = CliRunner()
    exported_run = runner.invoke(
        app, ["export", str(study.id), "--database-url", sqlite_url, "--out", str(path)]
    )
    assert exported_run.exit_code == 0, exported_run.output
    task_file = str(Path(__file__).resolve().parents[1] / "regression_task.py")
    replayed = runner.invoke(
        app, ["replay", str(path), "--task-file", task_file, "--tolerance", "0.001"]
    )
    assert replayed.exit_code == 0, (replayed.stdout, replayed.stderr, replayed.exception)
    match = re.search(
        r"replayed val mse ([\d.]+), recorded ([\d.]+) \(study \d+, trial 0\): ([+-][\d.e-]+) "
        r"\(in the metric's own units\)",
        replayed.stdout,
    )
    assert match, replayed.stdout
    assert float(match.group(2)) == pytest.approx(mse, rel=1e-3)
    assert abs(float(match.group(3))) <= 0.001
    assert re.search(r"epoch 2: batch 32, lr [\d.e-]+, val mse [\d.]+", replayed.stderr)

    # A recorded value 0.05 off: --tolerance bounds the difference in the metric's units.
    document = yaml.safe_load(path.read_text(encoding="utf-8"))
    document["provenance"]["metrics"]["metric_value"] = mse + 0.05
    path.write_text(yaml.safe_dump(document), encoding="utf-8")
    strict = runner.invoke(
        app, ["replay", str(path), "--task-file", task_file, "--tolerance", "0.01"]
    )
    assert strict.exit_code == 1, (strict.stdout, strict.stderr)
    assert re.search(
        r"the replay differs by 0\.050*\d* \(val mse, in its own units\), more than "
        r"--tolerance 0\.01",
        strict.stderr,
    ), strict.stderr
