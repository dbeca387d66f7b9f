"""Placement: how a global batch is split over data-parallel workers.

:func:`place_batch` splits one global batch (samples per optimizer step) over ``world_size``
workers, evenly or in proportion to per-rank speed weights, and each worker's share into
gradient-accumulation micro-batches of at most ``micro_batch`` samples
(:class:`BatchPlacement`); :func:`place` does it for every stage of a schedule
(:class:`StagePlacement`). A batch that cannot be placed raises :class:`PlacementError`
saying why. Worker ranks are 0-based like ``torch.distributed`` ranks.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import cast

from tuner.schedule.model import Schedule
from tuner.schedule.values import (
    MAX_ACCUMULATION_STEPS,
    MAX_BATCH_SIZE,
    MAX_PLACEMENT_ENTRIES,
    MAX_WORLD_SIZE,
    _is_int,
    _norm_int,
    _ProblemsError,
    _show,
    _stage_label,
    _to_float,
)


class PlacementError(_ProblemsError):
    """A global batch cannot be placed on the workers; ``problems`` lists why."""


@dataclass(frozen=True)
class BatchPlacement:
    """How one global batch is split over workers and gradient-accumulation micro-batches.

    ``local_batches[r]`` is rank ``r``'s samples per optimizer step (they sum to
    ``global_batch``). Every worker runs ``accumulation_steps`` forward/backward passes per
    optimizer step; ``micro_batches[r]`` are rank ``r``'s pass sizes, which sum to its local
    batch and differ by at most one. With uneven speed weights a slow worker's micro-batch
    may be 0 (it then skips the forward/backward of that pass but still joins the
    all-reduce).
    """

    global_batch: int
    local_batches: tuple[int, ...]
    accumulation_steps: int
    micro_batches: tuple[tuple[int, ...], ...]

    @property
    def world_size(self) -> int:
        return len(self.local_batches)

    @property
    def max_micro_batch(self) -> int:
        """The largest micro-batch any worker runs (its memory need)."""
        return max(max(mb) for mb in self.micro_batches)

    @property
    def gradient_weights(self) -> tuple[float, ...]:
        """``local_batches[r] / global_batch``: weight rank ``r``'s mean-loss gradient by this
        and *sum* over ranks to get the mean gradient over the global batch (with equal local
        batches this equals averaging)."""
        return tuple(b / self.global_batch for b in self.local_batches)


@dataclass(frozen=True)
class StagePlacement:
    """The placement of one stage's global batch (``stage_index`` is 0-based)."""

    stage_index: int
    placement: BatchPlacement


