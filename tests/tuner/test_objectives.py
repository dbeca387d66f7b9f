"""Objectives: per-epoch reports -> objective values, trial outcomes, the study's result."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, ConfigDict

from tuner.errors import StagetuneError, ValidationError
from tuner.formatting import format_bytes
from tuner.objectives import (
    ENDED_TEXT_CHARS,
    StudyObjective,
    TrialOutcome,
    ended_text,
    epochs_done,
    failure_of,
    loss_jump,
    objective_label,
    outside_text,
    pareto_front,
    search_text,
    select_best,
    summarize,
    trial_status,
)
from tuner.spec import StudySpec
from tuner.tasks import metric_declaration, register_task_name, unregister_task_name


def objective(yaml_objective: str, epochs: int = 10) -> StudyObjective:
    spec = StudySpec.from_yaml(f"task: mnist1d\nobjective: {yaml_objective}")
    return StudyObjective.of(spec, epochs)


def report(
    epoch: int, acc: float, steps: int, wall: float = 1.0, **extra: object
) -> dict[str, object]:
    return {
        "training_iteration": epoch,
        "epoch": epoch - 1,
        "val_accuracy": acc,
        "steps": steps,
        "samples": steps * 64,
        "wall_time_s": wall,
        "diverged": False,
        **extra,
    }


def outcome(
    number: int,
    values: tuple[float, ...] | None,
    *,
    baseline: str | None = None,
    status: str = "completed",
    steps: int = 100,
    feasible: bool = True,
    acc: float | None = None,
) -> TrialOutcome:
    return TrialOutcome(
        number=number,
        baseline=baseline,
        schedule={},
        status=status,  # type: ignore[arg-type]
        val_accuracy=acc if acc is not None else (values[0] if values else None),
        metric_value=acc if acc is not None else (values[0] if values else None),
        steps=steps,
        samples=steps * 64,
        values=values,
        feasible=feasible,
    )


def test_accuracy_objective_maximises_the_final_accuracy() -> None:
    obj = objective("{kind: accuracy}")
    assert obj.names == ("val_accuracy",)
    assert obj.directions == ("maximize",)
    assert obj.scheduler_metric == "val_accuracy"
    assert obj.values(report(10, 0.91, 500)) == (0.91,)
    assert obj.values({"training_iteration": 3}) is None  # nothing to score
    assert obj.is_finished_run(report(10, 0.5, 1))
    assert not obj.is_finished_run(report(9, 0.9, 1))


def test_time_to_accuracy_scores_cost_at_the_target_and_penalises_misses() -> None:
    obj = objective("{kind: time_to_accuracy, target_accuracy: 0.9, cost: steps}")
    assert obj.names == ("steps_to_target",)
    assert obj.directions == ("minimize",)
    hit = report(4, 0.92, 400)
    assert obj.reached_target(hit)
    assert obj.is_finished_run(hit)
    assert obj.values(hit) == (400.0,)
    # Never reached after the whole run: 2 x (cost) x (1 + shortfall 0.1).
    miss = report(10, 0.8, 1000)
    assert obj.values(miss) == pytest.approx((2 * 1000 * 1.1,))
    # A near miss ranks better than a far one at the same cost...
    assert obj.values(report(10, 0.89, 1000)) < obj.values(miss)  # type: ignore[operator]
    # ...and every miss ranks worse than a hit that took the whole run.
    assert obj.values(report(10, 0.9, 1000))[0] < obj.values(report(10, 0.89, 1000))[0]  # type: ignore[index]
    # Stopped early (ASHA): the cost is projected to the whole run.
    assert obj.values(report(5, 0.5, 500)) == pytest.approx((2 * 1000 * 1.4,))
    wall = objective("{kind: time_to_accuracy, target_accuracy: 0.9, cost: wall_time}")
    assert wall.values(report(3, 0.95, 400, wall=12.5)) == (12.5,)


def test_pareto_objective_has_two_values_and_no_early_stopping() -> None:
    obj = objective("{kind: pareto, cost: steps}")
    assert obj.names == ("val_accuracy", "steps")
    assert obj.directions == ("maximize", "minimize")
    assert obj.is_multi
    assert obj.scheduler_metric is None
    assert obj.values(report(10, 0.9, 321)) == (0.9, 321.0)


@pytest.mark.parametrize(
    ("result", "error", "status", "reason"),
    [
        (report(10, 0.9, 10), False, "completed", "trained all 10 epochs"),
        (report(4, 0.6, 10), False, "stopped", "stopped early after 4 of 10 epochs"),
        (report(2, 0.1, 10, diverged=True), False, "diverged", "non-finite in epoch 2"),
        (
            {**report(5, 0.1, 10, diverged=True), "val_loss": 4994.0, "diverged_from_loss": 0.2},
            False,
            "diverged",
            "the validation loss jumped to 4994 in epoch 5, 24,970x its lowest so far (0.2)",
        ),
        (report(3, 0.5, 10), True, "failed", "raised"),
        (None, True, "failed", "raised"),
        (
            report(4, 0.0, 10, failure="out of memory at global batch 512"),
            False,
            "failed",
            "the trial failed in epoch 4: out of memory at global batch 512",
        ),
    ],
)
def test_trial_status_tells_how_a_trial_ended(
    result: dict[str, object] | None, error: bool, status: str, reason: str
) -> None:
    got_status, got_reason = trial_status(objective("{kind: accuracy}"), result, error=error)
    assert got_status == status
    assert reason in got_reason


def test_a_failure_report_ends_a_trial_as_failed_with_no_value() -> None:
    """The trainable ends a trial whose stage does not fit in memory with a report that says
    so (``FAILURE_KEY``), not an error: the epoch it reports was not trained, and the trial
    has no objective value even where the report carries numbers."""
    obj = objective("{kind: accuracy}")
    failed = report(3, 0.9, 10, failure="out of memory at global batch 512 (stage 2)")
    assert failure_of(failed) == "out of memory at global batch 512 (stage 2)"
    assert epochs_done(failed) == 2  # Tune counted the report; two epochs were trained
    assert obj.values(failed) is None
    assert trial_status(obj, failed, error=False) == (
        "failed",
        "the trial failed in epoch 3: out of memory at global batch 512 (stage 2)",
    )
    # An empty or missing failure is no failure.
    for result in (report(3, 0.9, 10, failure=None), report(3, 0.9, 10, failure=""), None):
        assert failure_of(result) is None
    assert epochs_done(report(3, 0.9, 10)) == 3
    assert obj.values(report(3, 0.9, 10)) == (0.9,)


def test_a_loss_far_above_the_runs_lowest_for_two_epochs_is_a_jump() -> None:
    # mnist1d, batch 128 -> 1,024 at the linear rule's LR (measured): 0.09 -> 61 -> 1,248.
    assert loss_jump([0.5, 0.09], 61.0, 20.0) is None  # one epoch above: not yet
    assert loss_jump([0.5, 0.09, 61.0], 1248.0, 20.0) == 0.09
    # A run that learns at a high LR and spikes for one epoch (mnist1d, the batch warm-up
    # recipe's up-variant, seed 23760: 0.128 -> 2.60, 20.3x, then 0.34; it ends at 99.12 %).
    spike = [1.118, 0.189, 0.128, 0.560, 0.198]
    assert loss_jump(spike, 2.595, 20.0) is None
    assert loss_jump([*spike, 2.595], 0.340, 20.0) is None
    # Ordinary ups and downs of a run that learns (mnist1d, batch 512: 0.55 -> 1.345).
    assert loss_jump([61.4, 35.6, 2.69, 3.08, 1.31, 0.55], 1.345, 20.0) is None
    assert loss_jump([0.5, 9.9], 9.9, 20.0) is None  # 19.8x: within the factor
    assert loss_jump([0.5, 10.1], 10.1, 20.0) == 0.5
    assert loss_jump([0.5, 10.1], 9.9, 20.0) is None  # back under it
    # One epoch is enough when asked for.
    assert loss_jump([0.5], 10.1, 20.0, epochs=1) == 0.5
    # Nothing to compare with, no factor, or a loss that is not finite (the loop's own rule).
    assert loss_jump([], 100.0, 20.0) is None
    assert loss_jump([0.1], 100.0, 20.0) is None
    assert loss_jump([None, math.nan, 100.0], 100.0, 20.0) is None
    assert loss_jump([0.1, 100.0], 100.0, None) is None
    assert loss_jump([0.1, 100.0], math.inf, 20.0) is None


def test_reaching_the_target_early_is_a_completed_trial() -> None:
    obj = objective("{kind: time_to_accuracy, target_accuracy: 0.8}")
    assert trial_status(obj, report(3, 0.85, 10), error=False)[0] == "completed"


def test_best_is_the_best_completed_tuned_trial() -> None:
    obj = objective("{kind: accuracy}")
    outcomes = [
        outcome(0, (0.90,), baseline="small_batch"),
        outcome(1, (0.80,), baseline="large_batch"),
        outcome(3, (0.95,), status="stopped"),  # ASHA-stopped: never the result
        outcome(4, (0.91,), steps=300),
        outcome(5, (0.91,), steps=200),  # tie on accuracy: fewer steps wins
        outcome(6, (0.99,), feasible=False),
    ]
    best, is_baseline = select_best(outcomes, obj)
    assert best is not None
    assert best.number == 5
    assert not is_baseline


def test_a_baseline_is_the_result_only_when_nothing_beats_it() -> None:
    obj = objective("{kind: accuracy}")
    base = outcome(0, (0.92,), baseline="small_batch")
    best, is_baseline = select_best([base, outcome(3, (0.90,))], obj)
    assert best is base
    assert is_baseline
    best, is_baseline = select_best([base, outcome(3, (0.90,), status="stopped")], obj)
    assert best is base
    assert is_baseline
    best, is_baseline = select_best([base, outcome(3, (0.93,))], obj)
    assert best is not None
    assert best.number == 3
    assert not is_baseline
    assert select_best([outcome(3, None, status="failed")], obj) == (None, False)


def test_time_to_accuracy_best_is_the_cheapest() -> None:
    obj = objective("{kind: time_to_accuracy, target_accuracy: 0.9}")
    outcomes = [outcome(3, (500.0,), acc=0.91), outcome(4, (300.0,), acc=0.9)]
    best, _ = select_best(outcomes, obj)
    assert best is not None
    assert best.number == 4


def test_pareto_front_and_recommended_member() -> None:
    obj = objective("{kind: pareto, accuracy_tolerance: 0.01}")
    outcomes = [
        outcome(3, (0.95, 900.0)),
        outcome(4, (0.945, 400.0)),  # within 0.01 of the top, much cheaper: recommended
        outcome(5, (0.90, 100.0)),
        outcome(6, (0.89, 500.0)),  # dominated by 4 and 5
        outcome(7, (0.99, 50.0), status="stopped"),
    ]
    assert [o.number for o in pareto_front(outcomes, obj)] == [3, 4, 5]
    best, is_baseline = select_best(outcomes, obj)
    assert best is not None
    assert best.number == 4
    assert not is_baseline
    summary = summarize(outcomes, obj)
    assert [row["number"] for row in summary["pareto_front"]] == [3, 4, 5]


def test_summary_compares_the_best_with_each_baseline() -> None:
    obj = objective("{kind: accuracy}")
    outcomes = [
        outcome(0, (0.90,), baseline="small_batch", steps=1000),
        outcome(1, (0.85,), baseline="large_batch", steps=100),
        outcome(2, (0.91,), baseline="increase_batch", steps=500),
        outcome(3, (0.92,), steps=250),
        outcome(4, None, status="failed"),
    ]
    summary = summarize(outcomes, obj, extra={"budget": 5})
    assert summary["best"]["number"] == 3
    assert summary["best_is_baseline"] is False
    assert summary["trials"] == {"total": 5, "completed": 4, "failed": 1}
    assert summary["budget"] == 5
    by_name = {row["baseline"]: row for row in summary["baselines"]}
    assert list(by_name) == ["small_batch", "large_batch", "increase_batch"]
    small = by_name["small_batch"]["vs_best"]
    assert small["accuracy_delta"] == pytest.approx(0.02)
    assert small["steps_ratio"] == pytest.approx(0.25)
    assert by_name["large_batch"]["mean_batch_size"] == 64
    assert "tuned trial 3" in summary["note"]


def test_search_text_shows_the_disk_the_boundary_states_took() -> None:
    """A study's checkpoint disk use is shown where its search is described (CLI, dashboard):
    the boundary states left at the end, their size and the spec's cap."""
    summary = {
        "search_compute_epochs": 40.0,
        "compute_epochs": 40.0,
        "prefixes": {
            "states": 12,
            "bytes": 3_565_158,
            "max_bytes": 2048 * 2**20,
            "forks": 3,
            "epochs_reused": 9,
        },
    }
    assert search_text(summary) == (
        "search: 40.0 trial-epochs trained; 3 trials forked from shared prefixes, 9 epochs "
        "not trained again (boundary states: 12, 3.4 MB on disk, cap 2.0 GB)"
    )
    summary["prefixes"] = {"states": 0, "bytes": 0, "forks": 0, "epochs_reused": 0}
    assert search_text(summary).endswith(
        "0 trials forked from shared prefixes, 0 epochs not trained again"
    )


