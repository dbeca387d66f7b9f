"""The large-batch penalty of the ``denoise`` task at a fixed number of epochs.

The task's default run (its default epochs, base batch and LR, AdamW) against the same epochs
at ``--factors`` times the base batch, with the LR scaled by the square-root rule (no warm-up)
and by the linear rule (with a linear warm-up over the first epoch from the base LR, as the
``large_batch`` baseline of Goyal et al.). Every run uses the small-batch baseline's step-decay
skeleton (the LR divided by 4 at 50 % and at 75 % of the epochs; :mod:`tuner.baselines`) and
trains through the trial loop (:class:`workers.loop.TrialWorker`, one CPU rank, one thread),
on the task's default options; the trial's seed varies the initialisation and the data
order, not the data. Reported: the final val PSNR (dB) per run and the mean over seeds, the
penalty against the base batch, and the base run's PSNR and time per epoch.

The summary line::

    denoise_batch_penalty base_psnr=.. penalty_sqrt_<f>x=.. penalty_linear_<f>x=.. ...

Results go to ``bench/results/denoise_batch_penalty.{json,md}``.

    .venv/bin/python bench/denoise_batch_penalty.py         # 2x, 4x, 8x, 16x; seeds 0 and 1
    .venv/bin/python bench/denoise_batch_penalty.py --smoke # tiny: every code path (CI)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Run as a script (``bench/`` is not a package): the repository root for ``tuner`` /
# ``workers``, and ``bench/`` itself for the shared helpers in ``common.py``.
_HERE = Path(__file__).resolve().parent
for _path in (str(_HERE.parent), str(_HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from common import RESULTS_DIR, machine_info, markdown_table, publish  # noqa: E402

TASK = "denoise"


def _schedule(batch: int, epochs: int, rule: str, warmup_epochs: float) -> Any:
    """The step-decay skeleton at ``batch``, its LR the task's base LR scaled by ``rule``
    from the base batch; a warm-up starts from the base LR."""
    from tuner.baselines import DECAY_FACTOR, skeleton
    from tuner.schedule import Schedule, Stage
    from workers.tasks import get_task

    task = get_task(TASK)
    opt = task.default_optimizer
    stages = tuple(
        Stage(
            start,
            end,
            batch,
            lr_multiplier=1.0 / DECAY_FACTOR**i,
            warmup_epochs=min(warmup_epochs, float(end - start)) if i == 0 else 0.0,
        )
        for i, (start, end) in enumerate(skeleton(epochs))
    )
    return Schedule(
        stages=stages,
        base_lr=task.default_base_lr,
        base_batch_size=task.default_base_batch_size,
        scaling_rule=rule,  # type: ignore[arg-type]
        optimizer=opt.name,
        momentum=opt.momentum,
        weight_decay=opt.weight_decay,
    )


def train(
    batch: int, epochs: int, rule: str, seed: int, options: dict[str, Any], warmup: float = 0.0
) -> dict[str, Any]:
    """One run through the trial loop: per-epoch val PSNR and training time."""
    from workers.gang import WorkerContext
    from workers.loop import TrialWorker

    schedule = _schedule(batch, epochs, rule, warmup)
    worker = TrialWorker(WorkerContext(0, 1, "cpu", "gloo", 1.0))
    worker.configure(
        {
            "schedule": schedule.to_dict(),
            "task": TASK,
            "task_options": options,
            "seed": seed,
        }
    )
    psnr: list[float | None] = []
    times: list[float] = []
    started = time.perf_counter()
    for epoch in range(epochs):
        result = worker.train_epoch(epoch)
        psnr.append(result["val_psnr"])
        times.append(result["epoch_time_s"])
        if result["diverged"]:
            break
    return {
        "batch": batch,
        "peak_lr": schedule.peak_lr(0),
        "scaling_rule": rule,
        "warmup_epochs": warmup,
        "seed": seed,
        "val_psnr": psnr,
        "final_val_psnr": psnr[-1] if len(psnr) == epochs else None,
        "epoch_time_s": times,
        "wall_time_s": time.perf_counter() - started,
    }


def _fmt(value: float | None, digits: int = 2) -> str:
    return "diverged" if value is None else f"{value:.{digits}f}"


def _markdown(data: dict[str, Any]) -> str:
    rows = []
    for row in data["rows"]:
        finals = row["final_val_psnr"]
        shown = ", ".join(_fmt(v) for v in finals)
        rows.append(
            [
                row["label"],
                str(row["batch"]),
                f"{row['lr']:g}",
                shown,
                _fmt(row["mean"]),
                "-" if row["penalty"] is None else f"{row['penalty']:.2f}",
            ]
        )
    base = data["base_run"]
    machine = data["machine"]
    where = (
        f"{machine['cpu_count']} CPUs ({machine['processor']}), torch {machine['torch']}, "
        f"one thread per run, load average {machine['load_avg_1_5_15']}"
    )
    per_epoch = " ".join(_fmt(v) for v in base["val_psnr"])
    mean_time = statistics.fmean(base["epoch_time_s"])
    return (
        f"# denoise: large-batch penalty at {data['epochs']} epochs\n\n"
        f"Options {data['options'] or 'default'}; the noisy input scores "
        f"{data['noisy_psnr']:.2f} dB. Machine: {where}.\n\n"
        + markdown_table(
            ["run", "batch", "peak LR", "final val PSNR per seed (dB)", "mean", "penalty (dB)"],
            rows,
        )
        + f"\nBase run (seed {base['seed']}), val PSNR after each epoch: {per_epoch}; "
        f"{mean_time:.2f} s of training per epoch.\n"
    )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--factors", default="2,4,8,16", help="multiples of the base batch")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=None, help="default: the task's")
    parser.add_argument("--smoke", action="store_true", help="tiny data and epochs (CI)")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    args = parser.parse_args(argv)

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(args)
    finally:
        torch.set_num_threads(threads)


def _measure(args: argparse.Namespace) -> dict[str, Any]:
    from torch import nn

    from workers.tasks import evaluate_metrics, get_task, load_tensors

    task = get_task(TASK)
    options: dict[str, Any] = {}
    epochs = args.epochs or task.default_epochs
    factors = [int(f) for f in args.factors.split(",")]
    if args.smoke:
        options = {"num_train_patches": 128, "patch_size": 16, "depth": 3, "width": 8}
        epochs, factors, args.seeds = 2, [2], 1
    base_batch, base_lr = task.default_base_batch_size, task.default_base_lr
    data = load_tensors(task, options, seed=0)
    noisy = evaluate_metrics(task, nn.Identity(), data.val_x, data.val_y)["val_psnr"]

    runs: list[tuple[str, int, str, float, float]] = [("base", base_batch, "linear", base_lr, 0)]
    for f in factors:
        runs.append((f"{f}x sqrt", f * base_batch, "sqrt", base_lr * f**0.5, 0.0))
        runs.append((f"{f}x linear + warm-up", f * base_batch, "linear", base_lr * f, 1.0))
    rows: list[dict[str, Any]] = []
    base_run: dict[str, Any] = {}
    base_mean: float | None = None
    for label, batch, rule, lr, warmup in runs:
        results = [train(batch, epochs, rule, seed, options, warmup) for seed in range(args.seeds)]
        finals = [r["final_val_psnr"] for r in results]
        done = [v for v in finals if v is not None]
        mean = statistics.fmean(done) if done else None
        if label == "base":
            base_run, base_mean = results[0], mean
        penalty = None if mean is None or base_mean is None else base_mean - mean
        rows.append(
            {
                "label": label,
                "batch": batch,
                "lr": lr,
                "final_val_psnr": finals,
                "mean": mean,
                "penalty": penalty,
                "runs": results,
            }
        )
        print(f"{label}: batch {batch}, LR {lr:g}: {[_fmt(v) for v in finals]}", flush=True)
    parts = [f"base_psnr={_fmt(base_mean)}"]
    for row in rows[1:]:
        kind = "sqrt" if "sqrt" in row["label"] else "linear"
        factor = row["batch"] // base_batch
        parts.append(f"penalty_{kind}_{factor}x={_fmt(row['penalty'])}")
    data_out = {
        "task": TASK,
        "options": options,
        "epochs": epochs,
        "noisy_psnr": noisy,
        "machine": machine_info(),
        "rows": rows,
        "base_run": base_run,
        "summary_line": "denoise_batch_penalty " + " ".join(parts),
    }
    stem = "denoise_batch_penalty_smoke" if args.smoke else "denoise_batch_penalty"
    return publish(args.results_dir, stem, data_out, _markdown)


if __name__ == "__main__":
    main()
