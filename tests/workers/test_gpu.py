"""The trial loop on a CUDA GPU: real out-of-memory recovery, forks and probes with the GPU's
RNG state, a compiled model, and the tasks of protocol v2 (the Transformer LM and the DnCNN
under bf16 against fp32, an AdamW fork, a dataset read through DataLoader workers). Skipped
where torch sees no CUDA device.

The worker runs in this process (one rank, no process group: the code path of every rank of a
one-worker trial). The first tests train on CIFAR-size synthetic images read through the
``cifar10`` task (ResNet-8, random crop and flip drawn from a generator on the GPU, bf16
autocast, channels-last).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.workers.test_dataset_data import DiskDigits, MemoryDigits, _train, digits_dir, tasks
from tuner.schedule import Schedule, Stage
from workers.gang import WorkerContext
from workers.loop import TrialWorker
from workers.tasks.cifar10 import write_synthetic_cifar10

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

__all__ = ["digits_dir", "tasks"]  # fixtures of the disk-dataset tests, used here on the GPU

DATA = "cifar-gpu-test"
DEVICE = "cuda:0"


@pytest.fixture(scope="module")
def options(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("datasets")
    write_synthetic_cifar10(Path(root) / DATA, num_train=4608, num_test=512, seed=0)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("STAGETUNE_DATASETS_DIR", str(root))
        yield {"data_dir": DATA, "num_val_samples": 512, "depth": 8}


def _worker() -> TrialWorker:
    return TrialWorker(WorkerContext(0, 1, DEVICE, "nccl", 1.0))


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


# ------------------------------------------------------------------------------------------
# the tasks of protocol v2 on the GPU: a Transformer LM, a DnCNN, data read from disk

LM_OPTIONS = {"num_train_sequences": 1024, "num_val_sequences": 256, "num_test_sequences": 64}
DENOISE_OPTIONS = {"num_train_patches": 1024}


def _adamw_two_stages(base_lr: float) -> Schedule:
    return Schedule(
        stages=(Stage(0, 2, 32), Stage(2, 4, 64, warmup_epochs=0.5)),
        base_lr=base_lr,
        base_batch_size=32,
        scaling_rule="sqrt",
        optimizer="adamw",
        momentum=0.9,
        weight_decay=0.01,
    )


def _task_config(
    task: str, options: dict[str, Any], base_lr: float, **extra: Any
) -> dict[str, Any]:
    return {
        "schedule": _adamw_two_stages(base_lr).to_dict(),
        "task": task,
        "task_options": options,
        "seed": 3,
        **extra,
    }


@pytest.mark.parametrize(
    ("task", "options", "base_lr", "channels_last"),
    [("tinylm", LM_OPTIONS, 3e-3, False), ("denoise", DENOISE_OPTIONS, 1e-3, True)],
)
def test_the_lm_and_denoising_tasks_train_under_bf16_as_well_as_in_fp32(
    task: str, options: dict[str, Any], base_lr: float, channels_last: bool
) -> None:
    """The CUDA default, bf16 autocast, on the token-id Transformer (2-D inputs: no
    channels-last) and on the DnCNN (4-D: channels-last), each against the same trial in full
    fp32 on the GPU (``amp: false``): it learns, and it ends as good as fp32 within a small
    margin (a regression output is where bf16's 8-bit mantissa would show first)."""
    worker = _worker()
    info = worker.configure(_task_config(task, options, base_lr))
    assert (info["amp"], info["channels_last"]) == (True, channels_last)
    bf16 = [worker.train_epoch(e) for e in range(4)]
    info = worker.configure(_task_config(task, options, base_lr, amp=False))
    assert info["amp"] is False
    fp32 = [worker.train_epoch(e) for e in range(4)]
    assert all(math.isfinite(r["train_loss"]) for r in bf16 + fp32)
    metric = "val_loss" if task == "tinylm" else "val_psnr"
    print(
        f"{task} {metric} by epoch: bf16 {[round(r[metric], 3) for r in bf16]}, fp32 "
        f"{[round(r[metric], 3) for r in fp32]}"
    )
    if task == "tinylm":
        # 3.28 nats: the training split's byte frequencies (a model that learnt no context).
        assert bf16[-1]["val_loss"] < 3.0
        assert bf16[-1]["val_loss"] <= fp32[-1]["val_loss"] + 0.05
    else:
        # 20.2 dB: the noisy input itself (a model that removes nothing).
        assert bf16[-1]["val_psnr"] > 25.0
        assert bf16[-1]["val_psnr"] >= fp32[-1]["val_psnr"] - 0.3


def test_a_fork_of_the_lm_on_the_gpu_continues_like_the_straight_run() -> None:
    """AdamW's moments and step counts on the GPU, saved at the stage boundary and loaded into
    a fresh trial: the fork goes on like the run that never stopped (float noise allowed:
    attention's backward kernels may sum in another order)."""
    worker = _worker()
    config = _task_config("tinylm", LM_OPTIONS, 3e-3)
    worker.configure(config)
    straight = [worker.train_epoch(e) for e in range(4)]
    worker.configure(config)
    head = [worker.train_epoch(e) for e in range(2)]
    saved = worker.state()
    worker.configure(config)
    worker.load_state(saved, saved)
    tail = [worker.train_epoch(e) for e in range(2, 4)]
    for a, b in zip(straight, head + tail, strict=True):
        assert (b["train_loss"], b["val_loss"]) == pytest.approx(
            (a["train_loss"], a["val_loss"]), rel=1e-2, abs=1e-2
        )
        assert a["steps"] == b["steps"]


def test_a_dataset_read_through_dataloader_workers_trains_on_the_gpu_like_tensors_in_memory(
    digits_dir: Path, tasks: tuple[DiskDigits, MemoryDigits]
) -> None:
    """The disk path on CUDA: samples read in two DataLoader worker processes, collated into
    pinned host memory and copied to the GPU, against the same files held as tensors in GPU
    memory (indexed there). Same batches, so the same training up to float noise."""
    disk, memory = tasks
    options = {"data_dir": str(digits_dir), "loader_workers": 2}
    on_disk, disk_params = _train(disk, options, DEVICE, micro_batch=24, probe_at=[2])
    in_memory, memory_params = _train(memory, options, DEVICE, micro_batch=24, probe_at=[2])
    for a, b in zip(on_disk, in_memory, strict=True):
        assert (a["steps"], a["samples"]) == (b["steps"], b["samples"])
        assert (a["train_loss"], a["val_loss"], a["val_accuracy"]) == pytest.approx(
            (b["train_loss"], b["val_loss"], b["val_accuracy"]), rel=1e-4, abs=1e-5
        )
    assert disk_params == pytest.approx(memory_params, rel=1e-4, abs=1e-5)
    assert on_disk[-1]["val_accuracy"] > 0.9
    assert on_disk[1]["probe_val_accuracy"] is not None
