"""The noise-scale candidate: a schedule of the space that follows a measured noise scale, and
the Optuna parameters that draw it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import optuna
import pytest

from tuner.noise_candidate import (
    noise_scale_batches,
    noise_scale_schedule,
    noise_scale_step_floor,
    step_floor_of_epochs,
    step_floor_text,
)
from tuner.space import ScheduleSpace
from tuner.spec import StudySpec, TaskDefaults

DEFAULTS = TaskDefaults(epochs=12, base_batch_size=32, base_lr=0.1)


def space(extra: str = "") -> ScheduleSpace:
    text = (
        "task: digits\nschedule: {total_epochs: 12}\n"
        "space: {stages: {min: 1, max: 3}, batch_size: {min: 32, max: 1024}, "
        f"lr_multiplier: {{min: 0.5, max: 2.0}}, warmup_epochs: {{min: 0, max: 1}}{extra}}}"
    )
    return ScheduleSpace.from_spec(StudySpec.from_yaml(text).resolve(DEFAULTS))


GROWING = [None, 20, 40, 60, 100, 150, 300, 500, 700, 900, 1000, 2000]


def test_batches_are_the_powers_of_two_at_or_below_and_never_decrease() -> None:
    sp = space()
    # The largest batch not above the noise scale: 900 gives 512, not the nearer 1,024.
    assert noise_scale_batches(sp, GROWING) == [
        32, 32, 32, 32, 64, 128, 256, 256, 512, 512, 512, 1024,
    ]  # fmt: skip
    # A dip does not shrink the batch; values beyond the space are clamped to it.
    assert noise_scale_batches(sp, [5, 300, 40, 5000] + [None] * 8) == [32, 256, 256] + [1024] * 9


def test_the_schedule_fits_the_space_and_keeps_the_smaller_batch_when_merging() -> None:
    sp = space()
    schedule = noise_scale_schedule(sp, GROWING)
    assert schedule is not None
    # 64 and 128 (one epoch each) go into 32's stage, the last epoch's 1,024 into 512's.
    assert schedule.summary() == "32@0-6 -> 256@6-8 -> 512@8-12"
    assert all(st.lr_multiplier == 1.0 for st in schedule.stages)  # the scaling rule
    assert noise_scale_schedule(sp, [None] * 12) is None  # nothing measured
    flat = noise_scale_schedule(sp, [100.0] * 12)
    assert flat is not None
    assert flat.summary() == "64@0-12"


def test_a_first_stage_too_short_grows_to_the_minimum_and_the_curve_goes_on() -> None:
    """mnist1d's measured curve: 225 and 283 samples, then 733 and more from the third epoch.
    The first stage (two epochs at 128) is shorter than the space's minimum (three): it takes
    the third epoch, and the batch then follows the curve; it used to swallow the whole run
    (``128@0-12``)."""
    sp = space(", min_stage_fraction: 0.25")
    assert sp.min_stage_epochs == 3
    schedule = noise_scale_schedule(sp, [225, 283] + [1100.0] * 10)
    assert schedule is not None
    assert schedule.summary() == "128@0-3 -> 1024@3-12"
    # A short second stage inside the first one's minimum goes with it.
    schedule = noise_scale_schedule(sp, [225, 600] + [1100.0] * 10)
    assert schedule is not None
    assert schedule.summary() == "128@0-3 -> 1024@3-12"
    # A curve whose first stage is long enough is unchanged by it.
    schedule = noise_scale_schedule(sp, [225, 283, 250, 280] + [1100.0] * 8)
    assert schedule is not None
    assert schedule.summary() == "128@0-4 -> 1024@4-12"


def test_the_candidate_takes_the_recipes_lr_warmups_and_decay() -> None:
    # SGD (the linear rule): multiplier 1, a warm-up of 5 % of the run wherever the LR rises,
    # and the last stage anneals to zero where the space has cosine (no decay at all before).
    schedule = noise_scale_schedule(space(", decay: [constant, cosine]"), GROWING)
    assert schedule is not None
    shapes = [
        (st.batch_size, st.lr_multiplier, st.warmup_epochs, st.decay) for st in schedule.stages
    ]
    assert shapes == [
        (32, 1.0, 0.6, "constant"),
        (256, 1.0, 0.6, "constant"),
        (512, 1.0, 0.6, "cosine"),
    ]  # fmt: skip
    # AdamW: the square-root rule's LR from the first stage's batch (linear scaling diverged).
    adamw = ScheduleSpace.from_spec(
        StudySpec.from_yaml(
            "task: digits\nschedule: {total_epochs: 12, optimizer: adamw}\n"
            "space: {stages: {min: 1, max: 3}, batch_size: {min: 32, max: 1024}, "
            "decay: [constant, cosine]}"
        ).resolve(DEFAULTS)
    )
    schedule = noise_scale_schedule(adamw, GROWING)
    assert schedule is not None
    peaks = [schedule.peak_lr(i) / schedule.base_lr for i in range(schedule.num_stages)]
    assert peaks == pytest.approx([1.0, 8**0.5, 16**0.5], rel=0.05)


@pytest.mark.parametrize(
    "extra", ["", ", decay: [constant, cosine]", ", label_smoothing: [0, 0.1]"]
)
def test_optuna_draws_the_candidate_back_from_its_params(extra: str) -> None:
    sp = space(extra)
    schedule = noise_scale_schedule(sp, GROWING)
    assert schedule is not None
    params = sp.params_for(schedule)
    assert params is not None
    study = optuna.create_study()
    study.enqueue_trial(params)
    assert sp.sample(study.ask()).stages == schedule.stages


def test_a_schedule_outside_the_space_has_no_params() -> None:
    sp = space()
    schedule = noise_scale_schedule(sp, GROWING)
    assert schedule is not None
    # Three stages do not fit a space of at most two.
    narrow = ScheduleSpace.from_spec(
        StudySpec.from_yaml(
            "task: digits\nschedule: {total_epochs: 12}\n"
            "space: {stages: {min: 1, max: 2}, batch_size: {min: 32, max: 1024}}"
        ).resolve(DEFAULTS)
    )
    assert narrow.params_for(schedule) is None
    # Nor does a batch outside its range.
    small = ScheduleSpace.from_spec(
        StudySpec.from_yaml(
            "task: digits\nschedule: {total_epochs: 12}\n"
            "space: {stages: {min: 1, max: 3}, batch_size: {min: 32, max: 256}}"
        ).resolve(DEFAULTS)
    )
    assert small.params_for(schedule) is None


def test_the_step_floor_weighs_each_epochs_steps_by_its_noise_scale() -> None:
    # 64 steps an epoch at batch 32: at B_noise = B a step is worth half an unbounded-batch
    # step, at 3B a quarter; the epoch without a measurement adds nothing.
    floor = noise_scale_step_floor([(32, 64, 32.0), (32, 128, None), (32, 192, 96.0)])
    assert floor is not None
    assert floor.floor == pytest.approx(64 / 2 + 64 / 4)
    assert (floor.steps, floor.measured_epochs, floor.epochs) == (192, 2, 3)
    assert floor.ratio == pytest.approx(4.0)
    assert floor.to_dict()["ratio"] == pytest.approx(4.0)
    # Larger batches later in the run: each epoch's own batch and steps count.
    mixed = noise_scale_step_floor([(32, 64, 32.0), (256, 72, 256.0)])
    assert mixed is not None
    assert mixed.floor == pytest.approx(32 + 4)


def test_the_step_floor_skips_undefined_measurements_and_needs_one() -> None:
    # A negative or infinite estimate (a gradient too noisy to measure) is no measurement.
    floor = noise_scale_step_floor(
        [(32, 10, -5.0), (32, 20, math.inf), (32, 30, 0.0), (32, 40, 96.0)]
    )
    assert floor is not None
    assert floor.floor == pytest.approx(10 / 4)
    assert floor.measured_epochs == 1
    assert noise_scale_step_floor([(32, 10, None), (32, 20, -1.0)]) is None
    assert noise_scale_step_floor([]) is None


def test_a_larger_noise_scale_lowers_the_floor_and_it_never_exceeds_the_steps() -> None:
    steps = [(64, 80 * (e + 1)) for e in range(10)]
    low = noise_scale_step_floor([(b, s, 10.0 * (e + 1)) for e, (b, s) in enumerate(steps)])
    high = noise_scale_step_floor([(b, s, 100.0 * (e + 1)) for e, (b, s) in enumerate(steps)])
    assert low is not None
    assert high is not None
    assert high.floor < low.floor < low.steps == 800


def test_the_step_floor_of_stored_epochs_needs_every_epoch_from_the_first() -> None:
    @dataclass
    class Epoch:
        epoch: int
        batch_size: int | None
        steps: int | None
        noise_scale: float | None

    whole = [Epoch(0, 32, 64, 32.0), Epoch(1, 32, 128, None), Epoch(2, 32, 192, 96.0)]
    floor = step_floor_of_epochs(whole)
    assert floor is not None
    assert floor.floor == pytest.approx(48)
    # Epoch 1 missing: its steps would count as epoch 2's, so there is no floor.
    assert step_floor_of_epochs([whole[0], whole[2]]) is None
    assert step_floor_of_epochs(whole[1:]) is None


def test_the_step_floors_sentence_says_the_cap_against_it() -> None:
    floor = noise_scale_step_floor([(32, 64, 32.0), (32, 128, 96.0)])
    assert floor is not None
    plain = step_floor_text(floor.to_dict(), 0)
    assert plain == (
        "Step floor: by its measured noise scale (McCandlish et al.), the progress the small "
        "batch (#0) made in 128 steps takes at least ~48 steps at any batch: a schedule can "
        "cut its steps by 2.7x at most and still match it."
    )
    assert floor.to_dict(40)["cap_below_floor"] is True
    assert step_floor_text(floor.to_dict(40), 0, running=True).endswith(
        "This study's step cap (40) is below the floor: expect its best schedule to fall "
        "short of the small batch."
    )
    assert "128 steps so far" in step_floor_text(floor.to_dict(40), 0, running=True)
    assert floor.to_dict(48)["cap_below_floor"] is False
    assert step_floor_text(floor.to_dict(64), 0).endswith("This study's step cap (64) is above it.")
