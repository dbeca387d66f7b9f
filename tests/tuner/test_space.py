"""The search space, sampled through a real Optuna study (no Ray): every draw is a valid
schedule inside the space, and infeasible spaces are rejected up front."""

from __future__ import annotations

import math
import re
from collections import Counter

import optuna
import pytest

from tuner.errors import ValidationError
from tuner.schedule import Schedule, Stage, place
from tuner.space import ScheduleSpace, StepCap, check_feasible, constraint_violations
from tuner.spec import StudySpec, TaskDefaults

DEFAULTS = TaskDefaults(epochs=20, base_batch_size=32, base_lr=0.05)

optuna.logging.set_verbosity(optuna.logging.WARNING)


def space_of(text: str, defaults: TaskDefaults = DEFAULTS) -> ScheduleSpace:
    return ScheduleSpace.from_spec(StudySpec.from_yaml(text).resolve(defaults))


def draw(space: ScheduleSpace, n: int, seed: int = 0) -> list[tuple[Schedule, dict[str, object]]]:
    """``n`` schedules from a seeded TPE study; each told a score so TPE leaves its startup."""
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=10)
    )
    out = []
    for _ in range(n):
        trial = study.ask()
        schedule = space.sample(trial)
        # Reward many large-batch epochs, so TPE pushes into a corner of the space.
        study.tell(trial, schedule.mean_batch_size(5000))
        out.append((schedule, dict(trial.params)))
    return out


SPEC = """
task: mnist1d
schedule: {total_epochs: 12, scaling_rule: sqrt}
space:
  stages: {min: 1, max: 4}
  min_stage_fraction: 0.15
  batch_size: {min: 24, max: 1000}
  lr_multiplier: {min: 0.5, max: 2.0}
  warmup_epochs: {min: 0.5, max: 3.0}
  decay: [constant, cosine]
  label_smoothing: [0.0, 0.1]
resources: {workers: 2, micro_batch: 16}
"""


def test_200_sampled_schedules_are_valid_and_inside_the_space() -> None:
    space = space_of(SPEC)
    # Batch sizes: powers of two in [24, 1000] that are multiples of 2 workers x 16 = 32.
    assert space.batch_sizes == (32, 64, 128, 256, 512)
    assert space.min_stage_epochs == 2  # ceil(0.15 x 12)
    stage_counts: Counter[int] = Counter()
    for schedule, params in draw(space, 200):
        stage_counts[schedule.num_stages] += 1
        assert schedule.total_epochs == 12
        assert schedule.stages[0].start_epoch == 0
        assert schedule.scaling_rule == "sqrt"
        assert schedule.label_smoothing in (0.0, 0.1)
        batches = [st.batch_size for st in schedule.stages]
        assert batches == sorted(batches), "batch sizes must be non-decreasing"
        for st in schedule.stages:
            assert st.batch_size in space.batch_sizes
            assert st.num_epochs >= 2
            assert 0.5 <= st.lr_multiplier <= 2.0
            assert min(0.5, st.num_epochs) <= st.warmup_epochs <= min(3.0, st.num_epochs)
            assert st.decay in ("constant", "cosine")
            # On the space's grid (what is trained is what is exported, and reads well):
            # two significant digits of LR multiplier, warm-ups in 0.05-epoch steps.
            assert st.lr_multiplier == float(f"{st.lr_multiplier:.2g}")
            assert st.warmup_epochs == st.num_epochs or (
                round(st.warmup_epochs / 0.05, 6) == round(st.warmup_epochs / 0.05)
            )
        # The YAML it exports carries short numbers.
        text = schedule.to_yaml()
        assert not re.search(r"\d\.\d{6,}", text), text
        # Placeable on the study's workers (what the trainable will do).
        assert len(place(schedule, 2, 16)) == schedule.num_stages
        assert params["n_stages"] == schedule.num_stages
        # The document round-trips (it is what trials store and export).
        assert Schedule.from_dict(schedule.to_dict()) == schedule
    assert set(stage_counts) == {1, 2, 3, 4}, stage_counts


def test_sampling_is_reproducible_with_the_seed() -> None:
    space = space_of(SPEC)
    first = [s.to_dict() for s, _ in draw(space, 15, seed=3)]
    second = [s.to_dict() for s, _ in draw(space, 15, seed=3)]
    other = [s.to_dict() for s, _ in draw(space, 15, seed=4)]
    assert first == second
    assert first != other


def test_decreasing_batches_are_sampled_only_when_allowed() -> None:
    space = space_of(
        "task: mnist1d\nschedule: {total_epochs: 8}\n"
        "space: {stages: {min: 3, max: 3}, allow_decreasing_batch: true}"
    )
    schedules = [s for s, _ in draw(space, 60)]
    assert all(s.allow_decreasing_batch for s in schedules)
    assert any(
        any(b.batch_size < a.batch_size for a, b in zip(s.stages, s.stages[1:], strict=False))
        for s in schedules
    )


