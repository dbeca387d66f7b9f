"""Replay: train an exported schedule once, with the same code that ran the study's trials.

``stagetune replay SCHEDULE.yaml --task NAME`` checks that a schedule reproduces outside the
study: it starts a gang of data-parallel workers (:class:`workers.gang.Gang`, the trial loop
:class:`workers.loop.TrialWorker`: the same data, model, seeds, placement and per-step LR as a
trial), trains every epoch of the schedule, and reports the final value of the study's metric
(the provenance's ``metrics.metric``; validation accuracy in files exported before studies
named their metric) next to the one recorded in the YAML's provenance: the difference in
percentage points for an accuracy, in the metric's own units for any other metric (a loss, a
PSNR in dB).

Defaults come from the provenance when the YAML was exported by stagetune: the task options,
the seed, and the world size and micro-batch the trial was tuned on. With the same seed and
workers a replay is a re-run of the trial, so the values agree up to floating-point
non-determinism (well within a point of accuracy); other workers or micro-batches train the
same schedule with a different data split and reduction order.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tuner.errors import StagetuneError, ValidationError
from tuner.formatting import format_metric, format_metric_delta, in_own_units, metric_kind
from tuner.schedule import Schedule

if TYPE_CHECKING:
    from workers.tasks import Task

__all__ = ["ReplayResult", "metric_label", "recorded_metric", "replay", "replay_config"]

#: The metric of a schedule exported before studies named their metric.
DEFAULT_METRIC = "val_accuracy"


def metric_label(metric: str) -> str:
    """``val_accuracy`` -> ``val accuracy``, ``val_loss`` -> ``val loss``: how replay names a
    metric in its lines."""
    return metric.replace("_", " ")


@dataclass(frozen=True)
class ReplayResult:
    """What a replay trained and how it compares with the recorded trial."""

    task: str
    task_options: dict[str, Any]
    seed: int
    workers: int
    micro_batch: int | None
    epochs: tuple[dict[str, Any], ...]
    """Rank 0's metrics of every epoch (keys of :meth:`workers.loop.TrialWorker.train_epoch`:
    ``val_<name>`` for each metric the task declares)."""
    wall_time_s: float
    recorded_value: float | None
    """The trial's final value of :attr:`metric` from the YAML's provenance (``metrics.
    metric_value``, or ``metrics.val_accuracy`` in an older file; None if absent or not
    comparable)."""
    recorded_from: str | None
    """``"study 3, trial 7"`` when the provenance names them."""
    notes: tuple[str, ...] = field(default=())
    """Why the replay may differ from the recorded trial (other task, seed, workers...)."""
    recorded_epochs: int | None = None
    """Epochs the recorded trial trained, when fewer than the schedule's (stopped early): the
    comparison then uses the replay's value after as many epochs."""
    metric: str = DEFAULT_METRIC
    """The metric compared: the study's (the provenance's ``metrics.metric``)."""

    @property
    def is_accuracy(self) -> bool:
        """Whether :attr:`metric` is an accuracy (a fraction; differences in points)."""
        return metric_kind(self.metric) == "percent"

    @property
    def value(self) -> float | None:
        """The replay's final value of :attr:`metric` (None when no epoch finished or the
        run did not report it)."""
        return self._value_after(len(self.epochs))

    def _value_after(self, epochs: int, key: str | None = None) -> float | None:
        if not 0 < epochs <= len(self.epochs):
            return None
        value = self.epochs[epochs - 1].get(key or self.metric)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if math.isfinite(value) else None

    @property
    def compared_value(self) -> float | None:
        """The replay's value compared with the recorded one (after the same epochs)."""
        if self.recorded_epochs is not None:
            return self._value_after(self.recorded_epochs)
        return self.value

    @property
    def difference(self) -> float | None:
        """Replayed minus recorded value: in percentage points for an accuracy, in the
        metric's own units otherwise (what ``--tolerance`` bounds)."""
        got = self.compared_value
        if got is None or self.recorded_value is None:
            return None
        delta = got - self.recorded_value
        return 100.0 * delta if self.is_accuracy else delta

    # Validation accuracy, as before studies named their metric (None where the study's
    # metric is another).

    @property
    def val_accuracy(self) -> float | None:
        """Final validation accuracy of the replay (None when no epoch finished)."""
        return self._value_after(len(self.epochs), "val_accuracy")

    @property
    def recorded_val_accuracy(self) -> float | None:
        """:attr:`recorded_value` when the metric is validation accuracy."""
        return self.recorded_value if self.metric == "val_accuracy" else None

    @property
    def difference_points(self) -> float | None:
        """:attr:`difference` when the metric is an accuracy (percentage points)."""
        return self.difference if self.is_accuracy else None

    @property
    def diverged(self) -> bool:
        return bool(self.epochs and self.epochs[-1].get("diverged"))

    def summary(self) -> str:
        """One line for the terminal."""
        label = metric_label(self.metric)
        got = self.value
        replayed = "no finished epoch" if not self.epochs else self._text(got)
        if self.diverged:
            replayed += " (diverged)"
        line = f"replayed {label} {replayed}"
        diff = self.difference
        if self.recorded_value is not None and diff is not None:
            where = f" ({self.recorded_from})" if self.recorded_from else ""
            if self.recorded_epochs is not None:
                line += (
                    f"; after {self.recorded_epochs} epochs (where the recorded trial stopped) "
                    f"{self._text(self.compared_value)}"
                )
            line += (
                f", recorded {self._text(self.recorded_value)}{where}: "
                f"{format_metric_delta(diff, self.metric)}"
            )
            if in_own_units(self.metric):
                line += " (in the metric's own units)"
        else:
            line += f", no recorded {label} to compare with"
        return line

    def _text(self, value: float | None) -> str:
        return format_metric(value, self.metric, percent=True)


