"""What the dashboard shows, built from store records: pure functions, no web framework.

The study page gets everything it draws from :func:`study_page_data` (embedded in the page,
and polled from the data endpoint while the study runs): the study header, one row per
trial, every learning curve (columnar, compact), the schedule pictures of the best trial and
the baselines, and the best-vs-baselines comparison. :func:`schedule_picture` turns a
schedule into the points of its batch-size and LR step plots; :func:`study_row` is a row of
the studies page. :func:`param_importance` reads the study's Optuna storage (the only
function here that touches a database).

Numbers stay numbers (the page formats them); times are ISO 8601 UTC strings.
"""

from __future__ import annotations

import hashlib
import math
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final

from tuner.errors import ValidationError
from tuner.formatting import format_duration, format_objective, metric_kind
from tuner.noise_candidate import StepFloor, step_floor_text
from tuner.objectives import (
    compare,
    ended_text,
    metric_words,
    objective_label,
    objective_target,
    objective_values,
    outside_text,
    search_text,
    study_metric,
    study_step_cap,
)
from tuner.schedule import Schedule, schedule_summary
from tuner.seeds import seed_text
from tuner.store import (
    EpochMetrics,
    EpochOrigin,
    StudyRecord,
    StudyStatus,
    TrialRecord,
    TrialStatus,
)

__all__ = [
    "BASELINE_LABELS",
    "CHANGE_MARGIN",
    "MIN_IMPORTANCE_TRIALS",
    "Curve",
    "EpochOrigin",
    "NoiseCurve",
    "best_detail",
    "compact_curve",
    "comparison_rows",
    "curves_of",
    "data_etag",
    "elapsed_seconds",
    "fork_parent",
    "format_duration",
    "format_objective",
    "is_live",
    "objective_info",
    "param_importance",
    "schedule_picture",
    "schedule_summary",
    "search_lane",
    "study_header",
    "study_metric",
    "study_page_data",
    "study_row",
    "trial_row",
]

#: Display names of the built-in baselines (others are shown by their name).
BASELINE_LABELS: Final[Mapping[str, str]] = {
    "small_batch": "small batch",
    "large_batch": "large batch (Goyal)",
    "increase_batch": "increase batch (Smith)",
    "noise_scale": "noise scale (McCandlish)",
    "fitted_constant": "budget-fitted constant batch",
    "fitted_increase": "budget-fitted increase batch",
    "fitted_constant_sqrt": "budget-fitted constant batch, square-root LR",
    "fitted_batch_warmup": "budget-fitted batch warm-up",
    "recipe_lr_half": "best recipe at half the LR",
    "recipe_first_lr_double": "best recipe at twice the first stage's LR",
    "recipe_lr_up": "best recipe, LR up: first stage 2x, uncut larger batches 3x",
    "runner_up_lr_half": "second-best recipe at half the LR",
    "runner_up_first_lr_double": "second-best recipe at twice the first stage's LR",
    "runner_up_lr_up": "second-best recipe, LR up: first stage 2x, uncut larger batches 3x",
}

#: An incremental poll (``since``) re-sends trials finished this long before ``since``
#: too, so a worker clock a little behind the server's loses no update.
CHANGE_MARGIN: Final = timedelta(minutes=2)

#: Parameter importance needs at least this many usable (complete, feasible) Optuna trials.
MIN_IMPORTANCE_TRIALS: Final = 5

#: Points per stage when sampling a decaying LR (cosine, linear); steps are drawn exactly.
_LR_SAMPLES_PER_STAGE: Final = 24


# -- small formatting helpers (also Jinja filters) -------------------------------------------


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _finite(value: float | None, digits: int | None = None) -> float | None:
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits) if digits is not None else float(value)


# -- objective ------------------------------------------------------------------------------


