"""PBT's schedule moves: where the population starts and what a perturbation makes of a
schedule (the Tune side runs in tests/tuner/test_engine.py and tests/workers/test_runner.py)."""

from __future__ import annotations

import random

from tuner.pbt import initial_schedules, pbt_interval, perturb
from tuner.schedule import Schedule
from tuner.space import ScheduleSpace
from tuner.spec import StudySpec, TaskDefaults

DEFAULTS = TaskDefaults(epochs=12, base_batch_size=32, base_lr=0.1)


def space(stages_max: int = 3) -> ScheduleSpace:
    text = (
        "task: digits\nschedule: {total_epochs: 12}\n"
        f"space: {{stages: {{min: 1, max: {stages_max}}}, batch_size: {{min: 32, max: 1024}}, "
        "lr_multiplier: {min: 0.5, max: 2.0}, warmup_epochs: {min: 0, max: 1}}"
    )
    return ScheduleSpace.from_spec(StudySpec.from_yaml(text).resolve(DEFAULTS))


def test_the_interval_cuts_the_run_into_as_many_segments_as_stages_allowed() -> None:
    assert pbt_interval(space(3), None) == 4
    assert pbt_interval(space(5), None) == 2
    assert pbt_interval(space(3), 5) == 5


def test_the_population_starts_one_stage_small_batch_and_feasible() -> None:
    sp = space()
    starts = initial_schedules(sp, 40, seed=1)
    assert len(starts) == 40
    assert {len(s.stages) for s in starts} == {1}
    # The smaller half of 32..1024 (6 sizes): 32, 64, 128; LR multipliers on the grid.
    assert {s.stages[0].batch_size for s in starts} == {32, 64, 128}
    mults = {s.stages[0].lr_multiplier for s in starts}
    assert len(mults) > 3
    assert all(0.5 <= m <= 2.0 for m in mults)
    assert initial_schedules(sp, 40, seed=1) == starts  # the study seed decides
    # A constraint (here: at least 256 per step) moves the start into what can meet it.
    big = initial_schedules(sp, 20, seed=1, feasible=lambda s: s.stages[0].batch_size >= 256)
    assert {s.stages[0].batch_size for s in big} == {256, 512}
    # Nothing feasible: the largest batch (the engine has checked the space can meet it).
    assert {s.stages[0].batch_size for s in initial_schedules(sp, 5, 1, lambda s: False)} == {1024}


def test_a_perturbation_keeps_the_head_and_adds_one_stage_to_the_end() -> None:
    sp = space()
    rng = random.Random(0)
    start = initial_schedules(sp, 1, seed=3)[0]
    seen = set()
    for _ in range(30):
        grown = perturb(sp, start, 4, rng)
        if grown == start:
            continue
        head, tail = grown.stages
        assert (head.start_epoch, head.end_epoch) == (0, 4)
        assert head.batch_size == start.stages[0].batch_size
        assert head.lr_multiplier == start.stages[0].lr_multiplier
        assert (tail.start_epoch, tail.end_epoch) == (4, 12)
        assert tail.batch_size in (head.batch_size, 2 * head.batch_size)
        assert 0.5 <= tail.lr_multiplier <= 2.0
        seen.add((tail.batch_size, tail.lr_multiplier))
        Schedule.from_dict(grown.to_dict())  # a valid schedule
    assert len(seen) >= 3  # batch kept or doubled, LR multiplier up or down
    # At stages.max stages, or at the run's edges, the schedule stays as it is.
    grown = start
    for epoch in (4, 8):
        before = grown
        while grown == before:
            grown = perturb(sp, before, epoch, rng)
    assert [st.start_epoch for st in grown.stages] == [0, 4, 8]
    assert perturb(sp, grown, 10, rng) == grown
    assert perturb(sp, start, 0, rng) == start
    assert perturb(sp, start, 12, rng) == start
