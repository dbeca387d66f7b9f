"""Acceptance: real studies on the ``digits`` task with the real trainable (gloo workers on the
session's local Ray), the real store (SQLite) and the real Optuna study in the same database.
"""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import optuna
import pytest
import ray
import yaml

from tests.environ import environ_without
from tests.seed_pick import checked_pick
from tuner.engine import checkpoint_bytes
from tuner.export import export_schedule, validate_document
from tuner.formatting import format_bytes
from tuner.leftovers import remove_leftovers
from tuner.objectives import search_text, split_resolution
from tuner.schedule import Schedule
from tuner.spec import StudySpec
from tuner.store.records import StudyStatus, TrialRecord, TrialStatus
from tuner.store.storage import StudyStore
from workers.runner import (
    experiment_name,
    optuna_study_name,
    print_result,
    run_study,
    tune_spec,
)
from workers.tasks import get_task

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
]

REPO = Path(__file__).resolve().parents[2]

SPEC = """
task: digits
name: digits-acceptance
schedule: {total_epochs: 4}
space:
  stages: {min: 1, max: 2}
  batch_size: {min: 32, max: 256}
  lr_multiplier: {min: 0.5, max: 2.0}
budget: {trials: 6, grace_period_epochs: 2, reduction_factor: 2, seed_runs: 0}
resources: {workers: 1, cpus_per_worker: 1}
"""

#: Two stages each and one trial at a time, so that trials after the startup ones have a
#: finished parent whose first stage they can extend (and fork from).
SPEC_WITH_FORKS = SPEC.replace("stages: {min: 1, max: 2}", "stages: {min: 2, max: 2}").replace(
    "budget: {trials: 6, grace_period_epochs: 2, reduction_factor: 2, seed_runs: 0}",
    "budget: {trials: 8, grace_period_epochs: 2, reduction_factor: 2, startup_trials: 2,\n"
    "         prefix_reuse: 0.9, max_concurrent: 1}",
)


