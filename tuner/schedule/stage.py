"""One stage of a schedule, and the LR arithmetic of one stage.

This is where a learning rate is computed. :class:`Stage` holds one stage's settings (its
epochs, global batch size, LR multiplier, warm-up and decay); the functions below turn them
into learning rates:

* :func:`lr_scale`: the scaling rule's factor for a batch size (1, x or sqrt(x) of
  ``batch_size / base_batch_size``);
* :func:`stage_peak_lr`: a stage's LR after warm-up,
  ``base_lr * lr_scale(...) * lr_multiplier``;
* :func:`stage_final_lr`: the LR a stage ends with (the next stage's warm-up starts there);
* :func:`lr_in_stage`: **the LR at a fractional epoch inside a stage** (warm-up ramp, then
  the decay shape). :meth:`Schedule.lr_at <tuner.schedule.model.Schedule.lr_at>` and
  :meth:`Schedule.iter_steps <tuner.schedule.model.Schedule.iter_steps>` both call it; no
  other code computes the LR at an epoch.

:class:`~tuner.schedule.model.Schedule` chains the stages: it computes each stage's peak and
final LR once, on construction, and passes the previous stage's final LR on as the next
warm-up's start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, cast

from tuner.schedule.values import (
    DECAYS,
    MAX_BATCH_SIZE,
    MAX_EPOCHS,
    Decay,
    ScalingRule,
    _is_finite_float,
    _is_int,
    _norm_float,
    _norm_int,
    _num,
    _show,
)

#: The float fields of a stage (integers given for them are stored as floats).
_STAGE_FLOAT_FIELDS: Final = ("lr_multiplier", "warmup_epochs", "decay_final_factor", "step_gamma")

# Tolerance (in units of step intervals) used to decide on which side of an LR step a
# fractional epoch falls, so that 0.3 / 0.1 == 2.9999999999999996 counts as 3 intervals.
_STEP_EPS: Final = 1e-9


@dataclass(frozen=True)
class Stage:
    """One stage: epochs ``[start_epoch, end_epoch)`` at one global batch size.

    ``batch_size`` is the global batch in samples per optimizer step. The stage's peak LR is
    ``base_lr * scale(batch_size / base_batch_size) * lr_multiplier`` (:func:`stage_peak_lr`).
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
        for name in _STAGE_FLOAT_FIELDS:
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
# LR arithmetic of one stage
# --------------------------------------------------------------------------------------------


def lr_scale(scaling_rule: ScalingRule, batch_size: int, base_batch_size: int) -> float:
    """The LR scaling rule's factor for ``batch_size``: with ``x = batch_size /
    base_batch_size``, ``x`` for ``linear``, ``sqrt(x)`` for ``sqrt`` and 1 for ``none``."""
    ratio = batch_size / base_batch_size
    if scaling_rule == "linear":
        return ratio
    if scaling_rule == "sqrt":
        return math.sqrt(ratio)
    return 1.0


def stage_peak_lr(
    st: Stage, base_lr: float, base_batch_size: int, scaling_rule: ScalingRule
) -> float:
    """The stage's LR after warm-up: ``base_lr`` scaled to its batch size, times its
    ``lr_multiplier``."""
    return base_lr * lr_scale(scaling_rule, st.batch_size, base_batch_size) * st.lr_multiplier


def stage_final_lr(st: Stage, peak: float) -> float:
    """LR a stage ends with (left limit at ``end_epoch``), given its peak LR."""
    span = st.end_epoch - st.start_epoch - st.warmup_epochs
    if span <= 0 or st.decay == "constant":
        return peak
    if st.decay == "step":
        ratio = span / cast(float, st.step_every_epochs)
        drops = math.ceil(ratio - _STEP_EPS) - 1
        return peak * st.step_gamma ** max(drops, 0)
    return peak * st.decay_final_factor


def lr_in_stage(st: Stage, t: float, peak: float, start_lr: float) -> float:
    """The learning rate at fractional epoch ``t`` inside stage ``st``: the one function that
    computes a stage's LR.

    ``peak`` is the stage's LR after warm-up (:func:`stage_peak_lr`) and ``start_lr`` the LR its
    warm-up starts from (the previous stage's :func:`stage_final_lr`, for the first stage the
    schedule's ``warmup_start_lr``, default ``base_lr``). During the first ``warmup_epochs`` the
    LR ramps linearly from ``start_lr`` to ``peak``; then the stage's ``decay`` runs from
    ``peak``: ``constant`` stays there, ``step`` multiplies by ``step_gamma`` every
    ``step_every_epochs``, ``cosine`` and ``linear`` fall to ``peak * decay_final_factor`` at
    ``end_epoch``. ``t`` is not checked: the caller passes an epoch in ``[start_epoch,
    end_epoch)``.
    """
    warm = st.warmup_epochs
    into = t - st.start_epoch
    if into < warm:
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
