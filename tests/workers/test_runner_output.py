"""What a local run prints (``workers.runner``): the study's metric in the trial lines and the
result table, for an accuracy study as before and for a study of another metric (a loss of
the test regression task, declared on its options model)."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from rich.console import Console

from tests.regression_task import TASK_NAME, LinearRegression, regression_task
from tuner.engine import SEED_RUN_KEY
from tuner.engine_search import META_KEY, TrialMeta
from tuner.noise_candidate import noise_scale_step_floor
from tuner.objectives import StudyObjective, TrialOutcome, summarize, trial_status
from tuner.pbt import LINEAGE_KEY
from tuner.schedule import Schedule, Stage
from tuner.seeds import seed_stats
from tuner.spec import StudySpec, TieBreak
from tuner.store.records import StudyStatus
from workers.console import LOG_WIDTH, stdout_console
from workers.runner import StudyResult, TrialPrinter, print_result

__all__ = ["regression_task"]  # the fixture, used here

SCHEDULE = Schedule(stages=(Stage(0, 3, 16),), base_lr=0.05, base_batch_size=16)


def objective(spec: dict[str, Any]) -> StudyObjective:
    return StudyObjective.of(StudySpec.from_dict(spec), total_epochs=3)


def outcome(number: int, value: float, obj: StudyObjective, **kw: Any) -> TrialOutcome:
    accuracy = value if obj.metric == "val_accuracy" else None
    return TrialOutcome(
        number=number,
        baseline=kw.pop("baseline", None),
        schedule=SCHEDULE.to_dict(),
        status="completed",
        epochs_done=3,
        val_accuracy=accuracy,
        metric_value=value,
        steps=30 + number,
        samples=480,
        wall_time_s=2.0,
        values=(value,),
        summary=SCHEDULE.summary(),
        **kw,
    )


def printed(summary: dict[str, Any]) -> str:
    console = Console(record=True, width=200)
    result = StudyResult(
        study_id=1,
        status=StudyStatus.COMPLETED,
        summary=summary,
        outcomes=(),
        best_number=None,
        best_is_baseline=False,
        best_schedule=None,
        schedule_path=Path("best.yaml"),
    )
    print_result(result, console)
    return console.export_text()


def test_an_accuracy_study_prints_val_acc_as_before() -> None:
    obj = objective({"task": "digits"})
    outcomes = [outcome(0, 0.9, obj, baseline="small_batch"), outcome(1, 0.93456, obj)]
    text = printed(summarize(outcomes, obj))
    header = next(line for line in text.splitlines() if "trial" in line and "kind" in line)
    assert "val_acc" in header
    assert "0.9346" in text
    assert "0.9000" in text


def test_the_small_batchs_step_floor_is_printed_and_a_cap_below_it_is_a_warning() -> None:
    obj = objective({"task": "digits"})
    outcomes = [outcome(0, 0.9, obj, baseline="small_batch"), outcome(1, 0.93456, obj)]
    floor = noise_scale_step_floor([(32, 64, 32.0), (32, 128, 96.0)])
    assert floor is not None
    summary = summarize(outcomes, obj)
    text = printed({**summary, "step_floor": {"trial": 0, **floor.to_dict(None)}})
    assert (
        "Step floor: by its measured noise scale (McCandlish et al.), the progress the small "
        "batch (#0) made in 128 steps takes at least ~48 steps at any batch: a schedule can "
        "cut its steps by 2.7x at most and still match it." in " ".join(text.split())
    )
    capped = printed({**summary, "step_floor": {"trial": 0, **floor.to_dict(40)}})
    assert "This study's step cap (40) is below the floor" in " ".join(capped.split())
    # No floor (no small-batch baseline, or no noise-scale curve): no line.
    assert "Step floor" not in printed({**summary, "step_floor": None})


def test_a_baseline_over_the_step_cap_says_so_in_the_table() -> None:
    """A capped study trains the small batch for the comparison although it takes more steps
    than the cap: its row says so, so a higher accuracy there does not read as a better
    result the search missed."""
    obj = objective({"task": "digits", "objective": {"kind": "accuracy", "max_steps": 500}})
    small = replace(
        outcome(0, 0.986, obj, baseline="small_batch", feasible=False, violated=("max_steps",)),
        steps=1560,
    )
    tuned = outcome(1, 0.9825, obj)
    text = " ".join(printed(summarize([small, tuned], obj)).split())
    assert "small_batch (1,560 steps, over the objective's 500)" in text
    row = next(
        line for line in printed(summarize([small, tuned], obj)).splitlines() if "│ 1 " in line
    )
    assert "best" in row
    assert "over the objective" not in row


def test_a_recipe_candidate_stopped_early_says_so_in_the_table() -> None:
    """A recipe candidate ASHA stopped after its first rung has the accuracy and steps of the
    epochs it trained: its row says how it ended, so 78 steps and a low accuracy do not read
    as what its whole schedule gives. A completed row says nothing of the kind."""
    obj = objective({"task": "digits"})
    _, reason = trial_status(obj, {"epoch": 0, "training_iteration": 1}, error=False)
    assert reason == "stopped early after 1 of 3 epochs"
    stopped = replace(
        outcome(6, 0.8972, obj),
        status="stopped",
        stop_reason=reason,
        epochs_done=1,
        steps=78,
        extra={"candidate": "fitted_constant"},
    )
    done = replace(outcome(5, 0.9859, obj), extra={"candidate": "fitted_increase"})
    text = printed(summarize([outcome(0, 0.9, obj, baseline="small_batch"), done, stopped], obj))
    rows = {int(line.split("│")[1]): line for line in text.splitlines() if line.startswith("│ ")}
    assert "fitted_constant (tuned; stopped early after 1 of 3 epochs)" in rows[6]
    assert "│ 78 " in rows[6]
    assert "stopped" not in rows[5]
    assert "stopped" not in rows[0]


def test_a_loss_study_prints_its_metric_in_the_table(regression_task: LinearRegression) -> None:
    obj = objective({"task": TASK_NAME, "objective": {"metric": "val_loss"}})
    assert (obj.metric, obj.metric_direction) == ("val_loss", "min")
    small = outcome(0, 0.2, obj, baseline="small_batch")
    tuned = outcome(1, 0.012345, obj)
    stats = [
        seed_stats(tuned, {10: outcome(1, 0.0125, obj), 11: outcome(1, 0.0135, obj)}, [10, 11],
                   metric="val_loss"),
        seed_stats(small, {10: outcome(0, 0.21, obj), 11: outcome(0, 0.19, obj)}, [10, 11],
                   metric="val_loss"),
    ]  # fmt: skip
    summary = summarize([small, tuned], obj, seed_runs=stats, seeds=[10, 11])
    text = printed(summary)
    header = next(line for line in text.splitlines() if "trial" in line and "kind" in line)
    assert "val_loss (search run)" in header
    assert "val_loss over 2 fresh seeds" in header
    assert "val_acc" not in header
    best = next(line for line in text.splitlines() if " best " in f" {line} ")
    assert "0.01235" in best  # 4 significant digits, not 4 decimals (0.0123)
    assert "0.0130 ± 0.0007" in best  # the seed runs' mean ± std
    assert "0.2 " in next(line for line in text.splitlines() if "small_batch" in line)


def test_a_psnr_column_is_in_db() -> None:
    summary = {
        "objective": {"kind": "accuracy", "metric": "val_psnr", "metric_direction": "max"},
        "best": {"number": 3, "schedule_summary": "16@0-3", "metric_value": 27.3141, "steps": 9},
        "best_is_baseline": False,
        "baselines": [],
        "note": "",
    }
    text = printed(summary)
    assert "val_psnr (dB)" in text
    assert "27.31" in text
    assert "27.3141" not in text


def test_trial_lines_show_the_study_metric(regression_task: LinearRegression) -> None:
    def line(obj: StudyObjective, result: dict[str, Any]) -> str:
        printer = TrialPrinter(budget=4, objective=obj)
        printer._console = Console(record=True, width=200)
        meta = TrialMeta(number=2, baseline=None, params={})
        trial = SimpleNamespace(
            config={META_KEY: meta.to_dict(), "schedule": SCHEDULE.to_dict()},
            last_result={"training_iteration": 3, "steps": 30, "wall_time_s": 1.5, **result},
            trial_id="t2",
        )
        printer.on_trial_complete(0, [], trial)
        return str(printer._console.export_text())

    accuracy = line(objective({"task": "digits"}), {"val_accuracy": 0.93456, "val_loss": 0.2})
    assert "completed: val_accuracy 0.9346 after 3 epoch(s), 30 steps" in accuracy
    loss_study = objective({"task": TASK_NAME, "objective": {"metric": "val_loss"}})
    loss = line(loss_study, {"val_loss": 0.0123456, "val_mse": 0.0246912})
    assert "completed: val_loss 0.01235 after 3 epoch(s)" in loss
    mse = line(objective({"task": TASK_NAME}), {"val_loss": 0.0123456, "val_mse": 0.0246912})
    assert "val_mse 0.02469" in mse
    assert "val_accuracy" not in mse


def test_trial_lines_name_each_trials_kind_and_count_the_seed_runs() -> None:
    """The progress lines' bracketed parts (``[small_batch]``, ``[tuned]``, ``[seed 1/6]``)
    are printed: rich read them as styles and printed nothing in their place."""
    printer = TrialPrinter(budget=4, objective=objective({"task": "digits"}))
    printer._console = Console(record=True, width=200)

    def trial(number: int, baseline: str | None, **config: Any) -> SimpleNamespace:
        meta = TrialMeta(number=number, baseline=baseline, params={})
        return SimpleNamespace(
            config={META_KEY: meta.to_dict(), "schedule": SCHEDULE.to_dict(), **config},
            last_result={"training_iteration": 3, "steps": 30, "val_accuracy": 0.9},
            trial_id=f"t{number}-{config.get('seed', '')}",
        )

    printer.on_trial_start(0, [], trial(0, "small_batch"))
    printer.on_trial_complete(0, [], trial(0, "small_batch"))
    printer.on_trial_start(0, [], trial(3, None))
    printer.on_trial_complete(0, [], trial(3, None))
    seed_run = {SEED_RUN_KEY: {"seed": 7919, "seeds": 3, "runs": 6, "reserve": False}}
    printer.on_trial_start(0, [], trial(3, None, seed=7919, **seed_run))
    printer.on_trial_complete(0, [], trial(3, None, seed=7919, **seed_run))
    lines = str(printer._console.export_text()).splitlines()
    summary = SCHEDULE.summary()
    assert f"  start trial   0 [small_batch] {summary}" in lines
    assert any(line.startswith("[  1/4] trial   0 [small_batch] completed: ") for line in lines)
    assert f"  start trial   3 [tuned] {summary}" in lines
    assert any(line.startswith("[  2/4] trial   3 [tuned] completed: ") for line in lines)
    assert f"  start trial   3 [tuned] on seed 7919: {summary}" in lines
    assert any(
        line.startswith("[seed  1/6] trial   3 [tuned] seed 7919 completed: ") for line in lines
    ), lines


def test_every_pbt_clone_has_a_line_also_when_the_lineage_keeps_its_length() -> None:
    """A PBT clone takes the donor's lineage plus one entry: trial 4 cloned from trial 5 at
    epoch 2 ([[2, 5]]), then from trial 3 (never cloned) at epoch 5 ([[5, 3]]), a lineage as
    long as before. Both clones are printed (the second was not)."""
    printer = TrialPrinter(budget=8, objective=objective({"task": "digits"}))
    printer._console = Console(record=True, width=200)
    meta = TrialMeta(number=4, baseline=None, params={}).to_dict()

    def start(lineage: list[list[int]]) -> None:
        config = {META_KEY: meta, "schedule": SCHEDULE.to_dict(), LINEAGE_KEY: lineage}
        printer.on_trial_start(0, [], SimpleNamespace(config=config, trial_id="t4"))

    start([])
    start([])  # resumed at a perturbation epoch without a clone: no line
    start([[2, 5]])
    start([[5, 3]])
    start([[5, 3]])
    lines = [line for line in str(printer._console.export_text()).splitlines() if "clone" in line]
    assert lines == [
        f"  clone trial   4 [tuned] took trial 5's state at epoch 2: {SCHEDULE.summary()}",
        f"  clone trial   4 [tuned] took trial 3's state at epoch 5: {SCHEDULE.summary()}",
    ]


def test_a_stop_reason_with_brackets_is_printed_as_it_is() -> None:
    """A row's stop reason (an error message) may hold brackets: the table shows them, and
    one that reads like a closing tag does not make rich refuse to print the result."""
    obj = objective({"task": "digits"})
    small = outcome(0, 0.9, obj, baseline="small_batch")
    reason = "failed: RuntimeError: [enforce fail at alloc.cpp] [/dev/shm] full"
    stopped = replace(
        outcome(5, 0.5, obj, extra={"candidate": "fitted_constant"}),
        status="failed",
        stop_reason=reason,
    )
    text = printed(summarize([small, stopped], obj))
    assert "[enforce fail at alloc.cpp] [/dev/shm] full" in " ".join(text.split()), text


def test_to_a_pipe_the_result_table_keeps_names_and_schedules_whole() -> None:
    """Printed to a pipe or a log file, where rich would use 80 columns: the candidates' names
    (``fitted…``) and the schedules were cut. The CLI's console there is 160 columns wide."""
    obj = objective({"task": "digits"})
    small = outcome(0, 0.9, obj, baseline="small_batch")
    variant = replace(
        outcome(7, 0.93456, obj, extra={"candidate": "runner_up_first_lr_double"}),
        summary="128@0-22 -> 512@22-27 -> 1024@27-30",
    )
    result = StudyResult(
        study_id=1,
        status=StudyStatus.COMPLETED,
        summary=summarize([small, variant], obj),
        outcomes=(),
        best_number=7,
        best_is_baseline=False,
        best_schedule=None,
        schedule_path=Path("best.yaml"),
    )
    out = io.StringIO()
    console = stdout_console(file=out)
    assert not console.is_terminal
    assert console.width >= LOG_WIDTH
    print_result(result, console)
    rows = [line for line in out.getvalue().splitlines() if "runner_up_first_lr_double" in line]
    assert len(rows) == 1, out.getvalue()
    assert "runner_up_first_lr_double (tuned)" in rows[0]
    assert "128@0-22 -> 512@22-27 -> 1024@27-30" in rows[0]
    assert "0.9346" in rows[0]


