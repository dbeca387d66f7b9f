"""StudySpec: defaults, YAML/JSON loading, and errors that name the field and the reason."""

from __future__ import annotations

import json

import pydantic
import pytest

from tuner.errors import ValidationError
from tuner.spec import (
    AccuracyObjective,
    ParetoObjective,
    StudySpec,
    TaskDefaults,
    TimeToAccuracyObjective,
)

DEFAULTS = TaskDefaults(
    epochs=30, base_batch_size=32, base_lr=0.05, optimizer="sgd", momentum=0.9, weight_decay=5e-4
)


def errors_of(text: str) -> str:
    with pytest.raises(ValidationError) as info:
        StudySpec.from_yaml(text)
    return str(info.value)


def test_task_alone_is_a_valid_spec_with_sane_defaults() -> None:
    spec = StudySpec.from_yaml("task: mnist1d")
    assert spec.baselines is True
    assert isinstance(spec.objective, AccuracyObjective)
    assert spec.budget.trials > 3  # room for tuned trials after the three baselines
    assert spec.resources.workers == 1
    resolved = spec.resolve(DEFAULTS)
    assert resolved.total_epochs == 30
    assert resolved.base_batch_size == 32
    assert resolved.base_lr == 0.05
    assert resolved.weight_decay == 5e-4
    assert (resolved.batch_min, resolved.batch_max) == (32, 512)


def test_a_trial_epoch_budget_is_optional_and_parses() -> None:
    assert StudySpec.from_yaml("task: mnist1d").budget.trial_epochs is None
    spec = StudySpec.from_yaml("task: mnist1d\nbudget: {trials: 200, trial_epochs: 400}")
    assert (spec.budget.trials, spec.budget.trial_epochs) == (200, 400)


def test_explicit_settings_win_over_task_defaults() -> None:
    spec = StudySpec.from_yaml(
        "task: digits\nschedule: {total_epochs: 5, base_lr: 0.2, base_batch_size: 16, "
        "optimizer: adamw, weight_decay: 0.01}\nspace: {batch_size: {min: 16, max: 64}}"
    )
    resolved = spec.resolve(DEFAULTS)
    assert (resolved.total_epochs, resolved.base_lr, resolved.base_batch_size) == (5, 0.2, 16)
    assert (resolved.optimizer, resolved.weight_decay, resolved.momentum) == ("adamw", 0.01, 0.9)
    assert (resolved.batch_min, resolved.batch_max) == (16, 64)


def test_json_and_yaml_give_the_same_spec() -> None:
    doc = {
        "task": "mnist1d",
        "objective": {"kind": "time_to_accuracy", "target_accuracy": 0.8, "cost": "wall_time"},
        "budget": {"trials": 10},
    }
    from_json = StudySpec.from_yaml(json.dumps(doc))
    assert isinstance(from_json.objective, TimeToAccuracyObjective)
    assert from_json.objective.cost == "wall_time"
    assert StudySpec.from_yaml(from_json.to_yaml()) == from_json
    assert StudySpec.from_dict(from_json.to_dict()) == from_json


