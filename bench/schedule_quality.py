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

The study optimises validation accuracy under ``max_steps`` = ``--steps-fraction`` (1/5) of
the small batch's steps: the target is small-batch accuracy at >= 5x fewer optimizer steps.

Writes ``schedule_quality[_smoke].{json,md,png}`` to ``--results-dir`` (default
``bench/results``) and ends with one line::

    quality task=.. dominated=K/N steps_ratio_at_small_acc=.. tuned_acc=.. small_acc=..
    small_std=.. tuned_steps=.. small_steps=.. steps_ratio=.. best_baseline=..
    best_baseline_acc=.. large_batch_gap=..

(accuracies in percent on the test split, means over the seeds; ``best_baseline`` is the most
accurate recipe other than ``small_batch``; ``large_batch_gap`` is the small batch's accuracy
minus Goyal's large batch's, in points: the penalty a schedule can win back). With
``--budgets recipes`` (the default) one more study runs under each recipe's own step count
(``tuned@<steps>``), so the result is a front of tuned schedules: ``dominated`` counts the
recipes for which some tuned schedule has at least their test accuracy (within one std of
their mean) at no more steps, and
``steps_ratio_at_small_acc`` is the small batch's steps over those of the cheapest tuned
schedule within the small batch's spread (``none``: no such schedule). ``tuned_*`` is the
``--steps-fraction`` study's.

    .venv/bin/python bench/schedule_quality.py       # mnist1d, 30 epochs, batch 32-1024, 3 seeds
    .venv/bin/python bench/schedule_quality.py --tuned-yaml best.yaml
    .venv/bin/python bench/schedule_quality.py --smoke --results-dir /tmp/q
