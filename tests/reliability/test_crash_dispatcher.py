"""A dispatcher killed outright (SIGKILL) in the middle of a study, and a second one taking it
over: ``stagetune worker`` as real processes on the session's Ray cluster (``RAY_ADDRESS``),
the embedded SQLite database, a small digits study run one trial at a time.

The first worker is killed once at least two trials are finished and another one is running.
A second worker, started with a short ``STAGETUNE_STALE_AFTER_S``, claims the study when the
dead one's heartbeat goes stale and resumes it. Checked afterwards:

* every trial finished before the kill is still there, unchanged (its row and its metric rows);
* the study completed with exactly the budget of trials (numbers 0..budget-1), owned by the
  second worker, ``attempts == 2``;
* no trial is left ``running``: the one interrupted by the kill was run again (completed, a
  full curve, ``restarts == 1`` with a ``restart_reason``) or is ``failed`` with a reason;
  every other trial ran once (``restarts == 0``); the API shows the same;
* no schedule was trained twice (a sampler that replayed its sequence would repeat them);
* the killed worker's gang pool (its trials' warm worker processes) is gone, not kept for its
  idle time;
* the interrupted trial, killed after one of its stage boundaries, is not trained from
  scratch where the second worker can reach the first one's stage-boundary states (same host
  or shared storage, even with the experiment's state files cut short): it forks from the
  last boundary it had saved and reports the epochs before it again, exactly as first
  recorded.

Three variants: the second worker sees the first one's Ray Tune experiment directory (same
host, or shared storage) and restores it; or it does not (another host with a local data
directory) and must finish the study from what the database holds; or it sees the directory
with the saved state files emptied, as a kill during Tune's copy of its state leaves them
(also seen in the first variant when the kill lands in that copy), and must set the directory
aside (``study-N.unreadable-<time>``) and finish the study from the database.

A fourth test kills the worker after the search, while the finalists train on fresh seeds:
the second worker restores the seed runs' own experiment and trains only the runs left (if the
kill cut a state file short, it sets the directory aside and still trains only the runs left,
unless the experiment state itself was cut short).
"""

from __future__ import annotations

import json
import pickle
import signal
import subprocess
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

from api.app import create_app
from tests.cli import STAGETUNE
from tests.reliability.helpers import STUDIES, api_settings, clean_env
from tuner.prefixes import boundaries
from tuner.schedule import Schedule
from tuner.spec import StudySpec
from tuner.store import StudyStatus, StudyStore, TrialRecord, TrialStatus
from tuner.store.migrate import upgrade

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

pytestmark = [pytest.mark.ray, pytest.mark.slow]

BUDGET = 6
EPOCHS = 8
SPEC = {
    "task": "digits",
    "name": "crash-me",
    "baselines": False,
    # Enough epochs that the trial seen running is still running when the kill lands, even on
    # a fast idle machine (~0.1 s per epoch); two stages each, so that every trial saves a
    # stage-boundary state the one interrupted can resume from.
    "schedule": {"total_epochs": EPOCHS},
    "space": {"stages": {"min": 2, "max": 2}, "batch_size": {"min": 32, "max": 128}},
    "budget": {
        "trials": BUDGET,
        "early_stopping": False,
        "max_concurrent": 1,
        "seed_runs": 0,
    },
    "resources": {"workers": 1, "cpus_per_worker": 1},
}


def start_worker(
    url: str,
    worker_id: str,
    data_dir: Path,
    ray_address: str,
    log: Path,
    stale_after_s: float,
    *,
    until: str = "--once",
) -> subprocess.Popen[bytes]:
    """``stagetune worker`` (``until``: ``--once``, or ``--max-studies=1`` for a worker that
    waits for a study to become claimable, e.g. stale)."""
    env = clean_env(
        {
            "STAGETUNE_DATABASE_URL": url,
            "STAGETUNE_DATA_DIR": str(data_dir),
            "STAGETUNE_HEARTBEAT_S": "0.5",
            "STAGETUNE_POLL_S": "0.5",
            "STAGETUNE_STALE_AFTER_S": str(stale_after_s),
            "RAY_ADDRESS": ray_address,
        }
    )
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*STAGETUNE, "worker", until, "--worker-id", worker_id, "--log-level", "info"],
            cwd=data_dir.parent,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def other_drivers_pools() -> list[str]:
    """The gang pools on the cluster (``workers.gang_pool``) but this test session's own."""
    from workers.gang_pool import live_pools, pool_name

    mine = pool_name()
    return [name for name in live_pools() if name != mine]


def unreadable(path: Path) -> bool:
    """An empty state file, or one cut short (what a kill during Tune's copy leaves). Only
    ``experiment_state-*.json`` is JSON: ``search_gen_state-*.json`` is a pickle, like
    ``searcher-state-*.pkl``."""
    data = path.read_bytes()
    if not data:
        return True
    try:
        if path.name.startswith("experiment_state-"):
            json.loads(data)
        else:
            pickle.loads(data)
    except Exception:  # a cut-short pickle raises anything from EOFError on
        return True
    return False


