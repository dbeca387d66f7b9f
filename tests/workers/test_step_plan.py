"""What is tuned is what runs: the trial loop and the production runtime (tuner.runtime)
iterate one step plan (tuner.step_plan), so for the same schedule, dataset, world size,
micro-batch and seed they run the same optimizer steps with the same LRs on the same samples,
and a plain PyTorch loop driven by the runtime trains the trial's model."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from tuner.runtime import ScheduleLR, ScheduleRuntime
from tuner.schedule import Schedule, Stage
from workers.gang import WorkerContext
from workers.loop import TrialWorker
from workers.tasks import evaluate, get_task
from workers.tasks.base import load_tensors

#: mnist1d with 1,000 training samples: 1000 % 48 = 40 and 1000 % 64 = 40, so the partial last
#: steps of drop_last=False split evenly over 2 and 4 workers.
OPTIONS = {"num_train_samples": 1000, "num_val_samples": 200, "num_test_samples": 200}
N = 1000
SEED = 11

SCHEDULES = {
    "one stage": Schedule.constant(32, 2, 0.05),
    "stages, warm-up, decay": Schedule(
        stages=(
            Stage(0, 1, 16),
            Stage(1, 2, 48, lr_multiplier=2.0, warmup_epochs=0.5),
            Stage(2, 4, 64, lr_multiplier=3.0, decay="cosine"),
        ),
        base_lr=0.05,
        base_batch_size=16,
    ),
}


def _record_loop(
    monkeypatch: pytest.MonkeyPatch,
    schedule: Schedule,
    world_size: int,
    rank: int,
    micro_batch: int | None,
    drop_last: bool,
) -> list[tuple[float, list[list[int]]]]:
    """Rank ``rank``'s steps as the trial loop runs them: (LR, the sample indices of each
    forward/backward pass). The collectives are skipped: one process plays one rank."""
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: None)
    monkeypatch.setattr(torch.distributed, "broadcast", lambda *a, **k: None)
    steps: list[tuple[float, list[list[int]]]] = []
    worker = TrialWorker(WorkerContext(rank, world_size, "cpu", "gloo", 1.0))
    train_step = worker._train_step
    forward_backward = worker._forward_backward

    def record_step(indices: torch.Tensor, placement: Any, lr: float) -> Any:
        steps.append((lr, []))
        return train_step(indices, placement, lr)

    def record_pass(indices: torch.Tensor, global_batch: int) -> torch.Tensor:
        steps[-1][1].append(indices.tolist())
        return forward_backward(indices, global_batch)

    monkeypatch.setattr(worker, "_train_step", record_step)
    monkeypatch.setattr(worker, "_forward_backward", record_pass)
    worker.configure(
        {
            "schedule": schedule.to_dict(),
            "task": "mnist1d",
            "task_options": OPTIONS,
            "seed": SEED,
            "workers": world_size,
            "micro_batch": micro_batch,
            "drop_last": drop_last,
        }
    )
    for epoch in range(schedule.total_epochs):
        worker.train_epoch(epoch)
    return steps


@pytest.mark.parametrize("name", list(SCHEDULES))
@pytest.mark.parametrize(
    ("world_size", "micro_batch", "drop_last"),
    [(1, None, True), (1, 12, False), (2, None, False), (2, 8, True), (4, 4, False)],
)
def test_the_runtime_yields_exactly_the_trial_loops_steps(
    monkeypatch: pytest.MonkeyPatch,
    name: str,
    world_size: int,
    micro_batch: int | None,
    drop_last: bool,
) -> None:
    schedule = SCHEDULES[name]
    for rank in range(world_size):
        ran = _record_loop(monkeypatch, schedule, world_size, rank, micro_batch, drop_last)
        rt = ScheduleRuntime(schedule, N, world_size, rank, micro_batch, drop_last, seed=SEED)
        planned: list[tuple[float, list[list[int]]]] = []
        for epoch in range(rt.num_epochs):
            passes = rt.micro_batch_indices(epoch)
            for step in rt.steps(epoch):
                planned.append((step.lr, [next(passes) for m in step.micro_batches if m]))
            assert next(passes, None) is None
        assert len(ran) == len(planned) == rt.total_steps
        for k, ((lr, samples), (want_lr, want_samples)) in enumerate(
            zip(ran, planned, strict=True)
        ):
            assert lr == want_lr, (rank, k)
            assert samples == want_samples, (rank, k)
        # The sampler a DataLoader would use yields the same lists.
        sampler = rt.batch_sampler()
        flat: list[list[int]] = []
        for epoch in range(rt.num_epochs):
            sampler.set_epoch(epoch)
            flat.extend(sampler)
        assert flat == [s for _, passes in planned for s in passes]


def test_a_plain_loop_driven_by_the_runtime_trains_the_trial_loops_model() -> None:
    """One worker: the trial loop, and the plainest PyTorch loop a user would write around
    ScheduleRuntime + ScheduleLR (same model init, optimizer and loss), give the same
    validation metrics after every epoch."""
    schedule = SCHEDULES["stages, warm-up, decay"]
    worker = TrialWorker(WorkerContext(0, 1, "cpu", "gloo", 1.0))
    worker.configure(
        {
            "schedule": schedule.to_dict(),
            "task": "mnist1d",
            "task_options": OPTIONS,
            "seed": SEED,
            "micro_batch": 16,
        }
    )
    trial = [worker.train_epoch(epoch) for epoch in range(schedule.total_epochs)]

    task = get_task("mnist1d")
    opts = task.validate_options(OPTIONS)
    data = load_tensors(task, opts, SEED)
    torch.manual_seed(SEED)
    model = task.build_model(opts)
    model.train()
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=schedule.lr_at(0.0),
        momentum=schedule.momentum,
        weight_decay=schedule.weight_decay,
    )
    rt = ScheduleRuntime(schedule, data.num_train, micro_batch=16, seed=SEED)
    scheduler = ScheduleLR(optimizer, schedule, data.num_train)
    sampler = rt.batch_sampler()
    plain = []
    for epoch in range(rt.num_epochs):
        sampler.set_epoch(epoch)
        batches = iter(sampler)
        for step in rt.steps(epoch):
            for size in step.micro_batches:
                idx = torch.as_tensor(next(batches))
                assert len(idx) == size
                logits = model(data.train_x[idx])
                loss = F.cross_entropy(logits, data.train_y[idx], reduction="sum")
                torch.autograd.backward(loss / step.global_batch)
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        model.eval()
        plain.append(evaluate(model, data.val_x, data.val_y))
        model.train()

    for epoch, (result, (val_loss, val_acc)) in enumerate(zip(trial, plain, strict=True)):
        assert result["val_accuracy"] == pytest.approx(val_acc, abs=1e-9), epoch
        assert result["val_loss"] == pytest.approx(val_loss, rel=1e-5), epoch
    assert trial[-1]["steps"] == rt.total_steps
