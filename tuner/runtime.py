"""Run an exported schedule in your own PyTorch training loop (no Ray, no stagetune service).

Two pieces, usable together or apart; this module imports torch and :mod:`tuner.schedule`
only:

* :class:`ScheduleRuntime` answers, per epoch, the global batch, this rank's local batch and
  gradient-accumulation steps, and gives a batch sampler (:class:`ScheduleBatchSampler`) that
  plugs into ``DataLoader(dataset, batch_sampler=...)``: it yields this rank's index lists, one
  per forward/backward micro-batch, from a seeded permutation that is identical on every rank
  (so the ranks' slices of each global batch are disjoint and together form the global batch).
* :class:`ScheduleLR` is a standard ``torch.optim.lr_scheduler.LRScheduler``: call
  ``scheduler.step()`` after every ``optimizer.step()`` and it sets the LR of the next optimizer
  step from the schedule. Its ``state_dict()`` holds plain numbers and strings (``torch.load``
  with ``weights_only=True`` reads it), and ``load_state_dict`` resumes it exactly, mid-epoch
  included.

A loop (``reduction="sum"`` times ``step.loss_weight`` makes the gradient the mean over the
global batch, also when DDP averages it over ranks)::

    rt = ScheduleRuntime("schedule.yaml", len(train_set), world_size, rank, micro_batch=64)
    sampler = rt.batch_sampler()
    loader = DataLoader(train_set, batch_sampler=sampler)
    scheduler = ScheduleLR(optimizer, rt.schedule, len(train_set))
    for epoch in range(rt.num_epochs):
        sampler.set_epoch(epoch)
        batches = iter(loader)
        for step in rt.steps(epoch):
            for size in step.micro_batches:
                if size == 0:
                    continue  # see StepPlan.micro_batches
                x, y = next(batches)
                loss = F.cross_entropy(model(x), y, reduction="sum") * step.loss_weight
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler
from torch.utils.data import Sampler

from tuner.errors import ValidationError
from tuner.retarget import RetargetedSchedule, retarget
from tuner.schedule import BatchPlacement, Schedule
from tuner.step_plan import PlannedStep, epoch_order, epoch_steps, rank_micro_slices, split_step

__all__ = [
    "EpochPlan",
    "ScheduleBatchSampler",
    "ScheduleLR",
    "ScheduleRuntime",
    "StepPlan",
    "load_schedule",
]

ScheduleSource = Schedule | str | os.PathLike[str]


def load_schedule(source: ScheduleSource) -> Schedule:
    """A :class:`Schedule`, or one read from a YAML file path (``Schedule.load``)."""
    if isinstance(source, Schedule):
        return source
    if isinstance(source, str | os.PathLike):
        return Schedule.load(source)
    raise ValidationError(
        f"expected a Schedule or the path of a schedule YAML file, got {type(source).__name__}"
    )


@dataclass(frozen=True)
class EpochPlan:
    """What one epoch looks like on this rank (full steps; see :meth:`ScheduleRuntime.steps`
    for the smaller last step of ``drop_last=False``)."""

    epoch: int
    stage_index: int
    global_batch: int
    """Samples per optimizer step, over all workers."""
    local_batch: int
    """This rank's samples per optimizer step."""
    accumulation_steps: int
    """Forward/backward passes per optimizer step (the same on every rank)."""
    micro_batches: tuple[int, ...]
    """This rank's pass sizes (sum: ``local_batch``)."""
    steps: int
    """Optimizer steps in the epoch."""


@dataclass(frozen=True)
class StepPlan:
    """One optimizer step on this rank."""

    global_step: int
    epoch: int
    step_in_epoch: int
    stage_index: int
    global_batch: int
    """Samples in this step over all workers (smaller for the last step with drop_last=False)."""
    lr: float
    """The schedule's LR of this step (what :class:`ScheduleLR` sets)."""
    local_batch: int
    micro_batches: tuple[int, ...]
    """This rank's pass sizes, one per accumulation step. The sampler yields a batch for each
    non-zero size only: a size of 0 (possible with uneven ``speed_weights``) means this rank has
    no samples in that pass; under DDP it must still join the gradient all-reduce (e.g. a
    zero-weighted backward) on the step's last pass."""
    loss_weight: float
    """``world_size / global_batch``: multiply a ``reduction="sum"`` loss by this so that the
    gradient, averaged over ranks (as DDP does) or summed on one worker, is the mean over the
    global batch."""

    @property
    def accumulation_steps(self) -> int:
        return len(self.micro_batches)


