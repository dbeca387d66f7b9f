"""The runtime for users' own training loops: tuner.runtime without Ray or the service."""

from __future__ import annotations

import io
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F  # noqa: N812
from torch.utils.data import DataLoader, TensorDataset

from tests.imports import imported_after
from tuner.errors import ValidationError
from tuner.export import export_yaml
from tuner.runtime import ScheduleLR, ScheduleRuntime
from tuner.schedule import PlacementError, Schedule, Stage, StepInfo
from tuner.store.records import StudyRecord, StudyStatus, TrialRecord, TrialStatus

N = 200  # dataset size: 200 // 48 = 4 steps at batch 48 (8 dropped), 200 // 16 = 12


def staged_schedule() -> Schedule:
    """Warm-up, a step decay and a cosine stage: the LR changes inside epochs."""
    return Schedule(
        stages=(
            Stage(0, 2, 16, warmup_epochs=0.5),
            Stage(
                2,
                4,
                32,
                lr_multiplier=0.8,
                warmup_epochs=1.0,
                decay="step",
                step_every_epochs=0.5,
                step_gamma=0.5,
            ),
            Stage(4, 6, 48, lr_multiplier=0.5, decay="cosine", decay_final_factor=0.1),
        ),
        base_lr=0.05,
        base_batch_size=16,
        warmup_start_lr=0.01,
    )


def exported_yaml_file(tmp_path: Path, schedule: Schedule) -> Path:
    now = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    study = StudyRecord(
        id=7,
        name="runtime",
        owner=None,
        task="synthetic",
        spec={"resources": {"world_size": 2}},
        status=StudyStatus.COMPLETED,
        cancel_requested=False,
        budget=4,
        created_at=now,
        started_at=now,
        finished_at=now,
        heartbeat_at=None,
        worker_id=None,
        attempts=1,
        error=None,
        best_trial_id=1,
        best_trial_number=0,
        best_value=0.5,
        summary=None,
        trials_done=4,
        trials_running=0,
    )
    trial = TrialRecord(
        id=1,
        study_id=7,
        number=0,
        baseline=None,
        schedule=schedule.to_dict(),
        params={},
        status=TrialStatus.COMPLETED,
        stop_reason=None,
        started_at=now,
        finished_at=now,
        epochs_done=schedule.total_epochs,
        val_accuracy=0.5,
        val_loss=1.0,
        steps=10,
        samples=100,
        wall_time_s=1.0,
        mean_batch_size=10.0,
        objective_values=None,
    )
    path = tmp_path / "schedule.yaml"
    path.write_text(export_yaml(study, trial), encoding="utf-8")
    return path


@dataclass
class Seen:
    global_step: int
    lr: float
    batch: int


def make_model() -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(4, 3)


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(N, 4, generator=g), torch.randint(0, 3, (N,), generator=g))


def train(
    runtime: ScheduleRuntime,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: ScheduleLR,
    seen: list[Seen],
    start_step: int = 0,
    stop_at: int | None = None,
) -> int:
    """A plain PyTorch loop driven by the runtime; returns the next global step."""
    sampler = runtime.batch_sampler()
    loader = DataLoader(dataset(), batch_sampler=sampler)
    epoch, k0 = runtime.locate(start_step)
    for e in range(epoch, runtime.num_epochs):
        first = k0 if e == epoch else 0
        sampler.set_epoch(e, first)
        batches = iter(loader)
        for step in runtime.steps(e, first):
            if stop_at is not None and step.global_step == stop_at:
                return step.global_step
            samples = 0
            for size in step.micro_batches:
                x, y = next(batches)
                assert x.shape[0] == size
                samples += size
                loss = F.cross_entropy(model(x), y, reduction="sum") * step.loss_weight
                loss.backward()  # type: ignore[no-untyped-call]
            seen.append(Seen(step.global_step, optimizer.param_groups[0]["lr"], samples))
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()
        with pytest.raises(StopIteration):
            next(batches)
    return runtime.total_steps


