"""Objectives: how a trial's per-epoch metrics become the value(s) the tuner optimises.

The trainable reports, every epoch, cumulative ``steps``, ``samples`` and ``wall_time_s``
(training time so far) next to the task's validation metrics (``val_accuracy`` and
``val_loss`` for classification, ``val_psnr``, ...); Tune adds ``training_iteration`` (epochs
done). A study optimises one of them, its **metric** (``objective.metric``, default the task's
primary metric; maximised or minimised as the task declares). An objective reads the **last**
report of a trial:

* ``accuracy``: the final value of the metric (validation accuracy unless the spec names
  another). Constraints (mean batch size, total steps) follow from the schedule and the
  dataset size, so they are checked when a schedule is sampled: a violating schedule is
  **not trained**; it is told to Optuna as an infeasible trial (``Trial.set_constraint``),
  which TPE and NSGA-II use to steer away from it. ASHA compares the metric at its rungs
  (with cooldown probes, ``score``: the probe's value, larger is better).
* ``time_to_accuracy``: minimise the cost (cumulative ``steps`` or ``wall_time_s``) at the
  first epoch whose metric reaches the target (``target_accuracy``, or ``target`` of the
  metric); the trial stops there. A trial that never reaches it costs ``penalty_factor x (its
  cost projected to the whole run) x (1 + shortfall)``, so nearer misses rank better.
* ``pareto``: the metric and the cost, both at the end of the run; no ASHA (a
  multi-objective study has no single metric to cut on).

A trial's outcome (:func:`trial_status`): ``failed`` (it raised, or its last report names a
failure under ``FAILURE_KEY``: a stage that does not fit in memory), ``diverged`` (non-finite
loss), ``completed`` (all epochs, or the target reached), else ``stopped`` (ASHA or a cancel
ended it early). Only completed trials are eligible as the study's result.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Final, Literal

from tuner.errors import StagetuneError
from tuner.formatting import format_bytes, format_objective, one_line
from tuner.spec import (
    AccuracyObjective,
    ParetoObjective,
    StudySpec,
    TieBreak,
    TimeToAccuracyObjective,
)
from tuner.tasks import MetricDirection
from tuner.trial_config import STOP_AFTER_KEY

__all__ = [
    "DIVERGENCE_EPOCHS",
    "FAILURE_KEY",
    "JUMP_KEY",
    "ObjectiveSpec",
    "StudyObjective",
    "TrialOutcome",
    "compare",
    "ended_text",
    "epochs_done",
    "failure_of",
    "loss_jump",
    "metric_words",
    "objective_label",
    "objective_metric",
    "objective_target",
    "objective_values",
    "outside_text",
    "pareto_front",
    "rank_key",
    "search_text",
    "select_best",
    "split_reads",
    "split_resolution",
    "study_metric",
    "study_step_cap",
    "summarize",
    "trial_status",
]

if TYPE_CHECKING:
    from tuner.seeds import Lead, SeedStats

ObjectiveSpec = AccuracyObjective | TimeToAccuracyObjective | ParetoObjective
Direction = Literal["maximize", "minimize"]
TrialStatusName = Literal["running", "completed", "stopped", "diverged", "failed"]

COST_KEYS: dict[str, str] = {"steps": "steps", "wall_time": "wall_time_s"}


def epochs_done(result: Mapping[str, Any]) -> int:
    """Epochs a trial has trained, from its last report (0 if none). A failure report (see
    :func:`failure_of`) ends an epoch that was not trained to its end."""
    it = result.get("training_iteration")
    if isinstance(it, int) and not isinstance(it, bool):
        return max(0, it - 1) if failure_of(result) else it
    epoch = result.get("epoch")
    if isinstance(epoch, int) and not isinstance(epoch, bool):
        return epoch + 1
    return 0


def _number(result: Mapping[str, Any], key: str) -> float | None:
    value = result.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def objective_values(
    kind: str, cost: str = "steps", metric: str = "val_accuracy", metric_direction: str = "max"
) -> tuple[tuple[str, ...], tuple[Direction, ...]]:
    """The names and directions of an objective's values, from its ``kind``, ``cost`` and
    metric (the one rule: the engine, Optuna's study and the dashboard read them from here)."""
    direction: Direction = "minimize" if metric_direction == "min" else "maximize"
    if kind == "time_to_accuracy":
        return (f"{cost}_to_target",), ("minimize",)
    if kind == "pareto":
        return (metric, cost), (direction, "minimize")
    return (metric,), (direction,)


def objective_metric(spec: Mapping[str, Any], task: str | None = None) -> tuple[str, str]:
    """The metric and its direction (``"max"`` / ``"min"``) of a stored study: the summary's
    objective (``metric``, ``metric_direction``) when it has them, else the spec's, resolved
    with the task's declaration; validation accuracy (max) for studies stored before metrics
    were declared."""
    metric = spec.get("metric")
    direction = spec.get("metric_direction")
    if isinstance(metric, str) and direction in ("max", "min"):
        return metric, direction
    if task is not None:
        from tuner.tasks import resolve_metric

        target = spec.get("target_accuracy")
        try:
            return resolve_metric(
                task,
                metric if isinstance(metric, str) else None,
                target_accuracy=target if isinstance(target, int | float) else None,
            )
        except StagetuneError:  # unknown here, or a broken declaration: as stored before
            pass
    return "val_accuracy", "max"


def study_metric(
    spec: Mapping[str, Any], summary: Mapping[str, Any] | None = None
) -> tuple[str, str]:
    """A stored study's metric and its direction (``"max"`` / ``"min"``): as the engine wrote
    them in the summary's ``objective``, else from the spec and the task's declaration (a
    queued or running study); validation accuracy for a study stored before studies named a
    metric. The one reading behind the export's provenance, the API and the dashboard."""
    raw = spec.get("objective")
    objective: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    written = (summary or {}).get("objective")
    if isinstance(written, Mapping):
        for key in ("metric", "metric_direction"):
            if written.get(key) is not None:
                objective[key] = written[key]
    task = spec.get("task")
    return objective_metric(objective, task if isinstance(task, str) else None)


def study_step_cap(spec: Mapping[str, Any]) -> int | None:
    """A stored study's step cap (``objective.max_steps`` of its spec), if it has one."""
    raw = spec.get("objective")
    cap = raw.get("max_steps") if isinstance(raw, Mapping) else None
    return cap if isinstance(cap, int) and not isinstance(cap, bool) else None


def metric_words(metric: str) -> str:
    """``val_accuracy`` -> ``validation accuracy``, ``val_psnr`` -> ``validation psnr``."""
    return "validation " + metric.removeprefix("val_").replace("_", " ")


def objective_target(objective: Mapping[str, Any]) -> Any:
    """A time-to-target objective's target as stored: ``target_accuracy`` (validation
    accuracy), else ``target`` (of its metric); ``None`` without one."""
    target = objective.get("target_accuracy")
    return objective.get("target") if target is None else target


def objective_label(objective: Mapping[str, Any], metric: str, direction: str) -> str:
    """A study's objective (its spec's ``objective`` mapping) in words, as the dashboard heads
    the study and the CLI starts it: ``maximise final validation accuracy with steps ≤ 500``,
    ``minimise steps to reach 97.0% validation accuracy``, ``Pareto front of validation
    accuracy against wall time``. ``metric`` and ``direction``: the study's metric
    (:func:`study_metric`)."""
    kind = str(objective.get("kind") or "accuracy")
    cost_text = "wall time" if objective.get("cost") == "wall_time" else "steps"
    words = metric_words(metric)
    if kind == "time_to_accuracy":
        target = objective_target(objective)
        if isinstance(target, bool) or not isinstance(target, int | float):
            target_text = "the target"
        elif metric == "val_accuracy":
            target_text = f"{target * 100:.1f}%"
        else:
            target_text = format_objective(float(target), metric)
        return f"minimise {cost_text} to reach {target_text} {words}"
    if kind == "pareto":
        return f"Pareto front of {words} against {cost_text}"
    constraints = []
    if objective.get("max_mean_batch_size") is not None:
        constraints.append(f"mean batch ≤ {objective['max_mean_batch_size']:g}")
    if objective.get("min_mean_batch_size") is not None:
        constraints.append(f"mean batch ≥ {objective['min_mean_batch_size']:g}")
    if objective.get("max_steps") is not None:
        constraints.append(f"steps ≤ {objective['max_steps']:,}")
    way = "minimise" if direction == "min" else "maximise"
    label = f"{way} final {words}"
    if constraints:
        label += " with " + ", ".join(constraints)
    return label


def outside_text(row: Mapping[str, Any], objective: Mapping[str, Any]) -> str | None:
    """Why a trial's row (:meth:`TrialOutcome.to_dict`, as a study summary keeps it) can never
    be the study's result although it trained, in words: a baseline whose schedule breaks the
    objective's constraints, ``1,560 steps, over the objective's 500``. ``None`` for a row
    that meets them (or does not say: ``feasible`` missing)."""
    if row.get("feasible") is not False:
        return None

    def num(key: str) -> float | None:
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value)

    steps, mean = num("steps"), num("mean_batch_size")
    texts = []
    for name in row.get("violated") or ():
        limit = objective.get(name)
        if isinstance(limit, bool) or not isinstance(limit, int | float):
            continue
        if name == "max_steps":
            have = "more steps" if steps is None else f"{steps:,.0f} steps"
            texts.append(f"{have}, over the objective's {limit:,}")
        elif name in ("max_mean_batch_size", "min_mean_batch_size"):
            side = "over" if name == "max_mean_batch_size" else "under"
            have = "mean batch" if mean is None else f"mean batch {mean:,.0f}"
            texts.append(f"{have}, {side} the objective's {limit:g}")
    return "; ".join(texts) if texts else "outside the objective's constraints"


