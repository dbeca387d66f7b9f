"""The search space as an Optuna define-by-run function that yields a valid :class:`Schedule`.

A variable number of stages is a conditional space: the function first draws ``n_stages``
and then the parameters of that many stages. Validity is built into the sampling, never
checked and rejected afterwards:

* **Boundaries** (whole epochs, each stage at least ``min_stage_epochs`` long): every stage
  gets the minimum length, and the slack ``total - n * min`` is split by stick-breaking. The
  share ``u_i`` in [0, 1] of stage ``i`` is mapped through the inverse CDF of
  ``Beta(1, m)`` (``m`` = stages after it), so uniformly drawn shares give stage lengths
  uniform over the simplex and every draw gives ordered, contiguous boundaries.
* **Batch sizes** are powers of two ``2**e``; stage 0 draws ``e`` from the space's range and
  each later stage from ``[previous e, max]`` (non-decreasing by construction); with
  ``allow_decreasing_batch`` each stage draws from the whole range.
* **LR multipliers** are log-uniform in ``[min, max]``; 1 is the LR the scaling rule gives
  for the stage's batch size (the prior), so the range is centred on it in log space. A bound
  the spec leaves at its default is widened so that both the linear and the square-root
  rule's LR at the largest batch are inside (:func:`lr_multiplier_range`).
* **Warm-up** epochs are uniform in ``[min, max]``, clipped to the stage's length.
* **A step cap** (the objective's ``max_steps``, :class:`StepCap`) is built in the same way:
  each stage draws its batch only from the sizes with which the run can still meet the cap
  (the stages after it at the space's largest batch), so every draw meets it. Rejecting the
  draws over the cap instead wastes the sampler's random start-up on them: under a tight cap
  most random schedules break it, the few that pass fix the model's first picture, and the
  LR multipliers are never explored (a 40-step cap on ``tinylm``: 16 of 28 draws rejected,
  every kept one's multiplier above 0.69 of a range 0.062-4).

Parameter names (as Optuna and optuna-dashboard show them): ``n_stages``, ``share_<i>``,
``batch_exp_<i>``, ``lr_mult_<i>``, ``warmup_<i>``, ``decay_<i>`` (only with more than one
decay choice), ``label_smoothing`` (only with more than one choice); ``i`` is 0-based.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, cast

from tuner.errors import ValidationError
from tuner.schedule import PlacementHint, Schedule, Stage
from tuner.spec import (
    DEFAULT_LR_MULTIPLIER,
    AccuracyObjective,
    LrMultiplierRange,
    ResolvedSpec,
    StageDecay,
    min_stage_epochs,
)

__all__ = [
    "ScheduleSpace",
    "StepCap",
    "SuggestTrial",
    "check_feasible",
    "constraint_violations",
    "lr_multiplier_grid",
    "lr_multiplier_range",
    "violated_constraints",
    "warmup_grid",
]


class SuggestTrial(Protocol):
    """The part of ``optuna.Trial`` the define-by-run function uses."""

    def suggest_int(self, name: str, low: int, high: int) -> int: ...

    def suggest_float(self, name: str, low: float, high: float, *, log: bool = False) -> float: ...

    def suggest_categorical(self, name: str, choices: Sequence[Any]) -> Any: ...


@dataclass(frozen=True)
class StepCap:
    """At most ``max_steps`` optimizer steps over the run on ``train_size`` training samples
    (an epoch at batch ``b`` has ``train_size // b`` steps, as :meth:`Schedule.total_steps`)."""

    max_steps: int
    train_size: int

    @classmethod
    def of(cls, objective: object, train_size: int | None) -> StepCap | None:
        """The cap of an objective with ``max_steps`` (None without one, or without the
        training-set size)."""
        if not isinstance(objective, AccuracyObjective) or objective.max_steps is None:
            return None
        if train_size is None:
            return None
        return cls(objective.max_steps, train_size)

    def steps(self, batch: int, epochs: int) -> int:
        return (self.train_size // batch) * epochs


@dataclass(frozen=True)
class ScheduleSpace:
    """Everything needed to draw schedules; built from a resolved spec by :meth:`from_spec`."""

    total_epochs: int
    base_lr: float
    base_batch_size: int
    scaling_rule: Literal["none", "linear", "sqrt"]
    optimizer: Literal["sgd", "adamw", "lars"]
    momentum: float
    weight_decay: float
    stages_min: int
    stages_max: int
    min_stage_epochs: int
    batch_exp_min: int
    batch_exp_max: int
    lr_mult_min: float
    lr_mult_max: float
    warmup_min: float
    warmup_max: float
    label_smoothing: tuple[float, ...]
    decays: tuple[StageDecay, ...]
    allow_decreasing_batch: bool
    world_size: int
    micro_batch: int | None

    # ------------------------------------------------------------------ construction

    @classmethod
    def from_spec(cls, resolved: ResolvedSpec) -> ScheduleSpace:
        """The space of a resolved spec; :class:`ValidationError` if it holds no schedule."""
        spec = resolved.spec
        space = spec.space
        epochs = resolved.total_epochs
        min_len = min_stage_epochs(space.min_stage_fraction, epochs)
        fit = epochs // min_len
        if space.stages.min > fit:
            raise ValidationError(
                f"the search space is empty: {space.stages.min} stages of at least {min_len} "
                f"epoch(s) do not fit in {epochs} epochs; lower space.stages.min or "
                "space.min_stage_fraction"
            )
        unit = spec.resources.batch_unit
        if unit & (unit - 1):
            raise ValidationError(
                f"the search space is empty: batch sizes are powers of two and none is a "
                f"multiple of workers x micro_batch = {unit}; use a power-of-two number of "
                "workers and micro-batch"
            )
        lo_exp = max(_ceil_log2(resolved.batch_min), unit.bit_length() - 1)
        hi_exp = _floor_log2(resolved.batch_max)
        if lo_exp > hi_exp:
            raise ValidationError(
                f"the search space is empty: no power of two in [{resolved.batch_min}, "
                f"{resolved.batch_max}] is a multiple of workers x micro_batch = {unit}; "
                f"widen space.batch_size (e.g. max: {max(unit, 1 << lo_exp)})"
            )
        mult_low, mult_high = lr_multiplier_range(
            space.lr_multiplier,
            spec.schedule.scaling_rule,
            (1 << hi_exp) / resolved.base_batch_size,
        )
        return cls(
            total_epochs=epochs,
            base_lr=resolved.base_lr,
            base_batch_size=resolved.base_batch_size,
            scaling_rule=spec.schedule.scaling_rule,
            optimizer=resolved.optimizer,
            momentum=resolved.momentum,
            weight_decay=resolved.weight_decay,
            stages_min=space.stages.min,
            stages_max=min(space.stages.max, fit),
            min_stage_epochs=min_len,
            batch_exp_min=lo_exp,
            batch_exp_max=hi_exp,
            lr_mult_min=mult_low,
            lr_mult_max=mult_high,
            warmup_min=space.warmup_epochs.min,
            warmup_max=space.warmup_epochs.max,
            label_smoothing=tuple(space.label_smoothing),
            decays=tuple(space.decay),
            allow_decreasing_batch=space.allow_decreasing_batch,
            world_size=spec.resources.workers,
            micro_batch=spec.resources.micro_batch,
        )

    # ------------------------------------------------------------------ properties

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        """Every batch size a stage can get, ascending."""
        return tuple(1 << e for e in range(self.batch_exp_min, self.batch_exp_max + 1))

    @property
    def smallest_batch(self) -> int:
        return 1 << self.batch_exp_min

    @property
    def largest_batch(self) -> int:
        return 1 << self.batch_exp_max

    def describe(self) -> dict[str, Any]:
        """The resolved ranges, for the study summary and logs."""
        return {
            "total_epochs": self.total_epochs,
            "stages": [self.stages_min, self.stages_max],
            "min_stage_epochs": self.min_stage_epochs,
            "batch_sizes": list(self.batch_sizes),
            "lr_multiplier": [self.lr_mult_min, self.lr_mult_max],
            "warmup_epochs": [self.warmup_min, self.warmup_max],
            "label_smoothing": list(self.label_smoothing),
            "decay": list(self.decays),
            "allow_decreasing_batch": self.allow_decreasing_batch,
        }

    # ------------------------------------------------------------------ sampling

    def sample(self, trial: SuggestTrial, cap: StepCap | None = None) -> Schedule:
        """Draw one schedule through ``trial`` (define-by-run); always a valid Schedule, and
        within ``cap`` when the space's largest batch meets it (:class:`StepCap`)."""
        n = self._suggest_int(trial, "n_stages", self.stages_min, self.stages_max)
        lengths = self._sample_lengths(trial, n)

        exps: list[int] = []
        spent = 0
        for i in range(n):
            low = self.batch_exp_min
            if i > 0 and not self.allow_decreasing_batch:
                low = exps[-1]
            if cap is not None:
                low = self._capped_low(cap, low, lengths[i], sum(lengths[i + 1 :]), spent)
            exps.append(self._suggest_int(trial, f"batch_exp_{i}", low, self.batch_exp_max))
            if cap is not None:
                spent += cap.steps(1 << exps[-1], lengths[i])

        label_smoothing = self.label_smoothing[0]
        if len(self.label_smoothing) > 1:
            label_smoothing = float(
                trial.suggest_categorical("label_smoothing", list(self.label_smoothing))
            )

        stages: list[Stage] = []
        start = 0
        for i, (length, exp) in enumerate(zip(lengths, exps, strict=True)):
            mult = self.lr_mult_min
            if self.lr_mult_min < self.lr_mult_max:
                mult = lr_multiplier_grid(
                    trial.suggest_float(
                        f"lr_mult_{i}", self.lr_mult_min, self.lr_mult_max, log=True
                    ),
                    self.lr_mult_min,
                    self.lr_mult_max,
                )
            warmup = self.warmup_min
            if self.warmup_min < self.warmup_max:
                warmup = warmup_grid(
                    trial.suggest_float(f"warmup_{i}", self.warmup_min, self.warmup_max),
                    self.warmup_min,
                    self.warmup_max,
                )
            decay: StageDecay = self.decays[0]
            if len(self.decays) > 1:
                decay = cast(StageDecay, trial.suggest_categorical(f"decay_{i}", list(self.decays)))
            stages.append(
                Stage(
                    start_epoch=start,
                    end_epoch=start + length,
                    batch_size=1 << exp,
                    lr_multiplier=mult,
                    warmup_epochs=min(warmup, float(length)),
                    decay=decay,
                )
            )
            start += length
        return self.schedule(stages, label_smoothing=label_smoothing)

    def schedule(self, stages: Sequence[Stage], *, label_smoothing: float = 0.0) -> Schedule:
        """A schedule of ``stages`` with this space's run-wide settings."""
        return Schedule(
            stages=tuple(stages),
            base_lr=self.base_lr,
            base_batch_size=self.base_batch_size,
            scaling_rule=self.scaling_rule,
            optimizer=self.optimizer,
            momentum=self.momentum,
            weight_decay=self.weight_decay,
            label_smoothing=label_smoothing,
            allow_decreasing_batch=self.allow_decreasing_batch,
            placement=PlacementHint(world_size=self.world_size, micro_batch=self.micro_batch),
        )

    def params_for(self, schedule: Schedule, cap: StepCap | None = None) -> dict[str, Any] | None:
        """The Optuna parameters under which :meth:`sample` (with ``cap``) draws ``schedule``
        (to enqueue a schedule built outside the sampler, e.g. the noise-scale candidate), or
        ``None`` if the space cannot draw it (checked by drawing it back)."""
        stages = schedule.stages
        n = len(stages)
        if not self.stages_min <= n <= self.stages_max:
            return None
        params: dict[str, Any] = {}
        if self.stages_min < self.stages_max:
            params["n_stages"] = n
        remaining = self.total_epochs - n * self.min_stage_epochs
        for i, st in enumerate(stages[:-1]):
            extra = st.num_epochs - self.min_stage_epochs
            if extra < 0 or extra > remaining:
                return None
            after = n - 1 - i
            # The inverse of _sample_lengths' Beta(1, after) draw.
            params[f"share_{i}"] = 1.0 - (1.0 - extra / remaining) ** after if remaining else 0.0
            remaining -= extra
        low = self.batch_exp_min
        spent = 0
        for i, st in enumerate(stages):
            exp = st.batch_size.bit_length() - 1
            lowest = low
            if cap is not None:
                after = self.total_epochs - st.end_epoch
                lowest = self._capped_low(cap, low, st.num_epochs, after, spent)
                spent += cap.steps(st.batch_size, st.num_epochs)
            if st.batch_size != 1 << exp or not lowest <= exp <= self.batch_exp_max:
                return None
            if lowest < self.batch_exp_max:
                params[f"batch_exp_{i}"] = exp
            if not self.allow_decreasing_batch:
                low = exp
            if self.lr_mult_min < self.lr_mult_max:
                params[f"lr_mult_{i}"] = st.lr_multiplier
            if self.warmup_min < self.warmup_max:
                params[f"warmup_{i}"] = st.warmup_epochs
            if len(self.decays) > 1:
                params[f"decay_{i}"] = st.decay
        if len(self.label_smoothing) > 1:
            params["label_smoothing"] = schedule.label_smoothing
        import optuna

        try:
            drawn = self.sample(optuna.trial.FixedTrial(params), cap)
        except (ValueError, ValidationError):
            return None
        return params if drawn.stages == stages else None

    def _sample_lengths(self, trial: SuggestTrial, n: int) -> list[int]:
        slack = self.total_epochs - n * self.min_stage_epochs
        lengths: list[int] = []
        remaining = slack
        for i in range(n - 1):
            after = n - 1 - i  # stages after this one
            u = trial.suggest_float(f"share_{i}", 0.0, 1.0)
            # Inverse CDF of Beta(1, after): uniform u -> uniform over the simplex.
            fraction = 1.0 - (1.0 - u) ** (1.0 / after)
            extra = min(remaining, max(0, round(fraction * remaining)))
            lengths.append(self.min_stage_epochs + extra)
            remaining -= extra
        lengths.append(self.min_stage_epochs + remaining)
        return lengths

    def _capped_low(self, cap: StepCap, low: int, epochs: int, after: int, spent: int) -> int:
        """The smallest batch exponent from ``low`` with which a stage of ``epochs`` epochs,
        after ``spent`` steps and before ``after`` epochs at the largest batch, meets
        ``cap``; the largest exponent when none does (the run cannot meet it then)."""
        rest = cap.steps(self.largest_batch, after)
        for exp in range(low, self.batch_exp_max):
            if spent + cap.steps(1 << exp, epochs) + rest <= cap.max_steps:
                return exp
        return self.batch_exp_max

    @staticmethod
    def _suggest_int(trial: SuggestTrial, name: str, low: int, high: int) -> int:
        return low if low == high else int(trial.suggest_int(name, low, high))


def lr_multiplier_range(
    given: LrMultiplierRange, scaling_rule: str, largest_ratio: float
) -> tuple[float, float]:
    """The LR multipliers the search draws from: ``space.lr_multiplier``, where a bound the
    spec leaves at its default is widened so that the linear and the square-root scaling
    rules' LRs at the space's largest batch are both inside the range.

    Neither rule holds across a wide batch range: linear scaling is right while the batch is
    small against the task's critical batch and overshoots beyond it (on ``mnist1d`` batch
    1,024 from base 32, Goyal's linear LR diverges on some seeds where the square-root LR,
    a multiplier of 0.18 under the linear rule, trains stably). A range centred on one rule
    with fixed factors of 4 cannot reach the other one's LR at a 32x batch, so the search
    could not even find the better recipe. ``largest_ratio``: largest batch / base batch."""
    low = DEFAULT_LR_MULTIPLIER[0] if given.min is None else given.min
    high = DEFAULT_LR_MULTIPLIER[1] if given.max is None else given.max
    if largest_ratio > 1:
        if scaling_rule == "linear" and given.min is None:
            low *= largest_ratio**-0.5  # the square-root rule's LR at the largest batch
        elif scaling_rule == "sqrt" and given.max is None:
            high *= largest_ratio**0.5  # the linear rule's
        elif scaling_rule == "none" and given.max is None:
            high *= largest_ratio  # the linear rule's (the square root's is between)
    return float(f"{low:.2g}"), float(f"{high:.2g}")


def lr_multiplier_grid(value: float, low: float, high: float) -> float:
    """A sampled LR multiplier on the space's grid: two significant digits (``0.8995...`` is
    ``0.9``), kept within ``[low, high]``. The sampler draws continuously; the schedule (the
    one trained, stored and exported) carries the grid value."""
    rounded = float(f"{value:.2g}")
    return min(max(rounded, low), high)


def warmup_grid(value: float, low: float, high: float) -> float:
    """A sampled warm-up on the space's grid: multiples of 0.05 epoch, within ``[low, high]``."""
    return min(max(round(round(value / 0.05) * 0.05, 2), low), high)


# --------------------------------------------------------------------------------------------
# Constraints and feasibility
# --------------------------------------------------------------------------------------------


def constraint_violations(
    schedule: Schedule, objective: object, train_size: int | None
) -> dict[str, float]:
    """How far ``schedule`` violates the objective's constraints, relative (> 0: violated).

    Keys are the constraint names (``max_mean_batch_size``, ...); a value <= 0 means met.
    Needs the training-set size (steps and mean batch size depend on it); empty when the
    objective has no constraint.
    """
    if not isinstance(objective, AccuracyObjective) or not objective.has_constraint:
        return {}
    if train_size is None:
        raise ValidationError(
            "checking the objective's constraint needs the training-set size of the task"
        )
    out: dict[str, float] = {}
    mean = schedule.mean_batch_size(train_size)
    if objective.max_mean_batch_size is not None:
        out["max_mean_batch_size"] = mean / objective.max_mean_batch_size - 1.0
    if objective.min_mean_batch_size is not None:
        out["min_mean_batch_size"] = 1.0 - mean / objective.min_mean_batch_size
    if objective.max_steps is not None:
        out["max_steps"] = schedule.total_steps(train_size) / objective.max_steps - 1.0
    return out


def violated_constraints(
    schedule: Schedule, objective: object, train_size: int | None
) -> tuple[str, ...]:
    """The names of the objective's constraints ``schedule`` breaks (see
    :func:`constraint_violations`), in its order; empty when it meets them all."""
    return tuple(
        name for name, v in constraint_violations(schedule, objective, train_size).items() if v > 0
    )


def check_feasible(space: ScheduleSpace, objective: object, train_size: int | None) -> None:
    """Raise :class:`ValidationError` when no schedule of ``space`` can be trained or meet the
    objective's constraint (checked against the extreme schedules of the space)."""
    if train_size is not None and space.largest_batch > train_size:
        raise ValidationError(
            f"the search space's largest batch size {space.largest_batch} exceeds the task's "
            f"{train_size} training samples (an epoch would have no optimizer step); lower "
            f"space.batch_size.max to at most {1 << _floor_log2(train_size)}"
        )
    if not isinstance(objective, AccuracyObjective) or not objective.has_constraint:
        return
    if objective.max_mean_batch_size is not None and (
        objective.max_mean_batch_size < space.smallest_batch
    ):
        raise ValidationError(
            f"no schedule can meet objective.max_mean_batch_size={objective.max_mean_batch_size}"
            f": the smallest batch size of the space is {space.smallest_batch}; lower "
            "space.batch_size.min or raise the constraint"
        )
    if objective.min_mean_batch_size is not None and (
        objective.min_mean_batch_size > space.largest_batch
    ):
        raise ValidationError(
            f"no schedule can meet objective.min_mean_batch_size={objective.min_mean_batch_size}"
            f": the largest batch size of the space is {space.largest_batch}; raise "
            "space.batch_size.max or lower the constraint"
        )
    if objective.max_steps is not None:
        if train_size is None:
            raise ValidationError("checking objective.max_steps needs the training-set size")
        largest = space.schedule([Stage(0, space.total_epochs, space.largest_batch)])
        fewest = largest.total_steps(train_size)
        if fewest > objective.max_steps:
            raise ValidationError(
                f"no schedule can meet objective.max_steps={objective.max_steps}: even the "
                f"largest batch ({space.largest_batch}) for all {space.total_epochs} epochs "
                f"takes {fewest} steps on {train_size} samples; raise the constraint, "
                "space.batch_size.max or lower schedule.total_epochs"
            )


def _ceil_log2(n: int) -> int:
    return max(0, (n - 1).bit_length())


def _floor_log2(n: int) -> int:
    return n.bit_length() - 1
