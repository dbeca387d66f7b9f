"""Property tests of tuner.schedule: round trips, LR continuity, step sums, placement."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuner.schedule import (
    DECAYS,
    MAX_ACCUMULATION_STEPS,
    OPTIMIZERS,
    SCALING_RULES,
    PlacementError,
    PlacementHint,
    Schedule,
    ScheduleError,
    Stage,
    place,
    place_batch,
)

PROPS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def floats(
    lo: float | None = None, hi: float | None = None, *, exclude_max: bool = False
) -> st.SearchStrategy[float]:
    return st.floats(lo, hi, allow_nan=False, allow_infinity=False, exclude_max=exclude_max)


BATCHES = [8, 16, 24, 32, 64, 96, 128, 256, 512]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | floats()
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def schedules(draw: st.DrawFn, *, grid: bool = False, max_epochs: int = 12) -> Schedule:
    """Valid schedules. ``grid=True`` keeps warm-ups and step intervals on a 1/8-epoch grid
    (so that no LR drop falls a rounding error away from a stage end)."""
    n = draw(st.integers(1, 4))
    total = draw(st.integers(n, max_epochs))
    cuts = (
        sorted(draw(st.sets(st.integers(1, total - 1), min_size=n - 1, max_size=n - 1)))
        if n > 1
        else []
    )
    bounds = [0, *cuts, total]
    allow_decreasing = draw(st.booleans())
    sizes = [draw(st.sampled_from(BATCHES)) for _ in range(n)]
    if not allow_decreasing:
        sizes.sort()
    stages = []
    for i in range(n):
        length = bounds[i + 1] - bounds[i]
        warmup = draw(st.integers(0, 8 * length)) / 8 if grid else draw(floats(0, length))
        decay = draw(st.sampled_from(DECAYS))
        every = None
        if decay == "step":
            every = draw(st.integers(1, 16)) / 4 if grid else draw(floats(0.01, 20))
        stages.append(
            Stage(
                start_epoch=bounds[i],
                end_epoch=bounds[i + 1],
                batch_size=sizes[i],
                lr_multiplier=draw(floats(0.01, 10)),
                warmup_epochs=warmup,
                decay=decay,
                decay_final_factor=draw(floats(0, 1)),
                step_every_epochs=every,
                step_gamma=draw(floats(0.01, 1)),
            )
        )
    provenance = draw(st.none() | st.dictionaries(st.text(max_size=8), json_values, max_size=4))
    placement = draw(
        st.none() | st.builds(PlacementHint, st.integers(1, 1024), st.none() | st.integers(1, 4096))
    )
    return Schedule(
        stages=tuple(stages),
        base_lr=draw(floats(1e-6, 10)),
        base_batch_size=draw(st.sampled_from(BATCHES)),
        scaling_rule=draw(st.sampled_from(SCALING_RULES)),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        momentum=draw(floats(0, 1, exclude_max=True)),
        weight_decay=draw(floats(0, 1)),
        label_smoothing=draw(floats(0, 1, exclude_max=True)),
        warmup_start_lr=draw(st.none() | floats(0, 10)),
        allow_decreasing_batch=allow_decreasing,
        placement=placement,
        provenance=provenance,
    )


# ------------------------------------------------------------------------------ round trips


@PROPS
@given(schedules())
def test_yaml_round_trip_is_identity(s: Schedule) -> None:
    text = s.to_yaml()
    back = Schedule.from_yaml(text)
    assert back == s
    assert back.to_yaml() == text


@PROPS
@given(schedules())
def test_json_dict_round_trip_is_identity(s: Schedule) -> None:
    data = json.loads(json.dumps(s.to_dict(), allow_nan=False))
    assert Schedule.from_dict(data) == s


# ------------------------------------------------------------------------------ LR


@PROPS
@given(schedules(grid=True))
def test_lr_continuous_at_warmup_end(s: Schedule) -> None:
    delta = 1e-9
    for i, stage in enumerate(s.stages):
        if stage.warmup_epochs == 0:
            continue
        peak, start = s.peak_lr(i), s.stage_start_lr(i)
        warm_end = stage.decay_start_epoch
        # the ramp's slope bounds how far the LR may move in delta epochs
        slope = abs(peak - start) / stage.warmup_epochs
        tol = slope * delta * 1.01 + 1e-12 * max(peak, start)
        assert s.lr_at(warm_end - delta) == pytest.approx(peak, rel=0, abs=tol)
        if warm_end < stage.end_epoch:
            assert s.lr_at(warm_end) == pytest.approx(peak, rel=1e-12)


@PROPS
@given(schedules(grid=True))
def test_lr_continuous_into_a_stage_with_warmup(s: Schedule) -> None:
    delta = 1e-7
    for i in range(1, s.num_stages):
        stage, prev = s.stages[i], s.stages[i - 1]
        end_lr = s.stage_end_lr(i - 1)
        # the previous stage's curve approaches the LR it ends with ...
        approach = s.lr_at(stage.start_epoch - delta)
        tol = 1e-5 * max(s.peak_lr(i - 1), s.stage_start_lr(i - 1))
        assert approach == pytest.approx(end_lr, abs=tol), prev
        # ... and a warm-up starts exactly there
        if stage.warmup_epochs > 0:
            assert s.lr_at(stage.start_epoch) == end_lr
        else:
            assert s.lr_at(stage.start_epoch) == pytest.approx(s.peak_lr(i), rel=1e-12)


@PROPS
@given(schedules(), floats(0, 1))
def test_lr_is_positive_and_bounded(s: Schedule, frac: float) -> None:
    epoch = frac * s.total_epochs
    lr = s.lr_at(epoch)
    first = s.base_lr if s.warmup_start_lr is None else s.warmup_start_lr
    bound = max([first, *(s.peak_lr(i) for i in range(s.num_stages))])
    assert 0.0 <= lr <= bound * (1 + 1e-12)


# ------------------------------------------------------------------------------ steps


@PROPS
@given(schedules(max_epochs=6), st.integers(1, 1500), st.booleans())
def test_steps_and_samples_add_up(s: Schedule, n: int, drop_last: bool) -> None:
    if drop_last and any(stage.batch_size > n for stage in s.stages):
        with pytest.raises(ScheduleError, match="larger than the dataset"):
            s.total_steps(n, drop_last=drop_last)
        return
    per_stage = s.stage_steps(n, drop_last=drop_last)
    total = s.total_steps(n, drop_last=drop_last)
    steps = list(s.iter_steps(n, drop_last=drop_last))
    assert sum(per_stage) == total == len(steps)
    assert s.samples_seen(n, drop_last=drop_last) == sum(x.batch_size for x in steps)
    assert s.mean_batch_size(n, drop_last=drop_last) == pytest.approx(
        sum(x.batch_size for x in steps) / len(steps)
    )
    if not drop_last:
        assert s.samples_seen(n, drop_last=False) == n * s.total_epochs
    assert [x.global_step for x in steps] == list(range(total))
    for i, stage in enumerate(s.stages):
        items = [x for x in steps if x.stage_index == i]
        assert len(items) == per_stage[i]
        assert {x.epoch for x in items} == set(range(stage.start_epoch, stage.end_epoch))
        assert all(x.batch_size <= stage.batch_size for x in items)
    for x in steps[:: max(1, len(steps) // 25)]:
        spe = s.steps_per_epoch(x.stage_index, n, drop_last=drop_last)
        assert x.lr == s.lr_at(x.epoch + x.step_in_epoch / spe)
        assert x.batch_size == s.batch_size_at(x.epoch) or (
            not drop_last and x.step_in_epoch == spe - 1
        )


# ------------------------------------------------------------------------------ placement

weights_for = floats(0.01, 100)


@st.composite
def placement_args(draw: st.DrawFn) -> tuple[int, int, int | None, list[float] | None]:
    world = draw(st.integers(1, 32))
    global_batch = draw(st.integers(1, 4096) | st.integers(1, 64).map(lambda k: k * world))
    micro = draw(st.none() | st.integers(1, 512))
    weights = draw(st.none() | st.lists(weights_for, min_size=world, max_size=world))
    return global_batch, world, micro, weights


@PROPS
@given(placement_args())
def test_placement_multiplies_back_to_the_global_batch(
    args: tuple[int, int, int | None, list[float] | None],
) -> None:
    global_batch, world, micro, weights = args
    try:
        p = place_batch(global_batch, world, micro, weights)
    except PlacementError as exc:
        msg = str(exc)
        if global_batch < world:
            assert "at least one sample" in msg
        elif weights is None and global_batch % world != 0:
            assert "does not divide evenly" in msg
        elif "accumulation steps" in msg:
            assert micro is not None
            assert math.ceil(global_batch / micro) > MAX_ACCUMULATION_STEPS
        else:
            assert weights is not None
            assert "would get 0" in msg
            assert min(global_batch * w / sum(weights) for w in weights) < 1
        return
    assert weights is not None or global_batch % world == 0
    assert sum(p.local_batches) == global_batch
    assert len(p.local_batches) == len(p.micro_batches) == world
    assert min(p.local_batches) >= 1
    if weights is not None:
        total_w = sum(Fraction(w) for w in weights)
        for b, w in zip(p.local_batches, weights, strict=True):
            assert abs(b - global_batch * Fraction(w) / total_w) < 1  # largest remainder
    biggest = max(p.local_batches)
    if micro is None:
        assert p.accumulation_steps == 1
    else:
        assert p.accumulation_steps == math.ceil(biggest / micro)
    for local, mbs in zip(p.local_batches, p.micro_batches, strict=True):
        assert len(mbs) == p.accumulation_steps
        assert sum(mbs) == local
        assert max(mbs) - min(mbs) <= 1
        if micro is not None:
            assert max(mbs) <= micro


@PROPS
@given(schedules(max_epochs=6), st.sampled_from([1, 2, 4, 8]), st.none() | st.integers(1, 128))
def test_place_schedule_covers_every_stage(s: Schedule, world: int, micro: int | None) -> None:
    # every batch in BATCHES is a multiple of 8, so an even split always exists
    placements = place(s, world, micro)
    assert [p.stage_index for p in placements] == list(range(s.num_stages))
    for p, stage in zip(placements, s.stages, strict=True):
        assert sum(p.placement.local_batches) == stage.batch_size