class ScheduleRuntime:
    """The schedule seen from one rank of a data-parallel run.

    ``schedule_or_yaml_path``: a :class:`Schedule` or the path of an exported YAML file.
    ``dataset_size``: training samples per epoch (the whole dataset, not one rank's shard).
    ``micro_batch``: the most samples one worker processes per forward/backward pass (None:
    the whole local batch in one pass). ``drop_last``: like ``DataLoader``, an epoch at batch
    ``b`` has ``N // b`` steps; with False ``ceil(N / b)``, the last one smaller. ``seed``: the
    epoch orders are :func:`tuner.step_plan.epoch_order` of ``(seed, epoch)`` on every rank;
    with the trial's seed (the schedule's provenance) and the same dataset, every step's LR,
    batch and samples are exactly the tuning trial's.
    ``speed_weights``: relative worker throughputs for an uneven split of each global batch.
    ``fixed_micro_batch``: gradient-accumulation mode, as Megatron-LM and DeepSpeed run batch
    ramps: every pass is exactly ``micro_batch`` samples per worker and each stage's global
    batch comes from its number of accumulation steps (ValidationError naming every stage
    whose per-worker batch is not a multiple of ``micro_batch``).

    Raises ValidationError (a PlacementError naming every stage) if the schedule cannot be
    placed on ``world_size`` workers, or a stage's batch is larger than the dataset.
    """

    def __init__(
        self,
        schedule_or_yaml_path: ScheduleSource,
        dataset_size: int,
        world_size: int = 1,
        rank: int = 0,
        micro_batch: int | None = None,
        drop_last: bool = True,
        *,
        seed: int = 0,
        speed_weights: Sequence[float] | None = None,
        fixed_micro_batch: bool = False,
    ) -> None:
        self.schedule = load_schedule(schedule_or_yaml_path)
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ValidationError(f"world_size must be a positive integer, got {world_size!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < world_size:
            raise ValidationError(
                f"rank must be an integer in [0, {world_size - 1}] (0-based, like "
                f"torch.distributed), got {rank!r}"
            )
        self.dataset_size = dataset_size
        self.world_size = world_size
        self.rank = rank
        self.micro_batch = micro_batch
        self.drop_last = drop_last
        self.seed = int(seed)
        self.speed_weights = tuple(float(w) for w in speed_weights) if speed_weights else None
        self._splits: dict[int, BatchPlacement] = {}  # global batch -> its split
        self.placed: RetargetedSchedule = retarget(
            self.schedule, world_size, micro_batch, speed_weights
        )
        # Validates dataset_size and (with drop_last) that no batch exceeds the dataset.
        self._stage_steps = [
            self.schedule.steps_per_epoch(i, dataset_size, drop_last=drop_last)
            for i in range(self.schedule.num_stages)
        ]
        self._epoch_stage = [
            self.schedule.stage_index_at(e) for e in range(self.schedule.total_epochs)
        ]
        self._epoch_start_step = [0]
        for e in range(self.schedule.total_epochs):
            self._epoch_start_step.append(
                self._epoch_start_step[-1] + self._stage_steps[self._epoch_stage[e]]
            )
        self.fixed_micro_batch = fixed_micro_batch
        if fixed_micro_batch:
            self._check_fixed_micro_batch()
        if not drop_last:  # place every partial last step now, so problems surface here
            for i, st in enumerate(self.schedule.stages):
                remainder = dataset_size % st.batch_size
                if remainder:
                    self.placed.step_placement(remainder, i)

    def _check_fixed_micro_batch(self) -> None:
        """Gradient-accumulation mode: every pass on every worker is exactly ``micro_batch``
        samples and a stage grows its global batch only through more accumulation steps (how
        Megatron-LM's and DeepSpeed's batch ramps run). Every stage's per-worker batch must be
        a multiple of the micro-batch; the error lists those that are not and the micro-batches
        that would do."""
        m = self.micro_batch
        if m is None:
            raise ValidationError(
                "fixed_micro_batch needs micro_batch (the per-device batch of every pass)"
            )
        if self.speed_weights is not None:
            raise ValidationError(
                "fixed_micro_batch splits every global batch evenly; drop speed_weights"
            )
        problems = []
        locals_ = []
        for i, st in enumerate(self.schedule.stages):
            local = self.placed.placement(i).local_batches[self.rank]
            locals_.append(local)
            if local % m:
                problems.append(
                    f"stage {i + 1} (epochs {st.start_epoch}-{st.end_epoch}): batch "
                    f"{st.batch_size} on {self.world_size} worker(s) is {local} per worker, not "
                    f"a multiple of {m}"
                )
        if not self.drop_last:
            for i, st in enumerate(self.schedule.stages):
                rest = self.dataset_size % st.batch_size
                if rest and (rest % self.world_size or (rest // self.world_size) % m):
                    problems.append(
                        f"stage {i + 1}'s partial last step of {rest} samples (drop_last=False)"
                    )
        if problems:
            common = math.gcd(*locals_)
            fits = [d for d in range(1, common + 1) if common % d == 0]
            raise ValidationError(
                f"fixed micro-batch {m}: " + "; ".join(problems) + f". Micro-batches that divide "
                f"every stage: {', '.join(map(str, fits[-4:]))} (the largest; with "
                "drop_last=True)"
            )

    # ------------------------------------------------------------------ run-wide

    @property
    def num_epochs(self) -> int:
        return self.schedule.total_epochs

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run."""
        return self._epoch_start_step[-1]

    def _check_epoch(self, epoch: int) -> int:
        if (
            isinstance(epoch, bool)
            or not isinstance(epoch, int)
            or not (0 <= epoch < self.num_epochs)
        ):
            raise ValidationError(
                f"epoch must be an integer in [0, {self.num_epochs - 1}], got {epoch!r}"
            )
        return epoch

    def locate(self, global_step: int) -> tuple[int, int]:
        """``(epoch, step_in_epoch)`` of optimizer step ``global_step`` (0-based), e.g. to
        resume a checkpoint mid-epoch with ``sampler.set_epoch(epoch, start_step)``."""
        if not 0 <= global_step < self.total_steps:
            raise ValidationError(
                f"global_step must be in [0, {self.total_steps - 1}], got {global_step!r}"
            )
        epoch = bisect_right(self._epoch_start_step, global_step) - 1
        return epoch, global_step - self._epoch_start_step[epoch]

    # ------------------------------------------------------------------ per epoch

    def stage_index(self, epoch: int) -> int:
        return self._epoch_stage[self._check_epoch(epoch)]

    def _placement(self, epoch: int) -> BatchPlacement:
        return self.placed.placement(self.stage_index(epoch))

    def global_batch(self, epoch: int) -> int:
        """Samples per optimizer step over all workers in ``epoch``."""
        return self._placement(epoch).global_batch

    def local_batch(self, epoch: int) -> int:
        """This rank's samples per (full) optimizer step in ``epoch``."""
        return self._placement(epoch).local_batches[self.rank]

    def accumulation_steps(self, epoch: int) -> int:
        """Forward/backward passes per (full) optimizer step in ``epoch``, on every rank."""
        return self._placement(epoch).accumulation_steps

    def steps_in_epoch(self, epoch: int) -> int:
        return self._stage_steps[self.stage_index(epoch)]

    def epoch_plan(self, epoch: int) -> EpochPlan:
        p = self._placement(epoch)
        return EpochPlan(
            epoch=epoch,
            stage_index=self.stage_index(epoch),
            global_batch=p.global_batch,
            local_batch=p.local_batches[self.rank],
            accumulation_steps=p.accumulation_steps,
            micro_batches=p.micro_batches[self.rank],
            steps=self.steps_in_epoch(epoch),
        )

    def _planned(self, epoch: int, start_step: int) -> Iterator[tuple[PlannedStep, BatchPlacement]]:
        """The step plan's steps of ``epoch`` (:mod:`tuner.step_plan`, the trial loop's too)
        with their split over the workers."""
        self._check_epoch(epoch)
        for step in epoch_steps(
            self.schedule,
            self.dataset_size,
            epoch,
            drop_last=self.drop_last,
            start_step=start_step,
            first_global_step=self._epoch_start_step[epoch],
        ):
            # The constructor placed every stage (and partial step) through retarget, so
            # split_step cannot fail here; its split is the trial loop's (one per batch size).
            split = self._splits.get(step.global_batch)
            if split is None:
                split = split_step(
                    step.global_batch, self.world_size, self.micro_batch, self.speed_weights
                )
                self._splits[step.global_batch] = split
            yield step, split

    def steps(self, epoch: int, start_step: int = 0) -> Iterator[StepPlan]:
        """This rank's optimizer steps of ``epoch`` from ``start_step`` on, in order."""
        for step, p in self._planned(epoch, start_step):
            yield StepPlan(
                global_step=step.global_step,
                epoch=epoch,
                step_in_epoch=step.step_in_epoch,
                stage_index=step.stage_index,
                global_batch=step.global_batch,
                lr=step.lr,
                local_batch=p.local_batches[self.rank],
                micro_batches=p.micro_batches[self.rank],
                loss_weight=self.world_size / step.global_batch,
            )

    def permutation(self, epoch: int) -> torch.Tensor:
        """The epoch's sample order, identical on every rank and the trial loop's
        (:func:`tuner.step_plan.epoch_order` of ``(seed, epoch)``)."""
        self._check_epoch(epoch)
        return torch.from_numpy(epoch_order(self.seed, epoch, self.dataset_size))

    def micro_batch_indices(self, epoch: int, start_step: int = 0) -> Iterator[list[int]]:
        """This rank's index lists of ``epoch``, one per non-empty micro-batch, in order."""
        order = epoch_order(self.seed, self._check_epoch(epoch), self.dataset_size).tolist()
        for step, p in self._planned(epoch, start_step):
            for offset, size in rank_micro_slices(p, self.rank):
                if size:
                    yield order[step.start + offset : step.start + offset + size]

    def batch_sampler(self, epoch: int = 0, start_step: int = 0) -> ScheduleBatchSampler:
        """A batch sampler for ``DataLoader(batch_sampler=...)``; call ``set_epoch`` per epoch."""
        return ScheduleBatchSampler(self, epoch, start_step)

    def lr_scheduler(self, optimizer: Optimizer, last_epoch: int = -1) -> ScheduleLR:
        """A :class:`ScheduleLR` for ``optimizer`` on this runtime's schedule and dataset."""
        return ScheduleLR(
            optimizer,
            self.schedule,
            self.dataset_size,
            drop_last=self.drop_last,
            last_epoch=last_epoch,
        )


class ScheduleBatchSampler(Sampler[list[int]]):
    """Yields this rank's index lists for one epoch, one per non-empty micro-batch.

    Like ``DistributedSampler``, call :meth:`set_epoch` before each epoch (the batch size
    changes with the stage); ``start_step`` resumes an epoch after that many optimizer steps.
    ``len()`` is the number of index lists the current epoch yields.
    """

    def __init__(self, runtime: ScheduleRuntime, epoch: int = 0, start_step: int = 0) -> None:
        super().__init__()
        self.runtime = runtime
        self.epoch = 0
        self.start_step = 0
        self.set_epoch(epoch, start_step)

    def set_epoch(self, epoch: int, start_step: int = 0) -> None:
        spe = self.runtime.steps_in_epoch(epoch)
        if not 0 <= start_step <= spe:
            raise ValidationError(
                f"start_step must be in [0, {spe}] for epoch {epoch}, got {start_step!r}"
            )
        self.epoch = epoch
        self.start_step = start_step

    def __iter__(self) -> Iterator[list[int]]:
        return self.runtime.micro_batch_indices(self.epoch, self.start_step)

    def __len__(self) -> int:
        return sum(
            sum(1 for m in step.micro_batches if m)
            for step in self.runtime.steps(self.epoch, self.start_step)
        )


def schedule_fingerprint(schedule: Schedule) -> str:
    """A short hash of the schedule's stages and run-wide settings (not its provenance)."""
    document = schedule.to_dict()
    document.pop("provenance", None)
    document.pop("placement", None)
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


class ScheduleLR(LRScheduler):
    """Sets the optimizer's LR at every optimizer step from the schedule.

    Step ``g`` (0-based, over the whole run) of epoch ``e``, ``k`` steps into it, gets
    ``schedule.lr_at(e + k / steps_in_epoch)`` (the same as ``Schedule.iter_steps``). On
    construction the optimizer gets step 0's LR; each ``scheduler.step()`` (after
    ``optimizer.step()``) moves to the next step. Past the last step the LR stays at the
    schedule's final LR. Every parameter group gets the schedule's LR, times the group's
    ``lr_scale`` entry if it has one (e.g. ``{"params": ..., "lr_scale": 0.1}``).

    ``state_dict()`` is plain data; ``load_state_dict`` refuses a checkpoint made for another
    schedule, dataset size or ``drop_last``.
    """

    def __init__(
        self,
        optimizer: Optimizer,
        schedule: ScheduleSource,
        dataset_size: int,
        *,
        drop_last: bool = True,
        last_epoch: int = -1,
    ) -> None:
        self.schedule = load_schedule(schedule)
        self.dataset_size = dataset_size
        self.drop_last = drop_last
        self.fingerprint = schedule_fingerprint(self.schedule)
        per_stage = [
            self.schedule.steps_per_epoch(i, dataset_size, drop_last=drop_last)
            for i in range(self.schedule.num_stages)
        ]
        self._epoch_steps = [
            per_stage[self.schedule.stage_index_at(e)] for e in range(self.schedule.total_epochs)
        ]
        starts = [0]
        for n in self._epoch_steps:
            starts.append(starts[-1] + n)
        self._epoch_starts = starts
        self.total_steps = starts[-1]
        super().__init__(optimizer, last_epoch)

    def lr_at_step(self, global_step: int) -> float:
        """The schedule's LR of optimizer step ``global_step`` (clamped to the run)."""
        if global_step >= self.total_steps:
            return self.schedule.lr_at(self.schedule.total_epochs)
        g = max(global_step, 0)
        epoch = bisect_right(self._epoch_starts, g) - 1
        k = g - self._epoch_starts[epoch]
        return self.schedule.lr_at(epoch + k / self._epoch_steps[epoch])

    def get_lr(self) -> list[float | torch.Tensor]:
        lr = self.lr_at_step(self.last_epoch)
        return [lr * float(group.get("lr_scale", 1.0)) for group in self.optimizer.param_groups]

    _STATE_KEYS = ("last_epoch", "_step_count", "_last_lr", "base_lrs")

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {key: self.__dict__[key] for key in self._STATE_KEYS}
        state["_last_lr"] = [float(lr) for lr in state["_last_lr"]]
        state["base_lrs"] = [float(lr) for lr in state["base_lrs"]]
        state["schedule_fingerprint"] = self.fingerprint
        state["schedule_summary"] = self.schedule.summary()
        state["dataset_size"] = self.dataset_size
        state["drop_last"] = self.drop_last
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        mine = (self.fingerprint, self.dataset_size, self.drop_last)
        theirs = (
            state_dict.get("schedule_fingerprint"),
            state_dict.get("dataset_size"),
            state_dict.get("drop_last"),
        )
        if mine != theirs:
            raise ValidationError(
                "this LR scheduler state was saved for schedule "
                f"{state_dict.get('schedule_summary')!s} (fingerprint {theirs[0]}) on "
                f"{theirs[1]} samples with drop_last={theirs[2]}, not for "
                f"{self.schedule.summary()} (fingerprint {mine[0]}) on {mine[1]} samples with "
                f"drop_last={mine[2]}; resume with the schedule and dataset it was saved with"
            )
        for key in self._STATE_KEYS:
            if key in state_dict:
                self.__dict__[key] = state_dict[key]
        # Re-apply: the optimizer's LR is the schedule's for the resumed step.
        for group, lr in zip(self.optimizer.param_groups, self.get_lr(), strict=True):
            group["lr"] = lr
        self._last_lr = [float(group["lr"]) for group in self.optimizer.param_groups]
