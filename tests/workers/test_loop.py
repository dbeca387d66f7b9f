"""The data-parallel training loop: gradient equivalence, training quality, per-epoch metrics,
divergence and out-of-memory handling.

Everything runs real ``torch.distributed`` (gloo) training across 2 Ray actors of the session's
local Ray instance (2 CPUs). The trials of this module run one after another on one shared
trainable, handed on with ``reset_config`` as under Tune's actor reuse (so they also check that
one trial's leftovers - a divergence, an OOM retry, a failed trial - do not leak into the
next). Test-only tasks are defined here and shipped to the worker processes through
``ScheduleTrainable.extra_tasks`` (pickled by value).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import pytest
import ray.cloudpickle
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from tuner.errors import ValidationError
from tuner.objectives import StudyObjective, failure_of, trial_status
from tuner.schedule import Schedule, Stage, place_batch
from tuner.spec import AccuracyObjective
from workers.gang import WorkerContext
from workers.loop import LARS, TrialWorker
from workers.noise_scale import NoiseScaleEstimator, unbiased_estimates
from workers.tasks import BaseTask, TaskData, TaskOptions, get_task
from workers.tasks.base import load_tensors
from workers.trainable import METRIC_KEYS, ScheduleTrainable

# Worker processes cannot import this test module by name: pickle its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]


# ------------------------------------------------------------------------------------------
# test-only tasks


class Float64Task(BaseTask[TaskOptions]):
    """A tiny float64 classification problem (for exact gradient comparisons)."""

    name = "test_float64"
    description = "float64 Gaussian blobs, 3 classes, tanh MLP"
    default_epochs = 2
    default_base_batch_size = 8
    default_base_lr = 0.1
    options_model = TaskOptions

    def _load(self, opts: TaskOptions, data_seed: int) -> TaskData:
        g = torch.Generator().manual_seed(data_seed)
        x = torch.randn(96, 5, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (96,), generator=g)
        return TaskData(
            train_x=x[:64],
            train_y=y[:64],
            val_x=x[64:80],
            val_y=y[64:80],
            test_x=x[80:],
            test_y=y[80:],
            num_classes=3,
            input_shape=(5,),
        )

    def _build(self, opts: TaskOptions) -> nn.Module:
        return nn.Sequential(nn.Linear(5, 16), nn.Tanh(), nn.Linear(16, 3)).double()


class _RaisesOOMAbove(nn.Module):
    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner = inner
        self.limit = limit

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and x.shape[0] > self.limit:
            raise torch.OutOfMemoryError(
                f"test: a micro-batch of {x.shape[0]} > {self.limit} does not fit"
            )
        out: torch.Tensor = self.inner(x)
        return out


class OOMTask(BaseTask[TaskOptions]):
    """digits, with a model that raises a real ``torch.OutOfMemoryError`` on large batches."""

    name = "test_oom_digits"
    description = "digits; training forward passes above 24 samples raise OutOfMemoryError"
    default_epochs = 2
    default_base_batch_size = 32
    default_base_lr = 0.05
    options_model = TaskOptions
    limit: ClassVar[int] = 24

    def _load(self, opts: TaskOptions, data_seed: int) -> TaskData:
        return load_tensors(get_task("digits"), {"data_seed": data_seed}, data_seed)

    def _build(self, opts: TaskOptions) -> nn.Module:
        inner = get_task("digits").build_model({})
        return _RaisesOOMAbove(inner, self.limit)


class OOMAlwaysTask(OOMTask):
    name = "test_oom_always"
    description = "digits; every training forward pass raises OutOfMemoryError"
    limit: ClassVar[int] = 0


class Images4dTask(BaseTask[TaskOptions]):
    """Random 3x8x8 images and a small conv net with BatchNorm (4-D input: channels-last)."""

    name = "test_images4d"
    description = "random 3x8x8 images, 4 classes, conv + BatchNorm"
    default_epochs = 2
    default_base_batch_size = 32
    default_base_lr = 0.05
    options_model = TaskOptions

    def _load(self, opts: TaskOptions, data_seed: int) -> TaskData:
        g = torch.Generator().manual_seed(data_seed)
        y = torch.randint(0, 4, (384,), generator=g)
        x = torch.randn(384, 3, 8, 8, generator=g) + y.view(-1, 1, 1, 1).float()
        return TaskData(
            train_x=x[:256],
            train_y=y[:256],
            val_x=x[256:320],
            val_y=y[256:320],
            test_x=x[320:],
            test_y=y[320:],
            num_classes=4,
            input_shape=(3, 8, 8),
        )

    def _build(self, opts: TaskOptions) -> nn.Module:
        return nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Linear(8, 4),
        )


class LoopTrainable(ScheduleTrainable):
    extra_tasks = (Float64Task(), OOMTask(), OOMAlwaysTask(), Images4dTask())


# ------------------------------------------------------------------------------------------
# helpers and fixtures


def trial_config(schedule: Schedule, task: str, **extra: Any) -> dict[str, Any]:
    config: dict[str, Any] = {
        "schedule": schedule.to_dict(),
        "task": task,
        "task_options": {},
        "seed": 0,
        "workers": 2,
        "cpus_per_worker": 1.0,
        "gpus_per_worker": 0.0,
        "micro_batch": None,
        "performance_aware": False,
    }
    config.update(extra)
    return config


@pytest.fixture(scope="module")
def start_trial(ray_session: None) -> Iterator[Callable[[dict[str, Any]], ScheduleTrainable]]:
    """Start a trial on one trainable shared by this module's tests: the first call creates
    it (and its gang of worker processes), later calls hand it the next trial with
    ``reset_config`` like Tune's actor reuse does (a gang with other resources is replaced)."""
    shared: list[ScheduleTrainable] = []

    def start(config: dict[str, Any]) -> ScheduleTrainable:
        if not shared:
            shared.append(LoopTrainable(config))
        else:
            assert shared[0].reset_config(config) is True
        return shared[0]

    yield start
    for trainable in shared:
        trainable.stop()


