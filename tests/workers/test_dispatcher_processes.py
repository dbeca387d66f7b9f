"""Dispatchers as real processes: several against one PostgreSQL database run every study
exactly once (with the real Ray runner, and at scale with a stand-in runner); SIGTERM gives
the running study back and exits cleanly; ``stagetune worker`` fails a study whose run
raises, with the error message."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.cli import STAGETUNE
from tests.environ import environ_without
from tuner.spec import StudySpec
from tuner.store import StudyStatus, StudyStore, TrialStatus
from tuner.store.migrate import upgrade

REPO = Path(__file__).resolve().parents[2]

# A dispatcher process with a stand-in runner: it records trial 0 (a second run of the same
# study would hit the unique trial number and fail loudly), waits WORK_S, and completes it.
SCRIPT = """
import sys, time
from tuner.settings import Settings
from tuner.store import StudyStatus, StudyStore, TrialStatus
from workers.dispatcher import Dispatcher, install_signal_handlers

url, worker_id, work_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
SCHEDULE = {schedule!r}

def runner(store, study_id, worker):
    trial = store.create_trial(study_id, 0, SCHEDULE, {{"worker": worker}})
    time.sleep(work_s)
    store.finish_trial(trial.id, TrialStatus.COMPLETED, final={{"val_accuracy": 0.5}})
    store.finish_study(study_id, StudyStatus.COMPLETED, worker_id=worker)

settings = Settings(_env_file=None, heartbeat_s=0.1, stale_after_s=30, poll_s=0.05)
with StudyStore(url) as store:
    dispatcher = Dispatcher(store, settings, runner=runner, worker_id=worker_id, once=True)
    install_signal_handlers(dispatcher)
    stats = dispatcher.run()
