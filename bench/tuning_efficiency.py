"""Tuning efficiency: best schedule found against compute spent, stagetune's search vs random.

Runs the same study (task, epochs, search space, objective) several times through the
service's code path (``workers.runner.run_study``: engine, Ray Tune, Optuna, store), once per
method and seed:

* ``default``: stagetune's default search: the recipe candidates first (a constant batch and
  Smith's increasing batch fitted to the step cap, ``budget.recipe_candidates: true``), then
  Optuna TPE with ASHA early stopping that ranks trials at its rungs by cooldown probes
  (``budget.cooldown_probes: true``), and prefix reuse (``budget.prefix_reuse: 0.5``): half
  the trials after the startup ones keep the first stages of one of the best trials so far,
  and fork from its stage-boundary state. The other methods run without the recipes;
* ``stagewise``: the stage-wise search (``budget.search: stagewise``, its default 6
  candidates per round and 2 prefixes kept): synchronous rounds, one per stage, each
  candidate trained to its stage's end and scored by a cooldown probe there; the best
  prefixes are forked with TPE's candidates for the next stage;
* ``tpe_asha_probes``: the default without prefix reuse (``budget.prefix_reuse: 0``);
* ``tpe_asha``: neither, ASHA on mid-run accuracy (the search before probes and prefixes;
  ``budget.cooldown_probes: false``, no stage-boundary states);
* ``random``: Optuna's RandomSampler without early stopping (``budget.sampler: random``,
  ``budget.early_stopping: false``): every drawn schedule trains all its epochs unless it
  diverges (a non-finite loss, or the divergence rule: ``budget.divergence_factor``, on in
  every method);
* ``pbt``: Ray Tune's Population Based Training (``budget.search: pbt``), a population of
  ``--pbt-population`` (default 2/3 of the random search's trials, so that its whole run fits
  the budget) perturbed at ``space.stages.max`` cuts of the run; its trials all finish at the
  end, so it reaches the threshold, if at all, when it ends.

No engine hook is needed: the switches are fields of the study spec. The studies run no
baselines and no seed runs (``budget.seed_runs: 0``: they follow the whole search, so they
cannot change when it first found a schedule; this measures the search). Compute is
counted in **trial-epochs** (epochs trained by all trials plus the epochs of their cooldown
probes, less the epochs a fork did not train again; a schedule rejected by the objective's
constraint before training costs 0), in the order trials finish. A trial's accuracy counts as a
"schedule found" only when it trained every epoch (a trial stopped by ASHA has no final
accuracy). The fixed compute budget is ``--random-trials x epochs`` trial-epochs (12 full
runs); the curves are cut there. Random search and the TPE searches get it as their
``budget.trial_epochs`` (with ``--tpe-trials``, 72, only a cap on their count), so the compute
that early stopping, forks and diverged runs stopped early save buys more trials (runs before
2026-11-26 gave random search a count of 12 trials instead).

The studies optimise the task's primary metric (``--metric`` another one it declares):
validation accuracy on mnist1d, validation loss on tinylm, PSNR on denoise. The *best schedule
known* is the best full run by that metric over all studies of this run; for each study the
script reports the trial-epochs spent until its best-so-far came within ``--tolerance`` of it
(0.2 point of accuracy, 0.05 nats of loss, 0.2 dB of PSNR by default). Target: the default
search needs at most half of random search's compute.

Writes ``tuning_efficiency[_<task>][_smoke][_<tag>].{json,md,png}`` to ``--results-dir``
(default ``bench/results``; no task part for mnist1d) and ends with one line::

    efficiency task=.. [metric=..] default=tpe+probes+prefixes ratio_vs_random=..
        ratio_vs_tpe_asha=.. ratio_vs_pbt=..  (one line; metric= unless it is accuracy)

(ratios of the means over the seeds of the trial-epochs to come within the tolerance; a study
that never does counts the whole budget, and the JSON flags it).

    .venv/bin/python bench/tuning_efficiency.py            # mnist1d, 3 seeds per method
    .venv/bin/python bench/tuning_efficiency.py --task tinylm   # val loss, 10-epoch trials
    .venv/bin/python bench/tuning_efficiency.py --smoke --results-dir /tmp/e
    # the methods the ratios need, without the stage-wise and probes-only searches:
    .venv/bin/python bench/tuning_efficiency.py --task tinylm \
        --methods default,random,tpe_asha,pbt
    # only the default again, the other methods' studies from an earlier run (same config):
    .venv/bin/python bench/tuning_efficiency.py --methods default \
        --reuse bench/results/tuning_efficiency.json
    # two more seeds of an earlier run (seeds 0-2 of every method taken from it):
    .venv/bin/python bench/tuning_efficiency.py --seeds 5 --first-seed 3 \
        --methods default,random,tpe_asha,pbt --reuse bench/results/tuning_efficiency.json
    # an earlier run's studies aggregated again by this script (nothing trained):
    .venv/bin/python bench/tuning_efficiency.py --rescore bench/results/tuning_efficiency.json
    # ... and each seed's two best schedules retrained on every seed (``cross_seed``, ``paired``):
    .venv/bin/python bench/tuning_efficiency.py --rescore bench/results/tuning_efficiency.json \
        --cross-seed

Besides the threshold of the target, the results give each method's trial-epochs to reach a
few more levels (``LEVELS``: the best known less 5, 2.5 and 1.5 tolerances, i.e. 1, 0.5 and
0.3 point of accuracy), so that a new best schedule moving the threshold does not hide how
fast each search gets close. They also give the same measure against each **seed's own** best
schedule known (``per_seed`` in the JSON): every trial of a study trains on the study seed and
the studies of one seed share it, so on a task whose seed-to-seed spread exceeds the
tolerance (tinylm: 0.08-0.105 nats, a schedule's std over five seeds, against 0.05) a seed
that is lucky for every schedule sets a best known that the other seeds' studies cannot
reach. The summary line keeps the global measure. ``--cross-seed`` (on by default in a full
run of two seeds or more; ``--no-cross-seed`` skips it) measures that spread: each
seed's best schedules (``--cross-seed-picks``, 2 by default: its best full runs of distinct
schedules, whichever search found them; a schedule several seeds found trains once)
retrained on every seed, and the mean over those schedules of their standard deviation over
the seeds, against the tolerance. It also
gives the **paired** measure (``paired``): the schedule with the best mean over the seeds is
the best known, and a study of seed k must come within the tolerance of that schedule's value
on seed k, so a seed's luck is on both sides of the comparison.
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
    add_study_arguments,
    default_batch_max,
    ensure_ray,
    machine_info,
    markdown_table,
    mean_std,
    retrain_many,
    run_tuning_study,
    study_arguments,
    study_base,
    write_json,
)

from tuner.spec import StudySpec  # noqa: E402

METHODS = ("default", "stagewise", "tpe_asha_probes", "tpe_asha", "random", "pbt")
# The methods the summary line's ratios compare: a run (or --reuse) must have all of them.
RATIO_METHODS = ("default", "random", "tpe_asha", "pbt")
DEFAULT = "default"
#: What the summary line calls the default search.
DEFAULT_NAME = "tpe+probes+prefixes+recipes"
COLORS = {
    "default": "tab:green",
    "stagewise": "tab:cyan",
    "tpe_asha_probes": "tab:olive",
    "tpe_asha": "tab:red",
    "random": "tab:blue",
    "pbt": "tab:purple",
}


def study_spec(
    method: str,
    task: str,
    epochs: int,
    batch_max: int,
    max_steps: int | None,
    trials: int,
    seed: int,
    grace: int,
    concurrent: int,
    trial_epochs: int | None = None,
    metric: str | None = None,
    task_options: Mapping[str, Any] | None = None,
    lr_multiplier: tuple[float, float] | None = LEGACY_LR_MULTIPLIER,
) -> StudySpec:
    """One method's study; ``metric`` (else the task's primary one) is its objective,
    ``lr_multiplier`` the space's range given explicitly (None: the space's default)."""
    tpe = method not in ("random", "pbt")
    base = study_base(
        task,
        f"bench-efficiency-{method}-{seed}",
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
                # Every search but PBT stops on compute (budget.trial_epochs), not on a trial
                # count: what ASHA, forks and the divergence rule save goes into more trials.
                "trial_epochs": trial_epochs if method != "pbt" else None,
                "max_concurrent": concurrent,
                "grace_period_epochs": grace,
                "reduction_factor": 3,
                "early_stopping": tpe,
                "cooldown_probes": method in ("default", "stagewise", "tpe_asha_probes"),
                "prefix_reuse": 0.5 if method == "default" else 0.0,
                # The recipes fitted to the budget start the default search only: the other
                # methods are the searches as they were before it (and as committed runs
                # measured them, see --reuse).
                "recipe_candidates": method == "default",
                "prefix_store_mb": 0 if method == "tpe_asha" else 2048,
                "sampler": "tpe" if tpe else "random",
                "search": method if method in ("pbt", "stagewise") else "optuna",
                "startup_trials": min(5, max(1, trials // 4)),
                # The seed runs come after the search and re-rank its finalists; they do not
                # change when a search first found a schedule within the tolerance (they are
                # counted by bench/schedule_quality.py, whose tuned schedule uses them).
                "seed_runs": 0,
            },
            "resources": {"workers": 1, "cpus_per_worker": 1},
            "baselines": False,
        }
    )


#: Further levels reported, in tolerances below the best known (the target's is 1).
LEVELS = (5.0, 2.5, 1.5)


def study_config(args: argparse.Namespace, max_steps: int | None, budget: int) -> dict[str, Any]:
    """The configuration of this run's studies: what an earlier run must share for its
    studies to be reused (``--reuse``), and part of the results' ``config``."""
    return {
        "task": args.task,
        "task_options": args.task_options,
        "epochs": args.epochs,
        "random_trials": args.random_trials,
        "tpe_trials": args.tpe_trials,
        "pbt_population": args.pbt_population,
        "grace": args.grace,
        "concurrent": args.concurrent,
        "max_steps": max_steps,
        "budget_trial_epochs": budget,
        # Random search stops on compute like the TPE searches (runs before: 12 trials).
        "random_budget": "trial_epochs",
    }