@pytest.mark.parametrize("tie_break", ["mean", "fewer_steps"])
def test_a_runner_up_as_good_within_noise_has_a_row_and_the_note_says_what_it_saves(
    tie_break: TieBreak,
) -> None:
    """The note may call the runner-up finalist as good as the result; the table then shows
    that finalist (a plain TPE draw, neither the result nor a named candidate) with its seed
    runs and steps, so that the user can take it instead. Under ``tie_break: fewer_steps``
    (the default) the cheaper one is the result and the row is the best mean's."""
    obj = objective({"task": "digits"})
    small = outcome(0, 0.9, obj, baseline="small_batch")
    longer = replace(outcome(12, 0.9885, obj), steps=915, summary="128@0-22 -> 512@22-30")
    shorter = replace(outcome(2, 0.9880, obj), steps=747, summary="64@0-3 -> 256@3-30")
    seeds = [10, 11, 12]

    def runs(o: TrialOutcome, accs: list[float]) -> dict[int, TrialOutcome]:
        return {
            s: replace(o, val_accuracy=a, metric_value=a, values=(a,))
            for s, a in zip(seeds, accs, strict=True)
        }

    stats = [
        seed_stats(longer, runs(longer, [0.987, 0.987, 0.988]), seeds),
        seed_stats(shorter, runs(shorter, [0.9875, 0.9875, 0.986]), seeds),
        seed_stats(small, runs(small, [0.90, 0.91, 0.92]), seeds),
    ]
    summary = summarize(
        [small, shorter, longer], obj, seed_runs=stats, seeds=seeds, tie_break=tie_break
    )
    best = 12 if tie_break == "mean" else 2
    assert summary["best"]["number"] == best
    result = StudyResult(
        study_id=1,
        status=StudyStatus.COMPLETED,
        summary=summary,
        outcomes=(small, shorter, longer),
        best_number=best,
        best_is_baseline=False,
        best_schedule=None,
        schedule_path=Path("best.yaml"),
    )
    console = Console(record=True, width=240)
    print_result(result, console)
    text = console.export_text()
    flat = " ".join(text.split())
    row = next(line for line in text.splitlines() if "finalist" in line)
    if tie_break == "mean":
        assert "64@0-3 -> 256@3-30" in row
        assert "0.9870 ± 0.0009" in row  # its seed runs
        assert " 747 " in row
        assert "tuned trial 2 is as good" in text
        assert "18% fewer optimizer steps (747 against 915)" in flat
    else:
        assert "128@0-22 -> 512@22-30" in row
        assert "0.9873 ± 0.0006" in row
        assert " 915 " in row
        assert "Picked for fewer optimizer steps within the seeds' noise: tuned trial 12" in flat
        assert "the pick takes 18% fewer steps (747 against 915)" in flat
    # Each trial has one row: the result and the baseline are not repeated as finalists.
    assert sum("finalist" in line for line in text.splitlines()) == 1