def test_plain_loop_sees_the_schedule_lr_and_batch_at_every_step_across_a_resume(
    tmp_path: Path,
) -> None:
    schedule = staged_schedule()
    path = exported_yaml_file(tmp_path, schedule)
    expected = list(Schedule.load(path).iter_steps(N))
    assert [s.batch_size for s in expected] == [s.batch_size for s in schedule.iter_steps(N)]

    # Uninterrupted run (micro-batch 10: 2 accumulation passes at 16, 3 at 32, 5 at 48).
    runtime = ScheduleRuntime(path, N, micro_batch=10, seed=3)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=123.0, momentum=0.9)
    sched = ScheduleLR(opt, path, N)
    straight: list[Seen] = []
    train(runtime, model, opt, sched, straight)
    _assert_matches(straight, expected)

    # Interrupted mid-epoch (epoch 2, step 5 of 6), checkpointed, restored into fresh objects.
    stop = runtime.total_steps // 2
    assert runtime.locate(stop)[1] != 0
    model_a = make_model()
    opt_a = torch.optim.SGD(model_a.parameters(), lr=123.0, momentum=0.9)
    sched_a = ScheduleLR(opt_a, schedule, N)
    resumed: list[Seen] = []
    at = train(runtime, model_a, opt_a, sched_a, resumed, stop_at=stop)
    buffer = io.BytesIO()
    torch.save(
        {
            "model": model_a.state_dict(),
            "opt": opt_a.state_dict(),
            "lr": sched_a.state_dict(),
            "step": at,
        },
        buffer,
    )
    buffer.seek(0)
    checkpoint = torch.load(buffer, weights_only=True)  # plain data only

    model_b = make_model()
    opt_b = torch.optim.SGD(model_b.parameters(), lr=0.5, momentum=0.9)
    sched_b = ScheduleLR(opt_b, path, N)
    model_b.load_state_dict(checkpoint["model"])
    opt_b.load_state_dict(checkpoint["opt"])
    sched_b.load_state_dict(checkpoint["lr"])
    assert opt_b.param_groups[0]["lr"] == pytest.approx(expected[stop].lr, rel=1e-12)
    train(runtime, model_b, opt_b, sched_b, resumed, start_step=checkpoint["step"])

    _assert_matches(resumed, expected)
    # Same data order and LRs: the resumed run ends with the uninterrupted run's weights.
    for a, b in zip(model.parameters(), model_b.parameters(), strict=True):
        torch.testing.assert_close(a, b)


def _assert_matches(seen: list[Seen], expected: list[StepInfo]) -> None:
    assert [s.global_step for s in seen] == [e.global_step for e in expected]
    assert [s.batch for s in seen] == [e.batch_size for e in expected]
    for s, e in zip(seen, expected, strict=True):
        assert s.lr == pytest.approx(e.lr, rel=1e-12, abs=1e-15), s


