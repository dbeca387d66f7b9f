"""The recipe candidates: the published recipes fitted to the study's budget, drawn by the
searcher first as ordinary (enqueued) points of the space, once per study."""

from __future__ import annotations

import pickle
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from tuner.engine_search import META_KEY, ScheduleSearcher
from tuner.objectives import StudyObjective
from tuner.optuna_storage import CANDIDATE_ATTR
from tuner.recipes import (
    FITTED_BATCH_WARMUP,
    FITTED_CONSTANT,
    FITTED_CONSTANT_SQRT,
    FITTED_INCREASE,
    LATER_LR_FACTOR,
    MAX_LR_JUMP,
    OTHER_LR_VARIANTS,
    RECIPE_FIRST_LR_DOUBLE,
    RECIPE_LR_HALF,
    RECIPE_LR_UP,
    RUNNER_UP_LR_HALF,
    RUNNER_UP_LR_UP,
    SGD_LR_VARIANTS,
    lr_bracket,
    lr_variant_names,
    lr_variants,
    recipe_schedules,
)
from tuner.schedule import Schedule
from tuner.space import ScheduleSpace, StepCap
from tuner.spec import StudySpec, TaskDefaults

optuna.logging.set_verbosity(optuna.logging.WARNING)

DEFAULTS = TaskDefaults(epochs=12, base_batch_size=32, base_lr=0.1)
TRAIN_SIZE = 5000
# mnist1d's bench space: 1,872 steps at batch 32; the cap is a fifth of them.
SPEC = """
task: mnist1d
schedule: {total_epochs: 12, scaling_rule: linear}
space:
  stages: {min: 1, max: 4}
  batch_size: {min: 32, max: 1024}
  lr_multiplier: {min: 0.25, max: 4}
  warmup_epochs: {min: 0, max: 1}
  decay: [constant, cosine]
objective: {kind: accuracy, max_steps: 374}
"""


def recipes(text: str, train_size: int | None = TRAIN_SIZE) -> dict[str, Schedule]:
    spec = StudySpec.from_yaml(text)
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    return dict(recipe_schedules(space, spec.objective, train_size))


def test_the_constant_recipe_takes_the_smallest_batch_within_the_step_cap() -> None:
    schedule = recipes(SPEC)[FITTED_CONSTANT]
    (stage,) = schedule.stages
    # 128 would take 39 x 12 = 468 steps > 374; 256 takes 19 x 12 = 228.
    assert stage.batch_size == 256
    assert schedule.total_steps(TRAIN_SIZE) <= 374
    assert stage.lr_multiplier == 1.0  # the scaling rule's LR
    assert stage.warmup_epochs == pytest.approx(0.6)  # 5 % of the run
    assert stage.decay == "cosine"


def test_the_increase_recipe_multiplies_the_batch_at_the_cuts_and_keeps_the_lr() -> None:
    schedule = recipes(SPEC)[FITTED_INCREASE]
    # From 128, the smallest start with which the skeleton (cuts at epochs 6 and 9: 273
    # steps) fits the cap, its cuts moved later to use the most of it: 8 x 39 + 2 x 9 +
    # 2 x 4 = 338 steps (cuts at 9 and 11 would take 373, but leave a 1-epoch stage, under
    # the space's 2-epoch minimum).
    assert [(s.start_epoch, s.end_epoch, s.batch_size) for s in schedule.stages] == [
        (0, 8, 128),
        (8, 10, 512),
        (10, 12, 1024),
    ]
    assert schedule.total_steps(TRAIN_SIZE) == 338
    # Linear rule: 4x the batch at a quarter of the multiplier is the same absolute LR; at
    # 1,024 (capped, 2,048 wanted) the multiplier 1/16 is clipped to the space's 0.25.
    assert [s.lr_multiplier for s in schedule.stages] == [1.0, 0.25, 0.25]
    assert [s.decay for s in schedule.stages] == ["constant", "constant", "cosine"]