def test_a_width_given_or_columns_set_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    assert stdout_console(file=io.StringIO(), width=100).width == 100
    monkeypatch.setenv("COLUMNS", "220")
    assert stdout_console(file=io.StringIO()).width == 220


@pytest.mark.slow
@pytest.mark.ray_free
def test_stagetune_tasks_to_a_pipe_prints_whole_lines(tmp_path: Path) -> None:
    """The real console script, its stdout a pipe and no ``COLUMNS``: each task's first line
    (name, epochs, base batch and LR, optimizer) is one line, as on a terminal."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["STAGETUNE_DATA_DIR"] = str(tmp_path / "d")
    done = subprocess.run(
        [str(Path(sys.executable).with_name("stagetune")), "tasks"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    header = re.compile(
        r"^(\S+): \d+ epochs, base batch \d+ at LR \S+, \w+ \(momentum \S+, weight decay \S+\)$"
    )
    names = [m.group(1) for m in map(header.match, done.stdout.splitlines()) if m]
    assert {"cifar10", "denoise", "digits", "mnist1d", "tinylm"} <= set(names), done.stdout


def test_the_resume_hint_gives_commands_that_run_as_printed_and_never_a_password() -> None:
    """After Ctrl-C on ``stagetune tune``: the commands that finish the study. A URL with a
    password is never printed with it, nor put in a command that would then fail (its
    password hidden): the user sets STAGETUNE_DATABASE_URL instead."""
    from workers.runner import resume_hint

    plain = resume_hint(4, "sqlite:///stagetune-data/stagetune.db", "best schedule.yaml")
    assert (
        "run from this directory `STAGETUNE_DATABASE_URL=sqlite:///stagetune-data/stagetune.db "
        "stagetune worker --once`"
    ) in plain
    assert (
        "`stagetune export 4 --database-url sqlite:///stagetune-data/stagetune.db -o "
        "'best schedule.yaml'` writes its schedule"
    ) in plain
    secret = resume_hint(4, "postgresql://tuner:s3cret@db:5432/studies", "best.yaml")
    assert "s3cret" not in secret
    assert (
        "set STAGETUNE_DATABASE_URL to this database's URL with its password "
        "(postgresql://tuner:***@db:5432/studies), then run from this directory "
        "`stagetune worker --once`"
    ) in secret
    assert "`stagetune export 4 -o best.yaml`, which writes its schedule" in secret
    assert "--database-url" not in secret
    tasks = resume_hint(4, "sqlite:///x.db", "best.yaml", own_tasks=True)
    assert "run `stagetune tune` again" in tasks
