"""The study spec: what a user asks the tuner for (task, search space, objective, budget).

A :class:`StudySpec` is a pydantic v2 model. Every model forbids unknown keys (a typo is an
error naming the field) and every number is bounded (an absurd value is an error saying the
allowed range). ``task: mnist1d`` alone is a valid spec: everything else has a default, and
the run-wide settings left ``null`` (epochs, base batch size, base LR, optimizer) take the
task's defaults when the study runs (:meth:`StudySpec.resolve`).

Example (YAML; JSON works too)::

    task: mnist1d
    name: mnist1d-demo
    seed: 0
    schedule: {total_epochs: 12, scaling_rule: linear}
    space:
      stages: {min: 1, max: 3}
      min_stage_fraction: 0.15
      batch_size: {min: 32, max: 512}
      lr_multiplier: {min: 0.5, max: 2.0}
      warmup_epochs: {min: 0.0, max: 1.0}
    objective: {kind: accuracy, max_mean_batch_size: 256}
    budget: {trials: 12, grace_period_epochs: 3, reduction_factor: 3}
    resources: {workers: 1, cpus_per_worker: 1}
    baselines: true

``task_options`` are checked against the options model the task publishes, without importing
the task (:func:`tuner.tasks.task_option_problems`; path options must lie inside the datasets
root, :mod:`tuner.task_paths`), each problem reported at ``task_options.<option>``. The check
runs wherever a spec is validated: the API, ``stagetune tune`` and the worker that runs it.

Feasibility that needs the task (its defaults, its dataset size) is checked by
:meth:`StudySpec.resolve` and :func:`tuner.space.check_feasible` when the study starts; what
the spec alone can tell is checked here, so the API rejects it with a 422.
"""

from __future__ import annotations

import difflib
import json
import math
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal, Self

import pydantic
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from tuner.errors import StagetuneError, ValidationError, field_problems
from tuner.tasks import MetricDirection, check_task_name, resolve_metric, task_option_problems

__all__ = [
    "BASELINE_NAMES",
    "MAX_TRIALS",
    "AccuracyObjective",
    "BatchSizeRange",
    "Budget",
    "IntRange",
    "Objective",
    "ParetoObjective",
    "ResolvedSpec",
    "Resources",
    "RunSettings",
    "SearchSpace",
    "StageDecay",
    "StudySpec",
    "TaskDefaults",
    "TieBreak",
    "TimeToAccuracyObjective",
    "format_validation_error",
    "spec_problems",
]

#: The baselines every study evaluates first (when ``baselines: true``), in this order.
BASELINE_NAMES: Final[tuple[str, ...]] = ("small_batch", "large_batch", "increase_batch")

MAX_TRIALS: Final = 10_000
MAX_EPOCHS: Final = 10_000
MAX_SPACE_STAGES: Final = 16
MAX_BATCH: Final = 2**24
MAX_SPEC_CHARS: Final = 256 * 1024

StageDecay = Literal["constant", "cosine", "linear"]
Cost = Literal["steps", "wall_time"]
#: How the seed runs' pick treats finalists within the seeds' noise of the best mean
#: (``tuner.seeds.pick``): the cheaper in optimizer steps, or always the best mean.
TieBreak = Literal["fewer_steps", "mean"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False)


# --------------------------------------------------------------------------------------------
# Run-wide schedule settings
# --------------------------------------------------------------------------------------------


class RunSettings(_Model):
    """Settings shared by every schedule of the study; ``null`` = the task's default."""

    total_epochs: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=MAX_EPOCHS,
        description="Epochs of every trial; null: the task default.",
    )
    base_lr: float | None = Field(
        default=None,
        gt=0,
        le=100,
        description="LR at base_batch_size (the multipliers refer to it); null: task default.",
    )
    base_batch_size: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=MAX_BATCH,
        description="Batch size base_lr is tuned for (the small-batch baseline); null: task "
        "default.",
    )
    scaling_rule: Literal["none", "linear", "sqrt"] = Field(
        default="linear",
        description="How a stage's LR scales with its batch size before the multiplier.",
    )
    optimizer: Literal["sgd", "adamw", "lars"] | None = Field(
        default=None, description="Optimizer; null: the task's default."
    )
    momentum: float | None = Field(
        default=None, ge=0, lt=1, description="null: the task's default."
    )
    weight_decay: float | None = Field(
        default=None, ge=0, le=1, description="null: the task's default."
    )


# --------------------------------------------------------------------------------------------
# Search space
# --------------------------------------------------------------------------------------------