def boundary_reached(store: StudyStore, trial: TrialRecord) -> int | None:
    """The last stage boundary (epoch) a running trial has reported past, if any: the trial
    saved its state there before it reported that epoch."""
    reported = len(store.trial_metrics(trial.id))
    ends = [end for _, end in boundaries(Schedule.from_dict(trial.schedule))]
    return max((end for end in ends if end <= reported), default=None)


def curve_of(store: StudyStore, trial_id: int) -> list[tuple[Any, ...]]:
    return [
        (m.epoch, m.val_accuracy, m.val_loss, m.train_loss, m.steps, m.lr)
        for m in store.trial_metrics(trial_id)
    ]


def finished_rows(store: StudyStore, study_id: int) -> dict[int, tuple[Any, ...]]:
    """Every finished trial with its metric rows: what must survive the crash unchanged."""
    rows = {}
    for t in store.list_trials(study_id, limit=1000).items:
        if t.status is TrialStatus.RUNNING:
            continue
        curve = tuple(curve_of(store, t.id))
        rows[t.number] = (
            t.id,
            t.status,
            t.stop_reason,
            t.started_at,
            t.finished_at,
            t.epochs_done,
            t.val_accuracy,
            t.wall_time_s,
            t.steps,
            t.schedule,
            curve,
        )
    return rows