def test_search_text_says_when_tunes_leftover_pbt_checkpoints_were_removed() -> None:
    summary: dict[str, Any] = {
        "search_compute_epochs": 28.0,
        "compute_epochs": 28.0,
        "pbt": {
            "population": 4,
            "interval_epochs": 1,
            "lineages": {"0": [[3, 2]], "1": []},
            "checkpoints": {"bytes": 3 * 2**20, "kept_per_trial": 4, "untracked_removed": 0},
        },
    }
    assert search_text(summary).endswith(
        "PBT: a population of 4 perturbed every epoch, 1 clone of a better trial's state "
        "(checkpoints: 3.0 MB on disk, the newest 4 per trial)"
    )
    summary["pbt"]["checkpoints"]["untracked_removed"] = 2
    assert search_text(summary).endswith(
        "(checkpoints: 3.0 MB on disk, the newest 4 per trial; 2 that Tune's clean-up left "
        "untracked removed)"
    )


@pytest.mark.parametrize(
    ("size", "text"),
    [(0, "0 B"), (1000, "1000 B"), (2048, "2.0 KB"), (150 * 2**20, "150 MB"), (None, "—")],
)
def test_sizes_read_in_powers_of_1024(size: float | None, text: str) -> None:
    assert format_bytes(size) == text