#: The longest reason :func:`ended_text` quotes (on one line): a failed trial's reason ends
#: with its error, which can run to a traceback's worth; the trial's own page has it whole.
ENDED_TEXT_CHARS: Final = 120


def ended_text(row: Mapping[str, Any]) -> str | None:
    """How a trial's row (:meth:`TrialOutcome.to_dict`, as a study summary keeps it) ended
    when it did not train its whole schedule, in words: its ``stop_reason``, e.g. ``stopped
    early after 2 of 10 epochs`` for a recipe candidate ASHA stopped, whose accuracy and steps
    are then those of the epochs it trained, not of its schedule. ``None`` for a completed row
    (or one that does not say: ``status`` missing)."""
    status = row.get("status")
    if not isinstance(status, str) or status in ("completed", "running"):
        return None
    reason = row.get("stop_reason")
    return one_line(
        reason if isinstance(reason, str) and reason.strip() else status, ENDED_TEXT_CHARS
    )


def better(value: float, other: float, direction: str) -> bool:
    """Whether ``value`` is strictly better than ``other`` for a metric of ``direction``."""
    return value < other if direction == "min" else value > other


def signed(value: float, direction: str) -> float:
    """``value`` oriented so that larger is better (a ``min`` metric negated): what ASHA,
    PBT and the trainable's ``score`` compare."""
    return -value if direction == "min" else value