@pytest.mark.parametrize(
    ("text", "field", "reason"),
    [
        ("task: nope", "task", "unknown task 'nope'"),
        ("task: mnist1d\nspace: {batch_sise: {min: 3}}", "space.batch_sise", "unknown field"),
        ("task: mnist1d\nbudjet: {trials: 3}", "budjet", "unknown field (did you mean `budget`?)"),
        (
            "task: mnist1d\nobjective: {kind: time_to_accuracy, target_acuracy: 0.9}",
            "objective.target_acuracy",
            "did you mean `objective.target_accuracy`?",
        ),
        ("task: mnist1d\nbudget: {trials: 100000}", "budget.trials", "less than or equal"),
        ("task: mnist1d\nschedule: {base_lr: -1}", "schedule.base_lr", "greater than 0"),
        ("task: mnist1d\nresources: {gpus_per_worker: 64}", "resources.gpus_per_worker", "16"),
        (
            "task: mnist1d\nobjective: {kind: time_to_accuracy}",
            "objective",
            "needs one target: target_accuracy",
        ),
        ("task: mnist1d\nobjective: {kind: speed}", "objective", "one of accuracy"),
        ("task: mnist1d\nobjective: {max_stepz: 5}", "objective.max_stepz", "unknown field"),
        (
            "task: mnist1d\nspace: {batch_size: {min: 64, max: 32}}",
            "space.batch_size",
            "must not exceed",
        ),
        ("task: mnist1d\nspace: {lr_multiplier: {min: 2}}", "space.lr_multiplier.min", "1"),
        ("task: mnist1d\nspace: {decay: [step]}", "space.decay.0", "constant"),
        (
            "task: mnist1d\nspace: {label_smoothing: [0.1, 0.1]}",
            "space.label_smoothing",
            "distinct",
        ),
        ("task: digits\ntask_options: {hidden_dim: 1}", "task_options.hidden_dim", ">= 8"),
        ("task: digits\ntask_options: {epochs: 3}", "task_options.epochs", "unknown option"),
        ("task: cifar10", "task_options.data_dir", "is required"),
        (
            "task: cifar10\ntask_options: {data_dir: ../cifar}",
            "task_options.data_dir",
            "'..' component",
        ),
    ],
)
def test_errors_name_the_field_and_the_reason(text: str, field: str, reason: str) -> None:
    message = errors_of(text)
    assert f"{field}:" in message
    assert reason in message


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("task: mnist1d\nbudget: {trials: 3}", "must exceed the 3 baseline trials"),
        (
            "task: mnist1d\nresources: {workers: 3}",
            "none is a multiple of resources.workers x micro_batch = 3",
        ),
        (
            "task: mnist1d\nresources: {workers: 4, micro_batch: 32}\n"
            "space: {batch_size: {min: 16, max: 64}}",
            "smaller than workers x micro_batch = 128",
        ),
        (
            "task: mnist1d\nspace: {batch_size: {min: 64, max: 512}}\n"
            "objective: {max_mean_batch_size: 32}",
            "no schedule can meet it",
        ),
        (
            "task: mnist1d\nspace: {batch_size: {min: 16, max: 64}}\n"
            "objective: {min_mean_batch_size: 100}",
            "no schedule can meet it",
        ),
        (
            "task: mnist1d\nobjective: {min_mean_batch_size: 100, max_mean_batch_size: 50}",
            "no schedule can meet both",
        ),
        (
            "task: mnist1d\nschedule: {total_epochs: 4}\nbudget: {grace_period_epochs: 5}",
            "budget.grace_period_epochs (5) exceeds the run's 4 epochs",
        ),
        (
            "task: mnist1d\nschedule: {total_epochs: 10}\n"
            "space: {stages: {min: 4, max: 4}, min_stage_fraction: 0.3}",
            "do not fit in the run",
        ),
        (
            "task: mnist1d\nbudget: {search: pbt, trials: 8, trial_epochs: 100}",
            "budget.trial_epochs applies to budget.search: optuna",
        ),
        ("task: mnist1d\nbudget: {trial_epochs: 0}", "greater than or equal to 1"),
    ],
)
def test_specs_no_schedule_can_satisfy_are_rejected_with_the_fix(text: str, reason: str) -> None:
    assert reason in errors_of(text)


def test_errors_list_every_problem_at_once() -> None:
    message = errors_of("task: mnist1d\nseed: -1\nbudget: {trials: 0}\nresources: {workers: 0}")
    for field in ("seed:", "budget.trials:", "resources.workers:"):
        assert field in message


@pytest.mark.parametrize(
    "text",
    ["", "- task: mnist1d", "task: [unclosed", "just a string"],
)
def test_malformed_documents_get_a_clear_error(text: str) -> None:
    message = errors_of(text)
    assert "study spec" in message


def test_yaml_syntax_errors_give_the_line() -> None:
    assert "line 2" in errors_of("task: mnist1d\nbudget: {trials: 4]\nseed: 1\n")


def test_resolve_rejects_what_only_the_task_defaults_reveal() -> None:
    # 30 task epochs fit, but a grace period longer than a 3-epoch task default does not.
    spec = StudySpec.from_yaml("task: mnist1d\nbudget: {grace_period_epochs: 5}")
    with pytest.raises(ValidationError, match="grace_period_epochs"):
        spec.resolve(TaskDefaults(epochs=3, base_batch_size=32, base_lr=0.1))
    # An explicit min above the default max (16 x base batch) cannot be resolved silently.
    spec = StudySpec.from_yaml("task: mnist1d\nspace: {batch_size: {max: 16}}")
    with pytest.raises(ValidationError, match=r"min \(32\) exceeds max \(16\)"):
        spec.resolve(DEFAULTS)


def test_pareto_and_constraints_parse() -> None:
    spec = StudySpec.from_yaml(
        "task: digits\nobjective: {kind: pareto, cost: wall_time}\nbaselines: false\n"
        "budget: {trials: 2}"
    )
    assert isinstance(spec.objective, ParetoObjective)
    spec = StudySpec.from_yaml("task: digits\nobjective: {max_steps: 500}")
    assert isinstance(spec.objective, AccuracyObjective)
    assert spec.objective.has_constraint


def test_spec_is_the_api_request_model() -> None:
    # The API validates request bodies with the model itself: unknown keys are errors.
    with pytest.raises(pydantic.ValidationError) as info:
        StudySpec.model_validate({"task": "mnist1d", "budget": {"trails": 5}})
    assert info.value.errors()[0]["loc"] == ("budget", "trails")
    assert "properties" in StudySpec.model_json_schema()