def run_trial(trainable: ScheduleTrainable) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    while True:
        result = trainable.train()
        results.append(result)
        if result["done"]:
            return results


def check_metrics(results: list[dict[str, Any]], schedule: Schedule, num_train: int) -> None:
    """Every reported field is present, typed and consistent with the schedule's arithmetic."""
    steps = samples = 0
    wall = 0.0
    for epoch, result in enumerate(results):
        for key in METRIC_KEYS:
            assert key in result, key
        stage = schedule.stage_index_at(epoch)
        spe = schedule.steps_per_epoch(stage, num_train)
        batch = schedule.batch_size_at(epoch)
        steps += spe
        samples += spe * batch
        assert result["epoch"] == epoch
        assert result["stage"] == stage
        assert result["batch_size"] == batch
        assert result["steps"] == steps
        assert result["samples"] == samples
        assert result["steps_in_epoch"] == spe
        assert result["lr"] == pytest.approx(schedule.lr_at(epoch + (spe - 1) / spe), rel=1e-12)
        assert result["diverged"] is False
        assert 0.0 <= result["val_accuracy"] <= 1.0
        for key in ("val_loss", "train_loss", "epoch_time_s", "samples_per_s", "wall_time_s"):
            assert isinstance(result[key], float), key
            assert math.isfinite(result[key]), key
            assert result[key] > 0, key
        assert result["samples_per_s"] == pytest.approx(
            spe * batch / result["epoch_time_s"], rel=1e-9
        )
        wall += result["epoch_time_s"]
        assert result["wall_time_s"] == pytest.approx(wall, rel=1e-9)
        noise = result["noise_scale"]
        assert noise is None or (isinstance(noise, float) and math.isfinite(noise) and noise > 0)
        assert result["done"] is (epoch == schedule.total_epochs - 1)
    assert steps == schedule.total_steps(num_train)
    assert samples == schedule.samples_seen(num_train)


