"""The trial config the engine hands each trial (tuner.trial_config): one set of rules, read
the same way by the engine, the trainable's resource request and the trial loop."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tuner.errors import ValidationError
from tuner.schedule import Schedule, Stage
from tuner.spec import StudySpec
from tuner.trial_config import TrialConfig, TrialResources

SCHEDULE = Schedule(stages=(Stage(0, 2, 32), Stage(2, 4, 128)), base_lr=0.1, base_batch_size=32)


def test_defaults_and_what_a_sampler_or_tune_hands_over() -> None:
    config = TrialConfig.from_config({"schedule": SCHEDULE.to_dict(), "task": "digits"})
    assert config.schedule == SCHEDULE
    assert (config.workers, config.cpus_per_worker, config.gpus_per_worker) == (1, 1.0, 0.0)
    assert config.micro_batch is None
    assert (config.performance_aware, config.drop_last, config.amp, config.compile) == (
        False,
        True,
        True,
        False,
    )
    assert (config.eval_batch_size, config.probe_at, config.probe_fraction) == (1024, (), 0.2)
    # NumPy scalars, rank keys as JSON strings, the nested resources spelling, bookkeeping
    # keys the engine carries, probe epochs out of order.
    config = TrialConfig.from_config(
        {
            "schedule": SCHEDULE.to_dict(),
            "task": "digits",
            "seed": np.int64(7),
            "noise_scale_ema": np.float32(0.5),
            "resources": {"workers": 2, "gpus_per_worker": 0.25},
            "cpus_per_worker": 2,
            "slowdown": {"1": 2},
            "probe_at": [3, 1, 3],
            "stagetune": {"number": 4},
            "task_options": None,
        }
    )
    assert config.seed == 7
    assert type(config.seed) is int
    assert config.noise_scale_ema == 0.5
    assert (config.workers, config.cpus_per_worker, config.gpus_per_worker) == (2, 2.0, 0.25)
    assert config.slowdown == {1: 2.0}
    assert config.probe_at == (1, 3)
    assert config.task_options == {}


def test_to_config_round_trips_through_json() -> None:
    config = TrialConfig.from_config(
        {"schedule": SCHEDULE, "task": "digits", "micro_batch": 16, "probe_at": [2]}
    )
    plain = json.loads(json.dumps(config.to_config()))
    assert TrialConfig.from_config(plain) == config


def test_every_bad_key_is_named_with_its_rule() -> None:
    with pytest.raises(ValidationError) as info:
        TrialConfig.from_config(
            {
                "schedule": SCHEDULE.to_dict(),
                "task": "",
                "workers": 0,
                "compile": "yes",
                "amp": 1,
                "seed": True,
                "micro_batch": "4",
                "cpus_per_worker": 0,
                "gpus_per_worker": float("inf"),
                "noise_scale_ema": 1.0,
                "probe_fraction": 1.5,
                "probe_at": [0],
                "slowdown": {"x": 2.0, "0": 0.5},
            }
        )
    message = str(info.value)
    assert message.startswith("invalid trial config: ")
    for part in (
        "'task' must not be empty, got ''",
        "'workers' must be >= 1, got 0",
        "'compile' must be true or false, got 'yes'",
        "'amp' must be true or false, got 1",
        "'seed' must be an integer, got True",
        "'micro_batch' must be an integer, got '4'",
        "'cpus_per_worker' must be > 0",
        "'gpus_per_worker' must be a finite number, got inf",
        "'noise_scale_ema' must be < 1",
        "'probe_fraction' must be <= 1",
        "'probe_at' [0] must be >= 1, got 0",
        "'slowdown' [x] must be an integer, got 'x'",
        "'slowdown' [0] must be >= 1",
    ):
        assert part in message, part


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"task": "digits"}, "'schedule' is required (a Schedule.to_dict() mapping)"),
        ({"schedule": {"stages": []}, "task": "digits"}, "'schedule': "),
        (
            {"schedule": SCHEDULE.to_dict(), "task": "digits", "slowdown": {"3": 2.0}},
            "'slowdown' names rank 3, but there are 1 workers",
        ),
        ([1, 2], "a trial config must be a mapping, got list"),
    ],
)
def test_structural_errors(config: object, expected: str) -> None:
    with pytest.raises(ValidationError, match="invalid trial config") as info:
        TrialConfig.from_config(config)
    assert expected in str(info.value)


def test_resources_alone_need_no_schedule() -> None:
    res = TrialResources.from_config({"resources": {"workers": 3}, "gpus_per_worker": 0.5})
    assert (res.workers, res.cpus_per_worker, res.gpus_per_worker) == (3, 1.0, 0.5)
    with pytest.raises(ValidationError, match=r"'workers' must be an integer, got 2\.5"):
        TrialResources.from_config({"workers": 2.5})


def test_the_engine_checks_the_trial_config_before_any_trial_starts(tmp_path: Path) -> None:
    """A bad key in the trial config fails the run at once, naming the key; no Ray Tune
    experiment is created."""
    from tuner.engine import TuningEngine
    from tuner.spec import TaskDefaults

    spec = StudySpec.from_yaml("task: digits\nschedule: {total_epochs: 2}\nbudget: {trials: 5}")
    engine = TuningEngine(
        spec.resolve(TaskDefaults(epochs=2, base_batch_size=32, base_lr=0.1)),
        object,
        storage_path=tmp_path / "ray",
        experiment_name="study-1",
        optuna_storage=f"sqlite:///{tmp_path / 'optuna.db'}",
        optuna_study_name="study-1",
        train_size=1000,
        trial_config={"eval_batch_size": 0},
    )
    with pytest.raises(ValidationError, match=r"'eval_batch_size' must be >= 1, got 0"):
        engine.run()
    assert not (tmp_path / "ray" / "study-1").exists()
