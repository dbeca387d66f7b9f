"""The :class:`Schedule`: stages that cover a run's epochs, plus its run-wide settings.

A schedule is validated on construction (every problem of every stage at once), then answers
questions about the run: which stage, batch size and LR hold at a fractional epoch
(``stage_at``, ``batch_size_at``, ``lr_at``), how many optimizer steps each stage takes on a
dataset (``steps_per_epoch``, ``stage_steps``, ``total_steps``, ``iter_steps``...), and its
one-line ``summary``. The LR of one stage is computed in :mod:`tuner.schedule.stage`
(:func:`~tuner.schedule.stage.lr_in_stage`); this module only chains the stages (the warm-up
of a stage starts from the LR the previous one ended with). The YAML / dict methods delegate
to :mod:`tuner.schedule.document`.
"""

from __future__ import annotations

import math
import os
from bisect import bisect_right
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from tuner.errors import ValidationError
from tuner.schedule.document import (
    _TOP_FLOAT_FIELDS,
    PlacementHint,
    _copy_json_like,
    document_to_yaml,
    dump_yaml,
    load_schedule,
    schedule_from_dict,
    schedule_from_yaml,
    schedule_to_dict,
)
from tuner.schedule.stage import Stage, lr_in_stage, stage_final_lr, stage_peak_lr
from tuner.schedule.values import (
    MAX_BATCH_SIZE,
    MAX_STAGES,
    OPTIMIZERS,
    SCALING_RULES,
    Decay,
    Optimizer,
    ScalingRule,
    ScheduleError,
    _is_finite_float,
    _is_int,
    _norm_float,
    _norm_int,
    _num,
    _show,
    _stage_label,
    _to_float,
    _valid_batch,
)


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


@dataclass(frozen=True)
class Schedule:
    """A complete variable batch-size schedule; validated on construction.

    ``peak_lr(i) = base_lr * scale(stages[i].batch_size / base_batch_size) *
    stages[i].lr_multiplier`` where ``scale(x)`` is 1, x or sqrt(x) for the scaling rule
    none / linear / sqrt. Stage 0's warm-up starts at ``warmup_start_lr`` (default
    ``base_lr``); the warm-up of a later stage starts at the LR the previous stage ended with.
    The LR inside a stage (warm-up, then decay) is computed by
    :func:`tuner.schedule.stage.lr_in_stage`.

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
            peak = stage_peak_lr(st, self.base_lr, self.base_batch_size, self.scaling_rule)
            if not math.isfinite(peak) or peak <= 0:
                raise ScheduleError(
                    f"{_stage_label(i, st.start_epoch, st.end_epoch)}: its peak LR "
                    f"(base_lr * scale * lr_multiplier = {peak!r}) is not a finite positive "
                    "number; lower base_lr or lr_multiplier"
                )
            starts.append(st.start_epoch)
            peaks.append(peak)
            start_lrs.append(prev_end if st.warmup_epochs > 0 else peak)
            prev_end = stage_final_lr(st, peak)
            end_lrs.append(prev_end)
        object.__setattr__(self, "_starts", tuple(starts))
        object.__setattr__(self, "_peaks", tuple(peaks))
        object.__setattr__(self, "_start_lrs", tuple(start_lrs))
        object.__setattr__(self, "_end_lrs", tuple(end_lrs))

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
        i = bisect_right(self._starts, value) - 1
        return lr_in_stage(self.stages[i], value, self._peaks[i], self._start_lrs[i])

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
        for i, st in enumerate(self.stages):
            peak, start_lr = self._peaks[i], self._start_lrs[i]
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
                        lr_in_stage(st, epoch + k / spe, peak, start_lr),
                    )
                    global_step += 1

    # ---------------------------------------------------------------- presentation

    def summary(self) -> str:
        """One line: ``"64@0-3 -> 256@3-8 (lr x0.5) -> 1024@8-12 (lr x0.125)"``: batch@start-end
        per stage, and the stage's LR multiplier (on top of the scaling rule's LR) where it is
        not 1, so two schedules that differ only in their LR never read the same."""
        return " -> ".join(_stage_summary(s) for s in self.stages)

    # ---------------------------------------------------------------- dict / YAML

    def to_dict(self) -> dict[str, Any]:
        """The document form: JSON-serialisable plain types, ``from_dict`` reads it back.

        Optional fields at their defaults that do not apply (e.g. ``step_gamma`` of a cosine
        stage, a null ``warmup_start_lr``) are left out. See :mod:`tuner.schedule.document`.
        """
        return schedule_to_dict(self)

    @classmethod
    def from_dict(cls, data: object) -> Schedule:
        """Build a schedule from its document form (see ``docs/schedule-format.md``).

        Raises ScheduleError listing unknown or missing keys, a wrong version or units, and
        every validation problem.
        """
        return schedule_from_dict(cls, data, yaml_numbers=False)

    def to_yaml(self) -> str:
        """The YAML document (floats written with full repr precision).

        Text is written as UTF-8 where PyYAML reads it back unchanged; otherwise (rare
        characters such as U+0085 in provenance strings) non-ASCII characters are escaped.
        """
        return document_to_yaml(self.to_dict())

    @classmethod
    def from_yaml(cls, text: str) -> Schedule:
        """Parse a YAML document (``yaml.safe_load``); errors are ScheduleErrors with the line.

        Floats written in exponent form without a dot (``1e-3``), which YAML 1.1 reads as
        strings, are accepted in numeric fields.
        """
        return schedule_from_yaml(cls, text)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Schedule:
        """Read a YAML schedule file; errors name the file."""
        return load_schedule(path, cls.from_yaml)

    def dump(self, path: str | os.PathLike[str]) -> None:
        """Write the YAML document to ``path`` (UTF-8)."""
        dump_yaml(path, self.to_yaml())


def _check_dataset_size(dataset_size: int) -> int:
    size = _norm_int(dataset_size)
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ScheduleError(
            f"dataset_size must be a positive integer (training samples per epoch), "
            f"got {_show(dataset_size)}"
        )
    return size


def _stage_summary(stage: Stage) -> str:
    """``64@0-3``, with `` (lr x0.5)`` where the LR multiplier, to 3 digits, is not 1."""
    text = f"{stage.batch_size}@{stage.start_epoch}-{stage.end_epoch}"
    shown = f"{stage.lr_multiplier:.3g}"
    return text if shown == "1" else f"{text} (lr x{shown})"


def schedule_summary(document: Mapping[str, Any]) -> str | None:
    """``"64@0-3 -> 256@3-8 (lr x0.5)"`` (:meth:`Schedule.summary`) for a schedule document,
    ``None`` if it is not a valid schedule: the one rule behind the summary the store writes
    with each trial (``TrialRecord.schedule_summary``, which the API, dashboard and CLI show)."""
    try:
        return Schedule.from_dict(dict(document)).summary()
    except (ValidationError, TypeError, ValueError):
        return None
