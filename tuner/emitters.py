"""Emitters: a schedule as Megatron-LM arguments or DeepSpeed configs, with what they lose.

Neither framework can run a stagetune schedule as such, so each emitter builds the closest
artefact the framework accepts, *simulates* what the framework will do with it (the batch size
and LR of every optimizer step, following the framework's own formulas), compares that with the
schedule, and returns the artefact with a list of human-readable limitations: what the target
cannot express and how far the result is from the schedule. An empty list means the artefact
reproduces the schedule's global batch and LR at every step.

* :func:`emit_megatron`: ``--global-batch-size``, ``--micro-batch-size``, ``--rampup-batch-size``
  (Megatron's only way to change the batch: a linear ramp in equal sample intervals), one
  warm-up + decay LR schedule over samples (``--lr``, ``--min-lr``, ``--lr-warmup-init``,
  ``--lr-warmup-samples``, ``--lr-decay-samples``, ``--lr-decay-style``), optimizer flags.
* :func:`emit_deepspeed`: one DeepSpeed config per stage (``train_batch_size`` =
  ``train_micro_batch_size_per_gpu`` x ``gradient_accumulation_steps`` x world size, optimizer,
  ``WarmupLR`` / ``WarmupDecayLR`` / ``WarmupCosineLR``) with the stage's epochs and steps:
  DeepSpeed fixes the batch for a run, so each stage is a run resumed from the previous one's
  checkpoint.
"""

from __future__ import annotations

import json
import math
import shlex
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Final, Generic, Literal, TypeVar

from tuner.errors import ValidationError
from tuner.retarget import retarget
from tuner.schedule import Schedule

__all__ = [
    "DeepSpeedPlan",
    "DeepSpeedStage",
    "Emitted",
    "MegatronArgs",
    "MegatronLR",
    "MegatronRamp",
    "deepspeed_files",
    "emit",
    "emit_deepspeed",
    "emit_megatron",
]

T = TypeVar("T")

#: Relative deviations below this count as exact (float rounding).
EXACT = 1e-9
#: Largest number of ramp increments the Megatron fit considers.
MAX_RAMP_INCREMENTS = 4096


@dataclass(frozen=True)
class Emitted(Generic[T]):
    """An emitter's result: the artefact, its text form, and what it cannot express."""

    format: str
    artefact: T
    limitations: tuple[str, ...]
    text: str
    """The artefact as a file's content (shell arguments, JSON)."""

    @property
    def exact(self) -> bool:
        return not self.limitations


# ============================================================================== helpers


class _Steps:
    """The schedule's optimizer steps in *consumed samples*: step k starts after
    ``starts[k]`` samples and has ``batches[k]`` samples at LR ``lrs[k]``."""

    def __init__(self, schedule: Schedule, dataset_size: int, drop_last: bool) -> None:
        self.starts: list[int] = []
        self.batches: list[int] = []
        self.lrs: list[float] = []
        consumed = 0
        for step in schedule.iter_steps(dataset_size, drop_last=drop_last):
            self.starts.append(consumed)
            self.batches.append(step.batch_size)
            self.lrs.append(step.lr)
            consumed += step.batch_size
        self.total = consumed

    def index_at(self, consumed: int) -> int:
        return max(0, min(bisect_right(self.starts, consumed) - 1, len(self.starts) - 1))


def _pct(x: float) -> str:
    return f"{100 * x:.3g}%"


def _num(x: float) -> str:
    return f"{x:.6g}"


def _divisors(n: int) -> list[int]:
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


# ============================================================================== Megatron-LM


@dataclass(frozen=True)
class MegatronRamp:
    """``--rampup-batch-size start increment samples``: the global batch is ``start`` and grows
    by ``increment`` every ``samples / ((global - start) / increment)`` consumed samples until
    it reaches ``--global-batch-size`` after ``samples``."""

    start: int
    increment: int
    samples: int


@dataclass(frozen=True)
class MegatronLR:
    """Megatron's LR schedule over consumed samples: linear warm-up from ``init`` to ``max``
    over ``warmup_samples``, then ``decay_style`` down to ``min`` at ``decay_samples``."""

    init: float
    max: float
    min: float
    warmup_samples: int
    decay_samples: int
    decay_style: Literal["constant", "linear", "cosine"]


