"""Per-trial overhead: worker reuse (stagetune's trainable) against a Ray Train run per trial.

Runs K short trials of the same schedule on the same tiny task, twice, in one Ray session:

* **reuse**: ``workers.trainable.ScheduleTrainable`` under a Ray Tune ``Tuner`` with
  ``TuneConfig(reuse_actors=True)``: one gang of 2 worker processes (gloo process group, cached
  task data) trains every trial; a new trial only re-initialises model, optimizer and RNGs.
* **torchtrainer**: one ``ray.train.torch.TorchTrainer(...).fit()`` per trial (2 CPU workers,
  gloo): every trial starts fresh worker processes, a process group, and loads the data.

Both run the same per-worker training code (``workers.loop.TrialWorker``), so the time inside
the training loop (measured the same way on both sides, in rank 0: each epoch's training steps
and validation, ``epoch_time_s + eval_time_s``) is comparable;
everything else a trial costs is *non-training time* = wall - training. For the reuse path a
trial's wall time is the time between consecutive trial completions seen by the driver (the
first one also pays for Tune's start and the gang's creation); for TorchTrainer it is the
``fit()`` call. The summary uses medians over the trials after the first and ends with::

    overhead_per_trial_s=X baseline_per_trial_s=Y ratio=Z fork_s_max=F \\
        start_pooled_s=P start_fresh_s=S

(X: reuse, Y: TorchTrainer, Z = Y / X; F: the costliest fork; P and S: the non-training time of
the first trial of a later Tune experiment in the same driver, on the gang the driver's gang
pool kept from the first experiment, and on a gang started anew; one line in the output.)
``--perf-split`` adds a comparison of the equal and the performance-aware split with one worker
artificially slowed down. ``--smoke`` is a tiny run for CI. Results go to
``bench/results/trial_overhead.{json,md}`` (full runs) or to ``--results-dir``.

    .venv/bin/python bench/trial_overhead.py            # full: 5 trials each, + nothing else
    .venv/bin/python bench/trial_overhead.py --perf-split
    .venv/bin/python bench/trial_overhead.py --smoke
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def _schedule_dict(epochs: int) -> dict[str, Any]:
    from tuner.schedule import Schedule, Stage

    if epochs == 1:
        return Schedule.constant(64, 1, 0.05, base_batch_size=32).to_dict()
    split = max(1, epochs // 3)
    return Schedule(
        stages=(Stage(0, split, 32), Stage(split, epochs, 128, warmup_epochs=0.5)),
        base_lr=0.05,
        base_batch_size=32,
        scaling_rule="sqrt",
    ).to_dict()


def _trial_config(task: str, epochs: int, seed: int) -> dict[str, Any]:
    return {
        "schedule": _schedule_dict(epochs),
        "task": task,
        "task_options": {},
        "seed": seed,
        "workers": 2,
        "cpus_per_worker": 1.0,
        "gpus_per_worker": 0.0,
        "micro_batch": None,
        "performance_aware": False,
    }


# ------------------------------------------------------------------------------------------
# reuse: the trainable under Ray Tune


def run_reuse(
    task: str, epochs: int, trials: int, storage: str, name: str = "reuse"
) -> tuple[list[dict[str, float]], tuple[int, ...]]:
    """One Tune experiment of ``trials`` trials; per trial its wall, training and non-training
    seconds, and the pids of the worker processes that trained them all."""
    from ray import tune

    completions: dict[str, float] = {}

    class Timer(tune.Callback):
        def on_trial_complete(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
            completions[trial.trial_id] = time.perf_counter()

    from workers.trainable import ScheduleTrainable

    base = _trial_config(task, epochs, 0)
    base["seed"] = tune.grid_search(list(range(trials)))
    tuner = tune.Tuner(
        ScheduleTrainable,
        param_space=base,
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=1),
        run_config=tune.RunConfig(
            storage_path=storage,
            name=name,
            verbose=0,
            callbacks=[Timer()],
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
        ),
    )
    started = time.perf_counter()
    grid = tuner.fit()
    if grid.num_errors:
        raise RuntimeError(f"reuse run: {grid.num_errors} trials failed: {grid.errors}")
    rows: list[dict[str, Any]] = []
    for i in range(len(grid)):
        result = grid[i]
        frame = result.metrics_dataframe
        if frame is None:
            raise RuntimeError("a trial reported no metrics")
        if result.metrics is None:
            raise RuntimeError("a trial reported no metrics")
        trial_id = str(result.metrics["trial_id"])
        rows.append(
            {
                "completed": completions[trial_id],
                "training_s": float((frame["epoch_time_s"] + frame["eval_time_s"]).sum()),
                "pids": tuple(frame["worker_pids"].iloc[0]),
                "val_accuracy": float(frame["val_accuracy"].iloc[-1]),
            }
        )
    rows.sort(key=lambda r: r["completed"])
    print(f"{name}: {len(rows)} trials in {time.perf_counter() - started:.2f} s")
    out: list[dict[str, float]] = []
    previous = started
    for row in rows:
        wall = row["completed"] - previous
        previous = row["completed"]
        out.append(
            {
                "wall_s": wall,
                "training_s": row["training_s"],
                "non_training_s": wall - row["training_s"],
                "val_accuracy": row["val_accuracy"],
            }
        )
    if len({row["pids"] for row in rows}) != 1:
        raise RuntimeError("worker processes were not reused across trials")
    return out, rows[0]["pids"]


def run_experiment_starts(
    task: str, epochs: int, storage: str, first_pids: tuple[int, ...]
) -> dict[str, Any]:
    """What the first trial of a later experiment in the same driver costs (a study's seed
    runs, the dispatcher's next study): once with the gang the previous experiment gave back
    to the driver's gang pool (``workers.gang_pool``), once with the pool killed first, so
    that the trial starts its gang's processes anew. One trial each; the previous
    experiment's gang must be the one the pooled start trains on."""
    from workers.gang_pool import IDLE_ENV, close_driver_pool

    pooled, pooled_pids = run_reuse(task, epochs, 1, storage, name="reuse-pooled-start")
    if pooled_pids != first_pids:
        raise RuntimeError(
            f"the later experiment trained on new workers {pooled_pids}, not on the pooled "
            f"gang {first_pids} (is the gang pool off: {IDLE_ENV}=0?)"
        )
    close_driver_pool()
    fresh, fresh_pids = run_reuse(task, epochs, 1, storage, name="reuse-fresh-start")
    if set(fresh_pids) & set(first_pids):
        raise RuntimeError(f"the pool's gang {first_pids} outlived the pool")
    return {
        "pooled": pooled[0],
        "fresh": fresh[0],
        "pooled_pids": list(pooled_pids),
        "fresh_pids": list(fresh_pids),
    }


# ------------------------------------------------------------------------------------------
# baseline: one TorchTrainer per trial


def _torch_train_fn(config: dict[str, Any]) -> None:
    import ray.train
    import torch.distributed as dist

    from workers.gang import WorkerContext
    from workers.loop import TrialWorker

    context = ray.train.get_context()
    worker = TrialWorker(
        WorkerContext(
            rank=context.get_world_rank(),
            world_size=context.get_world_size(),
            device="cpu",
            backend=dist.get_backend(),
            cpus=1.0,
        )
    )
    worker.configure(config)
    training = 0.0
    epochs = int(config["schedule"]["stages"][-1]["end_epoch"])
    accuracy = 0.0
    for epoch in range(epochs):
        result = worker.train_epoch(epoch)
        training += result["epoch_time_s"] + result["eval_time_s"]
        accuracy = float(result["val_accuracy"])
        ray.train.report({"epoch": epoch, "val_accuracy": accuracy})
    if context.get_world_rank() == 0:
        # Ray Train v2 keeps only metrics attached to checkpoints; a checkpoint would add I/O
        # the reuse path does not pay, so the timing goes out through a file instead.
        Path(config["_timing_file"]).write_text(
            json.dumps({"training_s": training, "val_accuracy": accuracy})
        )


def run_torchtrainer(task: str, epochs: int, trials: int, storage: str) -> list[dict[str, float]]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    out: list[dict[str, float]] = []
    for seed in range(trials):
        timing_file = Path(storage) / f"torchtrainer-{seed}.json"
        config = _trial_config(task, epochs, seed)
        config["_timing_file"] = str(timing_file)
        trainer = TorchTrainer(
            _torch_train_fn,
            train_loop_config=config,
            torch_config=TorchConfig(backend="gloo"),
            scaling_config=ScalingConfig(
                num_workers=2, use_gpu=False, resources_per_worker={"CPU": 1}
            ),
            run_config=RunConfig(storage_path=storage, name=f"torchtrainer-{seed}"),
        )
        started = time.perf_counter()
        result = trainer.fit()
        wall = time.perf_counter() - started
        if result.error is not None:
            raise RuntimeError(f"TorchTrainer trial {seed} failed: {result.error}")
        timing = json.loads(timing_file.read_text())
        training = float(timing["training_s"])
        out.append(
            {
                "wall_s": wall,
                "training_s": training,
                "non_training_s": wall - training,
                "val_accuracy": float(timing["val_accuracy"]),
            }
        )
        print(f"torchtrainer trial {seed}: wall {wall:.2f} s, training {training:.2f} s")
    return out


# ------------------------------------------------------------------------------------------
# performance-aware split with one slowed-down worker


def run_perf_split(epochs: int, slowdown: float) -> dict[str, Any]:
    from tuner.schedule import Schedule
    from workers.trainable import ScheduleTrainable

    schedule = Schedule.constant(256, epochs, 0.1).to_dict()
    out: dict[str, Any] = {"slowdown": {"1": slowdown}, "epochs": epochs}
    trainable: ScheduleTrainable | None = None
    try:
        for aware in (False, True):
            config = {
                "schedule": schedule,
                "task": "digits",
                "task_options": {"hidden_dim": 1024, "num_hidden_layers": 2},
                "seed": 0,
                "workers": 2,
                "slowdown": {"1": slowdown},
                "performance_aware": aware,
            }
            if trainable is None:
                trainable = ScheduleTrainable(config)
            else:
                trainable.reset_config(config)
            results = [trainable.step() for _ in range(epochs)]
            out["aware" if aware else "equal"] = {
                "epoch_time_s": [r["epoch_time_s"] for r in results],
                "local_batches": [r["local_batches"] for r in results],
                "worker_compute_s": [r["worker_compute_s"] for r in results],
                "val_accuracy": results[-1]["val_accuracy"],
            }
    finally:
        if trainable is not None:
            trainable.stop()
    equal = statistics.median(out["equal"]["epoch_time_s"][1:] or out["equal"]["epoch_time_s"])
    aware_t = statistics.median(out["aware"]["epoch_time_s"][1:] or out["aware"]["epoch_time_s"])
    out["median_epoch_time_equal_s"] = equal
    out["median_epoch_time_aware_s"] = aware_t
    out["speedup"] = equal / aware_t
    return out


FORK_ROUNDS = 5


def run_fork_cost(tasks: list[str], workdir: str) -> list[dict[str, Any]]:
    """What a fork costs on each task's model (2 gloo workers): saving the whole trial state
    at a stage boundary (every rank's state, pickled, written to the prefix store) and
    loading it into the next trial's workers. ``cifar10`` runs on synthetic CIFAR-size files
    (its ResNet-20 is the largest built-in CPU model)."""
    from tuner.schedule import Schedule, Stage
    from workers.trainable import ScheduleTrainable

    def config(task: str, options: dict[str, Any], store: str, second: int) -> dict[str, Any]:
        schedule = Schedule(
            stages=(Stage(0, 1, 64), Stage(1, 2, second)), base_lr=0.05, base_batch_size=64
        )
        return {
            "schedule": schedule.to_dict(),
            "task": task,
            "task_options": options,
            "seed": 0,
            "workers": 2,
            "prefix_store": store,
        }

    rows: list[dict[str, Any]] = []
    for task in tasks:
        options: dict[str, Any] = {}
        if task == "cifar10":
            options = {"data_dir": "cifar-fork", "max_train_samples": 512, "num_val_samples": 64}
        store = Path(workdir) / f"prefixes-{task}"
        saves: list[float] = []
        loads: list[float] = []
        trainable = ScheduleTrainable(config(task, options, str(store), 128))
        try:
            # The first round pays for imports and data loading; the median of the rest
            # passes over the odd 0.2 s stall of a Ray actor call.
            for _ in range(1 + FORK_ROUNDS):
                for state in store.glob("*.state"):
                    state.unlink()
                trainable.reset_config(config(task, options, str(store), 128))
                trainable.step()  # epoch 1 ends at the stage boundary: the state is saved
                assert trainable.prefix_save_s is not None
                saves.append(trainable.prefix_save_s)
                trainable.reset_config(config(task, options, str(store), 256))  # forks
                assert trainable.fork_load_s is not None
                loads.append(trainable.fork_load_s)
            size = sum(p.stat().st_size for p in store.glob("*.state"))
        finally:
            trainable.stop()
        save = statistics.median(saves[1:])
        load = statistics.median(loads[1:])
        rows.append(
            {
                "task": task,
                "state_bytes": size,
                "save_s": saves,
                "load_s": loads,
                "save_median_s": save,
                "load_median_s": load,
                "fork_s": save + load,
            }
        )
    return rows


# ------------------------------------------------------------------------------------------
# reporting


def _machine() -> dict[str, Any]:
    import ray
    import torch

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "description": f"{os.cpu_count()} cores CPU ({model or platform.processor()}), no GPU",
        "cpu_count": os.cpu_count(),
        "cpu_model": model,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "ray": ray.__version__,
        "load_average_at_start": list(os.getloadavg()),
    }


