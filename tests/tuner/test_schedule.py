"""Unit tests of tuner.schedule: stages, LR curves, step arithmetic, placement, YAML."""

from __future__ import annotations

import json
import math
import pickle
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tuner.errors import ValidationError
from tuner.schedule import (
    MAX_EPOCHS,
    MAX_STAGES,
    BatchPlacement,
    PlacementError,
    PlacementHint,
    Schedule,
    ScheduleError,
    Stage,
    StepInfo,
    place,
    place_batch,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "schedule.yaml"


def three_stage(**overrides: Any) -> Schedule:
    """64@0-3 -> 256@3-8 -> 1024@8-12, base 0.1 at batch 64, linear scaling."""
    stages = (
        Stage(0, 3, 64),
        Stage(3, 8, 256, lr_multiplier=0.5, warmup_epochs=1.0),
        Stage(8, 12, 1024, lr_multiplier=0.25, warmup_epochs=2.0, decay="cosine"),
    )
    kwargs: dict[str, Any] = {"stages": stages, "base_lr": 0.1, "base_batch_size": 64}
    kwargs.update(overrides)
    return Schedule(**kwargs)


def doc(**overrides: Any) -> dict[str, Any]:
    """A valid document dict; keys set to None in overrides are removed."""
    data: dict[str, Any] = {
        "version": 1,
        "units": {"time": "epochs", "batch_size": "samples", "lr": "absolute"},
        "base_lr": 0.1,
        "base_batch_size": 64,
        "stages": [
            {"start_epoch": 0, "end_epoch": 3, "batch_size": 64},
            {"start_epoch": 3, "end_epoch": 8, "batch_size": 256},
        ],
    }
    for key, value in overrides.items():
        if value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return data


# ------------------------------------------------------------------------------ basics


def test_summary_and_epoch_lookups() -> None:
    s = three_stage()
    assert s.summary() == "64@0-3 -> 256@3-8 (lr x0.5) -> 1024@8-12 (lr x0.25)"
    # The LR multiplier shows where it is not 1: two schedules that differ only in their LR
    # never read the same.
    plain = replace(s, stages=tuple(replace(st, lr_multiplier=1.0) for st in s.stages))
    assert plain.summary() == "64@0-3 -> 256@3-8 -> 1024@8-12"
    near = replace(
        plain, stages=(replace(plain.stages[0], lr_multiplier=1.0004), *plain.stages[1:])
    )
    assert near.summary() == plain.summary()  # shown to 3 digits: never "(lr x1)"
    assert s.total_epochs == 12
    assert [s.stage_index_at(e) for e in (0, 2.999, 3, 7.5, 8, 11.99)] == [0, 0, 1, 1, 2, 2]
    assert [s.batch_size_at(e) for e in (0, 3, 8, 11)] == [64, 256, 1024, 1024]


@pytest.mark.parametrize("epoch", [-0.5, 12, 13, math.nan])
def test_epoch_outside_schedule_is_rejected(epoch: float) -> None:
    with pytest.raises(ScheduleError, match="epoch"):
        three_stage().batch_size_at(epoch)


def test_lr_at_end_of_run_is_allowed_but_not_beyond() -> None:
    s = three_stage()
    assert s.lr_at(12) == pytest.approx(0.0)  # cosine to factor 0
    with pytest.raises(ScheduleError, match=r"outside the schedule's epochs \[0, 12\]"):
        s.lr_at(12.5)


def test_constant_constructor() -> None:
    s = Schedule.constant(128, 10, 0.05, weight_decay=1e-4)
    assert s.summary() == "128@0-10"
    assert s.base_batch_size == 128
    assert s.lr_at(0) == pytest.approx(0.05)
    assert s.lr_at(9.9) == pytest.approx(0.05)
    assert s.weight_decay == 1e-4


def test_schedule_error_is_validation_error_and_pickles() -> None:
    with pytest.raises(ValidationError) as info:
        Schedule.constant(0, 0, -1.0)
    err = info.value
    assert isinstance(err, ScheduleError)
    assert isinstance(err, ValueError)
    restored = pickle.loads(pickle.dumps(err))
    assert restored.problems == err.problems
    assert str(restored) == str(err)


def test_ints_for_float_fields_are_stored_as_floats() -> None:
    s = Schedule((Stage(0, 2, 8, lr_multiplier=2, warmup_epochs=1),), base_lr=1, base_batch_size=8)
    assert type(s.stages[0].lr_multiplier) is float
    assert type(s.stages[0].warmup_epochs) is float
    assert type(s.base_lr) is float


def test_list_of_stages_is_accepted_and_stored_as_tuple() -> None:
    s = Schedule([Stage(0, 2, 8)], base_lr=0.1, base_batch_size=8)  # type: ignore[arg-type]
    assert s.stages == (Stage(0, 2, 8),)
    assert hash(s) == hash(Schedule((Stage(0, 2, 8),), base_lr=0.1, base_batch_size=8))


# ------------------------------------------------------------------------------ learning rate


@pytest.mark.parametrize(
    ("rule", "expected"),
    [("none", 0.1), ("linear", 0.1 * 16), ("sqrt", 0.1 * 4)],
)
def test_peak_lr_scaling_rules(rule: str, expected: float) -> None:
    s = Schedule.constant(1024, 4, 0.1, base_batch_size=64, scaling_rule=rule)  # type: ignore[arg-type]
    assert s.peak_lr(0) == pytest.approx(expected)
    assert s.lr_at(2) == pytest.approx(expected)


def test_peak_lr_includes_multiplier() -> None:
    s = three_stage()
    assert s.peak_lr(0) == pytest.approx(0.1)
    assert s.peak_lr(1) == pytest.approx(0.1 * 4 * 0.5)
    assert s.peak_lr(2) == pytest.approx(0.1 * 16 * 0.25)


def test_first_stage_warmup_starts_at_base_lr_by_default() -> None:
    s = Schedule.constant(256, 10, 0.1, base_batch_size=64, warmup_epochs=2)
    assert s.lr_at(0) == pytest.approx(0.1)
    assert s.lr_at(1) == pytest.approx((0.1 + 0.4) / 2)
    assert s.lr_at(2) == pytest.approx(0.4)


def test_first_stage_warmup_from_warmup_start_lr() -> None:
    s = Schedule.constant(256, 10, 0.1, base_batch_size=64, warmup_epochs=4, warmup_start_lr=0.0)
    assert s.lr_at(0) == 0.0
    assert s.lr_at(1) == pytest.approx(0.1)
    assert s.lr_at(4) == pytest.approx(0.4)


def test_later_warmup_ramps_from_previous_stage_end_lr() -> None:
    s = three_stage()
    # stage 2 starts at 0.1 (stage 1 constant) and reaches 0.2 after 1 epoch
    assert s.lr_at(3) == pytest.approx(0.1)
    assert s.lr_at(3.5) == pytest.approx(0.15)
    assert s.lr_at(4) == pytest.approx(0.2)
    # stage 3 ramps from 0.2 to 0.4 over 2 epochs, then cosine to 0 at epoch 12
    assert s.lr_at(9) == pytest.approx(0.3)
    assert s.lr_at(10) == pytest.approx(0.4)
    assert s.lr_at(11) == pytest.approx(0.2)
    assert s.stage_end_lr(2) == 0.0


def test_stage_without_warmup_jumps_to_its_peak() -> None:
    s = Schedule((Stage(0, 2, 64), Stage(2, 4, 128)), base_lr=0.1, base_batch_size=64)
    assert s.lr_at(1.999) == pytest.approx(0.1)
    assert s.lr_at(2) == pytest.approx(0.2)
    assert s.stage_start_lr(1) == pytest.approx(0.2)


def test_linear_decay_to_final_factor() -> None:
    s = Schedule.constant(64, 10, 1.0, decay="linear", decay_final_factor=0.1, warmup_epochs=2)
    assert s.lr_at(2) == pytest.approx(1.0)
    assert s.lr_at(6) == pytest.approx(0.55)
    assert s.lr_at(10) == pytest.approx(0.1)
    assert s.stage_end_lr(0) == pytest.approx(0.1)


def test_cosine_decay_midpoint() -> None:
    s = Schedule.constant(64, 10, 1.0, decay="cosine", decay_final_factor=0.2)
    assert s.lr_at(0) == pytest.approx(1.0)
    assert s.lr_at(5) == pytest.approx(0.6)
    assert s.lr_at(10) == pytest.approx(0.2)


def test_step_decay_drops_every_interval_after_warmup() -> None:
    s = Schedule.constant(
        64, 30, 1.0, decay="step", step_every_epochs=10, step_gamma=0.1, warmup_epochs=1
    )
    assert s.lr_at(10.99) == pytest.approx(1.0)
    assert s.lr_at(11) == pytest.approx(0.1)
    assert s.lr_at(21) == pytest.approx(0.01)
    assert s.lr_at(29.9) == pytest.approx(0.01)
    # the run ends before the drop that would happen at epoch 31
    assert s.stage_end_lr(0) == pytest.approx(0.01)
    assert s.lr_at(30) == pytest.approx(0.01)


def test_step_decay_end_lr_when_a_drop_falls_on_the_stage_end() -> None:
    # decay span 0.3 epochs, a drop every 0.1: drops at 0.1 and 0.2; the one at 0.3 is the
    # stage end, so the stage ends at gamma**2 (the next stage's warm-up starts there)
    stages = (
        Stage(0, 1, 8, warmup_epochs=0.7, decay="step", step_every_epochs=0.1, step_gamma=0.5),
        Stage(1, 2, 8, warmup_epochs=0.5),
    )
    s = Schedule(stages, base_lr=1.0, base_batch_size=8)
    assert s.stage_end_lr(0) == pytest.approx(0.25)
    assert s.lr_at(0.99) == pytest.approx(0.25)
    assert s.lr_at(1) == pytest.approx(0.25)


def test_lr_at_is_cheap_for_many_stages() -> None:
    stages = tuple(Stage(i, i + 1, 8, warmup_epochs=0.5) for i in range(MAX_STAGES))
    s = Schedule(stages, base_lr=0.1, base_batch_size=8)
    # 20k evaluations take ~30 ms; walking the chain of 1000 warm-ups per call would take
    # seconds. This process's CPU time, not wall time: the quick tests run at idle priority
    # beside training, where a wall-time bound measures the wait for a CPU.
    began = time.process_time()
    total = sum(s.lr_at(i / 20) for i in range(20_000))
    assert time.process_time() - began < 2.0
    assert total == pytest.approx(20_000 * 0.1)
    assert s.lr_at(999.25) == pytest.approx(0.1)


def test_schedule_pickles() -> None:
    s = three_stage(provenance={"study_id": "x"}, placement=PlacementHint(2, 32))
    back = pickle.loads(pickle.dumps(s))
    assert back == s
    assert back.lr_at(9) == s.lr_at(9)


# ------------------------------------------------------------------------------ steps


def test_steps_with_drop_last() -> None:
    s = three_stage()
    assert s.steps_per_epoch(0, 5000) == 78  # 5000 // 64
    assert s.steps_per_epoch(1, 5000) == 19
    assert s.steps_per_epoch(2, 5000) == 4
    assert s.stage_steps(5000) == [78 * 3, 19 * 5, 4 * 4]
    assert s.total_steps(5000) == 234 + 95 + 16
    assert s.samples_seen(5000) == 234 * 64 + 95 * 256 + 16 * 1024


def test_batch_larger_than_dataset_with_drop_last_names_the_stage() -> None:
    s = three_stage()
    with pytest.raises(ScheduleError, match=r"stage 3 \(epochs 8-12\): batch_size 1024 is larger"):
        s.total_steps(1000)
    with pytest.raises(ScheduleError, match=r"stage 3 \(epochs 8-12\).*drop_last=False"):
        s.steps_per_epoch(2, 1000)


def test_steps_without_drop_last_round_up() -> None:
    s = three_stage()
    assert s.stage_steps(1000, drop_last=False) == [16 * 3, 4 * 5, 1 * 4]
    assert s.total_steps(1000, drop_last=False) == 48 + 20 + 4
    assert s.samples_seen(1000, drop_last=False) == 12_000
    assert s.mean_batch_size(1000, drop_last=False) == pytest.approx(12_000 / 72)


def test_samples_seen_and_mean_batch_with_drop_last() -> None:
    s = Schedule((Stage(0, 2, 100), Stage(2, 3, 300)), base_lr=0.1, base_batch_size=100)
    # 1050 samples: 10 steps of 100 per epoch, then 3 steps of 300
    assert s.stage_steps(1050) == [20, 3]
    assert s.total_steps(1050) == 23
    assert s.samples_seen(1050) == 2 * 1000 + 900
    assert s.mean_batch_size(1050) == pytest.approx(2900 / 23)


@pytest.mark.parametrize("size", [0, -5, 2.5, True])
def test_dataset_size_must_be_positive_integer(size: Any) -> None:
    with pytest.raises(ScheduleError, match="dataset_size must be a positive integer"):
        three_stage().total_steps(size)


def test_iter_steps_items() -> None:
    s = Schedule(
        (Stage(0, 1, 4), Stage(1, 2, 8, warmup_epochs=1.0)), base_lr=0.4, base_batch_size=4
    )
    steps = list(s.iter_steps(10, drop_last=False))
    assert [st.batch_size for st in steps] == [4, 4, 2, 8, 2]
    assert steps[2] == StepInfo(2, 0, 2, 0, 2, s.lr_at(2 / 3))
    assert steps[2].lr == pytest.approx(0.4)
    assert steps[4].global_step == 4
    assert (steps[4].epoch, steps[4].step_in_epoch, steps[4].stage_index) == (1, 1, 1)
    # step 1 of the 2-step epoch 1 is at epoch 1.5: half-way from 0.4 to 0.8
    assert steps[4].lr == pytest.approx(0.6)
    assert steps[4].lr == s.lr_at(1.5)


def test_iter_steps_validates_before_iterating() -> None:
    with pytest.raises(ScheduleError, match="larger than the dataset"):
        three_stage().iter_steps(100)


def test_stage_index_for_step_helpers_must_exist() -> None:
    with pytest.raises(ScheduleError, match=r"stage_index must be an integer in \[0, 2\]"):
        three_stage().steps_per_epoch(3, 1000)


# ------------------------------------------------------------------------------ validation


def problems_of(**overrides: Any) -> str:
    with pytest.raises(ScheduleError) as info:
        three_stage(**overrides)
    return str(info.value)


def test_gap_names_both_stages() -> None:
    msg = problems_of(stages=(Stage(0, 3, 64), Stage(4, 8, 256)))
    assert "stage 1 (epochs 0-3) ends at epoch 3 but stage 2 (epochs 4-8) starts at epoch 4" in msg
    assert "stages must be contiguous (gap of 1 epoch)" in msg
    assert "set stage 2's start_epoch to 3" in msg


def test_overlap_names_both_stages() -> None:
    msg = problems_of(stages=(Stage(0, 5, 64), Stage(3, 8, 256)))
    assert "stage 1 (epochs 0-5) ends at epoch 5 but stage 2 (epochs 3-8) starts at epoch 3" in msg
    assert "overlap of 2 epochs" in msg


def test_stages_out_of_order() -> None:
    msg = problems_of(stages=(Stage(0, 3, 64), Stage(5, 8, 64), Stage(3, 5, 64)))
    assert "stage 3 (epochs 3-5) starts before stage 2 (epochs 5-8): list the stages in" in msg


def test_peak_lr_must_be_finite() -> None:
    msg = problems_of(stages=(Stage(0, 3, 64, lr_multiplier=1e308),), base_lr=1e10)
    assert "stage 1 (epochs 0-3): its peak LR" in msg
    assert "not a finite positive number" in msg


def test_numpy_integers_accepted_by_step_and_placement_helpers() -> None:
    np = pytest.importorskip("numpy")
    s = three_stage()
    assert type(s.total_steps(np.int64(5000))) is int
    assert type(s.samples_seen(np.int64(5000), drop_last=False)) is int
    last = list(s.iter_steps(np.int64(5000), drop_last=False))[-1]
    assert type(last.batch_size) is int
    assert s.steps_per_epoch(np.int64(0), 5000) == 78
    p = place_batch(np.int64(64), np.int64(4), np.int64(8))
    assert p.local_batches == (16, 16, 16, 16)
    assert type(p.local_batches[0]) is int


def test_first_stage_must_start_at_zero() -> None:
    msg = problems_of(stages=(Stage(1, 3, 64),))
    assert "stage 1 (epochs 1-3) starts at epoch 1: the first stage must start at epoch 0" in msg


def test_at_least_one_stage() -> None:
    assert "at least one stage" in problems_of(stages=())


def test_too_many_stages() -> None:
    stages = tuple(Stage(i, i + 1, 8) for i in range(MAX_STAGES + 1))
    assert f"exceed the maximum of {MAX_STAGES}" in problems_of(stages=stages)


def test_too_many_epochs() -> None:
    msg = problems_of(stages=(Stage(0, MAX_EPOCHS + 1, 8),))
    assert f"end_epoch {MAX_EPOCHS + 1} exceeds the maximum of {MAX_EPOCHS} epochs" in msg


def test_start_not_before_end() -> None:
    msg = problems_of(stages=(Stage(0, 3, 64), Stage(3, 3, 64)))
    assert "stage 2 (epochs 3-3): end_epoch 3 must be greater than start_epoch 3" in msg


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        (Stage(0, 4, 0), "batch_size must be a positive integer"),
        (
            Stage(0, 4, True),
            "batch_size must be a positive integer (global samples per optimizer step), "
            "got true (a boolean)",
        ),
        (Stage(0, 4, 64.0), "batch_size must be a positive integer"),  # type: ignore[arg-type]
        (Stage(0, 4, 2**31), "batch_size 2147483648 exceeds the maximum"),
        (Stage(0, 4, 64, lr_multiplier=0.0), "lr_multiplier must be a finite number > 0, got 0.0"),
        (Stage(0, 4, 64, lr_multiplier=math.inf), "lr_multiplier must be a finite number > 0"),
        (
            Stage(0, 4, 64, lr_multiplier="2"),  # type: ignore[arg-type]
            "lr_multiplier must be a finite number > 0, got '2' (a string)",
        ),
        (Stage(0, 4, 64, warmup_epochs=-1), "warmup_epochs must be a finite number >= 0"),
        (
            Stage(0, 4, 64, warmup_epochs=4.5),
            "warmup_epochs 4.5 is longer than the stage (4 epochs); use at most 4",
        ),
        (
            Stage(0, 4, 64, decay="exp"),  # type: ignore[arg-type]
            "decay 'exp' (a string) is not supported; use one of constant, cosine, linear, step",
        ),
        (
            Stage(0, 4, 64, decay="cosine", decay_final_factor=1.5),
            "decay_final_factor must be a number in [0, 1]",
        ),
        (Stage(0, 4, 64, decay="step"), "decay 'step' needs step_every_epochs"),
        (
            Stage(0, 4, 64, decay="cosine", step_every_epochs=2),
            "step_every_epochs is only used with decay 'step'",
        ),
        (
            Stage(0, 4, 64, decay="step", step_every_epochs=0),
            "step_every_epochs must be a finite number > 0",
        ),
        (
            Stage(0, 4, 64, decay="step", step_every_epochs=1, step_gamma=0),
            "step_gamma must be a number in (0, 1]",
        ),
        (Stage(0, 4, 64, step_gamma=1.5), "step_gamma must be a number in (0, 1]"),
    ],
)
def test_stage_field_messages(stage: Stage, expected: str) -> None:
    msg = problems_of(stages=(stage,))
    assert msg.startswith("stage 1 (epochs 0-4): ")
    assert expected in msg


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"base_lr": 0.0}, "base_lr must be a finite number > 0"),
        ({"base_lr": math.nan}, "base_lr must be a finite number > 0"),
        ({"base_batch_size": 0}, "base_batch_size must be an integer in [1,"),
        (
            {"scaling_rule": "cubic"},
            "scaling_rule 'cubic' (a string) is not supported; use one of none, linear, sqrt",
        ),
        (
            {"optimizer": "adam"},
            "optimizer 'adam' (a string) is not supported; use one of sgd, adamw, lars",
        ),
        ({"momentum": 1.0}, "momentum must be a number in [0, 1), got 1.0"),
        ({"momentum": -0.1}, "momentum must be a number in [0, 1)"),
        ({"weight_decay": -1e-4}, "weight_decay must be a finite number >= 0"),
        ({"label_smoothing": 1.0}, "label_smoothing must be a number in [0, 1)"),
        ({"warmup_start_lr": -1.0}, "warmup_start_lr must be a finite number >= 0"),
        ({"allow_decreasing_batch": "yes"}, "allow_decreasing_batch must be true or false"),
        ({"placement": PlacementHint(0)}, "placement.world_size must be an integer in [1,"),
        ({"placement": PlacementHint(8, 0)}, "placement.micro_batch must be a positive integer"),
        ({"provenance": {"x": math.inf}}, "provenance.x: inf is not allowed"),
        ({"provenance": {"x": {1: 2}}}, "provenance.x: key 1 must be a string"),
        ({"provenance": {"x": [object()]}}, "provenance.x[0]: <object"),
        ({"provenance": [1]}, "provenance must be a mapping"),
    ],
)
def test_run_wide_field_messages(overrides: dict[str, Any], expected: str) -> None:
    assert expected in problems_of(**overrides)