def objective_info(
    spec: Mapping[str, Any], summary: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The study's objective from its spec: kind, value names, directions, cost, the metric
    (name, direction, words, how to format it) and a label."""
    raw = spec.get("objective")
    objective: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    kind = str(objective.get("kind") or "accuracy")
    cost = str(objective.get("cost") or "steps")
    metric, direction = study_metric(spec, summary)
    words = metric_words(metric)
    names, directions = (list(v) for v in objective_values(kind, cost, metric, direction))
    common = {
        "kind": kind,
        "names": names,
        "directions": directions,
        "metric": metric,
        "metric_direction": direction,
        "metric_label": words,
        # how the page formats the metric's values (tuner.formatting.metric_kind)
        "metric_format": metric_kind(metric),
    }
    label = objective_label(objective, metric, direction)
    if kind == "time_to_accuracy":
        target = objective_target(objective)
        return {
            **common,
            "cost": cost,
            "target": target,
            "target_accuracy": target if metric == "val_accuracy" else None,
            "label": label,
        }
    if kind == "pareto":
        return {**common, "cost": cost, "label": label}
    return {**common, "kind": "accuracy", "cost": "steps", "label": label}


# -- studies page ---------------------------------------------------------------------------


def elapsed_seconds(study: StudyRecord, now: datetime) -> float | None:
    """Run time so far (running), or start to finish (finished); ``None`` if never started."""
    if study.started_at is None:
        return None
    end = study.finished_at if study.finished_at is not None else now
    return max(0.0, (end - study.started_at).total_seconds())


def best_detail(study: StudyRecord) -> str | None:
    """What the best value is, under it: the trial, its kind when it is a baseline, and
    "mean of K fresh seeds" for a seed-robust pick (``None`` without a best trial)."""
    if study.best_trial_number is None:
        return None
    parts = [f"trial #{study.best_trial_number}"]
    baseline = study.best_trial_baseline
    if baseline is not None:
        parts.append(f"{BASELINE_LABELS.get(baseline, baseline)} baseline")
    best = (study.summary or {}).get("best")
    if isinstance(best, Mapping) and best.get("number") == study.best_trial_number:
        seeds = best.get("seeds")
        if isinstance(seeds, Mapping) and seeds.get("seeds"):
            parts.append(f"mean of {len(seeds['seeds'])} fresh seeds")
    return " · ".join(parts)


def study_row(study: StudyRecord, now: datetime) -> dict[str, Any]:
    """One row of the studies page."""
    objective = objective_info(study.spec, study.summary)
    name = objective["names"][0]
    budget = max(1, study.budget)
    return {
        "id": study.id,
        "name": study.name or f"study {study.id}",
        "task": study.task,
        "owner": study.owner,
        "status": study.status.value,
        "finished": study.is_finished,
        "cancel_requested": study.cancel_requested,
        "budget": study.budget,
        "trials_done": study.trials_done,
        "trials_running": study.trials_running,
        "done_pct": round(min(100.0, 100.0 * study.trials_done / budget), 1),
        "running_pct": round(
            min(
                100.0 - min(100.0, 100.0 * study.trials_done / budget),
                100.0 * study.trials_running / budget,
            ),
            1,
        ),
        "best_value": _finite(study.best_value),
        "best_text": format_objective(study.best_value, name),
        "best_trial_number": study.best_trial_number,
        "best_detail": best_detail(study),
        "objective": objective,
        "elapsed_s": elapsed_seconds(study, now),
        "elapsed_text": format_duration(elapsed_seconds(study, now)),
        "created_at": _iso(study.created_at),
        "created_text": study.created_at.astimezone(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "error": study.error,
    }


# -- study page -------------------------------------------------------------------------------


def _lr_points(schedule: Schedule) -> tuple[list[float], list[float]]:
    """Points (epoch, LR) whose straight-line interpolation is the exact LR curve for constant,
    step and warm-up segments (a jump is two points at one epoch) and a fine sampling of
    cosine and linear decays."""
    xs: list[float] = []
    ys: list[float] = []

    def add(x: float, y: float) -> None:
        xs.append(round(x, 6))
        ys.append(float(f"{y:.6g}"))

    for i, st in enumerate(schedule.stages):
        start, end = float(st.start_epoch), float(st.end_epoch)
        if i > 0:  # the value just before the boundary, then the jump
            add(start, schedule.stage_end_lr(i - 1))
        add(start, schedule.lr_at(start))
        warm_end = start + min(st.warmup_epochs, end - start)
        if warm_end > start:
            add(warm_end, schedule.lr_at(min(warm_end, end - 1e-9)))
        if st.decay == "step" and st.step_every_epochs:
            k = 1
            while warm_end + k * st.step_every_epochs < end - 1e-9:
                x = warm_end + k * st.step_every_epochs
                add(x, schedule.lr_at(x - 1e-6))  # just before the step (beyond its tolerance)
                add(x, schedule.lr_at(x))
                k += 1
        elif st.decay in ("cosine", "linear") and end > warm_end:
            n = _LR_SAMPLES_PER_STAGE if st.decay == "cosine" else 1
            for j in range(1, n):
                x = warm_end + (end - warm_end) * j / n
                add(x, schedule.lr_at(x))
        add(end, schedule.stage_end_lr(i))
    return xs, ys


def schedule_picture(document: Mapping[str, Any]) -> dict[str, Any] | None:
    """The points of a schedule's pictures: batch size per epoch (draw with ``shape="hv"``:
    ``batch_epochs`` are the stage starts plus the end) and the LR curve (draw with straight
    lines). ``None`` if the document is not a valid schedule."""
    try:
        schedule = Schedule.from_dict(dict(document))
    except (ValidationError, TypeError, ValueError):
        return None
    stages = schedule.stages
    lr_epochs, lrs = _lr_points(schedule)
    return {
        "summary": schedule.summary(),
        "total_epochs": schedule.total_epochs,
        "batch_epochs": [s.start_epoch for s in stages] + [stages[-1].end_epoch],
        "batch_sizes": [s.batch_size for s in stages] + [stages[-1].batch_size],
        "lr_epochs": lr_epochs,
        "lrs": lrs,
        "stages": [
            {
                "start": s.start_epoch,
                "end": s.end_epoch,
                "batch_size": s.batch_size,
                "peak_lr": float(f"{schedule.peak_lr(i):.6g}"),
                "warmup_epochs": s.warmup_epochs,
                "decay": s.decay,
            }
            for i, s in enumerate(stages)
        ],
    }


def trial_row(trial: TrialRecord, metric: str = "val_accuracy") -> dict[str, Any]:
    """One trial as the page uses it (table row, chart point); ``metric_value`` is the final
    value of the study's ``metric``."""
    return {
        "number": trial.number,
        "baseline": trial.baseline,
        "status": trial.status.value,
        "stop_reason": trial.stop_reason,
        # Written by the store with the trial; older rows have none.
        "summary": trial.schedule_summary or schedule_summary(trial.schedule),
        "val_accuracy": _finite(trial.val_accuracy),
        "val_loss": _finite(trial.val_loss),
        "metric_value": _finite(trial.metric(metric)),
        "steps": trial.steps,
        "wall_time_s": _finite(trial.wall_time_s, 3),
        "mean_batch_size": _finite(trial.mean_batch_size, 3),
        "epochs_done": trial.epochs_done,
        "started_at": _iso(trial.started_at),
        "finished_at": _iso(trial.finished_at),
    }