# ---------------------------------------------------------------------------- any metric


class _RestorationOptions(BaseModel):
    """A torch-free declaration like an image-restoration task's: PSNR up, loss down."""

    model_config = ConfigDict(extra="forbid")
    metrics: ClassVar[dict[str, str]] = {"val_psnr": "max", "val_loss": "min"}
    primary_metric: ClassVar[str] = "val_psnr"


@pytest.fixture
def restoration_task() -> Iterator[str]:
    register_task_name("test_restoration", _RestorationOptions)
    yield "test_restoration"
    unregister_task_name("test_restoration")


def metric_objective(task: str, yaml_objective: str = "{}", epochs: int = 10) -> StudyObjective:
    spec = StudySpec.from_yaml(f"task: {task}\nobjective: {yaml_objective}")
    return StudyObjective.of(spec, epochs)


def test_the_metric_is_the_tasks_primary_one_unless_the_objective_names_one(
    restoration_task: str,
) -> None:
    psnr = metric_objective(restoration_task)
    assert (psnr.metric, psnr.metric_direction) == ("val_psnr", "max")
    assert (psnr.names, psnr.directions) == (("val_psnr",), ("maximize",))
    loss = metric_objective(restoration_task, "{metric: val_loss}")
    assert (loss.names, loss.directions) == (("val_loss",), ("minimize",))
    assert (loss.scheduler_metric, loss.scheduler_mode) == ("val_loss", "min")
    pareto = metric_objective(restoration_task, "{kind: pareto, metric: val_loss}")
    assert (pareto.names, pareto.directions) == (("val_loss", "steps"), ("minimize", "minimize"))
    # Classification declares accuracy (primary) and loss.
    assert metric_objective("mnist1d").names == ("val_accuracy",)
    assert metric_objective("mnist1d", "{metric: val_loss}").directions == ("minimize",)