"""

from __future__ import annotations

import argparse
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
    RESULTS_DIR,
    Job,
    RunResult,
    ensure_ray,
    machine_info,
    markdown_table,
    mean_std,
    publish,
    retrain_many,
    run_tuning_study,
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
) -> StudySpec:
    """The tuning study: accuracy under a step budget; the baselines are trained here, so the
    study runs none."""
    return StudySpec.from_dict(
        {
            "task": task,
            "name": f"bench-quality-{task}",
            "seed": seed,
            "schedule": {"total_epochs": epochs, "scaling_rule": "linear"},
            "space": {
                "stages": {"min": 1, "max": 4},
                "min_stage_fraction": 0.1,
                "batch_size": {"max": batch_max},
                "lr_multiplier": {"min": 0.25, "max": 4.0},
                "warmup_epochs": {"min": 0.0, "max": 1.0},
                "decay": ["constant", "cosine"],
            },
            "objective": {"kind": "accuracy", "max_steps": max_steps},
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


def _row(label: str, runs: list[RunResult]) -> dict[str, Any]:
    acc_mean, acc_std = mean_std([r.test_accuracy for r in runs])
    val_mean, _ = mean_std([r.val_accuracy for r in runs])
    return {
        "schedule": label,
        "description": DESCRIPTIONS[label],
        "test_acc_mean": acc_mean,
        "test_acc_std": acc_std,
        "test_acc_min": min(r.test_accuracy for r in runs),
        "test_acc_max": max(r.test_accuracy for r in runs),
        "val_acc_mean": val_mean,
        "steps": runs[0].steps,
        "mean_batch_size": runs[0].mean_batch_size,
        "samples_per_s": mean_std([r.samples_per_s for r in runs])[0],
        "train_time_s": mean_std([r.train_time_s for r in runs])[0],
        "wall_time_s": mean_std([r.wall_time_s for r in runs])[0],
        "diverged_runs": sum(r.diverged for r in runs),
        "seeds": [r.seed for r in runs],
        "test_acc_per_seed": [r.test_accuracy for r in runs],
    }


def _plot(rows: list[dict[str, Any]], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for row in rows:
        tuned = _is_tuned(row["schedule"])
        ax.errorbar(
            row["steps"],
            100 * row["test_acc_mean"],
            yerr=100 * row["test_acc_std"],
            fmt="*" if tuned else "o",
            markersize=14 if tuned else 7,
            capsize=4,
            color=("black" if row["schedule"] == "tuned" else "dimgray") if tuned else None,
            label=f"{row['schedule']} ({100 * row['test_acc_mean']:.2f}%)",
        )
    ax.set_xscale("log")
    ax.set_xlabel("optimizer steps (log)")
    ax.set_ylabel("test accuracy, % (mean +/- std over seeds)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
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


def _markdown(data: dict[str, Any]) -> str:
    cfg = data["config"]
    rows = [
        [
            f"**{r['schedule']}**" if _is_tuned(r["schedule"]) else r["schedule"],
            r["summary"],
            f"{100 * r['test_acc_mean']:.2f} +/- {100 * r['test_acc_std']:.2f}",
            f"{r['steps']:,}",
            f"{r['mean_batch_size']:.0f}",
            f"{r['samples_per_s']:,.0f}",
            f"{r['train_time_s']:.1f}",
            f"{r['wall_time_s']:.1f}",
        ]
        for r in data["rows"]
    ]
    out = [
        f"# Schedule quality: {cfg['task']}, {cfg['epochs']} epochs, seeds {cfg['seeds']}\n",
        "Test accuracy (held-out split, never seen by tuning), mean +/- sample std over the "
        "seeds; steps and mean batch per run; samples/s and times are per run (1 worker, "
        f"{_where(data)}), means over the seeds.\n",
        markdown_table(
            [
                "schedule",
                "stages",
                "test acc %",
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
    out.append(f"\nTuned schedule: {tuning['source']}.\n")
    for label, extra in (data.get("tuning_at_recipe_steps") or {}).items():
        out.append(f"\n{label}: {extra['source']}.\n")
    targets = data["targets"]
    out.append("\nTargets:\n")
    by = {r["schedule"]: r for r in data["rows"]}
    if "small_batch" in by and "large_linear" in by:
        out.append(
            f"\nLarge-batch gap of the task: {_gap(by):.2f} points (small batch minus Goyal's "
            f"large batch at {cfg['batch_range'][1]:,}, test accuracy).\n"
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


def _dominance(rows: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Which recipes some tuned schedule dominates: at least the recipe's test accuracy
    (within one std of the recipe's mean) at no more steps; and the largest step saving
    of a tuned schedule with small-batch accuracy (within its spread)."""
    tuned = [r for k, r in rows.items() if _is_tuned(k)]
    recipes = [r for k, r in rows.items() if not _is_tuned(k)]
    by: dict[str, str | None] = {}
    for recipe in recipes:
        floor = recipe["test_acc_mean"] - recipe["test_acc_std"]
        hits = [t for t in tuned if t["steps"] <= recipe["steps"] and t["test_acc_mean"] >= floor]
        best = max(hits, key=lambda t: t["test_acc_mean"]) if hits else None
        by[recipe["schedule"]] = None if best is None else best["schedule"]
    small = rows["small_batch"]
    floor = small["test_acc_mean"] - small["test_acc_std"]
    ratios = [small["steps"] / t["steps"] for t in tuned if t["test_acc_mean"] >= floor]
    return {"by": by, "ratio_at_small_acc": max(ratios) if ratios else None}


def _gap(rows: dict[str, dict[str, Any]]) -> float:
    """The task's large-batch penalty in points: the small batch's mean test accuracy minus
    Goyal's linear-scaling large batch's (what a search over this batch range can win back)."""
    return 100 * float(rows["small_batch"]["test_acc_mean"] - rows["large_linear"]["test_acc_mean"])