def test_without_a_constraint_the_recipes_start_at_the_smallest_batch() -> None:
    found = recipes(SPEC.replace(", max_steps: 374", ""))
    assert found[FITTED_CONSTANT].stages[0].batch_size == 32
    increase = found[FITTED_INCREASE]
    # No step budget to fill: the skeleton's cuts, at 50 % and 75 % of the run.
    assert [(s.start_epoch, s.batch_size) for s in increase.stages] == [(0, 32), (6, 128), (9, 512)]


def test_a_mean_batch_bound_alone_keeps_the_skeletons_cuts() -> None:
    found = recipes(SPEC.replace("max_steps: 374", "max_mean_batch_size: 512"))
    assert [s.start_epoch for s in found[FITTED_INCREASE].stages] == [0, 6, 9]


def test_the_increase_recipes_cuts_move_only_as_far_as_the_cap_allows() -> None:
    """A cap between two cut positions: the recipe takes the later one that still fits, and
    each schedule with one more epoch before a cut would exceed the cap."""
    for cap in (300, 320, 340, 360):
        text = SPEC.replace("max_steps: 374", f"max_steps: {cap}")
        schedule = recipes(text)[FITTED_INCREASE]
        steps = schedule.total_steps(TRAIN_SIZE)
        assert steps <= cap
        cuts = [s.start_epoch for s in schedule.stages[1:]]
        assert cuts[0] >= 6, cuts
        assert cuts[1] >= 9, cuts
        for i in range(len(cuts)):
            later = [c + (j == i) for j, c in enumerate(cuts)]
            if later[-1] > 10 or later[0] >= later[1] - 1:
                continue  # not a schedule of the space (a stage under 2 epochs)
            stages = [
                (st.start_epoch if k == 0 else later[k - 1], st.batch_size)
                for k, st in enumerate(schedule.stages)
            ]
            bounds = [b for b, _ in stages] + [12]
            more = sum(
                (bounds[k + 1] - bounds[k]) * (TRAIN_SIZE // size)
                for k, (_, size) in enumerate(stages)
            )
            assert more > cap, (cap, cuts, later, more)


def test_every_recipe_is_a_point_of_the_space_within_the_cap() -> None:
    spec = StudySpec.from_yaml(SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    cap = StepCap.of(spec.objective, TRAIN_SIZE)
    for name, schedule in recipe_schedules(space, spec.objective, TRAIN_SIZE):
        params = space.params_for(schedule, cap)
        assert params is not None, name
        assert space.sample(optuna.trial.FixedTrial(params), cap) == schedule


def test_a_space_that_cannot_draw_a_recipe_leaves_it_out() -> None:
    two_stages = recipes(SPEC.replace("stages: {min: 1, max: 4}", "stages: {min: 2, max: 4}"))
    assert FITTED_CONSTANT not in two_stages  # one batch is one stage
    one_stage = recipes(SPEC.replace("stages: {min: 1, max: 4}", "stages: {min: 1, max: 1}"))
    assert FITTED_INCREASE not in one_stage
    assert FITTED_CONSTANT in one_stage


def test_a_constrained_objective_without_the_training_size_gets_none() -> None:
    assert recipes(SPEC, train_size=None) == {}


def make_searcher(
    storage: str, recipes_on: bool = True, budget: int | None = None
) -> ScheduleSearcher:
    spec = StudySpec.from_yaml(SPEC)
    resolved = spec.resolve(DEFAULTS)
    return ScheduleSearcher(
        space=ScheduleSpace.from_spec(resolved),
        objective=StudyObjective.of(spec, resolved.total_epochs),
        baselines=[],
        storage_url=storage,
        study_name="recipes",
        startup_trials=3,
        train_size=TRAIN_SIZE,
        recipes=recipes_on,
        budget=budget,
    )


def test_the_searcher_draws_the_recipes_first_and_once(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = make_searcher(storage)
    first = [searcher.suggest(f"t{i}") for i in range(4)]
    assert all(isinstance(c, dict) for c in first)
    drawn = [Schedule.from_dict(c["schedule"]).summary() for c in first]  # type: ignore[index]
    # Under the step cap the batch warm-up recipe first, then the increase recipe.
    assert drawn[:3] == [
        "64@0-2 -> 256@2-12",
        "128@0-8 -> 512@8-10 (lr x0.25) -> 1024@10-12 (lr x0.25)",
        "256@0-12",
    ]
    assert [c[META_KEY]["candidate"] for c in first] == [  # type: ignore[index]
        FITTED_BATCH_WARMUP,
        FITTED_INCREASE,
        FITTED_CONSTANT,
        None,
    ]
    trials = searcher.study.get_trials(deepcopy=False)
    assert [t.user_attrs.get(CANDIDATE_ATTR) for t in trials] == [
        FITTED_BATCH_WARMUP,
        FITTED_INCREASE,
        FITTED_CONSTANT,
        None,
    ]
    for i in range(4):
        searcher.on_trial_complete(
            f"t{i}", {"training_iteration": 12, "val_accuracy": 0.9, "steps": 228}
        )
    # A searcher resuming the same Optuna study does not draw them again.
    again = make_searcher(storage)
    config = again.suggest("t4")
    assert isinstance(config, dict)
    assert config[META_KEY]["candidate"] is None


def test_recipes_off_draws_from_the_sampler_only(tmp_path: Path) -> None:
    searcher = make_searcher(f"sqlite:///{tmp_path / 'optuna.db'}", recipes_on=False)
    configs = [searcher.suggest(f"t{i}") for i in range(2)]
    assert all(c[META_KEY]["candidate"] is None for c in configs)  # type: ignore[index]


ADAMW = TaskDefaults(epochs=10, base_batch_size=32, base_lr=0.003, optimizer="adamw")
# tinylm's bench space: 640 steps at batch 32 on 2,048 sequences; the cap is a fifth of them.
ADAMW_SPEC = """
task: tinylm
schedule: {total_epochs: 10, scaling_rule: linear}
space:
  stages: {min: 1, max: 4}
  batch_size: {min: 32, max: 512}
  lr_multiplier: {min: 0.0625, max: 4}
  warmup_epochs: {min: 0, max: 1}
  decay: [constant, cosine]
objective: {kind: accuracy, metric: val_loss, max_steps: 128}
"""


def test_adamw_recipes_keep_the_base_lr_and_cool_down_at_the_end() -> None:
    """Linear scaling would take Adam to 8x its base LR at batch 256, the square-root rule to
    2.8x; both lose 0.3-0.5 nats on tinylm. The AdamW recipes keep the base LR at the first
    stage's batch, hold it, and cool down over the last fifth of the run (warm-up-stable-
    decay); a 4x larger batch halves the LR (Seesaw), down to the space's smallest
    multiplier."""
    spec = StudySpec.from_yaml(ADAMW_SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(ADAMW))
    found = dict(recipe_schedules(space, spec.objective, 2048))
    constant = found[FITTED_CONSTANT]
    stable, cooldown = constant.stages
    assert (stable.start_epoch, stable.end_epoch, cooldown.end_epoch) == (0, 8, 10)
    assert stable.batch_size == cooldown.batch_size == 256
    assert (stable.decay, cooldown.decay) == ("constant", "cosine")
    assert (stable.warmup_epochs, cooldown.warmup_epochs) == (0.5, 0)
    assert constant.peak_lr(0) == constant.peak_lr(1) == pytest.approx(0.003, rel=0.05)
    # A point the sampler can draw under the step cap (the searcher enqueues it so).
    assert space.params_for(constant, StepCap.of(spec.objective, 2048)) is not None
    # The same recipe again at the square-root rule's LR (a base LR below Adam's edge); under
    # the step cap the batch warm-up and increase recipes first.
    assert list(found) == [
        FITTED_BATCH_WARMUP,
        FITTED_INCREASE,
        FITTED_CONSTANT,
        FITTED_CONSTANT_SQRT,
    ]
    sqrt = found[FITTED_CONSTANT_SQRT]
    assert [(st.start_epoch, st.batch_size, st.decay) for st in sqrt.stages] == [
        (0, 256, "constant"),
        (8, 256, "cosine"),
    ]
    assert sqrt.peak_lr(0) == pytest.approx(0.003 * 8**0.5, rel=0.03)
    increase = found[FITTED_INCREASE]
    assert [s.batch_size for s in increase.stages] == [128, 512, 512]
    # The first cut moved from epoch 5 to 7 (100 -> 124 of the 128 steps); the second stays
    # at the skeleton's 8, as moving it adds no step (both stages at 512).
    assert [s.start_epoch for s in increase.stages] == [0, 7, 8]
    assert increase.total_steps(2048) == 124
    first, second, _ = (increase.peak_lr(i) for i in range(3))
    assert first == pytest.approx(0.003, rel=0.03)
    # 4x the batch halves the LR; at 512 the space's smallest multiplier is the base LR.
    assert increase.stages[1].lr_multiplier == space.lr_mult_min
    assert second == pytest.approx(0.003, rel=0.03)


def test_adamw_constant_recipe_is_one_cosine_stage_where_the_space_has_one_stage() -> None:
    spec = StudySpec.from_yaml(ADAMW_SPEC.replace("{min: 1, max: 4}", "{min: 1, max: 1}"))
    space = ScheduleSpace.from_spec(spec.resolve(ADAMW))
    found = dict(recipe_schedules(space, spec.objective, 2048))
    assert list(found) == [FITTED_CONSTANT, FITTED_CONSTANT_SQRT]
    (stage,) = found[FITTED_CONSTANT].stages
    assert (stage.batch_size, stage.decay, stage.end_epoch) == (256, "cosine", 10)
    assert found[FITTED_CONSTANT].peak_lr(0) == pytest.approx(0.003, rel=0.05)


def test_sgd_recipes_keep_the_studys_rule() -> None:
    """The same space with SGD: the linear rule's LR (multiplier 1) as before."""
    spec = StudySpec.from_yaml(ADAMW_SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    found = dict(recipe_schedules(space, spec.objective, 2048))
    # No square-root twin.
    assert list(found) == [FITTED_BATCH_WARMUP, FITTED_INCREASE, FITTED_CONSTANT]
    (constant,) = found[FITTED_CONSTANT].stages
    assert constant.lr_multiplier == 1.0


def test_the_square_root_twin_is_left_out_where_it_is_the_same_schedule() -> None:
    """Without a step cap both constant recipes take the base batch, where every scaling
    rule gives the base LR: the twin would train the same schedule again."""
    spec = StudySpec.from_yaml(ADAMW_SPEC.replace(", max_steps: 128", ""))
    space = ScheduleSpace.from_spec(spec.resolve(ADAMW))
    found = dict(recipe_schedules(space, spec.objective, 2048))
    assert list(found) == [FITTED_CONSTANT, FITTED_INCREASE]
    assert found[FITTED_CONSTANT].stages[0].batch_size == 32


def test_the_batch_warmup_recipe_spends_a_short_first_stage_on_the_most_steps() -> None:
    """Under a step cap: the space's shortest first stage, then a larger batch to the end,
    the pair of batches with which the run takes the most steps within the cap, at the study's
    rule's LR for SGD: mnist1d's space (2-epoch minimum stage) spends 2 x 78 = 156 of its 374
    steps at batch 64, then 10 x 19 at 256 (346; 512 after it would take 246)."""
    schedule = recipes(SPEC)[FITTED_BATCH_WARMUP]
    assert [(s.start_epoch, s.end_epoch, s.batch_size) for s in schedule.stages] == [
        (0, 2, 64),
        (2, 12, 256),
    ]
    assert schedule.total_steps(TRAIN_SIZE) == 346
    first, second = schedule.stages
    assert first.lr_multiplier == second.lr_multiplier == 1.0  # the linear rule's LR
    assert first.decay == "constant"
    assert second.decay == "cosine"
    assert second.warmup_epochs == pytest.approx(0.6)  # Goyal's 5 % of the run
    # A cap the smaller batches cannot start within: larger ones.
    tight = recipes(SPEC.replace("max_steps: 374", "max_steps: 200"))[FITTED_BATCH_WARMUP]
    assert [s.batch_size for s in tight.stages] == [128, 512]
    assert tight.total_steps(TRAIN_SIZE) <= 200


def test_the_batch_warmup_recipe_grows_the_lr_at_most_4x() -> None:
    """The most steps within mnist1d's cap would be 2 x 156 at batch 32, then 10 x 4 at 1,024
    (352): under the linear rule a 32x LR jump mid-run, which diverged in every study that
    drew it. Only pairs whose peak LR grows at most MAX_LR_JUMP times count; with a wider
    bound the 32x pair comes back (the bound is what leaves it out)."""
    schedule = recipes(SPEC)[FITTED_BATCH_WARMUP]
    assert schedule.peak_lr(1) / schedule.peak_lr(0) == pytest.approx(MAX_LR_JUMP)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("tuner.recipes.MAX_LR_JUMP", 32)
        wide = recipes(SPEC)[FITTED_BATCH_WARMUP]
    assert [s.batch_size for s in wide.stages] == [32, 1024]
    assert wide.total_steps(TRAIN_SIZE) == 352


def test_the_batch_warmup_recipe_trades_a_larger_first_batch_for_a_smaller_second() -> None:
    """mnist1d's 30-epoch space under a 936-step cap (3-epoch minimum stage): 32 first leaves
    only 512 after it (468 + 27 x 9 = 711; 256 would take 981), 64 first leaves 256 (234 +
    27 x 19 = 747). The recipe takes the most steps, so the smaller batch for 27 of the 30
    epochs: in fresh-seed retrains 98.81 +/- 0.07 % test against 98.77 +/- 0.08 %."""
    text = SPEC.replace("total_epochs: 12", "total_epochs: 30").replace("374", "936")
    schedule = recipes(text)[FITTED_BATCH_WARMUP]
    assert [(s.start_epoch, s.end_epoch, s.batch_size) for s in schedule.stages] == [
        (0, 3, 64),
        (3, 30, 256),
    ]
    assert schedule.total_steps(TRAIN_SIZE) == 747
    # The LR of the linear rule at each batch: 2x and 8x the base LR.
    assert [schedule.peak_lr(i) for i in (0, 1)] == pytest.approx([0.2, 0.8])


def test_the_batch_warmup_recipe_needs_a_step_cap() -> None:
    assert FITTED_BATCH_WARMUP not in recipes(SPEC.replace(", max_steps: 374", ""))
    assert FITTED_BATCH_WARMUP not in recipes(
        SPEC.replace("max_steps: 374", "max_mean_batch_size: 512")
    )
    one_stage = recipes(SPEC.replace("stages: {min: 1, max: 4}", "stages: {min: 1, max: 1}"))
    assert FITTED_BATCH_WARMUP not in one_stage


def test_adamw_batch_warmup_grows_the_lr_by_the_square_root_rule_and_cools_down() -> None:
    """For AdamW the large batch takes the square-root rule's LR from the first stage's
    (4x the batch: 2x the LR), held, then the cooldown of warm-up-stable-decay. tinylm's cap
    (128 steps of 2,048 sequences): 64 -> 256 takes 104 steps, 32 -> 512 100; measured on 5
    fresh seeds, 2.52 +/- 0.19 nats test loss against 2.71 +/- 0.26."""
    spec = StudySpec.from_yaml(ADAMW_SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(ADAMW))
    schedule = dict(recipe_schedules(space, spec.objective, 2048))[FITTED_BATCH_WARMUP]
    assert [(s.start_epoch, s.batch_size, s.decay) for s in schedule.stages] == [
        (0, 64, "constant"),
        (1, 256, "constant"),
        (8, 256, "cosine"),
    ]
    assert schedule.total_steps(2048) == 104  # 32 + 9 x 8; 32 -> 256 would be 136
    assert schedule.peak_lr(0) == pytest.approx(0.003, rel=0.03)
    assert schedule.peak_lr(1) == schedule.peak_lr(2) == pytest.approx(0.006, rel=0.03)
    assert space.params_for(schedule, StepCap.of(spec.objective, 2048)) is not None


def test_the_lr_variants_bracket_a_schedules_lr_and_keep_everything_else() -> None:
    """For SGD the LR moved up (the first stage's multiplier doubled, every stage at a larger
    batch than the first and not cut below the first's LR at 3x: at mnist1d's 1/5 cap 98.95 %
    test on ten seeds against the recipe's 98.79) and every stage's halved; batches, stages,
    warm-ups and decays stay; on the space's grid and within its range."""
    spec = StudySpec.from_yaml(SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    recipe = recipes(SPEC)[FITTED_INCREASE]
    variants = dict(lr_variants(space, recipe))
    assert list(variants) == [RECIPE_LR_UP, RECIPE_LR_HALF] == list(lr_variant_names(space)[:2])
    mults = [st.lr_multiplier for st in recipe.stages]
    low, high = space.lr_mult_min, space.lr_mult_max
    assert mults == [1.0, 0.25, 0.25]  # the later stages at the range's bottom

    def lrs(name: str) -> list[float]:
        return [st.lr_multiplier for st in variants[name].stages]

    assert LATER_LR_FACTOR == 3.0
    # The increase recipe's later stages are its LR cuts (the larger batch stands for a
    # decay): left at their LR, so the up-variant doubles the first stage alone.
    assert lrs(RECIPE_LR_UP) == [2.0, 0.25, 0.25]
    # The batch warm-up recipe's larger batch holds the rule's LR: tripled.
    warmup = recipes(SPEC)[FITTED_BATCH_WARMUP]
    assert [st.lr_multiplier for st in warmup.stages] == [1.0, 1.0]
    up = dict(lr_variants(space, warmup))[RECIPE_LR_UP]
    assert [st.lr_multiplier for st in up.stages] == [2.0, LATER_LR_FACTOR]
    assert lrs(RECIPE_LR_HALF) == [0.5, 0.25, 0.25] == [max(low, m / 2) for m in mults]
    assert high > 2.0  # nothing clipped at the top
    # The batch warm-up recipe's later stage near the range's top: clipped there.
    high_later = replace(
        warmup,
        stages=(warmup.stages[0], *(replace(st, lr_multiplier=2.0) for st in warmup.stages[1:])),
    )
    up = dict(lr_variants(space, high_later))[RECIPE_LR_UP]
    assert [st.lr_multiplier for st in up.stages][1:] == [high] * (len(up.stages) - 1)
    for variant in variants.values():
        assert [
            (st.start_epoch, st.end_epoch, st.batch_size, st.warmup_epochs, st.decay)
            for st in variant.stages
        ] == [
            (st.start_epoch, st.end_epoch, st.batch_size, st.warmup_epochs, st.decay)
            for st in recipe.stages
        ]
        assert space.params_for(variant, StepCap.of(spec.objective, TRAIN_SIZE)) is not None


def test_adamw_and_lars_double_the_first_stages_lr_alone() -> None:
    """For AdamW every stage's LR doubled lost on both tasks where it was measured, so the
    up-variant is the first stage's alone doubled (``recipe_first_lr_double``); LARS, not
    measured, keeps it too."""
    spec = StudySpec.from_yaml(ADAMW_SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(ADAMW))
    assert lr_variant_names(space) == OTHER_LR_VARIANTS
    found = dict(recipe_schedules(space, spec.objective, 2048))
    recipe = found[FITTED_BATCH_WARMUP]
    variants = dict(lr_variants(space, recipe))
    assert list(variants) == [RECIPE_FIRST_LR_DOUBLE, RECIPE_LR_HALF]
    mults = [st.lr_multiplier for st in recipe.stages]
    doubled = [st.lr_multiplier for st in variants[RECIPE_FIRST_LR_DOUBLE].stages]
    assert doubled == [2 * mults[0], *mults[1:]]
    lars = ScheduleSpace.from_spec(
        StudySpec.from_yaml(SPEC).resolve(replace(DEFAULTS, optimizer="lars"))
    )
    assert lr_variant_names(lars) == OTHER_LR_VARIANTS
    increase = recipes(SPEC)[FITTED_INCREASE]
    assert [name for name, _ in lr_variants(lars, increase)] == [
        RECIPE_FIRST_LR_DOUBLE,
        RECIPE_LR_HALF,
    ]


def test_an_lr_variant_that_changes_nothing_is_left_out() -> None:
    """At the range's top doubling changes nothing (left out), halving still does; at its
    bottom the reverse."""
    spec = StudySpec.from_yaml(SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    one = recipes(SPEC)[FITTED_CONSTANT]
    # One batch throughout: the up-variant doubles the first (only) stage's LR.
    assert [name for name, _ in lr_variants(space, one)] == [RECIPE_LR_UP, RECIPE_LR_HALF]

    def at(mult: float) -> Schedule:
        return replace(one, stages=tuple(replace(st, lr_multiplier=mult) for st in one.stages))

    assert [name for name, _ in lr_variants(space, at(space.lr_mult_max))] == [RECIPE_LR_HALF]
    assert [name for name, _ in lr_variants(space, at(space.lr_mult_min))] == [RECIPE_LR_UP]


def _finish(searcher: ScheduleSearcher, trial_id: str, score: float, epochs: int = 12) -> None:
    result = {"training_iteration": epochs, "val_accuracy": score, "score": score, "steps": 300}
    searcher.on_trial_result(trial_id, result)
    searcher.on_trial_complete(trial_id, result)


def test_once_the_recipes_have_trained_the_best_two_ones_lr_variants_come_next(
    tmp_path: Path,
) -> None:
    """The recipes first; while one is still training the sampler draws; once all have
    finished, the LR variants of the best two (ranked by the furthest epoch reached, then the
    score), the best one's first, once each, then the sampler again."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    searcher = make_searcher(storage)
    first = [searcher.suggest(f"t{i}") for i in range(3)]
    names = [c[META_KEY]["candidate"] for c in first]  # type: ignore[index]
    assert names == [FITTED_BATCH_WARMUP, FITTED_INCREASE, FITTED_CONSTANT]
    _finish(searcher, "t0", 0.95)
    _finish(searcher, "t2", 0.99, epochs=3)  # stopped early: ranked below a whole run
    # t1 is still training: no variants yet.
    drawn = searcher.suggest("t3")
    assert drawn[META_KEY]["candidate"] is None  # type: ignore[index]
    _finish(searcher, "t1", 0.97)
    best, second = (Schedule.from_dict(first[i]["schedule"]) for i in (1, 0))  # type: ignore[index]
    spec = StudySpec.from_yaml(SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    expected = dict(lr_variants(space, best))
    runner_up = {RECIPE_LR_UP: RUNNER_UP_LR_UP, RECIPE_LR_HALF: RUNNER_UP_LR_HALF}
    for name, variant in lr_variants(space, second):
        expected[runner_up[name]] = variant
    assert list(expected) == list(SGD_LR_VARIANTS)
    assert [name for name, _ in searcher._pending_variants()] == list(SGD_LR_VARIANTS)
    copy = pickle.dumps(searcher)  # the queue planned, nothing of it drawn yet
    variants = [searcher.suggest("t4")]
    # Restored from that copy after the first was drawn: only the others are still to draw.
    restored = pickle.loads(copy)
    assert [name for name, _ in restored._pending_variants()] == list(SGD_LR_VARIANTS[1:])
    variants += [searcher.suggest(f"t{i}") for i in range(5, 8)]
    assert [v[META_KEY]["candidate"] for v in variants] == list(SGD_LR_VARIANTS)  # type: ignore[index]
    for v in variants:
        name = v[META_KEY]["candidate"]  # type: ignore[index]
        assert Schedule.from_dict(v["schedule"]).stages == expected[name].stages  # type: ignore[index]
    after = searcher.suggest("t8")
    assert after[META_KEY]["candidate"] is None  # type: ignore[index]
    # Tune's restore path (set_state) reads them back from the Optuna study too.
    again = pickle.loads(copy)
    again.set_state(searcher.get_state())
    assert again._pending_variants() == []
    ot = searcher.study.get_trials(deepcopy=False)
    assert [t.user_attrs.get(CANDIDATE_ATTR) for t in ot][4:8] == list(SGD_LR_VARIANTS)


def test_the_lr_bracket_goes_around_the_best_two_recipes_and_trains_nothing_twice() -> None:
    """The best recipe's variants under their names, then the second's under the runner-up
    names; a third recipe gets none; a variant equal to a ranked recipe or an earlier
    variant is left out."""
    spec = StudySpec.from_yaml(SPEC)
    space = ScheduleSpace.from_spec(spec.resolve(DEFAULTS))
    made = recipes(SPEC)
    constant, increase = made[FITTED_CONSTANT], made[FITTED_INCREASE]
    bracket = lr_bracket(space, [increase, constant, made[FITTED_BATCH_WARMUP]])
    assert [name for name, _ in bracket] == list(SGD_LR_VARIANTS)
    assert (
        dict(bracket)[RECIPE_LR_HALF].stages
        == dict(lr_variants(space, increase))[RECIPE_LR_HALF].stages
    )
    assert (
        dict(bracket)[RUNNER_UP_LR_HALF].stages
        == dict(lr_variants(space, constant))[RECIPE_LR_HALF].stages
    )
    # The runner-up is the best one at twice its LR: the best one's doubled variant is the
    # runner-up itself and the runner-up's halved one the best recipe (both left out).
    (stage,) = constant.stages
    doubled = replace(constant, stages=(replace(stage, lr_multiplier=stage.lr_multiplier * 2),))
    bracket = lr_bracket(space, [constant, doubled])
    assert [name for name, _ in bracket] == [RECIPE_LR_HALF, RUNNER_UP_LR_UP]
    assert dict(bracket)[RUNNER_UP_LR_UP].stages[0].lr_multiplier == pytest.approx(
        stage.lr_multiplier * 4
    )
    # One recipe: its own bracket only.
    assert [name for name, _ in lr_bracket(space, [constant])] == list(SGD_LR_VARIANTS[:2])


def test_a_small_budget_spends_at_most_a_sixth_of_its_trials_on_lr_variants(
    tmp_path: Path,
) -> None:
    """With 24 tuned trials all four variants are drawn, with 12 the best recipe's two, with
    6 one, with 5 none."""
    for budget, wanted in ((24, 4), (12, 2), (6, 1), (5, 0)):
        searcher = make_searcher(f"sqlite:///{tmp_path / f'b{budget}.db'}", budget=budget)
        for i in range(3):
            searcher.suggest(f"t{i}")
        for i, score in enumerate((0.95, 0.97, 0.96)):
            _finish(searcher, f"t{i}", score)
        later = [searcher.suggest(f"t{i}") for i in range(3, min(budget, 8))]
        got = [c[META_KEY]["candidate"] for c in later]  # type: ignore[index]
        assert got == [*SGD_LR_VARIANTS[:wanted], *[None] * (len(later) - wanted)], budget