# ------------------------------------------------------------------------------------------
# pure parts: config parsing, the noise-scale estimator


def test_configure_reads_the_typed_trial_config() -> None:
    """The worker parses its config with tuner.trial_config.TrialConfig (its rules are tested
    in tests/tuner/test_trial_config.py): a bad key is refused before any data loads."""
    schedule = Schedule.constant(32, 3, 0.1)
    worker = TrialWorker(WorkerContext(0, 1, "cpu", "gloo", 1.0))
    info = worker.configure({"schedule": schedule.to_dict(), "task": "digits", "compile": False})
    assert info["compile"] is False
    with pytest.raises(ValidationError) as raised:
        worker.configure(
            {"schedule": schedule.to_dict(), "task": "digits", "compile": "yes", "amp": 1}
        )
    message = str(raised.value)
    assert "'compile' must be true or false, got 'yes'" in message
    assert "'amp' must be true or false, got 1" in message


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_state_saved_with_fused_kernels_loads_into_a_cpu_trial(optimizer: str) -> None:
    """On a GPU the optimizer runs its fused kernels and its saved param groups say so; a fork
    of that state into a trial on another device keeps the loading trial's own kernel choice
    (the moments and step counts are the same either way) and goes on like the straight run."""
    schedule = Schedule(
        stages=(Stage(0, 1, 32), Stage(1, 2, 64)),
        base_lr=0.01 if optimizer == "adamw" else 0.05,
        base_batch_size=32,
        optimizer=optimizer,  # type: ignore[arg-type]
    )
    config = {"schedule": schedule.to_dict(), "task": "digits", "seed": 5}
    worker = TrialWorker(WorkerContext(0, 1, "cpu", "gloo", 1.0))
    worker.configure(config)
    straight = [worker.train_epoch(e) for e in range(2)]
    worker.configure(config)
    worker.train_epoch(0)
    saved = worker.state()
    for group in saved["optimizer"]["param_groups"]:
        group["fused"] = True  # as the same trial on a GPU saves it
    worker.configure(config)
    worker.load_state(saved, saved)
    own = worker._optimizer.param_groups  # the kernel choice is not reported: read it here
    assert own
    assert all(not group["fused"] for group in own)
    forked = worker.train_epoch(1)
    assert forked["train_loss"] == pytest.approx(straight[1]["train_loss"], rel=1e-6)
    assert forked["val_loss"] == pytest.approx(straight[1]["val_loss"], rel=1e-6)


def test_noise_scale_estimator_recovers_known_noise_scale() -> None:
    # Per-sample gradients g_i = G + noise with tr(Σ) = d * sigma^2; B_simple = tr(Σ)/|G|^2.
    rng = np.random.default_rng(0)
    d, sigma = 50, 0.5
    true_g = rng.normal(size=d) * 0.1
    expected = d * sigma**2 / float(true_g @ true_g)
    estimator = NoiseScaleEstimator(beta=0.99)
    world, local = 4, 8
    for _ in range(3000):
        per_sample = true_g + sigma * rng.normal(size=(world * local, d))
        small = per_sample.reshape(world, local, d).mean(axis=1)
        big = per_sample.mean(axis=0)
        estimator.update(
            float(np.mean(np.sum(small**2, axis=1))), 1.0 / local, float(big @ big), 1.0 / 32
        )
    assert estimator.value is not None
    assert estimator.value == pytest.approx(expected, rel=0.15)


def test_noise_scale_is_undefined_without_a_smaller_batch() -> None:
    assert unbiased_estimates(1.0, 1 / 32, 0.5, 1 / 32) is None
    estimator = NoiseScaleEstimator()
    estimator.update(1.0, 1 / 32, 0.5, 1 / 32)
    assert estimator.value is None