Curve = Sequence[tuple[int, float | None]]
"""A learning curve: ``(epoch index, value of the study's metric)`` by epoch."""


def curves_of(
    metrics: Mapping[int, Sequence[EpochMetrics]], metric: str = "val_accuracy"
) -> dict[int, Curve]:
    """The learning curves of ``metric`` in :meth:`StudyStore.study_metrics`'s answer, by
    trial number."""

    def value(m: EpochMetrics) -> float | None:
        if metric == "val_accuracy":
            return m.val_accuracy
        if metric == "val_loss":
            return m.val_loss
        v = m.extra.get(metric)
        return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

    return {number: [(m.epoch, value(m)) for m in ms] for number, ms in metrics.items()}


def compact_curve(curve: Curve) -> dict[str, list[Any]]:
    """A learning curve as columns: ``epoch`` counts epochs trained (epoch index + 1, so it
    lines up with the schedule picture's epoch axis), ``value`` the study metric's value
    after it (6 significant digits; ``None`` where not reported: the store keeps non-finite
    values as ``NULL``)."""
    return {
        "epoch": [epoch + 1 for epoch, _ in curve],
        "value": [None if v is None else float(f"{v:.6g}") for _, v in curve],
    }


_COMPARED_KEYS: Final = ("val_accuracy", "metric_value", "steps", "wall_time_s", "mean_batch_size")


