"""``stagetune replay``: an exported schedule trained again with the trials' code."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from tuner.schedule import PlacementHint, Schedule, Stage
from tuner.store import StudyStore, TrialStatus
from workers.cli import app
from workers.replay import ReplayResult, replay_config

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
        wall_time_s=1.0, recorded_val_accuracy=0.25, recorded_from="study 1, trial 2",
        recorded_epochs=2,
    )  # fmt: skip
    assert result.val_accuracy == pytest.approx(0.4)
    assert result.difference_points == pytest.approx(-5.0)  # 0.2 after 2 epochs vs 0.25
    assert "after 2 epochs" in result.summary()


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