def test_stage_count_is_capped_by_what_fits_in_the_run() -> None:
    space = space_of(
        "task: mnist1d\nschedule: {total_epochs: 5}\n"
        "space: {stages: {min: 1, max: 8}, min_stage_fraction: 0.2}"
    )
    assert space.stages_max == 5
    for schedule, _ in draw(space, 40):
        assert all(st.num_epochs >= 1 for st in schedule.stages)


def test_boundaries_spread_over_the_whole_run() -> None:
    """Stick-breaking: the first stage is not systematically longer than the last."""
    space = space_of(
        "task: mnist1d\nschedule: {total_epochs: 40}\n"
        "space: {stages: {min: 3, max: 3}, min_stage_fraction: 0.025}"
    )
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=1))
    firsts, lasts = [], []
    for _ in range(300):
        schedule = space.sample(study.ask())
        firsts.append(schedule.stages[0].num_epochs)
        lasts.append(schedule.stages[-1].num_epochs)
    mean_first, mean_last = sum(firsts) / 300, sum(lasts) / 300
    assert math.isclose(mean_first, 40 / 3, rel_tol=0.15)
    assert math.isclose(mean_last, 40 / 3, rel_tol=0.15)


@pytest.mark.parametrize(
    ("text", "defaults", "reason"),
    [
        (
            # Spec-valid (batch max left to the default 16 x base = 64), empty once resolved.
            "task: mnist1d\nresources: {workers: 2, micro_batch: 64}",
            TaskDefaults(epochs=10, base_batch_size=4, base_lr=0.1),
            "no power of two in [4, 64] is a multiple of workers x micro_batch = 128",
        ),
        (
            "task: mnist1d\nspace: {stages: {min: 3, max: 4}}",
            TaskDefaults(epochs=2, base_batch_size=32, base_lr=0.1),
            "do not fit in the run",
        ),
    ],
)
def test_empty_spaces_are_rejected_with_the_fix(
    text: str, defaults: TaskDefaults, reason: str
) -> None:
    with pytest.raises(ValidationError, match="space") as info:
        ScheduleSpace.from_spec(StudySpec.from_yaml(text).resolve(defaults))
    assert reason in str(info.value)


def test_constraint_violations_are_relative_and_signed() -> None:
    spec = StudySpec.from_yaml(
        "task: mnist1d\nschedule: {total_epochs: 4}\n"
        "objective: {max_mean_batch_size: 64, max_steps: 100}"
    )
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    small = space.schedule([Stage(0, 4, 32)])
    big = space.schedule([Stage(0, 4, 128)])
    ok = constraint_violations(small, spec.objective, 1024)
    # 1024 // 32 = 32 steps/epoch x 4 = 128 steps > 100; mean batch 32 <= 64.
    assert ok["max_mean_batch_size"] == pytest.approx(32 / 64 - 1)
    assert ok["max_steps"] == pytest.approx(128 / 100 - 1)
    bad = constraint_violations(big, spec.objective, 1024)
    assert bad["max_mean_batch_size"] == pytest.approx(1.0)
    assert bad["max_steps"] < 0
    assert constraint_violations(small, StudySpec.from_yaml("task: mnist1d").objective, None) == {}


def test_check_feasible_rejects_constraints_no_schedule_can_meet() -> None:
    spec = StudySpec.from_yaml(
        "task: mnist1d\nschedule: {total_epochs: 10}\nspace: {batch_size: {min: 32, max: 256}}\n"
        "objective: {max_steps: 100}"
    )
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    # Largest batch 256 on 5000 samples: 19 steps/epoch x 10 = 190 > 100.
    with pytest.raises(ValidationError, match="takes 190 steps on 5000 samples"):
        check_feasible(space, spec.objective, 5000)
    check_feasible(space, spec.objective, 2560)  # 10 x 10 = 100 steps: feasible
    with pytest.raises(ValidationError, match="exceeds the task's 200 training samples"):
        check_feasible(space, spec.objective, 200)


CAPPED = """
task: tinylm
schedule: {total_epochs: 10, scaling_rule: linear}
space:
  stages: {min: 1, max: 4}
  batch_size: {min: 32, max: 512}
  decay: [constant, cosine]
objective: {max_steps: %d}
"""


def _capped_draws(max_steps: int, n: int) -> tuple[ScheduleSpace, StepCap, list[Schedule]]:
    spec = StudySpec.from_yaml(CAPPED % max_steps)
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    cap = StepCap.of(spec.objective, 2048)
    assert cap == StepCap(max_steps, 2048)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    drawn = []
    for _ in range(n):
        trial = study.ask()
        drawn.append(space.sample(trial, cap))
        study.tell(trial, 0.0)
    return space, cap, drawn