@dataclass(frozen=True)
class StudyObjective:
    """An objective of a spec, bound to the run's length."""

    spec: ObjectiveSpec
    total_epochs: int
    metric: str = "val_accuracy"
    metric_direction: MetricDirection = "max"

    @classmethod
    def of(cls, spec: StudySpec, total_epochs: int) -> StudyObjective:
        metric, direction = spec.objective_metric()
        return cls(
            spec=spec.objective,
            total_epochs=total_epochs,
            metric=metric,
            metric_direction=direction,
        )

    # ------------------------------------------------------------------ description

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def names(self) -> tuple[str, ...]:
        """Names of the objective values (as stored in ``objective_values`` and Optuna)."""
        return self._values()[0]

    @property
    def directions(self) -> tuple[Direction, ...]:
        return self._values()[1]

    def _values(self) -> tuple[tuple[str, ...], tuple[Direction, ...]]:
        cost = getattr(self.spec, "cost", "steps")
        return objective_values(self.spec.kind, cost, self.metric, self.metric_direction)

    @property
    def metric_label(self) -> str:
        """``"val_loss (min)"``: the metric and its direction, for messages."""
        return f"{self.metric} ({self.metric_direction})"

    def metric_of(self, result: Mapping[str, Any], prefix: str = "") -> float | None:
        """The metric's value in a report (``prefix="probe_"``: the cooldown probe's), if
        finite."""
        return _number(result, prefix + self.metric)

    def score_of(self, value: float | None) -> float | None:
        """A metric value oriented so that larger is better (what schedulers compare)."""
        return None if value is None else signed(value, self.metric_direction)

    @property
    def is_multi(self) -> bool:
        return len(self.directions) > 1

    @property
    def scheduler_metric(self) -> str | None:
        """The metric ASHA compares at its rungs (``None``: no early stopping)."""
        return None if self.is_multi else self.metric

    @property
    def scheduler_mode(self) -> Literal["max", "min"]:
        return self.metric_direction

    @property
    def cost_key(self) -> str | None:
        if isinstance(self.spec, TimeToAccuracyObjective | ParetoObjective):
            return COST_KEYS[self.spec.cost]
        return None

    # ------------------------------------------------------------------ per trial

    def reached_target(self, result: Mapping[str, Any]) -> bool:
        """Time-to-target: whether this report's metric reaches the target value."""
        if not isinstance(self.spec, TimeToAccuracyObjective):
            return False
        value = self.metric_of(result)
        target = self.spec.target_value
        return value is not None and (
            value == target or better(value, target, self.metric_direction)
        )

    def is_finished_run(self, result: Mapping[str, Any]) -> bool:
        """Whether the trial's run is complete after this report (all epochs or target)."""
        return epochs_done(result) >= self.total_epochs or self.reached_target(result)

    def values(self, result: Mapping[str, Any]) -> tuple[float, ...] | None:
        """The objective value(s) of a trial whose last report is ``result``; ``None`` when the
        report lacks what they need (no metric, no cost) or says the trial failed."""
        acc = self.metric_of(result)
        if acc is None or failure_of(result) is not None:
            return None
        if isinstance(self.spec, AccuracyObjective):
            return (acc,)
        cost_key = self.cost_key
        assert cost_key is not None
        cost = _number(result, cost_key)
        if cost is None:
            return None
        if isinstance(self.spec, ParetoObjective):
            return (acc, cost)
        if self.reached_target(result):
            return (cost,)
        done = max(1, epochs_done(result))
        projected = cost * self.total_epochs / done
        # How far from the target, relative to it for a metric larger than 1 in size (an
        # accuracy's shortfall stays in points of 1).
        target = self.spec.target_value
        gap = acc - target if self.metric_direction == "min" else target - acc
        shortfall = max(0.0, gap) / max(1.0, abs(target))
        return (self.spec.penalty_factor * projected * (1.0 + shortfall),)

    def infeasible_values(self) -> tuple[float, ...]:
        """Values told to Optuna for a schedule rejected by a constraint (never trained)."""
        return tuple(0.0 for _ in self.directions)

    def value_dict(self, values: Sequence[float] | None) -> dict[str, float | None]:
        if values is None:
            return dict.fromkeys(self.names)
        return dict(zip(self.names, values, strict=True))

    def sort_key(self, values: Sequence[float]) -> tuple[float, ...]:
        """Smaller is better (for single-objective ranking)."""
        return tuple(
            -v if d == "maximize" else v for v, d in zip(values, self.directions, strict=True)
        )


#: How the stop reason of a stage-wise search's prefix trial begins.
STAGE_STOP: Final = "stage-wise search: trained to the end of the stage its round searched"


def is_stage_stop(reason: str | None) -> bool:
    """Whether a trial's stop reason says the stage-wise search stopped it at a boundary."""
    return bool(reason) and str(reason).startswith(STAGE_STOP)


#: Result key: the lowest validation loss of the run before the jump that stopped it as
#: diverged (:func:`loss_jump`); None in every other result.
JUMP_KEY: Final = "diverged_from_loss"

#: Key of a trial's last report that says why it failed without raising: the trainable ends a
#: trial whose stage does not fit in memory (even at micro-batch 1) with such a report, so its
#: Ray actor and worker processes serve the next trial instead of being started again.
FAILURE_KEY: Final = "failure"


def failure_of(result: Mapping[str, Any] | None) -> str | None:
    """Why the trial whose report is ``result`` failed, if that report says it did."""
    value = (result or {}).get(FAILURE_KEY)
    return value if isinstance(value, str) and value else None


#: Epochs in a row the validation loss must stay above ``divergence_factor`` times the run's
#: lowest before the trial is stopped as diverged (:func:`loss_jump`).
DIVERGENCE_EPOCHS: Final = 2


