"""The per-worker data-parallel training loop of one trial.

Every rank of a :class:`workers.gang.Gang` holds one :class:`TrialWorker`. The gang keeps the
processes and the ``torch.distributed`` process group; :meth:`TrialWorker.configure` starts a
trial in them (model, optimizer, RNGs from the trial's seed; task data from the in-process
cache) and :meth:`TrialWorker.train_epoch` trains one epoch of the trial's schedule.

How one epoch runs, on every rank:

* The epoch's stage gives the global batch ``B``; the epoch has
  ``Schedule.steps_per_epoch(stage, N, drop_last)`` optimizer steps.
* The steps, their LRs and samples are the step plan's (:mod:`tuner.step_plan`, which the
  production runtime :mod:`tuner.runtime` iterates too). Every rank has the same order of the
  ``N`` training indices, :func:`~tuner.step_plan.epoch_order` of ``(trial seed, epoch)``.
  Optimizer step ``k`` uses the global batch ``order[k*B:(k+1)*B]``; rank ``r`` takes its
  contiguous slice, of length ``local_batches[r]`` from :func:`~tuner.step_plan.split_step`
  (equal shares, or shares proportional to measured throughput with ``performance_aware``),
  and runs it as ``accumulation_steps`` micro-batches of at most ``micro_batch`` samples.
* The loss of a micro-batch is the *sum* of its per-sample losses divided by ``B``; gradients
  accumulate in one flat buffer (the parameters' ``.grad`` are views of it) that is
  all-reduced with SUM once per step, so whatever the split the synchronized gradient is
  exactly the mean gradient over the global batch. The same all-reduce carries a few scalars
  (loss, local squared gradient norm, ...): one collective per optimizer step.
* The LR of step ``k`` is ``Schedule.lr_at(epoch + k / steps)`` (warm-up and decay included),
  set before every optimizer step.
* BatchNorm normalises with *local* (per-rank micro-batch) statistics; the running statistics
  are averaged across ranks before each evaluation, so every rank holds the same model.
* At the epoch's end the validation split is evaluated sharded over the ranks and the totals
  all-reduced.

Failure handling: a non-finite loss or gradient stops the trial as diverged (the offending
step is not applied, so the model and the metrics so far stay finite); a
``torch.OutOfMemoryError`` on any rank makes every rank drop that step and retry it with half
the micro-batch (more accumulation) until micro-batch 1, then :class:`TrialOOMError`.

On CUDA the forward pass runs under bf16 autocast, 4-D inputs use channels-last and AdamW / SGD
run their fused kernels; the trial config's ``compile`` key compiles the model
(``nn.Module.compile``, in place). The trial
config's keys, their rules and defaults are :class:`tuner.trial_config.TrialConfig`'s.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from tuner.errors import StagetuneError, ValidationError
from tuner.schedule import BatchPlacement, PlacementError, Schedule, place, place_batch
from tuner.step_plan import epoch_order, epoch_steps, split_step
from tuner.trial_config import TrialConfig
from workers.gang import WorkerContext
from workers.noise_scale import NoiseScaleEstimator
from workers.tasks import (
    AnyTaskData,
    DatasetData,
    Task,
    TaskData,
    evaluate_sums,
    get_task,
    register_task,
)
from workers.tasks.base import Split, collate_pair, evaluate_batches, metric_spread
from workers.trial_worker import TrialOOMError

__all__ = [
    "LARS",
    "TrialOOMError",
    "TrialWorker",
]

#: Scalars that ride along in the gradient all-reduce.
_EXTRA_SLOTS = 5  # loss, local |g|^2, 1/local batch, active ranks, OOM ranks


class _PlannedBatches:
    """A DataLoader's batch sampler whose batches are set before each pass: the index lists
    of this rank's samples of every step of an epoch (the loop computes them from the step
    plan), so the loader's workers read exactly the samples the loop will train on next."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []

    def __iter__(self) -> Iterator[list[int]]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)


class _Indexed(torch.utils.data.Dataset[Any]):
    """A dataset whose samples carry their index (to check a batch read ahead is the one)."""

    def __init__(self, data: DatasetData, split: Split) -> None:
        self.dataset = data.dataset(split)

    def __getitem__(self, index: int) -> tuple[int, Any]:
        return index, self.dataset[index]

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]


