"""The step plan's rules (tuner.step_plan): sample order, split and steps, without torch."""

from __future__ import annotations

import numpy as np
import pytest

from tuner.errors import ValidationError
from tuner.schedule import PlacementError, Schedule, Stage
from tuner.step_plan import epoch_order, epoch_steps, rank_micro_slices, split_step


def test_epoch_order_is_a_seeded_permutation_per_epoch() -> None:
    first = epoch_order(3, 0, 100)
    assert sorted(first.tolist()) == list(range(100))
    assert first.dtype == np.int64
    assert np.array_equal(first, epoch_order(3, 0, 100))  # every rank, every machine
    assert not np.array_equal(first, epoch_order(3, 1, 100))
    assert not np.array_equal(first, epoch_order(4, 0, 100))
    assert epoch_order(3, 0, 0).tolist() == []
    with pytest.raises(ValidationError, match="num_samples"):
        epoch_order(3, 0, -1)


def test_split_step_even_uneven_and_by_speed() -> None:
    even = split_step(64, 4, micro_batch=8)
    assert even.local_batches == (16, 16, 16, 16)
    assert even.micro_batches[0] == (8, 8)
    uneven = split_step(10, 4)
    assert uneven.local_batches == (3, 3, 2, 2)
    weighted = split_step(60, 2, speed_weights=(2.0, 1.0))
    assert weighted.local_batches == (40, 20)
    # A share that would be empty falls back to the even rule.
    assert split_step(2, 2, speed_weights=(100.0, 1.0)).local_batches == (1, 1)
    assert rank_micro_slices(split_step(64, 2, micro_batch=16), 1) == [(32, 16), (48, 16)]
    with pytest.raises(PlacementError):
        split_step(3, 4)


def test_epoch_steps_lr_slices_and_partial_last_step() -> None:
    schedule = Schedule(
        stages=(Stage(0, 1, 30), Stage(1, 2, 40, lr_multiplier=2.0)),
        base_lr=0.1,
        base_batch_size=30,
    )
    kept = list(epoch_steps(schedule, 100, 1, drop_last=False))
    assert [s.global_batch for s in kept] == [40, 40, 20]
    assert [(s.start, s.stop) for s in kept] == [(0, 40), (40, 80), (80, 100)]
    assert [s.global_step for s in kept] == [4, 5, 6]  # epoch 0: ceil(100 / 30) steps
    assert [s.lr for s in kept] == [schedule.lr_at(1 + k / 3) for k in range(3)]
    dropped = list(epoch_steps(schedule, 100, 1, start_step=1))
    assert [(s.step_in_epoch, s.global_step, s.global_batch) for s in dropped] == [(1, 4, 40)]
    with pytest.raises(ValidationError, match="epoch must be in"):
        list(epoch_steps(schedule, 100, 2))
    with pytest.raises(ValidationError, match="start_step"):
        list(epoch_steps(schedule, 100, 0, start_step=9))