def test_decreasing_batch_rejected_unless_allowed() -> None:
    stages = (Stage(0, 3, 256), Stage(3, 8, 64))
    msg = problems_of(stages=stages)
    assert (
        "stage 2 (epochs 3-8) has batch_size 64, smaller than stage 1 (epochs 0-3) batch_size "
        "256: batch sizes must be non-decreasing" in msg
    )
    assert "allow_decreasing_batch: true" in msg
    assert three_stage(stages=stages, allow_decreasing_batch=True).summary() == "256@0-3 -> 64@3-8"


def test_all_problems_are_reported_at_once() -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule(
            (Stage(0, 3, 0), Stage(4, 8, 64, lr_multiplier=-1)),
            base_lr=0.0,
            base_batch_size=64,
            momentum=2.0,
        )
    problems = info.value.problems
    assert len(problems) == 5
    assert str(info.value).startswith("5 problems: (1) stage 1 (epochs 0-3): batch_size")
    assert any("stage 2 (epochs 4-8): lr_multiplier" in p for p in problems)
    assert any("gap of 1 epoch" in p for p in problems)


def test_non_stage_items_are_rejected() -> None:
    msg = problems_of(stages=({"start_epoch": 0},))
    assert "stage 1: expected a Stage, got" in msg
    assert "Schedule.from_dict" in msg


