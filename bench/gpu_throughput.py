"""GPU throughput: the trial loop against the plainest fast PyTorch loop, and trials sharing a GPU.

Two measurements, on one GPU (``--device cpu`` runs the same code on the CPU, for the smoke
test and for a look without a GPU):

* **loop vs plain.** CIFAR-size synthetic data (:func:`workers.tasks.cifar10.
  write_synthetic_cifar10`: 50,000 training images, 3x32x32, read through the ``cifar10`` task
  like the real set) and the task's ResNet-20. The *trial loop* is
  :class:`workers.loop.TrialWorker`, the code every trial runs, trained in this process (one
  rank, so no process group) on a schedule with one stage per batch size of ``--batches``
  (``--epochs-per-stage`` each); a stage's samples/s is that of its last epoch (training steps
  only: the epoch's clock stops before validation), so compilation and cuDNN's first calls
  are not counted. The *plain loop* is the fastest plain PyTorch loop for the same model, data
  and batch: data on the device, the same per-sample crop + flip on the device, bf16 autocast,
  channels-last, fused SGD, ``zero_grad(set_to_none=True)``, no host synchronisation inside the
  timed steps; it runs eagerly and with ``torch.compile`` (the better counts). Both sides run
  with and without ``torch.compile``; the trial loop's option is the trial config's
  ``compile`` key. Ratio = trial loop / best plain loop, per batch size.
* **shared GPU.** ``--share-trials`` short trials (ResNet-20, ``--share-epochs`` epochs on
  ``--share-train`` images, batch 128 then 256) run through Ray Tune with
  :class:`workers.trainable.ScheduleTrainable` (the engine's trainable, actors reused), once
  with one trial holding the GPU at a time (``gpus_per_worker: 1``) and once per sharing level
  ``k`` in ``--share`` (``gpus_per_worker: 1/k``, ``k`` trials at once). Trials per hour =
  trials / wall time of the whole ``Tuner.fit()`` (actor start and data loading included).

The summary line::

    gpu_throughput device=.. loop_vs_plain_at_512=.. loop_samples_per_s_at_512=..
    plain_samples_per_s_at_512=.. best_sharing=k trials_per_hour_shared=.. trials_per_hour_alone=..

``--task tinylm`` / ``--task denoise`` run the loop-vs-plain part on the tasks of protocol v2
instead, at sizes a GPU is meant for (a 4-block Transformer of width 256 on 32,768 sequences of
128 bytes; the 17-layer, 64-channel DnCNN of Zhang et al. on 32,768 patches of 40 x 40 pixels):
their default optimizer (AdamW) on both sides (the plain loop's fused), their own loss, and
channels-last only for 4-D inputs. Their results go to ``gpu_throughput_<task>.{json,md}``.

Results go to ``bench/results/gpu_throughput.{json,md}`` (``--results-dir`` to change).

    python bench/gpu_throughput.py                 # on a machine with a CUDA GPU
    python bench/gpu_throughput.py --task tinylm --no-share
    python bench/gpu_throughput.py --smoke         # CI: CPU, tiny sizes, every code path
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DATA_NAME = "cifar10-synthetic"

#: Per task: the options of the full run and of the smoke run, the default batches, the option
#: that sets the training set's size (the shared-GPU trials cap it at ``--share-train``), and
#: what the data and model are (for the report). cifar10's data directory and training size
#: are set at run time.
TASKS: dict[str, dict[str, Any]] = {
    "cifar10": {
        "options": {},
        "smoke_options": {},
        "batches": "128,256,512",
        "data": "synthetic CIFAR-size images ({train:,} training, {val:,} validation), "
        "cifar10 task's ResNet-20 (width 16), SGD momentum 0.9",
    },
    "tinylm": {
        "options": {
            "seq_len": 128,
            "num_train_sequences": 32_768,
            "num_val_sequences": 1024,
            "num_test_sequences": 64,
            "width": 256,
            "num_layers": 4,
            "num_heads": 8,
        },
        "smoke_options": {
            "num_train_sequences": 384,
            "num_val_sequences": 64,
            "num_test_sequences": 16,
            "width": 32,
            "num_layers": 1,
        },
        "batches": "64,128,256",
        "train_size_option": "num_train_sequences",
        "data": "tinylm: byte-level LM on CPython's pydoc topics, 32,768 training sequences of "
        "128 bytes, a 4-block pre-LN Transformer (width 256, 8 heads, 3.2M parameters), AdamW",
    },
    "denoise": {
        "options": {"num_train_patches": 32_768, "patch_size": 40, "depth": 17, "width": 64},
        "smoke_options": {"num_train_patches": 384, "depth": 3, "width": 8},
        "batches": "32,64,128",
        "train_size_option": "num_train_patches",
        "data": "denoise: 32,768 grey 40 x 40 patches of scikit-learn's two photographs "
        "(sigma 25/255), the 17-layer DnCNN (64 channels, 0.56M parameters), AdamW",
    },
}


# ------------------------------------------------------------------------------------------
# data


@contextlib.contextmanager
def synthetic_cifar(num_train: int, num_test: int) -> Iterator[str]:
    """Write CIFAR-size synthetic data under a scratch datasets root; yield its relative path.

    Sets ``STAGETUNE_DATASETS_DIR`` for this process and the Ray workers it starts, and drops
    the cached settings on the way in and out (a process that read them before, a test session
    for one, would otherwise keep resolving paths against its old datasets root)."""
    from tuner.settings import get_settings
    from workers.tasks.cifar10 import write_synthetic_cifar10

    with tempfile.TemporaryDirectory(prefix="stagetune-gpu-bench-") as root:
        write_synthetic_cifar10(Path(root) / DATA_NAME, num_train, num_test, seed=0)
        old = os.environ.get("STAGETUNE_DATASETS_DIR")
        os.environ["STAGETUNE_DATASETS_DIR"] = root
        get_settings.cache_clear()
        try:
            yield DATA_NAME
        finally:
            if old is None:
                os.environ.pop("STAGETUNE_DATASETS_DIR", None)
            else:
                os.environ["STAGETUNE_DATASETS_DIR"] = old
            get_settings.cache_clear()


def _options(data_dir: str, num_val: int, max_train: int | None = None) -> dict[str, Any]:
    options: dict[str, Any] = {"data_dir": data_dir, "num_val_samples": num_val}
    if max_train is not None:
        options["max_train_samples"] = max_train
    return options


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ------------------------------------------------------------------------------------------
# the trial loop


def _schedule(task_name: str, stages: Sequence[Any], base_batch: int) -> Any:
    """The task's default LR and optimizer over these stages (square-root LR scaling for
    AdamW, linear for SGD)."""
    from tuner.schedule import Schedule
    from workers.tasks import get_task

    task = get_task(task_name)
    optimizer = task.default_optimizer
    return Schedule(
        stages=tuple(stages),
        base_lr=task.default_base_lr,
        base_batch_size=base_batch,
        scaling_rule="sqrt" if optimizer.name == "adamw" else "linear",
        optimizer=optimizer.name,
        momentum=optimizer.momentum,
        weight_decay=optimizer.weight_decay,
    )


def trial_loop(
    device_name: str,
    options: dict[str, Any],
    batches: Sequence[int],
    epochs_per_stage: int,
    compile_model: bool,
    task_name: str = "cifar10",
) -> dict[int, dict[str, Any]]:
    """Samples/s per stage (its last epoch) of :class:`TrialWorker` on one rank."""
    from tuner.schedule import Stage
    from workers.gang import WorkerContext
    from workers.loop import TrialWorker
    from workers.tasks import get_task

    stages = [
        Stage(i * epochs_per_stage, (i + 1) * epochs_per_stage, b) for i, b in enumerate(batches)
    ]
    schedule = _schedule(task_name, stages, batches[0])
    metric = get_task(task_name).primary_metric
    backend = "nccl" if device_name.startswith("cuda") else "gloo"
    worker = TrialWorker(WorkerContext(0, 1, device_name, backend, 1.0))
    info = worker.configure(
        {
            "schedule": schedule.to_dict(),
            "task": task_name,
            "task_options": options,
            "seed": 0,
            "compile": compile_model,
        }
    )
    out: dict[int, dict[str, Any]] = {}
    for epoch in range(schedule.total_epochs):
        r = worker.train_epoch(epoch)
        out[int(r["batch_size"])] = {
            "samples_per_s": float(r["samples_per_s"]),
            "epoch_time_s": float(r["epoch_time_s"]),
            "steps": int(r["steps_in_epoch"]),
            metric: float(r[metric]),
            "amp": bool(info["amp"]),
            "channels_last": bool(info["channels_last"]),
        }
    return out


# ------------------------------------------------------------------------------------------
# the plain loop


def plain_loop(
    device_name: str,
    options: dict[str, Any],
    batch: int,
    compile_model: bool,
    max_steps: int | None = None,
    task_name: str = "cifar10",
) -> dict[str, float]:
    """Samples/s of the plainest fast loop: one epoch of steps at ``batch`` after a warm-up."""
    import torch

    from workers.tasks import get_task, load_tensors

    device = torch.device(device_name)
    task = get_task(task_name)
    opts = task.validate_options(options)
    data = load_tensors(task, opts, 0).to(device)
    torch.manual_seed(0)
    cuda = device.type == "cuda"
    channels_last = cuda and data.train_x.dim() == 4
    model = task.build_model(opts).to(device)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if compile_model:
        model.compile()
    model.train()
    defaults = task.default_optimizer
    optimizer: torch.optim.Optimizer
    if defaults.name == "adamw":
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=task.default_base_lr,
            betas=(defaults.momentum, 0.999),
            weight_decay=defaults.weight_decay,
            fused=cuda or None,
        )
    else:
        optimizer = torch.optim.SGD(
            model.parameters(),
            lr=task.default_base_lr,
            momentum=defaults.momentum,
            weight_decay=defaults.weight_decay,
            fused=cuda or None,
        )
    generator = torch.Generator(device=device).manual_seed(1)
    n = data.num_train
    steps = n // batch
    if max_steps is not None:
        steps = min(steps, max_steps)
    perm = torch.randperm(n, device=device, generator=generator)
    autocast = (
        torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        if cuda
        else contextlib.nullcontext()
    )

    def step(k: int) -> None:
        idx = perm[(k % steps) * batch : (k % steps + 1) * batch]
        x = task.augment_batch(data.train_x[idx], generator)
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast:
            output = model(x)
        loss = task.loss(output.float(), data.train_y[idx]) / batch
        torch.autograd.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    for k in range(min(steps, 15)):  # warm-up: cuDNN's first calls, compilation
        step(k)
    _sync(device)
    started = time.perf_counter()
    for k in range(steps):
        step(k)
    _sync(device)
    elapsed = time.perf_counter() - started
    return {"samples_per_s": steps * batch / elapsed, "steps": steps, "time_s": elapsed}


# ------------------------------------------------------------------------------------------
# trials sharing one GPU


def shared_gpu(
    options: dict[str, Any],
    trials: int,
    epochs: int,
    sharing: int,
    gpus: float,
    storage: str,
    task_name: str = "cifar10",
    batches: tuple[int, int] = (128, 256),
) -> dict[str, Any]:
    """Run ``trials`` short trials through Ray Tune, ``sharing`` at once on ``gpus`` each."""
    from ray import tune

    from tuner.schedule import Stage
    from workers.tasks import get_task
    from workers.trainable import ScheduleTrainable

    split = max(1, epochs // 2)
    schedule = _schedule(
        task_name, (Stage(0, split, batches[0]), Stage(split, epochs, batches[1])), batches[0]
    )
    metric = get_task(task_name).primary_metric
    config: dict[str, Any] = {
        "schedule": schedule.to_dict(),
        "task": task_name,
        "task_options": options,
        "seed": tune.grid_search(list(range(trials))),
        "workers": 1,
        "cpus_per_worker": 1.0,
        "gpus_per_worker": gpus,
    }
    last: dict[str, float] = {}
    failed: list[str] = []

    class Record(tune.Callback):
        """Each trial's last value of the task's metric, and the trials that failed (read
        here, not from the result grid, which needs Tune's per-trial result files)."""

        def on_trial_result(
            self, iteration: int, trials: Any, trial: Any, result: dict[str, Any], **info: Any
        ) -> None:
            if result.get(metric) is not None:
                last[trial.trial_id] = float(result[metric])

        def on_trial_error(self, iteration: int, trials: Any, trial: Any, **info: Any) -> None:
            failed.append(trial.trial_id)

    tuner = tune.Tuner(
        ScheduleTrainable,
        param_space=config,
        tune_config=tune.TuneConfig(reuse_actors=True, max_concurrent_trials=sharing),
        run_config=tune.RunConfig(
            storage_path=storage,
            name=f"share-{sharing}",
            verbose=0,
            callbacks=[Record()],
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
        ),
    )
    started = time.perf_counter()
    tuner.fit()
    wall = time.perf_counter() - started
    if failed or len(last) != trials:
        raise RuntimeError(
            f"shared-GPU run ({sharing} at once): {len(failed)} trials failed, "
            f"{len(last)} of {trials} reported"
        )
    values = list(last.values())
    return {
        "sharing": sharing,
        "gpus_per_worker": gpus,
        "trials": trials,
        "epochs": epochs,
        "wall_time_s": wall,
        "trials_per_hour": trials / wall * 3600.0,
        "metric": metric,
        f"{metric}_mean": statistics.fmean(values) if values else None,
    }


# ------------------------------------------------------------------------------------------
# report


def _machine(device_name: str) -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = {
        "device": device_name,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    if device_name.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        info["cuda"] = torch.version.cuda
    with contextlib.suppress(OSError):
        info["load_avg_1_5_15"] = [round(v, 2) for v in os.getloadavg()]
    return info


def _markdown(data: dict[str, Any]) -> str:
    m = data["machine"]
    metric = data["config"]["metric"]
    lines = [
        "# GPU throughput: the trial loop against a plain loop, and trials sharing a GPU"
        f" ({data['config']['task']})",
        "",
        f"Device: **{m.get('gpu') or m['device']}** ({m.get('gpu_memory_gib', '-')} GiB), "
        f"torch {m['torch']}, CUDA {m.get('cuda', '-')}, {m['cpu_count']} CPU cores, Python "
        f"{m['python']}; load {m.get('load_avg_1_5_15')}. Data: {data['config']['data']}.",
        "",
        "## Trial loop vs plain loop (samples/s, training steps only)",
        "",
        "| batch | trial loop | trial loop, compiled | plain | plain, compiled | "
        f"loop / best plain | trial loop's {metric} after the stage |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]

    def rate(value: float) -> str:
        return f"{value:,.0f}" if value else "-"

    for row in data["loop_vs_plain"]:
        value = row["loop_detail"]["False"].get(metric)
        lines.append(
            f"| {row['batch']} | {rate(row['loop'])} | {rate(row['loop_compiled'])} | "
            f"{rate(row['plain'])} | {rate(row['plain_compiled'])} | {row['ratio']:.2f} | "
            f"{'-' if value is None else f'{value:.4g}'} |"
        )
    lines += [
        "",
        "Trial loop = the better of its eager and compiled runs; best plain = the better of the "
        "plain loop's two. " + data["config"]["loop_note"],
        "",
    ]
    if data.get("shared"):
        lines += [
            "## Trials sharing one GPU (Ray fractional GPUs)",
            "",
            "| trials at once | GPU per trial | trials | wall (s) | trials / hour | "
            f"vs one at a time | mean {metric} |",
            "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        alone = data["shared"][0]["trials_per_hour"]
        for row in data["shared"]:
            mean = row[f"{metric}_mean"]
            lines.append(
                f"| {row['sharing']} | {row['gpus_per_worker']:g} | {row['trials']} | "
                f"{row['wall_time_s']:.1f} | {row['trials_per_hour']:,.0f} | "
                f"{row['trials_per_hour'] / alone:.2f}x | "
                f"{'-' if mean is None else f'{mean:.4g}'} |"
            )
        lines.append("")
    targets = data["targets"]
    lines += ["## Targets", ""]
    for name, target in targets.items():
        lines.append(f"- `{name}`: {'met' if target['met'] else 'NOT met'} ({target['detail']})")
    lines += ["", "```", data["summary_line"], "```", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--device", default=None, help="cuda:0 when there is a GPU, else cpu")
    parser.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="cifar10",
        help="cifar10 (synthetic CIFAR-size images, ResNet-20), tinylm or denoise",
    )
    parser.add_argument(
        "--batches", default=None, help="the stages' batch sizes (default: per task)"
    )
    parser.add_argument("--epochs-per-stage", type=int, default=2)
    parser.add_argument(
        "--train", type=int, default=50_000, help="synthetic training images (cifar10)"
    )
    parser.add_argument("--no-compile", action="store_true", help="skip the compiled runs")
    parser.add_argument("--share", default="2,4,8", help="trials sharing the GPU at once")
    parser.add_argument("--share-trials", type=int, default=16)
    parser.add_argument("--share-epochs", type=int, default=4)
    parser.add_argument("--share-train", type=int, default=20_000)
    parser.add_argument("--no-share", action="store_true", help="skip the shared-GPU part")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run of every path")
    args = parser.parse_args(argv)

    import torch

    from workers.tasks import get_task

    if args.device is None:
        args.device = "cuda:0" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA GPU is visible to torch")
    setup = TASKS[args.task]
    stem = "gpu_throughput" if args.task == "cifar10" else f"gpu_throughput_{args.task}"
    task_options = dict(setup["options"])
    args.batches = args.batches or setup["batches"]
    max_plain_steps: int | None = None
    if args.smoke:
        stem += "_smoke"
        task_options = dict(setup["smoke_options"])
        args.batches, args.epochs_per_stage, args.train = "32,64", 1, 384
        args.no_compile = True
        args.share, args.share_trials, args.share_epochs, args.share_train = "2", 2, 2, 256
        max_plain_steps = 4
    batches = [int(b) for b in args.batches.split(",")]
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.backends.cudnn.benchmark = True  # both loops: the fastest conv algorithms
    compile_modes = [False] if args.no_compile else [False, True]
    num_val = 128 if args.smoke else 5000
    started = time.perf_counter()
    data: dict[str, Any] = {"machine": _machine(args.device)}
    rows: list[dict[str, Any]] = []
    cifar = args.task == "cifar10"
    data_context = (
        synthetic_cifar(args.train + num_val, 1000 if args.smoke else 10_000)
        if cifar
        else contextlib.nullcontext("")
    )
    with data_context as data_dir:
        options = _options(data_dir, num_val) if cifar else task_options
        loop: dict[bool, dict[int, dict[str, Any]]] = {}
        for compiled in compile_modes:
            loop[compiled] = trial_loop(
                args.device, options, batches, args.epochs_per_stage, compiled, args.task
            )
            print(f"trial loop (compile={compiled}): {json.dumps(loop[compiled])}", flush=True)
        for batch in batches:
            plain = {
                compiled: plain_loop(
                    args.device, options, batch, compiled, max_plain_steps, args.task
                )
                for compiled in compile_modes
            }
            print(f"plain loop batch {batch}: {json.dumps(plain)}", flush=True)
            loop_best = max(loop[c][batch]["samples_per_s"] for c in compile_modes)
            plain_best = max(p["samples_per_s"] for p in plain.values())
            rows.append(
                {
                    "batch": batch,
                    "loop": loop[False][batch]["samples_per_s"],
                    "loop_compiled": loop.get(True, {}).get(batch, {}).get("samples_per_s", 0.0),
                    "plain": plain[False]["samples_per_s"],
                    "plain_compiled": plain.get(True, {}).get("samples_per_s", 0.0),
                    "ratio": loop_best / plain_best,
                    "loop_detail": {str(c): loop[c][batch] for c in compile_modes},
                    "plain_detail": {str(c): plain[c] for c in compile_modes},
                }
            )
        shared: list[dict[str, Any]] = []
        if not args.no_share:
            import ray

            if ray.is_initialized():
                raise SystemExit(
                    "the shared-GPU part starts its own local Ray (its trials read the "
                    "synthetic data through STAGETUNE_DATASETS_DIR, set for the workers it "
                    "starts); shut down the running instance first"
                )
            ray.init(
                num_cpus=os.cpu_count() or 2,
                num_gpus=1 if cuda else 0,
                include_dashboard=False,
                configure_logging=False,
                log_to_driver=False,
            )
            levels = [1] + [int(k) for k in args.share.split(",") if int(k) > 1]
            if cifar:
                share_options = _options(data_dir, num_val, args.share_train)
            else:
                share_options = dict(task_options)
                size = setup["train_size_option"]
                share_options[size] = min(share_options[size], args.share_train)
            with tempfile.TemporaryDirectory(prefix="stagetune-gpu-share-") as storage:
                for k in levels:
                    gpus = (1.0 / k) if cuda else 0.0
                    row = shared_gpu(
                        share_options,
                        args.share_trials,
                        args.share_epochs,
                        k,
                        gpus,
                        storage,
                        args.task,
                        (batches[0], batches[1] if len(batches) > 1 else batches[0]),
                    )
                    print(f"shared GPU: {json.dumps(row)}", flush=True)
                    shared.append(row)
            ray.shutdown()
    at = rows[-1]
    best_share = max(shared, key=lambda r: r["trials_per_hour"]) if shared else None
    targets: dict[str, Any] = {
        f"loop_at_least_0.8_of_plain_at_{at['batch']}": {
            "met": at["ratio"] >= 0.8,
            "detail": f"{at['ratio']:.2f} of the best plain loop at batch {at['batch']}",
        }
    }
    device_label = str(data["machine"].get("gpu") or args.device).replace(" ", "_")
    line = (
        f"gpu_throughput task={args.task} device={device_label} "
        f"loop_vs_plain_at_{at['batch']}={at['ratio']:.2f} "
        f"loop_samples_per_s_at_{at['batch']}={max(at['loop'], at['loop_compiled']):.0f} "
        f"plain_samples_per_s_at_{at['batch']}={max(at['plain'], at['plain_compiled']):.0f}"
    )
    if best_share is not None:
        line += (
            f" best_sharing={best_share['sharing']} "
            f"trials_per_hour_shared={best_share['trials_per_hour']:.0f} "
            f"trials_per_hour_alone={shared[0]['trials_per_hour']:.0f}"
        )
    data.update(
        {
            "config": {
                "task": args.task,
                "metric": get_task(args.task).primary_metric,
                "task_options": task_options,
                "data": setup["data"].format(train=args.train, val=num_val),
                "device": args.device,
                "batches": batches,
                "epochs_per_stage": args.epochs_per_stage,
                "smoke": args.smoke,
                "loop_note": "The trial loop sets each step's LR, draws its permutation per "
                "epoch, packs a few scalars (loss, squared gradient norm for the noise scale) "
                "into the gradient buffer (all-reduced with more than one rank) and reads them "
                "back once per step.",
            },
            "loop_vs_plain": rows,
            "shared": shared,
            "targets": targets,
            "summary_line": line,
            "total_wall_time_s": time.perf_counter() - started,
        }
    )
    args.results_dir.mkdir(parents=True, exist_ok=True)
    (args.results_dir / f"{stem}.json").write_text(json.dumps(data, indent=2) + "\n", "utf-8")
    (args.results_dir / f"{stem}.md").write_text(_markdown(data), "utf-8")
    print(_markdown(data))
    print(line, flush=True)
    return data


if __name__ == "__main__":
    main()