class IntRange(_Model):
    min: int = Field(strict=True, ge=1, le=MAX_SPACE_STAGES)
    max: int = Field(strict=True, ge=1, le=MAX_SPACE_STAGES)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class BatchSizeRange(_Model):
    """Global batch sizes: the powers of two in ``[min, max]`` (that are multiples of
    ``workers x micro_batch`` where a micro-batch is set). ``null`` bounds: ``min`` = the base
    batch size, ``max`` = 16 x ``min``."""

    min: int | None = Field(strict=True, default=None, ge=1, le=MAX_BATCH)
    max: int | None = Field(strict=True, default=None, ge=1, le=MAX_BATCH)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min is not None and self.max is not None:
            if self.min > self.max:
                raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
            if _pow2_floor(self.max) < self.min:
                raise ValueError(
                    f"no power of two lies in [{self.min}, {self.max}]; widen the range "
                    f"(e.g. max: {_pow2_ceil(self.min)})"
                )
        return self


#: The LR-multiplier bounds a ``null`` bound starts from (before it is widened).
DEFAULT_LR_MULTIPLIER: Final = (0.25, 4.0)


class LrMultiplierRange(_Model):
    """A log range around 1, where 1 is the LR the scaling rule gives for the stage's batch.
    A ``null`` bound (the default) is 0.25 (min) or 4 (max), widened so that both the linear
    and the square-root rule's LR at the largest batch are in the range
    (``tuner.space.lr_multiplier_range``); a bound the spec gives is kept. The bounds stay
    ``null`` in the stored spec, so a study read back from the store widens them too."""

    min: float | None = Field(
        default=None,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="Lowest multiplier; null: 0.25, widened down to the square-root rule's LR "
        "at the largest batch under linear scaling.",
    )
    max: float | None = Field(
        default=None,
        ge=1,
        le=1000,
        allow_inf_nan=False,
        description="Highest multiplier; null: 4, widened up to the linear rule's LR at the "
        "largest batch under square-root (or no) scaling.",
    )


class WarmupRange(_Model):
    """Warm-up epochs at the start of each stage (clipped to the stage's length)."""

    min: float = Field(default=0.0, ge=0, le=MAX_EPOCHS, allow_inf_nan=False)
    max: float = Field(default=1.0, ge=0, le=MAX_EPOCHS, allow_inf_nan=False)

    @model_validator(mode="after")
    def _ordered(self) -> Self:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must not exceed max ({self.max})")
        return self


class SearchSpace(_Model):
    """The ranges the tuner draws schedules from.

    Ordering is built into the sampling (boundaries are increasing, batch sizes non-decreasing
    unless ``allow_decreasing_batch``), so every drawn schedule is valid.
    """

    stages: IntRange = Field(default=IntRange(min=1, max=4), description="Number of stages.")
    min_stage_fraction: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Shortest stage as a fraction of the run (and at least one epoch); stage "
        "boundaries are whole epochs.",
    )
    batch_size: BatchSizeRange = BatchSizeRange()
    lr_multiplier: LrMultiplierRange = LrMultiplierRange()
    warmup_epochs: WarmupRange = WarmupRange()
    label_smoothing: tuple[Annotated[float, Field(ge=0, le=0.5)], ...] = Field(
        default=(0.0,),
        min_length=1,
        max_length=8,
        description="Label-smoothing values to choose from (one value: fixed).",
    )
    decay: tuple[StageDecay, ...] = Field(
        default=("constant",),
        min_length=1,
        max_length=3,
        description="LR decays inside a stage to choose from, per stage.",
    )
    allow_decreasing_batch: bool = False

    @field_validator("label_smoothing", "decay")
    @classmethod
    def _unique(cls, value: tuple[Any, ...]) -> tuple[Any, ...]:
        if len(set(value)) != len(value):
            raise ValueError("choices must be distinct")
        return value


# --------------------------------------------------------------------------------------------
# Objectives
# --------------------------------------------------------------------------------------------


#: ``objective.metric``: a validation metric the task declares (``workers.task_options``).
MetricName = Annotated[
    str | None,
    Field(
        default=None,
        pattern=r"^val_[a-z][a-z0-9_]{0,39}$",
        description="The validation metric to optimise, one the task declares (e.g. "
        "val_accuracy, val_loss, val_psnr); its direction (max or min) is the task's. Default: "
        "the task's primary metric (val_accuracy for classification).",
    ),
]


