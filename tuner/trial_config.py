"""The trial config: what the engine hands each trial, typed once for both sides.

The engine builds a trial's config (:meth:`TuningEngine.common_config` plus the schedule the
searcher picked) and Ray Tune passes it to the trainable as a plain mapping; the trial loop
(``workers.loop``), the trainable's resource request and a replay read it back through
:meth:`TrialConfig.from_config`. The rules for each key (type, range, default) live here
only. No torch: the engine checks a study's config before any trial starts.

Keys the model does not know are ignored (the engine carries bookkeeping: the trial's meta,
its lineage, the prefix store). ``resources: {workers, cpus_per_worker, gpus_per_worker}`` is
accepted as another spelling of those three keys (the flat keys win).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Annotated, Any, Final, Literal, Self

import pydantic
import pydantic_core
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from tuner.errors import ValidationError, field_problems
from tuner.schedule import Schedule

__all__ = ["STOP_AFTER_KEY", "TrialConfig", "TrialResources"]

#: The key of the stage-wise search: the epoch after which the scheduler stops the trial (the
#: end of the stage its round searches; absent when that stage is the schedule's last). The
#: trial loop does not read it; the scheduler, the prefix key and the stop reason do.
STOP_AFTER_KEY: Final = "stop_after"

#: Keys the ``resources`` mapping may carry instead of the flat keys.
RESOURCE_KEYS = ("workers", "cpus_per_worker", "gpus_per_worker")


def _plain_number(value: Any) -> Any:
    """NumPy scalars (what a sampler may hand over) as Python numbers; bools stay bools so
    that the strict fields refuse them."""
    if isinstance(value, bool) or not isinstance(value, numbers.Number):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise pydantic_core.PydanticCustomError("finite_number", "must be a finite number")
    return value


def _rank(value: Any) -> Any:
    """A rank key: an integer, or its decimal string (JSON object keys are strings)."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return _plain_number(value)


Int = Annotated[int, BeforeValidator(_plain_number), Field(strict=True)]
Number = Annotated[
    float, BeforeValidator(_plain_number), Field(strict=True), AfterValidator(_finite)
]
Flag = Annotated[bool, Field(strict=True)]
Rank = Annotated[int, BeforeValidator(_rank), Field(strict=True, ge=0)]