@pytest.mark.parametrize(
    ("task", "objective_text", "message"),
    [
        (
            "mnist1d",
            "{metric: val_psnr}",
            "objective.metric 'val_psnr' is not a metric of task 'mnist1d'; it reports "
            "val_accuracy (max), val_loss (min)",
        ),
        (
            "test_restoration",
            "{kind: time_to_accuracy, target_accuracy: 0.9, metric: val_loss}",
            "give target (a value of val_loss) instead",
        ),
        ("test_restoration", "{kind: time_to_accuracy}", "needs one target"),
        ("mnist1d", "{metric: accuracy}", "objective.metric"),
    ],
)
def test_a_metric_the_task_does_not_report_is_refused_at_submission(
    restoration_task: str, task: str, objective_text: str, message: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)):
        StudySpec.from_yaml(f"task: {task}\nobjective: {objective_text}")


def test_a_loss_study_picks_the_lowest_loss_and_stops_at_a_target_below(
    restoration_task: str,
) -> None:
    loss = metric_objective(restoration_task, "{metric: val_loss}")
    assert loss.values({**report(10, 0.0, 500), "val_loss": 0.25}) == (0.25,)
    low, high = outcome(1, (0.2,)), outcome(2, (0.3,))
    assert select_best([high, low], loss)[0] is low
    assert loss.score_of(0.2) == -0.2  # what ASHA, PBT and the seed picks rank: larger is better

    target = metric_objective(
        restoration_task, "{kind: time_to_accuracy, metric: val_loss, target: 0.5}"
    )
    assert target.reached_target({"val_loss": 0.5})
    assert not target.reached_target({"val_loss": 0.51})
    assert target.values({**report(5, 0.0, 300), "val_loss": 0.4}) == (300.0,)
    # A miss after all 10 epochs: 2 x cost x (1 + shortfall), shortfall in the metric's units.
    assert target.values({**report(10, 0.0, 600), "val_loss": 0.75}) == pytest.approx(
        (2 * 600 * 1.25,)
    )
    status, reason = trial_status(target, {**report(4, 0.0, 100), "val_loss": 0.3}, error=False)
    assert (status, reason) == ("completed", "reached the target val_loss after 4 epoch(s)")

    psnr = metric_objective(restoration_task, "{kind: time_to_accuracy, target: 30}")
    assert psnr.reached_target({"val_psnr": 30.5})
    # A PSNR 3 dB short of 30 dB: the shortfall is relative to the target (10 %).
    assert psnr.values({**report(10, 0.0, 600), "val_psnr": 27.0}) == pytest.approx(
        (2 * 600 * 1.1,)
    )


