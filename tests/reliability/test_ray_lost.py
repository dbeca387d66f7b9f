"""The Ray cluster lost in the middle of a study: ``stagetune worker`` runs a small digits study
on a Ray cluster of its own (``ray start --head``, as on a cluster's head node), whose GCS is
then SIGKILLed, as a lost head machine leaves it.

Ray cannot connect a driver to a cluster again once it has gone, and ends the driver itself
about 60 s later, with the study still claimed until its heartbeat goes stale (another 60 s).
Instead, once the cluster has not answered for ``STAGETUNE_RAY_LOST_S`` (here 3 s), the worker
gives the study back to the queue, saying why, and exits with status 1 for its supervisor to
start it again. A second worker, on a cluster that answers (the session's), then finishes the
study, and every trial finished before the loss is still there, unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli import STAGETUNE
from tests.reliability.helpers import clean_env
from tests.reliability.test_crash_dispatcher import finished_rows
from tuner.spec import StudySpec
from tuner.store import StudyStatus, StudyStore, TrialStatus
from tuner.store.migrate import upgrade

pytestmark = [pytest.mark.ray, pytest.mark.slow]

MARKER_VAR = "LOST_CLUSTER_TEST_MARKER"
LOST_AFTER_S = 3
SPEC = {
    "task": "digits",
    "name": "lose-the-cluster",
    "baselines": False,
    "schedule": {"total_epochs": 8},
    "budget": {"trials": 4, "early_stopping": False, "max_concurrent": 1, "seed_runs": 0},
    "resources": {"workers": 1, "cpus_per_worker": 1},
}


def marked(marker: str) -> dict[int, str]:
    """The processes started with ``MARKER_VAR=marker`` in their environment (the head's
    daemons, the workers Ray starts under them): pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
        except OSError:
            continue
        if f"{MARKER_VAR}={marker}".encode() in environ:
            found[int(entry.name)] = cmdline
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def head() -> Iterator[tuple[str, str]]:
    """A Ray head node with 2 CPUs, its processes marked; ``(address, marker)``. Every
    process of it is killed afterwards."""
    marker = uuid.uuid4().hex
    port = free_port()
    temp_dir = tempfile.mkdtemp(prefix="st-lost-", dir="/tmp")  # Ray's socket paths are short
    env = clean_env({MARKER_VAR: marker})
    for name in [n for n in env if n.startswith("RAY_")]:
        del env[name]
    started = subprocess.run(
        [
            str(Path(STAGETUNE[0]).parent / "ray"),
            "start",
            "--head",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=2",
            "--num-gpus=0",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={temp_dir}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    try:
        assert started.returncode == 0, started.stdout[-2000:] + started.stderr[-2000:]
        yield f"127.0.0.1:{port}", marker
    finally:
        deadline = time.monotonic() + 30
        while (left := marked(marker)) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        assert not marked(marker), "the test's Ray head left processes behind"
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_worker_whose_ray_cluster_is_lost_gives_its_study_back_and_exits(
    head: tuple[str, str], ray_session: None, tmp_path: Path
) -> None:
    import ray

    address, marker = head
    url = f"sqlite:///{tmp_path / 'stagetune.db'}"
    upgrade(url)
    data_dir = tmp_path / "data"
    env = {
        "STAGETUNE_DATABASE_URL": url,
        "STAGETUNE_DATA_DIR": str(data_dir),
        "STAGETUNE_HEARTBEAT_S": "0.5",
        "STAGETUNE_POLL_S": "0.5",
        "STAGETUNE_RAY_LOST_S": str(LOST_AFTER_S),
    }
    with StudyStore(url) as store:
        spec = StudySpec.from_dict(SPEC)
        study_id = store.create_study(spec.task, spec.to_dict(), spec.budget.trials).id
        log = tmp_path / "worker.log"
        with log.open("wb") as out:
            worker = subprocess.Popen(
                [*STAGETUNE, "worker", "--once", "--worker-id", "w-lost", "--log-level", "info"],
                cwd=tmp_path,
                env=clean_env({**env, "RAY_ADDRESS": address, MARKER_VAR: marker}),
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        try:
            # one trial finished, the next one training
            deadline = time.monotonic() + 300
            while not (
                store.list_trials(study_id, status=TrialStatus.COMPLETED).total >= 1
                and store.list_trials(study_id, status=TrialStatus.RUNNING).total >= 1
            ):
                assert worker.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, "no trial finished in time"
                time.sleep(0.2)
            finished = finished_rows(store, study_id)
            (gcs,) = [pid for pid, cmd in marked(marker).items() if "gcs_server" in cmd]
            os.kill(gcs, signal.SIGKILL)
            lost_at = time.monotonic()
            worker.wait(timeout=60)
            exited_s = time.monotonic() - lost_at
        finally:
            if worker.poll() is None:
                worker.kill()
                worker.wait()
        output = log.read_text()
        assert worker.returncode == 1, output[-3000:]
        # Given back within the watch's time and a few probes, not Ray's 60 s and a stale
        # heartbeat's 60 s more.
        assert exited_s < LOST_AFTER_S + 20, (exited_s, output[-3000:])
        assert f"stagetune: error: the Ray cluster at {address} has not answered for" in output
        assert "its study went back to the queue" in output
        study = store.get_study(study_id)
        assert (study.status, study.worker_id, study.heartbeat_at) == (
            StudyStatus.QUEUED,
            None,
            None,
        ), output[-3000:]
        assert study.error is not None
        assert study.error.startswith(f"given back: the Ray cluster at {address} has not")

        # A dispatcher on a cluster that answers finishes the study; nothing finished is lost.
        resumed = subprocess.run(
            [*STAGETUNE, "worker", "--once", "--worker-id", "w-after"],
            cwd=tmp_path,
            env=clean_env({**env, "RAY_ADDRESS": ray.get_runtime_context().gcs_address}),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        study = store.get_study(study_id)
        assert (study.status, study.worker_id, study.attempts) == (
            StudyStatus.COMPLETED,
            "w-after",
            2,
        )
        trials = {t.number: t for t in store.list_trials(study_id, limit=100).items}
        assert sorted(trials) == list(range(SPEC["budget"]["trials"]))  # type: ignore[index]
        after = finished_rows(store, study_id)
        for number, row in finished.items():
            assert after[number] == row
