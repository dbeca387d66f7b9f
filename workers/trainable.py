"""The Ray Tune class trainable of stagetune: one ``step()`` trains one epoch of a schedule.

Process layout of one trial (``workers = N``)::

    Tune trial placement group (PACK):  [{"CPU": 0} head] + N x {"CPU": c, "GPU": g}
      ScheduleTrainable actor           head: no resources (it only coordinates)
      gang rank r (Ray actor, r < N)    worker bundle r: trains, gloo/NCCL process group

``default_resource_request(config)`` returns that :class:`PlacementGroupFactory`, so a
2-worker CPU trial needs exactly 2 CPUs. The gang (:class:`workers.gang.Gang`) is created in
the trial's placement group and survives ``reset_config()``: with
``TuneConfig(reuse_actors=True)`` the next trial with the same resources reuses the actor, its
worker processes, their process group and their cached task data, and only re-initialises
model, optimizer and RNGs from the new trial's seed. Results do not depend on what ran before.
When the actor stops, a CPU gang goes back to the driver's pool (:mod:`workers.gang_pool`),
and the trials of the driver's next Tune experiment start on it instead of new processes.

Failure behaviour: a diverged trial reports ``diverged: True`` and ``done: True`` with its
metrics so far; a stage that does not fit in memory is retried with more accumulation and
fails only at micro-batch 1, where every rank raises :class:`workers.loop.TrialOOMError`
together: the trial then ends with a last report whose ``failure`` says why
(:data:`tuner.objectives.FAILURE_KEY`; no metric, ``done: True``), not with an error, so Tune
keeps the actor and its workers for the next trial; a worker that dies makes
``step()`` raise :class:`workers.gang.WorkerDiedError` (the trial fails with that reason, and
the next trial, or ``reset_config()``, gets fresh workers).

Cooldown probes (config ``probe_at``): after those epochs the workers also train and
evaluate a short branch with the LR annealed to zero and put the trial back exactly
(:meth:`workers.loop.TrialWorker.probe`); the result then carries ``score`` (the probe's
accuracy) for schedulers to compare. Shared prefixes (config ``prefix_store``): at every stage
boundary but the last the trial saves its whole state, and a trial whose schedule starts with
the same stages forks from it, re-reporting the prefix's results as recorded
(:mod:`tuner.prefixes`). ``compute_epochs`` counts what the trial itself trained, probes
included.

Outside Tune the class works as a plain object (``ScheduleTrainable(config)``; ``train()``;
``stop()``): the gang then reserves its own placement group.
"""

from __future__ import annotations

import functools
import logging
import math
import pickle
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ray import tune
from ray.tune.execution.placement_groups import PlacementGroupFactory

from tuner.errors import StagetuneError, ValidationError
from tuner.objectives import FAILURE_KEY, JUMP_KEY, loss_jump
from tuner.prefixes import PrefixStore, boundaries, prefix_key
from tuner.trial_config import TrialConfig, TrialResources
from workers.gang import Gang, GangError
from workers.gang_pool import driver_pool, pool_key
from workers.trial_worker import TrialOOMError, trial_worker

if TYPE_CHECKING:
    from workers.tasks import Task

__all__ = ["EXTRA_KEYS", "METRIC_KEYS", "PROBE_KEYS", "ScheduleTrainable", "resource_request"]

#: Keys of every per-epoch result (besides Tune's own auto-filled keys).
METRIC_KEYS: tuple[str, ...] = (
    "epoch",
    "stage",
    "val_loss",
    "train_loss",
    "epoch_time_s",
    "samples_per_s",
    "steps",
    "samples",
    "batch_size",
    "lr",
    "noise_scale",
    "diverged",
    "wall_time_s",
)

#: Further per-epoch keys (diagnostics).
EXTRA_KEYS: tuple[str, ...] = (
    "steps_in_epoch",
    "eval_time_s",
    "accumulation_steps",
    "micro_batch",
    "oom_retries",
    "local_batches",
    "speed_weights",
)


log = logging.getLogger(__name__)

#: Keys a trial adds to each result about itself, not the schedule (left out of what a
#: boundary state records for forks to re-report).
_OWN_KEYS: frozenset[str] = frozenset({"done", "compute_epochs", "forked_epochs", "replayed"})

#: Keys of a cooldown probe's result (only in the results of the epochs it ran after), besides
#: ``probe_`` + each of the task's metrics (``probe_val_loss``, ``probe_val_accuracy``, ...).
PROBE_KEYS: tuple[str, ...] = (
    "probe_steps",
    "probe_epochs",
    "probe_time_s",
)


