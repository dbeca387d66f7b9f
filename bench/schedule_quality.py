"""Schedule quality: a tuned variable batch-size schedule against fixed and hand-made ones.

For one task, one number of epochs and the same fresh seeds, trains each schedule below from
scratch and evaluates the final model on the task's TEST split (never seen by tuning):

* ``small_batch``: the task's base batch and base LR throughout, step decays at 50 % / 75 %
  (``tuner.baselines.small_batch``: the reference accuracy).
* ``large_linear``: the space's largest batch, LR scaled linearly, warm-up (Goyal et al. 2017;
  ``tuner.baselines.large_batch``).
* ``large_sqrt``: the same with square-root LR scaling.
* ``increase_batch``: each LR decay replaced by a batch increase (Smith et al. 2017;
  ``tuner.baselines.increase_batch``).
* ``linear_ramp``: equal stages doubling the batch from the base to the largest, LR following
  linear scaling, a one-epoch warm-up at each increase (Lee et al. 2019 style).
* ``tuned``: the schedule stagetune's engine finds for the task (a study run here through
  ``workers.runner.run_study`` with the printed budget, or ``--tuned-yaml``), retrained from
  its YAML with the same fresh seeds as the others (not its tuning trial's seed).

The study optimises the task's study metric (its primary one, e.g. validation accuracy for
mnist1d and validation loss for tinylm, or ``--metric``) under ``max_steps`` =
``--steps-fraction`` (1/5) of the small batch's steps: the target is small-batch quality at
>= 5x fewer optimizer steps. Each retraining is scored on the TEST split by
``workers.tasks.evaluate_metrics`` (every metric the task declares; the tables use the study
metric's ``test_<name>``, and keep accuracy figures for classification tasks). "At least as
good" follows the metric's direction (``max`` / ``min``).

Writes ``schedule_quality[_<task>][_smoke][_<tag>].{json,md,png}`` to ``--results-dir``
(default ``bench/results``; no ``_<task>`` for mnist1d, nor for the smoke run's digits) and
ends with one line. For an accuracy study (mnist1d's)::

    quality task=.. dominated=K/N steps_ratio_at_small_acc=.. tuned_acc=.. small_acc=..
    small_std=.. tuned_steps=.. small_steps=.. steps_ratio=.. best_baseline=..
    best_baseline_acc=.. large_batch_gap=..

(accuracies in percent on the test split, means over the seeds; ``best_baseline`` is the most
accurate recipe other than ``small_batch``; ``large_batch_gap`` is the small batch's accuracy
minus Goyal's large batch's, in points: the penalty a schedule can win back). For any other
metric the keys are named after the metric and values are in its units (loss: 4 decimals,
psnr: 2 decimals, dB)::

    quality task=.. metric=val_loss dominated=K/N steps_ratio_at_small=.. tuned=.. small=..
    small_std=.. tuned_steps=.. small_steps=.. steps_ratio=.. best_baseline=..
    best_baseline_value=.. large_batch_gap=..

(``large_batch_gap`` oriented so that a positive gap is a penalty: Goyal's minus the small
batch's for a ``min`` metric). With ``--budgets recipes`` (the default) one more study runs
under each recipe's own step count (``tuned@<steps>``), so the result is a front of tuned
schedules: ``dominated`` counts the recipes for which some tuned schedule is at least as good
on the test metric (within one std of the recipe's mean) at no more steps, and
``steps_ratio_at_small[_acc]`` is the small batch's steps over those of the cheapest tuned
schedule within the small batch's spread (``none``: no such schedule). ``tuned*`` is the
``--steps-fraction`` study's. ``--ratios 2,3,4`` adds a study under a half, a third and a
quarter of the small batch's steps, so the front also has points at those savings.

The batch range is the task's base batch to ``--batch-max``; by default 1,024 for mnist1d
(measured: Goyal's recipe loses 3-5 points there, 0.3 at 512) and 16x the base batch for other
tasks (tinylm: 32-512).

    .venv/bin/python bench/schedule_quality.py       # mnist1d, 30 epochs, batch 32-1024, 3 seeds
    .venv/bin/python bench/schedule_quality.py --task tinylm --seeds 5 --trials 24
    .venv/bin/python bench/schedule_quality.py --tuned-yaml best.yaml
    .venv/bin/python bench/schedule_quality.py --smoke --results-dir /tmp/q
    .venv/bin/python bench/schedule_quality.py --smoke --task tinylm --results-dir /tmp/q
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# Run as a script (``bench/`` is not a package): the repository root for ``tuner`` /
# ``workers``, and ``bench/`` itself for the shared helpers in ``common.py``.
_HERE = Path(__file__).resolve().parent
for _path in (str(_HERE.parent), str(_HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from common import (  # noqa: E402
    LEGACY_LR_MULTIPLIER,
    RESULTS_DIR,
    Job,
    Metric,
    RunResult,
    add_study_arguments,
    default_batch_max,
    ensure_ray,
    machine_info,
    markdown_table,
    mean_std,
    publish,
    retrain_many,
    run_tuning_study,
    study_arguments,
    study_base,
)

from tuner.baselines import increase_batch, large_batch, small_batch  # noqa: E402
from tuner.schedule import Schedule, Stage  # noqa: E402
from tuner.space import ScheduleSpace  # noqa: E402
from tuner.spec import StudySpec  # noqa: E402

DESCRIPTIONS = {
    "small_batch": "base batch, base LR, step decays (reference)",
    "large_linear": "largest batch, linear LR scaling + warm-up (Goyal et al. 2017)",
    "large_sqrt": "largest batch, sqrt LR scaling + warm-up",
    "increase_batch": "batch increases instead of LR decays (Smith et al. 2017)",
    "linear_ramp": "batch doubling in equal stages, linear LR (Lee et al. 2019 style)",
    "tuned": "found by stagetune (TPE + ASHA), retrained with fresh seeds",
}

#: Task options of the smoke run, for tasks too slow at their defaults (the bench's
#: ``--task-options`` go on top).
SMOKE_TASK_OPTIONS: dict[str, dict[str, Any]] = {
    "tinylm": {"num_train_sequences": 256, "num_val_sequences": 64, "num_test_sequences": 64},
}


def study_spec(
    task: str,
    epochs: int,
    batch_max: int,
    max_steps: int,
    trials: int,
    seed: int,
    grace: int,
    concurrent: int,
    gpus_per_worker: float = 0.0,
    metric: str | None = None,
    task_options: Mapping[str, Any] | None = None,
    lr_multiplier: tuple[float, float] | None = LEGACY_LR_MULTIPLIER,
) -> StudySpec:
    """The tuning study: the task's metric (``metric``, else its primary one) under a step
    budget; the baselines are trained here, so the study runs none. ``lr_multiplier``: the
    space's range given explicitly, or None for the space's default (widened to reach the
    square-root rule's LR at the largest batch, ``tuner.space.lr_multiplier_range``)."""
    base = study_base(
        task,
        f"bench-quality-{task}",
        seed,
        epochs,
        batch_max,
        max_steps=max_steps,
        metric=metric,
        task_options=task_options,
        lr_multiplier=lr_multiplier,
    )
    return StudySpec.from_dict(
        {
            **base,
            "budget": {
                "trials": trials,
                "max_concurrent": concurrent,
                "grace_period_epochs": grace,
                "reduction_factor": 3,
                "early_stopping": True,
                "sampler": "tpe",
                "startup_trials": min(8, max(1, trials // 4)),
            },
            "resources": {
                "workers": 1,
                "cpus_per_worker": 1,
                "gpus_per_worker": gpus_per_worker,
            },
            "baselines": False,
        }
    )


def large_sqrt(space: ScheduleSpace) -> Schedule:
    """Goyal's schedule with the LR scaled by sqrt(batch / base) instead of linearly."""
    linear = large_batch(space)
    ratio = space.largest_batch / space.base_batch_size
    peak = space.base_lr * math.sqrt(ratio)
    stages = []
    for i, st in enumerate(linear.stages):
        lr = peak / 4**i
        stages.append(
            Stage(
                st.start_epoch,
                st.end_epoch,
                st.batch_size,
                lr_multiplier=lr / (space.base_lr * math.sqrt(ratio)),
                warmup_epochs=st.warmup_epochs,
            )
        )
    schedule = space.schedule(stages)
    return Schedule.from_dict({**schedule.to_dict(), "scaling_rule": "sqrt"})


def linear_ramp(space: ScheduleSpace) -> Schedule:
    """Equal stages doubling the batch from the base to the largest (at most one per epoch)."""
    batches: list[int] = []
    b = space.base_batch_size
    while b <= space.largest_batch:
        batches.append(b)
        b *= 2
    n = min(len(batches), space.total_epochs)
    batches = batches[len(batches) - n :] if n < len(batches) else batches
    bounds = [round(i * space.total_epochs / n) for i in range(n + 1)]
    stages = [
        Stage(
            bounds[i],
            bounds[i + 1],
            batches[i],
            warmup_epochs=min(1.0, float(bounds[i + 1] - bounds[i])) if i else 0.0,
        )
        for i in range(n)
    ]
    return space.schedule(stages)


def _stats(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample std; a diverged run's infinite value makes the mean infinite and the
    std NaN (no band)."""
    if all(math.isfinite(v) for v in values):
        return mean_std(values)
    finite = [v for v in values if not math.isnan(v)]
    return (sum(finite) / len(finite) if finite else math.nan), math.nan


def _row(label: str, runs: list[RunResult], metric: Metric) -> dict[str, Any]:
    row: dict[str, Any] = {"schedule": label, "description": DESCRIPTIONS[label]}
    accuracies = [r.test_accuracy for r in runs]
    if all(a is not None for a in accuracies):  # a classification task: as it always was
        accs = [float(a) for a in accuracies if a is not None]
        acc_mean, acc_std = mean_std(accs)
        val_mean, _ = mean_std([float(r.val_accuracy or 0.0) for r in runs])
        row.update(
            {
                "test_acc_mean": acc_mean,
                "test_acc_std": acc_std,
                "test_acc_min": min(accs),
                "test_acc_max": max(accs),
                "val_acc_mean": val_mean,
            }
        )
    values = [r.test_metrics[metric.test_key] for r in runs]
    value_mean, value_std = _stats(values)
    val = [v for r in runs if (v := r.val_metrics.get(metric.name)) is not None]
    row.update(
        {
            "metric": metric.test_key,
            "metric_mean": value_mean,
            "metric_std": value_std,
            "metric_min": min(values),
            "metric_max": max(values),
            "val_metric_mean": mean_std(val)[0] if val else None,
            "test_metrics": {
                name: _stats([r.test_metrics[name] for r in runs])[0]
                for name in runs[0].test_metrics
            },
        }
    )
    row.update(
        {
            "steps": runs[0].steps,
            "mean_batch_size": runs[0].mean_batch_size,
            "samples_per_s": mean_std([r.samples_per_s for r in runs])[0],
            "train_time_s": mean_std([r.train_time_s for r in runs])[0],
            "wall_time_s": mean_std([r.wall_time_s for r in runs])[0],
            "diverged_runs": sum(r.diverged for r in runs),
            "seeds": [r.seed for r in runs],
        }
    )
    if "test_acc_mean" in row:
        row["test_acc_per_seed"] = [r.test_accuracy for r in runs]
    row["metric_per_seed"] = values
    return row


def _plot(rows: list[dict[str, Any]], title: str, path: Path, metric: Metric) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for row in rows:
        if not math.isfinite(row["metric_mean"]):
            continue  # every seed diverged: nothing to draw
        tuned = _is_tuned(row["schedule"])
        std = row["metric_std"] if math.isfinite(row["metric_std"]) else 0.0
        ax.errorbar(
            row["steps"],
            metric.scale * row["metric_mean"],
            yerr=metric.scale * std,
            fmt="*" if tuned else "o",
            markersize=14 if tuned else 7,
            capsize=4,
            color=("black" if row["schedule"] == "tuned" else "dimgray") if tuned else None,
            label=f"{row['schedule']} ({metric.show(row['metric_mean'])})",
        )
    ax.set_xscale("log")
    ax.set_xlabel("optimizer steps (log)")
    unit = ", %" if metric.is_accuracy else (f",{metric.unit}" if metric.unit else "")
    ax.set_ylabel(
        f"test {metric.words}{unit} (mean +/- std over seeds"
        + (", lower is better)" if metric.direction == "min" else ")")
    )
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right" if metric.direction == "max" else "upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _where(data: Mapping[str, Any]) -> str:
    """What each run trained on: the CPU, or its share of the GPU."""
    gpus = float(data["config"].get("gpus_per_worker") or 0.0)
    if not gpus:
        return "CPU"
    gpu = data.get("machine", {}).get("gpu") or "GPU"
    return f"{gpus:g} of one {gpu}, bf16 autocast"


def _metric_of(cfg: Mapping[str, Any]) -> Metric:
    """The study metric a result's config names (accuracy for results from before metrics)."""
    m = cfg.get("metric") or {}
    return Metric(m.get("name", "val_accuracy"), m.get("direction", "max"))


def _markdown(data: dict[str, Any]) -> str:
    cfg = data["config"]
    metric = _metric_of(cfg)
    # Beside a non-accuracy study metric, the task's other metrics (means) get a column each.
    others = [
        Metric(name, direction)
        for name, direction in (cfg.get("declared_metrics") or {}).items()
        if name != metric.name and not metric.is_accuracy
    ]
    rows = [
        [
            f"**{r['schedule']}**" if _is_tuned(r["schedule"]) else r["schedule"],
            r["summary"],
            f"{metric.fmt(r['metric_mean'])} +/- {metric.fmt(r['metric_std'])}",
            *(o.fmt(r["test_metrics"].get(o.test_key)) for o in others),
            f"{r['steps']:,}",
            f"{r['mean_batch_size']:.0f}",
            f"{r['samples_per_s']:,.0f}",
            f"{r['train_time_s']:.1f}",
            f"{r['wall_time_s']:.1f}",
        ]
        for r in data["rows"]
    ]
    also = f"; also the means of {', '.join(o.column for o in others)}" if others else ""
    out = [
        f"# Schedule quality: {cfg['task']}, {cfg['epochs']} epochs, seeds {cfg['seeds']}\n",
        f"Test {metric.words} (held-out split, never seen by tuning), mean +/- sample std over "
        f"the seeds{also}; steps and mean batch per run; samples/s and times are per run (1 "
        f"worker, {_where(data)}), means over the seeds.\n",
        markdown_table(
            [
                "schedule",
                "stages",
                metric.column,
                *(o.column for o in others),
                "steps",
                "mean batch",
                "samples/s",
                "train s",
                "wall s",
            ],
            rows,
        ),
    ]
    tuning = data["tuning"]
    if "metric" in cfg:
        m = cfg["metric"]
        out.append(
            f"\nStudy metric: {m['name']} ({m['direction']}; {m['source']}); batch range "
            f"{cfg['batch_range'][0]:,}-{cfg['batch_range'][1]:,} ({cfg['batch_max_source']})"
            + (f"; task options {json.dumps(cfg['task_options'])}" if cfg["task_options"] else "")
            + ".\n"
        )
    out.append(f"\nTuned schedule: {tuning['source']}.\n")
    if cfg.get("ratios"):
        out.append(
            "\nThe front's step caps: every recipe's own steps and "
            + ", ".join(f"1/{r:g}" for r in cfg["ratios"])
            + " of the small batch's (`--ratios`).\n"
        )
    for label, extra in (data.get("tuning_at_recipe_steps") or {}).items():
        out.append(f"\n{label}: {extra['source']}.\n")
    targets = data["targets"]
    out.append("\nTargets:\n")
    by = {r["schedule"]: r for r in data["rows"]}
    if "small_batch" in by and "large_linear" in by:
        gap = metric.fmt_scaled(_gap(by, metric))
        if metric.is_accuracy:
            out.append(
                f"\nLarge-batch gap of the task: {gap} points (small batch minus Goyal's "
                f"large batch at {cfg['batch_range'][1]:,}, test accuracy).\n"
            )
        else:
            first, second = (
                ("Goyal's large batch", "the small batch")
                if metric.direction == "min"
                else ("the small batch", "Goyal's large batch")
            )
            out.append(
                f"\nLarge-batch gap of the task: {gap}{metric.unit} of test {metric.words} "
                f"({first} minus {second}, Goyal's at batch {cfg['batch_range'][1]:,}; "
                "positive: a penalty).\n"
            )
    for key, value in targets.items():
        out.append(f"- {key}: {'met' if value['met'] else 'NOT met'} ({value['detail']})\n")
    out.append(f"\nMachine: {data['machine']}\n")
    if data.get("summary_line"):
        out.append(f"\n```\n{data['summary_line']}\n```\n")
    return "".join(out)


def _is_tuned(label: str) -> bool:
    return label == "tuned" or label.startswith("tuned@")


def _brief(tuning: dict[str, Any]) -> dict[str, Any]:
    """A study's record without its trials (the JSON keeps the main study's in full)."""
    return {k: v for k, v in tuning.items() if k != "trials"}


def front_caps(
    recipe_steps: Sequence[int], small_steps: int, max_steps: int, ratios: Sequence[float]
) -> list[int]:
    """The step caps of the front's extra studies: every recipe's own steps (so that each
    recipe meets a tuned schedule at no more steps than its own) and, for each ratio ``k`` of
    ``--ratios``, a ``k``-th of the small batch's steps (rounded down), so that the front has a
    point at each saving a user asks about, not only where a recipe happens to sit. Without
    them ``steps_ratio_at_small`` can only land on the recipes' step counts: denoise's front
    read 1.78x through its 144-step point while its next point down, 88 steps, fell short, so
    the ratio could have been anything up to 2.9x. The main study's cap (``max_steps``) is left
    out: that study has run already."""
    caps = set(recipe_steps) | {max(1, int(small_steps / k)) for k in ratios}
    return sorted(caps - {max_steps})


def _ratios(text: str) -> list[float]:
    """``--ratios 2,3,4``: step savings over the small batch (each > 1), for :func:`front_caps`."""
    try:
        ratios = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--ratios takes numbers separated by commas (e.g. 2,3,4), not {text!r}"
        ) from None
    bad = [r for r in ratios if not r > 1]
    if bad:
        raise argparse.ArgumentTypeError(
            f"--ratios: each ratio is a saving over the small batch's steps and must be over 1, "
            f"not {', '.join(f'{r:g}' for r in bad)}"
        )
    return ratios


def _as_good(row: Mapping[str, Any], ref: Mapping[str, Any], metric: Metric) -> bool:
    """``row``'s mean test metric is at least as good as ``ref``'s, within one std of it."""
    return metric.at_least(row["metric_mean"], ref["metric_mean"], ref["metric_std"])


def _dominance(rows: dict[str, dict[str, Any]], metric: Metric) -> dict[str, Any]:
    """Which recipes some tuned schedule dominates: at least as good on the test metric as
    the recipe (within one std of the recipe's mean, by the metric's direction) at no more
    steps; and the largest step saving of a tuned schedule with small-batch quality (within
    its spread)."""
    tuned = [r for k, r in rows.items() if _is_tuned(k)]
    recipes = [r for k, r in rows.items() if not _is_tuned(k)]
    by: dict[str, str | None] = {}
    for recipe in recipes:
        hits = [t for t in tuned if t["steps"] <= recipe["steps"] and _as_good(t, recipe, metric)]
        best = metric.best(hits) if hits else None
        by[recipe["schedule"]] = None if best is None else best["schedule"]
    small = rows["small_batch"]
    ratios = [small["steps"] / t["steps"] for t in tuned if _as_good(t, small, metric)]
    return {"by": by, "ratio_at_small": max(ratios) if ratios else None}


def _gap(rows: dict[str, dict[str, Any]], metric: Metric) -> float:
    """The task's large-batch penalty, scaled as printed (accuracy in points): how much worse
    Goyal's linear-scaling large batch's mean test metric is than the small batch's (what a
    search over this batch range can win back); positive: a penalty."""
    return metric.penalty(rows["small_batch"]["metric_mean"], rows["large_linear"]["metric_mean"])


def _targets(rows: dict[str, dict[str, Any]], ratio_goal: float, metric: Metric) -> dict[str, Any]:
    if "tuned" not in rows:
        return {}
    tuned, small = rows["tuned"], rows["small_batch"]
    within = _as_good(tuned, small, metric)
    ratio = small["steps"] / tuned["steps"] if tuned["steps"] else math.inf
    dom = _dominance(rows, metric)
    dominated = [k for k, v in dom["by"].items() if v is not None]
    at_small = dom["ratio_at_small"]
    others = [r for k, r in rows.items() if k != "small_batch" and not _is_tuned(k)]
    beaten = [
        r["schedule"] for r in others if metric.better(tuned["metric_mean"], r["metric_mean"])
    ]
    cheaper = [r["schedule"] for r in others if r["steps"] < tuned["steps"]]
    what = metric.words
    return {
        "every_recipe_dominated": {
            "met": len(dominated) == len(dom["by"]),
            "dominated": len(dominated),
            "recipes": len(dom["by"]),
            "by": dom["by"],
            "detail": "; ".join(
                f"{k}: {'by ' + v if v else 'not dominated'}" for k, v in dom["by"].items()
            ),
        },
        f"small_{metric.short}_at_{ratio_goal:g}x_fewer_steps": {
            "met": at_small is not None and at_small >= ratio_goal,
            "ratio": at_small,
            "detail": f"no tuned schedule reaches the small batch's {what} within its spread"
            if at_small is None
            else f"best tuned schedule within the small batch's spread: {at_small:.2f}x "
            "fewer steps",
        },
        "within_small_batch_spread": {
            "met": within,
            "detail": f"tuned {metric.show(tuned['metric_mean'])} vs small "
            f"{metric.fmt(small['metric_mean'])} +/- {metric.show(small['metric_std'])}",
        },
        f"at_least_{ratio_goal:g}x_fewer_steps": {
            "met": ratio >= ratio_goal,
            "detail": f"{small['steps']} / {tuned['steps']} = {ratio:.2f}x",
        },
        "above_every_large_batch_baseline": {
            "met": len(beaten) == len(others),
            "detail": f"beats {beaten or 'none'} of {[r['schedule'] for r in others]}; "
            f"baselines with fewer steps than tuned: {cheaper or 'none'}",
        },
    }


def _seed_note(seeded: Mapping[str, Any], metric: Metric) -> str:
    """How a study's seed runs picked its result (from its summary's ``seed_runs``), for the
    tuning line and the results' ``source``; "" without seed runs."""
    if not seeded:
        return ""
    rows = seeded.get("finalists") or ()
    stats: Mapping[str, Any] = next(
        (f for f in rows if f.get("number") == seeded.get("picked")), {}
    )
    reserves = sum(1 for f in rows if f.get("reserve"))
    why = seeded.get("reserves_why")
    among = f"{len(rows) - reserves} finalists" + (
        f" and {reserves} reserve(s) ({why or 'why: not recorded by this version'})"
        if reserves
        else ""
    )
    mean = stats.get("metric_mean", stats.get(f"{metric.name}_mean"))
    std = stats.get("metric_std", stats.get(f"{metric.name}_std"))
    lead = seeded.get("lead") or {}
    unit = " points" if metric.is_accuracy else ""
    if lead and lead.get("for_steps"):
        lead_note = (
            f"; picked for fewer steps ({lead['pick_steps']:.0f} against "
            f"{lead['runner_up_steps']:.0f}) within the seeds' noise of trial "
            f"{lead['runner_up']}, the best mean, ahead by {metric.fmt(-lead['mean'])} +/- "
            f"{metric.fmt(lead['std'])}{unit}"
        )
    elif lead:
        lead_note = (
            f"; its lead over trial {lead['runner_up']} on those seeds "
            f"{metric.fmt(lead['mean'])} +/- {metric.fmt(lead['std'])}{unit}, "
            + ("clear" if lead.get("clear") else "within the seeds' noise")
        )
    else:
        lead_note = ""
    return (
        f"; picked on {len(seeded.get('seeds') or ())} fresh seeds among {among} (val "
        f"{metric.fmt(mean or 0)} +/- {metric.show(std or 0)}, seed runs "
        f"{float(seeded.get('compute_epochs') or 0):.0f} trial-epochs; the search's "
        f"single-run best was trial {seeded.get('search_pick')}{lead_note})"
    )


def _tune(
    args: argparse.Namespace,
    space: ScheduleSpace,
    max_steps: int,
    small_steps: int,
    metric: Metric,
) -> tuple[Schedule, dict[str, Any]]:
    """One tuning study under ``max_steps``: its seed-robust best schedule and what it cost."""
    spec = study_spec(
        args.task,
        args.epochs,
        args.batch_max,
        max_steps,
        args.trials,
        args.study_seed,
        args.grace,
        args.concurrent,
        args.gpus_per_worker,
        args.metric,
        args.task_options,
        args.lr_multiplier,
    )
    goal = (
        "val accuracy"
        if metric.is_accuracy
        else f"{metric.name} ({'minimised' if metric.direction == 'min' else 'maximised'})"
    )
    budget = (
        f"{args.trials} trials (TPE, {spec.budget.startup_trials} random start-up, ASHA "
        f"grace {args.grace} epochs, reduction 3, cooldown probes "
        f"{'on' if spec.budget.cooldown_probes else 'off'}, prefix reuse "
        f"{spec.budget.prefix_reuse:g}), {args.concurrent} at once, 1 worker "
        f"each{f' ({args.gpus_per_worker:g} GPU)' if args.gpus_per_worker else ''}, "
        f"{args.epochs} epochs, objective: {goal} with max_steps {max_steps} "
        f"({max_steps / small_steps:.2g} x small batch's {small_steps}), batch "
        f"{space.base_batch_size}-{space.largest_batch}"
    )
    print(f"tuning budget: {budget}", flush=True)
    with tempfile.TemporaryDirectory(prefix="stagetune-bench-") as tmp:
        run = run_tuning_study(spec, Path(tmp))
    trial_epochs = sum(int(t["epochs_done"]) for t in run.trials)
    compute = float(run.summary.get("compute_epochs") or trial_epochs)
    seeded = run.summary.get("seed_runs") or {}
    seed_note = _seed_note(seeded, metric)
    print(
        f"tuning done in {run.wall_time_s:.0f} s, {trial_epochs} trial-epochs trained by the "
        f"trials, {compute:.0f} in all (probes, seed runs); best trial {run.best_number}"
        f"{seed_note}",
        flush=True,
    )
    if run.best_yaml is None:
        raise SystemExit(f"the study under max_steps {max_steps} found no feasible schedule")
    tuned = Schedule.from_yaml(run.best_yaml)
    best = next(t for t in run.trials if t["number"] == run.best_number)
    best_value = best.get("metric_value")
    if best_value is None and metric.is_accuracy:
        best_value = best["val_accuracy"]
    tuning = {
        "source": f"study run here: {budget}; took {run.wall_time_s:.0f} s wall, "
        f"{trial_epochs} trial-epochs by the trials, {compute:.0f} in all (cooldown probes, "
        f"seed runs); best trial {run.best_number} (val "
        f"{metric.show(best_value or 0)} on the study seed){seed_note}",
        "budget": budget,
        "wall_time_s": run.wall_time_s,
        "trial_epochs": trial_epochs,
        "compute_epochs": compute,
        "seed_runs": seeded or None,
        "best_number": run.best_number,
        "best_val_accuracy": best["val_accuracy"],
        "best_metric_value": best_value,
        "yaml": run.best_yaml,
        "trials": list(run.trials),
    }
    return tuned, tuning


def summary_line(
    task: str, metric: Metric, rows: Mapping[str, dict[str, Any]], targets: Mapping[str, Any]
) -> str:
    """The last line the bench prints: an accuracy study's keys as they always were
    (``tuned_acc=`` etc.), another metric's named after it, values in its units."""
    small = rows["small_batch"]
    t = rows["tuned"]
    others = [r for k, r in rows.items() if k != "small_batch" and not _is_tuned(k)]
    best_other = metric.best(others)
    front = targets["every_recipe_dominated"]
    at_small = targets[f"small_{metric.short}_at_5x_fewer_steps"]["ratio"]
    ratio = "none" if at_small is None else f"{at_small:.2f}"
    steps = (
        f"tuned_steps={t['steps']} small_steps={small['steps']} "
        f"steps_ratio={small['steps'] / max(1, t['steps']):.2f}"
    )
    gap = metric.fmt_scaled(_gap(dict(rows), metric))
    if metric.is_accuracy:
        return (
            f"quality task={task} dominated={front['dominated']}/{front['recipes']} "
            f"steps_ratio_at_small_acc={ratio} "
            f"tuned_acc={metric.fmt(t['metric_mean'])} "
            f"small_acc={metric.fmt(small['metric_mean'])} "
            f"small_std={metric.fmt(small['metric_std'])} {steps} "
            f"best_baseline={best_other['schedule']} "
            f"best_baseline_acc={metric.fmt(best_other['metric_mean'])} "
            f"large_batch_gap={gap}"
        )
    return (
        f"quality task={task} metric={metric.name} "
        f"dominated={front['dominated']}/{front['recipes']} "
        f"steps_ratio_at_small={ratio} tuned={metric.fmt(t['metric_mean'])} "
        f"small={metric.fmt(small['metric_mean'])} small_std={metric.fmt(small['metric_std'])} "
        f"{steps} best_baseline={best_other['schedule']} "
        f"best_baseline_value={metric.fmt(best_other['metric_mean'])} large_batch_gap={gap}"
    )


def _stem(task: str, default_task: bool, smoke: bool, tag: str | None) -> str:
    """``schedule_quality[_<task>][_smoke][_<tag>]``: no task part for the default task
    (mnist1d, or digits in the smoke run), so its results keep their names."""
    stem = "schedule_quality" if default_task else f"schedule_quality_{task}"
    if smoke:
        stem += "_smoke"
    return f"{stem}_{tag}" if tag else stem


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", nargs="?", default=None, help="the task (default mnist1d)")
    parser.add_argument("--task", dest="task_option", default=None, help="the same as TASK")
    add_study_arguments(parser)
    parser.add_argument("--epochs", type=int, default=None, help="default: the task's (30)")
    parser.add_argument("--seeds", type=int, default=3, help="retraining seeds (fresh)")
    parser.add_argument("--seed-base", type=int, default=1000, help="first retraining seed")
    parser.add_argument(
        "--batch-max",
        type=int,
        default=None,
        help="largest batch of the space (default: 1024 for mnist1d, where Goyal's recipe "
        "then loses about 3-5 points to the small batch against 0.3 at 512; else 16x the "
        "task's base batch, e.g. 512 for tinylm)",
    )
    parser.add_argument("--trials", type=int, default=40, help="tuning budget (trials)")
    parser.add_argument("--grace", type=int, default=3, help="ASHA grace period (epochs)")
    parser.add_argument("--concurrent", type=int, default=2, help="trials / runs at once")
    parser.add_argument(
        "--gpus-per-worker",
        type=float,
        default=0.0,
        help="GPU share of each trial and retraining run (0: CPU; 0.25: four share a GPU)",
    )
    parser.add_argument("--steps-fraction", type=float, default=0.2)
    parser.add_argument("--study-seed", type=int, default=0)
    parser.add_argument("--tuned-yaml", type=Path, default=None)
    parser.add_argument(
        "--budgets",
        choices=("recipes", "single"),
        default="recipes",
        help="recipes: one more study under each recipe's own step count (the front); "
        "single: only the --steps-fraction study",
    )
    parser.add_argument(
        "--ratios",
        type=_ratios,
        default=[],
        help="with --budgets recipes, one more study under each k-th of the small batch's "
        "steps (e.g. 2,3,4: half, a third, a quarter), so the front has points at those "
        "savings too",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--tag", default=None, help="suffix of the result files' names")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="digits (or the task given, tiny options for tinylm), 2 epochs, 1 seed, 3 trials",
    )
    args = parser.parse_args(argv)
    if args.task and args.task_option and args.task != args.task_option:
        parser.error(f"two tasks given: {args.task} and --task {args.task_option}")
    if args.ratios and (args.budgets != "recipes" or args.tuned_yaml is not None):
        parser.error(
            "--ratios adds studies to the front: it needs --budgets recipes (the default) and "
            "no --tuned-yaml"
        )
    args.task = args.task or args.task_option or "mnist1d"
    default_task = args.task == "mnist1d"
    if args.smoke:
        if args.task == "mnist1d":
            args.task = "digits"
        args.task_options = {**SMOKE_TASK_OPTIONS.get(args.task, {}), **(args.task_options or {})}
        args.epochs = args.epochs or 2
        args.seeds, args.trials, args.grace = 1, 3, 1
        args.batch_max = 128
        args.steps_fraction = 0.6
    study_arguments(args)
    stem = _stem(args.task, default_task, args.smoke, args.tag)
    started = time.perf_counter()

    from workers.runner import resolve_spec
    from workers.tasks import get_task

    task = get_task(args.task)
    if args.epochs is None:
        args.epochs = task.default_epochs
    if args.batch_max is None:
        args.batch_max, batch_max_source = default_batch_max(
            args.task, task.default_base_batch_size
        )
    else:
        batch_max_source = "--smoke" if args.smoke else "--batch-max"
    # The space (base batch / LR / optimizer from the task) fixes every baseline.
    probe = study_spec(
        args.task,
        args.epochs,
        args.batch_max,
        10**9,
        2,
        0,
        1,
        1,
        metric=args.metric,
        task_options=args.task_options,
        lr_multiplier=args.lr_multiplier,
    )
    metric = Metric(*probe.objective_metric())
    resolved, train_size = resolve_spec(probe)
    space = ScheduleSpace.from_spec(resolved)
    source = "--metric" if args.metric else "the task's primary metric"
    print(
        f"task {args.task}: study metric {metric.name} ({metric.direction}, {source}), batch "
        f"{space.base_batch_size}-{space.largest_batch} ({batch_max_source}), {args.epochs} "
        f"epochs, {train_size:,} training samples, LR multipliers {space.lr_mult_min:g}-"
        f"{space.lr_mult_max:g} ({'given' if args.lr_multiplier else 'the space default'})"
        + (f", task options {json.dumps(args.task_options)}" if args.task_options else ""),
        flush=True,
    )
    schedules: dict[str, Schedule] = {
        "small_batch": small_batch(space),
        "large_linear": large_batch(space),
        "large_sqrt": large_sqrt(space),
        "increase_batch": increase_batch(space),
        "linear_ramp": linear_ramp(space),
    }
    small_steps = schedules["small_batch"].total_steps(train_size)
    max_steps = max(1, int(small_steps * args.steps_fraction))
    ensure_ray()

    tuning: dict[str, Any]
    if args.tuned_yaml is not None:
        tuned = Schedule.load(args.tuned_yaml)
        tuning = {"source": f"--tuned-yaml {args.tuned_yaml}", "budget": None}
    else:
        tuned, tuning = _tune(args, space, max_steps, small_steps, metric)
    if tuned.total_epochs != args.epochs:
        raise SystemExit(f"the tuned schedule has {tuned.total_epochs} epochs, not {args.epochs}")
    schedules["tuned"] = tuned
    # The front a user sees: one more study per step budget of a recipe (each recipe's own
    # steps), so that every recipe meets a tuned schedule at no more steps than its own.
    caps: list[int] = []
    if args.budgets == "recipes" and args.tuned_yaml is None:
        caps = front_caps(
            [sch.total_steps(train_size) for sch in schedules.values()],
            small_steps,
            max_steps,
            args.ratios,
        )
    if args.smoke:
        caps = caps[:1]  # the path, not the front: one extra study (the cheapest recipe's)
    extra_tuning: dict[str, Any] = {}
    for cap in caps:
        label = f"tuned@{cap}"
        DESCRIPTIONS[label] = f"found by stagetune under max_steps {cap}, fresh seeds"
        schedules[label], extra_tuning[label] = _tune(args, space, cap, small_steps, metric)
    seeds = [args.seed_base + i for i in range(args.seeds)]
    jobs = [
        Job(label, schedule, args.task, seed, args.task_options)
        for seed in seeds
        for label, schedule in schedules.items()
    ]
    # Longest first so the two gangs finish together.
    jobs.sort(key=lambda j: -j.schedule.total_steps(train_size))

    def done(r: RunResult) -> None:
        print(
            f"  {r.label:<15} seed {r.seed}: test {metric.show(r.test_metrics[metric.test_key])} "
            f"({r.steps} steps, {r.wall_time_s:.0f} s)",
            flush=True,
        )

    print(f"retraining {len(jobs)} runs on seeds {seeds}", flush=True)
    results = retrain_many(
        jobs, parallel=args.concurrent, on_done=done, gpus_per_worker=args.gpus_per_worker
    )
    by_label: dict[str, dict[str, Any]] = {}
    for label, schedule in schedules.items():
        row = _row(label, [r for r in results if r.label == label], metric)
        row["summary"] = schedule.summary()
        row["schedule_yaml"] = schedule.to_yaml()
        by_label[label] = row
    rows = list(by_label.values())
    targets = _targets(by_label, 5.0, metric)
    data: dict[str, Any] = {
        "config": {
            "task": args.task,
            "epochs": args.epochs,
            "seeds": seeds,
            "train_size": train_size,
            "batch_range": [space.base_batch_size, space.largest_batch],
            "lr_multiplier_range": [space.lr_mult_min, space.lr_mult_max],
            "base_lr": space.base_lr,
            "gpus_per_worker": args.gpus_per_worker,
            "smoke": args.smoke,
            "metric": {
                "name": metric.name,
                "direction": metric.direction,
                "test_key": metric.test_key,
                "source": source,
            },
            "declared_metrics": dict(task.metrics),
            "batch_max_source": batch_max_source,
            "task_options": args.task_options,
            "budgets": args.budgets,
            "ratios": args.ratios,
        },
        "tuning": tuning,
        "tuning_at_recipe_steps": {k: _brief(v) for k, v in extra_tuning.items()},
        "rows": rows,
        "targets": targets,
        "machine": machine_info(),
        "total_wall_time_s": time.perf_counter() - started,
    }
    data["summary_line"] = summary_line(args.task, metric, by_label, targets)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    _plot(
        rows,
        f"{args.task}, {args.epochs} epochs: test {metric.words} vs optimizer steps",
        args.results_dir / f"{stem}.png",
        metric,
    )
    return publish(args.results_dir, stem, data, _markdown)


if __name__ == "__main__":
    main()