def test_the_summary_names_the_metric_and_compares_baselines_on_it(
    restoration_task: str,
) -> None:
    loss = metric_objective(restoration_task, "{metric: val_loss}")
    tuned = outcome(3, (0.2,), acc=0.2)
    base = outcome(0, (0.3,), baseline="small_batch", acc=0.3)
    summary = summarize([base, tuned], loss)
    assert summary["objective"]["metric"] == "val_loss"
    assert summary["objective"]["metric_direction"] == "min"
    assert summary["best"]["metric"] == "val_loss"
    assert summary["best"]["metric_value"] == 0.2
    assert summary["baselines"][0]["vs_best"]["metric_delta"] == pytest.approx(-0.1)


def test_a_broken_metric_declaration_is_the_tasks_bug_and_says_what_to_fix() -> None:
    class NoLoss(BaseModel):
        metrics: ClassVar[dict[str, str]] = {"val_psnr": "max"}

    class BadName(BaseModel):
        metrics: ClassVar[dict[str, str]] = {"psnr": "max", "val_loss": "min"}

    class BadPrimary(BaseModel):
        metrics: ClassVar[dict[str, str]] = {"val_loss": "min"}
        primary_metric: ClassVar[str] = "val_psnr"

    with pytest.raises(StagetuneError, match="val_loss \\(min\\) must be one of them"):
        metric_declaration("t", NoLoss)
    with pytest.raises(StagetuneError, match="must be named val_<name>"):
        metric_declaration("t", BadName)
    with pytest.raises(StagetuneError, match="primary_metric 'val_psnr' is not one of them"):
        metric_declaration("t", BadPrimary)
    assert metric_declaration("t", None) == (
        {"val_accuracy": "max", "val_loss": "min"},
        "val_accuracy",
    )


def test_the_objective_label_names_the_constraints_target_and_cost() -> None:
    """One sentence for the objective, which the dashboard's header and the CLI's first line
    both print (:func:`tuner.objectives.objective_label`)."""
    assert objective_label({"kind": "accuracy"}, "val_accuracy", "max") == (
        "maximise final validation accuracy"
    )
    capped = {"kind": "accuracy", "max_steps": 1500, "max_mean_batch_size": 256.0}
    assert objective_label(capped, "val_accuracy", "max") == (
        "maximise final validation accuracy with mean batch ≤ 256, steps ≤ 1,500"
    )
    assert objective_label({"kind": "accuracy"}, "val_loss", "min") == (
        "minimise final validation loss"
    )
    tta = {"kind": "time_to_accuracy", "target_accuracy": 0.97, "cost": "steps"}
    assert objective_label(tta, "val_accuracy", "max") == (
        "minimise steps to reach 97.0% validation accuracy"
    )
    psnr = {"kind": "time_to_accuracy", "target": 28.0, "cost": "wall_time"}
    assert objective_label(psnr, "val_psnr", "max") == (
        "minimise wall time to reach 28.00 dB validation psnr"
    )
    assert objective_label({"kind": "pareto", "cost": "steps"}, "val_accuracy", "max") == (
        "Pareto front of validation accuracy against steps"
    )


