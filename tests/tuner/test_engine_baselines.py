"""The three baselines: small batch, Goyal's large batch with warm-up, Smith's batch increase."""

from __future__ import annotations

import pytest

from tuner.baselines import DECAY_FACTOR, build_baselines, skeleton
from tuner.errors import ValidationError
from tuner.schedule import Schedule
from tuner.space import ScheduleSpace
from tuner.spec import StudySpec, TaskDefaults

DEFAULTS = TaskDefaults(epochs=20, base_batch_size=32, base_lr=0.1)


def baselines_of(text: str, train_size: int | None = None) -> dict[str, Schedule]:
    space = ScheduleSpace.from_spec(StudySpec.from_yaml(text).resolve(DEFAULTS))
    return {b.name: b.schedule for b in build_baselines(space, train_size)}


def test_skeleton_cuts_at_half_and_three_quarters() -> None:
    assert skeleton(20) == [(0, 10), (10, 15), (15, 20)]
    assert skeleton(2) == [(0, 1), (1, 2)]
    assert skeleton(1) == [(0, 1)]


def test_the_three_baselines_share_the_step_decay_skeleton() -> None:
    got = baselines_of("task: mnist1d\nspace: {batch_size: {min: 32, max: 1024}}")
    assert list(got) == ["small_batch", "large_batch", "increase_batch"]
    small, large, smith = got["small_batch"], got["large_batch"], got["increase_batch"]
    for schedule in (small, large, smith):
        assert [(s.start_epoch, s.end_epoch) for s in schedule.stages] == skeleton(20)

    # Small batch: the base batch and base LR, divided by 4 at each cut.
    assert [s.batch_size for s in small.stages] == [32, 32, 32]
    assert [small.peak_lr(i) for i in range(3)] == pytest.approx([0.1, 0.025, 0.00625])

    # Large batch (Goyal): the largest batch, LR x 1024/32, warm-up from the base LR over 5%.
    assert {s.batch_size for s in large.stages} == {1024}
    assert large.peak_lr(0) == pytest.approx(0.1 * 32)
    assert large.stages[0].warmup_epochs == 1.0
    assert large.lr_at(0.0) == pytest.approx(0.1)
    assert large.peak_lr(2) == pytest.approx(3.2 / DECAY_FACTOR**2)

    # Smith: each LR decay becomes a batch increase of the same factor; the LR stays put.
    assert [s.batch_size for s in smith.stages] == [32, 128, 512]
    assert [smith.peak_lr(i) for i in range(3)] == pytest.approx([0.1, 0.1, 0.1])
    # The noise scale (LR / batch) of each stage matches the small-batch schedule's.
    for i in range(3):
        assert smith.peak_lr(i) / smith.stages[i].batch_size == pytest.approx(
            small.peak_lr(i) / small.stages[i].batch_size
        )


def test_smith_caps_the_batch_and_decays_the_rest() -> None:
    got = baselines_of("task: mnist1d\nspace: {batch_size: {min: 32, max: 64}}")
    smith = got["increase_batch"]
    assert [s.batch_size for s in smith.stages] == [32, 64, 64]
    # Wanted 128 then 512; capped at 64, the LR takes the remaining factor 2 then 8.
    assert [smith.peak_lr(i) for i in range(3)] == pytest.approx([0.1, 0.05, 0.0125])


@pytest.mark.parametrize("rule", ["sqrt", "none"])
def test_large_batch_scales_the_lr_linearly_whatever_the_rule(rule: str) -> None:
    got = baselines_of(
        f"task: mnist1d\nschedule: {{scaling_rule: {rule}}}\nspace: {{batch_size: {{max: 256}}}}"
    )
    assert got["large_batch"].peak_lr(0) == pytest.approx(0.1 * 8)
    assert got["increase_batch"].peak_lr(1) == pytest.approx(0.1)


def test_a_baseline_that_cannot_run_is_reported() -> None:
    with pytest.raises(ValidationError, match="large_batch baseline cannot run"):
        baselines_of("task: mnist1d\nspace: {batch_size: {max: 512}}", train_size=300)