def loss_jump(
    previous: Iterable[float | None],
    loss: float | None,
    factor: float | None,
    epochs: int = DIVERGENCE_EPOCHS,
) -> float | None:
    """The run's lowest validation loss before the jump when ``loss`` and the ``epochs - 1``
    losses before it are all above ``factor`` times it (the run has diverged, though its loss
    is still finite), else None (also without a factor or a finite loss before the jump).

    The rule behind ``budget.divergence_factor``: after an LR or batch increase too large for
    the model, the loss jumps by orders of magnitude and the run does not come back (on
    ``mnist1d``, batch 128 -> 1,024 at the linear rule's LR: 0.09 -> 61 -> 1,248, ending at 29 %
    accuracy; 64 -> 1,024 at twice it: 0.25 -> 4,994), while the loss of a run that learns
    moves within a few times its lowest. Comparing with the run's own lowest loss needs no
    knowledge of the task's loss scale. A run that learns at a high LR can spike for one
    epoch, though: the batch warm-up recipe's up-variant on mnist1d (64 then 256 at 2x and 3x
    the rule's LR, seed 23760) read 0.128 -> 2.60 (20.3x) in epoch 6 and 0.34 in epoch 7, and
    ended at 99.12 %, the best of its study; hence ``epochs`` in a row (default 2), which costs
    a diverged run one more epoch."""
    if factor is None or loss is None or not math.isfinite(loss):
        return None
    history = list(previous)
    streak = [*history[len(history) - (epochs - 1) :], loss] if epochs > 1 else [loss]
    before = history[: len(history) - (epochs - 1)] if epochs > 1 else history
    if len(streak) < epochs:
        return None
    finite = [v for v in before if v is not None and math.isfinite(v) and v > 0]
    if not finite:
        return None
    lowest = min(finite)
    above = all(v is not None and math.isfinite(v) and v > factor * lowest for v in streak)
    return lowest if above else None


def trial_status(
    objective: StudyObjective, result: Mapping[str, Any] | None, *, error: bool
) -> tuple[TrialStatusName, str]:
    """How a trial ended (store status) and why, from its last report."""
    result = result or {}
    done = epochs_done(result)
    if error:
        return "failed", "the trial raised an error"
    failure = failure_of(result)
    if failure is not None:
        return "failed", f"the trial failed in epoch {done + 1}: {failure}"
    if result.get("diverged"):
        lowest, loss = _number(result, JUMP_KEY), _number(result, "val_loss")
        if lowest is not None and loss is not None:
            return "diverged", (
                f"the validation loss jumped to {loss:.4g} in epoch {done}, "
                f"{loss / lowest:,.0f}x its lowest so far ({lowest:.4g}), the "
                f"{DIVERGENCE_EPOCHS} last epochs all above the divergence factor"
            )
        return "diverged", f"the loss became non-finite in epoch {done}"
    if objective.reached_target(result):
        return "completed", f"reached the target {objective.metric} after {done} epoch(s)"
    if done >= objective.total_epochs:
        return "completed", f"trained all {objective.total_epochs} epochs"
    config = result.get("config")
    stop = config.get(STOP_AFTER_KEY) if isinstance(config, Mapping) else None
    if isinstance(stop, int) and done >= stop:
        return "stopped", (
            f"{STAGE_STOP} (epoch {done} of {objective.total_epochs}), scored by a cooldown "
            "probe there"
        )
    return "stopped", f"stopped early after {done} of {objective.total_epochs} epochs"


# --------------------------------------------------------------------------------------------
# Study results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialOutcome:
    """One finished trial, as the study result compares it."""

    number: int
    baseline: str | None
    schedule: dict[str, Any]
    status: TrialStatusName
    stop_reason: str | None = None
    epochs_done: int = 0
    val_accuracy: float | None = None
    metric_value: float | None = None  # the study metric's last value (the objective's)
    steps: int | None = None
    samples: int | None = None
    wall_time_s: float | None = None
    values: tuple[float, ...] | None = None
    feasible: bool = True
    # The objective's constraints the schedule breaks, by name (``max_steps``, ...): why it
    # is not feasible, for what a user reads (:func:`outside_text`).
    violated: tuple[str, ...] = ()
    summary: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def mean_batch_size(self) -> float | None:
        if self.steps and self.samples is not None:
            return self.samples / self.steps
        return None

    @property
    def eligible(self) -> bool:
        """Can be the study's result: ran to completion, met the constraints, has values."""
        return self.status == "completed" and self.feasible and self.values is not None

    def to_dict(self, objective: StudyObjective) -> dict[str, Any]:
        return {
            "number": self.number,
            "baseline": self.baseline,
            "schedule_summary": self.summary,
            "status": self.status,
            "stop_reason": self.stop_reason,
            "epochs_done": self.epochs_done,
            "val_accuracy": self.val_accuracy,
            "metric": objective.metric,
            "metric_value": self.metric_value,
            "steps": self.steps,
            "samples": self.samples,
            "wall_time_s": self.wall_time_s,
            "mean_batch_size": self.mean_batch_size,
            "feasible": self.feasible,
            "violated": list(self.violated),
            "objective_values": objective.value_dict(self.values),
        }


