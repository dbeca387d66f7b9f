"""The step plan: what every optimizer step of a schedule is, for the trial loop and for
production alike.

stagetune promises that the schedule it exports is the one it tuned. So the trial loop
(``workers.loop``) and the runtime a user's own loop runs (:mod:`tuner.runtime`) do not each
work out a step: both iterate this plan. Per optimizer step it gives the epoch, the stage, the
LR, the global batch, the step's slice of the epoch's sample order, and how that batch is
split over the workers and into micro-batches. Pure Python and NumPy (no torch), so the engine,
the exports and the tests can read it too.

The rules, each in one place:

* **Sample order.** Epoch ``e`` of a run seeded ``s`` visits the ``N`` training samples in
  the order :func:`epoch_order` ``(s, e, N)``: a NumPy permutation from the seed sequence
  ``(s, 0, e)``, the same on every rank. Step ``k`` of the epoch takes positions
  ``[k * b, k * b + size)`` of it (``b`` the stage's batch; ``size`` is ``b``, or less for the
  last step when ``drop_last`` is off).
* **LR.** Step ``k`` of the ``K`` steps of epoch ``e`` runs at ``schedule.lr_at(e + k / K)``.
* **Split.** :func:`split_step`: the global batch split over the workers (evenly when it
  divides; otherwise, or with measured speeds, by weight, largest remainder first), each
  worker's share cut into micro-batches of at most ``micro_batch`` samples, the same number of
  passes on every worker. Rank ``r``'s samples follow ranks ``0..r-1``'s in the step's slice.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from tuner.errors import ValidationError
from tuner.schedule import BatchPlacement, PlacementError, Schedule, place_batch

__all__ = [
    "PlannedStep",
    "epoch_order",
    "epoch_steps",
    "rank_micro_slices",
    "split_step",
]

#: The stream of the seed sequence that orders the training samples (other streams of a
#: trial's seed: 1 global draws such as dropout, 2 augmentation, 3 cooldown probes).
ORDER_STREAM = 0


def epoch_order(seed: int, epoch: int, num_samples: int) -> np.ndarray:
    """The order in which epoch ``epoch`` of a run seeded ``seed`` visits ``num_samples``
    training samples (an int64 permutation, identical on every rank and machine)."""
    if num_samples < 0:
        raise ValidationError(f"num_samples must be >= 0, got {num_samples}")
    sequence = np.random.SeedSequence([int(seed) & 0xFFFFFFFF, ORDER_STREAM, int(epoch)])
    return np.random.Generator(np.random.PCG64(sequence)).permutation(num_samples)


def split_step(
    global_batch: int,
    world_size: int,
    micro_batch: int | None = None,
    speed_weights: Sequence[float] | None = None,
) -> BatchPlacement:
    """How one step's ``global_batch`` samples are split over ``world_size`` workers.

    Evenly when ``global_batch`` divides by ``world_size`` and no speeds are given; by
    ``speed_weights`` (relative throughputs) when given, falling back to the even rule when a
    share would be empty; otherwise as even as it gets (equal weights: the first ranks take one
    more sample). Raises :class:`PlacementError` when no split exists (fewer samples than
    workers)."""
    if speed_weights is not None:
        try:
            return place_batch(global_batch, world_size, micro_batch, tuple(speed_weights))
        except PlacementError:
            pass  # a share would be empty: the even rule below
    even = None if global_batch % world_size == 0 else (1.0,) * world_size
    return place_batch(global_batch, world_size, micro_batch, even)


def rank_micro_slices(placement: BatchPlacement, rank: int) -> list[tuple[int, int]]:
    """Rank ``rank``'s micro-batches of one step as ``(offset, size)`` within the step's
    samples, one per accumulation pass (a size of 0: no samples in that pass)."""
    offset = sum(placement.local_batches[:rank])
    out = []
    for size in placement.micro_batches[rank]:
        out.append((offset, size))
        offset += size
    return out


@dataclass(frozen=True)
class PlannedStep:
    """One optimizer step of a schedule over a dataset (the same on every rank)."""

    global_step: int
    """0-based over the whole run."""
    epoch: int
    step_in_epoch: int
    steps_in_epoch: int
    stage_index: int
    lr: float
    """``schedule.lr_at(epoch + step_in_epoch / steps_in_epoch)``."""
    start: int
    """Position of the step's first sample in the epoch's order (:func:`epoch_order`)."""
    global_batch: int
    """Samples in this step over all workers (the stage's batch, or fewer for the last step of
    an epoch with ``drop_last`` off)."""

    @property
    def stop(self) -> int:
        return self.start + self.global_batch


def epoch_steps(
    schedule: Schedule,
    num_samples: int,
    epoch: int,
    *,
    drop_last: bool = True,
    start_step: int = 0,
    first_global_step: int | None = None,
) -> Iterator[PlannedStep]:
    """The optimizer steps of epoch ``epoch`` from ``start_step`` on, in order.

    ``first_global_step``: the run's step count before this epoch (computed from the schedule
    when not given)."""
    if not 0 <= epoch < schedule.total_epochs:
        raise ValidationError(f"epoch must be in [0, {schedule.total_epochs - 1}], got {epoch!r}")
    stage = schedule.stage_index_at(epoch)
    batch = schedule.stages[stage].batch_size
    steps = schedule.steps_per_epoch(stage, num_samples, drop_last=drop_last)
    if not 0 <= start_step <= steps:
        raise ValidationError(f"start_step must be in [0, {steps}], got {start_step!r}")
    if first_global_step is None:
        first_global_step = sum(
            schedule.steps_per_epoch(schedule.stage_index_at(e), num_samples, drop_last=drop_last)
            for e in range(epoch)
        )
    for k in range(start_step, steps):
        start = k * batch
        yield PlannedStep(
            global_step=first_global_step + k,
            epoch=epoch,
            step_in_epoch=k,
            steps_in_epoch=steps,
            stage_index=stage,
            lr=schedule.lr_at(epoch + k / steps),
            start=start,
            global_batch=min(batch, num_samples - start),
        )