def test_a_small_digits_study_end_to_end(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    spec = StudySpec.from_yaml(SPEC_WITH_FORKS)
    assert spec.budget.trials == 8
    out = tmp_path / "best.yaml"
    result = tune_spec(spec, sqlite_url, out, storage_path=tmp_path / "ray", quiet=True)

    store = StudyStore(sqlite_url)
    study = store.get_study(result.study_id)
    assert study.status is StudyStatus.COMPLETED
    trials = store.list_trials(study.id).items
    # Every trial of the budget, numbered densely, persisted with its per-epoch metrics.
    assert [t.number for t in trials] == list(range(8))
    assert all(t.status is not TrialStatus.RUNNING for t in trials)
    for trial in trials:
        curve = store.trial_metrics(trial.id)
        assert [m.epoch for m in curve] == list(range(trial.epochs_done))
        assert all(m.val_accuracy is not None and m.steps for m in curve)
        assert trial.val_accuracy == curve[-1].val_accuracy
        if trial.status is TrialStatus.COMPLETED:
            assert trial.epochs_done == 4

    # Baselines first: the lowest numbers, started before any tuned trial, run to the end.
    baselines = [t for t in trials if t.baseline is not None]
    tuned = [t for t in trials if t.baseline is None]
    assert [(t.number, t.baseline) for t in baselines] == [
        (0, "small_batch"),
        (1, "large_batch"),
        (2, "increase_batch"),
    ]
    assert max(t.started_at for t in baselines) <= min(t.started_at for t in tuned)
    assert all(t.status is TrialStatus.COMPLETED for t in baselines)

    # The result is seed-robust: the two best completed tuned trials and the best baseline
    # (the finalists) trained again on 3 fresh seeds; the result is the best mean over those
    # seeds (or a finalist with fewer steps within the seeds' noise of it), stored as the
    # study's best value.
    summary = study.summary
    assert summary is not None
    assert summary["best"]["number"] == study.best_trial_number == result.best_number
    best = next(t for t in trials if t.number == study.best_trial_number)
    seeded = summary["seed_runs"]
    assert len(seeded["seeds"]) == 3
    assert spec.seed not in seeded["seeds"]
    # The task's validation split, against which the note weighs the pick's lead.
    digits = get_task("digits").load_data(spec.task_options, seed=spec.seed)
    assert seeded["val_size"] == digits.num_val > 0

    def by_search_run(pool: list[TrialRecord]) -> list[int]:
        done = [t for t in pool if t.status is TrialStatus.COMPLETED]
        return [t.number for t in sorted(done, key=lambda t: (-(t.val_accuracy or 0), t.steps))]

    finalists = seeded["finalists"]
    assert [f["number"] for f in finalists if not f["reserve"]] == (
        by_search_run(tuned)[:2] + by_search_run(baselines)[:1]
    )
    # Reserves (at most reserve_finalists, 2): tuned trials ASHA stopped, filling the finalist
    # places it left empty (fewer than 2 tuned trials ran to the end), and tuned trials that
    # ran to the end as close to the lowest tuned finalist as one run on the small digits
    # split can read.
    reserves = [f["number"] for f in finalists if f["reserve"]]
    assert len(reserves) <= 2
    number = {t.number: t for t in tuned}
    stopped = {n for n in reserves if number[n].status is TrialStatus.STOPPED}
    assert len(stopped) <= 2 - len(by_search_run(tuned)[:2])
    lowest = min(
        (
            number[f["number"]].val_accuracy or 0.0
            for f in finalists
            if not f["reserve"] and f["baseline"] is None
        ),
        default=2.0,  # no tuned finalist: nothing to be close to
    )
    reads = split_resolution(min(lowest, 1.0), seeded["val_size"])
    for n in set(reserves) - stopped:
        assert number[n].status is TrialStatus.COMPLETED
        assert (number[n].val_accuracy or 0.0) >= lowest - 1.05 * reads, (n, lowest, reads)
    for f in finalists:
        accs = f["val_accuracy"]
        assert len(accs) == 3, f
        assert None not in accs, f
        assert f["mean"] == pytest.approx(sum(accs) / 3)
        assert f["values"] == accs  # the accuracy objective's value is the accuracy
    # The fresh seeds train different models (their accuracies are not one run copied).
    assert len({a for f in finalists for a in f["val_accuracy"]}) > 3
    picked = checked_pick(seeded)  # the best mean, or a cheaper finalist within noise of it
    assert seeded["picked"] == best.number == picked["number"]
    assert study.best_value == pytest.approx(picked["mean"])
    assert summary["best"]["seeds"]["mean"] == picked["mean"]
    assert summary["best_is_baseline"] == (best.baseline is not None)
    assert summary["compute_epochs"] == pytest.approx(
        summary["search_compute_epochs"] + seeded["compute_epochs"]
    )
    # 3 fresh seeds x 4 epochs for each finalist and reserve, forks saving some of it.
    assert seeded["compute_epochs"] <= len(finalists) * 3 * 4
    assert [b["baseline"] for b in summary["baselines"]] == [
        "small_batch",
        "large_batch",
        "increase_batch",
    ]
    for row in summary["baselines"]:
        assert {"val_accuracy", "steps", "wall_time_s", "mean_batch_size", "vs_best"} <= set(row)

    # The exported YAML is the best trial's schedule, valid and loadable.
    exported = Schedule.load(out)
    assert exported.stages == Schedule.from_dict(best.schedule).stages
    assert result.best_schedule is not None
    assert result.best_schedule.stages == exported.stages

    # The candidates, the first tuned trials: the recipes the space can draw (two stages
    # exactly: Smith's increase, not a constant batch) and the noise-scale candidate, drawn
    # once the small-batch baseline has finished (before or after the recipe, as the trials
    # end). On one worker without gradient accumulation that baseline measured the noise
    # scale at each epoch's end; the other trials did not.
    candidates = {c["candidate"]: c["number"] for c in summary["candidates"]}
    assert sorted(candidates) == ["fitted_increase", "noise_scale"], candidates
    assert sorted(candidates.values()) == [3, 4], candidates
    noise = summary["noise_candidate"]
    assert noise["note"] is None, noise
    assert noise["number"] == candidates["noise_scale"], noise
    # (Late in the run the noise scale outgrows what 16 batches of 32 resolve: the estimate
    # of |G|^2 is not positive there, and the epoch reports none.)
    small_noise = [m.noise_scale for m in store.trial_metrics(baselines[0].id)]
    assert small_noise[0] is not None, small_noise
    assert all(v is None or v > 0 for v in small_noise), small_noise
    assert all(m.noise_scale is None for m in store.trial_metrics(baselines[1].id))
    # The step floor that curve gives is in the summary (this study has no step cap).
    floor = summary["step_floor"]
    assert floor["trial"] == 0
    assert floor["steps"] == store.trial_metrics(baselines[0].id)[-1].steps
    assert 0 < floor["floor"] < floor["steps"]
    assert (floor["step_cap"], floor["cap_below_floor"]) == (None, False)

    # The Optuna study lives in the same database (tuned trials only).
    ot = optuna.load_study(study_name=optuna_study_name(study.id), storage=sqlite_url)
    assert sorted(t.user_attrs["stagetune_number"] for t in ot.trials) == [3, 4, 5, 6, 7]
    # Its intermediate values are the store's per-epoch accuracies, epoch k at step k, the
    # last epoch included; optuna-dashboard names the objective.
    assert ot.metric_names == ["val_accuracy"]
    for frozen in ot.trials:
        record = next(t for t in trials if t.number == frozen.user_attrs["stagetune_number"])
        curve = store.trial_metrics(record.id)
        assert frozen.intermediate_values == {m.epoch: m.val_accuracy for m in curve}

    # Tuned trials after the first two extend good trials' first stage, and fork from the
    # state their parent saved at that boundary: the prefix's epochs are reported again, as
    # recorded, and not trained again. (Smith's baseline forks from the small-batch one too:
    # they share their first stage.)
    prefixes = summary["prefixes"]
    assert prefixes["forks"] >= 2, summary
    smith = store.trial_metrics(baselines[2].id)
    assert (
        smith[0].extra["forked_epochs"]
        == Schedule.from_dict(baselines[2].schedule).stages[0].end_epoch
    )
    forked = 1
    by_number = {t.number: t for t in trials}
    for child in ot.trials:
        if "stagetune_parent" not in child.user_attrs:
            continue
        record = by_number[child.user_attrs["stagetune_number"]]
        parent = by_number[child.user_attrs["stagetune_parent"]]
        curve = store.trial_metrics(record.id)
        reused = curve[0].extra["forked_epochs"]
        if not reused:
            continue  # started before its parent reached the boundary
        forked += 1
        assert reused == Schedule.from_dict(record.schedule).stages[0].end_epoch
        before = store.trial_metrics(parent.id)[:reused]
        assert [m.val_accuracy for m in curve[:reused]] == [m.val_accuracy for m in before]
        assert [m.extra["replayed"] for m in curve] == [
            e < reused for e in range(record.epochs_done)
        ]
        assert curve[-1].extra["compute_epochs"] <= record.epochs_done - reused + 1
    assert forked == prefixes["forks"]
    assert prefixes["epochs_reused"] >= forked
    # The boundary states are deleted with the study's end.
    assert not list((tmp_path / "ray").glob("*.prefixes"))
    # What the CLI prints says what the search spent and saved.
    from rich.console import Console

    console = Console(record=True, width=240)
    print_result(result, console)
    printed = console.export_text()
    assert f"search: {summary['compute_epochs']:,.1f} trial-epochs trained" in printed
    assert "(cooldown probes after epoch 2 included)" in printed
    assert f"{prefixes['forks']} trials forked from shared prefixes" in printed
    assert f"{prefixes['epochs_reused']} epochs not trained again" in printed
    assert f"{len(finalists)} finalists trained again on 3 fresh seeds" in printed
    assert "val_acc over 3 fresh seeds" in printed
    assert "no noise-scale candidate" not in printed
    mean, std = picked["val_accuracy_mean"], picked["val_accuracy_std"]
    assert f"{mean:.4f} ± {std:.4f}" in printed


def test_a_study_on_a_trial_epoch_budget_completes_with_fewer_trials(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    """budget.trial_epochs: the study stops starting trials once they have trained 14 epochs
    and is completed (not queued again as interrupted), with its best schedule exported and
    the budget in the CLI's search line."""
    text = SPEC.replace(
        "budget: {trials: 6, grace_period_epochs: 2, reduction_factor: 2, seed_runs: 0}",
        "budget: {trials: 30, trial_epochs: 14, max_concurrent: 1, grace_period_epochs: 2,\n"
        "         reduction_factor: 2, seed_runs: 0}",
    )
    spec = StudySpec.from_yaml(text)
    out = tmp_path / "best.yaml"
    result = tune_spec(spec, sqlite_url, out, storage_path=tmp_path / "ray", quiet=True)

    assert result.status is StudyStatus.COMPLETED
    with StudyStore(sqlite_url) as store:
        study = store.get_study(result.study_id)
        trials = store.list_trials(study.id).items
    assert study.status is StudyStatus.COMPLETED
    assert 4 <= len(trials) < 30  # 3 baselines of 4 epochs, then tuned trials up to 14
    summary = study.summary
    assert summary is not None
    assert summary["trial_epochs_budget"] == 14
    assert summary["search_compute_epochs"] >= 14
    assert out.exists()
    from rich.console import Console

    console = Console(record=True, width=240)
    print_result(result, console)
    spent = summary["search_compute_epochs"]
    assert f"the trials spent {spent:,.1f} of a 14 trial-epoch budget" in console.export_text()


def test_study_1_of_a_new_database_trains_its_own_trials_on_a_used_storage_path(
    ray_session: None, tmp_path: Path
) -> None:
    """A user deletes ``stagetune.db`` (or points ``--database-url`` elsewhere) and runs
    again: the new database's study 1 shares the storage path with the old study 1's Ray
    Tune experiment. It must train its own spec, not resume the old directory and report the
    old study's trials as its own (each study's directory carries its creation time)."""
    storage = tmp_path / "ray"
    base = SPEC.replace(
        "budget: {trials: 6, grace_period_epochs: 2, reduction_factor: 2, seed_runs: 0}",
        "budget: {trials: 2, seed_runs: 0, early_stopping: false}\nbaselines: false",
    )
    old = tune_spec(
        StudySpec.from_yaml(base.replace("total_epochs: 4", "total_epochs: 2")),
        f"sqlite:///{tmp_path / 'old.db'}",
        tmp_path / "old.yaml",
        storage_path=storage,
        quiet=True,
    )
    new_url = f"sqlite:///{tmp_path / 'new.db'}"
    new = tune_spec(
        StudySpec.from_yaml(base.replace("trials: 2", "trials: 3")),
        new_url,
        tmp_path / "new.yaml",
        storage_path=storage,
        quiet=True,
    )
    assert old.study_id == new.study_id == 1
    assert new.status is StudyStatus.COMPLETED
    with StudyStore(new_url) as store:
        trials = store.list_trials(1).items
    assert len(trials) == 3  # this spec's budget, not the old study's 2 trials
    assert {t.epochs_done for t in trials} == {4}  # its 4 epochs, not the old study's 2
    assert len([p for p in storage.glob("study-1-*") if "." not in p.name]) == 2


def test_ctrl_c_on_stagetune_tune_queues_the_study_and_its_hint_finishes_it(
    ray_session: None, tmp_path: Path
) -> None:
    """Ctrl-C on ``stagetune tune`` after a trial finished: exit 130, no schedule file for
    an unfinished study, and a hint whose commands, run as printed, finish the study without
    training its finished trial again and write its schedule."""
    import re
    import shlex

    spec = SPEC.replace(
        "budget: {trials: 6, grace_period_epochs: 2, reduction_factor: 2, seed_runs: 0}",
        "budget: {trials: 5, early_stopping: false, seed_runs: 0, max_concurrent: 1}",
    )
    (tmp_path / "spec.yaml").write_text(spec, encoding="utf-8")
    stagetune = str(Path(sys.executable).with_name("stagetune"))
    env = environ_without("STAGETUNE_")
    env.update(
        RAY_ADDRESS=ray.get_runtime_context().gcs_address, PYTHONUNBUFFERED="1", COLUMNS="100"
    )
    proc = subprocess.Popen(
        [stagetune, "tune", "spec.yaml"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if re.search(r"\[\s*1/5\] trial", line):
                proc.send_signal(signal.SIGINT)
                break
        lines.extend(proc.stdout)
        proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
    output = "".join(lines)
    assert proc.returncode == 130, f"exit {proc.returncode}\n{output[-4000:]}"
    assert not (tmp_path / "best-schedule.yaml").exists()
    hint = re.search(r"run from this directory `(.+?)`.*then `(.+?)` writes", output)
    assert hint is not None, output[-4000:]
    worker_cmd, export_cmd = shlex.split(hint.group(1)), shlex.split(hint.group(2))
    assert worker_cmd[1:] == ["stagetune", "worker", "--once"], hint.group(1)
    url = worker_cmd[0].removeprefix("STAGETUNE_DATABASE_URL=")
    with StudyStore(url) as store:
        assert store.get_study(1).status is StudyStatus.QUEUED
        before = _finished(store, 1)
    assert before, output[-4000:]

    done = subprocess.run(
        [stagetune, *worker_cmd[2:]],
        cwd=tmp_path,
        env={**env, "STAGETUNE_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    with StudyStore(url) as store:
        assert store.get_study(1).status is StudyStatus.COMPLETED
        after = _finished(store, 1)
    assert len(after) == 5
    for number, record in before.items():
        assert after[number] == record, f"trial {number} trained again after the resume"
    exported = subprocess.run(
        [stagetune, *export_cmd[1:]], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert exported.returncode == 0, exported.stderr
    validate_document(yaml.safe_load((tmp_path / "best-schedule.yaml").read_text()), export=True)


PBT_SPEC = """
task: digits
name: digits-pbt
schedule: {total_epochs: 4}
space:
  stages: {min: 1, max: 2}
  batch_size: {min: 32, max: 256}
  lr_multiplier: {min: 0.5, max: 2.0}
budget: {trials: 7, search: pbt, seed_runs: 2}
resources: {workers: 1, cpus_per_worker: 1}
"""


def test_a_pbt_study_exports_its_winning_lineage_as_a_schedule(
    ray_session: None, db_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """budget.search: pbt with the real trainable: the population of 4 perturbs at epoch 2
    (the run cut into stages.max segments); a trial that cloned another goes on from its
    checkpoint with a new stage, and the store holds its lineage: the schedule, and the
    curve's first epochs copied from the trial it cloned. The best lineage exports as an
    ordinary, valid schedule YAML."""
    spec = StudySpec.from_yaml(PBT_SPEC)
    out = tmp_path / "best.yaml"
    result = tune_spec(spec, db_url, out, storage_path=tmp_path / "ray", quiet=True)

    store = StudyStore(db_url)
    request.addfinalizer(store.close)  # before the database is dropped
    study = store.get_study(result.study_id)
    assert study.status is StudyStatus.COMPLETED
    summary = study.summary
    assert summary is not None
    assert summary["search"] == "pbt"
    assert summary["pbt"]["interval_epochs"] == 2
    assert summary["cooldown_probes"]["at_epochs"] == [2]
    trials = {t.number: t for t in store.list_trials(study.id).items}
    assert sorted(trials) == list(range(7))
    assert all(t.status is TrialStatus.COMPLETED and t.epochs_done == 4 for t in trials.values())
    lineages = {int(k): v for k, v in summary["pbt"]["lineages"].items()}
    assert sorted(lineages) == [3, 4, 5, 6]
    # One of four is the worst quarter: it cloned one of the best quarter at epoch 2.
    cloned = {n: v for n, v in lineages.items() if v}
    assert len(cloned) == 1, lineages
    ((number, [[epoch, donor]]),) = cloned.items()
    assert epoch == 2
    assert donor in lineages
    assert donor != number
    mine, theirs = trials[number], trials[donor]
    mine_schedule = Schedule.from_dict(mine.schedule)
    donor_schedule = Schedule.from_dict(theirs.schedule)
    assert mine_schedule.stages[0].end_epoch in (2, 4)
    assert mine_schedule.stages[0].batch_size == donor_schedule.stages[0].batch_size
    assert mine_schedule.stages[0].lr_multiplier == donor_schedule.stages[0].lr_multiplier
    # Its curve is its lineage's: the donor's first two epochs, then its own.
    mine_curve, donor_curve = store.trial_metrics(mine.id), store.trial_metrics(theirs.id)
    assert [m.epoch for m in mine_curve] == [0, 1, 2, 3]
    assert [m.val_accuracy for m in mine_curve[:2]] == [m.val_accuracy for m in donor_curve[:2]]
    assert [m.batch_size for m in mine_curve] == [
        mine_schedule.stages[mine_schedule.stage_index_at(e)].batch_size for e in range(4)
    ]
    # Every tuned trial's schedule is of the space's kind.
    for n in lineages:
        schedule = Schedule.from_dict(trials[n].schedule)
        batches = [st.batch_size for st in schedule.stages]
        assert batches == sorted(batches)
        assert len(batches) <= 2
        assert all(32 <= b <= 256 and b & (b - 1) == 0 for b in batches)

    # The recommendation is seed-robust like any search's, and exports as a valid schedule.
    assert study.best_trial_number is not None
    assert summary["seed_runs"]["picked"] == study.best_trial_number
    best = trials[study.best_trial_number]
    validate_document(yaml.safe_load(out.read_text()), export=True)
    assert Schedule.load(out).stages == Schedule.from_dict(best.schedule).stages
    exported = export_schedule(store, study.id, number)
    validate_document(exported.to_dict(), export=True)
    assert exported.stages == mine_schedule.stages

    # PBT's checkpoints: the newest four per trial at most, their size in the summary; they
    # stay after the study, and go with it when it is deleted.
    experiment = tmp_path / "ray" / experiment_name(study)
    per_trial = Counter(p.parent for p in experiment.glob("*/checkpoint_*"))
    assert per_trial, sorted(experiment.iterdir())
    assert max(per_trial.values()) <= 4
    saved = summary["pbt"]["checkpoints"]
    assert saved["bytes"] == checkpoint_bytes(experiment)
    assert saved["kept_per_trial"] == 4
    assert saved["untracked_removed"] >= 0  # Tune's clean-up rarely leaves any
    assert saved["bytes"] > 0
    assert f"(checkpoints: {format_bytes(saved['bytes'])} on disk" in search_text(summary)
    store.delete_study(study.id)
    removal = remove_leftovers(store, tmp_path / "ray")
    assert removal.studies == [study.id]
    assert removal.bytes_freed > saved["bytes"]
    assert not experiment.exists()
    assert not list((tmp_path / "ray").glob(f"{experiment.name}*"))


CHILD = """
import sys
from tuner.store.storage import StudyStore
from workers.runner import run_study
url, study_id, worker_id, storage = sys.argv[1:5]
run_study(StudyStore(url), int(study_id), worker_id=worker_id, storage_path=storage)
"""


def _finished(store: StudyStore, study_id: int) -> dict[int, tuple[object, ...]]:
    return {
        t.number: (t.status, t.finished_at, t.epochs_done, t.val_accuracy, t.wall_time_s)
        for t in store.list_trials(study_id).items
        if t.status is not TrialStatus.RUNNING
    }


def test_an_interrupted_study_resumes_without_rerunning_finished_trials(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    spec = StudySpec.from_yaml(
        SPEC.replace(
            "budget: {trials: 6, grace_period_epochs: 2, reduction_factor: 2, seed_runs: 0}",
            "budget: {trials: 6, early_stopping: false, seed_runs: 0}",
        )
    )
    store = StudyStore(sqlite_url, create=True)
    study = store.create_study(spec.task, spec.to_dict(), spec.budget.trials)
    claimed = store.claim_study("worker-a", stale_after_s=60)
    assert claimed is not None
    assert claimed.id == study.id
    storage = tmp_path / "ray"

    # Run the study in a real process attached to this session's Ray, and kill it outright
    # once two trials are finished.
    env = {
        **os.environ,
        "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
        "PYTHONPATH": str(REPO),
    }
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, sqlite_url, str(study.id), "worker-a", str(storage)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 240
        while len(_finished(store, study.id)) < 2:
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
            assert time.monotonic() < deadline, "the study did not get going"
            time.sleep(0.2)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        if child.stderr:
            child.stderr.close()
    before = _finished(store, study.id)
    assert store.get_study(study.id).status is StudyStatus.RUNNING
    assert len(before) < 6

    # Resume (here, in this process): the experiment and the Optuna study are restored.
    result = run_study(store, study.id, worker_id="worker-a", storage_path=storage)

    assert result.status is StudyStatus.COMPLETED
    trials = store.list_trials(study.id).items
    assert [t.number for t in trials] == list(range(6))  # exactly the budget
    assert all(t.status is TrialStatus.COMPLETED for t in trials)
    after = _finished(store, study.id)
    for number, record in before.items():
        assert after[number] == record, f"trial {number} changed after the resume"
    # Not rerun: the resumed experiment's results for them are the ones from before the kill.
    outcomes = {o.number: o for o in result.outcomes}
    for number, record in before.items():
        assert outcomes[number].wall_time_s == record[4]
    assert store.get_study(study.id).summary is not None
    ot = optuna.load_study(study_name=optuna_study_name(study.id), storage=sqlite_url)
    issued = [t for t in ot.trials if "stagetune_number" in t.user_attrs]
    assert sorted(t.user_attrs["stagetune_number"] for t in issued) == [3, 4, 5]
    assert all(t.state is optuna.trial.TrialState.COMPLETE for t in issued)
    # A trial Optuna handed out just before the kill, never given to Tune, is closed as failed.
    others = [(t.number, t.state.name, t.user_attrs) for t in ot.trials if t not in issued]
    assert all(state == "FAIL" for _, state, _ in others), others


def test_a_cancel_request_stops_the_study(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    spec = StudySpec.from_yaml(SPEC.replace("trials: 6", "trials: 20"))
    store = StudyStore(sqlite_url, create=True)
    study = store.create_study(spec.task, spec.to_dict(), spec.budget.trials)
    assert store.claim_study("worker-c", stale_after_s=60) is not None

    def cancel_after_one() -> None:
        deadline = time.monotonic() + 240
        while len(_finished(store, study.id)) < 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        store.request_cancel(study.id)

    canceller = threading.Thread(target=cancel_after_one, daemon=True)
    canceller.start()
    result = run_study(
        store, study.id, worker_id="worker-c", storage_path=tmp_path / "ray", poll_s=0.2
    )
    canceller.join()
    gc.collect()  # Ray's leaked file handles warn now, under this module's filters

    assert result.status is StudyStatus.CANCELLED
    record = store.get_study(study.id)
    assert record.status is StudyStatus.CANCELLED
    assert record.summary is not None
    assert record.summary["cancelled"] is True
    trials = store.list_trials(study.id).items
    assert 1 <= len(trials) < 20
    assert all(t.status is not TrialStatus.RUNNING for t in trials)
    # The trials the cancel ended say so (not "stopped early", which reads as ASHA's doing).
    ended = [t for t in trials if t.stop_reason and t.stop_reason.startswith("cancelled")]
    assert ended, [(t.number, t.status, t.stop_reason) for t in trials]
    for t in ended:
        assert t.status is TrialStatus.STOPPED
        assert t.stop_reason == f"cancelled after {t.epochs_done} of 4 epochs"


def test_failing_trials_are_persisted_as_failed_and_the_study_goes_on(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    spec = StudySpec.from_yaml(
        "task: digits\nschedule: {total_epochs: 2}\nbaselines: false\n"
        "budget: {trials: 2, max_failures: 0, seed_runs: 0}"
    )
    store = StudyStore(sqlite_url, create=True)
    study = store.create_study(spec.task, spec.to_dict(), spec.budget.trials)
    assert store.claim_study("worker-f", stale_after_s=60) is not None
    # A task the workers do not have makes every trial's setup raise in its Ray actor (the
    # trial config's types pass the engine's check).
    result = run_study(
        store,
        study.id,
        worker_id="worker-f",
        storage_path=tmp_path / "ray",
        trial_config={"task": "no-such-task"},
    )
    trials = store.list_trials(study.id).items
    assert [t.number for t in trials] == [0, 1]
    for trial in trials:
        assert trial.status is TrialStatus.FAILED
        assert "no-such-task" in (trial.stop_reason or "")
    assert result.status is StudyStatus.COMPLETED
    record = store.get_study(study.id)
    assert record.summary is not None
    assert record.summary["best"] is None
    assert record.summary["note"] == "no trial completed its run; there is no result"