class AccuracyObjective(_Model):
    """Optimise the final value of the metric (``metric``: the task's primary one by default,
    validation accuracy for classification), optionally under a constraint.

    Constraints are checked on each sampled schedule before it is trained (they follow from
    the schedule and the dataset size): a violating schedule is never trained; it is recorded
    in the Optuna study as infeasible so the sampler learns to avoid the region.
    """

    kind: Literal["accuracy"] = "accuracy"
    metric: MetricName = None
    max_mean_batch_size: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BATCH,
        description="Mean batch size (samples / steps) at most this.",
    )
    min_mean_batch_size: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BATCH,
        description="Mean batch size (samples / steps) at least this.",
    )
    max_steps: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=10**12,
        description="Total optimizer steps of the run at most this.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        lo, hi = self.min_mean_batch_size, self.max_mean_batch_size
        if lo is not None and hi is not None and lo > hi:
            raise ValueError(
                f"min_mean_batch_size ({lo}) exceeds max_mean_batch_size ({hi}): no schedule "
                "can meet both"
            )
        return self

    @property
    def has_constraint(self) -> bool:
        return any(
            v is not None
            for v in (self.max_mean_batch_size, self.min_mean_batch_size, self.max_steps)
        )


class TimeToAccuracyObjective(_Model):
    """Minimise the cost (optimizer steps or wall time) of reaching a target value of the
    metric: ``target_accuracy`` (validation accuracy) or ``target`` (of ``metric``, reached when
    at least it for a metric to maximise, at most it for one to minimise).

    A trial stops as soon as it reaches the target; one that never does scores
    ``penalty_factor x (its whole-run cost) x (1 + shortfall)`` so nearer misses rank better.
    """

    kind: Literal["time_to_accuracy"] = "time_to_accuracy"
    metric: MetricName = None
    target_accuracy: float | None = Field(
        default=None, gt=0, le=1, description="Validation accuracy to reach."
    )
    target: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="Value of objective.metric to reach (instead of target_accuracy).",
    )
    cost: Cost = "steps"
    penalty_factor: float = Field(default=2.0, ge=1, le=100)

    @model_validator(mode="after")
    def _one_target(self) -> Self:
        if (self.target_accuracy is None) == (self.target is None):
            raise ValueError(
                "time_to_accuracy needs one target: target_accuracy (validation accuracy, "
                "0-1) or target (a value of objective.metric)"
            )
        if self.target_accuracy is not None and self.metric not in (None, "val_accuracy"):
            raise ValueError(
                f"target_accuracy is a validation accuracy but objective.metric is "
                f"{self.metric}: give target (a value of {self.metric}) instead"
            )
        return self

    @property
    def target_value(self) -> float:
        value = self.target_accuracy if self.target_accuracy is not None else self.target
        assert value is not None
        return value


class ParetoObjective(_Model):
    """The metric (max or min, as the task declares it) and the cost (min) as a Pareto front;
    no early stopping (ASHA needs one metric). The recommended schedule is the cheapest front
    member whose metric is within ``accuracy_tolerance`` (in the metric's units) of the
    front's best."""

    kind: Literal["pareto"] = "pareto"
    metric: MetricName = None
    cost: Cost = "steps"
    accuracy_tolerance: float = Field(default=0.01, ge=0, le=1e6)


def _objective_kind(value: Any) -> str | None:
    """The discriminator of :data:`Objective`: ``kind``, ``accuracy`` when left out."""
    if isinstance(value, dict):
        kind = value.get("kind", "accuracy")
        return kind if isinstance(kind, str) else None
    kind = getattr(value, "kind", None)
    return kind if isinstance(kind, str) else None


Objective = Annotated[
    Annotated[AccuracyObjective, Tag("accuracy")]
    | Annotated[TimeToAccuracyObjective, Tag("time_to_accuracy")]
    | Annotated[ParetoObjective, Tag("pareto")],
    Discriminator(
        _objective_kind,
        custom_error_type="invalid_objective_kind",
        custom_error_message="objective.kind must be one of accuracy, time_to_accuracy, pareto",
    ),
]


# --------------------------------------------------------------------------------------------
# Budget and resources
# --------------------------------------------------------------------------------------------