#: What a ``--reuse`` file may differ in from this run (a variant run of some methods against
#: the others as an earlier run measured them): ASHA's grace period, which random search and
#: PBT do not use. The results name the reused studies' setting (``reused.differs``).
REUSE_MAY_DIFFER = ("grace",)


def reused_studies(
    args: argparse.Namespace, max_steps: int | None, budget: int
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The studies of ``args.reuse`` not run now (seeds below ``--seeds``): every seed of the
    methods left out, and the seeds below ``--first-seed`` of the methods run; and what was
    reused. Exits with a message if its configuration differs."""
    old = json.loads(args.reuse.read_text("utf-8"))
    cfg = old["config"]
    mine = study_config(args, max_steps, budget)
    first = getattr(args, "first_seed", 0)
    source = (old.get("reused") or {}).get("differs")
    if source and getattr(args, "rescore", None) is None:
        raise SystemExit(
            f"--reuse {args.reuse}: a variant run, whose reused studies ran with other "
            f"settings ({', '.join(f'{k}={v!r}' for k, v in source.items())}); reuse the file "
            f"they came from, {old['reused']['file']}"
        )
    # A variant run (a plain --reuse: not --rescore, not --first-seed, which would mix two
    # settings within one method) may differ in what REUSE_MAY_DIFFER names; the results say so.
    variant = not first and getattr(args, "rescore", None) is None
    differ = [k for k in mine if cfg.get(k) != mine[k] and not (variant and k in REUSE_MAY_DIFFER)]
    if differ:
        raise SystemExit(
            f"--reuse {args.reuse}: its configuration differs in {', '.join(differ)} "
            f"({', '.join(f'{k}={cfg.get(k)!r} here {mine[k]!r}' for k in differ)})"
        )
    methods = [m for m in METHODS if m not in args.methods]
    studies = [
        s
        for s in old["studies"]
        if int(s["seed"]) < args.seeds and (s["method"] in methods or int(s["seed"]) < first)
    ]
    if first:
        have = {(s["method"], int(s["seed"])) for s in studies}
        missing = [
            f"{m} seed {k}" for m in args.methods for k in range(first) if (m, k) not in have
        ]
        if missing:
            raise SystemExit(
                f"--first-seed {first}: {args.reuse} has no study of {', '.join(missing)}"
            )
    for s in studies:
        s.pop("epochs_to_reach", None)  # recomputed against this run's best known
    earlier = old.get("reused")  # where that run took some of its studies from
    if earlier and earlier.get("rescored"):  # a re-scored file: where its run took them from
        earlier = earlier.get("earlier")
    info = {
        "file": args.reuse.name,
        # the methods left out that the file has studies of
        "methods": [m for m in methods if any(s["method"] == m for s in studies)],
        # seeds of the methods run now that were taken from the file as well
        "seeds": list(range(first)),
        "machine": old.get("machine"),
        "best_known": old.get("best_known"),
        "total_wall_time_s": old.get("total_wall_time_s"),
        "earlier": earlier,
        # the settings the reused studies ran with where this run's differ (a variant run)
        "differs": {k: cfg.get(k) for k in REUSE_MAY_DIFFER if cfg.get(k) != mine[k]},
    }
    return studies, info


def full_run_value(t: Mapping[str, Any], epochs: int, metric: Metric) -> float | None:
    """A trial's value as a schedule found: its ``metric_value`` (an accuracy study's stored
    before that column: ``val_accuracy``) if it completed all ``epochs`` feasibly with a
    finite value, else None."""
    value = t.get("metric_value")
    if value is None and metric.is_accuracy:
        value = t.get("val_accuracy")
    full = t["status"] == "completed" and t["feasible"] and int(t["epochs_done"] or 0) >= epochs
    if full and isinstance(value, int | float) and math.isfinite(value):
        return float(value)
    return None


def curve(trials: Sequence[Mapping[str, Any]], epochs: int, metric: Metric) -> list[dict[str, Any]]:
    """Best-so-far full-run value of the study metric after each trial (in the order they
    finished), against cumulative trial-epochs (:func:`full_run_value`)."""
    spent = 0.0
    best: float | None = None
    points = []
    for t in trials:
        spent += float(t.get("compute_epochs") or t["epochs_done"] or 0)
        value = full_run_value(t, epochs, metric)
        if value is not None and (best is None or metric.better(value, best)):
            best = value
        points.append({"number": t["number"], "trial_epochs": spent, "best": best})
    return points


def epochs_to_reach(
    points: list[dict[str, Any]], threshold: float, budget: int, metric: Metric
) -> float | None:
    """Trial-epochs spent when the best-so-far first reached ``threshold`` (None: not within
    ``budget``)."""
    for p in points:
        if p["trial_epochs"] > budget:
            return None
        if p["best"] is not None and metric.reaches(p["best"], threshold):
            return round(float(p["trial_epochs"]), 1)
    return None


def best_value(studies: Sequence[Mapping[str, Any]], metric: Metric) -> float | None:
    """The best full-run value within budget over all studies."""
    out: float | None = None
    for s in studies:
        value = s["best_within_budget"]
        if value is not None and (out is None or metric.better(value, out)):
            out = value
    return out


def full_runs(
    study: Mapping[str, Any], epochs: int, metric: Metric, budget: float
) -> list[dict[str, Any]]:
    """The study's full runs (completed, feasible, every epoch) among the trials that finished
    within ``budget`` trial-epochs, in trial order, each with its value as ``_value``."""
    spent = {p["number"]: p["trial_epochs"] for p in study["curve"]}
    runs = []
    for t in study["trials"]:
        value = full_run_value(t, epochs, metric)
        if value is not None and spent.get(t["number"], math.inf) <= budget:
            runs.append({**t, "_value": value})
    return runs


def seed_bests(
    studies: Sequence[Mapping[str, Any]],
    epochs: int,
    metric: Metric,
    budget: float,
    method: str | None = None,
    per_seed: int = 1,
) -> list[tuple[int, Mapping[str, Any]]]:
    """Per seed (ascending), its ``per_seed`` best full runs of distinct schedules (best
    first) within ``budget`` over the studies of ``method`` (None: of every search), with
    ``_method`` set to the search that found each."""
    runs: dict[int, list[Mapping[str, Any]]] = {}
    for study in studies:
        if method is None or study["method"] == method:
            runs.setdefault(int(study["seed"]), []).extend(
                {**t, "_method": study["method"]} for t in full_runs(study, epochs, metric, budget)
            )
    sign = 1.0 if metric.direction == "min" else -1.0
    picks: list[tuple[int, Mapping[str, Any]]] = []
    for seed, found in sorted(runs.items()):
        seen: set[str] = set()
        for trial in sorted(found, key=lambda t: sign * float(t["_value"])):  # best first
            key = schedule_key(trial)
            if key not in seen and len(seen) < per_seed:
                seen.add(key)
                picks.append((seed, trial))
    return picks


def schedule_key(trial: Mapping[str, Any]) -> str:
    """One schedule's identity, whichever study or seed trained it."""
    return json.dumps(trial["schedule"], sort_keys=True)