@dataclass(frozen=True)
class MegatronArgs:
    """Megatron-LM training arguments for a schedule and how close they come to it."""

    args: tuple[str, ...]
    global_batch_size: int
    micro_batch_size: int
    data_parallel_size: int
    train_samples: int
    ramp: MegatronRamp | None
    lr: MegatronLR
    max_batch_deviation: float
    """Largest ``|megatron batch - schedule batch| / schedule batch`` over Megatron's steps."""
    weighted_batch_deviation: float
    """The same, averaged over consumed samples."""
    max_lr_deviation: float
    weighted_lr_deviation: float


def _megatron_batch(consumed: int, global_batch: int, ramp: MegatronRamp | None) -> int:
    """Megatron's RampupBatchsizeNumMicroBatchesCalculator.update (global batch size)."""
    if ramp is None or consumed > ramp.samples:
        return global_batch
    increments = (global_batch - ramp.start) // ramp.increment
    per_increment = ramp.samples / increments
    return ramp.start + int(consumed / per_increment) * ramp.increment


def _megatron_lr(consumed: int, lr: MegatronLR) -> float:
    """Megatron's OptimizerParamScheduler.get_lr with sample-based steps."""
    if lr.warmup_samples > 0 and consumed <= lr.warmup_samples:
        return lr.init + (lr.max - lr.init) * consumed / lr.warmup_samples
    if lr.decay_style == "constant":
        return lr.max
    if consumed > lr.decay_samples:
        return lr.min
    ratio = (consumed - lr.warmup_samples) / (lr.decay_samples - lr.warmup_samples)
    cosine = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    coeff = 1.0 - ratio if lr.decay_style == "linear" else cosine
    return lr.min + coeff * (lr.max - lr.min)


def _simulate_megatron(
    steps: _Steps, global_batch: int, ramp: MegatronRamp | None, lr: MegatronLR
) -> tuple[float, float, float, float]:
    """Run Megatron's batch and LR rules over the schedule's samples; deviations
    ``(max batch, weighted batch, max lr, weighted lr)`` relative to the schedule."""
    consumed = 0
    max_b = sum_b = max_lr = sum_lr = 0.0
    while consumed < steps.total:
        batch = _megatron_batch(consumed, global_batch, ramp)
        k = steps.index_at(consumed)
        weight = min(batch, steps.total - consumed)
        dev_b = abs(batch - steps.batches[k]) / steps.batches[k]
        want = steps.lrs[k]
        got = _megatron_lr(consumed, lr)
        dev_lr = abs(got - want) / want if want > 0 else abs(got)
        max_b, max_lr = max(max_b, dev_b), max(max_lr, dev_lr)
        sum_b += weight * dev_b
        sum_lr += weight * dev_lr
        consumed += batch
    return max_b, sum_b / steps.total, max_lr, sum_lr / steps.total


def _ramp_cost(
    bounds: Sequence[int],
    batches: Sequence[int],
    total: int,
    start: int,
    inc: int,
    n: int,
    samples: float,
    global_batch: int,
) -> float:
    """Samples-weighted mean relative batch deviation of a continuous-sample ramp."""
    per = samples / n
    cuts = sorted({0, total, *bounds, *(min(total, round(j * per)) for j in range(1, n + 1))})
    cost = 0.0
    for a, b in pairwise(cuts):
        if b <= a:
            continue
        mid = (a + b) / 2
        i = bisect_right(bounds, mid) - 1
        want = batches[i]
        got = global_batch if mid > samples else start + int(mid / per) * inc
        cost += (b - a) * abs(got - want) / want
    return cost / total