def _comparison_row(
    source: Mapping[str, Any], role: str, objective: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "role": role,
        "number": source.get("number"),
        "baseline": source.get("baseline"),
        "candidate": source.get("candidate"),
        "summary": source.get("schedule_summary") or source.get("summary"),
        "status": source.get("status"),
    }
    for key in _COMPARED_KEYS:
        value = source.get(key)
        row[key] = value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if row["metric_value"] is None and source.get("metric") is None:
        row["metric_value"] = row["val_accuracy"]  # a summary written before studies had metrics
    # A finalist's seed runs (see tuner.seeds): its metric over the fresh seeds.
    seeds = source.get("seeds")
    row["seeds_text"] = seed_text(seeds) if isinstance(seeds, Mapping) else None
    row["seed_count"] = len(seeds.get("seeds") or ()) if isinstance(seeds, Mapping) else None
    # A baseline that breaks the objective's constraints (over the step cap, say): trained
    # for the comparison, never the result.
    row["outside"] = outside_text(source, objective or {})
    # A row that did not train its whole schedule (a recipe candidate ASHA stopped): its
    # figures are those of the epochs it trained, and the row says so.
    row["ended"] = ended_text(source)
    return row


def comparison_rows(study: StudyRecord, trials: Iterable[TrialRecord]) -> list[dict[str, Any]]:
    """The best schedule against each baseline: the best row first, then one per baseline
    with ``vs_best`` (metric and accuracy differences best - baseline, best / baseline ratios of
    steps, wall time and mean batch). From the study summary when the engine wrote one,
    else from the trials themselves (while the study runs); without a best trial yet, the
    finished baselines alone (``vs_best`` ``None``). A baseline that is the best trial is
    only the best row."""
    summary = study.summary or {}
    metric = study_metric(study.spec, summary)[0]
    raw = study.spec.get("objective")
    objective: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    best_doc = summary.get("best")
    baselines_doc = summary.get("baselines")
    if isinstance(best_doc, Mapping) and isinstance(baselines_doc, list):
        best = _comparison_row(best_doc, "best")
        bases = [
            _comparison_row(b, "baseline", objective)
            for b in baselines_doc
            if isinstance(b, Mapping)
        ]
        for doc in summary.get("candidates") or []:
            if isinstance(doc, Mapping):
                row = _comparison_row(doc, "candidate")
                row["candidate"] = doc.get("candidate")
                bases.append(row)
    else:
        by_number = {t.number: t for t in trials}
        best_trial = (
            by_number.get(study.best_trial_number) if study.best_trial_number is not None else None
        )
        bases = [
            _comparison_row(trial_row(t, metric), "baseline")
            for t in sorted(by_number.values(), key=lambda t: t.number)
            if t.baseline is not None and t.status is not TrialStatus.RUNNING
        ]
        if best_trial is None:  # the baselines alone, nothing to compare them with yet
            for base in bases:
                base["vs_best"] = None
                base["is_best"] = False
            return bases
        best = _comparison_row(trial_row(best_trial, metric), "best")
    rows = [best]
    for base in bases:
        if base["number"] == best["number"]:
            continue  # the best is this baseline: its row says so
        base["vs_best"] = compare(best, base)
        base["is_best"] = False
        rows.append(base)
    best["is_best"] = True
    return rows