class _StepLoader:
    """Reads a :class:`~workers.tasks.DatasetData` trial's training batches ahead in
    DataLoader worker processes (persistent for the data), one batch per optimizer step (this
    rank's samples of it), and its validation shard in evaluation batches."""

    def __init__(self, data: DatasetData, *, pin: bool) -> None:
        self.data = data
        self._sampler = _PlannedBatches()
        collate = data.collate

        def collate_indexed(samples: list[tuple[int, Any]]) -> tuple[torch.Tensor, Any, Any]:
            x, y = collate_pair(collate, [s for _, s in samples])
            return torch.tensor([i for i, _ in samples], dtype=torch.int64), x, y

        self._collate = collate_indexed
        self._pin = pin
        self._train = torch.utils.data.DataLoader(
            _Indexed(data, "train"),
            batch_sampler=self._sampler,
            num_workers=data.loader_workers,
            collate_fn=collate_indexed,
            pin_memory=pin,
            persistent_workers=True,
        )
        self._iter: Iterator[tuple[torch.Tensor, Any, Any]] | None = None
        self._last: tuple[torch.Tensor, Any, Any] | None = None  # for a step retried (OOM)

    def start(self, batches: Sequence[torch.Tensor]) -> None:
        """Read these index lists (one per step) in order from now on."""
        self._sampler.batches = [b.tolist() for b in batches if b.numel()]
        self._iter = iter(self._train) if self._sampler.batches else None
        self._last = None

    def take(self, indices: torch.Tensor) -> tuple[Any, Any] | None:
        """The next batch read ahead if it holds exactly ``indices`` (or the last one again,
        for a step retried after an OOM), else None."""
        wanted = indices.cpu()
        if self._last is not None and torch.equal(self._last[0], wanted):
            return self._last[1], self._last[2]
        if self._iter is None:
            return None
        try:
            got, x, y = next(self._iter)
        except StopIteration:
            self._iter = None
            return None
        if not torch.equal(got, wanted):
            self._iter = None  # out of step (a probe's batch is not planned): read directly
            return None
        self._last = (got, x, y)
        return x, y

    def read(self, split: Split, lo: int, hi: int, batch: int) -> Iterator[tuple[Any, Any]]:
        """Samples ``lo`` to ``hi`` of ``split`` in batches, read by the loader's workers."""
        if hi <= lo:
            return
        subset = torch.utils.data.Subset(_Indexed(self.data, split), range(lo, hi))
        loader = torch.utils.data.DataLoader(
            subset,
            batch_size=batch,
            num_workers=min(self.data.loader_workers, max(1, (hi - lo) // batch)),
            collate_fn=self._collate,
            pin_memory=self._pin,
        )
        for _, x, y in loader:
            yield x, y

    def close(self) -> None:
        self._iter = None
        iterator = getattr(self._train, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()


# --------------------------------------------------------------------------------------------
# trial config


def _seed(*parts: int) -> int:
    """An independent 63-bit seed for the stream ``parts`` (e.g. (seed, purpose, epoch))."""
    state = np.random.SeedSequence([int(p) & 0xFFFFFFFF for p in parts]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1]))


def _to_cpu(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_cpu(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_cpu(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_to_cpu(v) for v in value)
    return value


# --------------------------------------------------------------------------------------------
# LARS (You, Gitman, Ginsburg 2017)


class LARS(torch.optim.Optimizer):
    """SGD with momentum and layer-wise adaptive rate scaling.

    For every parameter tensor with more than one dimension the step is scaled by the trust
    ratio ``eta * |w| / (|g| + weight_decay * |w|)``; biases and normalisation parameters
    (1-D) get plain momentum SGD. Weight decay is added to the gradient (coupled).
    """

    def __init__(
        self,
        params: Any,
        lr: float,
        momentum: float = 0.9,
        weight_decay: float = 0.0,
        eta: float = 0.001,
        eps: float = 1e-9,
    ) -> None:
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "weight_decay": weight_decay,
            "eta": eta,
            "eps": eps,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:  # type: ignore[override]
        for group in self.param_groups:
            lr, mom, wd = group["lr"], group["momentum"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if p.ndim > 1:
                    w_norm = torch.linalg.vector_norm(p)
                    g_norm = torch.linalg.vector_norm(grad)
                    trust = torch.where(
                        (w_norm > 0) & (g_norm > 0),
                        group["eta"] * w_norm / (g_norm + wd * w_norm + group["eps"]),
                        torch.ones_like(w_norm),
                    )
                    update = (grad + wd * p) * trust
                else:
                    update = grad + wd * p if wd else grad.clone()
                state = self.state[p]
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = state["momentum_buffer"] = update.detach().clone()
                else:
                    buf.mul_(mom).add_(update)
                p.add_(buf, alpha=-lr)


def _make_optimizer(schedule: Schedule, params: list[nn.Parameter]) -> torch.optim.Optimizer:
    lr = schedule.lr_at(0.0)
    # On a GPU, AdamW and SGD run their fused kernels (a few launches for all parameters, not
    # several per tensor); the state they keep is the same, so checkpoints move between devices.
    fused = True if params and all(p.is_cuda for p in params) else None
    if schedule.optimizer == "adamw":
        return torch.optim.AdamW(
            params,
            lr=lr,
            betas=(schedule.momentum, 0.999),
            weight_decay=schedule.weight_decay,
            fused=fused,
        )
    if schedule.optimizer == "lars":
        return LARS(params, lr=lr, momentum=schedule.momentum, weight_decay=schedule.weight_decay)
    return torch.optim.SGD(
        params, lr=lr, momentum=schedule.momentum, weight_decay=schedule.weight_decay, fused=fused
    )


def _load_optimizer_state(optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]) -> None:
    """Load a saved optimizer state, keeping this optimizer's own kernel choice (``fused``):
    a state saved on a GPU (fused kernels) loads into a CPU trial and the other way round.
    The choice is written into the saved groups before loading, so that torch places each
    parameter's ``step`` where that kernel wants it (on the parameter's device when fused)."""
    groups = [dict(group) for group in saved["param_groups"]]
    for group, own in zip(groups, optimizer.param_groups, strict=True):
        if "fused" in own:
            group["fused"] = own["fused"]
    optimizer.load_state_dict({**saved, "param_groups": groups})


# --------------------------------------------------------------------------------------------
# the worker


@dataclass
class _StepOutcome:
    oom: bool = False
    finite: bool = True
    loss: float = 0.0
    grad_sq: float = 0.0


class TrialWorker:
    """One rank's trial state. Built by the gang once per process; configured per trial."""

    def __init__(self, context: WorkerContext, tasks: Sequence[Task] = ()) -> None:
        self.ctx = context
        self.rank = context.rank
        self.world_size = context.world_size
        self.device = torch.device(context.device)
        for task in tasks:
            register_task(task, replace=True)
        self._spec: TrialConfig | None = None
        self._device_data: tuple[int, AnyTaskData] | None = None  # (id of the CPU data, on device)
        self._loader: _StepLoader | None = None  # DatasetData with loader workers
        # This rank's samples of the current step when read ahead: (indices, x, y, used).
        self._local: tuple[torch.Tensor, Any, Any, int] | None = None

    # ------------------------------------------------------------------ trial set-up

    def configure(self, config: Mapping[str, Any]) -> dict[str, Any]:
        """Start a trial: data (cached), model, optimizer and RNGs from the trial's seed."""
        started = time.perf_counter()
        spec = TrialConfig.from_config(config)
        if spec.workers != self.world_size:
            raise ValidationError(
                f"the trial wants {spec.workers} workers but this gang has {self.world_size}"
            )
        self._spec = None  # until fully configured
        task = get_task(spec.task)
        options = task.validate_options(spec.task_options)
        data = self._load(task, options, spec.seed)
        n = data.num_train
        schedule = spec.schedule
        schedule.stage_steps(n, drop_last=spec.drop_last)  # ScheduleError: batch > dataset
        uneven = any(st.batch_size % self.world_size for st in schedule.stages)
        place(
            schedule,
            self.world_size,
            spec.micro_batch,
            speed_weights=(1.0,) * self.world_size if uneven else None,
        )  # PlacementError naming the stage that cannot be placed

        torch.manual_seed(spec.seed)
        model = task.build_model(options).to(self.device)
        self._channels_last = self.device.type == "cuda" and data.sample_dims == 4
        if self._channels_last:
            model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        if spec.compile:
            model.compile()  # in place: the state dict keeps its keys (checkpoints, forks)
        model.train()
        if self.world_size > 1:
            with torch.no_grad():
                for tensor in [*model.parameters(), *model.buffers()]:
                    dist.broadcast(tensor.data, src=0)
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValidationError(f"the model of task {spec.task!r} has no trainable parameters")
        dtype = params[0].dtype
        numel = sum(p.numel() for p in params)
        self._flat = torch.zeros(numel + _EXTRA_SLOTS, dtype=dtype, device=self.device)
        self._views: list[torch.Tensor] = []
        offset = 0
        for p in params:
            view = torch.as_strided(self._flat, p.shape, p.stride(), offset)
            p.grad = view
            self._views.append(view)
            offset += p.numel()
        self._params = params
        self._num_params = numel
        self._model = model
        self._optimizer = _make_optimizer(schedule, params)
        self._task = task
        self._data = data
        torch.manual_seed(_seed(spec.seed, 1, self.rank))  # dropout and other global draws
        self._aug_generator = torch.Generator(device=self.device)
        self._aug_generator.manual_seed(_seed(spec.seed, 2, self.rank))
        self._noise = NoiseScaleEstimator(beta=spec.noise_scale_ema)
        self._micro_batch = spec.micro_batch
        self._oom_retries = 0
        self._eval_keys: list[str] | None = None
        self._steps = 0
        self._samples = 0
        self._wall_time = 0.0
        self._diverged = False
        self._placements: dict[tuple[int, int | None, tuple[float, ...] | None], BatchPlacement]
        self._placements = {}
        self._speed: float | None = None
        self._weights: tuple[float, ...] | None = None
        self._spec = spec
        if spec.performance_aware and self.world_size > 1:
            self._speed = self._calibrate()
        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "device": str(self.device),
            "backend": self.ctx.backend,
            "amp": self.device.type == "cuda" and spec.amp,
            "channels_last": self._channels_last,
            "compile": spec.compile,
            "num_train": n,
            "num_val": data.num_val,
            "parameters": numel,
            "configure_s": time.perf_counter() - started,
        }

    def _load(self, task: Task, options: Mapping[str, Any], seed: int) -> AnyTaskData:
        cpu = task.load_data(options, seed)  # cached in-process by the task registry
        if self._loader is not None and self._loader.data is not cpu:
            self._loader.close()
            self._loader = None
        if isinstance(cpu, DatasetData):
            if cpu.loader_workers > 0 and self._loader is None:
                self._loader = _StepLoader(cpu, pin=self.device.type == "cuda")
            return cpu
        if self.device.type == "cpu":
            return cpu
        if self._device_data is not None and self._device_data[0] == id(cpu):
            return self._device_data[1]
        self._device_data = None
        moved = cpu.to(self.device)
        self._device_data = (id(cpu), moved)
        return moved

    def _require(self) -> TrialConfig:
        if self._spec is None:
            raise StagetuneError("no trial is configured on this worker; call configure() first")
        return self._spec

    # ------------------------------------------------------------------ one epoch

    def train_epoch(self, epoch: int) -> dict[str, Any]:
        """Train epoch ``epoch`` of the schedule and evaluate; this rank's view of the epoch."""
        spec = self._require()
        schedule = spec.schedule
        if not 0 <= epoch < schedule.total_epochs:
            raise ValidationError(
                f"epoch {epoch} is outside the schedule's epochs 0-{schedule.total_epochs - 1}"
            )
        if self._diverged:
            raise StagetuneError("the trial diverged; configure a new trial first")
        started = time.perf_counter()
        stage_index = schedule.stage_index_at(epoch)
        batch = schedule.stages[stage_index].batch_size
        n = self._data.num_train
        # The step plan (tuner.step_plan) the production runtime iterates too: each step's
        # LR, global batch and slice of the epoch's sample order.
        plan = list(epoch_steps(schedule, n, epoch, drop_last=spec.drop_last))
        perm = self._permutation(epoch)
        weights = self._exchange_speed() if spec.performance_aware and self.world_size > 1 else None
        if self._loader is not None:  # read this rank's samples of every step ahead
            self._loader.start(
                [
                    self._mine(perm[st.start : st.stop], self._placement(st.global_batch, weights))
                    for st in plan
                ]
            )
        compute_s = 0.0
        local_samples = 0
        loss_sum = 0.0
        applied = 0
        epoch_samples = 0
        last_lr = schedule.lr_at(float(epoch))
        k = 0
        while k < len(plan):
            step = plan[k]
            idx = perm[step.start : step.stop]
            b = step.global_batch
            placement = self._placement(b, weights)
            lr = step.lr
            outcome = self._train_step(idx, placement, lr)
            compute_s += self._last_compute_s
            if outcome.oom:
                self._shrink_micro_batch(placement, stage_index)
                continue
            if not outcome.finite:
                self._diverged = True
                break
            local_samples += placement.local_batches[self.rank]
            loss_sum += outcome.loss
            applied += 1
            epoch_samples += b
            last_lr = lr
            k += 1
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        epoch_time = time.perf_counter() - started
        self._steps += applied
        self._samples += epoch_samples
        self._wall_time += epoch_time
        if compute_s > 0 and local_samples > 0:
            self._speed = local_samples / compute_s
        if spec.noise_batches and not self._diverged:
            self._measure_noise_scale(epoch, batch)

        eval_started = time.perf_counter()
        metrics = self._evaluate(with_spread=True)
        eval_time = time.perf_counter() - eval_started
        if metrics["val_loss"] is None:
            self._diverged = True
        probe: dict[str, Any] = {}
        done = epoch + 1
        if not self._diverged and done in spec.probe_at and done < schedule.total_epochs:
            probe = self.probe(done, last_lr, weights)
        # The stage's split as it stands at the epoch's end (after any OOM retries).
        placement = self._placement(batch, weights)
        return {
            **probe,
            "epoch": epoch,
            "stage": stage_index,
            "batch_size": batch,
            "lr": last_lr,
            "steps": self._steps,
            "samples": self._samples,
            "steps_in_epoch": applied,
            "train_loss": loss_sum / applied if applied else None,
            **metrics,
            "epoch_time_s": epoch_time,
            "eval_time_s": eval_time,
            "samples_per_s": epoch_samples / epoch_time if epoch_time > 0 else 0.0,
            "wall_time_s": self._wall_time,
            "noise_scale": self._noise.value,
            "diverged": self._diverged,
            "accumulation_steps": placement.accumulation_steps,
            "local_batches": list(placement.local_batches),
            "micro_batch": self._micro_batch,
            "oom_retries": self._oom_retries,
            "speed_weights": list(weights) if weights is not None else None,
            "compute_time_s": compute_s,
            "rank": self.rank,
            "pid": os.getpid(),
        }

    def _permutation(self, epoch: int) -> torch.Tensor:
        spec = self._require()
        order = epoch_order(spec.seed, epoch, self._data.num_train)
        return torch.from_numpy(order).to(self.device)

    def _placement(self, batch: int, weights: tuple[float, ...] | None) -> BatchPlacement:
        key = (batch, self._micro_batch, weights)
        cached = self._placements.get(key)
        if cached is None:
            cached = split_step(batch, self.world_size, self._micro_batch, weights)
            self._placements[key] = cached
        return cached

    def _autocast(self) -> contextlib.AbstractContextManager[Any]:
        spec = self._require()
        if self.device.type == "cuda" and spec.amp:
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _mine(self, indices: torch.Tensor, placement: BatchPlacement) -> torch.Tensor:
        """This rank's contiguous slice of a step's global batch."""
        start = sum(placement.local_batches[: self.rank])
        return indices[start : start + placement.local_batches[self.rank]]

    def _fetch(self, split: Split, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples ``indices`` of ``split`` on this rank's device."""
        x, y = self._data.batch(split, indices)
        return self._on_device(x), self._on_device(y)

    def _on_device(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.device == self.device else t.to(self.device, non_blocking=True)

    def _fetch_train(self, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """A micro-batch's training samples: a slice of the local batch read ahead when it is
        the next part of it, else read now."""
        local = self._local
        if local is not None:
            mine, x, y, pos = local
            m = int(indices.numel())
            if pos + m <= mine.numel() and torch.equal(mine[pos : pos + m], indices.cpu()):
                self._local = (mine, x, y, pos + m)
                return x[pos : pos + m], y[pos : pos + m]
        return self._fetch("train", indices)

    def _forward_backward(self, indices: torch.Tensor, global_batch: int) -> torch.Tensor:
        spec = self._require()
        x, y = self._fetch_train(indices)
        x = self._task.augment_batch(x, self._aug_generator)
        if self._channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        with self._autocast():
            logits = self._model(x)
        if logits.dtype in (torch.bfloat16, torch.float16):
            logits = logits.float()
        loss = self._task.loss(logits, y, label_smoothing=spec.schedule.label_smoothing) / float(
            global_batch
        )
        torch.autograd.backward(loss)
        return loss.detach()

    def _accumulate(
        self, indices: torch.Tensor, placement: BatchPlacement
    ) -> tuple[torch.Tensor, bool, float, float, int]:
        """Forward/backward of this rank's micro-batches into the flat gradient buffer.

        Returns (summed loss, OOM?, micro-batch sum of |g_micro|^2, sum of 1/micro, count);
        the micro-batch norms are only measured with one worker and accumulation.
        """
        flat = self._flat
        p = self._num_params
        b = placement.global_batch
        mine = self._mine(indices, placement)
        self._local = None
        if self._loader is not None and mine.numel():
            read = self._loader.take(mine)  # None: not the batch read ahead (a probe's)
            if read is not None:
                self._local = (mine.cpu(), self._on_device(read[0]), self._on_device(read[1]), 0)
        loss = torch.zeros((), dtype=flat.dtype, device=self.device)
        track = self.world_size == 1 and placement.accumulation_steps > 1
        prev: torch.Tensor | None = None
        micro_sq = micro_inv = 0.0
        count = 0
        pos = 0
        for m in placement.micro_batches[self.rank]:
            if m == 0:
                continue
            part = mine[pos : pos + m]
            pos += m
            try:
                loss += self._forward_backward(part, b)
            except torch.OutOfMemoryError:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                return loss, True, 0.0, 0.0, 0
            if track:
                grad = flat[:p]
                diff = grad if prev is None else grad - prev
                micro_sq += float(diff.double().square().sum()) * (b / m) ** 2
                micro_inv += 1.0 / m
                count += 1
                prev = grad.clone()
        return loss, False, micro_sq, micro_inv, count

    def _train_step(
        self, indices: torch.Tensor, placement: BatchPlacement, lr: float
    ) -> _StepOutcome:
        spec = self._require()
        flat = self._flat
        p = self._num_params
        b = placement.global_batch
        local = placement.local_batches[self.rank]
        flat.zero_()
        t0 = time.perf_counter()
        loss, oom, micro_sq, micro_inv, micro_count = self._accumulate(indices, placement)
        self._restore_grad_views()
        if self.device.type == "cuda" and (spec.performance_aware or spec.slowdown):
            torch.cuda.synchronize(self.device)
        compute = time.perf_counter() - t0
        factor = spec.slowdown.get(self.rank, 1.0)
        if factor > 1.0:
            time.sleep((factor - 1.0) * compute)
            compute = time.perf_counter() - t0
        self._last_compute_s = compute

        with torch.no_grad():
            local_sq = flat[:p].square().sum() * (b / local) ** 2 if local else flat.new_zeros(())
            flat[p] = loss
            flat[p + 1] = local_sq
            flat[p + 2] = 1.0 / local if local else 0.0
            flat[p + 3] = 1.0 if local else 0.0
            flat[p + 4] = 1.0 if oom else 0.0
        if self.world_size > 1:
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        with torch.no_grad():
            big_sq = flat[:p].square().sum()
            stats = torch.cat([flat[p:], big_sq.reshape(1)]).tolist()
        g_loss, small_sum, inv_sum, active, oom_ranks, big = stats
        if oom_ranks > 0:
            flat.zero_()
            return _StepOutcome(oom=True)
        if not (math.isfinite(g_loss) and math.isfinite(big)):
            flat.zero_()
            return _StepOutcome(finite=False, loss=g_loss)
        for group in self._optimizer.param_groups:
            group["lr"] = lr
        self._optimizer.step()
        if self.world_size > 1 and active >= 2:
            self._noise.update(small_sum / active, inv_sum / active, big, 1.0 / b)
        elif micro_count >= 2:
            self._noise.update(micro_sq / micro_count, micro_inv / micro_count, big, 1.0 / b)
        return _StepOutcome(loss=g_loss, grad_sq=big)

    def _restore_grad_views(self) -> None:
        # Autograd accumulates into an existing .grad in place; if anything replaced a .grad
        # (an optimizer's zero_grad(set_to_none), a custom hook), copy it back into the buffer.
        for param, view in zip(self._params, self._views, strict=True):
            if param.grad is not view:
                if param.grad is not None:
                    view.copy_(param.grad)
                param.grad = view

    def _shrink_micro_batch(self, placement: BatchPlacement, stage_index: int) -> None:
        current = placement.max_micro_batch
        if current <= 1:
            raise TrialOOMError(
                f"out of memory at global batch {placement.global_batch} (stage "
                f"{stage_index + 1}) even with micro-batch 1 after {self._oom_retries} retries; "
                "use a smaller batch or more workers"
            )
        new = max(1, current // 2)
        try:
            split_step(placement.global_batch, self.world_size, new)
        except PlacementError as exc:
            raise TrialOOMError(
                f"out of memory at global batch {placement.global_batch} (stage "
                f"{stage_index + 1}) with micro-batch {current}, and a smaller micro-batch "
                f"cannot be placed: {exc}"
            ) from exc
        self._micro_batch = new
        self._oom_retries += 1
        self._placements.clear()

    # ------------------------------------------------------------------ cooldown probes

    def probe(
        self, epochs_done: int, lr: float, weights: tuple[float, ...] | None = None
    ) -> dict[str, Any]:
        """A cooldown probe from the state after ``epochs_done`` epochs: train
        ``probe_fraction * epochs_done`` epochs' worth of steps at the batch of the stage just
        trained, with the LR annealed linearly from ``lr`` (the LR of the last step) to zero,
        evaluate, and put the trial's state back exactly as it was (model, optimizer, RNGs,
        noise-scale estimator, counters), so the main run goes on as if no probe had run.

        A run at a high LR or a large batch shows its progress only once its LR decays (Hägele
        et al. 2024): the probe's accuracy predicts where the run ends, mid-run accuracy does
        not. The probe's data order is its own stream (seed, 3, epochs_done), so the main run's
        permutations are untouched. Returns ``probe_`` + each of the task's metrics
        (``probe_val_accuracy``, ``probe_val_loss``, ...; None if the probe diverged),
        ``probe_steps``, ``probe_epochs`` (its length in epochs of the
        stage) and ``probe_time_s``."""
        spec = self._require()
        schedule = spec.schedule
        started = time.perf_counter()
        stage_index = schedule.stage_index_at(epochs_done - 1)
        batch = schedule.stages[stage_index].batch_size
        n = self._data.num_train
        per_epoch = schedule.steps_per_epoch(stage_index, n, drop_last=spec.drop_last)
        steps = max(1, round(spec.probe_fraction * epochs_done * per_epoch))
        generator = torch.Generator().manual_seed(_seed(spec.seed, 3, epochs_done))
        saved = self._snapshot()
        metrics: dict[str, float | None] = dict.fromkeys(self._task.metrics)
        try:
            perm = torch.randperm(n, generator=generator).to(self.device)
            k = j = 0
            finite = True
            while k < steps:
                if j >= per_epoch:  # one permutation holds an epoch's batches
                    perm = torch.randperm(n, generator=generator).to(self.device)
                    j = 0
                idx = perm[j * batch : min((j + 1) * batch, n)]
                placement = self._placement(int(idx.numel()), weights)
                outcome = self._train_step(idx, placement, lr * (1.0 - k / steps))
                if outcome.oom:
                    self._shrink_micro_batch(placement, stage_index)
                    continue
                if not outcome.finite:
                    finite = False
                    break
                k += 1
                j += 1
            if finite:
                measured = self._evaluate()
                if measured["val_loss"] is not None:
                    metrics = measured
        finally:
            self._restore(saved)
        return {
            **{f"probe_{name}": value for name, value in metrics.items()},
            "probe_steps": steps,
            "probe_epochs": steps / per_epoch,
            "probe_time_s": time.perf_counter() - started,
        }

    def _measure_noise_scale(self, epoch: int, batch: int) -> None:
        """One worker without accumulation (:attr:`TrialConfig.noise_batches`): the gradient
        noise scale at the epoch's final parameters, from ``noise_batches`` disjoint batches
        of the epoch's size (their own sample order, stream ``(seed, 4, epoch)``): each one's
        gradient is a small batch, their mean the big one (``workers.noise_scale``). The
        estimator then holds this measurement alone. The run's state is put back exactly
        (BatchNorm's running statistics, RNGs), as after a probe. Several workers or
        accumulation measure every step instead; nothing runs here then."""
        spec = self._require()
        n = self._data.num_train
        count = min(spec.noise_batches, n // batch)
        if self.world_size > 1 or count < 2:
            return
        placement = self._placement(batch, None)
        if placement.accumulation_steps > 1:
            return
        p = self._num_params
        generator = torch.Generator().manual_seed(_seed(spec.seed, 4, epoch))
        order = torch.randperm(n, generator=generator)[: count * batch].to(self.device)
        saved = self._snapshot()
        total: torch.Tensor | None = None
        small_sq = 0.0
        try:
            for i in range(count):
                self._flat.zero_()
                _, oom, _, _, _ = self._accumulate(order[i * batch : (i + 1) * batch], placement)
                self._restore_grad_views()
                if oom:
                    return
                grad = self._flat[:p]
                small_sq += float(grad.double().square().sum())
                total = grad.double().clone() if total is None else total.add_(grad.double())
        finally:
            self._restore(saved)
        assert total is not None
        big_sq = float(total.div_(count).square().sum())
        self._noise.reset()
        self._noise.update(small_sq / count, 1.0 / batch, big_sq, 1.0 / (count * batch))

    def _snapshot(self) -> dict[str, Any]:
        """This rank's whole trial state, in memory (for a probe to put back)."""
        return {
            "model": {k: v.detach().clone() for k, v in self._model.state_dict().items()},
            "optimizer": copy.deepcopy(self._optimizer.state_dict()),
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device)
            if self.device.type == "cuda"
            else None,
            "aug_rng": self._aug_generator.get_state(),
            "noise": copy.deepcopy(self._noise.get_state()),
        }

    def _restore(self, saved: Mapping[str, Any]) -> None:
        with torch.no_grad():
            self._model.load_state_dict(saved["model"])
        _load_optimizer_state(self._optimizer, saved["optimizer"])
        self._restore_grad_views()
        self._flat.zero_()
        torch.set_rng_state(saved["rng"])
        if saved["cuda_rng"] is not None:
            torch.cuda.set_rng_state(saved["cuda_rng"], self.device)
        self._aug_generator.set_state(saved["aug_rng"])
        self._noise.set_state(saved["noise"])

    # ------------------------------------------------------------------ throughput

    def _exchange_speed(self) -> tuple[float, ...]:
        """The speed weights of this epoch, identical on every rank.

        Every rank's throughput (samples/s of forward+backward, from the calibration or the
        previous epoch) is all-reduced; the new weights are the geometric mean of the previous
        weights and the measured speeds (damping: a rank measured at a tiny share pays its
        per-pass overhead on few samples and would otherwise oscillate), normalised so the
        fastest rank has weight 1. The split converges to equal step times.
        """
        speeds = torch.zeros(self.world_size, dtype=torch.float64, device=self.device)
        speeds[self.rank] = self._speed if self._speed and self._speed > 0 else 1.0
        dist.all_reduce(speeds, op=dist.ReduceOp.SUM)
        values = [float(v) for v in speeds.tolist()]
        if self._weights is not None:
            values = [math.sqrt(v * w) for v, w in zip(values, self._weights, strict=True)]
        top = max(values)
        self._weights = tuple(v / top for v in values)
        return self._weights

    def _calibrate(self, repeats: int = 3) -> float:
        """Samples/s of forward+backward on a copy of the model (the trial's state is untouched)."""
        spec = self._require()
        stage0 = spec.schedule.stages[0].batch_size
        size = max(1, min(self._data.num_train, max(stage0 // self.world_size, 1), 256))
        if self._micro_batch is not None:
            size = min(size, self._micro_batch)
        model = copy.deepcopy(self._model)
        x, y = self._fetch("train", torch.arange(size))
        if self._channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        factor = spec.slowdown.get(self.rank, 1.0)

        def once() -> None:
            with self._autocast():
                logits = model(x)
            torch.autograd.backward(self._task.loss(logits.float(), y))

        try:
            once()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            for _ in range(repeats):
                once()
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            elapsed = time.perf_counter() - t0
        except torch.OutOfMemoryError:
            return 1.0
        if factor > 1.0:
            time.sleep((factor - 1.0) * elapsed)
            elapsed *= factor
        return repeats * size / max(elapsed, 1e-9)

    # ------------------------------------------------------------------ evaluation

    def _sync_buffers(self) -> None:
        if self.world_size == 1:
            return
        with torch.no_grad():
            for buf in self._model.buffers():
                if buf.is_floating_point():
                    dist.all_reduce(buf, op=dist.ReduceOp.SUM)
                    buf.div_(self.world_size)

    def _evaluate(self, *, with_spread: bool = False) -> dict[str, float | None]:
        """Sharded validation: the task's metrics (``val_<name>``) from its summed
        ``eval_sums`` over every rank's shard; ``val_loss`` is None if it is not finite (the
        trial diverged), as is any other metric that is not finite. ``with_spread`` adds
        ``val_<name>_sd``, the per-sample standard deviation of the metrics the task can
        tell it of (:func:`workers.tasks.base.metric_spread`; how finely the split reads
        them)."""
        spec = self._require()
        self._sync_buffers()
        nv = self._data.num_val
        lo = self.rank * nv // self.world_size
        hi = (self.rank + 1) * nv // self.world_size
        batch = spec.eval_batch_size
        while True:
            try:
                with self._autocast():
                    sums, count = self._eval_shard(lo, hi, batch)
                break
            except torch.OutOfMemoryError:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                if batch == 1:
                    raise
                batch = max(1, batch // 2)
        keys = self._eval_keys
        if keys is None:  # the same on every rank: a rank with an empty shard asks the task
            if not sums and self._data.num_val > 0:
                with self._autocast():
                    sums = dict.fromkeys(self._eval_shard(0, 1, 1)[0], 0.0)
            keys = sorted(sums)
            self._eval_keys = keys
        totals = torch.tensor(
            [*(sums.get(k, 0.0) for k in keys), count], dtype=torch.float64, device=self.device
        )
        if self.world_size > 1:
            dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        values = totals.tolist()
        count_total = int(values[-1])
        names_ = list(self._task.metrics)
        if count_total <= 0:
            return dict.fromkeys(names_)
        summed = dict(zip(keys, values[:-1], strict=True))
        computed = self._task.metrics_from_sums(summed, count_total)
        result: dict[str, float | None] = {}
        for name in names_:
            value = float(computed[name.removeprefix("val_")])
            result[name] = value if math.isfinite(value) else None
        if with_spread and result.get("val_loss") is not None:
            for name, sd in metric_spread(self._task, summed, count_total).items():
                if f"val_{name}" in result:
                    result[f"val_{name}_sd"] = sd
        return result

    def _eval_shard(self, lo: int, hi: int, batch: int) -> tuple[dict[str, float], int]:
        """The task's summed ``eval_sums`` over validation samples ``lo`` to ``hi``."""
        data = self._data
        if isinstance(data, TaskData):
            x, y = data.val_x[lo:hi], data.val_y[lo:hi]
            return evaluate_sums(self._task.eval_sums, self._model, x, y, batch)
        batches = (
            self._fetch("val", torch.arange(start, min(start + batch, hi)))
            for start in range(lo, hi, batch)
        )
        if self._loader is not None:
            batches = (
                (self._on_device(x), self._on_device(y))
                for x, y in self._loader.read("val", lo, hi, batch)
            )
        return evaluate_batches(self._task.eval_sums, self._model, batches)

    # ------------------------------------------------------------------ checkpoints

    def state(self) -> dict[str, Any]:
        """This rank's trial state (CPU tensors): model and optimizer from rank 0 only (every
        rank holds the same ones after an epoch), RNGs and counters from every rank."""
        self._require()
        out: dict[str, Any] = {
            "rank": self.rank,
            "rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state(self.device)
            if self.device.type == "cuda"
            else None,
            "aug_rng": self._aug_generator.get_state(),
            "noise": self._noise.get_state(),
            "steps": self._steps,
            "samples": self._samples,
            "wall_time": self._wall_time,
            "micro_batch": self._micro_batch,
            "oom_retries": self._oom_retries,
            "speed": self._speed,
            "weights": self._weights,
            "diverged": self._diverged,
        }
        if self.rank == 0:
            out["model"] = _to_cpu(self._model.state_dict())
            out["optimizer"] = _to_cpu(self._optimizer.state_dict())
        return out

    def load_state(self, state: Mapping[str, Any] | None, shared: Mapping[str, Any]) -> None:
        """Restore :meth:`state` (``shared``: rank 0's state with model and optimizer; ``state``
        None on rank 0, whose own state that is) into the configured trial."""
        self._require()
        if state is None:
            state = shared
        with torch.no_grad():
            self._model.load_state_dict(shared["model"])
        _load_optimizer_state(self._optimizer, shared["optimizer"])
        self._restore_grad_views()
        torch.set_rng_state(state["rng"])
        if state.get("cuda_rng") is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"], self.device)
        self._aug_generator.set_state(state["aug_rng"])
        self._noise.set_state(state["noise"])
        self._steps = int(state["steps"])
        self._samples = int(state["samples"])
        self._wall_time = float(state["wall_time"])
        self._micro_batch = state["micro_batch"]
        self._oom_retries = int(state["oom_retries"])
        self._speed = state["speed"]
        self._weights = state["weights"]
        self._diverged = bool(state["diverged"])
        self._placements.clear()

    # ------------------------------------------------------------------ test and bench hooks

    def synchronized_gradient(
        self,
        indices: Sequence[int],
        speed_weights: Sequence[float] | None = None,
        micro_batch: int | None = None,
    ) -> list[float]:
        """The all-reduced gradient of the trial's current model on the global batch
        ``indices`` (placed like a training step, optionally unevenly); nothing is updated."""
        self._require()
        idx = torch.as_tensor(list(indices), dtype=torch.int64, device=self.device)
        weights = tuple(float(w) for w in speed_weights) if speed_weights is not None else None
        placement = place_batch(int(idx.numel()), self.world_size, micro_batch, weights)
        self._flat.zero_()
        _, oom, _, _, _ = self._accumulate(idx, placement)
        if oom:
            raise TrialOOMError("out of memory while computing a gradient")
        self._restore_grad_views()
        if self.world_size > 1:
            dist.all_reduce(self._flat, op=dist.ReduceOp.SUM)
        grad = self._flat[: self._num_params].detach().cpu().tolist()
        self._flat.zero_()
        return [float(g) for g in grad]

    def parameters_digest(self) -> list[float]:
        """The model's parameters, flattened (to compare ranks and runs in tests)."""
        self._require()
        return [float(v) for v in torch.cat([p.detach().reshape(-1) for p in self._params])]