def test_lars_scales_matrix_steps_by_the_trust_ratio() -> None:
    weight = nn.Parameter(torch.tensor([[3.0, 4.0]], dtype=torch.float64))  # |w| = 5
    bias = nn.Parameter(torch.tensor([1.0], dtype=torch.float64))
    weight.grad = torch.tensor([[0.6, 0.8]], dtype=torch.float64)  # |g| = 1
    bias.grad = torch.tensor([0.5], dtype=torch.float64)
    optimizer = LARS([weight, bias], lr=2.0, momentum=0.9, weight_decay=0.1, eta=0.001)
    optimizer.step()
    trust = 0.001 * 5.0 / (1.0 + 0.1 * 5.0)
    expected_w = torch.tensor([[3.0, 4.0]]) - 2.0 * trust * (
        torch.tensor([[0.6, 0.8]]) + 0.1 * torch.tensor([[3.0, 4.0]])
    )
    assert torch.allclose(weight.detach(), expected_w.double(), atol=1e-9)
    # 1-D parameters (biases, norms) take a plain momentum-SGD step with weight decay.
    assert bias.item() == pytest.approx(1.0 - 2.0 * (0.5 + 0.1 * 1.0), abs=1e-12)


# ------------------------------------------------------------------------------------------
# gradient equivalence (real gloo process group of 2 Ray actors)


@pytest.mark.ray
def test_uneven_split_gradient_equals_single_process_gradient(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    task = Float64Task()
    schedule = Schedule.constant(16, 2, 0.1, label_smoothing=0.1)
    trainable = start_trial(trial_config(schedule, task.name, seed=3))
    order = torch.randperm(64, generator=torch.Generator().manual_seed(1))
    indices = [int(i) for i in order[:21]]
    weights, micro = (1.0, 2.5), 4
    placement = place_batch(len(indices), 2, micro, weights)
    assert placement.local_batches == (6, 15)  # unequal shares ...
    assert placement.accumulation_steps == 4  # ... and gradient accumulation
    assert trainable._gang is not None
    assert trainable._gang.backend == "gloo"
    grads = trainable._gang.call("synchronized_gradient", indices, weights, micro)
    assert grads[0] == grads[1]  # both ranks hold the same synchronized gradient

    torch.manual_seed(3)
    model = task.build_model({})
    data = load_tensors(task, {}, 3)
    idx = torch.tensor(indices)
    loss = F.cross_entropy(
        model(data.train_x[idx]), data.train_y[idx], reduction="sum", label_smoothing=0.1
    ) / len(indices)
    torch.autograd.backward(loss)
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.grad is not None])
    got = torch.tensor(grads[0], dtype=torch.float64)
    assert got.shape == expected.shape
    assert torch.max(torch.abs(got - expected)).item() < 1e-12
    assert torch.linalg.vector_norm(expected).item() > 1e-3  # not trivially zero


# ------------------------------------------------------------------------------------------
# training quality and metrics