def cross_seed_check(
    studies: Sequence[Mapping[str, Any]], args: argparse.Namespace, metric: Metric
) -> dict[str, Any]:
    """Each seed's ``args.cross_seed_picks`` best schedules (of any search) retrained on
    every seed of the run (one worker per run, outside Tune; a schedule that several seeds
    found trains once): how far one schedule's value moves from seed to seed, against the
    tolerance. Where that spread exceeds the tolerance, the global threshold asks a study for
    a lucky seed, not for a better schedule. The schedule with the best mean is the best
    schedule known of the paired measure (:func:`paired_of`)."""
    from tuner.schedule import Schedule

    started = time.perf_counter()
    seeds = sorted({int(s["seed"]) for s in studies})
    per_seed = args.cross_seed_picks
    picks = seed_bests(
        studies, args.epochs, metric, args.random_trials * args.epochs, per_seed=per_seed
    )
    # one job list per distinct schedule, under the first (lowest seed, best) run that found it
    found_by: dict[str, list[tuple[int, Mapping[str, Any]]]] = {}
    for found, trial in picks:
        found_by.setdefault(schedule_key(trial), []).append((found, trial))
    candidates = list(found_by.values())
    jobs = [
        Job(
            f"schedule{i}",
            Schedule.from_dict(finds[0][1]["schedule"]),
            args.task,
            seed,
            args.task_options,
        )
        for i, finds in enumerate(candidates)
        for seed in seeds
    ]
    print(
        f"cross-seed check: {len(found_by)} schedules (each seed's {per_seed} best) x "
        f"{len(seeds)} seeds = {len(jobs)} runs",
        flush=True,
    )
    runs = retrain_many(jobs, parallel=args.concurrent)
    rows = []
    for i, ((found, trial), *others) in enumerate(candidates):
        label = f"schedule{i}"
        values = {r.seed: r.val_metrics.get(metric.name) for r in runs if r.label == label}
        finite = [v for v in values.values() if v is not None]
        mean, std = mean_std(finite)
        rows.append(
            {
                "found_on_seed": found,
                "found_by": trial["_method"],
                "trial": trial["number"],
                "summary": trial.get("summary"),
                "study_value": trial["_value"],
                # the same schedule among other seeds' picks (their own study values)
                "also_found": [
                    {
                        "seed": s,
                        "by": t["_method"],
                        "trial": t["number"],
                        "study_value": t["_value"],
                    }
                    for s, t in others
                ],
                "values": {str(k): v for k, v in values.items()},
                "mean": mean,
                "std": std,
            }
        )
    stds = [r["std"] for r in rows if math.isfinite(r["std"])]
    means = [r for r in rows if math.isfinite(r["mean"])]
    best = None
    for r in means:
        if best is None or metric.better(r["mean"], best["mean"]):
            best = r
    return {
        "method": "any",  # whose best runs (results before 2026-12-01: "default")
        "per_seed": per_seed,  # distinct schedules taken from each seed (before: 1, no key)
        "seeds": seeds,
        "schedules": rows,
        "spread": mean_std(stds)[0] if stds else math.nan,
        "tolerance": args.tolerance,
        "best_mean": best,
        "wall_time_s": time.perf_counter() - started,
        "machine": machine_info(),
    }