def _fit_ramp(
    schedule: Schedule, dataset_size: int, drop_last: bool, unit: int
) -> MegatronRamp | None:
    """The ramp closest (samples-weighted batch deviation) to the stages."""
    stages = schedule.stages
    first, last = stages[0].batch_size, stages[-1].batch_size
    if last <= first:
        return None
    per_stage = schedule.stage_steps(dataset_size, drop_last=drop_last)
    bounds: list[int] = []
    consumed = 0
    for st, steps in zip(stages, per_stage, strict=True):
        bounds.append(consumed)
        if drop_last:
            consumed += steps * st.batch_size
        else:
            consumed += dataset_size * st.num_epochs
    total = consumed
    batches = [st.batch_size for st in stages]
    diff = last - first
    increments = [d for d in _divisors(diff) if d % unit == 0 and diff // d <= MAX_RAMP_INCREMENTS]
    increments = increments[-48:]  # the coarsest ramps; finer ones add little
    best: tuple[float, int, float, int] | None = None
    for inc in increments:
        n = diff // inc
        grid = [total * j / 32 for j in range(1, 33)]
        candidates = sorted({*(float(b) for b in bounds[1:]), *grid})
        for _ in range(2):  # a coarse pass, then a finer one around the best
            for samples in candidates:
                if samples <= 0:
                    continue
                cost = _ramp_cost(bounds, batches, total, first, inc, n, samples, last)
                key = (cost, n, samples, inc)
                if best is None or key < best:
                    best = key
            assert best is not None
            step = total / 32
            centre = best[2]
            candidates = [max(1.0, centre + step * (j / 16 - 1)) for j in range(33)]
    assert best is not None
    _, _, samples, inc = best
    return MegatronRamp(start=first, increment=inc, samples=max(1, round(samples)))


def _fit_lr(steps: _Steps, schedule: Schedule) -> list[MegatronLR]:
    """Candidate Megatron LR schedules: warm-up to the schedule's highest LR, then each decay
    style down to the LR the schedule ends with."""
    peak = max(steps.lrs)
    first_peak = next(k for k, lr in enumerate(steps.lrs) if lr >= peak * (1 - EXACT))
    warmup = steps.starts[first_peak]
    end_lr = min(schedule.lr_at(schedule.total_epochs), peak)
    init = min(steps.lrs[0], peak)
    return [
        MegatronLR(init, peak, end_lr, warmup, steps.total, style)
        for style in ("constant", "linear", "cosine")
    ]


def emit_megatron(
    schedule: Schedule,
    dataset_size: int,
    data_parallel_size: int = 1,
    micro_batch: int | None = None,
    *,
    drop_last: bool = True,
) -> Emitted[MegatronArgs]:
    """Megatron-LM arguments for ``schedule`` trained on ``dataset_size`` samples per epoch.

    ``data_parallel_size``: Megatron's data-parallel size (world size / (tensor x pipeline
    parallel)). ``micro_batch``: ``--micro-batch-size`` (default: the first stage without
    gradient accumulation). Every batch Megatron runs must be a multiple of
    ``micro_batch x data_parallel_size``; raises ValidationError when the first or last stage's
    batch is not.
    """
    if data_parallel_size < 1:
        raise ValidationError(f"data_parallel_size must be >= 1, got {data_parallel_size}")
    first, last = schedule.stages[0].batch_size, schedule.stages[-1].batch_size
    common = math.gcd(first, last)
    if common % data_parallel_size:
        raise ValidationError(
            f"Megatron runs only global batches that are multiples of micro-batch x data-parallel "
            f"size; the schedule starts at {first} and ends at {last}, which "
            f"{data_parallel_size} data-parallel workers do not both divide: choose a "
            f"data-parallel size that divides {common}"
        )
    if micro_batch is None:
        micro_batch = common // data_parallel_size
    unit = micro_batch * data_parallel_size
    if common % unit:
        raise ValidationError(
            f"Megatron runs only global batches that are multiples of micro-batch {micro_batch} "
            f"x data-parallel size {data_parallel_size} = {unit}; the schedule starts at "
            f"{first} and ends at {last}: choose a micro-batch that divides "
            f"{common // data_parallel_size}"
        )
    steps = _Steps(schedule, dataset_size, drop_last)
    ramp = _fit_ramp(schedule, dataset_size, drop_last, unit)
    lr_best: tuple[float, MegatronLR, tuple[float, float, float, float]] | None = None
    for candidate in _fit_lr(steps, schedule):
        devs = _simulate_megatron(steps, last, ramp, candidate)
        key = devs[3] + devs[2] * 1e-6
        if lr_best is None or key < lr_best[0]:
            lr_best = (key, candidate, devs)
    assert lr_best is not None
    _, lr, (max_b, mean_b, max_lr, mean_lr) = lr_best

    args: list[str] = [
        "--global-batch-size",
        str(last),
        "--micro-batch-size",
        str(micro_batch),
    ]
    if ramp is not None:
        args += ["--rampup-batch-size", str(ramp.start), str(ramp.increment), str(ramp.samples)]
    args += [
        "--train-samples",
        str(steps.total),
        "--lr",
        _num(lr.max),
        "--min-lr",
        _num(lr.min),
        "--lr-decay-style",
        lr.decay_style,
        "--lr-decay-samples",
        str(lr.decay_samples),
        "--lr-warmup-samples",
        str(lr.warmup_samples),
    ]
    if lr.warmup_samples > 0:
        args += ["--lr-warmup-init", _num(lr.init)]
    limitations: list[str] = []
    if schedule.optimizer == "sgd":
        args += ["--optimizer", "sgd", "--sgd-momentum", _num(schedule.momentum)]
    elif schedule.optimizer == "adamw":
        args += ["--optimizer", "adam", "--adam-beta1", _num(schedule.momentum)]
    else:
        args += ["--optimizer", "sgd", "--sgd-momentum", _num(schedule.momentum)]
        limitations.append(
            "Megatron-LM has no LARS optimizer: the arguments use SGD with the same momentum, "
            "which trains differently at large batches"
        )
    args += ["--weight-decay", _num(schedule.weight_decay)]

    if max_b > EXACT:
        how = (
            f"the closest ramp (--rampup-batch-size {ramp.start} {ramp.increment} "
            f"{ramp.samples}, then {last})"
            if ramp is not None
            else f"a fixed --global-batch-size {last}"
        )
        limitations.append(
            "Megatron-LM changes the global batch only through --rampup-batch-size, a linear "
            "ramp in equal sample intervals, and cannot express step changes of the batch at "
            f"arbitrary stage boundaries ({schedule.summary()}): {how} deviates from the "
            f"schedule's batch size by up to {_pct(max_b)} (samples-weighted mean "
            f"{_pct(mean_b)})"
        )
    if max_lr > EXACT:
        limitations.append(
            "Megatron-LM's LR schedule is one warm-up followed by one decay over the whole run "
            "and cannot express per-stage LR multipliers, per-stage warm-ups, step decays or "
            "the LR change that comes with each batch change: the closest (warm-up "
            f"{_num(lr.init)} -> {_num(lr.max)} over {lr.warmup_samples} samples, then "
            f"{_decay_words(lr)}) deviates from the schedule's LR by up to "
            f"{_pct(max_lr)} (samples-weighted mean {_pct(mean_lr)})"
        )
    if schedule.label_smoothing > 0:
        limitations.append(
            f"Megatron-LM's language-model losses have no label-smoothing argument; apply "
            f"label_smoothing={_num(schedule.label_smoothing)} in your loss function"
        )
    if drop_last and any(dataset_size % st.batch_size for st in schedule.stages):
        limitations.append(
            "Megatron-LM counts consumed samples without epochs: the samples the schedule "
            "drops at the end of each epoch (drop_last) are not dropped, so the same step "
            "numbers see a slightly shifted sample stream (batch sizes and LRs are matched in "
            "consumed samples)"
        )
    artefact = MegatronArgs(
        args=tuple(args),
        global_batch_size=last,
        micro_batch_size=micro_batch,
        data_parallel_size=data_parallel_size,
        train_samples=steps.total,
        ramp=ramp,
        lr=lr,
        max_batch_deviation=max_b,
        weighted_batch_deviation=mean_b,
        max_lr_deviation=max_lr,
        weighted_lr_deviation=mean_lr,
    )
    return Emitted(
        "megatron", artefact, tuple(limitations), _megatron_text(schedule, artefact, limitations)
    )


def _decay_words(lr: MegatronLR) -> str:
    if lr.decay_style == "constant":
        return "constant"
    return f"{lr.decay_style} decay to {_num(lr.min)}"


#: The bash array the Megatron arguments file defines.
MEGATRON_ARRAY: Final = "STAGETUNE_MEGATRON_ARGS"


def _megatron_text(schedule: Schedule, artefact: MegatronArgs, limitations: list[str]) -> str:
    """A bash file that defines the arguments as an array: ``source`` it in the launcher and
    pass ``"${STAGETUNE_MEGATRON_ARGS[@]}"`` to ``pretrain_*.py`` with the model's own."""
    lines = [
        "#!/usr/bin/env bash",
        f"# Megatron-LM arguments for the stagetune schedule {schedule.summary()}",
        f"# data-parallel size {artefact.data_parallel_size} (GPUs = data-parallel x "
        "tensor-parallel x pipeline-parallel)",
        "# Use it in your launcher (bash):",
        "#   source ./this-file.sh",
        f'#   torchrun ... pretrain_gpt.py "${{{MEGATRON_ARRAY}[@]}}" <your model and data '
        "arguments>",
    ]
    lines += [f"# LIMITATION: {text}" for text in limitations] or ["# exact: no limitations"]
    pairs: list[str] = []
    current: list[str] = []
    for token in artefact.args:
        if token.startswith("--") and current:
            pairs.append(" ".join(current))
            current = []
        current.append(shlex.quote(token))
    if current:
        pairs.append(" ".join(current))
    lines.append(f"{MEGATRON_ARRAY}=(")
    lines += [f"  {p}" for p in pairs]
    lines.append(")")
    return "\n".join(lines) + "\n"


# ============================================================================== DeepSpeed


@dataclass(frozen=True)
class DeepSpeedStage:
    """One stage as one DeepSpeed run: its config and where it sits in the schedule."""

    stage_index: int
    start_epoch: int
    end_epoch: int
    steps_per_epoch: int
    optimizer_steps: int
    config: dict[str, Any]
    max_lr_deviation: float
    """Largest relative difference between DeepSpeed's scheduler and the schedule's LR."""


@dataclass(frozen=True)
class DeepSpeedPlan:
    world_size: int
    stages: tuple[DeepSpeedStage, ...]

    def to_dict(self, limitations: Sequence[str] = ()) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "how_to_run": _DEEPSPEED_HOW_TO,
            "stages": [
                {
                    "stage": s.stage_index + 1,
                    "epochs": [s.start_epoch, s.end_epoch],
                    "steps_per_epoch": s.steps_per_epoch,
                    "optimizer_steps": s.optimizer_steps,
                    "config": s.config,
                }
                for s in self.stages
            ],
            "limitations": list(limitations),
        }


