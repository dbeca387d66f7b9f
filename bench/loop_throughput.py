"""CPU throughput: the trial loop against the plainest PyTorch loop for the same model and batch.

A trial is real training, so its loop must not be much slower than the loop a user would write
by hand. On the CPU (the task's model, data in memory, the same batch, seed and thread count):

* **1 worker.** The trial loop is :class:`workers.loop.TrialWorker`, the code every trial
  runs, in this process (one rank, no process group) on a one-stage schedule per batch size;
  an epoch's samples/s counts its training steps only (the loop's clock stops before
  validation). The plain loop: the same model and SGD, each step's samples indexed from the
  in-memory tensors, ``cross_entropy`` + ``backward`` + ``step`` + ``zero_grad``, nothing else.
  Two more plain variants price what the trial loop adds per step: ``+ LR`` sets the
  optimizer's LR before every step (the schedule's warm-up and decay), ``+ noise`` also
  measures the gradient's squared norm and reads it back to Python (what the noise-scale
  estimate and the divergence check need: one host synchronisation per step).
* **2 workers.** The trial loop on a gang of 2 Ray actors (gloo, one flat-buffer all-reduce per
  step) against plain ``DistributedDataParallel`` in 2 processes started with
  ``torch.multiprocessing`` (gloo, the same global batch split in halves); 1 thread per
  worker on both sides.

Each measurement is the median samples/s of ``--epochs`` epochs after one warm-up epoch.

The summary line::

    loop_throughput task=.. ratio_1w_at_<b>=.. ratio_2w_at_<b>=.. noise_cost_pct=.. lr_cost_pct=..

(the largest batch's ratios; the costs are the plain loop's slowdown from the LR setting and
from the noise-scale measurement, in percent, at the smallest batch where they weigh most).
Results go to ``bench/results/loop_throughput.{json,md}``.

    .venv/bin/python bench/loop_throughput.py            # mnist1d, batches 32,128,512
    .venv/bin/python bench/loop_throughput.py --smoke    # CI: tiny sizes, every code path
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Run as a script (``bench/`` is not a package): the repository root for ``tuner`` /
# ``workers``, and ``bench/`` itself for the shared helpers in ``common.py``.
_HERE = Path(__file__).resolve().parent
for _path in (str(_HERE.parent), str(_HERE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

from common import RESULTS_DIR, machine_info, markdown_table, publish  # noqa: E402
from plain_ddp import plain_ddp, plain_setup  # noqa: E402

TARGET = 0.9


def _schedule(batch: int, epochs: int) -> Any:
    from tuner.schedule import Schedule, Stage

    return Schedule(stages=(Stage(0, epochs, batch),), base_lr=0.05, base_batch_size=batch)


def _config(
    task: str, options: dict[str, Any], batch: int, epochs: int, workers: int
) -> dict[str, Any]:
    return {
        "schedule": _schedule(batch, epochs).to_dict(),
        "task": task,
        "task_options": options,
        "seed": 0,
        "workers": workers,
        "cpus_per_worker": 1.0,
    }


def trial_loop_1w(task: str, options: dict[str, Any], batch: int, epochs: int) -> list[float]:
    """Samples/s of each epoch of :class:`TrialWorker` on one rank, in this process."""
    from workers.gang import WorkerContext
    from workers.loop import TrialWorker

    worker = TrialWorker(WorkerContext(0, 1, "cpu", "gloo", 1.0))
    worker.configure(_config(task, options, batch, epochs + 1, 1))
    return [float(worker.train_epoch(e)["samples_per_s"]) for e in range(epochs + 1)][1:]


def trial_loop_2w(task: str, options: dict[str, Any], batch: int, epochs: int) -> list[float]:
    """Samples/s (over both workers) of each epoch of a gang of 2 Ray actors."""
    from workers.gang import Gang
    from workers.loop import TrialWorker

    gang = Gang(2, TrialWorker, cpus_per_worker=1.0)
    try:
        gang.call("configure", _config(task, options, batch, epochs + 1, 2))
        out = []
        for e in range(epochs + 1):
            results = gang.call("train_epoch", e)
            # Each rank's epoch clock covers the same synchronised steps; the slower one counts.
            seconds = max(float(r["epoch_time_s"]) for r in results)
            samples = int(results[0]["steps_in_epoch"]) * batch
            out.append(samples / seconds)
        return out[1:]
    finally:
        gang.shutdown()


def plain_loop(
    task_name: str, options: dict[str, Any], batch: int, epochs: int, variant: str
) -> list[float]:
    """Samples/s per epoch of the plainest loop; ``variant``: ``plain``, ``lr`` (sets the LR
    before every step) or ``noise`` (that, plus the gradient's squared norm read back)."""
    import torch
    from torch.nn import functional as F  # noqa: N812

    task, opts, data = plain_setup(task_name, options)
    torch.manual_seed(0)
    model = task.build_model(opts)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.SGD(params, lr=0.05, momentum=0.9)
    n = data.num_train
    steps = n // batch
    generator = torch.Generator().manual_seed(1)
    out = []
    for epoch in range(epochs + 1):
        perm = torch.randperm(n, generator=generator)
        started = time.perf_counter()
        for k in range(steps):
            idx = perm[k * batch : (k + 1) * batch]
            loss = F.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
            torch.autograd.backward(loss)
            if variant in ("lr", "noise"):
                for group in optimizer.param_groups:
                    group["lr"] = 0.05 * (1.0 - (epoch + k / steps) / (epochs + 1))
            if variant == "noise":
                norm = sum(p.grad.square().sum() for p in params if p.grad is not None)
                float(torch.stack([loss.detach(), torch.as_tensor(norm)]).sum())
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        out.append(steps * batch / (time.perf_counter() - started))
    return out[1:]


def _median(values: Sequence[float]) -> float:
    return float(statistics.median(values))


def _markdown(data: dict[str, Any]) -> str:
    cfg = data["config"]
    rows = []
    for r in data["rows"]:
        rows.append(
            [
                str(r["batch"]),
                f"{r['loop_1w']:,.0f}",
                f"{r['plain']:,.0f}",
                f"{r['plain_lr']:,.0f}",
                f"{r['plain_noise']:,.0f}",
                f"{r['ratio_1w']:.2f}",
                "-" if r.get("loop_2w") is None else f"{r['loop_2w']:,.0f}",
                "-" if r.get("ddp_2w") is None else f"{r['ddp_2w']:,.0f}",
                "-" if r.get("ratio_2w") is None else f"{r['ratio_2w']:.2f}",
            ]
        )
    out = [
        f"# Loop throughput on the CPU: {cfg['task']} (training samples/s)\n\n",
        f"{cfg['task']} with {cfg['train']:,} training samples, one-stage schedules, median of "
        f"{cfg['epochs']} epochs after a warm-up epoch; 1 thread per worker. `plain + LR` and "
        "`plain + noise` are the plain loop with the trial loop's per-step LR setting, and "
        "also its squared-gradient-norm read-back (noise scale, divergence check).\n\n",
        markdown_table(
            [
                "batch",
                "trial loop, 1 worker",
                "plain",
                "plain + LR",
                "plain + noise",
                "loop / plain",
                "trial loop, 2 workers",
                "plain DDP, 2 workers",
                "loop / DDP",
            ],
            rows,
        ),
        "\n",
    ]
    for key, value in data["targets"].items():
        out.append(f"- {key}: {'met' if value['met'] else 'NOT met'} ({value['detail']})\n")
    out.append(f"\nMachine: {data['machine']}\n\n```\n{data['summary_line']}\n```\n")
    return "".join(out)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--task", default="mnist1d")
    parser.add_argument("--batches", default="32,128,512")
    parser.add_argument("--epochs", type=int, default=3, help="measured epochs (after 1 warm-up)")
    parser.add_argument("--train", type=int, default=20_000, help="training samples")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, 1-worker runs")
    parser.add_argument("--no-ddp", action="store_true", help="skip the 2-worker comparison")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, every code path")
    args = parser.parse_args(argv)
    stem = "loop_throughput"
    if args.smoke:
        stem = "loop_throughput_smoke"
        args.batches, args.epochs, args.train = "32,64", 1, 1000
    import torch

    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    options = {"num_train_samples": args.train, "num_val_samples": 200, "num_test_samples": 200}
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    for batch in batches:
        row: dict[str, Any] = {"batch": batch}
        row["loop_1w"] = _median(trial_loop_1w(args.task, options, batch, args.epochs))
        for variant in ("plain", "lr", "noise"):
            key = "plain" if variant == "plain" else f"plain_{variant}"
            row[key] = _median(plain_loop(args.task, options, batch, args.epochs, variant))
        row["ratio_1w"] = row["loop_1w"] / row["plain"]
        if not args.no_ddp:
            from common import ensure_ray

            ensure_ray()
            row["loop_2w"] = _median(trial_loop_2w(args.task, options, batch, args.epochs))
            row["ddp_2w"] = _median(plain_ddp(args.task, options, batch, args.epochs))
            row["ratio_2w"] = row["loop_2w"] / row["ddp_2w"]
        print(
            f"batch {batch}: " + ", ".join(f"{k} {v:,.2f}" for k, v in row.items() if k != "batch"),
            flush=True,
        )
        rows.append(row)
    small, large = rows[0], rows[-1]
    lr_cost = 100 * (1 - small["plain_lr"] / small["plain"])
    noise_cost = 100 * (1 - small["plain_noise"] / small["plain_lr"])
    targets = {
        f"loop_at_least_{TARGET:g}_of_plain_1w": {
            "met": all(r["ratio_1w"] >= TARGET for r in rows),
            "detail": ", ".join(f"batch {r['batch']}: {r['ratio_1w']:.2f}" for r in rows),
        }
    }
    if not args.no_ddp:
        targets[f"loop_at_least_{TARGET:g}_of_ddp_2w"] = {
            "met": all(r["ratio_2w"] >= TARGET for r in rows),
            "detail": ", ".join(f"batch {r['batch']}: {r['ratio_2w']:.2f}" for r in rows),
        }
    line = (
        f"loop_throughput task={args.task} ratio_1w_at_{large['batch']}={large['ratio_1w']:.2f}"
        + ("" if args.no_ddp else f" ratio_2w_at_{large['batch']}={large['ratio_2w']:.2f}")
        + f" noise_cost_pct={noise_cost:.1f} lr_cost_pct={lr_cost:.1f}"
    )
    data: dict[str, Any] = {
        "config": {
            "task": args.task,
            "batches": batches,
            "epochs": args.epochs,
            "train": args.train,
            "threads": args.threads,
            "smoke": args.smoke,
        },
        "rows": rows,
        "costs_at_smallest_batch_pct": {"lr": lr_cost, "noise": noise_cost},
        "targets": targets,
        "machine": machine_info(),
        "wall_time_s": time.perf_counter() - started,
        "summary_line": line,
    }
    return publish(args.results_dir, stem, data, _markdown)


if __name__ == "__main__":
    main()
