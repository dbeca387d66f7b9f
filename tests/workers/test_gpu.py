"""The trial loop on a CUDA GPU: real out-of-memory recovery, forks and probes with the GPU's
RNG state, and a compiled model. Skipped where torch sees no CUDA device.

The worker runs in this process (one rank, no process group: the code path of every rank of a
one-worker trial), on CIFAR-size synthetic images read through the ``cifar10`` task (ResNet-8,
random crop and flip drawn from a generator on the GPU, bf16 autocast, channels-last).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tuner.schedule import Schedule, Stage
from workers.gang import WorkerContext
from workers.loop import TrialWorker
from workers.tasks.cifar10 import write_synthetic_cifar10

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

DATA = "cifar-gpu-test"


@pytest.fixture(scope="module")
def options(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("datasets")
    write_synthetic_cifar10(Path(root) / DATA, num_train=4608, num_test=512, seed=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STAGETUNE_DATASETS_DIR", str(root))
        yield {"data_dir": DATA, "num_val_samples": 512, "depth": 8}


def _worker() -> TrialWorker:
    return TrialWorker(WorkerContext(0, 1, "cuda:0", "nccl", 1.0))


def _config(schedule: Schedule, options: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "schedule": schedule.to_dict(),
        "task": "cifar10",
        "task_options": options,
        "seed": 7,
        **extra,
    }


def _two_stages() -> Schedule:
    return Schedule(
        stages=(Stage(0, 2, 64), Stage(2, 4, 128, warmup_epochs=0.5)),
        base_lr=0.05,
        base_batch_size=64,
    )


def _metrics(result: dict[str, Any]) -> tuple[float, float, float]:
    return (result["train_loss"], result["val_loss"], result["val_accuracy"])


def test_the_cuda_path_trains_with_bf16_autocast_and_channels_last(
    options: dict[str, Any],
) -> None:
    worker = _worker()
    info = worker.configure(_config(_two_stages(), options))
    assert info["device"] == "cuda:0"
    assert (info["amp"], info["channels_last"]) == (True, True)
    results = [worker.train_epoch(e) for e in range(4)]
    assert all(math.isfinite(r["train_loss"]) for r in results)
    assert results[-1]["val_accuracy"] > 0.5  # the synthetic classes are easy to tell apart
    assert results[-1]["samples_per_s"] > 0


def test_a_fork_on_the_gpu_continues_like_the_straight_run(options: dict[str, Any]) -> None:
    """A state saved at the stage boundary (model, optimizer, CPU and CUDA RNGs, the
    augmentation generator on the GPU) and loaded into a fresh trial goes on like the run that
    never stopped. cuDNN's convolution kernels may sum in another order from run to run, so the
    comparison allows float noise; a lost RNG or optimizer state moves the loss far more."""
    worker = _worker()
    config = _config(_two_stages(), options)
    worker.configure(config)
    straight = [worker.train_epoch(e) for e in range(4)]
    worker.configure(config)
    head = [worker.train_epoch(e) for e in range(2)]
    saved = worker.state()
    assert saved["cuda_rng"] is not None
    worker.configure(config)  # a new trial: fresh model, optimizer and RNGs
    worker.load_state(saved, saved)
    tail = [worker.train_epoch(e) for e in range(2, 4)]
    for a, b in zip(straight, head + tail, strict=True):
        assert _metrics(b) == pytest.approx(_metrics(a), rel=2e-2, abs=2e-2)
        assert a["steps"] == b["steps"]


def test_a_cooldown_probe_on_the_gpu_leaves_the_main_run_as_it_was(
    options: dict[str, Any],
) -> None:
    worker = _worker()
    worker.configure(_config(_two_stages(), options))
    plain = [worker.train_epoch(e) for e in range(4)]
    worker.configure(_config(_two_stages(), options, probe_at=[2]))
    probed = [worker.train_epoch(e) for e in range(4)]
    assert probed[1]["probe_val_accuracy"] is not None
    assert probed[1]["probe_steps"] >= 1
    for a, b in zip(plain, probed, strict=True):
        assert _metrics(b) == pytest.approx(_metrics(a), rel=2e-2, abs=2e-2)


def test_a_real_cuda_out_of_memory_is_retried_with_half_the_micro_batch(
    options: dict[str, Any],
) -> None:
    """Measure the memory one step at batch 2048 needs, cap the process below it, and train
    again: the step runs out of GPU memory for real, the loop retries it with micro-batches of
    1024 (gradient accumulation), and the trial goes on with finite losses."""
    schedule = Schedule.constant(2048, 1, 0.05, base_batch_size=64)
    config = _config(schedule, options)
    worker = _worker()
    worker.configure(config)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    free = worker.train_epoch(0)
    need = torch.cuda.max_memory_allocated() - before
    assert free["oom_retries"] == 0
    assert free["accumulation_steps"] == 1

    worker.configure(config)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    cap = torch.cuda.memory_allocated() + int(0.65 * need)
    torch.cuda.set_per_process_memory_fraction(cap / total)
    try:
        capped = worker.train_epoch(0)
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()
    assert capped["oom_retries"] >= 1
    assert capped["micro_batch"] is not None
    assert capped["micro_batch"] <= 1024
    assert capped["accumulation_steps"] >= 2
    assert capped["steps_in_epoch"] == free["steps_in_epoch"]  # no step was lost
    assert math.isfinite(capped["train_loss"])


def test_a_compiled_model_trains_and_its_state_keeps_plain_keys(options: dict[str, Any]) -> None:
    worker = _worker()
    info = worker.configure(_config(_two_stages(), options, compile=True))
    assert info["compile"] is True
    results = [worker.train_epoch(e) for e in range(4)]
    assert all(math.isfinite(r["train_loss"]) for r in results)
    assert results[-1]["val_accuracy"] > 0.5
    # Checkpoints and forks load into uncompiled models too: no "_orig_mod." prefixes.
    keys = list(worker.state()["model"])
    assert keys
    assert not any("_orig_mod" in k for k in keys)