def test_a_step_cap_is_built_into_the_draws() -> None:
    """The objective's max_steps on 2,048 samples over 10 epochs: every draw meets it, none is
    wasted. At 40 steps only batch 512 can (4 steps an epoch), so every stage gets 512 and the
    draws explore the LR multipliers over their whole range instead (rejection kept 12 of 28
    draws on tinylm, all with multipliers above 0.69); at 128 steps the draws mix batches
    (smaller ones early, as far as the rest of the run at 512 leaves room for)."""
    space, cap, drawn = _capped_draws(40, 60)
    assert all(st.batch_size == 512 for sch in drawn for st in sch.stages)
    mults = sorted(st.lr_multiplier for sch in drawn for st in sch.stages)
    assert (space.lr_mult_min, space.lr_mult_max) == (0.062, 4.0)
    assert mults[0] < 0.15
    assert mults[-1] > 2.0
    assert sum(m < 0.5 for m in mults) > len(mults) // 4  # log-uniform: half below 0.5

    space, cap, drawn = _capped_draws(128, 200)
    for sch in drawn:
        assert (
            constraint_violations(sch, StudySpec.from_yaml(CAPPED % 128).objective, 2048)[
                "max_steps"
            ]
            <= 0
        )
        assert sch.total_steps(2048) <= 128
    firsts = Counter(sch.stages[0].batch_size for sch in drawn)
    # 32 fits only as a 1-epoch first stage: 64 steps + 9 epochs x 4 at 512 = 100.
    assert {32, 64, 128, 256, 512} <= set(firsts)
    assert any(sch.total_steps(2048) > 100 for sch in drawn)  # the cap is used, not avoided

    # A capped draw is enqueued back exactly (the noise-scale candidate, prefixes).
    for sch in drawn[:40]:
        params = space.params_for(sch, cap)
        assert params is not None
        assert space.sample(optuna.trial.FixedTrial(params), cap).stages == sch.stages


def test_without_a_cap_the_draws_are_unchanged() -> None:
    """No max_steps: the same seeded draws with and without the cap argument (existing
    studies resume with the schedules they drew)."""
    space = space_of(SPEC)
    assert StepCap.of(StudySpec.from_yaml(SPEC).objective, 5000) is None
    first = draw(space, 30, seed=7)
    study = optuna.create_study(
        direction="maximize", sampler=optuna.samplers.TPESampler(seed=7, n_startup_trials=10)
    )
    for schedule, params in first:
        trial = study.ask()
        again = space.sample(trial, None)
        study.tell(trial, again.mean_batch_size(5000))
        assert again == schedule
        assert trial.params == params


def test_the_default_lr_range_reaches_both_scaling_rules_at_the_largest_batch() -> None:
    """Batch 32 to 1,024 under linear scaling: the square-root rule's LR at 1,024 (a multiplier
    of sqrt(32/1024) = 0.18) is inside the drawn range, and the search draws it."""
    space = space_of("task: mnist1d\nspace: {batch_size: {max: 1024}}")
    assert (space.lr_mult_min, space.lr_mult_max) == (0.044, 4.0)
    sqrt_mult = math.sqrt(32 / 1024)
    assert space.lr_mult_min < sqrt_mult
    drawn = [s for s, _ in draw(space, 300)]
    assert any(st.lr_multiplier < sqrt_mult for s in drawn for st in s.stages)
    # Up to the base batch nothing changes; under the square-root rule the top is widened to
    # the linear rule's LR, under no scaling too (the square root lies between).
    assert (space_of("task: mnist1d\nspace: {batch_size: {max: 32}}").lr_mult_min) == 0.25
    sqrt = space_of(
        "task: mnist1d\nschedule: {scaling_rule: sqrt}\nspace: {batch_size: {max: 512}}"
    )
    assert (sqrt.lr_mult_min, sqrt.lr_mult_max) == (0.25, 16.0)
    none = space_of(
        "task: mnist1d\nschedule: {scaling_rule: none}\nspace: {batch_size: {max: 512}}"
    )
    assert (none.lr_mult_min, none.lr_mult_max) == (0.25, 64.0)


def test_a_stored_spec_widens_the_default_lr_range_as_the_submitted_one() -> None:
    """What a worker runs is the spec read back from the store (``to_dict`` -> ``from_dict``,
    defaults written out): a bound the user left out stays ``null`` there, so the study draws
    from the widened range, not from 0.25-4 (what every stored study drew before)."""
    submitted = StudySpec.from_yaml("task: mnist1d\nspace: {batch_size: {max: 1024}}")
    stored = submitted.to_dict()
    assert stored["space"]["lr_multiplier"] == {"min": None, "max": None}
    read_back = StudySpec.from_dict(stored)
    for spec in (submitted, read_back):
        space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
        assert (space.lr_mult_min, space.lr_mult_max) == (0.044, 4.0)
    given = StudySpec.from_yaml(
        "task: mnist1d\nspace: {batch_size: {max: 1024}, lr_multiplier: {min: 0.25}}"
    )
    again = ScheduleSpace.from_spec(StudySpec.from_dict(given.to_dict()).resolve(DEFAULTS))
    assert (again.lr_mult_min, again.lr_mult_max) == (0.25, 4.0)


def test_an_lr_range_the_spec_sets_is_the_range_searched() -> None:
    space = space_of(
        "task: mnist1d\nspace: {batch_size: {max: 1024}, lr_multiplier: {min: 0.5, max: 2}}"
    )
    assert (space.lr_mult_min, space.lr_mult_max) == (0.5, 2.0)
    partly = space_of("task: mnist1d\nspace: {batch_size: {max: 1024}, lr_multiplier: {max: 2}}")
    assert (partly.lr_mult_min, partly.lr_mult_max) == (0.044, 2.0)
