"""Gangs kept warm between Ray Tune experiments of one driver.

Ray Tune reuses a trial actor, and with it its gang of worker processes, only inside one
``Tuner.fit()``. A study runs several: the search, then the seed runs of its finalists (and
reserves), and a dispatcher runs study after study. Each new experiment used to start every
gang anew: a Ray worker process per rank, PyTorch and the trial loop imported, the process
group joined, the first optimizer built (several seconds of CPU per rank, before the first
epoch, however short the trial).

The pool keeps a gang whose trial actor has stopped, for the next trial actor of the same
driver that wants the same gang (:func:`pool_key`: world size, CPUs per worker, collective
timeout and worker factory) on the same nodes. It is one Ray actor per driver job (named
after the job), detached so that it outlives the trial actors that borrow from it, and
started on the node of the first of them (a node that runs user code, not a head node);
the gangs' actors are its own (Ray kills them with it). It holds no resources: pooled gang
members ask for no CPU, because while a trial uses one the trial's placement group already
holds the CPUs of its worker bundles, and each member is pinned to the node of its bundle.
So Tune's resource accounting is unchanged, and an idle pooled gang costs memory only.

Bounds: a pooled gang is killed after :data:`IDLE_ENV` seconds unused (default 60; ``0``
turns pooling off), at most :data:`MAX_IDLE` wait at once (the oldest go first); a gang lent
to a trial actor that dies without giving it back is killed within seconds (the pool watches
each borrower); the pool ends itself once it has held nothing for the idle time, and at once,
with every gang it holds, once its driver's job has ended (a driver killed without a chance to
call :func:`close_driver_pool`: SIGKILL, out of memory, its machine lost). GPU gangs
are not pooled (a member with no GPU of its own would see none), nor gangs outside Ray Tune
(which reserve their own placement group). Any pool failure falls back to a gang in the
trial's placement group, as without the pool.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tuner.settings import env_var, read_settings
from workers.gang import GangMember, WorkerInfo, kill_actors

log = logging.getLogger(__name__)

__all__ = [
    "DRIVER_CHECK_S",
    "IDLE_ENV",
    "MAX_IDLE",
    "POOL_NAME",
    "SWEEP_S",
    "GangPool",
    "close_driver_pool",
    "driver_pool",
    "idle_seconds",
    "job_has_ended",
    "live_pools",
    "pool_key",
    "pool_name",
]

#: The pool actor of a driver is ``<POOL_NAME>-<the driver's Ray job id>`` in this namespace.
POOL_NAME = "stagetune-gang-pool"
POOL_NAMESPACE = "stagetune"
#: Environment variable: seconds a pooled gang waits unused before it is killed; 0 = no pool
#: (the setting ``gang_idle_s`` of :class:`tuner.settings.Settings`, default 60).
IDLE_ENV = env_var("gang_idle_s")
#: At most this many gangs wait in the pool at once.
MAX_IDLE = 4
#: How often the pool checks idle gangs and borrowers.
SWEEP_S = 2.0
#: How often the pool asks Ray whether its driver's job is still alive.
DRIVER_CHECK_S = 5.0


def idle_seconds() -> float:
    """:data:`IDLE_ENV` in this process, read now (default 60); a bad value is a
    :class:`tuner.errors.ValidationError` naming the variable. The drivers' commands read the
    same settings at their start, so there a bad value stops them before any study runs."""
    return read_settings().gang_idle_s


def pool_key(
    world_size: int, cpus_per_worker: float, collective_timeout_s: float, worker_factory: Any
) -> str:
    """Which gangs are interchangeable: same shape, same timeout, same worker factory
    (compared pickled: a factory that pickles differently only loses reuse)."""
    from ray import cloudpickle

    pickled: bytes = cloudpickle.dumps(worker_factory)  # type: ignore[no-untyped-call]
    digest = hashlib.sha256(pickled).hexdigest()[:16]
    return f"{world_size}x{cpus_per_worker:g}cpu/{collective_timeout_s:g}s/{digest}"


def pool_name() -> str:
    """The name of this driver's pool actor (in :data:`POOL_NAMESPACE`): one per Ray job."""
    import ray

    return f"{POOL_NAME}-{ray.get_runtime_context().get_job_id()}"


def live_pools() -> list[str]:
    """The names of the gang pools alive in the cluster, every driver's (sorted)."""
    import ray

    return sorted(
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == POOL_NAMESPACE and actor["name"].startswith(f"{POOL_NAME}-")
    )