def pareto_front(outcomes: Sequence[TrialOutcome], objective: StudyObjective) -> list[TrialOutcome]:
    """The non-dominated eligible outcomes (by the objective's directions), by number."""
    pool = [o for o in outcomes if o.eligible]
    keys = {o.number: objective.sort_key(o.values or ()) for o in pool}

    def dominates(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
        return all(x <= y for x, y in zip(a, b, strict=True)) and a != b

    return sorted(
        (o for o in pool if not any(dominates(keys[p.number], keys[o.number]) for p in pool)),
        key=lambda o: o.number,
    )


def _best_of(pool: Sequence[TrialOutcome], objective: StudyObjective) -> TrialOutcome | None:
    if not pool:
        return None
    if objective.is_multi:
        front = pareto_front(pool, objective)
        assert isinstance(objective.spec, ParetoObjective)
        top = max(o.values[0] for o in front if o.values)
        near = [
            o for o in front if o.values and o.values[0] >= top - objective.spec.accuracy_tolerance
        ]
        return min(near, key=lambda o: ((o.values or (0.0, 0.0))[1], o.number))

    return min(pool, key=lambda o: rank_key(o, objective))


def rank_key(outcome: TrialOutcome, objective: StudyObjective) -> tuple[float, ...]:
    """Sort key of a single-objective study's trials, best first (ties: fewer steps, then the
    lower number)."""
    return (
        *objective.sort_key(outcome.values or ()),
        float(outcome.steps or 0),
        float(outcome.number),
    )


def select_best(
    outcomes: Sequence[TrialOutcome], objective: StudyObjective
) -> tuple[TrialOutcome | None, bool]:
    """The study's result and whether it is a baseline.

    The best eligible tuned trial, unless no tuned trial is eligible or an eligible baseline
    beats it, in which case that baseline is the result (and the second item is ``True``).
    For a Pareto study, "best" is the cheapest front member within ``accuracy_tolerance`` of
    the front's top accuracy.
    """
    eligible = [o for o in outcomes if o.eligible]
    tuned = _best_of([o for o in eligible if o.baseline is None], objective)
    if tuned is None:
        base = _best_of([o for o in eligible if o.baseline is not None], objective)
        return base, base is not None
    base = _best_of([o for o in eligible if o.baseline is not None], objective)
    if base is None:
        return tuned, False
    if objective.is_multi:
        # The tuned pick stands unless a baseline dominates it.
        front = pareto_front([tuned, base], objective)
        return (tuned, False) if tuned in front else (base, True)
    both = _best_of([tuned, base], objective)
    return (tuned, False) if both is tuned else (base, True)


def summarize(
    outcomes: Sequence[TrialOutcome],
    objective: StudyObjective,
    *,
    extra: Mapping[str, Any] | None = None,
    seed_runs: Sequence[SeedStats] = (),
    seeds: Sequence[int] = (),
    tie_break: TieBreak = "fewer_steps",
    val_size: int | None = None,
    val_size_option: str | None = None,
    reserves_why: str | None = None,
) -> dict[str, Any]:
    """The study summary (stored as the study's ``summary`` JSON and printed by the CLI): the
    result, its comparison with each baseline, and counts.

    ``reserves_why`` says why reserves trained on the fresh seeds (``seed_runs.reserves_why``).

    ``val_size`` (the task's validation samples) adds a sentence to the note when the
    seed-robust pick's lead is finer than one run on the split can read (:func:`_split_note`),
    naming ``val_size_option``, the task option that sets it (``None``: the split is fixed).

    With ``seed_runs`` (the finalists' :class:`~tuner.seeds.SeedStats` on ``seeds``) the
    result is the finalist :func:`tuner.seeds.pick` takes over those seeds (the best mean, or
    with ``tie_break="fewer_steps"`` a cheaper finalist within the seeds' noise of it); the
    best single run is then only what the search found (``seed_runs.search_pick``)."""
    from tuner.seeds import lead, pick

    best, is_baseline = select_best(outcomes, objective)
    search_pick = best
    robust = pick(seed_runs, objective, tie_break=tie_break) if seed_runs else None
    ahead = lead(seed_runs, objective, tie_break=tie_break) if robust is not None else None
    tie = _lead_note(ahead, objective)  # "" unless the lead is within noise
    # "" unless the lead is finer than the split reads
    split = _split_note(ahead, robust, val_size, objective, val_size_option)
    if robust is not None:
        best = next((o for o in outcomes if o.number == robust.number), best)
        is_baseline = best is not None and best.baseline is not None
        if best is not None and best.status != "completed":
            best = _as_trained_whole(best, robust)
    by_number = {s.number: s.to_dict() for s in seed_runs}
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.status] = counts.get(o.status, 0) + 1
    out: dict[str, Any] = {
        "objective": {
            "kind": objective.kind,
            "names": list(objective.names),
            "directions": list(objective.directions),
            **objective.spec.model_dump(mode="json"),
            "metric": objective.metric,
            "metric_direction": objective.metric_direction,
        },
        "trials": {"total": len(outcomes), **counts},
        "best": None if best is None else _with_seeds(best.to_dict(objective), by_number),
        "best_schedule": None if best is None else best.schedule,
        "best_is_baseline": is_baseline,
        "note": _note(
            best,
            is_baseline,
            outcomes,
            robust=len(seeds) if robust else 0,
            for_steps=ahead is not None and ahead.for_steps,
        )
        + _instability(robust, objective.metric)
        + (f". {tie}" if tie else "")
        + (f". {split}" if split else ""),
        "baselines": [],
        "seed_runs": None,
    }
    if seed_runs:
        out["seed_runs"] = {
            "seeds": list(seeds),
            "finalists": [s.to_dict() for s in seed_runs],
            "compute_epochs": round(sum(s.compute_epochs for s in seed_runs), 3),
            "picked": None if robust is None else robust.number,
            "search_pick": None if search_pick is None else search_pick.number,
            # what the dashboard shows beside the result: the note's sentence on the lead
            "lead": None
            if ahead is None
            else {**ahead.to_dict(), "note": tie or None, "split_note": split or None},
            "val_size": val_size,
            "reserves_why": reserves_why if any(s.reserve for s in seed_runs) else None,
        }
    best_row = {} if best is None else best.to_dict(objective)
    for base in sorted((o for o in outcomes if o.baseline is not None), key=lambda o: o.number):
        row = _with_seeds(base.to_dict(objective), by_number)
        if best is not None:
            row["vs_best"] = compare(best_row, row)
            if robust is not None and base.number in by_number:
                mine = by_number[base.number]["metric_mean"]
                theirs = by_number[robust.number]["metric_mean"]
                delta = None if mine is None or theirs is None else theirs - mine
                row["vs_best"]["metric_mean_delta"] = delta
                if objective.metric == "val_accuracy":
                    row["vs_best"]["accuracy_mean_delta"] = delta
        out["baselines"].append(row)
    # Tuned trials the engine built (the noise-scale candidate), compared like the baselines.
    out["candidates"] = []
    for cand in sorted((o for o in outcomes if o.extra.get("candidate")), key=lambda o: o.number):
        row = _with_seeds(cand.to_dict(objective), by_number)
        row["candidate"] = cand.extra["candidate"]
        if best is not None:
            row["vs_best"] = compare(best_row, row)
        out["candidates"].append(row)
    if objective.is_multi:
        out["pareto_front"] = [o.to_dict(objective) for o in pareto_front(outcomes, objective)]
    if extra:
        out.update(extra)
    return out


