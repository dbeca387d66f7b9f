"""The noise-scale candidate on the quality benchmark's spaces, trained on fresh test seeds.

A study with baselines turns the small-batch baseline's measured gradient noise scale into one
candidate schedule (``tuner.noise_candidate``). The quality benchmark's studies run no
baselines, so its fronts never contain that candidate; this benchmark measures it apart, per
task:

1. the small-batch baseline of the task's space in ``bench/schedule_quality.py`` (the same
   epochs, batch range and LR range), trained on one worker with trial seed 0 and the
   noise scale measured at each epoch's end (``noise_batches``, as a study gives it);
2. the candidate built from that curve (:func:`tuner.noise_candidate.noise_scale_schedule`);
3. the candidate trained on the quality benchmark's test seeds (1000, 1001, ...; one worker
   each) and evaluated on the TEST split;
4. the step floor of that small-batch run (:func:`tuner.noise_candidate.noise_scale_step_floor`):
   McCandlish et al.'s fewest steps, at any batch, that match the progress it made, and so the
   most any schedule could cut its steps by (``max_steps_ratio``). Where that is under 5, the
   quality benchmark's "small batch's figure at 5x fewer steps" is out of reach by the
   measured noise scale, not by the search.

Summary line per task (the last one printed is the last task's)::

    noise_candidate task=.. candidate=<stages> steps=.. test=<mean> std=.. step_floor=..
        max_steps_ratio=..

Results go to ``bench/results/noise_candidate.{json,md}``; compare them with the recipes'
rows of ``schedule_quality*.md`` at similar step counts.

    .venv/bin/python bench/noise_candidate.py                    # mnist1d, tinylm, denoise
    .venv/bin/python bench/noise_candidate.py --smoke            # CI: digits, 2 epochs, 1 seed
    # beside the candidate, other batch schedules with the recipes' LR, warm-ups and decay
    # (x1.4: 1.4 times the recipe's LR in that stage), or schedule files as they are:
    .venv/bin/python bench/noise_candidate.py --tasks mnist1d --tag two_stage \
        --compare "128@0-3 -> 512@3-30,128@0-20x1.4 -> 512@20-30,my-schedule.yaml"
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
for _path in (str(_HERE.parent), str(_HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from common import (  # noqa: E402
    LR_MULTIPLIER,
    RESULTS_DIR,
    Job,
    default_batch_max,
    ensure_ray,
    machine_info,
    markdown_table,
    mean_std,
    publish,
    retrain_many,
)
from schedule_quality import study_spec  # noqa: E402

from tuner.baselines import small_batch  # noqa: E402
from tuner.noise_candidate import (  # noqa: E402
    noise_scale_schedule,
    noise_scale_step_floor,
)
from tuner.recipes import recipe_stages  # noqa: E402
from tuner.schedule import Schedule  # noqa: E402
from tuner.space import ScheduleSpace  # noqa: E402

#: The test metric reported per task (higher is better but for a loss).
TEST_METRIC = {"tinylm": "test_loss", "denoise": "test_psnr"}


def measure_noise(
    task: str, space: ScheduleSpace, noise_batches: int
) -> list[tuple[int, int, float | None]]:
    """The small-batch baseline of ``space`` on one worker, trial seed 0: per epoch its batch,
    its steps so far and its noise scale measured at the epoch's end from ``noise_batches``
    batches."""
    from workers.trainable import ScheduleTrainable

    config = {
        "schedule": small_batch(space).to_dict(),
        "task": task,
        "seed": 0,
        "workers": 1,
        "cpus_per_worker": 1.0,
        "noise_batches": noise_batches,
    }
    trainable = ScheduleTrainable(config)
    epochs: list[tuple[int, int, float | None]] = []
    try:
        while True:
            result = trainable.train()
            epochs.append((result["batch_size"], result["steps"], result["noise_scale"]))
            if result["done"]:
                return epochs
    finally:
        trainable.stop()


def parse_parts(text: str) -> list[tuple[int, int, int, float]]:
    """``"128@0-3 -> 512@3-30"`` (a schedule's summary without its LRs) as ``(start, end,
    batch, factor)`` parts; ``BATCH@START-ENDxF`` sets a stage's ``factor`` (1 without): a
    factor on the recipes' LR, not the summary's absolute ``(lr x..)`` multiplier."""
    parts = []
    for stage in text.split("->"):
        body, _, factor = stage.strip().partition("x")
        batch, _, span = body.partition("@")
        start, _, end = span.partition("-")
        try:
            parts.append((int(start), int(end), int(batch), float(factor) if factor else 1.0))
        except ValueError:
            raise SystemExit(
                f"--compare: {stage.strip()!r} is not BATCH@START-END or BATCH@START-ENDxF "
                "(e.g. 128@0-3, or 128@0-3x1.4 for 1.4 times the recipe's LR)"
            ) from None
    return parts


def compare_schedule(space: ScheduleSpace, text: str) -> Schedule:
    """A schedule given to ``--compare``: a schedule YAML file (trained as it is), or stages
    (:func:`parse_parts`) with the recipes' LR, warm-ups and decay, each stage's LR multiplier
    then times its factor."""
    path = Path(text.strip())
    if path.suffix in (".yaml", ".yml"):
        if not path.is_file():
            raise SystemExit(f"--compare: no schedule file {path}")
        schedule = Schedule.load(path)
        if schedule.total_epochs != space.total_epochs:
            raise SystemExit(
                f"--compare: {path} runs {schedule.total_epochs} epochs, the task's space "
                f"{space.total_epochs}: give --epochs {schedule.total_epochs} or another file"
            )
        return schedule
    parts = parse_parts(text)
    stages = recipe_stages(space, [(start, end, batch) for start, end, batch, _ in parts])
    stages = [
        replace(stage, lr_multiplier=stage.lr_multiplier * factor)
        for stage, (*_, factor) in zip(stages, parts, strict=True)
    ]
    return space.schedule(stages, label_smoothing=space.label_smoothing[0])


def _train(schedule: Schedule, task: str, seeds: Sequence[int], metric: str) -> dict[str, Any]:
    """``schedule`` (the candidate, or one given to ``--compare``) trained and tested on the
    seeds."""
    label = schedule.summary()
    runs = retrain_many([Job(f"{label} {s}", schedule, task, s) for s in seeds], parallel=2)
    values = [float(r.test_metrics[metric]) for r in runs]
    mean, std = mean_std(values)
    return {
        "stages": label,
        "schedule": schedule.to_dict(),
        "steps": runs[0].steps,
        "values": values,
        "mean": mean,
        "std": std,
    }


def run_task(
    task: str,
    epochs: int | None,
    seeds: Sequence[int],
    noise_batches: int,
    compare: Sequence[str] = (),
) -> dict[str, Any]:
    from workers.runner import resolve_spec
    from workers.tasks import get_task

    defaults = get_task(task)
    epochs = epochs or defaults.default_epochs
    batch_max, _ = default_batch_max(task, defaults.default_base_batch_size)
    spec = study_spec(
        task, epochs, batch_max, 10**9, 1, 0, 1, 1, lr_multiplier=LR_MULTIPLIER.get(task)
    )
    resolved, _ = resolve_spec(spec)
    space = ScheduleSpace.from_spec(resolved)
    metric = TEST_METRIC.get(task, "test_accuracy")
    others = []  # checked before anything trains
    for text in compare:
        others.append(compare_schedule(space, text))
    started = time.perf_counter()
    measured = measure_noise(task, space, noise_batches)
    noise = [n for _, _, n in measured]
    candidate = noise_scale_schedule(space, noise)
    floor = noise_scale_step_floor(measured)
    row: dict[str, Any] = {
        "task": task,
        "epochs": epochs,
        "small_batch": small_batch(space).summary(),
        "noise_scale": noise,
        "small_batch_steps": [steps for _, steps, _ in measured],
        "step_floor": None if floor is None else floor.to_dict(),
        "candidate": None if candidate is None else candidate.summary(),
    }
    row["compare"] = [_train(schedule, task, seeds, metric) for schedule in others]
    if candidate is None:
        row["note"] = "no noise scale measured: no candidate"
        return row
    row["schedule"] = candidate.to_dict()
    trained = _train(candidate, task, seeds, metric)
    row["metric"] = metric
    for key in ("values", "mean", "std", "steps"):
        row[key] = trained[key]
    row["wall_time_s"] = time.perf_counter() - started
    row["summary_line"] = (
        f"noise_candidate task={task} candidate={row['candidate'].replace(' ', '')} "
        f"steps={row['steps']} test={row['mean']:.4f} std={row['std']:.4f}"
    )
    if floor is not None:
        row["summary_line"] += f" step_floor={floor.floor:.0f} max_steps_ratio={floor.ratio:.2f}"
    return row


def _floor_cell(row: dict[str, Any]) -> str:
    floor = row.get("step_floor")
    if not floor:
        return "-"
    return f"{floor['floor']:,.0f} of {floor['steps']:,} ({floor['ratio']:.1f}x)"


def _markdown(data: dict[str, Any]) -> str:
    rows = [
        [
            r["task"],
            str(r["epochs"]),
            ", ".join("-" if v is None else f"{v:,.0f}" for v in r["noise_scale"]),
            _floor_cell(r),
            f"`{r['candidate']}`" if r["candidate"] else "-",
            str(r.get("steps", "-")),
            f"{r['mean']:.4f} ± {r['std']:.4f} ({r['metric']})" if "mean" in r else r["note"],
        ]
        for r in data["rows"]
    ]
    lines = [
        "# The noise-scale candidate on the quality benchmark's spaces",
        "",
        f"Small-batch baseline on one worker, trial seed 0, noise scale measured at each epoch's "
        f"end from {data['noise_batches']} batches; the candidate from that curve trained on "
        f"test seeds {', '.join(map(str, data['seeds']))} (one worker each), test split.",
        "",
        markdown_table(
            [
                "task",
                "epochs",
                "noise scale per epoch",
                "step floor (of the small batch's steps)",
                "candidate",
                "steps",
                "test",
            ],
            rows,
        ),
        "",
        "Step floor: the fewest steps, at any batch, that make the small-batch run's progress "
        "(McCandlish et al. 2018: a step at batch B is worth 1 / (1 + B_noise / B) of a step "
        "at an unbounded batch; summed over the run's epochs, an epoch without a measurement "
        "adding nothing), and in brackets the most a schedule could cut the small batch's steps "
        "by and still match it. Under 5x: the small batch's figure at 5x fewer steps is out of "
        "reach by the measured noise scale (an estimate: the simple noise scale, SGD's model; "
        "it leans low, see `tuner.noise_candidate.noise_scale_step_floor`).",
        "",
    ]
    compared = [(r, c) for r in data["rows"] for c in r.get("compare", [])]
    if compared:
        lines += [
            "Other schedules on the same test seeds: batch schedules with the LR, warm-ups and "
            "decay the candidate takes (the recipes', times a stage's factor), schedule files "
            "as they are:",
            "",
            markdown_table(
                ["task", "stages", "LR multipliers", "steps", "test", "per seed"],
                [
                    [
                        r["task"],
                        f"`{c['stages']}`",
                        ", ".join(f"{st['lr_multiplier']:g}" for st in c["schedule"]["stages"]),
                        str(c["steps"]),
                        f"{c['mean']:.4f} ± {c['std']:.4f}",
                        ", ".join(f"{v:.4f}" for v in c["values"]),
                    ]
                    for r, c in compared
                ],
            ),
            "",
        ]
    lines += [
        f"Machine: {data['machine']}",
        "",
        "```",
        *[r["summary_line"] for r in data["rows"] if "summary_line" in r],
        "```",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--tasks", default="mnist1d,tinylm,denoise")
    parser.add_argument("--epochs", type=int, default=None, help="default: each task's")
    parser.add_argument("--seeds", type=int, default=5, help="test seeds")
    parser.add_argument("--seed-base", type=int, default=1000)
    parser.add_argument("--noise-batches", type=int, default=16)
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument(
        "--compare",
        default="",
        help="comma-separated batch schedules (BATCH@START-END -> ...) to train beside the "
        "candidate with the same LR rule (BATCH@START-ENDxF: F times that stage's LR), or "
        "schedule YAML files, trained as they are (one task only)",
    )
    parser.add_argument("--tag", default="", help="suffix of the results' file names")
    parser.add_argument("--smoke", action="store_true", help="digits, 2 epochs, 1 seed")
    args = parser.parse_args(argv)
    stem = "noise_candidate"
    if args.smoke:
        stem, args.tasks, args.epochs, args.seeds = "noise_candidate_smoke", "digits", 2, 1
    if args.tag:
        stem += f"_{args.tag}"
    compare = [c for c in args.compare.split(",") if c.strip()]
    tasks = args.tasks.split(",")
    if compare and len(tasks) != 1:
        parser.error("--compare: its schedules are one task's; give one task in --tasks")
    seeds = [args.seed_base + i for i in range(args.seeds)]
    ensure_ray(2)
    rows = [run_task(t, args.epochs, seeds, args.noise_batches, compare) for t in tasks]
    lines = [r["summary_line"] for r in rows if "summary_line" in r]
    data = {
        "noise_batches": args.noise_batches,
        "seeds": seeds,
        "rows": rows,
        "machine": machine_info(),
        "summary_line": lines[-1] if lines else "noise_candidate none",
    }
    args.results_dir.mkdir(parents=True, exist_ok=True)
    return publish(args.results_dir, stem, data, _markdown)


if __name__ == "__main__":
    main()