def deepspeed_files(plan: DeepSpeedPlan, limitations: Sequence[str] = ()) -> dict[str, str]:
    """What DeepSpeed takes, as files: one ``ds_config_stage<N>.json`` per stage (a plain
    DeepSpeed config, for ``deepspeed --deepspeed_config`` or ``deepspeed.initialize``), and
    ``stages.json``: which config runs when (epochs, optimizer steps), how to switch between
    them, and the limitations."""
    files: dict[str, str] = {}
    stages = []
    for s in plan.stages:
        name = f"ds_config_stage{s.stage_index + 1}.json"
        files[name] = json.dumps(s.config, indent=2) + "\n"
        stages.append(
            {
                "stage": s.stage_index + 1,
                "config_file": name,
                "epochs": [s.start_epoch, s.end_epoch],
                "steps_per_epoch": s.steps_per_epoch,
                "optimizer_steps": s.optimizer_steps,
            }
        )
    index = {
        "world_size": plan.world_size,
        "how_to_run": _DEEPSPEED_HOW_TO.replace("stages[i].config", "stages[i].config_file"),
        "stages": stages,
        "limitations": list(limitations),
    }
    files["stages.json"] = json.dumps(index, indent=2) + "\n"
    return files


_DEEPSPEED_HOW_TO = (
    "DeepSpeed fixes train_batch_size for a run, so run the stages one after another: for "
    "stage i, deepspeed.initialize(config=stages[i].config, ...); for i > 0 "
    "engine.load_checkpoint(dir, load_lr_scheduler_states=False); then "
    "engine.lr_scheduler.step(0) so the stage's first step gets its LR; train "
    "optimizer_steps steps (the stage's epochs); engine.save_checkpoint(dir). For the "
    "schedule's exact LR at every step, pass tuner.runtime.ScheduleLR as lr_scheduler to "
    "deepspeed.initialize instead of the scheduler block."
)