def _as_trained_whole(stopped: TrialOutcome, stats: SeedStats) -> TrialOutcome:
    """A reserve the search stopped early, picked on its seed runs: its row shows the whole
    schedule's figures (means over the completed seed runs), not the stopped run's."""
    return replace(
        stopped,
        metric_value=stats.accuracy_mean,
        val_accuracy=stats.accuracy_mean if stats.metric == "val_accuracy" else None,
        steps=None if stats.steps is None else round(stats.steps),
        samples=None if stats.samples is None else round(stats.samples),
        wall_time_s=stats.wall_time_s,
        stop_reason=(
            f"{stopped.stop_reason or 'stopped early'} in the search; trained whole on the "
            "fresh seeds as a reserve (its figures here are their means)"
        ),
    )


def _with_seeds(row: dict[str, Any], by_number: Mapping[int, dict[str, Any]]) -> dict[str, Any]:
    row["seeds"] = by_number.get(row["number"])
    return row


#: A pick whose final validation accuracy spreads more than this over the fresh seeds (sample
#: std, 2 points) gets a warning in the study's note: seed noise on the built-in tasks is
#: 0.1-0.5 point. For a metric larger than 1 in size the bound is relative to its mean (2 %).
UNSTABLE_STD: Final = 0.02


def _instability(robust: SeedStats | None, metric: str = "val_accuracy") -> str:
    """A warning when the seed-robust pick is unstable across its fresh seeds (the search run
    was lucky: at a high LR or a large batch, some seeds train and others do not)."""
    if robust is None or not robust.unstable:
        return ""
    accs = [a for a in robust.accuracies if a is not None]
    return (
        f". Warning: the pick is unstable across seeds (final {metric_words(metric)} "
        f"{min(accs):.4f} to {max(accs):.4f}); raise budget.finalists, budget.reserve_finalists or "
        "budget.seed_runs for a safer pick, or narrow the space (a lower space.batch_size.max or "
        "space.lr_multiplier.max)"
    )


def split_resolution(accuracy: float, samples: int) -> float:
    """How finely one run on a validation split of ``samples`` reads an accuracy near
    ``accuracy``: the binomial standard deviation ``sqrt(p (1 - p) / n)`` (0.0023 at 0.989
    on 2,000 samples, 0.0012 on 8,000). Every trial of a study is scored on the same split,
    so averaging over seeds does not remove it: it is about how far two schedules' accuracies
    there can differ from theirs on other samples of the task."""
    if samples < 1:
        raise ValueError(f"a validation split needs at least 1 sample, not {samples}")
    p = min(max(accuracy, 0.0), 1.0)
    return math.sqrt(p * (1.0 - p) / samples)


def split_reads(
    value: float, metric_sd: float | None, val_size: int | None, metric: str
) -> float | None:
    """How finely one run on a validation split of ``val_size`` samples reads the study's
    metric near ``value``: the metric's per-sample standard deviation over the square root of
    the samples, where the task reports it (``metric_sd``); else, for validation accuracy,
    the binomial :func:`split_resolution`; ``None`` when the split's size is not known or the
    metric's spread is not."""
    if not val_size:
        return None
    if metric_sd is not None and math.isfinite(metric_sd):
        return metric_sd / math.sqrt(val_size)
    if metric == "val_accuracy":
        return split_resolution(value, val_size)
    return None


def _runner_up_name(ahead: Lead) -> str:
    return (
        f"the {ahead.runner_up_baseline} baseline (trial {ahead.runner_up})"
        if ahead.runner_up_baseline is not None
        else f"tuned trial {ahead.runner_up}"
    )


