"""The noise-scale candidate: a schedule whose batch follows the measured gradient noise scale.

McCandlish et al. (2018) show that the simple gradient noise scale ``B_noise = tr(Σ) / |G|²``
estimates the critical batch size, the largest batch that still makes near-full use of each
sample, and that it grows during training. The small-batch baseline measures it every epoch
(``noise_scale`` in its results). The engine turns that curve into one schedule of the search
space (:func:`noise_scale_schedule`) and puts it in the search as an ordinary candidate (it
seeds the sampler: enqueued to Optuna with :meth:`ScheduleSpace.params_for`), reported beside
the baselines as ``noise_scale``.

The rule, per epoch ``e``: the space's largest power-of-two batch not above ``B_noise(e)``
(the smallest batch below it and before the first measurement), never decreasing (unless the
space allows it); runs of equal batches are stages; a first stage shorter than the space's
minimum takes the epochs up to it from the stages after it, a later one is merged into the
one before, and while there are more stages than the space allows, the shortest is merged into
its neighbour (keeping the smaller batch: a schedule that grows its batch later is the safer
error). The LR, warm-ups and decay are those the recipe candidates
give their stages (:func:`tuner.recipes.recipe_stages`): the scaling rule's LR for SGD and
LARS (multiplier 1), the square-root rule's for AdamW, a warm-up wherever the LR rises, and
the last stage's decay to zero.

Rounding down, not to the nearest power in log scale (the rule before): at ``B_noise`` steps
and samples trade evenly, and a batch above it buys few steps with many samples, and under
the scaling rule a larger LR jump at the stage boundary. On the quality benchmark's
``mnist1d`` space the nearest power gave ``256@0-3 -> 1024@3-30``, which diverged on one of
the five test seeds (65.99 %; 98.56-98.68 % on the others); rounding down gives ``128@0-3 ->
512@3-10 -> 1024@10-30``, 98.70 +/- 0.14 % in 260 steps, stable on all five. ``tinylm``
and ``denoise`` moved within their seeds' noise (1.92 -> 1.89 nats, 30.01 -> 29.94 dB).

Measured before the candidate took the recipes' LR (nearest powers, multiplier 1 under the
study's rule, no warm-up, the space's first decay shape, ``constant`` in the benchmarks' spaces:
no decay at all), on the quality benchmark's spaces with the five test seeds: ``mnist1d``
``256@0-30``, 95.63 +/- 1.98 % test accuracy in 570 steps (the small batch 98.92 %); ``tinylm``
``32@0-5 -> 64@5-8 -> 256@8-10``, 3.28 +/- 0.19 nats (linear scaling of AdamW's LR; the small
batch 1.98); ``denoise`` ``32@0-4 -> 128@4-6 -> 512@6-8`` diverged on every seed (16x the LR at
batch 512). See ``bench/README.md`` for the figures with the recipes' conventions.

The same curve gives the step floor (:func:`noise_scale_step_floor`): the fewest steps, at
any batch, that match the small batch's progress in McCandlish et al.'s model, and so the
most any schedule could cut its steps by. On the quality benchmark's spaces
(``bench/noise_candidate.py``) ``mnist1d`` allows about 27x, ``tinylm`` and ``denoise``
about 2.3x: there "the small batch's figure at 5x fewer steps" is beyond what the measured
noise allows. The study summary and the
study page show it (:func:`step_floor_text`), with a warning when a step cap is below it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tuner.recipes import recipe_stages
from tuner.schedule import Schedule
from tuner.space import ScheduleSpace

__all__ = [
    "NOISE_SCALE",
    "StepFloor",
    "noise_scale_batches",
    "noise_scale_schedule",
    "noise_scale_step_floor",
    "step_floor_of_epochs",
    "step_floor_text",
]

#: The candidate's name where baselines' names are shown.
NOISE_SCALE = "noise_scale"


def noise_scale_batches(space: ScheduleSpace, noise: Sequence[float | None]) -> list[int]:
    """One batch per epoch of the run, from the measured noise scale per epoch (epochs without
    a measurement keep the previous batch)."""
    sizes = space.batch_sizes
    batches: list[int] = []
    current = sizes[0]
    for e in range(space.total_epochs):
        value = noise[e] if e < len(noise) else None
        if value is not None and math.isfinite(value) and value > 0:
            # The largest batch not above the noise scale (the smallest when all are).
            current = max((b for b in sizes if b <= value), default=sizes[0])
        if batches and not space.allow_decreasing_batch:
            current = max(current, batches[-1])
        batches.append(current)
    return batches


def noise_scale_schedule(space: ScheduleSpace, noise: Sequence[float | None]) -> Schedule | None:
    """The candidate schedule (see the module docstring); ``None`` without any measurement."""
    if not any(v is not None and math.isfinite(v) and v > 0 for v in noise):
        return None
    batches = noise_scale_batches(space, noise)
    runs: list[list[int]] = []  # [start, end, batch]
    for e, b in enumerate(batches):
        if runs and runs[-1][2] == b:
            runs[-1][1] = e + 1
        else:
            runs.append([e, e + 1, b])

    def merge(i: int, into: int) -> None:
        keep = min(runs[i][2], runs[into][2])
        lo, hi = min(i, into), max(i, into)
        runs[lo] = [runs[lo][0], runs[hi][1], keep]
        del runs[hi]

    # A first stage too short takes the epochs up to the space's minimum from the stages after
    # it (merging it whole into the next would drop the rest of the curve: on mnist1d two
    # epochs at the first batch, then larger ones for 28, became the first batch throughout).
    first_end = runs[0][0] + space.min_stage_epochs
    if len(runs) > 1 and runs[0][1] < first_end:
        runs[0][1] = first_end
        while len(runs) > 1 and runs[1][1] <= first_end:
            del runs[1]
        if len(runs) > 1:
            runs[1][0] = first_end
    i = 1
    while i < len(runs):  # too short: into the stage before
        if runs[i][1] - runs[i][0] < space.min_stage_epochs:
            merge(i, i - 1)
        else:
            i += 1
    while len(runs) > space.stages_max:
        shortest = min(range(len(runs)), key=lambda k: (runs[k][1] - runs[k][0], k))
        merge(shortest, shortest - 1 if shortest > 0 else 1)
    while len(runs) < space.stages_min:  # a space that wants more stages: split the longest
        k = max(range(len(runs)), key=lambda j: (runs[j][1] - runs[j][0], -j))
        start, end, batch = runs[k]
        if end - start < 2 * space.min_stage_epochs:
            return None
        cut = start + (end - start) // 2
        runs[k : k + 1] = [[start, cut, batch], [cut, end, batch]]
    stages = recipe_stages(space, [(start, end, batch) for start, end, batch in runs])
    return space.schedule(stages, label_smoothing=space.label_smoothing[0])


@dataclass(frozen=True, slots=True)
class StepFloor:
    """What a run's measured noise scale says about how few steps could match it.

    ``floor`` is McCandlish et al.'s minimum number of steps (at an unbounded batch) for the
    progress the run made; ``steps`` the run's own steps; ``ratio`` = steps / floor, the most a
    schedule could cut the run's steps by and still match it; ``measured_epochs`` of the
    run's ``epochs`` had a usable measurement.
    """

    floor: float
    steps: int
    measured_epochs: int
    epochs: int

    @property
    def ratio(self) -> float:
        return self.steps / self.floor if self.floor > 0 else math.inf

    def to_dict(self, step_cap: int | None = None) -> dict[str, Any]:
        """JSON-ready, with a study's step cap (``objective.max_steps``) if it has one and
        whether that cap is below the floor (the best schedule will likely fall short)."""
        return {
            "floor": round(self.floor, 1),
            "steps": self.steps,
            "ratio": round(self.ratio, 3),
            "measured_epochs": self.measured_epochs,
            "epochs": self.epochs,
            "step_cap": step_cap,
            "cap_below_floor": step_cap is not None and step_cap < self.floor,
        }


def noise_scale_step_floor(
    epochs: Sequence[tuple[int | None, int | None, float | None]],
) -> StepFloor | None:
    """The fewest steps that could match a run's progress, from its measured noise scale.

    ``epochs``: per epoch of the run, in order, ``(batch, cumulative steps at its end, noise
    scale measured at its end)``, as a trial reports them (``batch_size``, ``steps``,
    ``noise_scale``). McCandlish et al. (2018, eq. 2.11): a step at batch ``B`` makes
    ``1 / (1 + B_noise / B)`` of the progress of a step at an unbounded batch, so the run's
    progress is worth ``S_min = sum over epochs of steps_e / (1 + B_noise_e / B_e)`` steps at
    best, and no batch schedule matches that progress in fewer steps (each step is worth one
    at most). An epoch without a usable measurement (none, or the estimate undefined: a
    gradient too noisy to measure, so ``B_noise`` far above the batch) adds nothing, and each
    epoch takes the value measured at its end (the noise scale mostly grows within an epoch),
    so the floor leans low: a floor above a step budget is a real warning, one below it no
    promise. Two caveats: the simple noise scale estimates the critical batch only up to the
    loss's conditioning, and the model is SGD's (the tasks on AdamW follow it only roughly).
    ``None`` when no epoch has a measurement.
    """
    floor = 0.0
    before = 0
    measured = 0
    for batch, steps, noise in epochs:
        if steps is None:
            continue
        taken = steps - before
        before = steps
        if batch is None or batch <= 0 or taken <= 0:
            continue
        if noise is None or not math.isfinite(noise) or noise <= 0:
            continue
        measured += 1
        floor += taken / (1.0 + noise / batch)
    if measured == 0:
        return None
    return StepFloor(floor=floor, steps=before, measured_epochs=measured, epochs=len(epochs))


class _EpochReport(Protocol):
    @property
    def epoch(self) -> int: ...
    @property
    def batch_size(self) -> int | None: ...
    @property
    def steps(self) -> int | None: ...
    @property
    def noise_scale(self) -> float | None: ...


def step_floor_of_epochs(epochs: Sequence[_EpochReport]) -> StepFloor | None:
    """:func:`noise_scale_step_floor` of a trial's stored per-epoch metrics
    (:class:`tuner.store.EpochMetrics`, by epoch); ``None`` unless every epoch from 0 is there
    (the floor sums each epoch's steps: a gap would count several epochs' steps as one's)."""
    if [m.epoch for m in epochs] != list(range(len(epochs))):
        return None
    return noise_scale_step_floor([(m.batch_size, m.steps, m.noise_scale) for m in epochs])


def step_floor_text(floor: Mapping[str, Any], trial: int, *, running: bool = False) -> str:
    """The sentence the study page and the CLI show for :meth:`StepFloor.to_dict` of the
    small-batch baseline (trial number ``trial``; ``running``: its curve so far)."""
    so_far = " so far" if running else ""
    text = (
        f"Step floor: by its measured noise scale (McCandlish et al.), the progress the small "
        f"batch (#{trial}) made in {floor['steps']:,} steps{so_far} takes at least "
        f"~{round(floor['floor']):,} steps at any batch: a schedule can cut its steps by "
        f"{floor['ratio']:.1f}x at most and still match it."
    )
    cap = floor.get("step_cap")
    if cap is not None:
        text += (
            f" This study's step cap ({cap:,}) is below the floor: expect its best schedule to "
            "fall short of the small batch."
            if floor.get("cap_below_floor")
            else f" This study's step cap ({cap:,}) is above it."
        )
    return text
