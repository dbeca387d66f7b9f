"""Variable batch-size schedules: the central type of stagetune.

A :class:`Schedule` is an ordered tuple of :class:`Stage` objects that cover the epochs
``[0, total_epochs)`` without gaps or overlaps, plus the run-wide settings (base LR at a base
batch size, LR scaling rule, optimizer, momentum, weight decay, label smoothing). Everything
here is pure arithmetic on epochs and optimizer steps; nothing imports torch.

Units, everywhere in this module and in the YAML format:

* time is in **epochs** (``start_epoch``, ``end_epoch``, ``warmup_epochs``,
  ``step_every_epochs``); a fractional epoch ``e + k / steps_in_epoch`` is the moment of
  optimizer step ``k`` of epoch ``e``;
* batch sizes are **global samples per optimizer step** (summed over all workers and
  accumulation micro-batches);
* ``base_lr`` and ``warmup_start_lr`` are **absolute** learning rates; ``lr_multiplier`` is
  relative to the base LR scaled to the stage's batch size.

Messages name stages 1-based with their epochs, e.g. ``stage 2 (epochs 3-8)``; worker ranks
(placement) are 0-based like ``torch.distributed`` ranks.

The YAML/dict format is described in ``docs/schedule-format.md``.
"""

from __future__ import annotations

import math
import numbers
import os
import re
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Final, Literal, NamedTuple, cast, get_args

import yaml

from tuner.errors import ValidationError

__all__ = [
    "DECAYS",
    "FORMAT_VERSION",
    "MAX_ACCUMULATION_STEPS",
    "MAX_BATCH_SIZE",
    "MAX_EPOCHS",
    "MAX_PLACEMENT_ENTRIES",
    "MAX_PROVENANCE_DEPTH",
    "MAX_PROVENANCE_ITEMS",
    "MAX_STAGES",
    "MAX_WORLD_SIZE",
    "MAX_YAML_CHARS",
    "OPTIMIZERS",
    "SCALING_RULES",
    "UNITS",
    "BatchPlacement",
    "Decay",
    "Optimizer",
    "PlacementError",
    "PlacementHint",
    "ScalingRule",
    "Schedule",
    "ScheduleError",
    "Stage",
    "StagePlacement",
    "StepInfo",
    "place",
    "place_batch",
    "schedule_summary",
]

# --------------------------------------------------------------------------------------------
# Constants
# --------------------------------------------------------------------------------------------

#: The schedule format version this module reads and writes.
FORMAT_VERSION: Final = 1
#: The fixed ``units`` block of a version-1 document.
UNITS: Final[Mapping[str, str]] = {"time": "epochs", "batch_size": "samples", "lr": "absolute"}

#: Upper bounds that stop absurd input early (they are far above any real run).
MAX_STAGES: Final = 1_000
MAX_EPOCHS: Final = 100_000
MAX_BATCH_SIZE: Final = 2**30
MAX_WORLD_SIZE: Final = 131_072
MAX_ACCUMULATION_STEPS: Final = 1_024
#: Largest ``world_size * accumulation_steps`` a placement may describe.
MAX_PLACEMENT_ENTRIES: Final = 2**24
#: Limits on the free-form ``provenance`` mapping and on YAML input.
MAX_PROVENANCE_DEPTH: Final = 8
MAX_PROVENANCE_ITEMS: Final = 10_000
MAX_YAML_CHARS: Final = 4 * 1024 * 1024

Decay = Literal["constant", "cosine", "linear", "step"]
ScalingRule = Literal["none", "linear", "sqrt"]
Optimizer = Literal["sgd", "adamw", "lars"]
DECAYS: Final[tuple[Decay, ...]] = get_args(Decay)
SCALING_RULES: Final[tuple[ScalingRule, ...]] = get_args(ScalingRule)
OPTIMIZERS: Final[tuple[Optimizer, ...]] = get_args(Optimizer)

# Tolerance (in units of step intervals) used to decide on which side of an LR step a
# fractional epoch falls, so that 0.3 / 0.1 == 2.9999999999999996 counts as 3 intervals.
_STEP_EPS: Final = 1e-9


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class ScheduleError(ValidationError):
    """A schedule (or a schedule document) is invalid.

    ``problems`` lists every problem found; the message joins them on one line.
    """

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: tuple[str, ...] = (
            (problems,) if isinstance(problems, str) else tuple(problems)
        )
        super().__init__(_join_problems(self.problems))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (list(self.problems),))


class PlacementError(ValidationError):
    """A global batch cannot be placed on the workers; ``problems`` lists why."""

    def __init__(self, problems: str | Sequence[str]) -> None:
        self.problems: tuple[str, ...] = (
            (problems,) if isinstance(problems, str) else tuple(problems)
        )
        super().__init__(_join_problems(self.problems))

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (list(self.problems),))


def _join_problems(problems: Sequence[str]) -> str:
    if len(problems) == 1:
        return problems[0]
    numbered = "; ".join(f"({i}) {p}" for i, p in enumerate(problems, start=1))
    return f"{len(problems)} problems: {numbered}"


# --------------------------------------------------------------------------------------------
# Small value helpers
# --------------------------------------------------------------------------------------------