def _split_note(
    ahead: Lead | None,
    robust: SeedStats | None,
    val_size: int | None,
    objective: StudyObjective,
    option: str | None = None,
) -> str:
    """For a single-metric study whose validation split is known: when the seed-robust pick's
    lead over its runner-up is smaller than one run on that split reads the metric, a
    sentence saying so and what to change; else "". Seeds average the training noise, not the
    split's: on mnist1d's former 2,000-sample split a schedule that read 0.05 point under two
    others in single runs tested 0.2 point above the one picked, on 8,000 held-out samples
    (``bench/README.md`` section 1).

    How finely the split reads: the metric's per-sample standard deviation over the square
    root of the split's size, where the task reports the spread (``SeedStats.metric_sd``:
    classification's binomial ``sqrt(p (1 - p))``, a PSNR's per patch, a language model's
    per-sequence loss); else, for validation accuracy, the binomial :func:`split_resolution`
    at the mean; nothing for another metric of a task that reports no spread."""
    if (
        ahead is None
        or robust is None
        or not val_size
        or objective.kind != "accuracy"
        or robust.accuracy_mean is None
    ):
        return ""
    value = robust.accuracy_mean
    reads = split_reads(value, robust.metric_sd, val_size, objective.metric)
    if reads is None:
        return ""
    if robust.metric_sd is not None:
        how = (
            f"{metric_words(objective.metric)} to about ± {_figure(reads)} at {_figure(value)} "
            f"(its per-sample spread, {_figure(robust.metric_sd)}, over the square root of "
            "the samples)"
        )
    else:  # validation accuracy from runs that did not report the spread
        how = f"accuracy to about ± {reads:.4f} at {value:.4f} (binomial)"
    if abs(ahead.mean) >= reads:
        return ""
    fix = (
        f"a larger validation split does (the task option {option})"
        if option
        else "a larger validation split would, and this task's is fixed: take the finalists "
        "as equally good"
    )
    return (
        f"The validation split holds {val_size:,} samples: one run there reads {how}, more "
        f"than the pick's difference from {_runner_up_name(ahead)} ({_figure(abs(ahead.mean))} "
        f"over the fresh seeds); more seeds do not shrink that (every run is scored on the "
        f"same samples), {fix}"
    )


def _figure(x: float) -> str:
    """A metric's figure in a sentence: four decimals below 10 (accuracy, a loss), two above
    (a PSNR in dB)."""
    return f"{x:.4f}" if abs(x) < 10 else f"{x:.2f}"


def _lead_note(ahead: Lead | None, objective: StudyObjective) -> str:
    """When the pick and the runner-up finalist are within the seeds' noise of each other
    (:func:`tuner.seeds.lead`), a sentence saying which finalist it is, by how much the better
    mean leads, what the cheaper one saves in steps, and how to tell them apart; else ""."""
    if ahead is None or ahead.clear:
        return ""
    who = _runner_up_name(ahead)

    def num(x: float) -> str:
        return f"{x:.4f}" if abs(x) < 10 else f"{x:.1f}"

    what = (
        metric_words(objective.metric)
        if objective.kind != "time_to_accuracy"
        else objective.names[0].replace("_", " ")
    )
    mine, theirs = ahead.pick_steps, ahead.runner_up_steps
    # Equal means at the figures shown (runs on a small validation split often score the
    # same count of samples right): "ahead by -0.0000" would say nothing.
    tied = float(num(ahead.mean)) == 0.0
    if ahead.for_steps and mine is not None and theirs:
        lead = (
            f"has the same mean {what} over the same {ahead.seeds} fresh seeds (their "
            f"difference ± {num(ahead.std)})"
            if tied
            else f"has the best mean, ahead by {num(-ahead.mean)} ± {num(ahead.std)} {what} "
            f"over the same {ahead.seeds} fresh seeds"
        )
        return (
            f"Picked for fewer optimizer steps within the seeds' noise: {who} {lead}, and the "
            f"pick takes {1 - mine / theirs:.0%} fewer steps ({mine:,.0f} against "
            f"{theirs:,.0f}); raise budget.seed_runs to tell them apart"
            + ("" if tied else ", or set budget.tie_break: mean to pick the best mean")
        )
    saves = ""
    if mine and theirs is not None and theirs < 0.99 * mine:
        saves = (
            f", and it takes {1 - theirs / mine:.0%} fewer optimizer steps "
            f"({theirs:,.0f} against {mine:,.0f})"
        )
    if tied:
        return (
            f"Within the seeds' noise {who} is as good: the same mean {what} over the same "
            f"{ahead.seeds} fresh seeds (their difference ± {num(ahead.std)}){saves}; raise "
            "budget.seed_runs to tell them apart"
        )
    return (
        f"Within the seeds' noise {who} is as good: the pick leads it by "
        f"{num(ahead.mean)} ± {num(ahead.std)} {what} over the same {ahead.seeds} fresh "
        f"seeds{saves}; raise budget.seed_runs to tell them apart"
    )


def _note(
    best: TrialOutcome | None,
    is_baseline: bool,
    outcomes: Sequence[TrialOutcome],
    *,
    robust: int = 0,
    for_steps: bool = False,
) -> str:
    if best is None:
        return "no trial completed its run; there is no result"
    how = (
        f"the fewest steps within the seeds' noise of the best mean over {robust} fresh seeds"
        if for_steps
        else f"best mean over {robust} fresh seeds"
    )
    on = f" ({how})" if robust else ""
    if robust and best.status != "completed":
        on = (
            f" ({how}; stopped early by the search, then trained whole on those seeds as a reserve)"
        )
    if is_baseline and for_steps:
        return f"the result is the {best.baseline} baseline{on}"
    if is_baseline:
        tuned = sum(1 for o in outcomes if o.baseline is None and o.eligible)
        if tuned == 0:
            return f"no tuned trial completed its run; the result is the {best.baseline} baseline"
        return (
            f"no tuned schedule beat the {best.baseline} baseline{on}; the result is that baseline"
        )
    return f"the result is tuned trial {best.number}{on}"