class _Config(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True, arbitrary_types_allowed=True)

    @model_validator(mode="before")
    @classmethod
    def _flatten_resources(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise ValueError(f"a trial config must be a mapping, got {type(data).__name__}")
        merged: dict[str, Any] = {}
        resources = data.get("resources")
        if isinstance(resources, Mapping):
            merged.update({k: resources[k] for k in RESOURCE_KEYS if k in resources})
        merged.update(data)
        # null means "the default" for the keys whose default is not null.
        for key in ("task_options", "slowdown", "probe_at"):
            if merged.get(key) is None:
                merged.pop(key, None)
        return merged

    @classmethod
    def from_config(cls, config: Any) -> Self:
        """Parse a trial config; :class:`ValidationError` naming every bad key and its rule."""
        try:
            return cls.model_validate(config)
        except pydantic.ValidationError as exc:
            raise ValidationError("invalid trial config: " + _problems(exc)) from None


class TrialResources(_Config):
    """What one trial holds: ``workers`` data-parallel workers with ``cpus_per_worker`` CPUs
    and ``gpus_per_worker`` GPUs each (a fraction shares a GPU)."""

    workers: Int = Field(default=1, ge=1)
    cpus_per_worker: Number = Field(default=1.0, gt=0)
    gpus_per_worker: Number = Field(default=0.0, ge=0)


class TrialConfig(TrialResources):
    """A trial config, parsed and checked (the keys and their defaults below)."""

    schedule: Schedule
    """The schedule to train (``Schedule.to_dict()`` in the config)."""
    task: str = Field(min_length=1, strict=True)
    """A registered task's name."""
    task_options: dict[str, Any] = Field(default_factory=dict)
    """The task's options (checked by the task when it loads its data)."""
    seed: Int = Field(default=0, ge=0)
    micro_batch: Int | None = Field(default=None, ge=1)
    """Largest per-worker forward/backward batch (None: no limit; more accumulates)."""
    performance_aware: Flag = False
    """Split each global batch by the workers' measured speeds."""
    drop_last: Flag = True
    slowdown: dict[Rank, Annotated[Number, Field(ge=1.0)]] = Field(default_factory=dict)
    """Debug: ``{rank: factor}``, that rank sleeps ``factor - 1`` times its compute time."""
    eval_batch_size: Int = Field(default=1024, ge=1)
    noise_scale_ema: Number = Field(default=0.9, ge=0.0, lt=1.0)
    noise_batches: Int = Field(default=0, ge=0, le=1024)
    """One worker without gradient accumulation has no smaller batch inside a step to measure
    the gradient noise scale with: at each epoch's end, measure it from this many batches of
    the epoch's size at the epoch's final parameters instead (nothing of the run changes);
    0: off. Ignored with several workers or accumulation, which measure it every step."""
    amp: Flag = True
    """bf16 autocast on CUDA."""
    collective_timeout_s: Number = Field(default=1800.0, gt=0)
    probe_at: tuple[Annotated[Int, Field(ge=1)], ...] = ()
    """Epoch counts after which a cooldown probe runs (sorted, duplicates dropped)."""
    probe_fraction: Number = Field(default=0.2, gt=0.0, le=1.0)
    """A probe's length as a fraction of the epochs trained so far."""
    divergence_factor: Number | None = Field(default=None, gt=1.0)
    """Stop the trial as diverged when its validation loss rises above this many times its
    lowest so far (``tuner.objectives.loss_jump``); None: only a non-finite loss does."""
    metric: str = Field(default="val_accuracy", pattern=r"^val_[a-z][a-z0-9_]{0,39}$")
    """The study's metric: the trial's ``score`` (what schedulers rank) is its value after a
    cooldown probe and at the run's end."""
    metric_mode: Literal["max", "min"] = "max"
    """The metric's direction; ``score`` is the metric negated for ``min`` (larger is better)."""
    compile: Flag = False
    """``torch.compile`` the model in place (state-dict keys kept). Off by default: it pays a
    compilation per new batch shape, and slowed the built-in ResNet-20's trial loop on an H100
    (``bench/README.md`` section 3)."""

    @pydantic.field_validator("schedule", mode="before")
    @classmethod
    def _schedule(cls, value: Any) -> Schedule:
        if isinstance(value, Schedule):
            return value
        if value is None:
            raise ValueError("is required (a Schedule.to_dict() mapping)")
        try:
            return Schedule.from_dict(value)
        except ValidationError as exc:
            raise ValueError(str(exc)) from None

    @pydantic.field_validator("probe_at", mode="after")
    @classmethod
    def _sorted(cls, value: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(sorted(set(value)))

    @model_validator(mode="after")
    def _ranks(self) -> Self:
        outside = sorted(r for r in self.slowdown if not 0 <= r < self.workers)
        if outside:
            raise ValueError(
                f"'slowdown' names rank {outside[0]}, but there are {self.workers} workers"
            )
        return self

    def to_config(self) -> dict[str, Any]:
        """The plain mapping Ray Tune carries (the schedule as ``Schedule.to_dict()``)."""
        out = self.model_dump(exclude={"schedule"})
        out["schedule"] = self.schedule.to_dict()
        out["probe_at"] = list(self.probe_at)
        return out


_REASONS = {
    "bool_type": "must be true or false",
    "int_type": "must be an integer",
    "float_type": "must be a number",
    "string_type": "must be a string",
    "dict_type": "must be a mapping",
    "tuple_type": "must be a list",
    "finite_number": "must be a finite number",
    "string_too_short": "must not be empty",
}


def _problems(exc: pydantic.ValidationError) -> str:
    """``'key' rule, got value`` per problem, joined with ``; ``."""
    out: list[str] = []
    for problem in field_problems(exc):
        loc = [str(p) for p in problem.loc if p != "[key]"]
        key = f"'{loc[0]}'" if loc else ""
        if len(loc) > 1:
            key += " " + " ".join(f"[{p}]" for p in loc[1:])
        kind, msg = problem.type, problem.message
        reason = _REASONS.get(kind)
        if reason is None:
            bounds = {
                "greater_than": ">",
                "greater_than_equal": ">=",
                "less_than": "<",
                "less_than_equal": "<=",
            }
            if kind in bounds:
                reason = f"must be {bounds[kind]} {next(iter(problem.ctx.values()), '')}"
            elif kind == "missing":
                reason = "is required"
                if loc == ["schedule"]:
                    reason += " (a Schedule.to_dict() mapping)"
            else:
                reason = msg
        got = "" if kind == "missing" or not problem.has_input else f", got {problem.input!r}"
        if kind == "value_error" and not loc:
            out.append(msg)
        elif kind == "value_error":
            out.append(f"{key}: {msg}")
        else:
            out.append(f"{key} {reason}{got}".strip())
    return "; ".join(out)