def study_header(study: StudyRecord, now: datetime) -> dict[str, Any]:
    """The study's header: :func:`study_row` plus what the study page adds, without the
    elapsed time (the page ticks it from ``started_at``), so the page data only changes when
    the study does."""
    row = study_row(study, now)
    del row["elapsed_s"], row["elapsed_text"]
    summary = study.summary or {}
    note = summary.get("note")
    lead = (summary.get("seed_runs") or {}).get("lead") or {}
    row.update(
        {
            "started_at": _iso(study.started_at),
            "finished_at": _iso(study.finished_at),
            "worker_id": study.worker_id,
            "attempts": study.attempts,
            "note": note if isinstance(note, str) else None,
            # the finalist as good as the result within the seeds' noise (tuner.seeds.lead;
            # the banner shows it where it does not show the note, which repeats it)
            "lead_note": lead.get("note") if isinstance(lead.get("note"), str) else None,
            # the lead is finer than one run on the validation split reads (an accuracy
            # study; tuner.objectives.split_resolution): shown beside the lead the same way
            "split_note": (
                lead.get("split_note") if isinstance(lead.get("split_note"), str) else None
            ),
            "best_is_baseline": bool(summary.get("best_is_baseline", False)),
            "search": search_text(summary) or None,
            "total_epochs": _spec_total_epochs(study.spec),
        }
    )
    return row


def _spec_total_epochs(spec: Mapping[str, Any]) -> int | None:
    schedule = spec.get("schedule")
    if isinstance(schedule, Mapping):
        total = schedule.get("total_epochs")
        if isinstance(total, int) and not isinstance(total, bool):
            return total
    return None


def _changed_since(trial: TrialRecord, since: datetime) -> bool:
    if trial.status is TrialStatus.RUNNING or trial.finished_at is None:
        return True
    return trial.finished_at >= since - CHANGE_MARGIN


@dataclass(frozen=True)
class NoiseCurve:
    """The gradient noise scale a trial measured per epoch (the small-batch baseline's: the
    noise-scale candidate follows it), and the step floor it gives
    (:func:`tuner.noise_candidate.noise_scale_step_floor`)."""

    number: int
    points: Sequence[tuple[int, float | None]]
    floor: StepFloor | None = None
    running: bool = False  # the trial is still running: its curve so far

    def to_dict(self, step_cap: int | None = None) -> dict[str, Any] | None:
        """Columns for the schedule chart: ``epoch`` is the middle of the epoch it was
        measured in (the batch picture's axis counts epochs from 0); ``step_floor``: the
        floor, the run's steps, their ratio, the study's step cap (``objective.max_steps``) if
        it has one, and the sentence the page shows. ``None`` without any finite value."""
        pts = [(e, v) for e, v in self.points if v is not None and math.isfinite(v) and v > 0]
        if not pts:
            return None
        floor = None if self.floor is None else self.floor.to_dict(step_cap)
        if floor is not None:
            floor["text"] = step_floor_text(floor, self.number, running=self.running)
        return {
            "trial": self.number,
            "epoch": [e + 0.5 for e, _ in pts],
            "value": [round(v, 3) for _, v in pts],
            "step_floor": floor,
        }