def _provenance(schedule: Schedule) -> Mapping[str, Any]:
    prov = schedule.provenance
    return prov if isinstance(prov, Mapping) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def recorded_metric(schedule: Schedule, task: str | None = None) -> str:
    """The metric a replay of ``schedule`` on ``task`` (default: the provenance's) compares:
    the one its provenance records (``metrics.metric``). A file without one (exported before
    studies named their metric, or written by hand): validation accuracy, unless the task
    does not report it (then its primary metric). Replaying another task than the recorded
    one: that task's primary metric (the recorded value is not comparable then)."""
    from tuner.tasks import task_metrics

    prov = _provenance(schedule)
    recorded_task = prov.get("task") if isinstance(prov.get("task"), str) else None
    name = task or recorded_task
    metrics = prov.get("metrics")
    written = metrics.get("metric") if isinstance(metrics, Mapping) else None
    other_task = task is not None and recorded_task is not None and task != recorded_task
    if isinstance(written, str) and written and not other_task:
        return written
    if name is None:
        return DEFAULT_METRIC
    try:
        declared, primary = task_metrics(name)
    except StagetuneError:  # an unknown task: the replay itself says so
        return DEFAULT_METRIC
    if other_task or DEFAULT_METRIC not in declared:
        return primary
    return DEFAULT_METRIC


def _recorded_value(metrics: Mapping[str, Any], metric: str) -> float | None:
    """The recorded trial's final value of ``metric``: ``metric_value`` when the provenance
    names the metric, else the value under the metric's own name (``val_accuracy`` in an
    older file)."""
    raw = metrics.get("metric_value") if metrics.get("metric") == metric else metrics.get(metric)
    if isinstance(raw, bool) or not isinstance(raw, int | float) or not math.isfinite(raw):
        return None
    return float(raw)


def replay_config(
    schedule: Schedule,
    task: str | None = None,
    *,
    seed: int | None = None,
    workers: int | None = None,
    micro_batch: int | None = None,
    task_options: Mapping[str, Any] | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
) -> tuple[dict[str, Any], list[str]]:
    """The trial config (:class:`tuner.trial_config.TrialConfig` keys) of a replay, and notes
    on what differs from the recorded trial. Unset arguments default to the provenance."""
    prov = _provenance(schedule)
    notes: list[str] = []
    recorded_task = prov.get("task") if isinstance(prov.get("task"), str) else None
    name = task or recorded_task
    if not name:
        raise ValidationError(
            "the schedule's provenance names no task; pass --task NAME (see `stagetune tasks`)"
        )
    same_task = recorded_task == name
    if recorded_task and not same_task:
        notes.append(
            f"the schedule was tuned on task {recorded_task!r}, not {name!r}: the recorded "
            "metrics are not comparable"
        )
    options: dict[str, Any] = {}
    if task_options is not None:
        options = dict(task_options)
    elif same_task and isinstance(prov.get("task_options"), Mapping):
        options = dict(prov["task_options"])
    tuned = prov.get("tuned_on") if isinstance(prov.get("tuned_on"), Mapping) else {}
    assert isinstance(tuned, Mapping)
    hint = schedule.placement
    recorded_seed = _int(prov.get("seed"))
    recorded_workers = _int(tuned.get("world_size")) or (hint.world_size if hint else None)
    recorded_micro = _int(tuned.get("micro_batch"))
    if recorded_micro is None and "micro_batch" not in tuned and hint is not None:
        recorded_micro = hint.micro_batch
    use_seed = seed if seed is not None else (recorded_seed if recorded_seed is not None else 0)
    use_workers = workers if workers is not None else (recorded_workers or 1)
    use_micro = micro_batch if micro_batch is not None else recorded_micro
    if recorded_seed is not None and use_seed != recorded_seed:
        notes.append(f"seed {use_seed} differs from the trial's seed {recorded_seed}")
    if recorded_workers is not None and use_workers != recorded_workers:
        notes.append(
            f"{use_workers} workers instead of the {recorded_workers} the trial ran on: the "
            "same global batches, but another split and reduction order"
        )
    if micro_batch is not None and micro_batch != recorded_micro:
        notes.append(f"micro-batch {micro_batch} instead of the trial's {recorded_micro}")
    document = schedule.to_dict()
    document.pop("provenance", None)
    config = {
        "schedule": document,
        "task": name,
        "task_options": options,
        "seed": use_seed,
        "workers": use_workers,
        "cpus_per_worker": cpus_per_worker,
        "gpus_per_worker": gpus_per_worker,
        "micro_batch": use_micro,
        "performance_aware": False,
    }
    return config, notes