class Budget(_Model):
    trials: int = Field(
        strict=True,
        default=16,
        ge=1,
        le=MAX_TRIALS,
        description="Trials in all, the baselines included.",
    )
    trial_epochs: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=MAX_TRIALS * MAX_EPOCHS,
        description="Compute budget of the search in trial-epochs (epochs trained by its "
        "trials, cooldown probes included, forked prefixes not): no trial starts once it is "
        "spent, the running ones finish. The study ends at this or at budget.trials, "
        "whichever comes first; the finalists' seed runs are not counted. null: trials only.",
    )
    max_concurrent: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=1024,
        description="Trials at once; null: as many as the cluster fits.",
    )
    grace_period_epochs: int = Field(
        strict=True,
        default=1,
        ge=1,
        le=MAX_EPOCHS,
        description="ASHA: epochs a trial runs before it can be stopped (its first rung; "
        "the next ones at this x reduction_factor^k). Ranked on cooldown probes, 1, 2 and 3 "
        "epochs searched equally well in the benchmarks' 10- and 12-epoch runs; 1 runs more, "
        "shorter trials.",
    )
    reduction_factor: float = Field(
        default=3.0,
        ge=2,
        le=16,
        description="ASHA: 1/fraction kept per rung; a rung stops no trial before it holds "
        "this many results.",
    )
    early_stopping: bool = Field(
        default=True, description="Stop unpromising trials with ASHA (single-objective studies)."
    )
    cooldown_probes: bool = Field(
        default=True,
        description="ASHA ranks a trial at each rung by a cooldown probe (a branch with the "
        "LR annealed to zero, then evaluated and thrown away), not by its mid-run accuracy.",
    )
    probe_fraction: float = Field(
        default=0.2,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="A probe's length as a fraction of the epochs the trial has trained.",
    )
    prefix_reuse: float = Field(
        default=0.5,
        ge=0,
        lt=1,
        allow_inf_nan=False,
        description="Share of tuned trials (after the startup ones) that keep the first "
        "stages of one of the best trials so far and let the sampler choose the rest; they "
        "fork from its stage-boundary state instead of training those stages again.",
    )
    prefix_store_mb: int = Field(
        strict=True,
        default=2048,
        ge=0,
        le=1_048_576,
        description="Disk for the trial states saved at stage boundaries (forks start from "
        "them; least recently used go first); 0: save none, every trial trains its whole run.",
    )
    search: Literal["optuna", "stagewise", "pbt"] = Field(
        default="optuna",
        description="optuna: schedules drawn by the Optuna sampler (budget.sampler) with ASHA, "
        "cooldown probes and prefix reuse; stagewise: the schedule is searched stage by stage "
        "in synchronous rounds (budget.stage_candidates candidates per round, each trained to "
        "its stage's end and scored by a cooldown probe there; the budget.stage_keep best "
        "prefixes are forked with candidates for the next stage, drawn by the sampler); pbt: "
        "Ray Tune's Population Based Training over the batch size and LR multiplier, a stage "
        "boundary at each perturbation (the trials after the baselines are the population). "
        "stagewise and pbt: single-objective studies.",
    )
    stage_candidates: int = Field(
        strict=True,
        default=6,
        ge=2,
        le=256,
        description="stagewise: candidates trained per round (one round per stage).",
    )
    stage_keep: int = Field(
        strict=True,
        default=2,
        ge=1,
        le=64,
        description="stagewise: the best prefixes of a round (by their cooldown probe at "
        "the stage's end) that the next round's candidates fork from.",
    )
    pbt_interval_epochs: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=MAX_EPOCHS,
        description="PBT: epochs between perturbations; null: the run cut into space.stages.max "
        "segments.",
    )
    noise_candidate: bool = Field(
        default=True,
        description="Once the small-batch baseline has run, add one candidate whose batch "
        "follows its measured gradient noise scale (McCandlish et al. 2018), rounded down to "
        "the space's powers of two; it seeds the sampler and is reported beside the "
        "baselines. Needs baselines and a single-objective study.",
    )
    divergence_factor: float | None = Field(
        default=20.0,
        gt=1,
        le=1e6,
        allow_inf_nan=False,
        description="A trial whose validation loss stays above this many times its lowest so "
        "far for two epochs in a row is stopped as diverged (after an LR or batch increase too "
        "large for the model the loss jumps by orders of magnitude and does not come back; a "
        "run that learns stays within a few times its lowest, or spikes for one epoch at a "
        "high LR and comes back). null: only a non-finite loss stops a trial.",
    )
    recipe_candidates: bool = Field(
        default=True,
        description="Train the published recipes fitted to the study's budget first: a "
        "constant batch and Smith's increasing batch, each starting from the smallest batch "
        "with which the run meets the objective's constraints (max_steps), the LR by the "
        "scaling rule (for AdamW the base LR, and the constant batch once more at the "
        "square-root rule's LR), a decay at the end; under a step cap also a batch warm-up "
        "(a short first stage, then one larger batch: the pair with the most steps whose LR "
        "grows at most 4x). Under a step cap the batch warm-up trains first and the "
        "increasing batch second, else the constant batch first. They seed "
        "the sampler and are reported beside the baselines (fitted_batch_warmup, "
        "fitted_increase, fitted_constant, fitted_constant_sqrt). Once they have trained, "
        "the best two train again with their LR moved (recipe_lr_up for SGD: the first "
        "stage's LR doubled and every larger batch's tripled unless the recipe cut it, "
        "else recipe_first_lr_double: "
        "the first stage's doubled; recipe_lr_half; then the same for the second-best, "
        "runner_up_lr_up or runner_up_first_lr_double, runner_up_lr_half; "
        "at most one of 6 tuned trials of the budget; not in the stage-wise search). "
        "Single-objective studies with the optuna or stagewise search.",
    )
    seed_runs: int = Field(
        strict=True,
        default=3,
        ge=0,
        le=16,
        description="Before the study picks its result, its best full schedules (see "
        "`finalists`) and the best baseline train again on this many fresh seeds; the result "
        "is the best mean over those seeds (see `tie_break`), reported as mean ± std. 0: pick "
        "on the search's "
        "single run. Single-objective studies only.",
    )
    tie_break: TieBreak = Field(
        default="fewer_steps",
        description="How the seed runs pick among finalists the seeds cannot tell apart. "
        "`fewer_steps`: a finalist that takes at most 95 % of the best mean's optimizer steps, "
        "and that the best mean leads by less than twice the lead's standard error over the "
        "same fresh seeds and by no more than the best mean's own std over them (nor is it "
        "unstable where the best mean is stable), is picked instead (the fewest steps among "
        "several); the summary reports the best mean's lead. `mean`: always the best mean.",
    )
    finalists: int = Field(
        strict=True,
        default=2,
        ge=1,
        le=16,
        description="Tuned schedules that take part in the seed runs (the best ones by the "
        "search's own run), beside the best baseline.",
    )
    reserve_finalists: int = Field(
        strict=True,
        default=2,
        ge=0,
        le=16,
        description="When the pick's seed runs disagree (final accuracy spreads over 2 points, "
        "or a run did not complete), up to this many more tuned schedules train on the same "
        "fresh seeds before the pick: those whose search evidence (last cooldown-probe score, "
        "else accuracy) beats the pick's mean, schedules the search stopped early included. "
        "They also fill the finalist places left empty when fewer tuned schedules than "
        "`finalists` ran to the end (ASHA stopped the rest), on the same rule; and a stable "
        "pick sends the tuned schedules that ran to the end as close to a finalist as one run "
        "on the validation split can read (best first). 0: never.",
    )
    max_failures: int = Field(
        strict=True,
        default=1,
        ge=0,
        le=10,
        description="Retries of a trial whose training raises before it fails.",
    )
    sampler: Literal["tpe", "random", "nsga2"] = Field(
        default="tpe", description="Optuna sampler (seeded with the study seed)."
    )
    startup_trials: int = Field(
        strict=True,
        default=5,
        ge=1,
        le=1000,
        description="TPE: random trials before the model takes over.",
    )