def compare(best: Mapping[str, Any], base: Mapping[str, Any]) -> dict[str, float | None]:
    """The best trial against another (a baseline, a candidate), from their rows
    (:meth:`TrialOutcome.to_dict` keys): the differences best - other of the study metric
    (``metric_delta``) and of validation accuracy (``accuracy_delta``, classification) and the
    best / other ratios of steps, wall time and mean batch (``None`` where a value is
    missing, not finite, or the other's is 0). The one rule behind the summary's ``vs_best``
    and the dashboard's comparison while a study runs."""

    def num(row: Mapping[str, Any], key: str) -> float | None:
        value = row.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return float(value) if math.isfinite(value) else None

    def ratio(key: str) -> float | None:
        a, b = num(best, key), num(base, key)
        return None if a is None or not b else a / b

    def delta(key: str) -> float | None:
        a, b = num(best, key), num(base, key)
        return None if a is None or b is None else a - b

    return {
        "metric_delta": delta("metric_value"),
        "accuracy_delta": delta("val_accuracy"),
        "steps_ratio": ratio("steps"),
        "wall_time_ratio": ratio("wall_time_s"),
        "mean_batch_size_ratio": ratio("mean_batch_size"),
    }


def search_text(summary: Mapping[str, Any]) -> str:
    """What the search spent, in one line: trial-epochs trained (cooldown probes and seed runs
    included), the seed runs, and what forks from shared prefixes saved; empty for a summary
    without these figures."""
    compute = summary.get("compute_epochs")
    if not isinstance(compute, int | float):
        return ""
    parts = [f"search: {compute:,.1f} trial-epochs trained"]
    probes = summary.get("cooldown_probes")
    if isinstance(probes, Mapping) and probes.get("at_epochs"):
        at = [str(e) for e in probes["at_epochs"]]
        word = "epoch" if len(at) == 1 else "epochs"
        parts[0] += f" (cooldown probes after {word} {', '.join(at)} included)"
    cap = summary.get("trial_epochs_budget")
    searched = summary.get("search_compute_epochs")
    if isinstance(cap, int | float) and isinstance(searched, int | float):
        parts.append(f"the trials spent {searched:,.1f} of a {cap:,} trial-epoch budget")
    seeded = summary.get("seed_runs")
    if isinstance(seeded, Mapping) and seeded.get("finalists"):
        n_final, n_seeds = len(seeded["finalists"]), len(seeded.get("seeds") or ())
        parts.append(
            f"{n_final} finalist{'s' if n_final != 1 else ''} trained again on {n_seeds} fresh "
            f"seed{'s' if n_seeds != 1 else ''} ({float(seeded.get('compute_epochs') or 0):,.1f} "
            "of those trial-epochs); the result is "
            + (
                "the fewest steps within the seeds' noise of the best mean"
                if isinstance(seeded.get("lead"), Mapping) and seeded["lead"].get("for_steps")
                else "the best mean"
            )
        )
        reserves = sum(1 for f in seeded["finalists"] if f.get("reserve"))
        if reserves and seeded.get("reserves_why"):
            parts.append(
                f"{reserves} of them as reserve{'s' if reserves != 1 else ''}: "
                f"{seeded['reserves_why']}"
            )
    noise = summary.get("noise_candidate")
    if isinstance(noise, Mapping) and noise.get("number") is not None:
        parts.append(
            f"noise-scale candidate: trial {noise['number']} ({noise.get('schedule') or '?'})"
        )
    elif isinstance(noise, Mapping) and noise.get("note"):
        parts.append(f"no noise-scale candidate: {noise['note']}")
    stagewise = summary.get("stagewise")
    if isinstance(stagewise, Mapping):
        probed, whole = int(stagewise.get("prefixes") or 0), int(stagewise.get("whole_runs") or 0)
        parts.append(
            f"stage-wise rounds of {stagewise.get('candidates')} candidates keeping the best "
            f"{stagewise.get('keep')}: {probed} prefix{'es' if probed != 1 else ''} trained "
            f"to a stage's end and probed, {whole} whole schedule{'s' if whole != 1 else ''}"
        )
    pbt = summary.get("pbt")
    if isinstance(pbt, Mapping):
        lineages = pbt.get("lineages") or {}
        clones = sum(len(v or ()) for v in lineages.values())
        interval = pbt.get("interval_epochs")
        every = "every epoch" if interval == 1 else f"every {interval} epochs"
        text = (
            f"PBT: a population of {pbt.get('population')} perturbed {every}, "
            f"{clones} clone{'s' if clones != 1 else ''} of a better trial's state"
        )
        saved = pbt.get("checkpoints")
        if isinstance(saved, Mapping) and isinstance(saved.get("bytes"), int | float):
            untracked = int(saved.get("untracked_removed") or 0)
            removed = ""
            if untracked:
                removed = f"; {untracked} that Tune's clean-up left untracked removed"
            text += (
                f" (checkpoints: {format_bytes(saved['bytes'])} on disk, the newest "
                f"{saved.get('kept_per_trial')} per trial{removed})"
            )
        parts.append(text)
    prefixes = summary.get("prefixes")
    if isinstance(prefixes, Mapping):
        forks, reused = int(prefixes.get("forks") or 0), int(prefixes.get("epochs_reused") or 0)
        text = (
            f"{forks} trial{'s' if forks != 1 else ''} forked from shared prefixes, "
            f"{reused} epoch{'s' if reused != 1 else ''} not trained again"
        )
        states, size = int(prefixes.get("states") or 0), prefixes.get("bytes")
        if states and isinstance(size, int | float):
            cap = prefixes.get("max_bytes")
            text += (
                f" (boundary states: {states}, {format_bytes(size)} on disk"
                + (f", cap {format_bytes(cap)}" if isinstance(cap, int | float) else "")
                + ")"
            )
        parts.append(text)
    return "; ".join(parts)