def test_numpy_like_integers_are_normalised() -> None:
    np = pytest.importorskip("numpy")
    s = Schedule(
        (Stage(0, np.int64(3), np.int64(64)),), base_lr=np.float64(0.1), base_batch_size=64
    )
    assert type(s.stages[0].end_epoch) is int
    assert json.loads(json.dumps(s.to_dict()))["stages"][0]["batch_size"] == 64


# ------------------------------------------------------------------------------ placement


def test_place_batch_even_split() -> None:
    p = place_batch(256, 4)
    assert p == BatchPlacement(256, (64, 64, 64, 64), 1, ((64,), (64,), (64,), (64,)))
    assert p.world_size == 4
    assert p.gradient_weights == (0.25, 0.25, 0.25, 0.25)


def test_place_batch_accumulation() -> None:
    p = place_batch(1000, 4, micro_batch=64)
    assert p.local_batches == (250,) * 4
    assert p.accumulation_steps == 4  # ceil(250 / 64)
    assert p.micro_batches[0] == (63, 63, 62, 62)
    assert p.max_micro_batch == 63


def test_place_batch_uneven_without_weights_suggests_multiples() -> None:
    with pytest.raises(
        PlacementError,
        match=r"global batch 100 does not divide evenly across 8 workers; use a multiple of 8 "
        r"\(e\.g\. 96 or 104\) or pass speed_weights",
    ):
        place_batch(100, 8)