def _show(value: object) -> str:
    """A value as a message shows it, with its type where that is the likely mistake."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"{str(value).lower()} (a boolean)"
    if isinstance(value, str):
        return f"{value!r} (a string)"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, int):
        return str(value)
    return f"{value!r} (a {type(value).__name__})"


def _num(x: float) -> str:
    """A number for a message: integers without a trailing .0, others compactly."""
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    return f"{x:g}"


def _to_float(value: object) -> float | None:
    """``value`` as a float if it is a real number (not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        return float(value)
    except (OverflowError, ValueError, TypeError):
        return None


def _norm_float(value: object) -> object:
    converted = _to_float(value)
    return value if converted is None or type(value) is float else converted


def _norm_int(value: object) -> object:
    if isinstance(value, (bool, int)):
        return value
    if isinstance(value, numbers.Integral):  # numpy integers and the like
        return int(value)
    return value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite_float(value: object) -> bool:
    return isinstance(value, float) and math.isfinite(value)


def _valid_batch(value: object) -> bool:
    return _is_int(value) and 1 <= cast(int, value) <= MAX_BATCH_SIZE


def _stage_label(index: int, start: object, end: object) -> str:
    if _is_int(start) and _is_int(end):
        return f"stage {index + 1} (epochs {start}-{end})"
    return f"stage {index + 1}"


# --------------------------------------------------------------------------------------------
# Stage
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stage:
    """One stage: epochs ``[start_epoch, end_epoch)`` at one global batch size.

    ``batch_size`` is the global batch in samples per optimizer step. The stage's peak LR is
    ``base_lr * scale(batch_size / base_batch_size) * lr_multiplier`` (see :class:`Schedule`).
    The first ``warmup_epochs`` epochs ramp the LR linearly from the previous stage's final LR
    (for the first stage from ``Schedule.warmup_start_lr``) to the peak; then ``decay`` runs
    from the peak over the rest of the stage:

    * ``constant``: the peak;
    * ``cosine`` / ``linear``: from the peak to ``peak * decay_final_factor`` at ``end_epoch``;
    * ``step``: the peak multiplied by ``step_gamma`` every ``step_every_epochs`` epochs after
      warm-up (``step_every_epochs`` is required for, and only allowed with, ``step``).

    A Stage is a plain value: it is validated when a :class:`Schedule` is built from it, so
    that every problem of every stage is reported at once. Integer values given for float
    fields are stored as floats.
    """

    start_epoch: int
    end_epoch: int
    batch_size: int
    lr_multiplier: float = 1.0
    warmup_epochs: float = 0.0
    decay: Decay = "constant"
    decay_final_factor: float = 0.0
    step_every_epochs: float | None = None
    step_gamma: float = 0.1

    def __post_init__(self) -> None:
        for name in ("start_epoch", "end_epoch", "batch_size"):
            object.__setattr__(self, name, _norm_int(getattr(self, name)))
        for name in ("lr_multiplier", "warmup_epochs", "decay_final_factor", "step_gamma"):
            object.__setattr__(self, name, _norm_float(getattr(self, name)))
        if self.step_every_epochs is not None:
            object.__setattr__(self, "step_every_epochs", _norm_float(self.step_every_epochs))

    @property
    def num_epochs(self) -> int:
        """Number of epochs in the stage (``end_epoch - start_epoch``)."""
        return self.end_epoch - self.start_epoch

    @property
    def decay_start_epoch(self) -> float:
        """The fractional epoch where warm-up ends and decay begins."""
        return self.start_epoch + self.warmup_epochs

    def problems(self) -> list[str]:
        """Problems of this stage on its own (without the stage label); empty if valid."""
        out: list[str] = []
        start, end, batch = self.start_epoch, self.end_epoch, self.batch_size
        if not _is_int(start) or start < 0:
            out.append(f"start_epoch must be an integer >= 0, got {_show(start)}")
        if not _is_int(end) or end < 1:
            out.append(f"end_epoch must be an integer >= 1, got {_show(end)}")
        elif end > MAX_EPOCHS:
            out.append(f"end_epoch {end} exceeds the maximum of {MAX_EPOCHS} epochs (MAX_EPOCHS)")
        epochs_ok = _is_int(start) and _is_int(end) and start >= 0
        if epochs_ok and end <= start:
            out.append(
                f"end_epoch {end} must be greater than start_epoch {start}; "
                "a stage covers the epochs [start_epoch, end_epoch)"
            )
            epochs_ok = False
        if not _is_int(batch) or batch < 1:
            out.append(
                f"batch_size must be a positive integer (global samples per optimizer step), "
                f"got {_show(batch)}"
            )
        elif batch > MAX_BATCH_SIZE:
            out.append(f"batch_size {batch} exceeds the maximum {MAX_BATCH_SIZE} (MAX_BATCH_SIZE)")
        mult = self.lr_multiplier
        if not _is_finite_float(mult) or mult <= 0:
            out.append(f"lr_multiplier must be a finite number > 0, got {_show(mult)}")
        warmup = self.warmup_epochs
        if not _is_finite_float(warmup) or warmup < 0:
            out.append(f"warmup_epochs must be a finite number >= 0, got {_show(warmup)}")
        elif epochs_ok and warmup > end - start:
            out.append(
                f"warmup_epochs {_num(warmup)} is longer than the stage ({end - start} epochs); "
                f"use at most {end - start}"
            )
        if self.decay not in DECAYS:
            out.append(
                f"decay {_show(self.decay)} is not supported; use one of {', '.join(DECAYS)}"
            )
        factor = self.decay_final_factor
        if not _is_finite_float(factor) or not 0.0 <= factor <= 1.0:
            out.append(
                "decay_final_factor must be a number in [0, 1] (the fraction of the peak LR "
                f"reached at the end of a cosine or linear decay), got {_show(factor)}"
            )
        every = self.step_every_epochs
        if self.decay == "step" and every is None:
            out.append(
                "decay 'step' needs step_every_epochs (the interval, in epochs after warm-up, "
                "between LR drops); add e.g. step_every_epochs: 30"
            )
        elif every is not None and self.decay != "step":
            out.append(
                f"step_every_epochs is only used with decay 'step' (this stage has decay "
                f"{_show(self.decay)}); remove it or set decay: step"
            )
        elif every is not None and (not _is_finite_float(every) or every <= 0):
            out.append(f"step_every_epochs must be a finite number > 0, got {_show(every)}")
        gamma = self.step_gamma
        if not _is_finite_float(gamma) or not 0.0 < gamma <= 1.0:
            out.append(
                "step_gamma must be a number in (0, 1] (the factor applied to the LR at each "
                f"step), got {_show(gamma)}"
            )
        return out


# --------------------------------------------------------------------------------------------
# Placement hint (part of the document) and per-step info
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementHint:
    """The placement a schedule was tuned on (informational; ``place`` takes its own args)."""

    world_size: int
    micro_batch: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "world_size", _norm_int(self.world_size))
        if self.micro_batch is not None:
            object.__setattr__(self, "micro_batch", _norm_int(self.micro_batch))

    def problems(self) -> list[str]:
        """Problems of this hint (without a label); empty if valid."""
        out: list[str] = []
        if not _is_int(self.world_size) or not 1 <= self.world_size <= MAX_WORLD_SIZE:
            out.append(
                f"placement.world_size must be an integer in [1, {MAX_WORLD_SIZE}], "
                f"got {_show(self.world_size)}"
            )
        mb = self.micro_batch
        if mb is not None and (not _is_int(mb) or not 1 <= mb <= MAX_BATCH_SIZE):
            out.append(f"placement.micro_batch must be a positive integer or null, got {_show(mb)}")
        return out