def test_ranks_split_each_global_batch_of_one_shared_permutation() -> None:
    schedule = staged_schedule()
    world = 4
    runtimes = [
        ScheduleRuntime(schedule, N, world, r, micro_batch=3, seed=11) for r in range(world)
    ]
    for epoch in range(schedule.total_epochs):
        perm = runtimes[0].permutation(epoch).tolist()
        assert sorted(perm) == list(range(N))
        batch = schedule.batch_size_at(epoch)
        per_rank = []
        for rt in runtimes:
            assert rt.permutation(epoch).tolist() == perm
            steps = list(rt.steps(epoch))
            lists = iter(rt.batch_sampler(epoch))
            per_step = [[i for _ in s.micro_batches for i in next(lists)] for s in steps]
            assert next(lists, None) is None
            per_rank.append(per_step)
            assert rt.accumulation_steps(epoch) == -(-(batch // world) // 3)
        for k in range(rt.steps_in_epoch(epoch)):
            together = [i for r in range(world) for i in per_rank[r][k]]
            assert together == perm[k * batch : (k + 1) * batch]


def test_drop_last_false_gives_the_schedule_smaller_last_steps() -> None:
    schedule = staged_schedule()
    rt = ScheduleRuntime(schedule, N, world_size=2, rank=1, micro_batch=8, drop_last=False)
    expected = list(schedule.iter_steps(N, drop_last=False))
    got = [s for e in range(rt.num_epochs) for s in rt.steps(e)]
    assert [s.global_batch for s in got] == [e.batch_size for e in expected]
    assert any(s.global_batch < schedule.batch_size_at(s.epoch) for s in got)
    assert rt.total_steps == len(expected)
    covered = [i for e in [5] for idx in rt.batch_sampler(e) for i in idx]
    assert len(covered) == N // 2  # rank 1's half of every step, the partial one included


def test_uneven_speed_weights_keep_the_global_batch() -> None:
    schedule = staged_schedule()
    rts = [
        ScheduleRuntime(schedule, N, 2, r, micro_batch=4, speed_weights=[3.0, 1.0])
        for r in range(2)
    ]
    for epoch in range(schedule.total_epochs):
        plans = [rt.epoch_plan(epoch) for rt in rts]
        assert sum(p.local_batch for p in plans) == plans[0].global_batch
        assert plans[0].local_batch == 3 * plans[1].local_batch
        assert plans[0].accumulation_steps == plans[1].accumulation_steps


def test_unplaceable_schedule_names_every_stage() -> None:
    with pytest.raises(PlacementError) as info:
        ScheduleRuntime(staged_schedule(), N, world_size=3)  # 16 and 32 do not split by 3
    message = str(info.value)
    assert "stage 1 (epochs 0-2)" in message
    assert "stage 2 (epochs 2-4)" in message
    assert "stage 3" not in message  # 48 = 3 x 16 places fine
    assert "3 workers" in message


def test_scheduler_refuses_a_checkpoint_of_another_schedule() -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = ScheduleLR(opt, staged_schedule(), N)
    other = ScheduleLR(
        torch.optim.SGD(make_model().parameters(), lr=0.1),
        Schedule.constant(16, 6, base_lr=0.05),
        N,
    )
    with pytest.raises(ValidationError, match="saved for schedule 16@0-6"):
        sched.load_state_dict(other.state_dict())


def test_param_group_lr_scale_and_end_of_run_lr() -> None:
    schedule = staged_schedule()
    model = make_model()
    groups: list[dict[str, Any]] = [
        {"params": [model.weight]},
        {"params": [model.bias], "lr_scale": 0.1},
    ]
    opt = torch.optim.SGD(groups, lr=1.0)
    sched = ScheduleLR(opt, schedule, N)
    first = schedule.lr_at(0)
    assert opt.param_groups[0]["lr"] == pytest.approx(first)
    assert opt.param_groups[1]["lr"] == pytest.approx(0.1 * first)
    for _ in range(schedule.total_steps(N) + 3):
        opt.step()
        sched.step()
    assert sched.get_last_lr()[0] == pytest.approx(schedule.lr_at(schedule.total_epochs))


def test_runtime_imports_without_ray_or_fastapi() -> None:
    heavy = ("ray", "fastapi", "starlette", "optuna", "sqlalchemy")
    imported = imported_after("import tuner.runtime", "torch", *heavy)
    assert not [m for m in imported if m.split(".")[0] in heavy], imported
    assert "torch" in imported


@settings(max_examples=25, deadline=None)
@given(
    batches=st.lists(st.integers(1, 12), min_size=1, max_size=3),
    world=st.integers(1, 4),
    micro=st.one_of(st.none(), st.integers(1, 7)),
    size=st.integers(50, 120),
    drop_last=st.booleans(),
    uneven=st.booleans(),
)
def test_ranks_cover_every_step_exactly_once(
    batches: list[int], world: int, micro: int | None, size: int, drop_last: bool, uneven: bool
) -> None:
    """Any placeable schedule: per step, the ranks' index lists are the step's global slice."""
    sizes = sorted(b * world for b in batches)
    schedule = Schedule(
        stages=tuple(Stage(i, i + 1, b) for i, b in enumerate(sizes)),
        base_lr=0.1,
        base_batch_size=sizes[0],
    )
    weights = [float(r + 1) for r in range(world)] if uneven else None
    try:
        rts = [
            ScheduleRuntime(schedule, size, world, r, micro, drop_last, speed_weights=weights)
            for r in range(world)
        ]
    except ValidationError:
        return  # e.g. the last partial step is smaller than the world size
    expected = list(schedule.iter_steps(size, drop_last=drop_last))
    got = [s for e in range(rts[0].num_epochs) for s in rts[0].steps(e)]
    assert [(s.global_batch, s.lr) for s in got] == [(e.batch_size, e.lr) for e in expected]
    for epoch in range(schedule.total_epochs):
        perm = rts[0].permutation(epoch).tolist()
        lists = [iter(rt.batch_sampler(epoch)) for rt in rts]
        offset = 0
        for steps in zip(*(rt.steps(epoch) for rt in rts), strict=True):
            assert len({s.accumulation_steps for s in steps}) == 1
            taken = []
            for rank, step in enumerate(steps):
                for m in step.micro_batches:
                    if m:
                        idx = next(lists[rank])
                        assert len(idx) == m
                        taken.extend(idx)
            assert taken == perm[offset : offset + steps[0].global_batch]  # rank order
            offset += steps[0].global_batch
        assert all(next(it, None) is None for it in lists)


def test_fixed_micro_batch_grows_the_batch_by_accumulation_only() -> None:
    """Gradient-accumulation mode (Megatron-LM's and DeepSpeed's batch ramps): every pass is
    the micro-batch on every worker; a stage's global batch is workers x micro x accumulation."""
    schedule = Schedule(
        stages=(Stage(0, 1, 64), Stage(1, 2, 256), Stage(2, 3, 1024)),
        base_lr=0.1,
        base_batch_size=64,
    )
    rt = ScheduleRuntime(
        schedule, 4096, world_size=2, rank=1, micro_batch=32, fixed_micro_batch=True
    )
    for epoch, accumulation in ((0, 1), (1, 4), (2, 16)):
        for step in rt.steps(epoch):
            assert step.micro_batches == (32,) * accumulation
    with pytest.raises(ValidationError) as info:
        ScheduleRuntime(schedule, 4096, world_size=2, micro_batch=48, fixed_micro_batch=True)
    message = str(info.value)
    assert (
        "stage 1 (epochs 0-1): batch 64 on 2 worker(s) is 32 per worker, not a multiple of 48"
        in message
    )
    assert "stage 2" in message
    assert "stage 3" in message
    assert "Micro-batches that divide every stage: 4, 8, 16, 32 (the largest" in message
    with pytest.raises(ValidationError, match=r"stage 3.s partial last step of 904 samples"):
        ScheduleRuntime(
            schedule, 5000, world_size=2, micro_batch=32, drop_last=False, fixed_micro_batch=True
        )
    with pytest.raises(ValidationError, match="needs micro_batch"):
        ScheduleRuntime(schedule, 4096, fixed_micro_batch=True)