def _shares_prefix(a: Mapping[str, Any], b: Mapping[str, Any], epoch: int) -> bool:
    """Whether two schedule documents have the same settings and stages up to a stage
    boundary at ``epoch`` (what a fork shares)."""
    rest_a = {k: v for k, v in a.items() if k not in ("stages", "provenance")}
    rest_b = {k: v for k, v in b.items() if k not in ("stages", "provenance")}
    if rest_a != rest_b:
        return False
    head_a = [st for st in a.get("stages") or () if st.get("start_epoch", 0) < epoch]
    head_b = [st for st in b.get("stages") or () if st.get("start_epoch", 0) < epoch]
    return bool(head_a) and head_a == head_b and head_a[-1].get("end_epoch") == epoch


def fork_parent(trial: TrialRecord, epoch: int, trials: Iterable[TrialRecord]) -> int | None:
    """The trial that trained the prefix ``trial`` forked from at ``epoch``: the first one
    started with the same stages up to that boundary (``None`` if none is in the study)."""
    parents = [
        t
        for t in trials
        if t.number != trial.number
        and t.started_at <= trial.started_at
        and _shares_prefix(t.schedule, trial.schedule, epoch)
    ]
    return min(parents, key=lambda t: (t.started_at, t.number)).number if parents else None


def search_lane(
    trial: TrialRecord, origins: Sequence[EpochOrigin], trials: Iterable[TrialRecord]
) -> dict[str, Any]:
    """One trial's lane of the search view: its epochs as segments ``[start, end, kind,
    from]`` (``kind`` ``own``: trained by the trial; ``fork``: a shared prefix it forked from,
    trained once by trial ``from``; ``clone``: PBT copied trial ``from``'s state), its cooldown
    probes ``[epoch, value of the metric]`` (epochs counted like the curves: after epoch k is
    k + 1), and ``origin``, the same in words."""
    parent: int | None = None
    forked = max((o.forked_epochs for o in origins if o.cloned_from is None), default=0)
    if forked:
        parent = fork_parent(trial, forked, trials)
    segments: list[list[Any]] = []
    for o in sorted(origins, key=lambda o: o.epoch):
        source: int | None
        if o.cloned_from is not None:
            kind, source = "clone", o.cloned_from
        elif o.replayed:
            kind, source = "fork", parent
        else:
            kind, source = "own", None
        last = segments[-1] if segments else None
        if last is not None and last[1] == o.epoch and last[2] == kind and last[3] == source:
            last[1] = o.epoch + 1
        else:
            segments.append([o.epoch, o.epoch + 1, kind, source])
    words = []
    for start, end, kind, source in segments:
        who = f"#{source}" if source is not None else "a saved prefix"
        if kind == "fork":
            words.append(f"forked from {who} at epoch {end}")
        elif kind == "clone":
            words.append(f"epochs {start + 1}-{end} cloned from {who} (PBT)")
    return {
        "segments": segments,
        "probes": [
            [o.epoch + 1, float(f"{o.probe:.6g}")]
            for o in origins
            if o.probe is not None and math.isfinite(o.probe)
        ],
        "origin": "; ".join(words) or None,
    }


def study_page_data(
    study: StudyRecord,
    trials: Sequence[TrialRecord],
    curves: Mapping[int, Curve],
    *,
    now: datetime,
    since: datetime | None = None,
    noise: NoiseCurve | None = None,
    origins: Mapping[int, Sequence[EpochOrigin]] | None = None,
) -> dict[str, Any]:
    """Everything the study page draws, in one JSON-ready mapping.

    With ``since`` (the ``server_time`` of an earlier answer) only trials that may have
    changed after it are included (running ones, and those finished since, with a margin:
    a finished trial never changes again), with ``"incremental": true``; the page merges
    them into what it has. Study-level parts (header, comparison, schedules of the best
    trial and the baselines) are always complete.
    """
    by_number = {t.number: t for t in trials}
    shown = [t for t in trials if since is None or _changed_since(t, since)]
    pictures: dict[str, Any] = {}
    for t in trials:
        if t.baseline is not None or t.number == study.best_trial_number:
            picture = schedule_picture(t.schedule)
            if picture is not None:
                pictures[str(t.number)] = picture
    counts = {s.value: 0 for s in TrialStatus}
    for t in trials:
        counts[t.status.value] += 1
    metric = study_metric(study.spec, study.summary)[0]
    return {
        "version": 1,
        "incremental": since is not None,
        "study": study_header(study, now),
        "counts": counts,
        "trial_total": len(by_number),
        "trials": [trial_row(t, metric) for t in shown],
        "curves": {str(t.number): compact_curve(curves.get(t.number, ())) for t in shown},
        "schedules": pictures,
        "noise_scale": None if noise is None else noise.to_dict(study_step_cap(study.spec)),
        "comparison": comparison_rows(study, trials),
        # The search view: per trial, what it trained, forked or cloned, and its probes
        # (what the whole search spent is the header's ``search``).
        "lanes": {
            str(t.number): search_lane(t, (origins or {}).get(t.number, ()), trials) for t in shown
        },
    }