def test_place_batch_speed_weights_largest_remainder() -> None:
    p = place_batch(10, 3, speed_weights=[1.0, 1.0, 1.0])
    assert p.local_batches == (4, 3, 3)  # ties go to the lower rank
    p = place_batch(100, 3, speed_weights=[1, 2, 3.5])
    # shares 15.38, 30.77, 53.85 -> floors 15, 30, 53 (+1 to the largest remainders)
    assert p.local_batches == (15, 31, 54)
    assert sum(p.local_batches) == 100
    assert sum(p.gradient_weights) == pytest.approx(1.0)


def test_slow_worker_micro_batches_may_be_zero() -> None:
    p = place_batch(41, 2, micro_batch=10, speed_weights=[1, 40])
    assert p.local_batches == (1, 40)
    assert p.accumulation_steps == 4
    assert p.micro_batches == ((1, 0, 0, 0), (10, 10, 10, 10))


def test_place_batch_each_worker_needs_a_sample() -> None:
    with pytest.raises(PlacementError, match="cannot give each of 8 workers at least one sample"):
        place_batch(4, 8, speed_weights=[1.0] * 8)
    with pytest.raises(PlacementError, match="rank 0 would get 0 of the 10 samples"):
        place_batch(10, 2, speed_weights=[0.01, 10.0])


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"global_batch": 0, "world_size": 1}, "global batch must be an integer"),
        ({"global_batch": 8, "world_size": 0}, "world_size must be an integer in [1,"),
        ({"global_batch": 8, "world_size": 2, "micro_batch": 0}, "micro_batch must be a positive"),
        (
            {"global_batch": 8, "world_size": 2, "speed_weights": [1.0]},
            "speed_weights has 1 entries but world_size is 2",
        ),
        (
            {"global_batch": 8, "world_size": 2, "speed_weights": [1.0, math.nan]},
            "speed_weights[1] must be a finite number > 0",
        ),
        (
            {"global_batch": 8, "world_size": 2, "speed_weights": [0, 1]},
            "speed_weights[0] must be a finite number > 0 (rank 0's relative throughput), got 0",
        ),
        (
            {"global_batch": 2**20, "world_size": 1, "micro_batch": 1},
            "needs 1048576 accumulation steps, more than the maximum",
        ),
    ],
)
def test_place_batch_argument_messages(kwargs: dict[str, Any], expected: str) -> None:
    with pytest.raises(PlacementError) as info:
        place_batch(**kwargs)
    assert expected in str(info.value)
    assert isinstance(info.value, ValidationError)