print("ran", stats.studies, "released", stats.released, flush=True)
"""


def _schedule() -> dict[str, Any]:
    from tuner.schedule import Schedule, Stage

    return Schedule(stages=(Stage(0, 1, 32),), base_lr=0.1, base_batch_size=32).to_dict()


def env(**extra: str) -> dict[str, str]:
    out = environ_without("STAGETUNE_")
    out["PYTHONPATH"] = str(REPO)
    out.update(extra)
    return out


def start_script(url: str, worker_id: str, work_s: float) -> subprocess.Popen[str]:
    code = SCRIPT.format(schedule=_schedule())
    return subprocess.Popen(
        [sys.executable, "-c", code, url, worker_id, str(work_s)],
        cwd=REPO,
        env=env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def quick_spec(name: str, **extra: Any) -> StudySpec:
    return StudySpec.from_dict(
        {
            "task": "digits",
            "name": name,
            "baselines": False,
            "schedule": {"total_epochs": 1},
            "space": {"stages": {"min": 1, "max": 1}},
            "budget": {"trials": 1, "grace_period_epochs": 1, "seed_runs": 0},
            "resources": {"workers": 1, "cpus_per_worker": 1},
            **extra,
        }
    )


def submit(store: StudyStore, spec: StudySpec) -> int:
    return store.create_study(spec.task, spec.to_dict(), spec.budget.trials, name=spec.name).id


@pytest.fixture
def pg_store(pg_url: str) -> Iterator[StudyStore]:
    upgrade(pg_url)
    with StudyStore(pg_url) as store:
        yield store


@pytest.mark.postgres
def test_two_dispatchers_run_every_study_exactly_once(pg_url: str, pg_store: StudyStore) -> None:
    ids = [submit(pg_store, quick_spec(f"s{i}")) for i in range(12)]
    procs = [start_script(pg_url, f"w{i}", 0.1) for i in range(2)]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    workers = set()
    for study_id in ids:
        study = pg_store.get_study(study_id)
        assert study.status is StudyStatus.COMPLETED, (study_id, study.error, outputs)
        assert study.attempts == 1
        trials = pg_store.list_trials(study_id)
        assert trials.total == 1
        assert trials.items[0].params["worker"] == study.worker_id
        workers.add(study.worker_id)
    assert workers <= {"w0", "w1"}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_gives_the_running_study_back_and_exits_cleanly(
    db_url: str, sig: signal.Signals
) -> None:
    upgrade(db_url)
    with StudyStore(db_url) as store:
        first = submit(store, quick_spec("first"))
        second = submit(store, quick_spec("second"))
        proc = start_script(db_url, "w-term", 600.0)
        try:
            deadline = time.monotonic() + 60
            while store.list_trials(first).total == 0:  # the runner is working on it
                assert proc.poll() is None, proc.communicate()[0]
                assert time.monotonic() < deadline
                time.sleep(0.1)
            proc.send_signal(sig)
            output = proc.communicate(timeout=30)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, output
        assert f"ran [{first}] released [{first}]" in output
        study = store.get_study(first)
        assert study.status is StudyStatus.QUEUED  # a later claim resumes it
        assert (study.worker_id, study.heartbeat_at) == (None, None)
        assert store.get_trial(first, 0).status is TrialStatus.FAILED
        assert store.get_study(second).attempts == 0  # nothing new was claimed


@pytest.mark.slow
@pytest.mark.ray_free  # the run raises before it connects to Ray
def test_worker_command_fails_a_study_whose_run_raises(sqlite_url: str) -> None:
    upgrade(sqlite_url)
    with StudyStore(sqlite_url) as store:
        # Options the spec refuses at submission; a study queued before that check existed
        # (or by another client) still reaches the worker, which must fail it with the reason.
        spec = {**quick_spec("bad").to_dict(), "task_options": {"hidden_dim": 1}}
        bad = store.create_study("digits", spec, 1, name="bad").id
        result = subprocess.run(
            [*STAGETUNE, "worker", "--once", "--worker-id", "cli-worker"],
            cwd=REPO,
            env=env(STAGETUNE_DATABASE_URL=sqlite_url),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert "ran 1 studies, 1 failed" in result.stderr
        study = store.get_study(bad)
        assert study.status is StudyStatus.FAILED
        assert study.worker_id == "cli-worker"
        assert study.error is not None
        assert "hidden_dim" in study.error


@pytest.mark.slow
@pytest.mark.ray_free
def test_worker_command_gives_back_a_study_when_nothing_answers_at_ray_address(
    sqlite_url: str,
) -> None:
    """A ``RAY_ADDRESS`` where no Ray head listens (a stopped cluster, a wrong port): the study
    goes back to the queue at once, not failed and not held for the minutes ``ray.init``
    would retry, and ``--once`` exits 1 saying why."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    upgrade(sqlite_url)
    with StudyStore(sqlite_url) as store:
        study_id = submit(store, quick_spec("no-ray"))
        result = subprocess.run(  # ray.init would retry the address for about 12 minutes
            [*STAGETUNE, "worker", "--once", "--worker-id", "cli-worker"],
            cwd=REPO,
            env=env(STAGETUNE_DATABASE_URL=sqlite_url, RAY_ADDRESS=f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 1, result.stderr
        assert "ran 1 studies, gave back 1" in result.stderr
        last = result.stderr.strip().splitlines()[-1]
        assert last.startswith(
            f"stagetune: error: could not connect to the Ray cluster at "
            f"RAY_ADDRESS=127.0.0.1:{port}: nothing accepts connections there"
        ), result.stderr
        assert f"Study {study_id} is queued again" in last
        # said once, by the command: not again by the dispatcher's log above it
        assert result.stderr.count("nothing accepts connections there") == 1, result.stderr
        study = store.get_study(study_id)
        assert (study.status, study.worker_id) == (StudyStatus.QUEUED, None)
        assert study.error is not None
        assert study.error.startswith(
            f"not started: could not connect to the Ray cluster at RAY_ADDRESS=127.0.0.1:{port}"
        )
        assert store.list_trials(study_id).total == 0


@pytest.mark.postgres
@pytest.mark.ray
@pytest.mark.slow
def test_two_worker_commands_run_real_studies_exactly_once(
    pg_url: str, pg_store: StudyStore, ray_session: None, tmp_path: Path
) -> None:
    """`stagetune worker --once` x 2 on one Ray cluster (RAY_ADDRESS): each study trains once."""
    import ray

    address = ray.get_runtime_context().gcs_address
    ids = [submit(pg_store, quick_spec(f"real{i}")) for i in range(3)]
    procs = [
        subprocess.Popen(
            [*STAGETUNE, "worker", "--once", "--worker-id", f"real-w{i}"],
            cwd=REPO,
            env=env(
                STAGETUNE_DATABASE_URL=pg_url,
                STAGETUNE_DATA_DIR=str(tmp_path / f"data{i}"),
                RAY_ADDRESS=address,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=540)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [p.returncode for p in procs] == [0, 0], [o[-3000:] for o in outputs]
    for study_id in ids:
        study = pg_store.get_study(study_id)
        assert study.status is StudyStatus.COMPLETED, (study.error, [o[-3000:] for o in outputs])
        assert study.attempts == 1
        assert study.worker_id in {"real-w0", "real-w1"}
        trials = pg_store.list_trials(study_id)
        assert trials.total == 1
        assert trials.items[0].status is TrialStatus.COMPLETED
        assert trials.items[0].epochs_done == 1


@pytest.mark.ray
@pytest.mark.slow
def test_cancel_stops_a_real_run_and_the_dispatcher_goes_on(
    sqlite_url: str, ray_session: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The production runner on the session's Ray: a cancel stops the study mid-way."""
    import threading

    # What the runner sets in a dispatcher process; here it must not outlive the test.
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")

    from tuner.settings import Settings
    from workers.dispatcher import Dispatcher

    upgrade(sqlite_url)
    with StudyStore(sqlite_url) as store:
        spec = quick_spec("cancelled").model_copy(
            update={
                "schedule": quick_spec("x").schedule.model_copy(update={"total_epochs": 3}),
                "budget": quick_spec("x").budget.model_copy(
                    update={"trials": 8, "max_concurrent": 1}
                ),
            }
        )
        cancelled = submit(store, StudySpec.from_dict(spec.to_dict()))
        after = submit(store, quick_spec("after"))

        def cancel_when_a_trial_runs() -> None:
            deadline = time.monotonic() + 300
            while store.list_trials(cancelled).total == 0 and time.monotonic() < deadline:
                time.sleep(0.2)
            store.request_cancel(cancelled)

        canceller = threading.Thread(target=cancel_when_a_trial_runs, daemon=True)
        canceller.start()
        settings = Settings(
            _env_file=None,  # type: ignore[call-arg]
            data_dir=tmp_path,
            heartbeat_s=1.0,
            poll_s=0.5,
        )
        stats = Dispatcher(store, settings, worker_id="w-cancel", once=True).run()
        canceller.join(timeout=5)
        assert stats.studies == [cancelled, after]
        study = store.get_study(cancelled)
        assert study.status is StudyStatus.CANCELLED, study.error
        assert study.cancel_requested
        assert store.list_trials(cancelled, status=TrialStatus.COMPLETED).total < 8
        assert store.get_study(after).status is StudyStatus.COMPLETED