def test_a_row_outside_the_objective_says_which_constraint_and_by_how_much() -> None:
    cap = {"kind": "accuracy", "max_steps": 500, "min_mean_batch_size": 64.0}
    over = {"feasible": False, "violated": ["max_steps"], "steps": 1560, "mean_batch_size": 32.0}
    assert outside_text(over, cap) == "1,560 steps, over the objective's 500"
    both = {**over, "violated": ["min_mean_batch_size", "max_steps"]}
    assert outside_text(both, cap) == (
        "mean batch 32, under the objective's 64; 1,560 steps, over the objective's 500"
    )
    # A summary written before rows named the constraint: still marked, in general words.
    assert outside_text({"feasible": False}, cap) == "outside the objective's constraints"
    assert outside_text({"feasible": True, "steps": 90}, cap) is None
    assert outside_text({"steps": 90}, cap) is None  # a row that does not say


def test_a_row_that_did_not_train_its_whole_schedule_says_how_it_ended() -> None:
    stopped = {"status": "stopped", "stop_reason": "stopped early after 2 of 10 epochs"}
    assert ended_text(stopped) == "stopped early after 2 of 10 epochs"
    assert ended_text({"status": "diverged", "stop_reason": None}) == "diverged"
    # A failed trial's reason ends with its error: cut to one line's worth.
    failed = {"status": "failed", "stop_reason": "the trial failed in epoch 3: " + "x" * 500}
    text = ended_text(failed)
    assert text is not None
    assert text.startswith("the trial failed in epoch 3: xx")
    assert len(text) == ENDED_TEXT_CHARS
    assert text.endswith("…")
    # ... and on one line: a table cell or a dashboard row holds no traceback's newlines.
    traced = {"status": "failed", "stop_reason": "failed in epoch 3: Traceback\n  File x\nOops"}
    assert ended_text(traced) == "failed in epoch 3: Traceback File x Oops"
    done = {"status": "completed", "stop_reason": "trained all 10 epochs"}
    assert ended_text(done) is None
    assert ended_text({"stop_reason": "stopped early"}) is None  # a row that does not say


def test_a_baseline_over_the_step_cap_is_an_outcome_that_names_it() -> None:
    """The engine's outcome of a finished baseline and the one rebuilt from its stored record
    both say which constraint its schedule breaks; a tuned trial is drawn under it."""
    from datetime import UTC, datetime

    from tuner.engine import outcome_of
    from tuner.engine_search import META_KEY, TrialMeta
    from tuner.progress import outcome_of_record
    from tuner.schedule import Schedule, Stage
    from tuner.store.records import TrialRecord, TrialStatus

    obj = objective("{kind: accuracy, max_steps: 50}")
    small = Schedule(stages=(Stage(0, 4, 32),), base_lr=0.05, base_batch_size=32)
    assert small.total_steps(1000) == 4 * 31 > 50
    config = {
        "schedule": small.to_dict(),
        META_KEY: TrialMeta(number=0, baseline="small_batch", params={}).to_dict(),
    }
    last = report(4, 0.9, 124)
    done = outcome_of(obj, config, last, error=False, train_size=1000)
    assert done is not None
    assert (done.feasible, done.violated, done.eligible) == (False, ("max_steps",), False)
    assert done.to_dict(obj)["violated"] == ["max_steps"]
    record = TrialRecord(
        id=1,
        study_id=1,
        number=0,
        baseline="small_batch",
        schedule=small.to_dict(),
        params={},
        status=TrialStatus.COMPLETED,
        stop_reason=None,
        started_at=datetime.now(UTC),
        finished_at=datetime.now(UTC),
        epochs_done=4,
        val_accuracy=0.9,
        val_loss=None,
        steps=124,
        samples=4000,
        wall_time_s=1.0,
        mean_batch_size=32.0,
        objective_values={"val_accuracy": 0.9},
    )
    stored = outcome_of_record(record, obj, train_size=1000)
    assert (stored.feasible, stored.violated) == (False, ("max_steps",))
    inside = outcome_of_record(record, objective("{kind: accuracy, max_steps: 500}"), 1000)
    assert (inside.feasible, inside.violated) == (True, ())