def test_place_schedule_per_stage() -> None:
    placements = place(three_stage(), 4, micro_batch=128)
    assert [p.stage_index for p in placements] == [0, 1, 2]
    assert [p.placement.local_batches[0] for p in placements] == [16, 64, 256]
    assert [p.placement.accumulation_steps for p in placements] == [1, 1, 2]


def test_place_names_every_unplaceable_stage() -> None:
    with pytest.raises(PlacementError) as info:
        place(three_stage(), 48)
    msg = str(info.value)
    assert "stage 1 (epochs 0-3): global batch 64 does not divide evenly across 48 workers" in msg
    assert "stage 2 (epochs 3-8): global batch 256" in msg
    assert "stage 3 (epochs 8-12): global batch 1024" in msg


def test_place_reports_bad_arguments_once() -> None:
    with pytest.raises(PlacementError) as info:
        place(three_stage(), 0)
    assert info.value.problems == ("world_size must be an integer in [1, 131072], got 0",)


# ------------------------------------------------------------------------------ dict / YAML


def test_example_file_loads() -> None:
    s = Schedule.load(EXAMPLE)
    assert s.summary() == "512@0-10 -> 2048@10-30 (lr x0.75) -> 8192@30-45 (lr x0.5)"
    assert s.placement == PlacementHint(world_size=8, micro_batch=256)
    assert s.provenance is not None
    assert s.provenance["task"] == "cifar10"
    assert s.peak_lr(2) == pytest.approx(1.6)
    assert Schedule.from_yaml(s.to_yaml()) == s
    # the numbers quoted in docs/schedule-format.md
    assert s.lr_at(31.0) == pytest.approx(0.95)
    assert s.lr_at(21.0) == pytest.approx(0.3)
    assert s.lr_at(45) == pytest.approx(0.016)
    assert s.total_steps(50_000) == 1540
    placements = place(s, s.placement.world_size, s.placement.micro_batch)
    assert placements[2].placement.accumulation_steps == 4