def place_batch(
    global_batch: int,
    world_size: int,
    micro_batch: int | None = None,
    speed_weights: Sequence[float] | None = None,
) -> BatchPlacement:
    """Split ``global_batch`` samples over ``world_size`` workers.

    Without ``speed_weights`` the global batch must divide evenly by ``world_size``. With them
    (one positive finite relative throughput per rank) each rank gets a share proportional to
    its weight, rounded by largest remainder (ties to the lower rank) so the local batches sum
    exactly to the global batch; every rank must get at least one sample.

    ``accumulation_steps`` is ``ceil(max(local) / micro_batch)`` (1 when ``micro_batch`` is
    None); each rank's local batch is split into that many micro-batches as evenly as possible
    (each at most ``micro_batch``; a slow rank's micro-batch may be 0).

    Raises PlacementError saying why the batch cannot be placed.
    """
    global_batch = cast(int, _norm_int(global_batch))
    world_size = cast(int, _norm_int(world_size))
    micro_batch = cast("int | None", _norm_int(micro_batch))
    problems: list[str] = []
    if not _is_int(global_batch) or not 1 <= global_batch <= MAX_BATCH_SIZE:
        problems.append(
            f"global batch must be an integer in [1, {MAX_BATCH_SIZE}], got {_show(global_batch)}"
        )
    weights = _check_placement_args(world_size, micro_batch, speed_weights, problems)
    if problems:
        raise PlacementError(problems)

    if global_batch < world_size:
        raise PlacementError(
            f"global batch {global_batch} cannot give each of {world_size} workers at least one "
            f"sample; use a global batch of at least {world_size} or fewer workers"
        )
    if weights is None:
        if global_batch % world_size:
            lower = global_batch // world_size * world_size
            raise PlacementError(
                f"global batch {global_batch} does not divide evenly across {world_size} "
                f"workers; use a multiple of {world_size} (e.g. {lower} or "
                f"{lower + world_size}) or pass speed_weights for an uneven split"
            )
        local = (global_batch // world_size,) * world_size
    else:
        local = _largest_remainder(global_batch, weights)
        empty = [r for r, b in enumerate(local) if b == 0]
        if empty:
            ranks = ", ".join(str(r) for r in empty)
            which = "rank" if len(empty) == 1 else "ranks"
            raise PlacementError(
                f"with speed_weights, {which} {ranks} would get 0 of the {global_batch} samples "
                f"(their share of the total weight is below one sample); every worker needs "
                f"at least one: raise the global batch, or drop the slowest workers"
            )

    biggest = max(local)
    steps = 1 if micro_batch is None else -(-biggest // micro_batch)
    if steps > MAX_ACCUMULATION_STEPS:
        raise PlacementError(
            f"a local batch of {biggest} at micro_batch {micro_batch} needs {steps} "
            f"accumulation steps, more than the maximum {MAX_ACCUMULATION_STEPS} "
            "(MAX_ACCUMULATION_STEPS); raise micro_batch or add workers"
        )
    if steps * world_size > MAX_PLACEMENT_ENTRIES:
        raise PlacementError(
            f"{world_size} workers x {steps} accumulation steps is more than "
            f"{MAX_PLACEMENT_ENTRIES} micro-batches; raise micro_batch"
        )
    cache: dict[int, tuple[int, ...]] = {}
    micro: list[tuple[int, ...]] = []
    for b in local:
        split = cache.get(b)
        if split is None:
            q, r = divmod(b, steps)
            split = (q + 1,) * r + (q,) * (steps - r)
            cache[b] = split
        micro.append(split)
    return BatchPlacement(
        global_batch=global_batch,
        local_batches=local,
        accumulation_steps=steps,
        micro_batches=tuple(micro),
    )


def _check_placement_args(
    world_size: int,
    micro_batch: int | None,
    speed_weights: Sequence[float] | None,
    problems: list[str],
) -> tuple[float, ...] | None:
    """Check the arguments shared by all stages; return the weights as floats (or None)."""
    if not _is_int(world_size) or not 1 <= world_size <= MAX_WORLD_SIZE:
        problems.append(
            f"world_size must be an integer in [1, {MAX_WORLD_SIZE}], got {_show(world_size)}"
        )
    if micro_batch is not None and (not _is_int(micro_batch) or micro_batch < 1):
        problems.append(f"micro_batch must be a positive integer or None, got {_show(micro_batch)}")
    if speed_weights is None:
        return None
    return _check_weights(speed_weights, world_size, problems)


def _check_weights(
    speed_weights: Iterable[float], world_size: int, problems: list[str]
) -> tuple[float, ...] | None:
    try:
        raw = tuple(speed_weights)
    except TypeError:
        problems.append(
            f"speed_weights must be a sequence of numbers, one per worker, got "
            f"{_show(speed_weights)}"
        )
        return None
    bad = False
    values: list[float] = []
    for r, w in enumerate(raw):
        value = _to_float(w)
        if value is None or not math.isfinite(value) or value <= 0:
            problems.append(
                f"speed_weights[{r}] must be a finite number > 0 (rank {r}'s relative "
                f"throughput), got {_show(w)}"
            )
            bad = True
        else:
            values.append(value)
    if _is_int(world_size) and len(raw) != world_size:
        problems.append(
            f"speed_weights has {len(raw)} entries but world_size is {world_size}: give one "
            "weight per worker, in rank order"
        )
        bad = True
    return None if bad else tuple(values)


def _largest_remainder(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """Integer shares of ``total`` proportional to ``weights`` (exact arithmetic)."""
    fw = [Fraction(w) for w in weights]
    wsum = sum(fw, Fraction(0))
    ideal = [total * w / wsum for w in fw]
    floors = [math.floor(x) for x in ideal]
    left = total - sum(floors)
    order = sorted(range(len(ideal)), key=lambda r: (-(ideal[r] - floors[r]), r))
    for r in order[:left]:
        floors[r] += 1
    return tuple(floors)


def place(
    schedule: Schedule,
    world_size: int,
    micro_batch: int | None = None,
    speed_weights: Sequence[float] | None = None,
) -> list[StagePlacement]:
    """:func:`place_batch` for every stage of ``schedule``, in stage order.

    Raises PlacementError naming every stage that cannot be placed and why.
    """
    world_size = cast(int, _norm_int(world_size))
    micro_batch = cast("int | None", _norm_int(micro_batch))
    common: list[str] = []
    _check_placement_args(world_size, micro_batch, speed_weights, common)
    if common:
        raise PlacementError(common)
    out: list[StagePlacement] = []
    problems: list[str] = []
    for i, st in enumerate(schedule.stages):
        try:
            out.append(
                StagePlacement(
                    i, place_batch(st.batch_size, world_size, micro_batch, speed_weights)
                )
            )
        except PlacementError as exc:
            label = _stage_label(i, st.start_epoch, st.end_epoch)
            problems.extend(f"{label}: {p}" for p in exc.problems)
    if problems:
        raise PlacementError(problems)
    return out