@pytest.mark.parametrize(
    "storage",
    [
        pytest.param("shared", id="shared-ray-storage"),
        pytest.param("other-host", id="other-host-storage"),
        pytest.param("truncated", id="truncated-experiment-state"),
    ],
)
def test_killed_dispatcher_is_taken_over_and_no_finished_trial_is_lost(
    ray_session: None, sqlite_url: str, tmp_path: Path, storage: str
) -> None:
    """``storage``: the second worker sees the first one's Ray Tune experiment directory
    (``shared``: same host, or shared storage); or it does not (``other-host``: local disks),
    and must finish the study from the database; or it sees the directory with its saved
    state files emptied (``truncated``: what a SIGKILL during Tune's state copy leaves)."""
    import ray

    address = ray.get_runtime_context().gcs_address
    upgrade(sqlite_url)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    with StudyStore(sqlite_url) as store:
        spec = StudySpec.from_dict(SPEC)
        study_id = store.create_study(spec.task, spec.to_dict(), BUDGET, name=spec.name).id

        first = start_worker(sqlite_url, "w-first", data_dir, address, tmp_path / "w1.log", 60)
        killed_running: int | None = None
        saved_at: int | None = None  # the last stage boundary it had saved a state at
        pools_at_kill: list[str] = []  # the gang pools of other drivers, the first worker's
        try:
            deadline = time.monotonic() + 300
            while True:
                assert first.poll() is None, (tmp_path / "w1.log").read_text()[-3000:]
                assert time.monotonic() < deadline, (
                    "the first worker did not finish 2 trials and get a third past a stage boundary"
                )
                trials = store.list_trials(study_id).items
                done = [t for t in trials if t.status is not TrialStatus.RUNNING]
                running = [t for t in trials if t.status is TrialStatus.RUNNING]
                if len(done) >= 2 and running:
                    saved_at = boundary_reached(store, running[0])
                    if saved_at is not None:
                        killed_running = running[0].number
                        pools_at_kill = other_drivers_pools()
                        break
                time.sleep(0.05)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        kill_time = time.monotonic()
        before = finished_rows(store, study_id)
        assert len(before) >= 2
        study = store.get_study(study_id)
        assert study.status is StudyStatus.RUNNING
        assert study.worker_id == "w-first"
        assert killed_running is not None
        assert saved_at is not None
        killed = store.get_trial(study_id, killed_running)
        assert killed.status is TrialStatus.RUNNING
        reported_before = curve_of(store, killed.id)

        # A standing dispatcher: it finds nothing to claim until the heartbeat is 3 s old.
        state_files = [
            f
            for pattern in ("experiment_state-*", "search_gen_state-*", "searcher-state-*")
            for f in (data_dir / "ray").glob(f"study-*/{pattern}")
        ]
        assert state_files, sorted((data_dir / "ray").rglob("*"))
        if storage == "truncated":
            for f in state_files:
                f.write_bytes(b"")
        truncated = any(unreadable(f) for f in state_files)  # also when the kill did it
        second_dir = data_dir if storage != "other-host" else tmp_path / "other-host" / "data"
        second_dir.mkdir(parents=True, exist_ok=True)
        second = start_worker(
            sqlite_url,
            "w-second",
            second_dir,
            address,
            tmp_path / "w2.log",
            3,
            until="--max-studies=1",
        )
        try:
            second.wait(timeout=420)
        finally:
            if second.poll() is None:
                second.kill()
                second.wait(30)
        log2 = (tmp_path / "w2.log").read_text()
        assert second.returncode == 0, log2[-4000:]
        print(f"taken over and finished {time.monotonic() - kill_time:.0f} s after the kill")
        # The killed worker's gang pool (its trials' warm worker processes) did not outlive it
        # for its idle time: it saw its driver's job end and went, gangs and all.
        assert pools_at_kill, "the first worker's trials kept no gang pool"
        deadline = time.monotonic() + 15
        while set(pools_at_kill) & set(other_drivers_pools()):
            assert time.monotonic() < deadline, (pools_at_kill, other_drivers_pools())
            time.sleep(0.5)
        aside = sorted((second_dir / "ray").glob("study-*.unreadable-*"))
        if storage != "other-host" and truncated:
            assert len(aside) == 1, sorted((second_dir / "ray").iterdir())
            assert (aside[0] / "tuner.pkl").exists()  # kept as the dead worker left it
            assert "cannot be restored" in log2, log2[-4000:]
        else:
            # A readable directory is restored, not set aside.
            assert not aside, log2[-4000:]
            assert ("resuming the Tune experiment" in log2) == (storage == "shared"), log2[-4000:]

        study = store.get_study(study_id)
        assert study.status is StudyStatus.COMPLETED, (study.error, log2[-4000:])
        assert study.worker_id == "w-second"
        assert study.attempts == 2
        trials = store.list_trials(study_id, limit=1000).items
        assert [t.number for t in trials] == list(range(BUDGET))
        assert all(t.status is not TrialStatus.RUNNING for t in trials)
        after = finished_rows(store, study_id)
        for number, row in before.items():
            assert after[number] == row, f"trial {number} changed after the take-over"
        interrupted = store.get_trial(study_id, killed_running)
        if interrupted.status is TrialStatus.FAILED:
            assert interrupted.stop_reason
        else:
            assert interrupted.status is TrialStatus.COMPLETED, interrupted
            curve = store.trial_metrics(interrupted.id)
            assert [m.epoch for m in curve] == list(range(EPOCHS))
            # The re-run is recorded on the trial (same number, started again).
            assert interrupted.restarts == 1, interrupted
            assert interrupted.restart_reason, interrupted
            assert "did not finish" in interrupted.restart_reason
            # Its finished prefix is not trained again where the states are in reach: it
            # forks from the last boundary it had saved (at least the one seen reported) and
            # reports the epochs before it again, as first recorded.
            if storage != "other-host":
                forked = curve[0].extra.get("forked_epochs") or 0
                replayed = [bool(m.extra.get("replayed")) for m in curve]
                ends = [end for _, end in boundaries(Schedule.from_dict(interrupted.schedule))]
                assert forked >= saved_at, (forked, saved_at)
                assert forked in ends, (forked, ends)
                assert replayed == [True] * forked + [False] * (EPOCHS - forked), replayed
                seen = min(forked, len(reported_before))
                assert curve_of(store, interrupted.id)[:seen] == reported_before[:seen]
        for t in trials:
            if t.number != killed_running:
                assert t.restarts == 0, t  # every other trial ran once
        for t in trials:
            if t.status is TrialStatus.FAILED:
                assert t.stop_reason, t
        schedules = [json.dumps(t.schedule, sort_keys=True) for t in trials]
        assert len(set(schedules)) == len(schedules), "a schedule was trained twice"

        # The API tells the same story.
        app = create_app(settings=api_settings(sqlite_url), store=store)
        with TestClient(app) as client:
            shown = client.get(f"{STUDIES}/{study_id}").json()
            assert shown["status"] == "completed"
            assert shown["attempts"] == 2
            assert shown["progress"]["trials_done"] == BUDGET
            assert shown["progress"]["trials_running"] == 0
            page = client.get(f"{STUDIES}/{study_id}/trials", params={"limit": 100}).json()
            assert {t["number"]: t["status"] for t in page["items"]} == {
                t.number: t.status.value for t in trials
            }
            assert {t["number"]: (t["restarts"], t["restart_reason"]) for t in page["items"]} == {
                t.number: (t.restarts, t.restart_reason) for t in trials
            }
            for t in page["items"]:
                if t["status"] == "failed":
                    assert t["stop_reason"]