class Resources(_Model):
    workers: int = Field(
        strict=True, default=1, ge=1, le=1024, description="Data-parallel workers per trial."
    )
    cpus_per_worker: float = Field(default=1.0, gt=0, le=256, allow_inf_nan=False)
    gpus_per_worker: float = Field(
        default=0.0,
        ge=0,
        le=16,
        allow_inf_nan=False,
        description="Fractions let trials share a GPU.",
    )
    micro_batch: int | None = Field(
        strict=True,
        default=None,
        ge=1,
        le=MAX_BATCH,
        description="Largest per-worker micro-batch (accumulation).",
    )
    performance_aware: bool = Field(
        default=False, description="Split each batch across workers by measured throughput."
    )

    @property
    def batch_unit(self) -> int:
        """Every batch size must be a multiple of this (workers x micro-batch, or workers)."""
        return self.workers * (self.micro_batch or 1)


# --------------------------------------------------------------------------------------------
# The study spec
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskDefaults:
    """What a task contributes to a spec's ``null`` settings (see :meth:`StudySpec.resolve`)."""

    epochs: int
    base_batch_size: int
    base_lr: float
    optimizer: Literal["sgd", "adamw", "lars"] = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0


@dataclass(frozen=True)
class ResolvedSpec:
    """A spec with every ``null`` replaced by a concrete value (what the engine runs)."""

    spec: StudySpec
    total_epochs: int
    base_lr: float
    base_batch_size: int
    optimizer: Literal["sgd", "adamw", "lars"]
    momentum: float
    weight_decay: float
    batch_min: int
    batch_max: int

    @property
    def n_baselines(self) -> int:
        return len(BASELINE_NAMES) if self.spec.baselines else 0