def _ds_gamma_warmup(it: int, warmup: int) -> float | None:
    return it / warmup if it < warmup else None


def _deepspeed_lr(config: dict[str, Any], it: int) -> float:
    """DeepSpeed's WarmupLR / WarmupDecayLR / WarmupCosineLR (linear warm-up) at iteration
    ``it`` (after ``lr_scheduler.step(it)``)."""
    kind = config["scheduler"]["type"]
    p = config["scheduler"]["params"]
    warmup = max(2, int(p["warmup_num_steps"]))
    if kind == "WarmupCosineLR":
        org = float(config["optimizer"]["params"]["lr"])
        if it < warmup:
            ratio = p["warmup_min_ratio"] + (it / warmup) * (1.0 - p["warmup_min_ratio"])
        else:
            real = it - warmup + 1
            progress = min(1.0, real / max(1, p["total_num_steps"] - warmup))
            ratio = max(
                0.0,
                p["cos_min_ratio"]
                + (1.0 - p["cos_min_ratio"]) * (1 + math.cos(math.pi * progress)) / 2,
            )
        return org * float(ratio)
    low, high = float(p["warmup_min_lr"]), float(p["warmup_max_lr"])
    gamma = _ds_gamma_warmup(it, warmup)
    if gamma is None:
        if kind == "WarmupDecayLR":
            total = int(p["total_num_steps"])
            gamma = max(0.0, (total - it) / max(1.0, total - warmup))
        else:
            gamma = 1.0
    return low + (high - low) * gamma


