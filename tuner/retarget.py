"""Re-targeting a schedule to other hardware: same global batches and LRs, new placement.

A schedule's batch sizes are *global* (samples per optimizer step summed over all workers and
accumulation micro-batches), so moving it from the 2 workers it was tuned on to 8 (or to 1)
changes nothing about the optimisation: every optimizer step sees the same number of samples
at the same LR. Only the per-worker work changes: each stage's global batch is split again
into local batches and gradient-accumulation micro-batches by :func:`tuner.schedule.place`.

This module is pure arithmetic (no torch); :mod:`tuner.runtime` builds on it.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from tuner.schedule import (
    BatchPlacement,
    PlacementError,
    PlacementHint,
    Schedule,
    StagePlacement,
    StepInfo,
    place,
    place_batch,
)

__all__ = [
    "RetargetError",
    "RetargetedSchedule",
    "StepPlacement",
    "describe_target",
    "retarget",
]


def describe_target(
    world_size: int, micro_batch: int | None, speed_weights: Sequence[float] | None = None
) -> str:
    """``"8 workers, micro-batch 32"``: a placement target for messages."""
    workers = "1 worker" if world_size == 1 else f"{world_size} workers"
    micro = "no gradient accumulation" if micro_batch is None else f"micro-batch {micro_batch}"
    weights = (
        ""
        if speed_weights is None
        else ", speed weights " + ":".join(f"{w:g}" for w in speed_weights)
    )
    return f"{workers}, {micro}{weights}"


class RetargetError(PlacementError):
    """The schedule cannot run on the target; ``problems`` names every stage and why."""

    def __init__(
        self, target: str, problems: str | Sequence[str], advice: Sequence[str] = ()
    ) -> None:
        super().__init__(problems)
        self.target = target
        self.advice = tuple(advice)
        tail = "".join(f"; {a}" for a in self.advice)
        self.args = (f"cannot re-target the schedule to {target}: {self.args[0]}{tail}",)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.target, list(self.problems), list(self.advice)))


@dataclass(frozen=True)
class StepPlacement:
    """One optimizer step of a re-targeted schedule: the step and how its batch is placed."""

    step: StepInfo
    placement: BatchPlacement


@dataclass(frozen=True)
class RetargetedSchedule:
    """A schedule placed on ``world_size`` workers with at most ``micro_batch`` per pass.

    ``schedule`` has the same stages and run-wide settings as the input (so the same global
    batch and LR at every step) and its ``placement`` hint set to the target; its provenance
    (including the placement it was tuned on) is kept. ``stages[i]`` is stage ``i``'s
    placement.
    """

    schedule: Schedule
    world_size: int
    micro_batch: int | None
    speed_weights: tuple[float, ...] | None
    stages: tuple[StagePlacement, ...]
    source: PlacementHint | None
    """The placement hint of the input schedule (what it was tuned on or last targeted)."""

    @property
    def target(self) -> str:
        return describe_target(self.world_size, self.micro_batch, self.speed_weights)

    def placement(self, stage_index: int) -> BatchPlacement:
        """Stage ``stage_index``'s (0-based) placement."""
        return self.stages[stage_index].placement

    def step_placement(self, batch_size: int, stage_index: int) -> BatchPlacement:
        """The placement of one step of ``batch_size`` samples in stage ``stage_index``.

        A full step uses the stage's placement; the smaller last step of an epoch (with
        ``drop_last=False``) is placed on its own and may need fewer accumulation passes.
        """
        full = self.stages[stage_index].placement
        if batch_size == full.global_batch:
            return full
        try:
            return place_batch(batch_size, self.world_size, self.micro_batch, self.speed_weights)
        except PlacementError as exc:
            raise RetargetError(
                self.target,
                [
                    f"the last, partial step of each epoch of stage {stage_index + 1} ({p})"
                    f"; use drop_last=True"
                    for p in exc.problems
                ],
            ) from None

    def iter_steps(self, dataset_size: int, *, drop_last: bool = True) -> Iterator[StepPlacement]:
        """Every optimizer step with its placement (see :meth:`Schedule.iter_steps`)."""
        for step in self.schedule.iter_steps(dataset_size, drop_last=drop_last):
            yield StepPlacement(step, self.step_placement(step.batch_size, step.stage_index))

    def describe(self) -> list[str]:
        """One human-readable line per stage: global batch = workers x local, accumulation."""
        lines = [f"placement for {self.target}:"]
        for sp, st in zip(self.stages, self.schedule.stages, strict=True):
            p = sp.placement
            local = (
                f"{len(p.local_batches)} x {p.local_batches[0]}"
                if len(set(p.local_batches)) == 1
                else "+".join(str(b) for b in p.local_batches)
            )
            largest = p.max_micro_batch
            lines.append(
                f"  stage {sp.stage_index + 1} (epochs {st.start_epoch}-{st.end_epoch}): global "
                f"batch {p.global_batch} = {local} per worker, {p.accumulation_steps} "
                f"accumulation step(s) of at most {largest}, peak LR "
                f"{self.schedule.peak_lr(sp.stage_index):.6g}"
            )
        return lines

    def to_yaml(self) -> str:
        """The re-targeted schedule document with the per-stage placement as comments."""
        from tuner.export import PROVENANCE_SOURCE, render_yaml

        prov = self.schedule.provenance or {}
        return render_yaml(
            self.schedule,
            comments=[
                "Re-targeted " + line if i == 0 else line for i, line in enumerate(self.describe())
            ],
            export=prov.get("source") == PROVENANCE_SOURCE,
        )