@pytest.mark.ray
@pytest.mark.slow
def test_digits_trains_past_90_percent_with_consistent_metrics(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    task = get_task("digits")
    epochs = task.default_epochs  # 15
    schedule = Schedule(
        stages=(
            Stage(0, 5, 32),
            Stage(5, 10, 128, warmup_epochs=1.0),
            Stage(10, epochs, 256, decay="cosine"),
        ),
        base_lr=task.default_base_lr,
        base_batch_size=task.default_base_batch_size,
        scaling_rule="sqrt",
        label_smoothing=0.05,
    )
    trainable = start_trial(trial_config(schedule, "digits", micro_batch=48))
    results = run_trial(trainable)
    assert len(results) == epochs
    check_metrics(results, schedule, num_train=1079)
    assert results[-1]["val_accuracy"] > 0.90, [r["val_accuracy"] for r in results]
    # batch 256 over 2 workers with micro-batch 48: 128 per worker in 3 accumulation passes
    assert results[-1]["local_batches"] == [128, 128]
    assert results[-1]["accumulation_steps"] == 3
    assert results[0]["local_batches"] == [16, 16]
    assert results[0]["accumulation_steps"] == 1
    assert any(r["noise_scale"] is not None for r in results)


@pytest.mark.ray
@pytest.mark.slow
def test_mnist1d_trains_past_90_percent(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    task = get_task("mnist1d")
    epochs = 12  # the task's default is 30; a growing batch gets past 90% well before
    schedule = Schedule(
        stages=(Stage(0, 3, 64), Stage(3, 8, 256, warmup_epochs=1.0), Stage(8, epochs, 512)),
        base_lr=task.default_base_lr,
        base_batch_size=task.default_base_batch_size,
        scaling_rule="sqrt",
        weight_decay=task.default_optimizer.weight_decay,
    )
    trainable = start_trial(trial_config(schedule, "mnist1d"))
    results = run_trial(trainable)
    check_metrics(results, schedule, num_train=5000)
    assert results[-1]["val_accuracy"] > 0.90, [r["val_accuracy"] for r in results]


# ------------------------------------------------------------------------------------------
# failures: divergence, out of memory


@pytest.mark.ray
def test_huge_learning_rate_diverges_and_keeps_metrics_so_far(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    # Two sane epochs, then a stage whose LR is 1e6 times larger.
    schedule = Schedule(
        stages=(Stage(0, 2, 32), Stage(2, 6, 32, lr_multiplier=1e6)),
        base_lr=0.05,
        base_batch_size=32,
    )
    trainable = start_trial(trial_config(schedule, "digits"))
    results = run_trial(trainable)
    assert len(results) == 3  # ended in the first epoch at the huge LR
    first, second, last = results
    assert not first["diverged"]
    assert not second["diverged"]
    assert first["val_accuracy"] > 0.8
    assert last["diverged"] is True
    assert last["done"] is True
    assert last["steps"] < second["steps"] + 1079 // 32  # stopped inside the epoch
    assert last["steps"] >= second["steps"]
    for key in ("val_loss", "train_loss", "noise_scale"):
        value = last[key]
        assert value is None or math.isfinite(value)
    assert isinstance(last["val_accuracy"], float)


@pytest.mark.ray
def test_out_of_memory_retries_with_more_accumulation(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    # Stage 2's local batch (64 per worker) exceeds what the model "fits" (24): the loop must
    # retry with micro-batch 32, then 16, and train the stage with 4 accumulation passes.
    schedule = Schedule(
        stages=(Stage(0, 1, 32), Stage(1, 2, 128)), base_lr=0.05, base_batch_size=32
    )
    trainable = start_trial(trial_config(schedule, OOMTask.name))
    results = run_trial(trainable)
    check_metrics(results, schedule, num_train=1079)
    assert results[0]["oom_retries"] == 0
    assert results[0]["micro_batch"] is None
    assert results[1]["oom_retries"] == 2
    assert results[1]["micro_batch"] == 16
    assert results[1]["accumulation_steps"] == 4
    assert results[1]["val_accuracy"] > 0.5


@pytest.mark.ray
def test_out_of_memory_at_micro_batch_one_fails_with_a_clear_reason(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    """Every rank raises :class:`workers.loop.TrialOOMError` together; the trial ends with a
    last report that says why (no metric, ``done``) and its workers train the next trial."""
    schedule = Schedule.constant(8, 1, 0.05)
    trainable = start_trial(trial_config(schedule, OOMAlwaysTask.name))
    pids = trainable.worker_pids
    last = trainable.train()
    assert last["done"] is True
    failure = failure_of(last)
    assert failure is not None
    assert "out of memory" in failure
    assert "even with micro-batch 1" in failure
    assert last["val_accuracy"] is None
    assert last["score"] is None
    assert last["steps"] == 0
    assert last["epoch"] == 0  # the epoch it failed in, not trained
    objective = StudyObjective(AccuracyObjective(), total_epochs=1)
    status, reason = trial_status(objective, last, error=False)
    assert status == "failed"
    assert "out of memory" in reason
    assert objective.values(last) is None

    # The same processes train the next trial.
    digits = Schedule.constant(32, 1, 0.05)
    trainable = start_trial(trial_config(digits, "digits"))
    assert trainable.worker_pids == pids
    results = run_trial(trainable)
    assert results[-1]["val_accuracy"] > 0.5
    assert failure_of(results[-1]) is None


@pytest.mark.ray
@pytest.mark.slow
def test_drop_last_false_trains_every_sample(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    # 1079 samples at batch 100: 10 full steps and a last step of 79 samples, split 40/39
    # over the two workers (an even split is impossible; the gradient is still the mean).
    schedule = Schedule.constant(100, 2, 0.05)
    trainable = start_trial(trial_config(schedule, "digits", drop_last=False))
    results = run_trial(trainable)
    assert [r["steps"] for r in results] == [11, 22]
    assert [r["samples"] for r in results] == [1079, 2158]
    assert schedule.total_steps(1079, drop_last=False) == 22
    assert results[-1]["local_batches"] == [50, 50]
    assert results[-1]["val_accuracy"] > 0.8


@pytest.mark.ray
@pytest.mark.slow
def test_single_worker_noise_scale_comes_from_accumulation(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    schedule = Schedule.constant(64, 2, 0.05)
    trainable = start_trial(trial_config(schedule, "digits", workers=1))
    plain = run_trial(trainable)
    # One worker, no accumulation: no smaller batch to compare with, so no noise scale.
    assert [r["noise_scale"] for r in plain] == [None, None]
    trainable.reset_config(trial_config(schedule, "digits", workers=1, micro_batch=16))
    accumulated = run_trial(trainable)
    assert all(r["accumulation_steps"] == 4 for r in accumulated)
    assert all(isinstance(r["noise_scale"], float) for r in accumulated)
    assert all(r["noise_scale"] > 0 for r in accumulated)
    # Accumulation changes how the batch is computed, not what is learned.
    for a, b in zip(plain, accumulated, strict=True):
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
        assert a["val_accuracy"] == pytest.approx(b["val_accuracy"], abs=0.01)


@pytest.mark.ray
@pytest.mark.slow
def test_single_worker_measures_the_noise_scale_at_each_epochs_end_and_trains_the_same(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    # mnist1d's net has BatchNorm: the measurement's forward passes would move its running
    # statistics (and so the validation metrics) if the run's state were not put back.
    schedule = Schedule.constant(64, 3, 0.05)
    trainable = start_trial(trial_config(schedule, "mnist1d", workers=1))
    plain = run_trial(trainable)
    assert [r["noise_scale"] for r in plain] == [None, None, None]
    trainable.reset_config(trial_config(schedule, "mnist1d", workers=1, noise_batches=8))
    measured = run_trial(trainable)
    assert all(isinstance(r["noise_scale"], float) and r["noise_scale"] > 0 for r in measured)
    # Nothing of the run changes: the same losses and accuracies, to the last bit.
    for key in ("train_loss", "val_loss", "val_accuracy", "steps", "samples"):
        assert [r[key] for r in measured] == [r[key] for r in plain], key
    # With accumulation the per-step estimator measures it and the key is not needed.
    trainable.reset_config(
        trial_config(schedule, "mnist1d", workers=1, micro_batch=32, noise_batches=8)
    )
    accumulated = run_trial(trainable)
    assert all(r["accumulation_steps"] == 2 for r in accumulated)
    assert all(r["noise_scale"] > 0 for r in accumulated)


@pytest.mark.ray
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_path_uses_bf16_autocast_and_channels_last(
    start_trial: Callable[[dict[str, Any]], ScheduleTrainable],
) -> None:
    schedule = Schedule.constant(32, 2, 0.05)
    trainable = start_trial(
        trial_config(schedule, Images4dTask.name, workers=1, gpus_per_worker=1.0)
    )
    (info,) = trainable.worker_info
    assert info["device"].startswith("cuda")
    assert info["backend"] == "nccl"
    assert info["amp"] is True
    assert info["channels_last"] is True
    results = run_trial(trainable)
    assert all(math.isfinite(r["train_loss"]) for r in results)
    assert results[-1]["val_accuracy"] > 0.5