class StudySpec(_Model):
    """One tuning job. ``task`` is required; everything else has a default."""

    task: str = Field(min_length=1, max_length=100, description="A registered task name.")
    task_options: dict[str, Any] = Field(
        default_factory=dict,
        validate_default=True,
        description="Options of the task, checked against the options model the task "
        "publishes (unknown options, bounds; path options must lie inside the server's "
        "datasets root, STAGETUNE_DATASETS_DIR).",
    )
    name: str | None = Field(default=None, min_length=1, max_length=200)
    seed: int = Field(strict=True, default=0, ge=0, le=2**31 - 1)
    schedule: RunSettings = RunSettings()
    space: SearchSpace = SearchSpace()
    objective: Objective = AccuracyObjective()
    budget: Budget = Budget()
    resources: Resources = Resources()
    baselines: bool = Field(
        default=True,
        description="Evaluate the small-batch, large-batch (Goyal) and increase-the-batch "
        "(Smith) baselines as the first trials.",
    )

    @field_validator("task")
    @classmethod
    def _known_task(cls, value: str) -> str:
        try:
            return check_task_name(value)
        except ValidationError as exc:
            raise ValueError(str(exc)) from None

    @field_validator("task_options")
    @classmethod
    def _small_options(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"task_options must be plain JSON values: {exc}") from None
        if len(text) > 10_000:
            raise ValueError("task_options is too large (over 10,000 characters as JSON)")
        return value

    @field_validator("task_options")
    @classmethod
    def _valid_options(cls, value: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        """The task's own options model, where it publishes one, and the path policy
        (:mod:`tuner.task_paths`); each problem is reported at ``task_options.<option>``."""
        task = info.data.get("task")
        if task is None:  # the task name was invalid: that is the error to report
            return value
        problems = task_option_problems(task, value)
        if problems:
            raise pydantic.ValidationError.from_exception_data(
                "task_options",
                [
                    {
                        "type": PydanticCustomError(
                            "invalid_task_option",
                            "{message}",
                            {"message": problem.message},
                        ),
                        "loc": problem.loc,
                        "input": problem.value,
                    }
                    for problem in problems
                ],
            )
        return value

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        problems: list[str] = []
        n_baselines = len(BASELINE_NAMES) if self.baselines else 0
        if self.budget.trials <= n_baselines:
            problems.append(
                f"budget.trials ({self.budget.trials}) must exceed the {n_baselines} baseline "
                "trials (the budget includes them); raise budget.trials or set baselines: false"
            )
        epochs = self.schedule.total_epochs
        if epochs is not None:
            problems.extend(_epoch_problems(self, epochs))
        problems.extend(_batch_problems(self))
        problems.extend(_metric_problems(self))
        if self.budget.search == "pbt":
            if not isinstance(self.objective, AccuracyObjective):
                problems.append(
                    "budget.search: pbt ranks its population by accuracy: use objective.kind: "
                    "accuracy, or budget.search: optuna"
                )
            elif self.budget.trial_epochs is not None:
                problems.append(
                    "budget.trial_epochs applies to budget.search: optuna (PBT trains its "
                    "whole population: its compute is the population times the epochs); "
                    "remove it or use budget.search: optuna"
                )
            elif self.budget.trials - n_baselines < 2:
                problems.append(
                    "budget.search: pbt needs a population of at least 2 trials after the "
                    f"{n_baselines} baselines; raise budget.trials"
                )
        if self.budget.search == "stagewise":
            problems.extend(_stagewise_problems(self))
        if problems:
            raise ValueError("; ".join(problems))
        return self

    # ------------------------------------------------------------------ the metric

    def objective_metric(self) -> tuple[str, MetricDirection]:
        """The validation metric the study optimises and its direction (the task's
        declaration): ``objective.metric``, else validation accuracy for a
        ``target_accuracy``, else the task's primary metric."""
        target = getattr(self.objective, "target_accuracy", None)
        return resolve_metric(self.task, self.objective.metric, target_accuracy=target)

    # ------------------------------------------------------------------ loading

    @classmethod
    def from_yaml(cls, text: str) -> StudySpec:
        """Parse a spec from YAML or JSON text; :class:`ValidationError` listing every problem."""
        if len(text) > MAX_SPEC_CHARS:
            raise ValidationError(f"study spec is too large (over {MAX_SPEC_CHARS} characters)")
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
            problem = getattr(exc, "problem", None) or str(exc)
            raise ValidationError(f"study spec is not valid YAML{where}: {problem}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> StudySpec:
        """Validate a plain mapping; :class:`ValidationError` listing every problem."""
        if not isinstance(data, dict):
            raise ValidationError(
                "study spec must be a mapping with at least 'task:' (e.g. 'task: mnist1d'), "
                f"got {type(data).__name__}"
            )
        try:
            return cls.model_validate(data)
        except pydantic.ValidationError as exc:
            raise ValidationError(format_validation_error(exc)) from None

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain JSON (defaults included), e.g. for the store."""
        return self.model_dump(mode="json")

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    # ------------------------------------------------------------------ resolving

    def resolve(self, defaults: TaskDefaults) -> ResolvedSpec:
        """Fill the ``null`` settings from the task's defaults and check what then follows.

        Raises :class:`ValidationError` when the resolved spec cannot work (e.g. the grace
        period is longer than the run, or no batch size of the space fits the workers).
        """
        s = self.schedule
        epochs = s.total_epochs if s.total_epochs is not None else defaults.epochs
        base_batch = (
            s.base_batch_size if s.base_batch_size is not None else defaults.base_batch_size
        )
        batch_min = (
            self.space.batch_size.min if self.space.batch_size.min is not None else base_batch
        )
        batch_max = (
            self.space.batch_size.max if self.space.batch_size.max is not None else 16 * batch_min
        )
        problems = _epoch_problems(self, epochs)
        if batch_min > batch_max:
            problems.append(
                f"space.batch_size: min ({batch_min}) exceeds max ({batch_max}); set both bounds"
            )
        if problems:
            raise ValidationError("study spec cannot run: " + "; ".join(problems))
        return ResolvedSpec(
            spec=self,
            total_epochs=epochs,
            base_lr=s.base_lr if s.base_lr is not None else defaults.base_lr,
            base_batch_size=base_batch,
            optimizer=s.optimizer if s.optimizer is not None else defaults.optimizer,
            momentum=s.momentum if s.momentum is not None else defaults.momentum,
            weight_decay=s.weight_decay if s.weight_decay is not None else defaults.weight_decay,
            batch_min=batch_min,
            batch_max=batch_max,
        )


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------


def min_stage_epochs(min_stage_fraction: float, total_epochs: int) -> int:
    """The shortest allowed stage, in whole epochs (at least 1)."""
    return max(1, math.ceil(min_stage_fraction * total_epochs - 1e-9))


def _epoch_problems(spec: StudySpec, epochs: int) -> list[str]:
    out: list[str] = []
    if spec.budget.grace_period_epochs > epochs:
        out.append(
            f"budget.grace_period_epochs ({spec.budget.grace_period_epochs}) exceeds the run's "
            f"{epochs} epochs; use at most {epochs}"
        )
    min_len = min_stage_epochs(spec.space.min_stage_fraction, epochs)
    fit = epochs // min_len
    if spec.space.stages.min > fit:
        out.append(
            f"space.stages.min ({spec.space.stages.min}) stages of at least {min_len} epoch(s) "
            f"(min_stage_fraction {spec.space.min_stage_fraction} of {epochs} epochs) do not fit "
            f"in the run; lower space.stages.min to {fit} or space.min_stage_fraction"
        )
    if spec.space.warmup_epochs.min > epochs:
        out.append(
            f"space.warmup_epochs.min ({spec.space.warmup_epochs.min}) exceeds the run's "
            f"{epochs} epochs"
        )
    return out


def _batch_problems(spec: StudySpec) -> list[str]:
    out: list[str] = []
    unit = spec.resources.batch_unit
    lo, hi = spec.space.batch_size.min, spec.space.batch_size.max
    if unit & (unit - 1):
        out.append(
            f"batch sizes are powers of two, and none is a multiple of resources.workers x "
            f"micro_batch = {unit}; use a power-of-two number of workers (and micro-batch)"
        )
    elif hi is not None and _pow2_floor(hi) < unit:
        out.append(
            f"space.batch_size.max ({hi}) is smaller than workers x micro_batch = {unit}: "
            "no batch size of the space can be split across the workers; raise "
            f"space.batch_size.max to at least {unit}"
        )
    obj = spec.objective
    if isinstance(obj, AccuracyObjective):
        if (
            obj.max_mean_batch_size is not None
            and lo is not None
            and obj.max_mean_batch_size < _pow2_ceil(lo)
        ):
            out.append(
                f"objective.max_mean_batch_size ({obj.max_mean_batch_size}) is below the "
                f"smallest batch size of the space ({_pow2_ceil(lo)}): no schedule can meet "
                "it; lower space.batch_size.min or raise the constraint"
            )
        if (
            obj.min_mean_batch_size is not None
            and hi is not None
            and obj.min_mean_batch_size > _pow2_floor(hi)
        ):
            out.append(
                f"objective.min_mean_batch_size ({obj.min_mean_batch_size}) is above the "
                f"largest batch size of the space ({_pow2_floor(hi)}): no schedule can meet "
                "it; raise space.batch_size.max or lower the constraint"
            )
    return out


def _stagewise_problems(spec: StudySpec) -> list[str]:
    """What ``budget.search: stagewise`` needs: one objective (rounds rank by one metric),
    cooldown probes (the score of a prefix), boundary states (the forks) and stages."""
    budget = spec.budget
    out = []
    if isinstance(spec.objective, ParetoObjective):
        out.append(
            "budget.search: stagewise ranks each round's prefixes by one metric: use "
            "objective.kind: accuracy or time_to_accuracy, or budget.search: optuna"
        )
    if not budget.cooldown_probes:
        out.append(
            "budget.search: stagewise scores each prefix by a cooldown probe at its stage's "
            "end: set budget.cooldown_probes: true"
        )
    if budget.prefix_store_mb <= 0:
        out.append(
            "budget.search: stagewise forks each round's candidates from the kept prefixes' "
            "boundary states: set budget.prefix_store_mb above 0"
        )
    if spec.space.stages.max < 2:
        out.append(
            "budget.search: stagewise searches stage by stage: allow space.stages.max of 2 or more"
        )
    if budget.stage_keep > budget.stage_candidates:
        out.append(
            f"budget.stage_keep ({budget.stage_keep}) must not exceed budget.stage_candidates "
            f"({budget.stage_candidates})"
        )
    return out


def _metric_problems(spec: StudySpec) -> list[str]:
    try:
        spec.objective_metric()
    except ValidationError as exc:
        return [str(exc)]
    except StagetuneError as exc:  # the task's own declaration is broken
        return [str(exc)]
    return []


def _pow2_floor(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _pow2_ceil(n: int) -> int:
    return 1 << (n - 1).bit_length()


_OBJECTIVE_KINDS: Final = frozenset({"accuracy", "time_to_accuracy", "pareto"})


_OBJECTIVE_MODELS: Final[dict[str, type[BaseModel]]] = {
    "accuracy": AccuracyObjective,
    "time_to_accuracy": TimeToAccuracyObjective,
    "pareto": ParetoObjective,
}


def _did_you_mean(loc: Sequence[str]) -> str:
    """For an unknown field at ``loc`` (pydantic's location, objective kind tag included):
    the closest known field of the model it is in, else where to look."""
    model: type[BaseModel] | None = StudySpec
    for part in loc[:-1]:
        if model is None:
            break
        if part in _OBJECTIVE_MODELS and model is not StudySpec:
            model = _OBJECTIVE_MODELS[part]
            continue
        field = model.model_fields.get(part)
        annotation = None if field is None else field.annotation
        model = next(
            (
                a
                for a in (annotation, *typing.get_args(annotation))
                if isinstance(a, type) and issubclass(a, BaseModel)
            ),
            None,
        )
        if part == "objective":
            model = AccuracyObjective  # the tag comes next; a stand-in until then
    if model is not None:
        close = difflib.get_close_matches(loc[-1], list(model.model_fields), n=1, cutoff=0.5)
        if close:
            where = ".".join(p for p in loc[:-1] if p not in _OBJECTIVE_MODELS)
            return f" (did you mean `{where + '.' if where else ''}{close[0]}`?)"
    return " (check the spelling; see the documented spec fields)"


def spec_problems(exc: pydantic.ValidationError) -> list[tuple[list[str | int], str, str]]:
    """Each problem of a spec that failed validation as (field path, reason, pydantic type):
    the objective's kind tag is not part of the path, an unknown field names the closest known
    one. The CLI's one line (:func:`format_validation_error`) and the API's ``details`` are
    both made from this."""
    out = []
    for problem in field_problems(exc):
        parts = list(problem.loc)
        if len(parts) > 1 and parts[0] == "objective" and parts[1] in _OBJECTIVE_KINDS:
            del parts[1]  # the discriminator's tag, not a field
        msg = problem.message
        if problem.type == "extra_forbidden":
            msg = "unknown field" + _did_you_mean([str(p) for p in problem.loc])
        out.append((parts, msg, problem.type))
    return out


def format_validation_error(exc: pydantic.ValidationError) -> str:
    """One line per problem, ``field.path: reason``, prefixed with ``invalid study spec``."""
    lines = [
        f"{'.'.join(str(p) for p in loc)}: {msg}" if loc else msg
        for loc, msg, _ in spec_problems(exc)
    ]
    return "invalid study spec: " + "; ".join(lines)