def retarget(
    schedule: Schedule,
    world_size: int,
    micro_batch: int | None = None,
    speed_weights: Sequence[float] | None = None,
) -> RetargetedSchedule:
    """Place ``schedule`` on ``world_size`` workers, keeping every global batch and LR.

    Each stage's local batches and gradient-accumulation steps are recomputed with
    :func:`tuner.schedule.place` (``micro_batch``: the most samples one worker processes per
    forward/backward pass, None for no accumulation; ``speed_weights``: relative worker
    throughputs for an uneven split). Raises :class:`RetargetError` naming every stage that
    cannot be placed and why.
    """
    weights = None if speed_weights is None else tuple(float(w) for w in speed_weights)
    target = describe_target(world_size, micro_batch, weights)
    try:
        stages = place(schedule, world_size, micro_batch, weights)
    except PlacementError as exc:
        advice = _what_would_work(schedule, world_size, micro_batch, weights)
        raise RetargetError(target, exc.problems, advice) from None
    hint = PlacementHint(world_size=world_size, micro_batch=micro_batch)
    return RetargetedSchedule(
        schedule=replace(schedule, placement=hint),
        world_size=world_size,
        micro_batch=micro_batch,
        speed_weights=weights,
        stages=tuple(stages),
        source=schedule.placement,
    )


def _placeable(
    schedule: Schedule, world_size: int, micro_batch: int | None, weights: Sequence[float] | None
) -> bool:
    try:
        place(schedule, world_size, micro_batch, weights)
    except PlacementError:
        return False
    return True


def _what_would_work(
    schedule: Schedule,
    world_size: int,
    micro_batch: int | None,
    weights: Sequence[float] | None,
    show: int = 6,
) -> list[str]:
    """What to change when a target does not fit: the micro-batch sizes that would work on
    ``world_size`` workers, else the world sizes (up to the one asked for) that would."""
    if weights is None and _placeable(schedule, world_size, None, None):
        smallest = min(st.batch_size for st in schedule.stages) // world_size
        micros = [m for m in range(smallest, 0, -1) if _placeable(schedule, world_size, m, None)]
        if micros:
            listed = ", ".join(str(m) for m in micros[:show])
            more = ", ..." if len(micros) > show else ""
            return [f"micro-batch sizes that work on {world_size} workers: {listed}{more}"]
    if weights is not None:
        return []
    worlds = [w for w in range(world_size, 0, -1) if _placeable(schedule, w, micro_batch, None)]
    if not worlds:
        return []
    listed = ", ".join(str(w) for w in worlds[:show])
    more = ", ..." if len(worlds) > show else ""
    smallest = min(st.batch_size for st in schedule.stages)
    return [
        f"world sizes up to {world_size} that work"
        f"{'' if micro_batch is None else f' with micro-batch {micro_batch}'}: {listed}{more} "
        f"(the schedule's smallest global batch is {smallest}; for more workers, tune with "
        "larger batches)"
    ]