def _targets(rows: dict[str, dict[str, Any]], ratio_goal: float) -> dict[str, Any]:
    if "tuned" not in rows:
        return {}
    tuned, small = rows["tuned"], rows["small_batch"]
    within = tuned["test_acc_mean"] >= small["test_acc_mean"] - small["test_acc_std"]
    ratio = small["steps"] / tuned["steps"] if tuned["steps"] else math.inf
    dom = _dominance(rows)
    dominated = [k for k, v in dom["by"].items() if v is not None]
    at_small = dom["ratio_at_small_acc"]
    others = [r for k, r in rows.items() if k != "small_batch" and not _is_tuned(k)]
    beaten = [r["schedule"] for r in others if tuned["test_acc_mean"] > r["test_acc_mean"]]
    cheaper = [r["schedule"] for r in others if r["steps"] < tuned["steps"]]
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
        f"small_acc_at_{ratio_goal:g}x_fewer_steps": {
            "met": at_small is not None and at_small >= ratio_goal,
            "ratio": at_small,
            "detail": "no tuned schedule reaches the small batch's accuracy within its spread"
            if at_small is None
            else f"best tuned schedule within the small batch's spread: {at_small:.2f}x "
            "fewer steps",
        },
        "within_small_batch_spread": {
            "met": within,
            "detail": f"tuned {100 * tuned['test_acc_mean']:.2f}% vs small "
            f"{100 * small['test_acc_mean']:.2f} +/- {100 * small['test_acc_std']:.2f}%",
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


def _tune(
    args: argparse.Namespace, space: ScheduleSpace, max_steps: int, small_steps: int
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
    )
    budget = (
        f"{args.trials} trials (TPE, {spec.budget.startup_trials} random start-up, ASHA "
        f"grace {args.grace} epochs, reduction 3, cooldown probes "
        f"{'on' if spec.budget.cooldown_probes else 'off'}, prefix reuse "
        f"{spec.budget.prefix_reuse:g}), {args.concurrent} at once, 1 worker "
        f"each{f' ({args.gpus_per_worker:g} GPU)' if args.gpus_per_worker else ''}, "
        f"{args.epochs} epochs, objective: val accuracy with max_steps {max_steps} "
        f"({max_steps / small_steps:.2g} x small batch's {small_steps}), batch "
        f"{space.base_batch_size}-{space.largest_batch}"
    )
    print(f"tuning budget: {budget}", flush=True)
    with tempfile.TemporaryDirectory(prefix="stagetune-bench-") as tmp:
        run = run_tuning_study(spec, Path(tmp))
    trial_epochs = sum(int(t["epochs_done"]) for t in run.trials)
    compute = float(run.summary.get("compute_epochs") or trial_epochs)
    seeded = run.summary.get("seed_runs") or {}
    picked = run.summary.get("best") or {}
    seed_note = ""
    if seeded:
        stats = picked.get("seeds") or {}
        rows = seeded.get("finalists") or ()
        reserves = sum(1 for f in rows if f.get("reserve"))
        among = f"{len(rows) - reserves} finalists" + (
            f" and {reserves} reserve(s) (the finalists' pick was unstable)" if reserves else ""
        )
        seed_note = (
            f"; picked on {len(seeded.get('seeds') or ())} fresh seeds among {among} (val "
            f"{100 * (stats.get('val_accuracy_mean') or 0):.2f} +/- "
            f"{100 * (stats.get('val_accuracy_std') or 0):.2f}%, seed runs "
            f"{float(seeded.get('compute_epochs') or 0):.0f} trial-epochs; the search's "
            f"single-run best was trial {seeded.get('search_pick')})"
        )
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
    tuning = {
        "source": f"study run here: {budget}; took {run.wall_time_s:.0f} s wall, "
        f"{trial_epochs} trial-epochs by the trials, {compute:.0f} in all (cooldown probes, "
        f"seed runs); best trial {run.best_number} (val "
        f"{100 * (best['val_accuracy'] or 0):.2f}% on the study seed){seed_note}",
        "budget": budget,
        "wall_time_s": run.wall_time_s,
        "trial_epochs": trial_epochs,
        "compute_epochs": compute,
        "seed_runs": seeded or None,
        "best_number": run.best_number,
        "best_val_accuracy": best["val_accuracy"],
        "yaml": run.best_yaml,
        "trials": list(run.trials),
    }
    return tuned, tuning


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", nargs="?", default="mnist1d")
    parser.add_argument("--epochs", type=int, default=None, help="default: the task's (30)")
    parser.add_argument("--seeds", type=int, default=3, help="retraining seeds (fresh)")
    parser.add_argument("--seed-base", type=int, default=1000, help="first retraining seed")
    parser.add_argument(
        "--batch-max",
        type=int,
        default=1024,
        help="largest batch of the space (1024: on mnist1d Goyal's recipe then loses about 6 "
        "points to the small batch, against 0.3 at 512)",
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
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--smoke", action="store_true", help="digits, 2 epochs, 1 seed, 3 trials")
    args = parser.parse_args(argv)
    if args.smoke:
        if args.task == "mnist1d":
            args.task = "digits"
        args.epochs = args.epochs or 2
        args.seeds, args.trials, args.grace = 1, 3, 1
        args.batch_max = 128
        args.steps_fraction = 0.6
    stem = "schedule_quality_smoke" if args.smoke else "schedule_quality"
    started = time.perf_counter()

    from workers.runner import resolve_spec
    from workers.tasks import get_task

    if args.epochs is None:
        args.epochs = get_task(args.task).default_epochs
    # The space (base batch / LR / optimizer from the task) fixes every baseline.
    probe = study_spec(args.task, args.epochs, args.batch_max, 10**9, 2, 0, 1, 1)
    resolved, train_size = resolve_spec(probe)
    space = ScheduleSpace.from_spec(resolved)
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
        tuned, tuning = _tune(args, space, max_steps, small_steps)
    if tuned.total_epochs != args.epochs:
        raise SystemExit(f"the tuned schedule has {tuned.total_epochs} epochs, not {args.epochs}")
    schedules["tuned"] = tuned
    # The front a user sees: one more study per step budget of a recipe (each recipe's own
    # steps), so that every recipe meets a tuned schedule at no more steps than its own.
    caps: list[int] = []
    if args.budgets == "recipes" and args.tuned_yaml is None:
        caps = sorted({sch.total_steps(train_size) for sch in schedules.values()} - {max_steps})
    if args.smoke:
        caps = caps[:1]  # the path, not the front: one extra study (the cheapest recipe's)
    extra_tuning: dict[str, Any] = {}
    for cap in caps:
        label = f"tuned@{cap}"
        DESCRIPTIONS[label] = f"found by stagetune under max_steps {cap}, fresh seeds"
        schedules[label], extra_tuning[label] = _tune(args, space, cap, small_steps)
    seeds = [args.seed_base + i for i in range(args.seeds)]
    jobs = [
        Job(label, schedule, args.task, seed)
        for seed in seeds
        for label, schedule in schedules.items()
    ]
    # Longest first so the two gangs finish together.
    jobs.sort(key=lambda j: -j.schedule.total_steps(train_size))

    def done(r: RunResult) -> None:
        print(
            f"  {r.label:<15} seed {r.seed}: test {100 * r.test_accuracy:.2f}% "
            f"({r.steps} steps, {r.wall_time_s:.0f} s)",
            flush=True,
        )

    print(f"retraining {len(jobs)} runs on seeds {seeds}", flush=True)
    results = retrain_many(
        jobs, parallel=args.concurrent, on_done=done, gpus_per_worker=args.gpus_per_worker
    )
    by_label: dict[str, dict[str, Any]] = {}
    for label, schedule in schedules.items():
        row = _row(label, [r for r in results if r.label == label])
        row["summary"] = schedule.summary()
        row["schedule_yaml"] = schedule.to_yaml()
        by_label[label] = row
    rows = list(by_label.values())
    targets = _targets(by_label, 5.0)
    data: dict[str, Any] = {
        "config": {
            "task": args.task,
            "epochs": args.epochs,
            "seeds": seeds,
            "train_size": train_size,
            "batch_range": [space.base_batch_size, space.largest_batch],
            "base_lr": space.base_lr,
            "gpus_per_worker": args.gpus_per_worker,
            "smoke": args.smoke,
        },
        "tuning": tuning,
        "tuning_at_recipe_steps": {k: _brief(v) for k, v in extra_tuning.items()},
        "rows": rows,
        "targets": targets,
        "machine": machine_info(),
        "total_wall_time_s": time.perf_counter() - started,
    }
    small = by_label["small_batch"]
    t = by_label["tuned"]
    others = [r for k, r in by_label.items() if k not in ("small_batch",) and not _is_tuned(k)]
    best_other = max(others, key=lambda r: r["test_acc_mean"])
    front = targets["every_recipe_dominated"]
    at_small = targets["small_acc_at_5x_fewer_steps"]["ratio"]
    line = (
        f"quality task={args.task} dominated={front['dominated']}/{front['recipes']} "
        f"steps_ratio_at_small_acc={'none' if at_small is None else f'{at_small:.2f}'} "
        f"tuned_acc={100 * t['test_acc_mean']:.2f} "
        f"small_acc={100 * small['test_acc_mean']:.2f} "
        f"small_std={100 * small['test_acc_std']:.2f} tuned_steps={t['steps']} "
        f"small_steps={small['steps']} steps_ratio={small['steps'] / max(1, t['steps']):.2f} "
        f"best_baseline={best_other['schedule']} "
        f"best_baseline_acc={100 * best_other['test_acc_mean']:.2f} "
        f"large_batch_gap={_gap(by_label):.2f}"
    )
    data["summary_line"] = line
    args.results_dir.mkdir(parents=True, exist_ok=True)
    _plot(
        rows,
        f"{args.task}, {args.epochs} epochs: test accuracy vs optimizer steps",
        args.results_dir / f"{stem}.png",
    )
    return publish(args.results_dir, stem, data, _markdown)


if __name__ == "__main__":
    main()