def replay(
    schedule: Schedule,
    task: str | None = None,
    *,
    seed: int | None = None,
    workers: int | None = None,
    micro_batch: int | None = None,
    task_options: Mapping[str, Any] | None = None,
    cpus_per_worker: float = 1.0,
    gpus_per_worker: float = 0.0,
    on_epoch: Callable[[dict[str, Any]], None] | None = None,
    tasks: Sequence[Task] = (),
) -> ReplayResult:
    """Train ``schedule`` once on a gang of Ray workers and compare the study's metric
    (:func:`recorded_metric`) with the provenance.

    Uses the running Ray instance, or starts a local one (enough CPUs for the workers) and
    shuts it down afterwards. ``on_epoch`` receives rank 0's metrics after every epoch. Stops
    early when the run diverges. ``tasks`` are tasks registered in this process only (a task
    file's), sent to the workers like a study's ``ScheduleTrainable.extra_tasks``.
    """
    import functools

    import ray

    from workers.gang import Gang
    from workers.loop import TrialWorker

    config, notes = replay_config(
        schedule,
        task,
        seed=seed,
        workers=workers,
        micro_batch=micro_batch,
        task_options=task_options,
        cpus_per_worker=cpus_per_worker,
        gpus_per_worker=gpus_per_worker,
    )
    started_ray = False
    if not ray.is_initialized():
        from tuner.engine import quiet_local_ray_notices

        if not os.environ.get("RAY_ADDRESS", "").strip():
            quiet_local_ray_notices()
        need = math.ceil(config["workers"] * cpus_per_worker)
        ray.init(
            num_cpus=max(need, os.cpu_count() or 1),
            include_dashboard=False,
            configure_logging=False,
            log_to_driver=False,
        )
        started_ray = True
    epochs: list[dict[str, Any]] = []
    started = time.perf_counter()
    try:
        gang = Gang(
            config["workers"],
            functools.partial(TrialWorker, tasks=tuple(tasks)),
            cpus_per_worker=cpus_per_worker,
            gpus_per_worker=gpus_per_worker,
        )
        try:
            gang.call("configure", config)
            for epoch in range(schedule.total_epochs):
                metrics = dict(gang.call("train_epoch", epoch)[0])
                epochs.append(metrics)
                if on_epoch is not None:
                    on_epoch(metrics)
                if metrics.get("diverged"):
                    break
        finally:
            gang.shutdown()
    finally:
        if started_ray:
            ray.shutdown()
    prov = _provenance(schedule)
    metrics_rec = prov.get("metrics") if isinstance(prov.get("metrics"), Mapping) else {}
    assert isinstance(metrics_rec, Mapping)
    metric = recorded_metric(schedule, config["task"])
    recorded = _recorded_value(metrics_rec, metric)
    comparable = not any("not comparable" in n for n in notes)
    recorded_epochs = _int(metrics_rec.get("epochs_done"))
    if recorded_epochs is not None and not 0 < recorded_epochs < schedule.total_epochs:
        recorded_epochs = None
    if recorded_epochs is not None:
        notes.append(
            f"the recorded trial stopped after {recorded_epochs} of {schedule.total_epochs} "
            f"epochs; its {metric_label(metric)} is compared with the replay's after as many "
            "epochs"
        )
    recorded_from = None
    if prov.get("study_id") is not None and prov.get("trial_number") is not None:
        recorded_from = f"study {prov['study_id']}, trial {prov['trial_number']}"
    return ReplayResult(
        task=config["task"],
        task_options=config["task_options"],
        seed=config["seed"],
        workers=config["workers"],
        micro_batch=config["micro_batch"],
        epochs=tuple(epochs),
        wall_time_s=time.perf_counter() - started,
        recorded_value=recorded if comparable else None,
        recorded_from=recorded_from,
        notes=tuple(notes),
        recorded_epochs=recorded_epochs,
        metric=metric,
    )
