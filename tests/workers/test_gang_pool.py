"""The driver's gang pool (``workers.gang_pool``): a CPU gang outlives its Tune experiment and
trains the next experiment's trials with the same results; a trial actor that dies holding a
gang loses it; idle gangs, and then the empty pool, go away; a pool whose driver is killed
ends at once.

Real Ray actors and real gloo training on the session's local Ray instance (2 CPUs).
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest
import ray

from tuner.errors import ValidationError
from tuner.schedule import Schedule
from workers.gang_pool import (
    IDLE_ENV,
    POOL_NAMESPACE,
    SWEEP_S,
    GangPool,
    idle_seconds,
    live_pools,
    pool_name,
)
from workers.trainable import ScheduleTrainable

TIMING = {"epoch_time_s", "eval_time_s", "samples_per_s", "loop_time_s", "worker_compute_s"}


def test_idle_seconds_reads_its_variable_and_names_it_when_wrong(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(IDLE_ENV, raising=False)
    assert idle_seconds() == 60.0
    monkeypatch.setenv(IDLE_ENV, "0")
    assert idle_seconds() == 0.0  # no pool
    monkeypatch.setenv(IDLE_ENV, "2.5")
    assert idle_seconds() == 2.5
    for bad in ("soon", "-1", "nan", "inf"):  # inf: a pool that never ends
        monkeypatch.setenv(IDLE_ENV, bad)
        with pytest.raises(ValidationError, match=f"{IDLE_ENV}='{bad}'"):
            idle_seconds()


def _fit(storage: Path, name: str) -> list[dict[str, Any]]:
    from ray import tune

    grid = tune.Tuner(
        ScheduleTrainable,
        param_space={
            "schedule": Schedule.constant(64, 2, 0.05, base_batch_size=32).to_dict(),
            "task": "digits",
            "task_options": {},
            "seed": 3,
            "workers": 2,
            "cpus_per_worker": 1.0,
            "gpus_per_worker": 0.0,
            "micro_batch": None,
            "performance_aware": False,
        },
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
        run_config=tune.RunConfig(
            storage_path=str(storage),
            name=name,
            verbose=0,
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
        ),
    ).fit()
    assert grid.num_errors == 0
    frame = grid[0].metrics_dataframe
    assert frame is not None
    return [dict(row) for _, row in frame.iterrows()]


@pytest.mark.ray
@pytest.mark.slow
def test_the_next_tune_experiment_trains_on_the_pooled_gang_with_the_same_results(
    ray_session: None, tmp_path: Path
) -> None:
    first = _fit(tmp_path, "first")
    second = _fit(tmp_path, "second")
    # The second experiment's trial actor is a new process; its workers are not.
    assert second[0]["worker_pids"] == first[0]["worker_pids"]
    keys = [k for k in first[0] if k.startswith(("val_", "train_")) and k not in TIMING]
    assert keys
    assert [[r[k] for k in keys] for r in second] == [[r[k] for k in keys] for r in first]
    pool = ray.get_actor(pool_name(), namespace=POOL_NAMESPACE)
    assert pool_name() in live_pools()  # found among the cluster's pools
    # the pool watches this driver's job (a pool of a killed driver ends with it)
    assert _watched_job(pool) == ray.get_runtime_context().get_job_id()
    counts = _counts(pool)
    assert counts["reused"] >= 1
    assert counts["lent"] == 0  # every trial actor gave its gang back


def _counts(pool: Any) -> dict[str, int]:
    return cast(dict[str, int], ray.get(pool.counts.remote()))


def _watched_job(pool: Any) -> str | None:
    return cast("str | None", ray.get(pool.driver_job.remote()))


def _own_pool(idle_s: float, driver_job: str | None = None) -> Any:
    return (
        ray.remote(GangPool)
        .options(name=f"test-pool-{uuid.uuid4().hex[:8]}", num_cpus=0, max_concurrency=8)
        .remote(idle_s, driver_job=driver_job, driver_check_s=CHECK_S)
    )


#: The test pools ask Ray about their driver's job at every sweep (SWEEP_S), not every
#: DRIVER_CHECK_S (the crash tests check a real dispatcher's pool at the default).
CHECK_S = SWEEP_S / 2


def _wait_for(check: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.5)


def _dead(actor: Any) -> bool:
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return True
    return False


@ray.remote(num_cpus=0)
class Borrower:
    def ping(self) -> int:
        return 1


@pytest.mark.ray
@pytest.mark.slow
def test_a_gang_whose_trial_actor_dies_is_killed_and_an_idle_pool_ends(
    ray_session: None,
) -> None:
    node = ray.get_runtime_context().get_node_id()
    pool = _own_pool(idle_s=60.0)
    borrower = Borrower.remote()  # type: ignore[attr-defined]
    lease, members = ray.get(pool.create.remote((node, node), 1.0, borrower))
    assert ray.get([m.ping.remote() for m in members])  # the members started
    ray.kill(borrower)
    # The pool notices the dead borrower and kills the gang it held.
    _wait_for(lambda: _counts(pool)["reclaimed"] == 1)
    assert all(_dead(m) for m in members)
    assert ray.get(pool.give_back.remote(lease, "k", (node, node), ())) is False

    # A gang given back waits at most the idle time; then the empty pool ends itself.
    pool = _own_pool(idle_s=1.0)
    alive = Borrower.remote()  # type: ignore[attr-defined]
    lease, members = ray.get(pool.create.remote((node,), 1.0, alive))
    assert ray.get(pool.give_back.remote(lease, "k", (node,), ())) is True
    assert ray.get(pool.take.remote("other", (node,), alive)) is None  # another key: none
    _wait_for(lambda: _counts(pool)["expired"] == 1)
    assert _dead(members[0])
    _wait_for(lambda: _dead(pool))


@pytest.mark.ray
@pytest.mark.slow
def test_a_pool_whose_driver_is_killed_ends_with_its_gangs_at_once(ray_session: None) -> None:
    """A driver SIGKILLed (no chance to close its pool): the detached pool sees its job end in
    Ray's job table and kills the gangs it keeps and lends, long before the idle time."""
    driver = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time, ray; ray.init(address=sys.argv[1]); "
            "print(ray.get_runtime_context().get_job_id(), flush=True); time.sleep(600)",
            ray.get_runtime_context().gcs_address,
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None
        job = driver.stdout.readline().strip()
        assert job, "the driver did not start"
        node = ray.get_runtime_context().get_node_id()
        pool = _own_pool(idle_s=600.0, driver_job=job)
        borrower = Borrower.remote()  # type: ignore[attr-defined]
        lease, kept = ray.get(pool.create.remote((node,), 1.0, borrower))
        assert ray.get(pool.give_back.remote(lease, "k", (node,), ())) is True
        _, lent = ray.get(pool.create.remote((node,), 1.0, borrower))
        time.sleep(1.5 * SWEEP_S)  # the driver lives: the pool keeps both gangs
        counts = _counts(pool)
        assert (counts["pooled"], counts["lent"], counts["orphaned"]) == (1, 1, 0)
    finally:
        driver.kill()
        driver.communicate()
    started = time.monotonic()
    _wait_for(lambda: _dead(pool))
    assert time.monotonic() - started < 10 * SWEEP_S  # not the idle time (600 s)
    assert _dead(kept[0])
    assert _dead(lent[0])
    assert _dead(borrower) is False  # the test's own actor: not the pool's to end