class StepInfo(NamedTuple):
    """One optimizer step, as yielded by :meth:`Schedule.iter_steps`.

    ``global_step`` counts from 0 over the whole run, ``epoch`` and ``step_in_epoch`` from 0;
    ``batch_size`` is the number of samples in *this* step (with ``drop_last=False`` the last
    step of an epoch may be smaller than the stage's batch size); ``lr`` is
    ``lr_at(epoch + step_in_epoch / steps_in_epoch)``.
    """

    global_step: int
    epoch: int
    step_in_epoch: int
    stage_index: int
    batch_size: int
    lr: float


# --------------------------------------------------------------------------------------------
# Schedule
# --------------------------------------------------------------------------------------------

_STAGE_FLOAT_FIELDS: Final = ("lr_multiplier", "warmup_epochs", "decay_final_factor", "step_gamma")
_TOP_FLOAT_FIELDS: Final = ("base_lr", "momentum", "weight_decay", "label_smoothing")


@dataclass(frozen=True)
class Schedule:
    """A complete variable batch-size schedule; validated on construction.

    ``peak_lr(i) = base_lr * scale(stages[i].batch_size / base_batch_size) *
    stages[i].lr_multiplier`` where ``scale(x)`` is 1, x or sqrt(x) for the scaling rule
    none / linear / sqrt. Stage 0's warm-up starts at ``warmup_start_lr`` (default
    ``base_lr``); the warm-up of a later stage starts at the LR the previous stage ended with.

    ``momentum`` is the SGD / LARS momentum (AdamW uses it as beta1). ``provenance`` is a
    free-form JSON-like mapping (study id, task, metrics...) and ``placement`` the placement
    the schedule was tuned on; both are carried through ``to_dict``/``to_yaml`` unchanged.

    Raises :class:`ScheduleError` listing every problem found.
    """

    stages: tuple[Stage, ...]
    base_lr: float
    base_batch_size: int
    scaling_rule: ScalingRule = "linear"
    optimizer: Optimizer = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0
    label_smoothing: float = 0.0
    warmup_start_lr: float | None = None
    allow_decreasing_batch: bool = False
    placement: PlacementHint | None = None
    provenance: Mapping[str, Any] | None = field(default=None, hash=False)

    # Precomputed per-stage values (derived from the fields above).
    _starts: tuple[int, ...] = field(init=False, repr=False, compare=False, hash=False)
    _peaks: tuple[float, ...] = field(init=False, repr=False, compare=False, hash=False)
    _start_lrs: tuple[float, ...] = field(init=False, repr=False, compare=False, hash=False)
    _end_lrs: tuple[float, ...] = field(init=False, repr=False, compare=False, hash=False)

    # ---------------------------------------------------------------- construction / checks

    def __post_init__(self) -> None:
        stages: object = self.stages
        if isinstance(stages, list):
            stages = tuple(stages)
            object.__setattr__(self, "stages", stages)
        object.__setattr__(self, "base_batch_size", _norm_int(self.base_batch_size))
        for name in _TOP_FLOAT_FIELDS:
            object.__setattr__(self, name, _norm_float(getattr(self, name)))
        if self.warmup_start_lr is not None:
            object.__setattr__(self, "warmup_start_lr", _norm_float(self.warmup_start_lr))
        problems = self._problems()
        if self.provenance is not None and isinstance(self.provenance, Mapping):
            prov_problems: list[str] = []
            copied = _copy_json_like(self.provenance, "provenance", 0, [0], prov_problems)
            problems.extend(prov_problems)
            if not prov_problems:
                object.__setattr__(self, "provenance", copied)
        if problems:
            raise ScheduleError(problems)
        self._precompute()

    def _problems(self) -> list[str]:
        out: list[str] = []
        stages: object = self.stages
        stages_ok = False
        if not isinstance(stages, tuple):
            out.append(f"stages must be a list of stages, got {_show(stages)}")
        elif not stages:
            out.append("a schedule needs at least one stage")
        elif len(stages) > MAX_STAGES:
            out.append(f"{len(stages)} stages exceed the maximum of {MAX_STAGES} (MAX_STAGES)")
        else:
            stages_ok = True
            for i, st in enumerate(stages):
                if not isinstance(st, Stage):
                    out.append(
                        f"stage {i + 1}: expected a Stage, got {_show(st)}; "
                        "use Schedule.from_dict for plain mappings"
                    )
                    stages_ok = False
                    continue
                label = _stage_label(i, st.start_epoch, st.end_epoch)
                out.extend(f"{label}: {p}" for p in st.problems())
        if stages_ok:
            out.extend(self._order_problems())

        if not _is_finite_float(self.base_lr) or self.base_lr <= 0:
            out.append(
                "base_lr must be a finite number > 0 (the absolute LR at base_batch_size), "
                f"got {_show(self.base_lr)}"
            )
        bbs = self.base_batch_size
        if not _is_int(bbs) or not 1 <= bbs <= MAX_BATCH_SIZE:
            out.append(
                f"base_batch_size must be an integer in [1, {MAX_BATCH_SIZE}] (the batch size "
                f"base_lr is tuned for), got {_show(bbs)}"
            )
        if self.scaling_rule not in SCALING_RULES:
            out.append(
                f"scaling_rule {_show(self.scaling_rule)} is not supported; use one of "
                f"{', '.join(SCALING_RULES)}"
            )
        if self.optimizer not in OPTIMIZERS:
            out.append(
                f"optimizer {_show(self.optimizer)} is not supported; use one of "
                f"{', '.join(OPTIMIZERS)}"
            )
        if not _is_finite_float(self.momentum) or not 0.0 <= self.momentum < 1.0:
            out.append(f"momentum must be a number in [0, 1), got {_show(self.momentum)}")
        if not _is_finite_float(self.weight_decay) or self.weight_decay < 0:
            out.append(f"weight_decay must be a finite number >= 0, got {_show(self.weight_decay)}")
        if not _is_finite_float(self.label_smoothing) or not 0.0 <= self.label_smoothing < 1.0:
            out.append(
                f"label_smoothing must be a number in [0, 1), got {_show(self.label_smoothing)}"
            )
        wsl = self.warmup_start_lr
        if wsl is not None and (not _is_finite_float(wsl) or wsl < 0):
            out.append(
                "warmup_start_lr must be a finite number >= 0, or null for base_lr, "
                f"got {_show(wsl)}"
            )
        allow: object = self.allow_decreasing_batch
        if not isinstance(allow, bool):
            out.append(f"allow_decreasing_batch must be true or false, got {_show(allow)}")
        hint: object = self.placement
        if hint is not None:
            if isinstance(hint, PlacementHint):
                out.extend(hint.problems())
            else:
                out.append(
                    f"placement must be a PlacementHint (world_size, micro_batch), "
                    f"got {_show(hint)}"
                )
        prov: object = self.provenance
        if prov is not None and not isinstance(prov, Mapping):
            out.append(f"provenance must be a mapping, got {_show(prov)}")
        return out

    def _order_problems(self) -> list[str]:
        """Contiguity from epoch 0 and batch-size order (only where the epochs are integers)."""
        out: list[str] = []
        stages = self.stages
        first = stages[0]
        if _is_int(first.start_epoch) and first.start_epoch != 0:
            out.append(
                f"{_stage_label(0, first.start_epoch, first.end_epoch)} starts at epoch "
                f"{first.start_epoch}: the first stage must start at epoch 0"
            )
        for i in range(1, len(stages)):
            prev, cur = stages[i - 1], stages[i]
            if not (_is_int(prev.end_epoch) and _is_int(cur.start_epoch)):
                continue
            if _is_int(prev.start_epoch) and cur.start_epoch < prev.start_epoch:
                out.append(
                    f"{_stage_label(i, cur.start_epoch, cur.end_epoch)} starts before "
                    f"{_stage_label(i - 1, prev.start_epoch, prev.end_epoch)}: list the stages "
                    "in epoch order"
                )
            elif prev.end_epoch != cur.start_epoch:
                gap = cur.start_epoch - prev.end_epoch
                kind = f"gap of {gap}" if gap > 0 else f"overlap of {-gap}"
                unit = "epoch" if abs(gap) == 1 else "epochs"
                out.append(
                    f"{_stage_label(i - 1, prev.start_epoch, prev.end_epoch)} ends at epoch "
                    f"{prev.end_epoch} but {_stage_label(i, cur.start_epoch, cur.end_epoch)} "
                    f"starts at epoch {cur.start_epoch}: stages must be contiguous ({kind} "
                    f"{unit}); set stage {i + 1}'s start_epoch to {prev.end_epoch}"
                )
        if self.allow_decreasing_batch is not True:
            for i in range(1, len(stages)):
                prev, cur = stages[i - 1], stages[i]
                if not (_valid_batch(prev.batch_size) and _valid_batch(cur.batch_size)):
                    continue
                if cur.batch_size < prev.batch_size:
                    out.append(
                        f"{_stage_label(i, cur.start_epoch, cur.end_epoch)} has batch_size "
                        f"{cur.batch_size}, smaller than "
                        f"{_stage_label(i - 1, prev.start_epoch, prev.end_epoch)} batch_size "
                        f"{prev.batch_size}: batch sizes must be non-decreasing; change the "
                        "batch sizes or set allow_decreasing_batch: true"
                    )
        return out

    def _precompute(self) -> None:
        starts: list[int] = []
        peaks: list[float] = []
        start_lrs: list[float] = []
        end_lrs: list[float] = []
        prev_end = self.base_lr if self.warmup_start_lr is None else self.warmup_start_lr
        for i, st in enumerate(self.stages):
            peak = self.base_lr * self._scale(st.batch_size) * st.lr_multiplier
            if not math.isfinite(peak) or peak <= 0:
                raise ScheduleError(
                    f"{_stage_label(i, st.start_epoch, st.end_epoch)}: its peak LR "
                    f"(base_lr * scale * lr_multiplier = {peak!r}) is not a finite positive "
                    "number; lower base_lr or lr_multiplier"
                )
            starts.append(st.start_epoch)
            peaks.append(peak)
            start_lrs.append(prev_end if st.warmup_epochs > 0 else peak)
            prev_end = _decay_end_lr(st, peak)
            end_lrs.append(prev_end)
        object.__setattr__(self, "_starts", tuple(starts))
        object.__setattr__(self, "_peaks", tuple(peaks))
        object.__setattr__(self, "_start_lrs", tuple(start_lrs))
        object.__setattr__(self, "_end_lrs", tuple(end_lrs))

    def _scale(self, batch_size: int) -> float:
        ratio = batch_size / self.base_batch_size
        if self.scaling_rule == "linear":
            return ratio
        if self.scaling_rule == "sqrt":
            return math.sqrt(ratio)
        return 1.0

    @classmethod
    def constant(
        cls,
        batch_size: int,
        total_epochs: int,
        base_lr: float,
        base_batch_size: int | None = None,
        *,
        lr_multiplier: float = 1.0,
        warmup_epochs: float = 0.0,
        decay: Decay = "constant",
        decay_final_factor: float = 0.0,
        step_every_epochs: float | None = None,
        step_gamma: float = 0.1,
        scaling_rule: ScalingRule = "linear",
        optimizer: Optimizer = "sgd",
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        label_smoothing: float = 0.0,
        warmup_start_lr: float | None = None,
    ) -> Schedule:
        """A one-stage schedule: ``batch_size`` for all ``total_epochs`` epochs.

        ``base_batch_size`` defaults to ``batch_size`` (so the peak LR is
        ``base_lr * lr_multiplier`` whatever the scaling rule).
        """
        stage = Stage(
            start_epoch=0,
            end_epoch=total_epochs,
            batch_size=batch_size,
            lr_multiplier=lr_multiplier,
            warmup_epochs=warmup_epochs,
            decay=decay,
            decay_final_factor=decay_final_factor,
            step_every_epochs=step_every_epochs,
            step_gamma=step_gamma,
        )
        return cls(
            stages=(stage,),
            base_lr=base_lr,
            base_batch_size=batch_size if base_batch_size is None else base_batch_size,
            scaling_rule=scaling_rule,
            optimizer=optimizer,
            momentum=momentum,
            weight_decay=weight_decay,
            label_smoothing=label_smoothing,
            warmup_start_lr=warmup_start_lr,
        )

    # ---------------------------------------------------------------- epochs and LR

    @property
    def total_epochs(self) -> int:
        """Number of epochs of the whole run (the last stage's ``end_epoch``)."""
        return self.stages[-1].end_epoch

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    def _check_stage_index(self, stage_index: int) -> int:
        index = _norm_int(stage_index)
        if not isinstance(index, int) or isinstance(index, bool):
            index = -1
        if not 0 <= index < len(self.stages):
            raise ScheduleError(
                f"stage_index must be an integer in [0, {len(self.stages) - 1}] (0-based), "
                f"got {_show(stage_index)}"
            )
        return index

    def _check_epoch(self, epoch: float, *, allow_end: bool) -> float:
        total = self.stages[-1].end_epoch
        # fast path for the common case: a plain number inside the schedule
        if (type(epoch) is float or type(epoch) is int) and (
            0 <= epoch < total or (allow_end and epoch == total)
        ):
            return epoch
        value = _to_float(epoch)
        if value is None or math.isnan(value):
            raise ScheduleError(f"epoch must be a number, got {_show(epoch)}")
        if value < 0 or value > total or (value == total and not allow_end):
            bracket = "]" if allow_end else ")"
            raise ScheduleError(
                f"epoch {_num(value)} is outside the schedule's epochs [0, {total}{bracket}"
            )
        return value

    def stage_index_at(self, epoch: float) -> int:
        """0-based index of the stage containing ``epoch`` (a number in ``[0, total_epochs)``)."""
        value = self._check_epoch(epoch, allow_end=False)
        return bisect_right(self._starts, value) - 1

    def stage_at(self, epoch: float) -> Stage:
        """The stage containing ``epoch`` (in ``[0, total_epochs)``)."""
        return self.stages[self.stage_index_at(epoch)]

    def batch_size_at(self, epoch: float) -> int:
        """Global batch size (samples per optimizer step) at ``epoch`` in ``[0, total_epochs)``."""
        return self.stages[self.stage_index_at(epoch)].batch_size

    def peak_lr(self, stage_index: int) -> float:
        """The stage's LR after warm-up: base LR, scaled to its batch, times its multiplier."""
        stage_index = self._check_stage_index(stage_index)
        return self._peaks[stage_index]

    def stage_start_lr(self, stage_index: int) -> float:
        """LR at the stage's first instant: the warm-up's starting LR, or the peak if none."""
        stage_index = self._check_stage_index(stage_index)
        return self._start_lrs[stage_index]

    def stage_end_lr(self, stage_index: int) -> float:
        """LR at the very end of the stage (the limit as the epoch approaches ``end_epoch``).

        The next stage's warm-up starts from this value.
        """
        stage_index = self._check_stage_index(stage_index)
        return self._end_lrs[stage_index]

    def lr_at(self, epoch: float) -> float:
        """Learning rate at a fractional ``epoch`` in ``[0, total_epochs]``; O(log stages).

        At a stage boundary the LR is the new stage's (its warm-up start, or its peak when it
        has no warm-up). ``lr_at(total_epochs)`` is the LR the run ends with.
        """
        value = self._check_epoch(epoch, allow_end=True)
        if value == self.total_epochs:
            return self._end_lrs[-1]
        return self._lr_in_stage(bisect_right(self._starts, value) - 1, value)

    def _lr_in_stage(self, i: int, t: float) -> float:
        st = self.stages[i]
        peak = self._peaks[i]
        warm = st.warmup_epochs
        into = t - st.start_epoch
        if into < warm:
            start_lr = self._start_lrs[i]
            return start_lr + (peak - start_lr) * (into / warm)
        decay = st.decay
        if decay == "constant":
            return peak
        x = into - warm
        if decay == "step":
            every = cast(float, st.step_every_epochs)
            return peak * st.step_gamma ** math.floor(x / every + _STEP_EPS)
        span = st.end_epoch - st.start_epoch - warm
        if span <= 0:
            return peak
        p = min(x / span, 1.0)
        final = peak * st.decay_final_factor
        if decay == "cosine":
            return final + (peak - final) * 0.5 * (1.0 + math.cos(math.pi * p))
        return peak + (final - peak) * p

    # ---------------------------------------------------------------- step arithmetic

    def steps_per_epoch(
        self, stage_index: int, dataset_size: int, *, drop_last: bool = True
    ) -> int:
        """Optimizer steps in one epoch of stage ``stage_index`` (0-based) on ``dataset_size``
        training samples.

        With ``drop_last=True`` (the default) an epoch at batch ``b`` has ``N // b`` steps and
        the last ``N % b`` samples are dropped; a batch larger than the dataset is an error.
        With ``drop_last=False`` it has ``ceil(N / b)`` steps, the last one smaller.
        """
        stage_index = self._check_stage_index(stage_index)
        dataset_size = _check_dataset_size(dataset_size)
        st = self.stages[stage_index]
        if drop_last:
            if st.batch_size > dataset_size:
                raise ScheduleError(self._too_large(stage_index, dataset_size))
            return dataset_size // st.batch_size
        return -(-dataset_size // st.batch_size)

    def _too_large(self, i: int, dataset_size: int) -> str:
        st = self.stages[i]
        return (
            f"{_stage_label(i, st.start_epoch, st.end_epoch)}: batch_size {st.batch_size} is "
            f"larger than the dataset ({dataset_size} samples), so with drop_last every epoch "
            f"would have no optimizer step; use a batch_size of at most {dataset_size} or "
            "drop_last=False"
        )

    def stage_steps(self, dataset_size: int, *, drop_last: bool = True) -> list[int]:
        """Optimizer steps of each stage (steps per epoch times the stage's epochs).

        Raises ScheduleError naming every stage whose batch is larger than the dataset when
        ``drop_last`` is true.
        """
        dataset_size = _check_dataset_size(dataset_size)
        if drop_last:
            too_large = [
                self._too_large(i, dataset_size)
                for i, st in enumerate(self.stages)
                if st.batch_size > dataset_size
            ]
            if too_large:
                raise ScheduleError(too_large)
        return [
            self.steps_per_epoch(i, dataset_size, drop_last=drop_last) * st.num_epochs
            for i, st in enumerate(self.stages)
        ]

    def total_steps(self, dataset_size: int, *, drop_last: bool = True) -> int:
        """Optimizer steps of the whole run (the sum of :meth:`stage_steps`)."""
        return sum(self.stage_steps(dataset_size, drop_last=drop_last))

    def samples_seen(self, dataset_size: int, *, drop_last: bool = True) -> int:
        """Training samples processed over the run (dropped samples do not count)."""
        steps = self.stage_steps(dataset_size, drop_last=drop_last)
        dataset_size = _check_dataset_size(dataset_size)
        if not drop_last:
            return dataset_size * self.total_epochs
        return sum(n * st.batch_size for n, st in zip(steps, self.stages, strict=True))

    def mean_batch_size(self, dataset_size: int, *, drop_last: bool = True) -> float:
        """Samples seen divided by optimizer steps over the whole run."""
        return self.samples_seen(dataset_size, drop_last=drop_last) / self.total_steps(
            dataset_size, drop_last=drop_last
        )

    def iter_steps(self, dataset_size: int, *, drop_last: bool = True) -> Iterator[StepInfo]:
        """Every optimizer step of the run, in order, as :class:`StepInfo`.

        Step ``k`` of epoch ``e`` has LR ``lr_at(e + k / steps_in_epoch)``; ``batch_size`` is the
        samples in that step (the last step of an epoch is smaller when ``drop_last=False`` and
        the batch does not divide the dataset). Validation happens before the first item.
        """
        dataset_size = _check_dataset_size(dataset_size)
        per_epoch = [
            n // st.num_epochs
            for n, st in zip(
                self.stage_steps(dataset_size, drop_last=drop_last), self.stages, strict=True
            )
        ]
        return self._iter_steps(dataset_size, per_epoch)

    def _iter_steps(self, dataset_size: int, per_epoch: list[int]) -> Iterator[StepInfo]:
        global_step = 0
        lr_in_stage = self._lr_in_stage
        for i, st in enumerate(self.stages):
            spe = per_epoch[i]
            batch = st.batch_size
            last_batch = dataset_size - (spe - 1) * batch if batch * spe > dataset_size else batch
            for epoch in range(st.start_epoch, st.end_epoch):
                for k in range(spe):
                    yield StepInfo(
                        global_step,
                        epoch,
                        k,
                        i,
                        last_batch if k == spe - 1 else batch,
                        lr_in_stage(i, epoch + k / spe),
                    )
                    global_step += 1

    # ---------------------------------------------------------------- presentation

    def summary(self) -> str:
        """One line: ``"64@0-3 -> 256@3-8 -> 1024@8-12"`` (batch@start-end per stage)."""
        return " -> ".join(f"{s.batch_size}@{s.start_epoch}-{s.end_epoch}" for s in self.stages)

    # ---------------------------------------------------------------- dict / YAML

    def to_dict(self) -> dict[str, Any]:
        """The document form: JSON-serialisable plain types, ``from_dict`` reads it back.

        Optional fields at their defaults that do not apply (e.g. ``step_gamma`` of a cosine
        stage, a null ``warmup_start_lr``) are left out.
        """
        out: dict[str, Any] = {
            "version": FORMAT_VERSION,
            "units": dict(UNITS),
            "base_lr": self.base_lr,
            "base_batch_size": self.base_batch_size,
            "scaling_rule": self.scaling_rule,
            "optimizer": self.optimizer,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "label_smoothing": self.label_smoothing,
        }
        if self.warmup_start_lr is not None:
            out["warmup_start_lr"] = self.warmup_start_lr
        out["allow_decreasing_batch"] = self.allow_decreasing_batch
        out["stages"] = [_stage_to_dict(st) for st in self.stages]
        if self.placement is not None:
            hint: dict[str, Any] = {"world_size": self.placement.world_size}
            if self.placement.micro_batch is not None:
                hint["micro_batch"] = self.placement.micro_batch
            out["placement"] = hint
        if self.provenance is not None:
            out["provenance"] = _copy_json_like(self.provenance, "provenance", 0, [0], [])
        return out

    @classmethod
    def from_dict(cls, data: object) -> Schedule:
        """Build a schedule from its document form (see ``docs/schedule-format.md``).

        Raises ScheduleError listing unknown or missing keys, a wrong version or units, and
        every validation problem.
        """
        return cls._from_document(data, yaml_numbers=False)

    def to_yaml(self) -> str:
        """The YAML document (floats written with full repr precision).

        Text is written as UTF-8 where PyYAML reads it back unchanged; otherwise (rare
        characters such as U+0085 in provenance strings) non-ASCII characters are escaped.
        """
        document = self.to_dict()
        text = _safe_dump(document, allow_unicode=True)
        if _reads_back(text, document):
            return text
        return _safe_dump(document, allow_unicode=False)

    @classmethod
    def from_yaml(cls, text: str) -> Schedule:
        """Parse a YAML document (``yaml.safe_load``); errors are ScheduleErrors with the line.

        Floats written in exponent form without a dot (``1e-3``), which YAML 1.1 reads as
        strings, are accepted in numeric fields.
        """
        if not isinstance(text, str):
            raise ScheduleError(f"a schedule YAML document must be text, got {_show(text)}")
        if len(text) > MAX_YAML_CHARS:
            raise ScheduleError(
                f"the schedule YAML document has {len(text)} characters, more than the "
                f"maximum {MAX_YAML_CHARS}"
            )
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ScheduleError(_yaml_error_message(exc)) from None
        if data is None:
            raise ScheduleError("the schedule YAML document is empty")
        return cls._from_document(data, yaml_numbers=True)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Schedule:
        """Read a YAML schedule file; errors name the file."""
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read(MAX_YAML_CHARS + 1)
        except OSError as exc:
            raise ScheduleError(
                f"cannot read schedule file {os.fspath(path)}: {exc.strerror or exc}"
            ) from None
        except UnicodeDecodeError:
            raise ScheduleError(f"schedule file {os.fspath(path)} is not UTF-8 text") from None
        try:
            return cls.from_yaml(text)
        except ScheduleError as exc:
            raise ScheduleError([f"{os.fspath(path)}: {p}" for p in exc.problems]) from None

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the YAML document to ``path`` (UTF-8)."""
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(self.to_yaml())

    @classmethod
    def _from_document(cls, data: object, *, yaml_numbers: bool) -> Schedule:
        problems: list[str] = []
        kwargs = _parse_document(data, problems, yaml_numbers)
        if kwargs is None:
            raise ScheduleError(problems)
        if not problems:
            return cls(**kwargs)
        # Structural problems (unknown keys...): still report the value problems of whatever
        # could be read, so that one pass shows everything.
        if all(key in kwargs for key in _TOP_REQUIRED if key not in ("version", "units")):
            try:
                cls(**kwargs)
            except ScheduleError as exc:
                problems.extend(exc.problems)
        raise ScheduleError(problems)


def _safe_dump(document: Mapping[str, Any], *, allow_unicode: bool) -> str:
    return yaml.safe_dump(
        document, sort_keys=False, default_flow_style=False, allow_unicode=allow_unicode
    )


def _reads_back(text: str, document: Mapping[str, Any]) -> bool:
    try:
        text.encode("utf-8")
        return bool(yaml.safe_load(text) == document)
    except (UnicodeEncodeError, yaml.YAMLError):
        return False


def _decay_end_lr(st: Stage, peak: float) -> float:
    """LR a stage ends with (left limit at ``end_epoch``)."""
    span = st.end_epoch - st.start_epoch - st.warmup_epochs
    if span <= 0 or st.decay == "constant":
        return peak
    if st.decay == "step":
        ratio = span / cast(float, st.step_every_epochs)
        drops = math.ceil(ratio - _STEP_EPS) - 1
        return peak * st.step_gamma ** max(drops, 0)
    return peak * st.decay_final_factor


def _check_dataset_size(dataset_size: int) -> int:
    size = _norm_int(dataset_size)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ScheduleError(
            f"dataset_size must be a positive integer (training samples per epoch), "
            f"got {_show(dataset_size)}"
        )
    return size


def _stage_to_dict(st: Stage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "start_epoch": st.start_epoch,
        "end_epoch": st.end_epoch,
        "batch_size": st.batch_size,
        "lr_multiplier": st.lr_multiplier,
        "warmup_epochs": st.warmup_epochs,
        "decay": st.decay,
    }
    if st.decay in ("cosine", "linear") or st.decay_final_factor != 0.0:
        out["decay_final_factor"] = st.decay_final_factor
    if st.step_every_epochs is not None:
        out["step_every_epochs"] = st.step_every_epochs
    if st.decay == "step" or st.step_gamma != 0.1:
        out["step_gamma"] = st.step_gamma
    return out


# --------------------------------------------------------------------------------------------
# Document parsing
# --------------------------------------------------------------------------------------------

_TOP_KEYS: Final = (
    "version",
    "units",
    "base_lr",
    "base_batch_size",
    "scaling_rule",
    "optimizer",
    "momentum",
    "weight_decay",
    "label_smoothing",
    "warmup_start_lr",
    "allow_decreasing_batch",
    "stages",
    "placement",
    "provenance",
)
_TOP_REQUIRED: Final = ("version", "units", "base_lr", "base_batch_size", "stages")
_STAGE_KEYS: Final = (
    "start_epoch",
    "end_epoch",
    "batch_size",
    "lr_multiplier",
    "warmup_epochs",
    "decay",
    "decay_final_factor",
    "step_every_epochs",
    "step_gamma",
)
_STAGE_REQUIRED: Final = ("start_epoch", "end_epoch", "batch_size")
_PLACEMENT_KEYS: Final = ("world_size", "micro_batch")
_UNITS_EXAMPLE: Final = "units: {time: epochs, batch_size: samples, lr: absolute}"
_UNIT_HINTS: Final[Mapping[str, str]] = {
    "time": "all times (start_epoch, end_epoch, warmup_epochs, step_every_epochs) are in epochs",
    "batch_size": "batch sizes are global samples per optimizer step",
    "lr": "base_lr and warmup_start_lr are absolute learning rates",
}
# YAML 1.1 reads 1e-3 (no dot) as a string; accept it in numeric fields of YAML input.
_EXP_FLOAT: Final = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _yaml_error_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return (
            f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}; "
            "check the indentation and quoting there"
        )
    return f"invalid YAML: {problem}"


def _check_keys(
    mapping: Mapping[Any, Any],
    where: str,
    allowed: Sequence[str],
    required: Sequence[str],
    problems: list[str],
) -> None:
    for key in mapping:
        if key not in allowed:
            problems.append(f"{where}: unknown key {key!r}; allowed: {', '.join(allowed)}")
    for key in required:
        if key not in mapping:
            problems.append(f"{where}: missing required key {key!r}")


def _yaml_number(value: object, yaml_numbers: bool) -> object:
    if yaml_numbers and isinstance(value, str) and _EXP_FLOAT.fullmatch(value.strip()):
        return float(value)
    return value


def _parse_document(data: object, problems: list[str], yaml_numbers: bool) -> dict[str, Any] | None:
    if not isinstance(data, Mapping):
        problems.append(
            f"a schedule document must be a mapping with version, units, base_lr, "
            f"base_batch_size and stages, got {_show(data)}"
        )
        return None
    if "version" not in data:
        problems.append(
            f"top level: missing 'version'; this stagetune reads schedule format version "
            f"{FORMAT_VERSION}: add 'version: {FORMAT_VERSION}'"
        )
    else:
        version = data["version"]
        if not _is_int(version) or version != FORMAT_VERSION:
            problems.append(
                f"top level: unsupported version {_show(version)}; this stagetune reads "
                f"schedule format version {FORMAT_VERSION} only"
            )
            return None  # another version's keys would only add noise
    _check_keys(data, "top level", _TOP_KEYS, (), problems)
    for key in _TOP_REQUIRED:
        if key == "version" or key in data:
            continue
        hint = f"; add {_UNITS_EXAMPLE}" if key == "units" else ""
        problems.append(f"top level: missing required key {key!r}{hint}")
    if "units" in data:
        _check_units(data["units"], problems)

    kwargs: dict[str, Any] = {}
    for key in _TOP_KEYS:
        if key in ("version", "units", "stages", "placement", "provenance") or key not in data:
            continue
        value = data[key]
        if key in (*_TOP_FLOAT_FIELDS, "warmup_start_lr"):
            value = _yaml_number(value, yaml_numbers)
        kwargs[key] = value

    stages_raw = data.get("stages")
    stages: list[Stage] = []
    stages_complete = False
    if "stages" in data:
        if not isinstance(stages_raw, list):
            problems.append(f"stages: must be a list of stage mappings, got {_show(stages_raw)}")
        elif len(stages_raw) > MAX_STAGES:
            problems.append(
                f"stages: {len(stages_raw)} stages exceed the maximum of {MAX_STAGES} (MAX_STAGES)"
            )
        else:
            stages_complete = True
            for i, raw in enumerate(stages_raw):
                stage = _parse_stage(i, raw, problems, yaml_numbers)
                if stage is None:
                    stages_complete = False
                else:
                    stages.append(stage)
    if stages_complete:
        kwargs["stages"] = tuple(stages)

    if "placement" in data and data["placement"] is not None:
        raw_p = data["placement"]
        if not isinstance(raw_p, Mapping):
            problems.append(
                f"placement: must be a mapping with world_size and optionally micro_batch, "
                f"got {_show(raw_p)}"
            )
        else:
            _check_keys(raw_p, "placement", _PLACEMENT_KEYS, ("world_size",), problems)
            if "world_size" in raw_p:
                kwargs["placement"] = PlacementHint(
                    world_size=raw_p["world_size"], micro_batch=raw_p.get("micro_batch")
                )
    if "provenance" in data and data["provenance"] is not None:
        prov = data["provenance"]
        if not isinstance(prov, Mapping):
            problems.append(f"provenance: must be a mapping, got {_show(prov)}")
        else:
            kwargs["provenance"] = _copy_json_like(prov, "provenance", 0, [0], problems)
    return kwargs


def _check_units(units: object, problems: list[str]) -> None:
    if not isinstance(units, Mapping):
        problems.append(f"units: must be a mapping, {_UNITS_EXAMPLE}; got {_show(units)}")
        return
    for key in units:
        if key not in UNITS:
            problems.append(f"units: unknown key {key!r}; allowed: {', '.join(UNITS)}")
    for key, expected in UNITS.items():
        if key not in units:
            problems.append(f"units: missing key {key!r}; version 1 requires {_UNITS_EXAMPLE}")
        elif units[key] != expected:
            problems.append(
                f"units.{key}: {_show(units[key])} is not supported; version 1 uses "
                f"{key}: {expected} ({_UNIT_HINTS[key]})"
            )


def _parse_stage(index: int, raw: object, problems: list[str], yaml_numbers: bool) -> Stage | None:
    if not isinstance(raw, Mapping):
        problems.append(f"stage {index + 1}: must be a mapping, got {_show(raw)}")
        return None
    label = _stage_label(index, raw.get("start_epoch"), raw.get("end_epoch"))
    _check_keys(raw, label, _STAGE_KEYS, _STAGE_REQUIRED, problems)
    if any(key not in raw for key in _STAGE_REQUIRED):
        return None
    kwargs: dict[str, Any] = {}
    for key in _STAGE_KEYS:
        if key in raw:
            value = raw[key]
            if key in (*_STAGE_FLOAT_FIELDS, "step_every_epochs"):
                value = _yaml_number(value, yaml_numbers)
            kwargs[key] = value
    return Stage(**kwargs)


def _copy_json_like(
    value: object, where: str, depth: int, count: list[int], problems: list[str]
) -> Any:
    """Copy a JSON-like value (str keys; str/int/float/bool/null, lists, mappings).

    Tuples become lists. Non-finite floats, other types, too deep or too large values are
    reported in ``problems``.
    """
    count[0] += 1
    if count[0] > MAX_PROVENANCE_ITEMS:
        if count[0] == MAX_PROVENANCE_ITEMS + 1:
            problems.append(f"provenance: more than {MAX_PROVENANCE_ITEMS} values; keep it small")
        return None
    if depth > MAX_PROVENANCE_DEPTH:
        problems.append(f"{where}: nested deeper than {MAX_PROVENANCE_DEPTH} levels")
        return None
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            problems.append(f"{where}: {value!r} is not allowed (JSON has no NaN or infinity)")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(f"{where}: key {key!r} must be a string")
                continue
            out[key] = _copy_json_like(item, f"{where}.{key}", depth + 1, count, problems)
        return out
    if isinstance(value, (list, tuple)):
        return [
            _copy_json_like(item, f"{where}[{j}]", depth + 1, count, problems)
            for j, item in enumerate(value)
        ]
    problems.append(
        f"{where}: {_show(value)} is not allowed; use strings, numbers, booleans, null, "
        "lists and mappings"
    )
    return None


# --------------------------------------------------------------------------------------------
# Placement
# --------------------------------------------------------------------------------------------


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


def schedule_summary(document: Mapping[str, Any]) -> str | None:
    """``"64@0-3 -> 256@3-8"`` (:meth:`Schedule.summary`) for a schedule document, ``None``
    if it is not a valid schedule: the one rule behind the summary the store writes with each
    trial (``TrialRecord.schedule_summary``, which the API, dashboard and CLI show)."""
    try:
        return Schedule.from_dict(dict(document)).summary()
    except (ValidationError, TypeError, ValueError):
        return None


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