def finished_seed_runs(ray_dir: Path, experiment: str = "study-*.seeds") -> dict[str, str]:
    """The seed runs finished so far, as the seed runs' Tune experiment state (saved at every
    step) records them: Tune trial id -> its last result and start time (JSON), which must
    not change again. ``experiment``: the directory's pattern under ``ray_dir``."""
    out: dict[str, str] = {}
    for path in sorted(ray_dir.glob(f"{experiment}/experiment_state-*.json"))[-1:]:
        try:
            state = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # being written
        for trial_text, runtime_text in state["trial_data"]:
            trial, runtime = json.loads(trial_text), json.loads(runtime_text)
            last = runtime.get("last_result") or {}
            if last.get("done"):
                # Its start time changes if it is run again.
                seen = {k: last.get(k) for k in ("val_accuracy", "steps", "training_iteration")}
                out[trial["trial_id"]] = json.dumps({**seen, "start": runtime.get("start_time")})
    return out


def test_a_dispatcher_killed_during_the_seed_runs_is_taken_over_without_retraining_them(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    """The search has finished and its finalists are training on fresh seeds when the worker
    is killed: the second worker restores the seed runs' experiment, trains only the runs
    that had not finished, and reports the pick on every finalist's full set of seeds."""
    import ray

    address = ray.get_runtime_context().gcs_address
    upgrade(sqlite_url)
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    runs = 1 * 3  # finalists x fresh seeds
    spec = StudySpec.from_dict(
        {
            **SPEC,
            "name": "crash-in-seed-runs",
            "budget": {
                **dict(SPEC["budget"]),  # type: ignore[call-overload]
                "trials": 2,
                "seed_runs": 3,
                "finalists": 1,
                "reserve_finalists": 0,
            },
        }
    )
    with StudyStore(sqlite_url) as store:
        study_id = store.create_study(spec.task, spec.to_dict(), 2, name=spec.name).id
        first = start_worker(sqlite_url, "w-first", data_dir, address, tmp_path / "w1.log", 60)
        try:
            deadline = time.monotonic() + 300
            while True:
                assert first.poll() is None, (tmp_path / "w1.log").read_text()[-3000:]
                assert time.monotonic() < deadline, "no seed run finished in time"
                before = finished_seed_runs(data_dir / "ray")
                if 1 <= len(before) < runs:
                    break
                time.sleep(0.05)
        finally:
            first.send_signal(signal.SIGKILL)
            first.wait(30)
        before = finished_seed_runs(data_dir / "ray")  # what the kill left
        assert len(before) < runs, "every seed run had finished before the kill"
        # Tune saves the seed runs' state at every step: the kill can land in that copy and
        # leave a state file empty or cut short (the window the main test's variants cover).
        seeds_dir = next((data_dir / "ray").glob("study-*.seeds"))
        truncated = sorted(
            f.name
            for pattern in ("experiment_state-*", "search_gen_state-*", "searcher-state-*")
            for f in seeds_dir.glob(pattern)
            if unreadable(f)
        )
        assert store.get_study(study_id).status is StudyStatus.RUNNING
        search = finished_rows(store, study_id)
        assert len(search) == 2  # the search had finished

        second = start_worker(
            sqlite_url,
            "w-second",
            data_dir,
            address,
            tmp_path / "w2.log",
            3,
            until="--max-studies=1",
        )
        try:
            second.wait(timeout=420)
        finally:
            if second.poll() is None:
                second.kill()
                second.wait(30)
        log2 = (tmp_path / "w2.log").read_text()
        assert second.returncode == 0, log2[-4000:]
        aside: dict[str, str] = {}
        if truncated:
            # Set aside: the runs its experiment state holds as finished are reused, the
            # others train in a new experiment; with that state itself cut short, every run
            # trains again (docs/reliability.md).
            assert "cannot be restored" in log2, (truncated, log2[-4000:])
            assert len(list((data_dir / "ray").glob("study-*.seeds.unreadable-*"))) == 1
            if any(name.startswith("experiment_state-") for name in truncated):
                before = {}
            else:
                aside = finished_seed_runs(data_dir / "ray", "study-*.seeds.unreadable-*")
                assert aside == before
                assert f"reusing {len(before)} finished seed run(s)" in log2, log2[-4000:]
        else:
            assert "resuming the seed runs" in log2, log2[-4000:]
        study = store.get_study(study_id)
        assert study.status is StudyStatus.COMPLETED, (study.error, log2[-4000:])
        assert study.worker_id == "w-second"
        assert finished_rows(store, study_id) == search  # no search trial ran again
        after = {**aside, **finished_seed_runs(data_dir / "ray")}
        assert len(after) == runs, sorted(after)  # one Tune trial per run, none repeated
        for name, text in before.items():
            assert after[name] == text, f"seed run {name} trained again after the take-over"
        summary = study.summary or {}
        seeded = summary["seed_runs"]
        assert len(seeded["finalists"]) == 1
        for finalist in seeded["finalists"]:
            assert finalist["failed"] == 0
            assert len(finalist["values"]) == 3
            assert None not in finalist["values"]
        assert summary["best"]["number"] == seeded["picked"]
