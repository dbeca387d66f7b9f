"""The three baselines every study evaluates first (``baselines: true``).

They share one step-decay skeleton (as in Goyal et al. and Smith et al.): the run is cut at
50 % and 75 % of its epochs, and each cut divides the learning rate by :data:`DECAY_FACTOR`.

* ``small_batch``: the base batch size and base LR throughout, with the step decays (the
  schedule the task's defaults describe).
* ``large_batch`` (Goyal et al. 2017): the space's largest batch for the whole run, the LR
  scaled linearly from the base LR (``base_lr x batch / base_batch``, whatever the study's
  scaling rule), reached by a linear warm-up from the base LR over the first ~5 % of the run
  (at least one epoch), then the same step decays.
* ``increase_batch`` (Smith, Kindermans, Le 2017, "don't decay the learning rate, increase
  the batch size"): the small-batch schedule with each LR decay replaced by a batch increase
  of the same factor; once the batch would exceed the space's largest batch it is capped
  there and the rest of that factor is applied to the LR instead.

Baselines are not drawn from the search space (their stages need not fit its ranges) and
are not part of the Optuna study; they are trained and reported like any other trial, and
are the study's result only when no tuned trial beats them.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Final

from tuner.errors import ValidationError
from tuner.schedule import Schedule, Stage, place
from tuner.schedule.stage import lr_scale
from tuner.space import ScheduleSpace
from tuner.spec import BASELINE_NAMES

__all__ = ["DECAY_FACTOR", "DECAY_FRACTIONS", "Baseline", "build_baselines"]

#: The LR decay (resp. batch increase) at each cut of the skeleton.
DECAY_FACTOR: Final = 4
#: Where the skeleton cuts the run, as fractions of its epochs.
DECAY_FRACTIONS: Final = (0.5, 0.75)
#: Warm-up of the large-batch baseline, as a fraction of the run (Goyal: 5 of 90 epochs).
WARMUP_FRACTION: Final = 0.05

DESCRIPTIONS: Final = {
    "small_batch": "base batch and base LR with step decays",
    "large_batch": "largest batch, linearly scaled LR with warm-up (Goyal et al. 2017)",
    "increase_batch": "increase the batch instead of decaying the LR (Smith et al. 2017)",
}


@dataclass(frozen=True)
class Baseline:
    name: str
    description: str
    schedule: Schedule


def skeleton(total_epochs: int) -> list[tuple[int, int]]:
    """The step-decay skeleton's stages ``[(start, end), ...]`` (fewer for very short runs)."""
    cuts = sorted({round(f * total_epochs) for f in DECAY_FRACTIONS} - {0, total_epochs})
    bounds = [0, *cuts, total_epochs]
    return list(itertools.pairwise(bounds))


def _scale(space: ScheduleSpace, batch: int) -> float:
    return lr_scale(space.scaling_rule, batch, space.base_batch_size)


def multiplier_for(space: ScheduleSpace, batch: int, lr: float) -> float:
    """The stage multiplier that gives the absolute LR ``lr`` at ``batch``."""
    return lr / (space.base_lr * _scale(space, batch))


def small_batch(space: ScheduleSpace) -> Schedule:
    base = space.base_batch_size
    stages = [
        Stage(
            start,
            end,
            base,
            lr_multiplier=multiplier_for(space, base, space.base_lr / DECAY_FACTOR**i),
        )
        for i, (start, end) in enumerate(skeleton(space.total_epochs))
    ]
    return space.schedule(stages)


def large_batch(space: ScheduleSpace) -> Schedule:
    batch = space.largest_batch
    peak = space.base_lr * batch / space.base_batch_size  # linear scaling, whatever the rule
    parts = skeleton(space.total_epochs)
    warmup = float(max(1, round(WARMUP_FRACTION * space.total_epochs)))
    stages = [
        Stage(
            start,
            end,
            batch,
            lr_multiplier=multiplier_for(space, batch, peak / DECAY_FACTOR**i),
            warmup_epochs=min(warmup, float(end - start)) if i == 0 else 0.0,
        )
        for i, (start, end) in enumerate(parts)
    ]
    return space.schedule(stages)


def increase_batch(space: ScheduleSpace) -> Schedule:
    base = space.base_batch_size
    cap = max(space.largest_batch, base)
    stages: list[Stage] = []
    for i, (start, end) in enumerate(skeleton(space.total_epochs)):
        wanted = base * DECAY_FACTOR**i
        batch = min(wanted, cap)
        lr = space.base_lr * batch / wanted  # the part of the decay the cap did not absorb
        stages.append(Stage(start, end, batch, lr_multiplier=multiplier_for(space, batch, lr)))
    return space.schedule(stages)


def build_baselines(space: ScheduleSpace, train_size: int | None = None) -> list[Baseline]:
    """The baselines, in :data:`tuner.spec.BASELINE_NAMES` order.

    Raises :class:`ValidationError` if one cannot be trained on the study's workers (e.g. a
    base batch that cannot be split into the micro-batch) or on ``train_size`` samples.
    """
    builders = {
        "small_batch": small_batch,
        "large_batch": large_batch,
        "increase_batch": increase_batch,
    }
    out: list[Baseline] = []
    for name in BASELINE_NAMES:
        schedule = builders[name](space)
        try:
            place(schedule, space.world_size, space.micro_batch)
            if train_size is not None:
                schedule.stage_steps(train_size)
        except ValidationError as exc:
            raise ValidationError(
                f"the {name} baseline cannot run on this study ({exc}); change "
                "schedule.base_batch_size or the resources, or set baselines: false"
            ) from None
        out.append(Baseline(name=name, description=DESCRIPTIONS[name], schedule=schedule))
    return out
