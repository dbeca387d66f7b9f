"""``stagetune worker`` stopped by SIGTERM (what ``docker stop`` and Kubernetes send) while a
real study trains on Ray: it gives the study back to the queue and exits 0, keeping every
trial that finished, and ends its gang pool. Ray's ``ray.init`` installs its own SIGTERM
handler in the driver, so this checks that the worker's graceful shutdown survives Ray
starting mid-study; and a second signal while it shuts down (a supervisor repeating SIGTERM,
Ctrl+C on ``serve``, which then stops its dispatcher with SIGTERM too) must not kill it before
its pool is closed."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.cli import STAGETUNE
from tests.workers.test_dispatcher_processes import REPO, env, quick_spec, submit
from tuner.spec import StudySpec
from tuner.store import StudyStatus, StudyStore, TrialStatus
from tuner.store.migrate import upgrade
from workers.gang_pool import live_pools


@pytest.mark.ray
@pytest.mark.slow
def test_sigterm_mid_study_gives_the_study_back(
    sqlite_url: str, ray_session: None, tmp_path: Path
) -> None:
    import ray

    upgrade(sqlite_url)
    spec = quick_spec("sigterm").to_dict()
    spec["schedule"] = {"total_epochs": 4}
    spec["budget"] = {
        "trials": 20,
        "max_concurrent": 1,
        "grace_period_epochs": 4,
        "seed_runs": 0,
    }
    with StudyStore(sqlite_url) as store:
        study_id = submit(store, StudySpec.from_dict(spec))
        pools_before = set(live_pools())
        proc = subprocess.Popen(
            [*STAGETUNE, "worker", "--worker-id", "w-sigterm"],
            cwd=REPO,
            env=env(
                STAGETUNE_DATABASE_URL=sqlite_url,
                STAGETUNE_DATA_DIR=str(tmp_path / "data"),
                RAY_ADDRESS=ray.get_runtime_context().gcs_address,
            ),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            deadline = time.monotonic() + 240
            # Wait until one trial has finished and another is training.
            while not (
                store.list_trials(study_id, status=TrialStatus.COMPLETED).total >= 1
                and store.list_trials(study_id, status=TrialStatus.RUNNING).total >= 1
            ):
                assert proc.poll() is None, proc.communicate()[0][-3000:]
                assert time.monotonic() < deadline, "no trial finished in time"
                time.sleep(0.2)
            finished = {
                t.number: (t.val_accuracy, t.steps, t.epochs_done)
                for t in store.list_trials(study_id, status="completed").items
            }
            pools = set(live_pools()) - pools_before
            assert pools, "the worker's trials pooled no gang"
            proc.terminate()
            # Once the dispatcher has stopped, while the command ends its pool: again.
            assert proc.stdout is not None
            lines = []
            while line := proc.stdout.readline():
                lines.append(line)
                if "stopped after" in line:
                    proc.send_signal(signal.SIGTERM)
                    break
            output = "".join(lines) + proc.communicate(timeout=90)[0]
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        assert proc.returncode == 0, output[-3000:]
        assert "stopped after" in output, output[-3000:]
        assert not pools & set(live_pools()), output[-3000:]
        study = store.get_study(study_id)
        assert study.status is StudyStatus.QUEUED, (study.status, study.error, output[-3000:])
        assert (study.worker_id, study.heartbeat_at) == (None, None)
        after = {t.number: t for t in store.list_trials(study_id, limit=100).items}
        for number, final in finished.items():
            trial = after[number]
            assert trial.status is TrialStatus.COMPLETED
            assert (trial.val_accuracy, trial.steps, trial.epochs_done) == final
        assert not [t for t in after.values() if t.status is TrialStatus.RUNNING]