def test_format_doc_embeds_the_example_verbatim() -> None:
    text = (EXAMPLE.parents[1] / "docs" / "schedule-format.md").read_text()
    section = text.split("## Complete example", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    assert block == EXAMPLE.read_text()


def test_dict_round_trip_through_json() -> None:
    s = three_stage(
        warmup_start_lr=0.0,
        placement=PlacementHint(4),
        provenance={"study_id": "abc", "metrics": {"val_accuracy": 0.91}, "seeds": (1, 2)},
    )
    data = json.loads(json.dumps(s.to_dict()))
    assert Schedule.from_dict(data) == s
    assert data["provenance"]["seeds"] == [1, 2]


def test_to_dict_shape() -> None:
    d = three_stage().to_dict()
    assert list(d)[:2] == ["version", "units"]
    assert d["version"] == 1
    assert d["units"] == {"time": "epochs", "batch_size": "samples", "lr": "absolute"}
    assert d["stages"][0] == {
        "start_epoch": 0,
        "end_epoch": 3,
        "batch_size": 64,
        "lr_multiplier": 1.0,
        "warmup_epochs": 0.0,
        "decay": "constant",
    }
    assert d["stages"][2]["decay_final_factor"] == 0.0
    assert "warmup_start_lr" not in d
    assert "provenance" not in d


def test_yaml_round_trip_keeps_float_precision() -> None:
    s = three_stage(base_lr=0.1 + 0.2, weight_decay=1e-5, label_smoothing=1 / 3)
    text = s.to_yaml()
    assert "0.30000000000000004" in text
    assert Schedule.from_yaml(text) == s


@pytest.mark.parametrize("text", ["é ü", "line\u0085break", "\ud800", "😀"])
def test_yaml_round_trip_of_unusual_provenance_text(text: str) -> None:
    s = three_stage(provenance={"note": text, text: [text]})
    assert Schedule.from_yaml(s.to_yaml()) == s


def test_dump_and_load(tmp_path: Path) -> None:
    s = three_stage(provenance={"task": "digits"})
    path = tmp_path / "s.yaml"
    s.dump(path)
    assert Schedule.load(path) == s


def test_yaml_with_gap_names_both_stages() -> None:
    text = EXAMPLE.read_text().replace("start_epoch: 10", "start_epoch: 11")
    with pytest.raises(ScheduleError) as info:
        Schedule.from_yaml(text)
    assert (
        "stage 1 (epochs 0-10) ends at epoch 10 but stage 2 (epochs 11-30) starts at epoch 11"
        in str(info.value)
    )


def test_yaml_exponent_without_dot_is_a_number() -> None:
    text = EXAMPLE.read_text().replace("weight_decay: 5.0e-05", "weight_decay: 5e-5")
    assert Schedule.from_yaml(text).weight_decay == 5e-5


def test_from_dict_exponent_string_is_not_a_number() -> None:
    with pytest.raises(
        ScheduleError, match="weight_decay must be a finite number >= 0, got '5e-5'"
    ):
        Schedule.from_dict(doc(weight_decay="5e-5"))


def test_unknown_stage_key_names_key_and_stage() -> None:
    data = doc()
    data["stages"][1]["bach_size"] = 128
    with pytest.raises(ScheduleError) as info:
        Schedule.from_dict(data)
    msg = str(info.value)
    assert "stage 2 (epochs 3-8): unknown key 'bach_size'; allowed: start_epoch, end_epoch" in msg


def test_unknown_top_level_key() -> None:
    with pytest.raises(ScheduleError, match="top level: unknown key 'base_lrr'; allowed: version"):
        Schedule.from_dict(doc(base_lrr=0.1))


def test_unknown_placement_and_units_keys() -> None:
    with pytest.raises(ScheduleError, match="placement: unknown key 'gpus'"):
        Schedule.from_dict(doc(placement={"world_size": 2, "gpus": 2}))
    units = {"time": "epochs", "batch_size": "samples", "lr": "absolute", "memory": "GB"}
    with pytest.raises(ScheduleError, match="units: unknown key 'memory'"):
        Schedule.from_dict(doc(units=units))


def test_missing_keys() -> None:
    data = doc(base_lr=None)
    del data["stages"][0]["batch_size"]
    with pytest.raises(ScheduleError) as info:
        Schedule.from_dict(data)
    assert info.value.problems == (
        "top level: missing required key 'base_lr'",
        "stage 1 (epochs 0-3): missing required key 'batch_size'",
    )


def test_structural_and_value_problems_reported_together() -> None:
    data = doc()
    data["stages"][0]["colour"] = "red"
    data["stages"][1]["batch_size"] = 0
    with pytest.raises(ScheduleError) as info:
        Schedule.from_dict(data)
    assert len(info.value.problems) == 2
    assert "unknown key 'colour'" in info.value.problems[0]
    assert "stage 2 (epochs 3-8): batch_size must be a positive integer" in info.value.problems[1]


@pytest.mark.parametrize(
    ("version", "expected"),
    [
        (
            None,
            "missing 'version'; this stagetune reads schedule format version 1: add 'version: 1'",
        ),
        (2, "unsupported version 2; this stagetune reads schedule format version 1 only"),
        ("1", "unsupported version '1' (a string)"),
        (True, "unsupported version true (a boolean)"),
    ],
)
def test_version_checks(version: Any, expected: str) -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.from_dict(doc(version=version))
    assert expected in str(info.value)


def test_units_are_fixed() -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.from_dict(doc(units={"time": "steps", "batch_size": "samples", "lr": "absolute"}))
    assert "units.time: 'steps' (a string) is not supported; version 1 uses time: epochs" in str(
        info.value
    )
    with pytest.raises(ScheduleError, match="units: missing key 'lr'"):
        Schedule.from_dict(doc(units={"time": "epochs", "batch_size": "samples"}))
    with pytest.raises(ScheduleError, match=r"missing required key 'units'; add units: \{time"):
        Schedule.from_dict(doc(units=None))


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ([1, 2], "a schedule document must be a mapping"),
        (doc(stages={"a": 1}), "stages: must be a list of stage mappings"),
        (doc(stages=[3]), "stage 1: must be a mapping, got 3"),
        (doc(provenance="x"), "provenance: must be a mapping"),
        (doc(placement=[8]), "placement: must be a mapping"),
    ],
)
def test_document_shape_messages(data: object, expected: str) -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.from_dict(data)
    assert expected in str(info.value)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 1\nstages: [\n", "invalid YAML at line 3, column 1"),
        ("version: 1\n  base_lr: 0.1\n", "invalid YAML at line 2"),
        ("", "the schedule YAML document is empty"),
        ("just text", "a schedule document must be a mapping"),
        ("!!python/object:os.system {}", "invalid YAML"),
    ],
)
def test_malformed_yaml_gives_clear_error(text: str, expected: str) -> None:
    with pytest.raises(ScheduleError) as info:
        Schedule.from_yaml(text)
    assert expected in str(info.value)


def test_load_errors_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ScheduleError, match=r"cannot read schedule file .*nope\.yaml"):
        Schedule.load(missing)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 3\n")
    with pytest.raises(ScheduleError, match=r"bad.yaml: top level: unsupported version 3"):
        Schedule.load(bad)


def test_provenance_is_copied_not_aliased() -> None:
    prov: dict[str, Any] = {"metrics": {"acc": 0.5}}
    s = three_stage(provenance=prov)
    prov["metrics"]["acc"] = 0.9
    assert s.provenance == {"metrics": {"acc": 0.5}}


def test_replace_revalidates() -> None:
    s = three_stage()
    with pytest.raises(ScheduleError, match="base_lr"):
        replace(s, base_lr=-1.0)
