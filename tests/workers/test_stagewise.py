"""The stage-wise search end to end (``budget.search: stagewise``): a real digits study
through Ray Tune, the trainable's boundary states and the store, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.objectives import search_text
from tuner.schedule import Schedule
from tuner.spec import StudySpec
from tuner.store.records import StudyStatus, TrialStatus
from tuner.store.storage import StudyStore
from workers.runner import tune_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPEC = """
task: digits
name: digits-stagewise
schedule: {total_epochs: 6}
space:
  stages: {min: 2, max: 2}
  batch_size: {min: 32, max: 256}
  lr_multiplier: {min: 0.5, max: 2.0}
budget: {trials: 6, search: stagewise, stage_candidates: 3, stage_keep: 1, seed_runs: 0,
         max_concurrent: 2}
baselines: false
resources: {workers: 1, cpus_per_worker: 1}
"""


def test_a_stagewise_study_trains_each_stage_once_and_forks_the_best(
    ray_session: None, db_url: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    spec = StudySpec.from_yaml(SPEC)
    result = tune_spec(
        spec, db_url, tmp_path / "best.yaml", storage_path=tmp_path / "ray", quiet=True
    )
    store = StudyStore(db_url)
    request.addfinalizer(store.close)  # before the database is dropped
    study = store.get_study(result.study_id)
    assert study.status is StudyStatus.COMPLETED
    trials = store.list_trials(study.id).items
    assert [t.number for t in trials] == list(range(6))
    first, second = trials[:3], trials[3:]

    # Round 0: every candidate trained its first stage only, then was stopped there.
    for t in first:
        end = Schedule.from_dict(t.schedule).stages[0].end_epoch
        assert t.status is TrialStatus.STOPPED
        assert t.epochs_done == end
        assert t.stop_reason is not None
        assert t.stop_reason.startswith("stage-wise search"), t.stop_reason
    # Round 1 starts once round 0 has been ranked (synchronous rounds) ...
    assert min(t.started_at for t in second) >= max(t.finished_at for t in first if t.finished_at)
    # ... and its candidates keep one round-0 prefix (stage_keep: 1) and train the last stage.
    kept = {Schedule.from_dict(t.schedule).stages[0] for t in second}
    assert len(kept) == 1
    assert kept <= {Schedule.from_dict(t.schedule).stages[0] for t in first}
    for t in second:
        assert t.status is TrialStatus.COMPLETED
        assert t.epochs_done == 6
    # The kept prefix trained once: the round-1 trials forked from its boundary state.
    summary = study.summary
    assert summary is not None
    prefixes = summary["prefixes"]
    assert prefixes["forks"] == 3
    stage0 = next(iter(kept)).end_epoch
    assert prefixes["epochs_reused"] == 3 * stage0
    # Compute: every round-0 epoch and probe, the round-1 trials' own stage only.
    assert summary["search_compute_epochs"] < 3 * 6 + 3 * (6 - stage0) + 1
    assert summary["stagewise"] == {"candidates": 3, "keep": 1, "prefixes": 3, "whole_runs": 3}
    assert "stage-wise rounds of 3 candidates keeping the best 1: 3 prefixes trained to a " in (
        search_text(summary)
    )
    # The result is a whole schedule.
    best = next(t for t in trials if t.number == study.best_trial_number)
    assert best.status is TrialStatus.COMPLETED
    assert Schedule.load(tmp_path / "best.yaml").stages == Schedule.from_dict(best.schedule).stages