def _cross_seed_markdown(data: Mapping[str, Any], metric: Metric) -> str:
    cross = data.get("cross_seed")
    if not cross:
        return ""
    seeds = cross["seeds"]
    rows = []
    for r in cross["schedules"]:
        finds = [
            (r["found_on_seed"], r.get("found_by", cross["method"]), r["trial"], r["study_value"]),
            *((f["seed"], f["by"], f["trial"], f["study_value"]) for f in r.get("also_found", [])),
        ]
        rows.append(
            [
                "; ".join(f"seed {seed}, trial {number} ({by})" for seed, by, number, _ in finds),
                f"`{r['summary']}`",
                "; ".join(metric.show(value) for *_, value in finds),
                *(metric.show(r["values"].get(str(k))) for k in seeds),
                f"{metric.show(r['mean'])} +/- {metric.fmt(r['std'])}",
            ]
        )
    table = markdown_table(
        ["found on", "stages", "in its study", *(f"seed {k}" for k in seeds), "mean"],
        rows,
    )
    best = cross["best_mean"]
    spread, tol = cross["spread"], cross["tolerance"]
    verdict = (
        "larger than the tolerance: the global threshold rewards a study's seed as much as its "
        "search, and the paired and per-seed measures above are the ones that compare searches"
        if spread > tol
        else "smaller than the tolerance: the global threshold mostly compares schedules, not seeds"
    )
    unit = " points" if metric.is_accuracy else metric.unit
    best_text = (
        f" The best mean is {metric.show(best['mean'])}, the schedule found on seed "
        f"{best['found_on_seed']}; the best known of any single run is "
        f"{metric.show(data['best_known'])}."
        if best
        else ""
    )
    searches = "any search" if cross["method"] == "any" else f"the {cross['method']} search"
    where = (cross.get("machine") or {}).get("cpu_model")
    studied = (data.get("machine") or {}).get("cpu_model")
    other = (
        f" The studies ran on another CPU ({studied}): there the same schedule on the same seed "
        "can end elsewhere (another order of floating-point sums), so compare a schedule's "
        "value in its study with its own seed's column."
        if where and studied and where != studied
        else ""
    )
    per_seed = cross.get("per_seed", 1)
    runs = (
        f"{per_seed} best full runs of distinct schedules ({searches}), each schedule"
        if per_seed > 1
        else f"best full run of {searches}"
    )
    return (
        f"\nCross-seed check: each seed's {runs} "
        "retrained on every seed (1 worker, outside Tune"
        + (f", on {where}" if where else "")
        + f"; the validation metric after the last epoch; {cross['wall_time_s']:.0f} s):\n\n"
        f"{table}\n"
        f"One schedule's value moves by {metric.fmt(spread)}{unit} from seed to seed (the "
        f"standard deviation over the seeds, mean over the schedules), {verdict} (tolerance "
        f"{metric.fmt(tol)}{unit}).{best_text}{other}\n"
    )