def _optimizer_block(schedule: Schedule, lr: float) -> tuple[dict[str, Any], str | None]:
    if schedule.optimizer == "adamw":
        return {
            "type": "AdamW",
            "params": {
                "lr": lr,
                "betas": [schedule.momentum, 0.999],
                "weight_decay": schedule.weight_decay,
            },
        }, None
    block = {
        "type": "SGD",
        "params": {"lr": lr, "momentum": schedule.momentum, "weight_decay": schedule.weight_decay},
    }
    if schedule.optimizer == "lars":
        return block, (
            "DeepSpeed has no LARS optimizer: the configs use SGD (torch.optim.SGD) with the "
            "same momentum; bring your own LARS as a client optimizer to keep it"
        )
    return block, None


def emit_deepspeed(
    schedule: Schedule,
    dataset_size: int,
    world_size: int,
    micro_batch: int | None = None,
    *,
    drop_last: bool = True,
) -> Emitted[DeepSpeedPlan]:
    """One DeepSpeed config per stage, for ``world_size`` GPUs and at most ``micro_batch``
    samples per GPU per pass.

    Raises RetargetError (naming every stage) when a stage's batch cannot be split evenly
    over ``world_size``.
    """
    placed = retarget(schedule, world_size, micro_batch)
    limitations: list[str] = []
    if schedule.num_stages > 1:
        limitations.append(
            "DeepSpeed's batch size (train_batch_size) is fixed for a run, and its data-"
            "efficiency features (curriculum learning, dynamic batching by token count) "
            "change the data per batch, not the batch size per epoch, so they cannot express "
            f"the {schedule.num_stages} stages: switching stages means stopping at the stage's "
            "last epoch and restarting from its checkpoint with the next stage's config"
        )
    per_stage_steps = [
        schedule.steps_per_epoch(i, dataset_size, drop_last=drop_last)
        for i in range(schedule.num_stages)
    ]
    stages: list[DeepSpeedStage] = []
    lr_notes: list[str] = []
    opt_note: str | None = None
    for i, st in enumerate(schedule.stages):
        placement = placed.placement(i)
        local = placement.local_batches[0]
        accumulation = next(
            a for a in range(placement.accumulation_steps, local + 1) if local % a == 0
        )
        spe = per_stage_steps[i]
        n = spe * st.num_epochs
        want = [
            schedule.lr_at(epoch + k / spe)
            for epoch in range(st.start_epoch, st.end_epoch)
            for k in range(spe)
        ]
        peak = schedule.peak_lr(i)
        start = schedule.stage_start_lr(i)
        warm = round(st.warmup_epochs * spe)
        final = peak * st.decay_final_factor
        optimizer, opt_note = _optimizer_block(schedule, peak)
        scheduler: dict[str, Any]
        if st.decay == "cosine":
            scheduler = {
                "type": "WarmupCosineLR",
                "params": {
                    "total_num_steps": n,
                    "warmup_min_ratio": start / peak if warm else 1.0,
                    "warmup_num_steps": max(1, warm),
                    "cos_min_ratio": st.decay_final_factor,
                    "warmup_type": "linear",
                },
            }
        elif st.decay == "linear":
            scheduler = {
                "type": "WarmupDecayLR",
                "params": {
                    "total_num_steps": n,
                    "warmup_min_lr": start if warm else final,
                    "warmup_max_lr": peak,
                    "warmup_num_steps": max(1, warm),
                    "warmup_type": "linear",
                },
            }
        else:
            scheduler = {
                "type": "WarmupLR",
                "params": {
                    "warmup_min_lr": start if warm else peak,
                    "warmup_max_lr": peak,
                    "warmup_num_steps": max(1, warm),
                    "warmup_type": "linear",
                },
            }
        config: dict[str, Any] = {
            "train_batch_size": st.batch_size,
            "train_micro_batch_size_per_gpu": local // accumulation,
            "gradient_accumulation_steps": accumulation,
            "optimizer": optimizer,
            "scheduler": scheduler,
        }
        got = [_deepspeed_lr(config, k) for k in range(n)]
        devs = [abs(g - w) / w if w > 0 else abs(g) for g, w in zip(got, want, strict=True)]
        worst = max(devs)
        label = f"stage {i + 1} (epochs {st.start_epoch}-{st.end_epoch})"
        if worst > EXACT:
            off = sum(1 for d in devs if d > 0.01)
            why = {
                "step": "DeepSpeed has no step-decay scheduler: the config holds the peak LR "
                "and the drops are lost",
                "linear": "WarmupDecayLR warms up from the LR it decays to, and warms up for at "
                "least 2 steps",
                "cosine": "WarmupCosineLR's decay is one step behind and warms up for at least "
                "2 steps",
                "constant": "WarmupLR warms up for a whole number of steps, at least 2",
            }[st.decay]
            lr_notes.append(
                f"{label}: {scheduler['type']} deviates from the schedule's LR by up to "
                f"{_pct(worst)} ({off} of {n} steps off by more than 1%): {why}"
            )
        stages.append(DeepSpeedStage(i, st.start_epoch, st.end_epoch, spe, n, config, worst))
    if opt_note:
        limitations.append(opt_note)
    limitations.extend(lr_notes)
    if schedule.label_smoothing > 0:
        limitations.append(
            "DeepSpeed's config has no label smoothing: apply "
            f"label_smoothing={_num(schedule.label_smoothing)} in your loss function"
        )
    if not drop_last and any(dataset_size % st.batch_size for st in schedule.stages):
        limitations.append(
            "DeepSpeed's batch size is fixed within a run: the smaller last step of each epoch "
            "(drop_last=False) cannot be expressed; use drop_last=True in your DataLoader"
        )
    plan = DeepSpeedPlan(world_size, tuple(stages))
    text = json.dumps(plan.to_dict(limitations), indent=2) + "\n"
    return Emitted("deepspeed", plan, tuple(limitations), text)


# ============================================================================== dispatch

Format = Literal["megatron", "deepspeed"]


def emit(
    fmt: Format,
    schedule: Schedule,
    dataset_size: int,
    world_size: int,
    micro_batch: int | None = None,
    *,
    drop_last: bool = True,
) -> Emitted[MegatronArgs] | Emitted[DeepSpeedPlan]:
    """``emit_megatron`` or ``emit_deepspeed`` by name."""
    if fmt == "megatron":
        return emit_megatron(schedule, dataset_size, world_size, micro_batch, drop_last=drop_last)
    if fmt == "deepspeed":
        return emit_deepspeed(schedule, dataset_size, world_size, micro_batch, drop_last=drop_last)
    raise ValidationError(f"unknown format {fmt!r}; use megatron or deepspeed")