def close_driver_pool(wait_s: float = 30.0, *, strict: bool = True) -> bool:
    """Kill this driver's pool, and with it the gangs it keeps (its own actors), if it has
    one; ``True`` if a pool was killed. A driver that is done with Ray calls it (the
    ``worker`` and ``tune`` commands, as they end): the pool is detached and would otherwise
    keep its warm gangs on the nodes for the idle time, and a node stopped meanwhile (SIGTERM)
    waits out Ray's drain time (30 s) for them. A later trial of the same driver starts a new,
    empty pool. Raises ``TimeoutError`` if the pool is still there after ``wait_s``; with
    ``strict=False`` (a command ending) any failure is logged and ``False`` returned."""
    if not strict:
        try:
            return close_driver_pool(wait_s)
        except Exception as exc:
            log.warning("could not end the gang pool: %s", exc)
            return False
    import sys

    if "ray" not in sys.modules:
        return False  # this process never used Ray
    import ray

    if not ray.is_initialized():
        return False
    name = pool_name()
    try:
        ray.kill(ray.get_actor(name, namespace=POOL_NAMESPACE), no_restart=True)
    except ValueError:
        return False  # no pool
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            ray.get_actor(name, namespace=POOL_NAMESPACE)
        except ValueError:
            return True
        time.sleep(0.1)
    raise TimeoutError(f"the gang pool {name} was still there {wait_s:g} s after it was killed")


def driver_pool() -> Any | None:
    """This driver's pool actor (started on first use), or None when pooling is off or the
    pool cannot be reached (the caller then starts its gang as without one)."""
    idle = idle_seconds()
    if idle <= 0:
        return None
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    try:
        context = ray.get_runtime_context()
        return (
            ray.remote(GangPool)
            .options(
                name=pool_name(),
                namespace=POOL_NAMESPACE,
                get_if_exists=True,
                lifetime="detached",
                num_cpus=0,
                max_concurrency=8,
                max_restarts=0,
                # Beside the trial actor that starts it (a node that runs user code, not
                # the head), and not in that actor's placement group: Tune's trial actors
                # capture their children into it, and it goes when the trial does.
                scheduling_strategy=NodeAffinitySchedulingStrategy(
                    context.get_node_id(), soft=False
                ),
            )
            .remote(idle, driver_job=context.get_job_id())
        )
    except Exception as exc:
        log.warning("no gang pool (gangs start afresh): %s", exc)
        return None


@dataclass
class _Pooled:
    key: str
    nodes: tuple[str, ...]
    actors: list[Any]
    infos: tuple[WorkerInfo, ...]
    since: float = field(default_factory=time.monotonic)


@dataclass
class _Lent:
    actors: list[Any]
    borrower: Any
    probe: Any = None