def _median_after_first(rows: list[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows[1:]] or [r[key] for r in rows]
    return float(statistics.median(values))


def _table(reuse: list[dict[str, float]], base: list[dict[str, float]]) -> str:
    lines = [
        "| trial | reuse wall s | reuse training s | reuse non-training s "
        "| TorchTrainer wall s | TorchTrainer training s | TorchTrainer non-training s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for i, (a, b) in enumerate(zip(reuse, base, strict=True)):
        lines.append(
            f"| {i} | {a['wall_s']:.2f} | {a['training_s']:.2f} | {a['non_training_s']:.2f} "
            f"| {b['wall_s']:.2f} | {b['training_s']:.2f} | {b['non_training_s']:.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--trials", type=int, default=5, help="trials per mode (default 5)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs per trial (default 3)")
    parser.add_argument("--task", default="digits", help="task name (default digits)")
    parser.add_argument("--smoke", action="store_true", help="tiny run: 2 trials of 1 epoch")
    parser.add_argument(
        "--perf-split",
        action="store_true",
        help="also compare the equal and the performance-aware split with a slowed worker",
    )
    parser.add_argument("--slowdown", type=float, default=4.0, help="rank 1's slowdown factor")
    parser.add_argument(
        "--fork-tasks",
        default="digits,mnist1d,synthetic,cifar10",
        help="tasks whose fork cost (save + load of a stage-boundary state) is measured",
    )
    parser.add_argument(
        "--results-dir",
        type=Path,
        default=None,
        help="where to write trial_overhead.{json,md} (default: bench/results for full runs, "
        "nothing for --smoke)",
    )
    args = parser.parse_args(argv)
    if args.smoke:
        args.trials, args.epochs = 2, 1
        args.fork_tasks = "digits"
    results_dir: Path | None = args.results_dir
    if results_dir is None and not args.smoke:
        results_dir = RESULTS_DIR

    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    logging.getLogger("ray").setLevel(logging.WARNING)
    import ray

    machine = _machine()
    fork_tasks = [t for t in args.fork_tasks.split(",") if t]
    with tempfile.TemporaryDirectory(prefix="stagetune-bench-") as storage:
        if "cifar10" in fork_tasks:
            # Worker processes inherit the datasets root from the driver's environment.
            from workers.tasks.cifar10 import write_synthetic_cifar10

            os.environ["STAGETUNE_DATASETS_DIR"] = storage
            write_synthetic_cifar10(Path(storage) / "cifar-fork", num_train=1024, num_test=64)
        ray.init(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
        try:
            reuse, reuse_pids = run_reuse(args.task, args.epochs, args.trials, storage)
            starts = run_experiment_starts(args.task, args.epochs, storage, reuse_pids)
            base = run_torchtrainer(args.task, args.epochs, args.trials, storage)
            perf = run_perf_split(max(args.epochs, 3), args.slowdown) if args.perf_split else None
            forks = run_fork_cost(fork_tasks, storage)
        finally:
            ray.shutdown()
    machine["load_average_at_end"] = list(os.getloadavg())

    overhead = _median_after_first(reuse, "non_training_s")
    baseline = _median_after_first(base, "non_training_s")
    ratio = baseline / overhead if overhead > 0 else float("inf")
    table = _table(reuse, base)
    print(f"machine: {machine['description']}; load average {machine['load_average_at_start']}")
    print(f"{args.trials} trials of {args.epochs} epochs of {args.task!r}, 2 workers (gloo)")
    print(table)
    starts_line = (
        f"first trial of a later experiment in the same driver: "
        f"{starts['pooled']['non_training_s']:.2f} s non-training with the pooled gang, "
        f"{starts['fresh']['non_training_s']:.2f} s with its processes started anew "
        f"(the session's first trial: {reuse[0]['non_training_s']:.2f} s)"
    )
    print(starts_line)
    if perf is not None:
        print(
            f"perf split (rank 1 slowed {args.slowdown:g}x): median epoch "
            f"{perf['median_epoch_time_equal_s']:.3f} s equal vs "
            f"{perf['median_epoch_time_aware_s']:.3f} s performance-aware "
            f"(speed-up {perf['speedup']:.2f}x); local batches "
            f"{perf['aware']['local_batches']}"
        )
    fork_table = "\n".join(
        [
            "| task | state MB | save s (median) | load s (median) | fork s |",
            "|---|---:|---:|---:|---:|",
            *(
                f"| {f['task']} | {f['state_bytes'] / 2**20:.2f} | {f['save_median_s']:.3f} "
                f"| {f['load_median_s']:.3f} | {f['fork_s']:.3f} |"
                for f in forks
            ),
        ]
    )
    print(fork_table)
    fork_max = max(f["fork_s"] for f in forks)
    summary = (
        f"overhead_per_trial_s={overhead:.3f} baseline_per_trial_s={baseline:.3f} ratio={ratio:.1f}"
        f" fork_s_max={fork_max:.3f}"
        f" start_pooled_s={starts['pooled']['non_training_s']:.2f}"
        f" start_fresh_s={starts['fresh']['non_training_s']:.2f}"
    )
    if results_dir is not None:
        results_dir.mkdir(parents=True, exist_ok=True)
        payload = {
            "machine": machine,
            "task": args.task,
            "epochs": args.epochs,
            "trials": args.trials,
            "reuse": reuse,
            "torchtrainer": base,
            "overhead_per_trial_s": overhead,
            "baseline_per_trial_s": baseline,
            "ratio": ratio,
            "experiment_starts": starts,
            "perf_split": perf,
            "forks": forks,
            "fork_s_max": fork_max,
        }
        (results_dir / "trial_overhead.json").write_text(json.dumps(payload, indent=2) + "\n")
        md = [
            "# Per-trial overhead: worker reuse vs a TorchTrainer per trial",
            "",
            f"Machine: {machine['description']}; {machine['platform']}; torch "
            f"{machine['torch']}, ray {machine['ray']}. Load average (1/5/15 min) at start "
            f"{machine['load_average_at_start']}, at end {machine['load_average_at_end']} "
            "(the machine is shared).",
            "",
            f"{args.trials} trials of {args.epochs} epochs of `{args.task}`, 2 workers (gloo), "
            "same per-worker training code in both. Non-training = wall - time inside the "
            "training loop. Command: `.venv/bin/python bench/trial_overhead.py"
            + (" --perf-split" if perf is not None else "")
            + "`.",
            "",
            table,
            "",
            "Experiment start: a study runs several Tune experiments (its search, then its "
            "finalists' seed runs) and a dispatcher runs study after study; Tune reuses a gang "
            "only inside one. The first trial of a later experiment in the same driver (1 "
            "trial, same schedule), once on the gang the first experiment gave back to the "
            "driver's gang pool (the same worker pids), once with the pool killed first, so "
            "that its worker processes start anew:",
            "",
            "| first trial of | wall s | training s | non-training s |",
            "|---|---:|---:|---:|",
            *(
                f"| {label} | {row['wall_s']:.2f} | {row['training_s']:.2f} "
                f"| {row['non_training_s']:.2f} |"
                for label, row in (
                    ("the session (table above, trial 0)", reuse[0]),
                    ("a later experiment, pooled gang", starts["pooled"]),
                    ("a later experiment, gang started anew", starts["fresh"]),
                )
            ),
            "",
        ]
        if perf is not None:
            md += [
                f"Performance-aware split, rank 1 slowed down {args.slowdown:g}x (sleeps "
                f"{args.slowdown - 1:g}x its compute time), digits MLP 1024x2, batch 256: median "
                f"epoch {perf['median_epoch_time_equal_s']:.3f} s with the equal split, "
                f"{perf['median_epoch_time_aware_s']:.3f} s performance-aware "
                f"(speed-up {perf['speedup']:.2f}x); local batches per epoch "
                f"{perf['aware']['local_batches']}.",
                "",
            ]
        md += [
            "Fork cost (target < 0.2 s): saving a trial's whole state at a stage boundary "
            "(every rank's model, optimizer, RNGs and counters, pickled into the prefix store) "
            "and loading it into the next trial's 2 workers (rank 0's state goes through Ray's "
            f"object store once); medians of {FORK_ROUNDS} rounds after a warm-up round. "
            "cifar10 is ResNet-20 on synthetic CIFAR-size files.",
            "",
            fork_table,
            "",
        ]
        md += ["```", summary, "```", ""]
        (results_dir / "trial_overhead.md").write_text("\n".join(md))
    print(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