def _plot(
    studies: list[dict[str, Any]],
    threshold: float,
    best: float,
    tolerance: float,
    budget: int,
    metric: Metric,
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    labelled: set[str] = set()
    for s in studies:
        xs = [0]
        ys = [math.nan]
        for p in s["curve"]:
            if p["trial_epochs"] > budget:
                break
            xs.append(p["trial_epochs"])
            ys.append(metric.scale * p["best"] if p["best"] is not None else math.nan)
        method = s["method"]
        ax.step(
            xs,
            ys,
            where="post",
            color=COLORS[method],
            alpha=0.8,
            label=None if method in labelled else method.replace("_", " + "),
        )
        labelled.add(method)
    ax.axhline(
        metric.scale * best, color="gray", linewidth=0.8, label=f"best known {metric.show(best)}"
    )
    ax.axhline(
        metric.scale * threshold,
        color="gray",
        linestyle="--",
        linewidth=0.8,
        label=f"within tolerance ({metric.show(threshold)})",
    )
    ax.set_xlim(0, budget)
    # The region that matters (15 tolerances on the bad side: 3 points of accuracy).
    worse = metric.scale * metric.threshold(best, 15 * tolerance)
    better = metric.scale * metric.threshold(best, -2.5 * tolerance)
    ax.set_ylim(min(worse, better), max(worse, better))
    ax.set_xlabel("compute spent (trial-epochs)")
    unit = "%" if metric.is_accuracy else metric.unit.strip()
    ax.set_ylabel(
        f"best full-run val {metric.words} so far{', ' + unit if unit else ''}"
        + (" (lower is better)" if metric.direction == "min" else "")
    )
    ax.set_title("Best schedule found vs compute (one line per seed)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _fmt_epochs(value: float | None, budget: int) -> str:
    return f"not within budget (>{budget})" if value is None else f"{value:.1f}"


def _markdown(data: dict[str, Any]) -> str:
    cfg = data["config"]
    budget = cfg["budget_trial_epochs"]
    metric = Metric(cfg["metric"]["name"], cfg["metric"]["direction"])
    what = "val accuracy" if metric.is_accuracy else f"{metric.name} ({metric.direction})"
    rows = [
        [
            s["method"],
            str(s["seed"]),
            str(s["trials_trained"]),
            f"{s['trial_epochs_total']:.1f}",
            metric.fmt(s["best_within_budget"]) if s["best_within_budget"] is not None else "-",
            _fmt_epochs(s["epochs_to_reach"], budget),
            f"{s['wall_time_s']:.0f}",
        ]
        for s in data["studies"]
    ]
    for method, agg in data["methods"].items():
        rows.append(
            [
                f"**{method} (mean)**",
                "",
                "",
                f"{agg['trial_epochs_total_mean']:.0f}",
                metric.fmt(agg["best_mean"]) if math.isfinite(agg["best_mean"]) else "-",
                f"{agg['epochs_to_reach_mean']:.0f}"
                + (" (lower bound)" if agg["not_reached"] else ""),
                "",
            ]
        )
    out = [
        f"# Tuning efficiency: {cfg['task']}, {cfg['epochs']}-epoch trials\n\n",
        (
            f"Budget per study: `budget.trial_epochs: {budget}` ({cfg['random_trials']} full "
            f"runs' worth; no trial starts once it is spent), random search and the TPE + ASHA "
            f"searches up to {cfg['tpe_trials']} trials within it, PBT a population of "
            f"{cfg['pbt_population']} (ASHA "
            if cfg.get("random_budget") == "trial_epochs"
            else f"Budget per study: random {cfg['random_trials']} trials, the TPE + ASHA "
            f"searches up to {cfg['tpe_trials']} trials within `budget.trial_epochs: {budget}` "
            "(no trial starts once it is spent; "
        )
        + f"grace {cfg['grace']} epochs, reduction 3; probes after "
        "the rungs' epochs, 0.2 of the epochs trained), curves cut at "
        f"{budget} trial-epochs; {cfg['concurrent']} trials at once, 1 worker each. "
        f"Objective: {what} with max_steps {cfg['max_steps']}; batch "
        f"{cfg['batch_range'][0]}-{cfg['batch_range'][1]}, LR multipliers "
        f"{cfg['lr_multiplier_range'][0]:g}-{cfg['lr_multiplier_range'][1]:g}. Best schedule "
        f"known: {metric.show(data['best_known'])} val; tolerance "
        f"{metric.fmt_scaled(metric.scale * cfg['tolerance'])}"
        f"{' point' if metric.is_accuracy else metric.unit} -> threshold "
        f"{metric.show(data['threshold'])}.\n\n",
        markdown_table(
            [
                "method",
                "seed",
                "trials trained",
                "trial-epochs spent",
                f"best val {'%' if metric.is_accuracy else metric.words + metric.unit}",
                "trial-epochs to threshold",
                "wall s",
            ],
            rows,
        ),
        ""
        if data.get("complete", True)
        else f"\n**Partial**: seeds {cfg['seeds']} finished; the run was cut short.\n",
        f"\nRatios of the default ({DEFAULT}) to random: {_ratio(data['ratio'])}, to TPE + ASHA "
        f"without probes or prefixes: {_ratio(data['ratio_vs_tpe_asha'])}, to TPE + ASHA with "
        f"probes alone: {_ratio(data['ratio_vs_tpe_asha_probes'])}, to PBT (population "
        f"{cfg['pbt_population']}): {_ratio(data['ratio_vs_pbt'])}; target <= 0.5 of random and "
        f"<= 1 of PBT: {'met' if data['target_met'] else 'NOT met'}.\n",
        _levels_markdown(data, metric),
        _per_seed_markdown(data, metric),
        _paired_markdown(data, metric),
        _cross_seed_markdown(data, metric),
        f"\nThe stage-wise search (not the default) to random: "
        f"{_ratio(data['ratio_stagewise_vs_random'])}, to PBT: "
        f"{_ratio(data['ratio_stagewise_vs_pbt'])}.\n",
        f"\nMachine: {data['machine']}\n",
    ]
    origin = reuse_markdown(data, metric)
    if origin:
        out.insert(-1, origin)
    if data.get("summary_line"):
        out.append(f"\n```\n{data['summary_line']}\n```\n")
    return "".join(out)


def reuse_markdown(data: Mapping[str, Any], metric: Metric) -> str:
    """Where a run's reused or re-scored studies came from (a paragraph; "" for a run that
    trained all its studies), with the grace period of a variant run's reused studies."""
    cfg = data["config"]
    reused = data.get("reused")
    if not reused:
        return ""
    studies = data["studies"]
    earlier = reused.get("earlier")
    took = (
        f"; that run took the studies {_taken(earlier, studies)} from `{earlier['file']}`"
        if earlier and _taken(earlier, studies)
        else ""
    )
    # A variant run's reused studies ran with another grace period (REUSE_MAY_DIFFER).
    variant = reused.get("differs") or (earlier or {}).get("differs") or {}
    grace = (
        f" The reused studies ran with ASHA grace {variant['grace']} epochs (random search "
        f"and PBT do not use it), the others with {cfg['grace']}."
        if "grace" in variant
        else ""
    )
    if reused.get("rescored"):
        return (
            f"\nRe-scored from `{reused['file']}`: its studies as they ran (no study trained "
            f"again), aggregated by the current script{took}.{grace}\n"
        )
    same = "the same code" if grace else "the same configuration and code"
    return (
        f"\nThe studies {_taken(reused, studies)} are those of an earlier run with "
        f"{same} for those methods (`{reused['file']}`, its best "
        f"known {metric.show(reused['best_known'])}{took}); the threshold here is "
        f"recomputed over all studies shown.{grace}\n"
    )


def _taken(info: Mapping[str, Any], studies: Sequence[Mapping[str, Any]]) -> str:
    """Which studies a run took from a file: ``of <methods>`` (those it has studies of)
    and/or ``of seeds <k> of every method``."""
    have = {s["method"] for s in studies}
    methods = [m for m in info.get("methods") or [] if m in have]
    parts = [f"of {', '.join(methods)}"] if methods else []
    if info.get("seeds"):
        parts.append(f"of seeds {', '.join(map(str, info['seeds']))} of every method")
    return " and ".join(parts)


def _ratio(value: float) -> str:
    return "not run" if math.isnan(value) else f"{value:.2f}"


def levels_of(
    studies: Sequence[Mapping[str, Any]],
    best_known: float,
    tolerance: float,
    budget: int,
    metric: Metric,
) -> list[dict[str, Any]]:
    """Per level (:data:`LEVELS`, then the target's threshold) and method: the mean
    trial-epochs to reach it (a study that does not counts ``budget``) and how many did."""
    levels = []
    for factor in (*LEVELS, 1.0):
        level = metric.threshold(best_known, factor * tolerance)
        per_method = {}
        for method in METHODS:
            reached = [
                epochs_to_reach(s["curve"], level, budget, metric)
                for s in studies
                if s["method"] == method
            ]
            per_method[method] = {
                "mean": mean_std([budget if r is None else r for r in reached])[0],
                "reached": sum(r is not None for r in reached),
                "studies": len(reached),
            }
        levels.append({"tolerances": factor, "value": level, "methods": per_method})
    return levels


def per_seed_of(
    studies: Sequence[Mapping[str, Any]], tolerance: float, budget: int, metric: Metric
) -> dict[str, Any]:
    """The same measure against each seed's own best schedule known: every trial of a study
    trains on the study seed, and the studies of one seed (one per method) share it, so a
    seed whose draw is lucky for every schedule sets a best known that the studies of the
    other seeds cannot reach whatever they find. Per seed, the best full run over its
    studies (all methods) and its threshold; per method, the trial-epochs each study spent
    to reach its seed's threshold (a study that does not counts ``budget``), and the
    default's ratios to the other methods' means."""
    best: dict[int, float] = {}
    for s in studies:
        seed, value = int(s["seed"]), s["best_within_budget"]
        if value is not None and (seed not in best or metric.better(value, best[seed])):
            best[seed] = value
    return _against_seed_values(studies, best, tolerance, budget, metric)


def _against_seed_values(
    studies: Sequence[Mapping[str, Any]],
    values: Mapping[int, float],
    tolerance: float,
    budget: int,
    metric: Metric,
) -> dict[str, Any]:
    """Per method, the trial-epochs each study spent to come within ``tolerance`` of its
    seed's value in ``values`` (None: not within ``budget``, or no value for its seed; the
    mean counts such a study ``budget``), and the default's ratios to the other methods."""
    methods: dict[str, dict[str, Any]] = {}
    for method in METHODS:
        mine = [s for s in studies if s["method"] == method]
        if not mine:
            continue
        reached = [
            epochs_to_reach(
                s["curve"], metric.threshold(values[int(s["seed"])], tolerance), budget, metric
            )
            if int(s["seed"]) in values
            else None
            for s in mine
        ]
        methods[method] = {
            "epochs_to_reach": reached,
            "epochs_to_reach_mean": mean_std([budget if r is None else r for r in reached])[0],
            "not_reached": sum(r is None for r in reached),
        }
    return {
        "best_known": {str(seed): value for seed, value in sorted(values.items())},
        "methods": methods,
        "ratio_vs_random": ratio_of(methods, DEFAULT, "random"),
        "ratio_vs_tpe_asha": ratio_of(methods, DEFAULT, "tpe_asha"),
        "ratio_vs_pbt": ratio_of(methods, DEFAULT, "pbt"),
    }


def paired_of(
    studies: Sequence[Mapping[str, Any]],
    cross: Mapping[str, Any] | None,
    tolerance: float,
    budget: int,
    metric: Metric,
) -> dict[str, Any] | None:
    """The measure against the best schedule known trained on each study's own seed: the
    cross-seed check's schedule with the best mean over the seeds is the best known, and a
    study of seed k reaches it when its best-so-far comes within the tolerance of that
    schedule's value on seed k (a paired comparison: the seed's luck, good or bad, is on both
    sides). A study that does not within ``budget`` counts ``budget``. None without a
    cross-seed check, or where the best schedule has no value on some seed of the studies."""
    best = (cross or {}).get("best_mean")
    if not best:
        return None
    values = {int(k): v for k, v in best["values"].items() if v is not None}
    if any(int(s["seed"]) not in values for s in studies):
        return None
    return {
        "schedule": {k: best.get(k) for k in ("found_on_seed", "found_by", "trial", "summary")},
        **_against_seed_values(studies, values, tolerance, budget, metric),
    }


def _paired_markdown(data: dict[str, Any], metric: Metric) -> str:
    paired = data.get("paired")
    if not paired:
        return ""
    budget = data["config"]["budget_trial_epochs"]
    best = paired["schedule"]
    values, table, ratios = _seed_measure_parts(paired, metric)
    return (
        "\nAgainst the best schedule known trained on each study's own seed (paired: the "
        "schedule with the best mean in the cross-seed check below, "
        f"`{best['summary']}` (found by {best.get('found_by') or 'the default'} on seed "
        f"{best['found_on_seed']}), scores {values}; a study's threshold is that value on its "
        f"seed within the tolerance, so a seed's luck counts on both sides; a study that does "
        f"not reach it within {budget} counts {budget}):\n\n"
        f"{table}\n{ratios}"
    )


def _seed_measure_parts(measure: Mapping[str, Any], metric: Metric) -> tuple[str, str, str]:
    """A per-seed or paired measure's seed values, its table (per method: trial-epochs per
    seed and their mean) and its ratios line, for the markdown."""
    values = ", ".join(
        f"seed {seed} {metric.show(value)}" for seed, value in measure["best_known"].items()
    )
    rows = []
    for method, m in measure["methods"].items():
        cells = ["-" if r is None else f"{r:.0f}" for r in m["epochs_to_reach"]]
        bound = " (lower bound)" if m["not_reached"] else ""
        rows.append([method, ", ".join(cells), f"{m['epochs_to_reach_mean']:.0f}{bound}"])
    table = markdown_table(["method", "trial-epochs per seed (- not reached)", "mean"], rows)
    ratios = (
        f"Ratios of the default on this measure: to random {_ratio(measure['ratio_vs_random'])}, "
        f"to TPE + ASHA {_ratio(measure['ratio_vs_tpe_asha'])}, to PBT "
        f"{_ratio(measure['ratio_vs_pbt'])}.\n"
    )
    return values, table, ratios


def ratio_of(methods: Mapping[str, Mapping[str, Any]], method: str, to: str) -> float:
    """Mean trial-epochs to the threshold of ``method`` over those of ``to`` (NaN when either
    was not run)."""
    if method not in methods or to not in methods:
        return math.nan
    theirs = methods[to]["epochs_to_reach_mean"]
    return methods[method]["epochs_to_reach_mean"] / theirs if theirs else math.inf


def _per_seed_markdown(data: dict[str, Any], metric: Metric) -> str:
    per_seed = data.get("per_seed")
    if not per_seed or not per_seed["methods"]:
        return ""
    budget = data["config"]["budget_trial_epochs"]
    bests, table, ratios = _seed_measure_parts(per_seed, metric)
    return (
        "\nAgainst each seed's own best schedule known (every trial of a study trains on its "
        "seed, and one seed's studies share it, so a seed lucky for every schedule sets a best "
        f"known the other seeds cannot reach): best per seed: {bests}; a study's threshold is "
        f"its seed's best within the tolerance; a study that does not reach it within {budget} "
        f"counts {budget}.\n\n"
        f"{table}\n{ratios}"
    )


def _levels_markdown(data: dict[str, Any], metric: Metric) -> str:
    """Trial-epochs to reach each level, per method (mean over its studies, a study that
    never does counting the budget; how many did)."""
    levels = data.get("levels") or []
    if not levels:
        return ""
    budget = data["config"]["budget_trial_epochs"]
    header = ["method"] + [f"to {metric.show(lv['value'])}" for lv in levels]
    rows = []
    for method in METHODS:
        if not levels[0]["methods"][method]["studies"]:  # not run (--methods)
            continue
        cells = [method]
        for lv in levels:
            m = lv["methods"][method]
            if not m["studies"]:
                cells.append("-")
                continue
            bound = " (lower bound)" if m["reached"] < m["studies"] else ""
            cells.append(f"{m['mean']:.0f}{bound}, {m['reached']}/{m['studies']} reached")
        rows.append(cells)
    return (
        f"\nTrial-epochs to reach each level (mean over the seeds; a study that does not "
        f"reach it within {budget} counts {budget}), the last column the target's threshold:"
        f"\n\n{markdown_table(header, rows)}"
    )


def report(
    studies: list[dict[str, Any]],
    args: argparse.Namespace,
    budget: int,
    max_steps: int | None,
    small_steps: int,
    started: float,
    stem: str,
    complete: bool,
    metric: Metric,
    space: Any,
) -> dict[str, Any]:
    """Aggregate the studies so far and write JSON, markdown and PNG (after every seed, so an
    interrupted run leaves the seeds it finished)."""
    found = best_value(studies, metric)
    best_known = found if found is not None else (0.0 if metric.direction == "max" else math.inf)
    threshold = metric.threshold(best_known, args.tolerance)
    methods: dict[str, dict[str, Any]] = {}
    for s in studies:
        s["epochs_to_reach"] = epochs_to_reach(s["curve"], threshold, budget, metric)
    for method in METHODS:
        mine = [s for s in studies if s["method"] == method]
        if not mine:  # not run (--methods)
            continue
        reach = [budget if s["epochs_to_reach"] is None else s["epochs_to_reach"] for s in mine]
        methods[method] = {
            "epochs_to_reach": [s["epochs_to_reach"] for s in mine],
            "epochs_to_reach_mean": mean_std(reach)[0],
            "not_reached": sum(s["epochs_to_reach"] is None for s in mine),
            "trial_epochs_total_mean": mean_std([s["trial_epochs_total"] for s in mine])[0],
            # Over the studies that completed a full run within budget (``no_full_run``: the
            # others).
            "best_mean": mean_std(
                [s["best_within_budget"] for s in mine if s["best_within_budget"] is not None]
            )[0],
            "no_full_run": sum(s["best_within_budget"] is None for s in mine),
        }
    levels = levels_of(studies, best_known, args.tolerance, budget, metric)
    per_seed = per_seed_of(studies, args.tolerance, budget, metric)
    cross = getattr(args, "cross_seed_result", None)
    paired = paired_of(studies, cross, args.tolerance, budget, metric)
    reused = getattr(args, "reused", None)
    rescored = bool(reused and reused.get("rescored"))

    ratio = ratio_of(methods, DEFAULT, "random")
    ratio_tpe = ratio_of(methods, DEFAULT, "tpe_asha")
    ratio_probes = ratio_of(methods, DEFAULT, "tpe_asha_probes")
    ratio_pbt = ratio_of(methods, DEFAULT, "pbt")
    ratio_stagewise = ratio_of(methods, "stagewise", "random")
    ratio_stagewise_pbt = ratio_of(methods, "stagewise", "pbt")
    data: dict[str, Any] = {
        "config": {
            **study_config(args, max_steps, budget),
            "metric": {"name": metric.name, "direction": metric.direction},
            "batch_range": [space.base_batch_size, space.largest_batch],
            "lr_multiplier_range": [space.lr_mult_min, space.lr_mult_max],
            "seeds": sorted({s["seed"] for s in studies}),
            "small_batch_steps": small_steps,
            "tolerance": args.tolerance,
            "smoke": args.smoke,
        },
        "complete": complete,
        "best_known": best_known,
        "threshold": threshold,
        "methods": methods,
        "levels": levels,
        "per_seed": per_seed,
        "paired": paired,
        "default": DEFAULT,
        "ratio": ratio,
        "ratio_vs_tpe_asha": ratio_tpe,
        "ratio_vs_tpe_asha_probes": ratio_probes,
        "ratio_vs_pbt": ratio_pbt,
        "ratio_stagewise_vs_random": ratio_stagewise,
        "ratio_stagewise_vs_pbt": ratio_stagewise_pbt,
        "target_met": ratio <= 0.5 and ratio_pbt <= 1.0,
        "studies": studies,
        "machine": machine_info(),
        "total_wall_time_s": time.perf_counter() - started,
        "reused": reused,
        "cross_seed": cross,
    }
    if reused and rescored:  # the machine and time its studies ran on and took
        data["machine"] = reused["machine"]
        data["total_wall_time_s"] = reused["total_wall_time_s"]
    line = (
        f"efficiency task={args.task} "
        + ("" if metric.is_accuracy else f"metric={metric.name} ")
        + f"default={DEFAULT_NAME} ratio_vs_random={ratio:.2f} "
        f"ratio_vs_tpe_asha={ratio_tpe:.2f} ratio_vs_pbt={ratio_pbt:.2f}"
    )
    data["summary_line"] = line
    args.results_dir.mkdir(parents=True, exist_ok=True)
    write_json(args.results_dir / f"{stem}.json", data)
    (args.results_dir / f"{stem}.md").write_text(_markdown(data), "utf-8")
    if found is not None:
        _plot(
            studies,
            threshold,
            best_known,
            args.tolerance,
            budget,
            metric,
            args.results_dir / f"{stem}.png",
        )
    return data


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="mnist1d")
    add_study_arguments(parser)
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="epochs of every trial (default: 12 for mnist1d, else the task's default)",
    )
    parser.add_argument("--seeds", type=int, default=3, help="studies per method")
    parser.add_argument("--random-trials", type=int, default=12)
    parser.add_argument(
        "--tpe-trials",
        type=int,
        default=72,
        help="cap on the TPE searches' trials (they stop when the compute budget is spent)",
    )
    parser.add_argument(
        "--pbt-population", type=int, default=None, help="default: 2/3 of --random-trials"
    )
    parser.add_argument("--grace", type=int, default=2, help="ASHA grace period (epochs)")
    parser.add_argument(
        "--batch-max",
        type=int,
        default=None,
        help="largest batch of the space (default: the schedule-quality benchmark's, 1024 "
        "for mnist1d, else 16x the task's base batch)",
    )
    parser.add_argument("--steps-fraction", type=float, default=0.2, help="max_steps / small's")
    parser.add_argument("--concurrent", type=int, default=2)
    parser.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="how close to the best known counts as found, in the metric's units (accuracy "
        "as a fraction); default: 0.002 for accuracy (0.2 point, the target), 0.05 for a "
        "loss, 0.2 for PSNR (common.TOLERANCES)",
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--smoke", action="store_true", help="digits, 2 epochs, 1 seed, 3 trials")
    parser.add_argument("--tag", default="", help="output name suffix (variant runs)")
    parser.add_argument(
        "--methods",
        type=lambda text: [m.strip() for m in text.split(",") if m.strip()],
        default=list(METHODS),
        help=f"the methods to run, comma-separated (default: all of {','.join(METHODS)}); "
        f"without --reuse they must include {','.join(RATIO_METHODS)}",
    )
    parser.add_argument(
        "--reuse",
        type=Path,
        default=None,
        help="a results JSON of an earlier run with the same configuration: the studies of "
        "the methods not run now are taken from it (the results say so)",
    )
    parser.add_argument(
        "--cross-seed",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="at the end, retrain each seed's best schedules (of any search; "
        "--cross-seed-picks) on every seed, "
        "report how far one schedule moves from seed to seed against the tolerance, and measure "
        "every study against the best-mean schedule on its own seed (with --rescore: the only "
        "runs it trains); default: on for a full run of two seeds or more, off for --smoke "
        "and --rescore",
    )
    parser.add_argument(
        "--cross-seed-picks",
        type=int,
        default=2,
        help="the cross-seed check's candidates: each seed's this many best full runs of "
        "distinct schedules (of any search); a schedule several seeds found trains once",
    )
    parser.add_argument(
        "--first-seed",
        type=int,
        default=0,
        help="run the seeds from this one to --seeds - 1 only; the lower seeds' studies of "
        "the methods run come from --reuse as well (more seeds for an earlier run)",
    )
    parser.add_argument(
        "--rescore",
        type=Path,
        default=None,
        help="a results JSON of an earlier run: re-aggregate all its studies with this "
        "script's analysis (same command line as that run, for the configuration check); "
        "trains nothing",
    )
    args = parser.parse_args(argv)
    if args.rescore is not None:
        if args.reuse is not None:
            parser.error("--rescore reads every study from its file; leave out --reuse")
        args.reuse = args.rescore
    unknown = sorted(set(args.methods) - set(METHODS))
    if unknown or not args.methods:
        parser.error(f"--methods: unknown {unknown or 'empty'}; choose from {','.join(METHODS)}")
    default_task = args.task == "mnist1d"
    if args.smoke:
        if args.task == "mnist1d":
            args.task = "digits"
        args.epochs, args.seeds = 2, 1
        args.random_trials = args.tpe_trials = 3
        args.grace, args.batch_max, args.steps_fraction = 1, 128, 0.0
    if not 0 <= args.first_seed < args.seeds:
        parser.error(f"--first-seed must be in 0..{args.seeds - 1} (--seeds {args.seeds})")
    if args.first_seed and args.reuse is None:
        parser.error("--first-seed needs --reuse: the file with the lower seeds' studies")
    if args.cross_seed_picks < 1:
        parser.error(f"--cross-seed-picks must be at least 1, not {args.cross_seed_picks}")
    if args.pbt_population is None:
        args.pbt_population = max(2, 2 * args.random_trials // 3)
    if args.cross_seed is None:  # the paired measure needs a schedule retrained on 2+ seeds
        args.cross_seed = not args.smoke and args.rescore is None and args.seeds >= 2
    study_arguments(args)
    stem = "tuning_efficiency" if default_task else f"tuning_efficiency_{args.task}"
    if args.smoke:
        stem += "_smoke"
    if args.tag:
        stem += f"_{args.tag}"
    started = time.perf_counter()

    from tuner.schedule import Schedule
    from tuner.space import ScheduleSpace
    from workers.runner import resolve_spec
    from workers.tasks import get_task

    task = get_task(args.task)
    if args.epochs is None:
        args.epochs = 12 if args.task == "mnist1d" else task.default_epochs
    if args.batch_max is None:
        args.batch_max = default_batch_max(args.task, task.default_base_batch_size)[0]
    probe = study_spec(
        "random",
        args.task,
        args.epochs,
        args.batch_max,
        None,
        2,
        0,
        1,
        1,
        metric=args.metric,
        task_options=args.task_options,
        lr_multiplier=args.lr_multiplier,
    )
    metric = Metric(*probe.objective_metric())
    if args.tolerance is None:
        args.tolerance = metric.default_tolerance
        if args.tolerance is None:
            parser.error(f"--tolerance is needed for {metric.name} (no default for it)")
    resolved, train_size = resolve_spec(probe)
    space = ScheduleSpace.from_spec(resolved)
    small = Schedule.constant(
        resolved.base_batch_size, args.epochs, resolved.base_lr, resolved.base_batch_size
    )
    small_steps = small.total_steps(train_size)
    max_steps = int(small_steps * args.steps_fraction) if args.steps_fraction > 0 else None
    budget = args.random_trials * args.epochs
    print(
        f"task {task.name}: metric {metric.name} ({metric.direction}), tolerance "
        f"{args.tolerance:g}, batch {space.base_batch_size}-{space.largest_batch}, LR "
        f"multipliers {space.lr_mult_min:g}-{space.lr_mult_max:g}; "
        f"{args.epochs} epochs per trial, max_steps {max_steps} (small batch: "
        f"{small_steps}); random {args.random_trials} trials, TPE + ASHA up to {args.tpe_trials} "
        f"trials; compute budget {budget} trial-epochs; {args.seeds} seed(s)",
        flush=True,
    )
    studies: list[dict[str, Any]] = []
    if args.rescore is not None:
        args.methods = []
        studies, args.reused = reused_studies(args, max_steps, budget)
        args.reused["rescored"] = True
        if args.cross_seed:
            ensure_ray()
            args.cross_seed_result = cross_seed_check(studies, args, metric)
        data = report(
            studies, args, budget, max_steps, small_steps, started, stem, True, metric, space
        )
        print(_markdown(data))
        print(data["summary_line"], flush=True)
        return data
    ensure_ray()
    if args.reuse is not None:
        studies, args.reused = reused_studies(args, max_steps, budget)
    elif not set(RATIO_METHODS) <= set(args.methods):
        parser.error(
            f"--methods must include {', '.join(RATIO_METHODS)} (the summary line's ratios) "
            "unless --reuse gives the studies of those left out"
        )
    for seed in range(args.first_seed, args.seeds):
        for method in args.methods:
            # Every search but PBT (a fixed population) stops on compute: what early stopping,
            # forks and the divergence rule save buys more trials.
            trials = {"pbt": args.pbt_population}.get(method, args.tpe_trials)
            spec = study_spec(
                method,
                args.task,
                args.epochs,
                args.batch_max,
                max_steps,
                trials,
                seed,
                args.grace,
                args.concurrent,
                trial_epochs=budget,
                metric=args.metric,
                task_options=args.task_options,
                lr_multiplier=args.lr_multiplier,
            )
            with tempfile.TemporaryDirectory(prefix="stagetune-bench-") as tmp:
                run = run_tuning_study(spec, Path(tmp))
            points = curve(run.trials, args.epochs, metric)
            within = [p for p in points if p["trial_epochs"] <= budget]
            best_in = within[-1]["best"] if within else None
            studies.append(
                {
                    "method": method,
                    "seed": seed,
                    "trials": list(run.trials),
                    "trials_trained": sum(1 for t in run.trials if t["epochs_done"]),
                    "trial_epochs_total": points[-1]["trial_epochs"] if points else 0,
                    "best_within_budget": best_in,
                    "curve": points,
                    "wall_time_s": run.wall_time_s,
                }
            )
            print(
                f"  {method:<15} seed {seed}: {len(run.trials)} trials, "
                f"{studies[-1]['trial_epochs_total']:.1f} trial-epochs, best "
                f"{metric.show(best_in)} within budget, {run.wall_time_s:.0f} s",
                flush=True,
            )
            if method == args.methods[-1]:
                report(
                    studies,
                    args,
                    budget,
                    max_steps,
                    small_steps,
                    started,
                    stem,
                    False,
                    metric,
                    space,
                )
    if args.cross_seed:
        args.cross_seed_result = cross_seed_check(studies, args, metric)
    data = report(studies, args, budget, max_steps, small_steps, started, stem, True, metric, space)
    print(_markdown(data))
    print(data["summary_line"], flush=True)
    return data


if __name__ == "__main__":
    main()