def data_etag(body: bytes) -> str:
    """A strong ETag of the serialized page data."""
    return '"' + hashlib.blake2b(body, digest_size=12).hexdigest() + '"'


# -- parameter importance (Optuna) ----------------------------------------------------------------


def _unavailable(note: str, **extra: Any) -> dict[str, Any]:
    return {"available": False, "note": note, "objectives": [], **extra}


#: Target quantile of PED-ANOVA: the top 10 % of the trials, but at least this many trials.
_IMPORTANCE_TOP: Final = 0.1
_IMPORTANCE_TOP_MIN: Final = 5
_IMPORTANCE_LOCK: Final = threading.Lock()


def param_importance(storage_url: str, study: StudyRecord) -> dict[str, Any]:
    """Optuna's parameter importance for the study, read from the Optuna RDB storage at
    ``storage_url`` (the service database): one ranking per objective value.

    The evaluator is PED-ANOVA (``optuna.importance.PedAnovaImportanceEvaluator``): how much
    each parameter's distribution in the best trials (top 10 %, at least 5 trials, at most
    half) differs from its distribution in all of them. It handles the conditional space
    (``share_2`` only exists with three stages and more) and takes well under a second on
    1,000 trials, where fANOVA takes minutes. Tuned trials with a result: completed ones, and
    (single objective) those ASHA stopped, at the metric of their last reported epoch (the
    note says how many of each); baselines are not Optuna trials, and those the engine told
    as infeasible (never trained) are left out. Returns ``{"available": False, "note": why}``
    when the database has no Optuna tables, the study has no Optuna study, or it has fewer
    than :data:`MIN_IMPORTANCE_TRIALS` usable trials.
    """
    import optuna  # heavy; only this endpoint needs it

    from tuner import optuna_storage

    budget = study.spec.get("budget") if isinstance(study.spec, dict) else None
    if isinstance(budget, dict) and budget.get("search") == "pbt":
        return _unavailable(
            "a PBT study samples no schedules from Optuna (its population grows by cloning "
            "and perturbing; the Search view shows each trial's lineage), so it has no "
            "parameter importance"
        )
    storage = optuna_storage.open_existing(storage_url)
    if storage is None:
        return _unavailable(
            "no Optuna storage in this database yet (the engine creates it when it samples "
            "its first schedule)"
        )
    try:
        existing = {s.study_name for s in storage.get_all_studies()}
        name = next((n for n in optuna_storage.study_names(study) if n in existing), None)
        if name is None:
            return _unavailable("no Optuna study found for this study")
        loaded = optuna.load_study(study_name=name, storage=storage)
        directions = loaded.directions
        # (params, distributions, values) of each usable trial: completed ones with their
        # values; for a single objective also those ASHA stopped, at the metric of the last
        # epoch they reported (their score when the search let them go).
        usable: list[tuple[dict[str, Any], dict[str, Any], list[float]]] = []
        stopped = 0
        for t in loaded.get_trials(deepcopy=False):
            if t.user_attrs.get(optuna_storage.INFEASIBLE_ATTR) or not t.params:
                continue
            if t.state is optuna.trial.TrialState.COMPLETE and t.values is not None:
                if all(math.isfinite(v) for v in t.values):
                    usable.append((t.params, t.distributions, list(t.values)))
            elif (
                t.state is optuna.trial.TrialState.PRUNED
                and len(directions) == 1
                and t.intermediate_values
            ):
                last = t.intermediate_values[max(t.intermediate_values)]
                if math.isfinite(last):
                    usable.append((t.params, t.distributions, [last]))
                    stopped += 1
        names_attr = loaded.user_attrs.get(optuna_storage.OBJECTIVE_ATTR)
    finally:
        storage.engine.dispose()
    completed = len(usable) - stopped
    if len(usable) < MIN_IMPORTANCE_TRIALS:
        when = (
            "; the study has finished (a study with more trials shows it)"
            if study.is_finished
            else " so far"
        )
        return _unavailable(
            f"parameter importance needs at least {MIN_IMPORTANCE_TRIALS} tuned trials with "
            f"a result (completed, or stopped early by ASHA); this study has {len(usable)}"
            f"{when}. Baselines are not in the Optuna study",
            optuna_study=name,
            n_trials=len(usable),
        )
    value_names = (
        [str(n) for n in names_attr]
        if isinstance(names_attr, list) and len(names_attr) == len(directions)
        else [f"objective {i}" for i in range(len(directions))]
    )
    # PED-ANOVA needs its top quantile below the whole (1.0): at most half of few trials.
    top = min(0.5, max(_IMPORTANCE_TOP, _IMPORTANCE_TOP_MIN / len(usable)))
    objectives = []
    for index, (value_name, direction) in enumerate(zip(value_names, directions, strict=True)):
        # One single-objective copy per value, so "best" follows that value's direction.
        copy = optuna.create_study(direction=direction)
        copy.add_trials(
            [
                optuna.trial.create_trial(params=params, distributions=dists, value=values[index])
                for params, dists, values in usable
            ]
        )
        try:
            # warnings.catch_warnings swaps the process-wide filters, so two requests doing this
            # at once in the server's threads would restore each other's filters mid-way; the
            # lock keeps the swap whole (importance is computed one study at a time anyway).
            with _IMPORTANCE_LOCK, warnings.catch_warnings():
                # "Some regimes ... have less than 2 trials": a conditional parameter seen in
                # few trials is judged on those it has; nothing for the page to act on.
                warnings.simplefilter("ignore")
                ranking = optuna.importance.get_param_importances(
                    copy,
                    evaluator=optuna.importance.PedAnovaImportanceEvaluator(target_quantile=top),
                )
        except (ValueError, RuntimeError) as exc:
            return _unavailable(
                f"Optuna could not compute parameter importance: {exc}",
                optuna_study=name,
                n_trials=len(usable),
            )
        objectives.append(
            {
                "name": value_name,
                "direction": direction.name.lower(),
                "params": [
                    {"name": param, "importance": round(float(value), 5)}
                    for param, value in ranking.items()
                ],
            }
        )
    best_n = max(1, round(top * len(usable)))
    which = f"{completed} completed" + (
        f" and {stopped} stopped early (at their last epoch's metric)" if stopped else ""
    )
    return {
        "available": True,
        "note": f"PED-ANOVA: what sets the best {best_n} of {len(usable)} tuned trials "
        f"({which}) apart",
        "evaluator": "ped_anova",
        "optuna_study": name,
        "n_trials": len(usable),
        "n_stopped": stopped,
        "objectives": objectives,
    }


def is_live(study: StudyRecord) -> bool:
    """Whether the page should keep polling (the study may still change)."""
    return study.status in (StudyStatus.QUEUED, StudyStatus.RUNNING)
