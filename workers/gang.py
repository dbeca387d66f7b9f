"""A reusable gang of Ray worker actors joined in one ``torch.distributed`` process group.

One actor per data-parallel worker. Ray places the processes (inside a placement group: the
trial's own when running under Ray Tune, or one the gang creates for itself otherwise); the
gang only wires them into a process group (gloo on CPU, NCCL when every worker has its own GPU)
and calls methods on a *worker object* that lives in each actor. The processes, the loaded
task data and the process group survive across trials: a trial re-initialises the worker
object's state, not the processes (see :mod:`workers.trainable`).

Failure handling: a call that finds a dead actor kills the whole gang (the surviving ranks may
be blocked inside a collective) and raises :class:`WorkerDiedError`; a call in which some ranks
raise and others do not finish within a grace period does the same with
:class:`WorkerFailedError`. When every rank raises the same domain error (a coordinated
failure, e.g. out of memory on every rank) the gang stays healthy and the error is re-raised.
A broken gang refuses further calls; callers create a fresh one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import socket
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from tuner.errors import StagetuneError

log = logging.getLogger(__name__)

__all__ = [
    "Gang",
    "GangError",
    "WorkerContext",
    "WorkerDiedError",
    "WorkerFailedError",
    "WorkerInfo",
    "kill_actors",
]


class GangError(StagetuneError):
    """The gang of data-parallel workers cannot carry on (a worker died or failed)."""


class WorkerDiedError(GangError):
    """A worker process (Ray actor) died; the gang has been torn down."""


class WorkerFailedError(GangError):
    """A worker raised an error the other ranks did not share; the gang has been torn down."""


@dataclass(frozen=True)
class WorkerContext:
    """What a worker object knows about its place in the gang."""

    rank: int
    world_size: int
    device: str
    backend: str
    cpus: float


@dataclass(frozen=True)
class WorkerInfo:
    """Identity of one gang member (for logs, tests and reuse checks)."""

    rank: int
    pid: int
    hostname: str
    node_ip: str
    device: str
    backend: str
    gpu_ids: tuple[str, ...]


class WorkerFactory(Protocol):
    def __call__(self, context: WorkerContext) -> Any: ...


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        port: int = sock.getsockname()[1]
        return port


class GangMember:
    """The body of one gang actor (a Ray actor class is made of it in :class:`Gang`)."""

    def __init__(self, rank: int, world_size: int, cpus: float, gpus: float) -> None:
        import torch

        self.rank = rank
        self.world_size = world_size
        self.cpus = cpus
        self.gpus = gpus
        torch.set_num_threads(max(1, int(cpus)))
        self._worker: Any = None
        self._device = "cpu"
        self._backend = "gloo"

    def gpu_ids(self) -> tuple[str, ...]:
        import ray

        return tuple(str(g) for g in ray.get_gpu_ids())

    def address(self) -> tuple[str, int]:
        import ray

        ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return str(ip), _free_port()

    def init_process_group(
        self,
        master_addr: str,
        master_port: int,
        backend: str,
        timeout_s: float,
        worker_factory: WorkerFactory,
    ) -> WorkerInfo:
        import ray
        import torch
        import torch.distributed as dist

        if backend == "nccl" or (self.gpus > 0 and torch.cuda.is_available()):
            # Ray sets CUDA_VISIBLE_DEVICES per actor: the first visible device is ours.
            torch.cuda.set_device(0)
            self._device = "cuda:0"
        self._backend = backend
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=self.rank,
            world_size=self.world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        context = WorkerContext(
            rank=self.rank,
            world_size=self.world_size,
            device=self._device,
            backend=backend,
            cpus=self.cpus,
        )
        self._worker = worker_factory(context)
        node_ip = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        return WorkerInfo(
            rank=self.rank,
            pid=os.getpid(),
            hostname=socket.gethostname(),
            node_ip=str(node_ip),
            device=self._device,
            backend=backend,
            gpu_ids=self.gpu_ids(),
        )

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self._worker, method)(*args, **kwargs)

    def call_pickled(self, method: str, *args: Any, **kwargs: Any) -> bytes:
        """``call``, its result pickled in this process."""
        return pickle.dumps(self.call(method, *args, **kwargs), protocol=pickle.HIGHEST_PROTOCOL)

    def call_unpickled(self, method: str, *args: Any) -> Any:
        """``call`` with arguments that arrive pickled (``bytes``; others as they are)."""
        return self.call(method, *(pickle.loads(a) if isinstance(a, bytes) else a for a in args))

    def ping(self) -> int:
        return os.getpid()

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


class Gang:
    """N Ray actors, one per data-parallel rank, joined in one process group.

    ``placement_group`` with ``bundle_offset``: rank ``r`` goes into bundle
    ``bundle_offset + r`` of that group (the trial's group under Ray Tune). Without one the
    gang reserves its own group of ``world_size`` bundles and releases it on shutdown.
    ``worker_factory(context)`` builds the worker object in each actor, after the process
    group is up; :meth:`call` invokes one of its methods on every rank.

    ``pool`` (a :class:`workers.gang_pool.GangPool` actor; CPU gangs in a given placement
    group only): the gang is taken from the pool when one of ``pool_key`` waits there on the
    bundles' nodes, else the pool starts its members; :meth:`shutdown` gives a healthy gang
    back instead of killing it.
    """

    def __init__(
        self,
        world_size: int,
        worker_factory: WorkerFactory,
        *,
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        placement_group: Any = None,
        bundle_offset: int = 0,
        collective_timeout_s: float = 1800.0,
        start_timeout_s: float = 300.0,
        failure_grace_s: float = 10.0,
        pool: Any = None,
        pool_key: str = "",
    ) -> None:
        import ray
        from ray.util.placement_group import placement_group as make_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.world_size = world_size
        self.cpus_per_worker = cpus_per_worker
        self.gpus_per_worker = gpus_per_worker
        self.failure_grace_s = failure_grace_s
        self._broken: str | None = None
        self._own_pg = placement_group is None
        # A gang borrowed from the driver's pool (workers.gang_pool): its lease, key and nodes.
        self._pool: Any = None
        self._lease: int | None = None
        self._pool_key = pool_key
        self._nodes: tuple[str, ...] = ()
        if placement_group is None:
            bundle: dict[str, float] = {"CPU": cpus_per_worker}
            if gpus_per_worker > 0:
                bundle["GPU"] = gpus_per_worker
            placement_group = make_placement_group([dict(bundle)] * world_size, strategy="PACK")
            ready, _ = ray.wait([placement_group.ready()], timeout=start_timeout_s)
            if not ready:
                ray.util.remove_placement_group(placement_group)
                available = ray.available_resources()  # type: ignore[no-untyped-call]
                raise GangError(
                    f"cannot place {world_size} workers with {bundle} each within "
                    f"{start_timeout_s:.0f} s; cluster resources: {available}"
                )
            bundle_offset = 0
        self._pg = placement_group
        self.actors: list[Any] = []
        self.infos: tuple[WorkerInfo, ...] = ()
        pooled = pool is not None and not self._own_pg and gpus_per_worker <= 0
        if pooled and self._borrow(pool, placement_group, bundle_offset):
            return  # a pooled gang, its process group already up
        actor_cls = ray.remote(GangMember)
        self.actors = self.actors or [
            actor_cls.options(
                num_cpus=cpus_per_worker,
                num_gpus=gpus_per_worker,
                max_restarts=0,
                max_concurrency=1,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=placement_group,
                    placement_group_bundle_index=bundle_offset + rank,
                    placement_group_capture_child_tasks=False,
                ),
            ).remote(rank, world_size, cpus_per_worker, gpus_per_worker)
            for rank in range(world_size)
        ]
        try:
            gpu_ids = self._gather([a.gpu_ids.remote() for a in self.actors], "start")
            backend = "gloo"
            if gpus_per_worker > 0:
                distinct = {g for ids in gpu_ids for g in ids}
                one_each = all(len(ids) >= 1 for ids in gpu_ids)
                # NCCL needs one GPU per rank; shared (fractional) GPUs fall back to gloo.
                if one_each and len(distinct) >= world_size:
                    backend = "nccl"
            master_addr, master_port = self._gather(
                [self.actors[0].address.remote()], "rendezvous"
            )[0]
            infos = self._gather(
                [
                    a.init_process_group.remote(
                        master_addr, master_port, backend, collective_timeout_s, worker_factory
                    )
                    for a in self.actors
                ],
                "process group start",
            )
        except BaseException:
            self._broken = self._broken or "the gang failed to start"  # never pooled
            self.shutdown()
            raise
        self.infos = tuple(infos)

    def _borrow(self, pool: Any, placement_group: Any, bundle_offset: int) -> bool:
        """Take a pooled gang for the bundles' nodes (True: ready to use), or have the pool
        start new members there (False, ``actors`` set: join them as usual). Any failure
        leaves ``actors`` empty: the caller then starts members in the placement group."""
        import ray

        try:
            table = ray.util.placement_group_table(placement_group)["bundles_to_node_id"]
            nodes = tuple(table[bundle_offset + r] for r in range(self.world_size))
            borrower = ray.get_runtime_context().current_actor
            got = ray.get(pool.take.remote(self._pool_key, nodes, borrower), timeout=60)
            if got is not None:
                lease, actors, infos = got
                if _answer(actors):
                    self._pool, self._lease, self._nodes = pool, lease, nodes
                    self.actors, self.infos = list(actors), tuple(infos)
                    return True
                pool.drop.remote(lease)  # a pooled member died: start afresh
            created = ray.get(pool.create.remote(nodes, self.cpus_per_worker, borrower), timeout=60)
            if created is not None:
                self._lease, actors = created
                self._pool, self._nodes = pool, nodes
                self.actors = list(actors)
        except Exception as exc:  # the pool is gone or unreachable: no pool for this gang
            log.warning("the gang pool failed (%s); starting the gang without it", _short(exc))
            if self._lease is not None:
                with contextlib.suppress(Exception):
                    pool.drop.remote(self._lease)
            self._pool, self._lease, self.actors = None, None, []
        return False

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(info.pid for info in self.infos)

    @property
    def backend(self) -> str:
        return self.infos[0].backend if self.infos else "gloo"

    @property
    def broken(self) -> str | None:
        """Why the gang is unusable, or None while it is healthy."""
        return self._broken

    def alive(self, timeout_s: float = 30.0) -> bool:
        """True when the gang is healthy and every actor answers a ping."""
        if self._broken is not None:
            return False
        try:
            self._gather([a.ping.remote() for a in self.actors], "ping", timeout_s=timeout_s)
        except GangError:
            return False
        return True

    def call(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Call ``method`` of the worker object on every rank; results in rank order."""
        return self.call_each(method, [(args, kwargs)] * self.world_size)

    def call_each(
        self, method: str, arguments: Sequence[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[Any]:
        """Call ``method`` on every rank with that rank's ``(args, kwargs)``."""
        return self._invoke("call", method, arguments)

    def states(self) -> list[bytes]:
        """Every rank's trial state (the worker's ``state()``, rank order), each pickled in its
        own process: the caller stores them and hands them to :meth:`load_states` without
        unpickling (or importing) what they hold."""
        return self._invoke("call_pickled", "state", [((), {})] * self.world_size)

    def load_states(self, states: Sequence[Any]) -> None:
        """Load every rank's trial state (:meth:`states`, or the worker's ``state()`` objects,
        rank order) with its ``load_state``. Rank 0's state carries the model and optimizer
        that every rank loads: it goes into Ray's object store once, and each rank reads it
        from there instead of the driver serialising it once per rank (and twice for rank 0).
        """
        import ray

        if len(states) != self.world_size:
            raise ValueError(f"need {self.world_size} states, got {len(states)}")
        shared = ray.put(states[0])
        self._invoke(
            "call_unpickled",
            "load_state",
            [((None if rank == 0 else state, shared), {}) for rank, state in enumerate(states)],
        )

    def _invoke(
        self,
        entry: str,
        method: str,
        arguments: Sequence[tuple[tuple[Any, ...], dict[str, Any]]],
    ) -> list[Any]:
        """``GangMember.<entry>(method, *args, **kwargs)`` on every rank; results in rank
        order."""
        if self._broken is not None:
            raise GangError(f"the worker gang is unusable: {self._broken}")
        if len(arguments) != self.world_size:
            raise ValueError(f"need {self.world_size} argument sets, got {len(arguments)}")
        refs = [
            getattr(actor, entry).remote(method, *args, **kwargs)
            for actor, (args, kwargs) in zip(self.actors, arguments, strict=True)
        ]
        return self._gather(refs, method)

    def _pid(self, rank: int) -> str:
        return str(self.infos[rank].pid) if rank < len(self.infos) else "?"

    def _gather(self, refs: list[Any], what: str, timeout_s: float | None = None) -> list[Any]:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        pending: dict[Any, int] = {ref: rank for rank, ref in enumerate(refs)}
        results: list[Any] = [None] * len(refs)
        errors: dict[int, BaseException] = {}
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            wait_s: float | None = None
            if errors:
                # Some rank failed: the others get a grace period to fail the same way.
                wait_s = self.failure_grace_s
            if deadline is not None:
                left = max(0.0, deadline - time.monotonic())
                wait_s = left if wait_s is None else min(wait_s, left)
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=wait_s)
            if not ready:
                if errors:
                    rank, error = min(errors.items())
                    reason = (
                        f"rank {rank} (pid {self._pid(rank)}) failed during {what} while the "
                        f"other ranks did not: {_short(error)}"
                    )
                    self._break(reason)
                    raise WorkerFailedError(reason) from error
                self._break(f"no answer from the workers within {timeout_s} s during {what}")
                raise WorkerDiedError(self._broken or what) from GetTimeoutError(what)
            for ref in ready:
                rank = pending.pop(ref)
                try:
                    results[rank] = ray.get(ref)
                except RayActorError as exc:
                    reason = (
                        f"data-parallel worker rank {rank} (pid {self._pid(rank)}) died during "
                        f"{what}: {_short(exc)}"
                    )
                    self._break(reason)
                    raise WorkerDiedError(reason) from exc
                except RayTaskError as exc:
                    errors[rank] = exc.cause if exc.cause is not None else exc
        if errors:
            rank, error = min(errors.items())
            if len(errors) == len(refs) and isinstance(error, StagetuneError):
                # A coordinated failure: every rank raised; the gang itself is fine.
                raise error
            if len(errors) == len(refs):
                raise WorkerFailedError(
                    f"every rank failed during {what}; rank {rank}: {_short(error)}"
                ) from error
            reason = f"rank {rank} (pid {self._pid(rank)}) failed during {what}: {_short(error)}"
            self._break(reason)
            raise WorkerFailedError(reason) from error
        return results

    def _break(self, reason: str) -> None:
        self._broken = reason
        self._kill()

    def _kill(self) -> None:
        if self._pool is not None and self._lease is not None:
            with contextlib.suppress(Exception):  # the pool is gone: its actors went with it
                self._pool.drop.remote(self._lease)
            self._lease = None
        kill_actors(self.actors)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Tear down the process group, kill the actors and release an own placement group;
        a healthy gang borrowed from the pool goes back to it instead, process group and
        all."""
        import ray

        if self._broken is None and self._pool is not None and self._lease is not None:
            lease, self._lease = self._lease, None
            with contextlib.suppress(Exception):  # the pool is gone: its actors went with it
                ray.get(
                    self._pool.give_back.remote(lease, self._pool_key, self._nodes, self.infos),
                    timeout=timeout_s,
                )
            self.actors = []
            self._broken = "the gang went back to the pool"
            return
        if self._broken is None and self.actors:
            refs = [a.shutdown.remote() for a in self.actors]
            ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        self._kill()
        self.actors = []
        if self._broken is None:
            self._broken = "the gang was shut down"
        if self._own_pg and self._pg is not None:
            with contextlib.suppress(Exception):  # already removed (e.g. Ray shut down)
                ray.util.remove_placement_group(self._pg)
            self._pg = None


def kill_actors(actors: Sequence[Any]) -> None:
    """Kill each actor (no restart); one already gone is skipped."""
    import ray

    for actor in actors:
        with contextlib.suppress(Exception):  # already gone
            ray.kill(actor, no_restart=True)


def _answer(actors: Sequence[Any], timeout_s: float = 30.0) -> bool:
    """Whether every actor answers a ping within the timeout."""
    import ray

    pings = [a.ping.remote() for a in actors]
    try:
        done, _ = ray.wait(pings, num_returns=len(pings), timeout=timeout_s)
        return len(done) == len(pings) and all(ray.get(done))
    except Exception:  # a dead actor
        return False


def _short(error: BaseException, limit: int = 400) -> str:
    text = f"{type(error).__name__}: {error}".strip().replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."