def _resources(config: Mapping[str, Any]) -> tuple[int, float, float]:
    res = TrialResources.from_config(config)
    return res.workers, res.cpus_per_worker, res.gpus_per_worker


def resource_request(config: Mapping[str, Any]) -> PlacementGroupFactory:
    """The trial's placement group: an empty head bundle for the trainable, then one bundle
    ``{"CPU": cpus_per_worker, "GPU": gpus_per_worker}`` per data-parallel worker (PACK)."""
    workers, cpus, gpus = _resources(config)
    bundle: dict[str, float] = {"CPU": cpus}
    if gpus > 0:
        bundle["GPU"] = gpus
    head: dict[str, float] = {"CPU": 0.0}  # no resources: Tune drops it from the group
    return PlacementGroupFactory([head] + [dict(bundle) for _ in range(workers)])


def _signed(value: Any, sign: float) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return sign * float(value)


class ScheduleTrainable(tune.Trainable):
    """Trains one schedule; ``step()`` = one epoch. Config keys: see
    :class:`tuner.trial_config.TrialConfig`."""

    #: Tasks to register in the worker processes (tests, notebooks); subclasses set this.
    extra_tasks: ClassVar[tuple[Task, ...]] = ()

    @classmethod
    def default_resource_request(cls, config: dict[str, Any]) -> PlacementGroupFactory:
        return resource_request(config)

    # ------------------------------------------------------------------ lifecycle

    def setup(self, config: dict[str, Any]) -> None:
        self._gang: Gang | None = None
        self.gangs_created = 0
        self._start_trial(config)

    def train(self) -> dict[str, Any]:
        """One epoch with Tune's bookkeeping (typed wrapper of ``Trainable.train``)."""
        result: dict[str, Any] = super().train()  # type: ignore[no-untyped-call]
        return result

    def stop(self) -> None:
        """Release the workers (typed wrapper of ``Trainable.stop``, which calls cleanup)."""
        super().stop()  # type: ignore[no-untyped-call]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._start_trial(new_config)
        return True

    def cleanup(self) -> None:
        if self._gang is not None:
            self._gang.shutdown()
            self._gang = None

    @property
    def worker_pids(self) -> tuple[int, ...]:
        return self._gang.pids if self._gang is not None else ()

    def _start_trial(self, config: Mapping[str, Any]) -> None:
        started = time.perf_counter()
        spec = TrialConfig.from_config(config)
        self._spec = spec
        self._epoch = 0
        self._finished = False
        self._compute_epochs = 0.0
        self._config = dict(config)
        self._history: list[dict[str, Any]] = []  # this trial's results, for boundary states
        self._replay: list[dict[str, Any]] = []  # a fork's prefix results, to report again
        self._forked_epochs = 0
        #: Seconds the last stage-boundary save and this trial's fork took (diagnostics).
        self.prefix_save_s: float | None = None
        self.fork_load_s: float | None = None
        gang = self._gang
        reusable = (
            gang is not None
            and gang.world_size == spec.workers
            and gang.cpus_per_worker == spec.cpus_per_worker
            and gang.gpus_per_worker == spec.gpus_per_worker
            and gang.alive()
        )
        if not reusable:
            if gang is not None:
                gang.shutdown()
            self._gang = None
            self._gang = self._new_gang(spec)
        assert self._gang is not None
        self.worker_info: list[dict[str, Any]] = self._gang.call("configure", dict(config))
        store = self._prefix_store()
        if store is not None:
            self._fork(store)
        self.setup_time_s = time.perf_counter() - started

    def _new_gang(self, spec: TrialConfig) -> Gang:
        import ray

        pg = None
        offset = 0
        # Under Tune the trial's placement group holds the workers' bundles; outside Tune
        # (no trial info) the gang reserves its own.
        resources = self.trial_resources if self._trial_info is not None else None
        if resources is not None:
            pg = ray.util.get_current_placement_group()
            offset = 0 if resources.head_bundle_is_empty else 1
            have = len(resources.bundles) - offset
            if pg is not None and have < spec.workers:
                raise ValidationError(
                    f"the trial's placement group has {have} worker bundles but the trial "
                    f"wants {spec.workers} workers; let ScheduleTrainable.default_resource_"
                    "request size it (do not wrap it in tune.with_resources)"
                )
        factory = functools.partial(trial_worker, tasks=self.extra_tasks)
        # Under Tune a CPU gang comes from (and goes back to) the driver's pool, so the next
        # Tune experiment's trials start on warm workers (workers.gang_pool).
        pool = driver_pool() if pg is not None and spec.gpus_per_worker <= 0 else None
        gang = Gang(
            spec.workers,
            factory,
            cpus_per_worker=spec.cpus_per_worker,
            gpus_per_worker=spec.gpus_per_worker,
            placement_group=pg,
            bundle_offset=offset,
            collective_timeout_s=spec.collective_timeout_s,
            pool=pool,
            pool_key=""
            if pool is None
            else pool_key(spec.workers, spec.cpus_per_worker, spec.collective_timeout_s, factory),
        )
        self.gangs_created += 1
        return gang

    # ------------------------------------------------------------------ shared prefixes

    def _prefix_store(self) -> PrefixStore | None:
        path = self._config.get("prefix_store")
        if not path:
            return None
        bound = self._config.get("prefix_store_bytes")
        return PrefixStore(str(path), int(bound) if bound else None)

    def _fork(self, store: PrefixStore) -> None:
        """Start from the longest prefix of the schedule that some trial saved: load its state
        into the workers and queue its per-epoch results to be reported again."""
        assert self._gang is not None
        started = time.perf_counter()
        schedule = self._spec.schedule
        for stages, epoch in reversed(boundaries(schedule)):
            blob = store.get(prefix_key(schedule, stages, self._config))
            if blob is None:
                continue
            try:
                saved = pickle.loads(blob)
                ranks, results = saved["ranks"], list(saved["results"])
                if saved.get("version") != 1 or len(results) != epoch:
                    raise ValueError("not a version 1 prefix state of this boundary")
            except Exception as exc:  # an unreadable state is a miss, not a failed trial
                log.warning("ignoring the unreadable prefix state at epoch %s: %s", epoch, exc)
                continue
            self._gang.load_states(ranks)
            self._replay = results
            self._forked_epochs = epoch
            self.fork_load_s = time.perf_counter() - started
            return

    def _save_prefix(self, store: PrefixStore) -> None:
        """At a stage boundary (not the run's end): save the state for later forks."""
        assert self._gang is not None
        schedule = self._spec.schedule
        for stages, epoch in boundaries(schedule):
            if epoch != self._epoch:
                continue
            key = prefix_key(schedule, stages, self._config)
            if store.has(key):
                return
            started = time.perf_counter()
            blob = pickle.dumps(
                {
                    "version": 1,
                    "epoch": epoch,
                    "ranks": self._gang.states(),
                    "results": self._history[:epoch],
                },
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            try:
                store.put(key, blob)
            except OSError as exc:  # a full disk costs later forks, not this trial
                log.warning("could not save the prefix state at epoch %s: %s", epoch, exc)
            self.prefix_save_s = time.perf_counter() - started
            return

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, Any]:
        """The trial's full state (model, optimizer, RNGs, counters) as a dict Tune pickles.

        Tune's default for class trainables is ``checkpoint_at_end=True``; an engine that keeps
        only metrics can set ``CheckpointConfig(checkpoint_at_end=False)`` to skip it.
        """
        if self._gang is None:
            raise GangError("no worker gang: the trainable was stopped")
        states = self._gang.states()
        return {
            "version": 1,
            "epoch": self._epoch,
            "finished": self._finished,
            "compute_epochs": self._compute_epochs,
            "history": self._history,
            "replay": self._replay,
            "forked_epochs": self._forked_epochs,
            "ranks": states,
        }

    def load_checkpoint(self, checkpoint: dict[str, Any] | None) -> None:
        if self._gang is None:
            raise GangError("no worker gang: the trainable was stopped")
        if not checkpoint or checkpoint.get("version") != 1:
            raise ValidationError("not a ScheduleTrainable checkpoint (version 1)")
        states = checkpoint["ranks"]
        if len(states) != self._gang.world_size:
            raise ValidationError(
                f"the checkpoint has {len(states)} workers, this trial {self._gang.world_size}"
            )
        self._gang.load_states(states)
        self._epoch = int(checkpoint["epoch"])
        self._finished = bool(checkpoint["finished"])
        self._compute_epochs = float(checkpoint.get("compute_epochs", self._epoch))
        self._history = list(checkpoint.get("history", []))
        self._replay = list(checkpoint.get("replay", []))
        self._forked_epochs = int(checkpoint.get("forked_epochs", 0))

    # ------------------------------------------------------------------ one epoch

    def step(self) -> dict[str, Any]:
        if self._gang is None:
            raise GangError("no worker gang: the trainable was stopped")
        if self._finished:
            raise StagetuneError("the trial has finished; start a new one with reset_config()")
        if self._replay:
            # A forked trial's prefix: the results recorded when it was trained, as they were.
            replayed = dict(self._replay.pop(0))
            self._history.append(dict(replayed))
            self._epoch += 1
            replayed.update(
                compute_epochs=self._compute_epochs,
                forked_epochs=self._forked_epochs,
                replayed=True,
                done=False,  # a prefix ends at a stage boundary, before the run's end
            )
            return replayed
        started = time.perf_counter()
        try:
            results = self._gang.call("train_epoch", self._epoch)
        except TrialOOMError as exc:
            return self._failed(str(exc))
        loop_time = time.perf_counter() - started
        first = results[0]
        metrics: dict[str, Any] = {key: first[key] for key in METRIC_KEYS}
        # The task's metrics (val_accuracy, val_psnr, ...); val_accuracy is always a key
        # (None for a task that does not report it), as Tune wants its keys in every result.
        metrics["val_accuracy"] = None
        metrics.update({k: v for k, v in first.items() if k.startswith("val_")})
        for key in EXTRA_KEYS:
            metrics[key] = first[key]
        metrics["loop_time_s"] = loop_time
        metrics["worker_pids"] = [r["pid"] for r in results]
        metrics["worker_compute_s"] = [r["compute_time_s"] for r in results]
        for key in ("val_loss", "train_loss", "noise_scale"):
            value = metrics[key]
            if value is not None and not math.isfinite(value):
                metrics[key] = None
        self._epoch += 1
        # A finite loss that jumped far above the run's lowest: diverged all the same.
        lowest = loss_jump(
            (h.get("val_loss") for h in self._history),
            metrics["val_loss"],
            self._spec.divergence_factor,
        )
        metrics[JUMP_KEY] = lowest
        metrics["diverged"] = bool(first["diverged"]) or lowest is not None
        done = metrics["diverged"] or self._epoch >= self._spec.schedule.total_epochs
        # ``score`` ranks the run where it can be ranked: after a cooldown probe, the probe's
        # value of the study's metric; at the run's end, its own (the schedule's decay has
        # run). None otherwise (Tune wants the key in every result), so a scheduler comparing
        # ``score`` decides only at those epochs. Larger is better: a metric to minimise is
        # negated.
        self._compute_epochs += 1.0
        metrics["score"] = None
        metric, sign = self._spec.metric, (-1.0 if self._spec.metric_mode == "min" else 1.0)
        if "probe_steps" in first:
            for key, value in first.items():
                if key in PROBE_KEYS or key.startswith("probe_val_"):
                    metrics[key] = value
            self._compute_epochs += float(first["probe_epochs"])
            if not metrics["diverged"]:
                metrics["score"] = _signed(first.get(f"probe_{metric}"), sign)
        elif done and not metrics["diverged"]:
            metrics["score"] = _signed(metrics.get(metric), sign)
        self._history.append({k: v for k, v in metrics.items() if k not in _OWN_KEYS})
        store = self._prefix_store()
        if store is not None and not done:
            self._save_prefix(store)
        metrics["compute_epochs"] = self._compute_epochs
        metrics["forked_epochs"] = self._forked_epochs
        metrics["replayed"] = False
        self._finished = done
        metrics["done"] = done
        return metrics

    def _failed(self, reason: str) -> dict[str, Any]:
        """The last report of a trial whose epoch failed on every rank alike (a stage that
        does not fit in memory even at micro-batch 1): ``failure`` says why, no metric has a
        value, the counters are those of the last epoch trained. The gang is unharmed (every
        rank dropped the step), so the trial ends as a result instead of an error and Tune
        keeps this actor and its workers for the next trial."""
        last = self._history[-1] if self._history else {}
        metrics: dict[str, Any] = dict.fromkeys((*METRIC_KEYS, *EXTRA_KEYS))
        metrics.update({k: None for k in last if k.startswith("val_")})
        metrics.update(val_accuracy=None, score=None, diverged=False, epoch=self._epoch)
        metrics[self._spec.metric] = None
        for key in ("steps", "samples", "wall_time_s"):
            metrics[key] = last.get(key, 0)
        metrics[FAILURE_KEY] = reason
        metrics.update(
            compute_epochs=self._compute_epochs,
            forked_epochs=self._forked_epochs,
            replayed=False,
            done=True,
        )
        self._finished = True  # the epoch counter stays at the epochs trained
        log.info("trial failed in epoch %s: %s", self._epoch + 1, reason)
        return metrics
