"""A data-parallel worker process of a trial killed mid-epoch (SIGKILL of one Ray actor of the
trial's gang, found through the worker PIDs the trainable reports with every epoch).

``stagetune worker --once`` runs a small digits study (2 workers per trial, one trial at a
time, no retries) on the session's Ray cluster. Once the first trial has reported an epoch,
its rank-1 worker is killed. Then: that trial ends ``failed`` with a reason naming the dead
worker, the study goes on and completes its budget, and the later trials ran on fresh
worker processes (PIDs disjoint from the killed trial's).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli import STAGETUNE
from tests.reliability.helpers import clean_env
from tuner.spec import StudySpec
from tuner.store import StudyStatus, StudyStore, TrialStatus
from tuner.store.migrate import upgrade

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BUDGET = 3
SPEC = {
    "task": "digits",
    "name": "kill-a-worker",
    "baselines": False,
    # Enough epochs (at the smallest batch) that the kill, sent as soon as the first epoch is
    # reported, lands while the trial still trains even on a fast idle machine (~0.1 s/epoch).
    "schedule": {"total_epochs": 20},
    "space": {"stages": {"min": 1, "max": 1}, "batch_size": {"min": 32, "max": 32}},
    "budget": {
        "trials": BUDGET,
        "early_stopping": False,
        "max_concurrent": 1,
        "max_failures": 0,
        "seed_runs": 0,
    },
    "resources": {"workers": 2, "cpus_per_worker": 1},
}


def pids_of(store: StudyStore, trial_id: int) -> set[int]:
    found: set[int] = set()
    for m in store.trial_metrics(trial_id):
        found.update(int(p) for p in m.extra.get("worker_pids") or ())
    return found


def test_a_killed_gang_worker_fails_its_trial_and_the_study_goes_on(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    import ray

    upgrade(sqlite_url)
    with StudyStore(sqlite_url) as store:
        spec = StudySpec.from_dict(SPEC)
        study_id = store.create_study(spec.task, spec.to_dict(), BUDGET, name=spec.name).id
        env = clean_env(
            {
                "STAGETUNE_DATABASE_URL": sqlite_url,
                "STAGETUNE_DATA_DIR": str(tmp_path / "data"),
                "STAGETUNE_HEARTBEAT_S": "1",
                "STAGETUNE_POLL_S": "0.5",
                "RAY_ADDRESS": ray.get_runtime_context().gcs_address,
            }
        )
        log = tmp_path / "worker.log"
        with open(log, "wb") as out:
            worker = subprocess.Popen(
                [*STAGETUNE, "worker", "--once", "--worker-id", "w-kill"],
                cwd=tmp_path,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + 240
            victim: int | None = None
            while victim is None:
                assert worker.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "the first trial never reported an epoch"
                trials = store.list_trials(study_id).items
                if trials and trials[0].status is TrialStatus.RUNNING:
                    curve = store.trial_metrics(trials[0].id)
                    if curve and curve[-1].extra.get("worker_pids"):
                        pids = [int(p) for p in curve[-1].extra["worker_pids"]]
                        assert len(pids) == 2, pids
                        victim = pids[1]
                time.sleep(0.05)
            os.kill(victim, signal.SIGKILL)
            killed_at = time.monotonic()
            worker.wait(timeout=420)
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait(30)
        output = log.read_text()
        assert worker.returncode == 0, output[-4000:]
        print(f"study finished {time.monotonic() - killed_at:.0f} s after the kill")

        study = store.get_study(study_id)
        assert study.status is StudyStatus.COMPLETED, (study.error, output[-4000:])
        trials = store.list_trials(study_id).items
        assert [t.number for t in trials] == list(range(BUDGET))
        first, *rest = trials
        assert first.status is TrialStatus.FAILED, first
        assert first.stop_reason is not None
        assert "died" in first.stop_reason or "worker" in first.stop_reason, first.stop_reason
        assert [t.status for t in rest] == [TrialStatus.COMPLETED] * len(rest), rest
        killed_trial_pids = pids_of(store, first.id)
        assert victim in killed_trial_pids
        for t in rest:
            fresh = pids_of(store, t.id)
            assert len(fresh) == 2, (t.number, fresh)
            assert not fresh & killed_trial_pids, (t.number, fresh, killed_trial_pids)