class GangPool:
    """The body of the pool actor (see the module docstring). Threaded: the sweeper runs
    beside the borrowers' calls; every method holds the lock."""

    def __init__(
        self,
        idle_s: float,
        max_idle: int = MAX_IDLE,
        driver_job: str | None = None,
        driver_check_s: float = DRIVER_CHECK_S,
    ) -> None:
        self._idle_s = idle_s
        self._max_idle = max_idle
        self._driver_job = driver_job  # hex job id of the driver served (None: not watched)
        self._driver_check_s = driver_check_s
        self._driver_checked = time.monotonic()
        self._lock = threading.Lock()
        self._pooled: list[_Pooled] = []
        self._lent: dict[int, _Lent] = {}
        self._leases = itertools.count(1)
        self._empty_since = time.monotonic()
        self._closing = False
        #: Counters for logs and tests.
        self.stats = {"created": 0, "reused": 0, "expired": 0, "reclaimed": 0, "orphaned": 0}
        threading.Thread(target=self._sweep_forever, name="gang-pool-sweep", daemon=True).start()

    # ------------------------------------------------------------------ borrowers' calls

    def take(
        self, key: str, nodes: tuple[str, ...], borrower: Any
    ) -> tuple[int, list[Any], tuple[WorkerInfo, ...]] | None:
        """A pooled gang of ``key`` whose ranks sit on ``nodes``, lent to ``borrower``."""
        with self._lock:
            if self._closing:
                return None
            for i, pooled in enumerate(self._pooled):
                if pooled.key == key and pooled.nodes == tuple(nodes):
                    del self._pooled[i]
                    lease = next(self._leases)
                    self._lent[lease] = _Lent(pooled.actors, borrower)
                    self.stats["reused"] += 1
                    return lease, pooled.actors, pooled.infos
            return None

    def create(
        self, nodes: tuple[str, ...], cpus_per_worker: float, borrower: Any
    ) -> tuple[int, list[Any]] | None:
        """New gang members, one per node in ``nodes`` (rank order), owned by the pool and
        lent to ``borrower``; the borrower joins them into a process group."""
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        with self._lock:
            if self._closing:
                return None
            member = ray.remote(GangMember)
            world_size = len(nodes)
            actors = [
                member.options(
                    num_cpus=0,
                    num_gpus=0,
                    max_restarts=0,
                    max_concurrency=1,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
                ).remote(rank, world_size, cpus_per_worker, 0.0)
                for rank, node in enumerate(nodes)
            ]
            lease = next(self._leases)
            self._lent[lease] = _Lent(actors, borrower)
            self.stats["created"] += 1
            return lease, actors

    def give_back(
        self, lease: int, key: str, nodes: tuple[str, ...], infos: tuple[WorkerInfo, ...]
    ) -> bool:
        """The borrower is done with a healthy gang: keep it for the next (False: the pool
        is closing or full, and killed it instead)."""
        with self._lock:
            lent = self._lent.pop(lease, None)
            if lent is None:
                return False  # reclaimed meanwhile
            if self._closing or self._idle_s <= 0:
                kill_actors(lent.actors)
                return False
            self._pooled.append(_Pooled(key, tuple(nodes), lent.actors, tuple(infos)))
            while len(self._pooled) > self._max_idle:
                kill_actors(self._pooled.pop(0).actors)
                self.stats["expired"] += 1
            return True

    def drop(self, lease: int) -> None:
        """The borrower's gang broke (or failed to start): kill what is left of it."""
        with self._lock:
            lent = self._lent.pop(lease, None)
            if lent is not None:
                kill_actors(lent.actors)

    def driver_job(self) -> str | None:
        """The hex id of the job whose end ends the pool (None: not watched)."""
        return self._driver_job

    def counts(self) -> dict[str, int]:
        with self._lock:
            return {**self.stats, "pooled": len(self._pooled), "lent": len(self._lent)}

    # ------------------------------------------------------------------ the sweeper

    def _sweep_forever(self) -> None:
        while True:
            time.sleep(SWEEP_S)
            try:
                if self._sweep():
                    return
            except Exception:  # never let the sweeper die silently
                log.exception("the gang pool's sweep failed")

    def _sweep(self) -> bool:
        """Kill expired gangs and those of dead borrowers; True once the pool has ended."""
        import ray
        from ray.exceptions import RayActorError

        now = time.monotonic()
        if self._driver_job is not None and now - self._driver_checked >= self._driver_check_s:
            self._driver_checked = now
            if job_has_ended(self._driver_job):
                self._end_orphaned()
                return True
        with self._lock:
            if self._pooled or self._lent:
                self._empty_since = now  # the pool ends only once it has held nothing a while
            keep = []
            for pooled in self._pooled:
                if now - pooled.since >= self._idle_s:
                    kill_actors(pooled.actors)
                    self.stats["expired"] += 1
                else:
                    keep.append(pooled)
            self._pooled = keep
            # A borrower answers ``__ray_ready__`` after its running call; a dead one fails it.
            for lease, lent in list(self._lent.items()):
                if lent.probe is None:
                    lent.probe = lent.borrower.__ray_ready__.remote()
                    continue
                ready, _ = ray.wait([lent.probe], timeout=0)
                if not ready:
                    continue
                try:
                    ray.get(lent.probe)
                    lent.probe = None
                except RayActorError:
                    kill_actors(lent.actors)
                    del self._lent[lease]
                    self.stats["reclaimed"] += 1
                    log.warning(
                        "a trial actor died holding gang lease %d; its gang is killed", lease
                    )
            if self._pooled or self._lent or now - self._empty_since < self._idle_s:
                return False
            self._closing = True
        _end_this_actor()
        return True

    def _end_orphaned(self) -> None:
        """The driver's job has ended: no trial of it will borrow a gang again."""
        with self._lock:
            self._closing = True
            gangs = [p.actors for p in self._pooled] + [lent.actors for lent in self._lent.values()]
            self._pooled, self._lent = [], {}
            for actors in gangs:
                kill_actors(actors)
            self.stats["orphaned"] += len(gangs)
        log.warning(
            "the driver job %s has ended; its gang pool ends with the %d gang(s) it held",
            self._driver_job,
            len(gangs),
        )
        _end_this_actor()


def _end_this_actor() -> None:
    import ray

    with contextlib.suppress(Exception):
        ray.kill(ray.get_runtime_context().current_actor, no_restart=True)


def job_has_ended(job_id: str) -> bool:
    """Whether Ray's job table marks the job ``job_id`` (hex) as ended: its driver exited or
    was killed. Any failure to ask answers False (the pool then ends on its idle time)."""
    import ray

    try:
        gcs: Any = getattr(ray._private.worker.global_worker, "gcs_client")  # noqa: B009
        jobs = gcs.get_all_job_info(
            job_or_submission_id=job_id,
            skip_submission_job_info_field=True,
            skip_is_running_tasks_field=True,
        )
    except Exception as exc:
        log.debug("cannot read the job table: %s", exc)
        return False
    return any(info.job_id.hex() == job_id and info.is_dead for info in jobs.values())
