"""Recipe candidates: the published large-batch recipes fitted to a study's space and budget,
as the first schedules a search trains.

A sampler's random start-up knows nothing about batch-size schedules: on ``mnist1d`` (batch
32-1,024, LR multipliers 0.25-4, a 374-step cap) a quarter to a third of the random draws
train to chance accuracy (a large batch at a high multiplier), and the sampler then models
that noise. A user tuning by hand starts instead from what the literature says works, fitted
to the run's step budget. These candidates do that; they are ordinary points of the search
space (enqueued to Optuna with :meth:`ScheduleSpace.params_for`), so the sampler conditions
on them like on any other trial, and they are reported beside the baselines under their names.

* ``fitted_constant`` (Goyal et al. 2017, fitted): one batch for the whole run, the smallest
  of the space with which the run meets the objective's constraints (its ``max_steps``, mean
  batch bounds): the most optimizer steps the budget allows. The LR follows the recipe's
  scaling rule (below), reached by a warm-up of 5 % of the run (Goyal's 5 of 90 epochs,
  within the space's warm-up range), then a cosine decay to zero over the run. For AdamW the
  shape is warm-up-stable-decay instead (the language-model practice; Hägele et al. 2024
  find it matches cosine): the LR stays at its peak, then a cooldown to zero over the last
  :data:`COOLDOWN_FRACTION` of the run, as a second stage at the same batch (one cosine
  stage where the space cannot draw two, or lacks the constant or the cosine shape).
* ``fitted_increase`` (Smith, Kindermans, Le 2017, fitted): the baselines' step skeleton
  (cuts at 50 % and 75 % of the run, fewer where the space allows fewer stages) with the
  batch multiplied by 4 at each cut instead of dividing the LR by 4, starting from the
  smallest batch with which the run meets the constraints, at the recipe's scaling rule's
  LR. For SGD and LARS the absolute LR then stays that of the first stage (Smith's
  equivalence: 4x the batch is a quarter of the LR); for AdamW each 4x of the batch halves it
  (Seesaw, arXiv 2510.14717: for Adam, doubling the batch stands for dividing the LR by
  sqrt(2)). Once the batch is capped at the space's largest, the rest of the factor divides
  the LR. The last stage decays to zero (cosine). Under a step cap the cuts then move later,
  as far as the cap allows (the most optimizer steps it allows, as for ``fitted_constant``;
  of equal counts, the cuts nearest the skeleton's): the batches are powers of two, so the
  skeleton at the smallest start that fits leaves part of the budget unused. Measured with
  the cap at a fifth of the small batch's steps: ``tinylm`` 100 of 128 steps, validation
  loss 2.86 / 2.55 / 2.60 / 2.54 / 2.51 nats on trial seeds 0-4, against 2.68 / 2.49 / 2.52
  / 2.44 / 2.43 with the first cut moved from epoch 5 to 7 (124 steps); ``denoise`` 40 of 51
  steps, 24.42 / 25.69 dB on seeds 0 / 1, against 25.42 / 26.83 with it moved from epoch 4
  to 5 (46 steps).
* ``fitted_constant_sqrt`` (AdamW only): ``fitted_constant`` at the square-root rule's LR
  (below).
* ``fitted_batch_warmup`` (under a step cap only): the critical batch grows fastest early in
  training (McCandlish et al. 2018; the batch-size warm-up of language-model practice), so
  the steps a cap allows are best spent early. The space's shortest first stage, at the
  recipe's scaling rule's LR, then one larger batch to the end. Of the pairs of batches with
  which the run meets the constraints, the one with the most steps (of equal counts, the
  smaller second batch, then the smaller first): the second batch holds for nearly the whole
  run, so a larger first batch that lets it be smaller is worth it. Its LR: the study's
  rule's for SGD and LARS (Goyal's, reached by a warm-up of 5 % of the run), the square-root
  rule's from the first stage's for AdamW, with the cooldown of warm-up-stable-decay.
  Measured on the five test seeds of ``bench/schedule_quality.py``: ``mnist1d`` (cap 936)
  ``64@0-3 -> 256@3-30``, 747 steps, 98.81 +/- 0.07 % test accuracy against 98.77 +/- 0.08
  for ``32@0-3 -> 512@3-30`` (711 steps; 256 after 32 would take 981); ``tinylm`` (cap 128)
  ``64@0-1 -> 256@1-10``, 104 steps, 2.52 +/- 0.19 nats test loss against 2.71 +/- 0.26 for
  ``32@0-1 -> 512@1-10`` (100 steps). In-process at ``denoise``'s 51-step cap (validation
  PSNR, trial seeds 0-3): ``32@0-1 -> 512@1-6 -> 512@6-8``, 46 steps, 26.61 / 27.69 / 28.25
  / 27.83 dB against ``fitted_increase``'s 25.50 / 27.04 / 26.86 / 25.93 in the same 46
  steps. Only pairs whose LR grows at most :data:`MAX_LR_JUMP` (4) times at the increase
  count: the jump comes mid-run, after a warm-up of 5 % of the run, not from the base LR at
  the start as in Goyal's recipe. In ``mnist1d``'s efficiency-bench space (12 epochs, cap
  374, SGD, linear rule) the most steps are ``32@0-2 -> 1024@2-12`` (352), a 32x LR jump:
  validation accuracy 54 / 48 / 60 / 76 / 65 % on trial seeds 0-4 (it diverged at epoch 3
  in every study of that bench), against 98.70 / 98.55 / 98.65 / 98.85 / 98.70 % for
  ``64@0-2 -> 256@2-12`` (346 steps, a 4x jump), the pair the bound leaves; ``64 -> 512``
  (8x) 98.54 % on average, and the 32x pair at a quarter of its second LR (8x) 98.03 %.
  The AdamW pairs measured above jump 2x and 4x (square-root rule).

The recipe's scaling rule: the study's own for SGD and LARS (Goyal's linear rule by
default). For AdamW no one rule holds: past the gradient noise scale Adam's best LR stops
growing with the batch and then falls (Li et al., NeurIPS 2024, the "surge" phenomenon), and
the square-root rule (Malladi et al., NeurIPS 2022) is derived for LRs well below the edge of
stable training, so which one a task follows depends on where its base LR sits. So the AdamW
recipes bracket it: ``fitted_constant`` and ``fitted_increase`` keep the base LR at their
first batch (a base LR tuned to the edge), and ``fitted_constant_sqrt``, the constant recipe
again, takes the square-root rule's LR (a base LR below it). Measured at 8x the base batch,
warm-up-stable-decay, validation metric after the tasks' default epochs: ``tinylm`` (base LR
3e-3, tuned to the edge: 5e-3 trains worse at batch 32; 80 steps; trial seeds 0 / 1) base LR
2.70 / 2.63 nats, square-root LR 3.14 / 3.01, linear 3.13 / 2.97 (with one warm-up epoch and
no decay); ``denoise`` (base LR 1e-3; 32 steps; seed 0) square-root 24.50 dB, base LR 22.93,
linear 20.06. And everywhere warm-up-stable-decay beat a cosine decay over the run:
``tinylm`` base LR 2.85 / 2.82 with a cosine decay; ``denoise`` 0.2-1.2 dB at 4x and 8x the
batch, under each rule.

**The LR bracket** (:func:`lr_variants`): the recipes fix the LR by a rule, and which LR a
budget rewards differs by task, so once they have trained the searcher draws the best two
(:func:`lr_bracket`) again with their LR moved up and with every stage's halved. Two, because
the recipes are ranked at their rule's LR on one seed: at tinylm's 1/5 step cap (validation
loss, trial seeds 0-4) the constant recipe wins at its rule's LR on seed 0 (2.61 nats against
the increase recipe's 2.70), while the increase recipe at half its LR reaches 2.58 there and
2.54 on average (the constant recipe 2.61, halved 2.69). Measured in-process at the quality
bench's 1/5 step caps (validation, trial seeds 0-2, ``fitted_batch_warmup``): ``denoise``
26.64 / 27.59 / 28.27 dB, the first stage doubled 27.50 / 28.48 / 28.70, every stage doubled
26.91 / 24.09 / 23.05; ``tinylm`` 2.81 / 2.42 / 2.52 nats, every stage halved 2.57 / 2.52 /
2.54, the first stage doubled 2.95 / 2.94 / 2.84. So for AdamW (and LARS, not measured) the
up-variant is ``recipe_first_lr_double``, the first stage's LR alone doubled.

For SGD it is ``recipe_lr_up``: the first stage's LR doubled and every stage at a larger batch
than the first at :data:`LATER_LR_FACTOR` (3) times the recipe's, unless the recipe cut that
stage's multiplier below the first's (the increase recipe's later stages, where the larger
batch stands for an LR decay: there the variant is the first stage's alone doubled). Under a
step cap SGD wants more LR than the linear rule gives at the larger batches: on ``mnist1d`` at
its 1/5 cap (``64@0-3 -> 256@3-30``, 747 steps, 6.3x fewer than the small batch; test accuracy
over ten fresh seeds, ``bench/README.md``) the recipe scores 98.79 +/- 0.11 %, with both stages
at 2x its LR 98.89, with the first at 2x and the second at 3x 98.95 +/- 0.10, at 2x and 4x
99.02 +/- 0.10, against the small batch's 98.98 +/- 0.07 in 4,680 steps. 3, not 4: the 4x
schedule diverged on one fresh seed of 16 (in a study's seed runs). The search's own draws
rarely get there: TPE drew that neighbourhood at 1.5-2.5x, and ASHA, comparing them before
their end on one seed, stopped them. ASHA stopped the variant itself too, at its epoch-9 rung
(of 30) in the quality bench's cap study (90.6 % validation on its cooldown probe there; the
recipe 98.9 % at the end), so SGD's up-variants are left unjudged by ASHA
(:data:`UNJUDGED_VARIANTS`): at most two trials of a study run to the end that would have
stopped at a rung. The increase recipe's later stages are left at their cut LR: tripled, they
lost everywhere they were measured (at mnist1d's 30-epoch cap 98.35 % validation against the
recipe's 98.75; in three of the efficiency bench's studies 98.10 / 98.20 / 97.05 % against
98.65 / 98.65 / 98.25 left at their cut LR; in the README's demo 97.05 against 98.05 on the
search seed and 97.80 +/- 0.26 against 98.50 +/- 0.18 on three fresh seeds). Every stage from
the first batch increase on doubled was tried as a third variant of each recipe and not kept:
behind early, ASHA stopped it before its end (docs/design.md).

**The order.** Where the batch warm-up recipe is built (under a step cap), it trains first and
the increase recipe second (:data:`RECIPES`); elsewhere the constant recipe first
(:data:`UNCAPPED_RECIPES`). Under the caps measured, those two were the best recipes: the
batch warm-up recipe on ``mnist1d`` (in its efficiency bench's five studies 98.55-98.85 %
validation, mean 98.69, against 97.75-98.80 for the constant recipe and 97.30-98.30 for the
increase recipe) and on ``denoise`` (above), the increase recipe on ``tinylm`` (plain runs on
trial seeds 0-4 at its 128-step cap: mean validation loss 2.520 nats, the constant recipe
2.610, the batch warm-up recipe 2.603). The order matters to a search in three ways: a
small budget trains only the first few, a study trains two or more at once (the first two
start together), and what finishes first is what the sampler, prefix reuse and ASHA's rungs
start from. Measured on the efficiency bench (docs/design.md): with the batch warm-up recipe
third, it was the trial that brought three of mnist1d's five studies within the tolerance,
after 52-59 trial-epochs; first, it did so after 13.6 (0.36x random search's compute against
0.42x; ``tinylm`` 0.497x against 0.55x, seed 1's best at 11.6 trial-epochs against 46.4).

Multipliers and warm-ups are clipped to the space's ranges and put on its grid; a recipe the
space cannot draw (too few stages, a stage shorter than its minimum) is left out. Only
single-objective studies get them (a Pareto search has no single step budget to fit).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Final

from tuner.baselines import DECAY_FACTOR, WARMUP_FRACTION, multiplier_for, skeleton
from tuner.errors import ValidationError
from tuner.schedule import Schedule, Stage
from tuner.schedule.stage import lr_scale
from tuner.schedule.values import ScalingRule
from tuner.space import ScheduleSpace, constraint_violations, lr_multiplier_grid, warmup_grid
from tuner.spec import StageDecay

__all__ = [
    "BRACKETED_RECIPES",
    "COOLDOWN_FRACTION",
    "FITTED_BATCH_WARMUP",
    "FITTED_CONSTANT",
    "FITTED_CONSTANT_SQRT",
    "FITTED_INCREASE",
    "LATER_LR_FACTOR",
    "LR_VARIANTS",
    "MAX_LR_JUMP",
    "OTHER_LR_VARIANTS",
    "RECIPES",
    "RECIPE_FIRST_LR_DOUBLE",
    "RECIPE_LR_HALF",
    "RECIPE_LR_UP",
    "RUNNER_UP_FIRST_LR_DOUBLE",
    "RUNNER_UP_LR_HALF",
    "RUNNER_UP_LR_UP",
    "RUNNER_UP_VARIANTS",
    "SGD_LR_VARIANTS",
    "UNCAPPED_RECIPES",
    "UNJUDGED_VARIANTS",
    "lr_bracket",
    "lr_variant_names",
    "lr_variants",
    "recipe_schedules",
    "recipe_stages",
]

FITTED_CONSTANT: Final = "fitted_constant"
FITTED_INCREASE: Final = "fitted_increase"
#: AdamW only: the constant recipe at the square-root rule's LR.
FITTED_CONSTANT_SQRT: Final = "fitted_constant_sqrt"
#: Under a step cap: a short first stage at the smallest batch, then one large batch.
FITTED_BATCH_WARMUP: Final = "fitted_batch_warmup"
#: The recipe candidates, in the order the search trains them where the batch warm-up recipe
#: is built (under a step cap): it first and the increase recipe second, the two best recipes
#: under the caps measured (module docstring, "The order"). Otherwise the order is that of
#: :data:`UNCAPPED_RECIPES`.
RECIPES: Final = (FITTED_BATCH_WARMUP, FITTED_INCREASE, FITTED_CONSTANT, FITTED_CONSTANT_SQRT)
#: The order without a step cap (no batch warm-up recipe): the constant recipe first.
UNCAPPED_RECIPES: Final = (FITTED_CONSTANT, FITTED_INCREASE, FITTED_CONSTANT_SQRT)
#: The LR bracket around the best recipe (:func:`lr_variants`): for AdamW and LARS the first
#: stage's multiplier alone doubled; for SGD the first stage's doubled and every stage at a
#: larger batch than the first at :data:`LATER_LR_FACTOR` times its multiplier; and every
#: stage's halved.
RECIPE_FIRST_LR_DOUBLE: Final = "recipe_first_lr_double"
RECIPE_LR_UP: Final = "recipe_lr_up"
RECIPE_LR_HALF: Final = "recipe_lr_half"
#: The same bracket around the second-best recipe (:func:`lr_bracket`).
RUNNER_UP_FIRST_LR_DOUBLE: Final = "runner_up_first_lr_double"
RUNNER_UP_LR_UP: Final = "runner_up_lr_up"
RUNNER_UP_LR_HALF: Final = "runner_up_lr_half"
RUNNER_UP_VARIANTS: Final = (RUNNER_UP_FIRST_LR_DOUBLE, RUNNER_UP_LR_UP, RUNNER_UP_LR_HALF)
#: The LR variants a study with SGD draws, in the order the search trains them.
SGD_LR_VARIANTS: Final = (RECIPE_LR_UP, RECIPE_LR_HALF, RUNNER_UP_LR_UP, RUNNER_UP_LR_HALF)
#: The LR variants a study with AdamW or LARS draws, in the order the search trains them.
OTHER_LR_VARIANTS: Final = (
    RECIPE_FIRST_LR_DOUBLE,
    RECIPE_LR_HALF,
    RUNNER_UP_FIRST_LR_DOUBLE,
    RUNNER_UP_LR_HALF,
)
#: Every LR variant's name.
LR_VARIANTS: Final = (*OTHER_LR_VARIANTS, RECIPE_LR_UP, RUNNER_UP_LR_UP)
#: SGD's up-variant: the multiplier of every stage at a larger batch than the first, times
#: this (module docstring, "The LR bracket"; 4 diverged on one seed of 16).
LATER_LR_FACTOR: Final = 3.0
#: The LR variants ASHA leaves unjudged (``tuner.engine.ProtectedASHA``), so they train to
#: the end: SGD's up-variants, behind at the rungs and ahead at the end (module docstring).
UNJUDGED_VARIANTS: Final = (RECIPE_LR_UP, RUNNER_UP_LR_UP)
#: How many of the best recipes the LR bracket goes around (:func:`lr_bracket`): the recipes
#: are ranked at their rule's LR on one seed, and the one that wins there need not be the one
#: that wins at its best LR (module docstring).
BRACKETED_RECIPES: Final = 2
_RUNNER_UP_NAMES: Final = {
    RECIPE_FIRST_LR_DOUBLE: RUNNER_UP_FIRST_LR_DOUBLE,
    RECIPE_LR_UP: RUNNER_UP_LR_UP,
    RECIPE_LR_HALF: RUNNER_UP_LR_HALF,
}
#: The most the batch warm-up recipe's LR may grow at its one batch increase: the factor of
#: one cut of the increase recipe (Smith et al.'s 4x batch). A larger jump, mid-run and with a
#: short warm-up, diverged where it was measured (module docstring).
MAX_LR_JUMP: Final = DECAY_FACTOR
#: The cooldown of AdamW's warm-up-stable-decay constant recipe, as a fraction of the run.
COOLDOWN_FRACTION: Final = 0.2


_Build = Callable[[ScheduleSpace, int], Schedule | None]
_Fill = Callable[[ScheduleSpace, int, Schedule, object, int], Schedule]


def recipe_schedules(
    space: ScheduleSpace, objective: object, train_size: int | None
) -> list[tuple[str, Schedule]]:
    """The recipe candidates of ``space`` that meet ``objective``'s constraints (see the
    module docstring), in :data:`RECIPES` order where the batch warm-up recipe is built (under
    a step cap), else in :data:`UNCAPPED_RECIPES` order. Without the training-set size no step or
    mean-batch constraint can be checked: then a constrained objective gets none."""
    out: list[tuple[str, Schedule]] = []
    # (name, the recipe from a start batch, what fits it further to the budget once it fits)
    builds: tuple[tuple[str, _Build, _Fill | None], ...] = (
        (FITTED_CONSTANT, _constant, None),
        (FITTED_INCREASE, _increase, _fill_step_cap),
        (FITTED_CONSTANT_SQRT, _constant_sqrt, None),
    )
    for name, build, fill in builds:
        for batch in space.batch_sizes:  # the smallest start that meets the constraints
            schedule = build(space, batch)
            if schedule is None:
                continue
            try:
                violations = constraint_violations(schedule, objective, train_size)
            except ValidationError:  # constrained, and no training-set size to check it
                return []
            if all(v <= 0 for v in violations.values()):
                if fill is not None and train_size is not None:
                    schedule = fill(space, batch, schedule, objective, train_size)
                # A twin that comes out the same (the square-root rule at the base batch) is
                # not trained twice.
                if all(schedule.stages != other.stages for _, other in out):
                    out.append((name, schedule))
                break
    warmup = _batch_warmup(space, objective, train_size)
    if warmup is not None and all(warmup.stages != other.stages for _, other in out):
        out.append((FITTED_BATCH_WARMUP, warmup))
    order = RECIPES if warmup is not None else UNCAPPED_RECIPES
    out.sort(key=lambda item: order.index(item[0]))
    return out


def lr_variant_names(space: ScheduleSpace) -> tuple[str, ...]:
    """The LR variants a study over ``space`` draws, in the order the search trains them:
    :data:`SGD_LR_VARIANTS` for SGD, else :data:`OTHER_LR_VARIANTS`."""
    return SGD_LR_VARIANTS if space.optimizer == "sgd" else OTHER_LR_VARIANTS


def lr_variants(space: ScheduleSpace, schedule: Schedule) -> list[tuple[str, Schedule]]:
    """The LR bracket around ``schedule`` (the best recipe, once the recipes have trained), in
    :func:`lr_variant_names` order: the LR moved up (for SGD, ``recipe_lr_up``: the first
    stage's multiplier doubled and that of every stage at a larger batch than the first and
    at no lower a multiplier (not one of the recipe's LR cuts) times
    :data:`LATER_LR_FACTOR`; for AdamW and LARS, ``recipe_first_lr_double``: the first
    stage's alone doubled), then every stage's halved; on the space's grid and clipped
    to its range. A variant that comes out equal to the schedule or to an earlier variant (a
    multiplier at the range's end) is left out. Batches, stages, warm-ups and decays stay.
    Not every stage's doubled: it lost on both AdamW tasks where it was measured (module
    docstring), and until the first boundary it trains the same as the up-variant."""
    first = schedule.stages[0]
    sgd = space.optimizer == "sgd"

    def up(i: int, st: Stage) -> float:
        if i == 0:
            return 2.0
        raised = (
            sgd and st.batch_size > first.batch_size and st.lr_multiplier >= first.lr_multiplier
        )
        return LATER_LR_FACTOR if raised else 1.0

    up_name, half_name = lr_variant_names(space)[:2]
    out: list[tuple[str, Schedule]] = []
    for name, factor in ((up_name, up), (half_name, lambda i, st: 0.5)):
        stages = tuple(
            replace(
                st,
                lr_multiplier=lr_multiplier_grid(
                    st.lr_multiplier * factor(i, st), space.lr_mult_min, space.lr_mult_max
                ),
            )
            for i, st in enumerate(schedule.stages)
        )
        if stages != schedule.stages and all(stages != other.stages for _, other in out):
            out.append((name, replace(schedule, stages=stages)))
    return out


def lr_bracket(space: ScheduleSpace, ranked: Sequence[Schedule]) -> list[tuple[str, Schedule]]:
    """The LR bracket around the best :data:`BRACKETED_RECIPES` of ``ranked`` (the recipes
    that trained, best first), in :func:`lr_variant_names` order: the best one's
    :func:`lr_variants`, then the second's under the ``runner_up_`` names. A variant that
    comes out equal to a ranked recipe or to an earlier variant is left out."""
    out: list[tuple[str, Schedule]] = []
    for rank, schedule in enumerate(ranked[:BRACKETED_RECIPES]):
        for name, variant in lr_variants(space, schedule):
            if any(variant.stages == other.stages for other in ranked) or any(
                variant.stages == other.stages for _, other in out
            ):
                continue
            out.append((name if rank == 0 else _RUNNER_UP_NAMES[name], variant))
    return out


def recipe_stages(space: ScheduleSpace, parts: Sequence[tuple[int, int, int]]) -> list[Stage]:
    """Stages over ``parts`` (``(start_epoch, end_epoch, batch)``, contiguous, batches not
    decreasing) with the LR, warm-ups and decay the recipes give theirs, for a schedule whose
    batches come from elsewhere (the noise-scale candidate): the first stage at the recipe's
    scaling rule's LR, a larger batch at the study's rule's LR for SGD and LARS and at the
    square-root rule's from the first stage for AdamW (as ``fitted_batch_warmup``); a warm-up
    of 5 % of the run at the start and wherever the LR rises; the last stage decays (cosine to
    zero where the space has it), the others hold their LR."""
    rule, _ = _rules(space)
    base = space.base_batch_size
    first = parts[0][2]
    lr = lr_scale(rule, first, base)  # in units of the base LR
    later: ScalingRule = "sqrt" if space.optimizer == "adamw" else space.scaling_rule
    flat: StageDecay = "constant" if "constant" in space.decays else space.decays[0]
    stages: list[Stage] = []
    previous = 0.0  # the stage before's peak LR, in units of the base LR
    for i, (start, end, batch) in enumerate(parts):
        mult = _mult(space, batch, lr * lr_scale(later, batch, base) / lr_scale(later, first, base))
        peak = lr_scale(space.scaling_rule, batch, base) * mult
        rises = i == 0 or peak > previous * (1.0 + 1e-9)
        previous = peak
        stages.append(
            Stage(
                start_epoch=start,
                end_epoch=end,
                batch_size=batch,
                lr_multiplier=mult,
                warmup_epochs=_warmup(space, end - start)
                if rises
                else min(space.warmup_min, float(end - start)),
                decay=_decay(space) if i == len(parts) - 1 else flat,
            )
        )
    return stages


def _rules(space: ScheduleSpace) -> tuple[ScalingRule, ScalingRule]:
    """The recipe's scaling rule for the first LR, and the rule under which a larger batch
    stands for a lower LR (the noise it removes): ``(study's, linear)`` for SGD and LARS,
    ``(none, sqrt)`` for AdamW."""
    if space.optimizer == "adamw":
        return "none", "sqrt"
    return space.scaling_rule, "linear"


def _decay(space: ScheduleSpace) -> StageDecay:
    """Cosine to zero where the space has it, else its first decay shape."""
    return "cosine" if "cosine" in space.decays else space.decays[0]


def _mult(space: ScheduleSpace, batch: int, lr: float) -> float:
    """The space's multiplier (on its grid, within its range) for ``lr`` (in units of the
    base LR) at ``batch``."""
    return lr_multiplier_grid(
        multiplier_for(space, batch, lr * space.base_lr), space.lr_mult_min, space.lr_mult_max
    )


def _warmup(space: ScheduleSpace, length: int) -> float:
    wanted = warmup_grid(WARMUP_FRACTION * space.total_epochs, space.warmup_min, space.warmup_max)
    return min(wanted, float(length))


def _constant_sqrt(space: ScheduleSpace, batch: int) -> Schedule | None:
    return _constant(space, batch, "sqrt") if space.optimizer == "adamw" else None


def _constant(space: ScheduleSpace, batch: int, rule: ScalingRule | None = None) -> Schedule | None:
    epochs = space.total_epochs
    rule = rule or _rules(space)[0]
    mult = _mult(space, batch, lr_scale(rule, batch, space.base_batch_size))
    smoothing = space.label_smoothing[0]
    wsd = _stable_then_cooldown(space, 0, batch, mult, stages_before=0)
    if wsd is not None:
        return space.schedule(wsd, label_smoothing=smoothing)
    if space.stages_min > 1:
        return None  # one batch is one stage; a space that wants more stages cannot draw it
    stage = Stage(
        start_epoch=0,
        end_epoch=epochs,
        batch_size=batch,
        lr_multiplier=mult,
        warmup_epochs=_warmup(space, epochs),
        decay=_decay(space),
    )
    return space.schedule([stage], label_smoothing=smoothing)


def _fill_step_cap(
    space: ScheduleSpace, batch: int, fitted: Schedule, objective: object, train_size: int
) -> Schedule:
    """``fitted`` (the increase recipe from ``batch``, within the constraints) with its cuts
    moved later, as far as the objective's step cap allows: of the cut positions at or after
    the skeleton's that meet every constraint, those with the most steps, and of them the
    nearest the skeleton's. Without a step cap, ``fitted`` itself."""
    if getattr(objective, "max_steps", None) is None:
        return fitted
    epochs = space.total_epochs
    starts = [st.start_epoch for st in fitted.stages[1:]]
    best, best_key = fitted, (fitted.total_steps(train_size), 0)
    for cuts in itertools.combinations(range(starts[0], epochs), len(starts)):
        if any(cut < start for cut, start in zip(cuts, starts, strict=True)):
            continue
        bounds = [0, *cuts, epochs]
        schedule = _increase(space, batch, list(itertools.pairwise(bounds)))
        if schedule is None:
            continue
        if any(v > 0 for v in constraint_violations(schedule, objective, train_size).values()):
            continue
        key = (
            schedule.total_steps(train_size),
            -sum(c - s for c, s in zip(cuts, starts, strict=True)),
        )
        if key > best_key:
            best, best_key = schedule, key
    return best


def _increase(
    space: ScheduleSpace, batch: int, parts: list[tuple[int, int]] | None = None
) -> Schedule | None:
    """The increase recipe from ``batch`` over ``parts`` (its stages' epochs; by default the
    skeleton's)."""
    if parts is None:
        parts = skeleton(space.total_epochs)[: space.stages_max]
        if len(parts) < max(2, space.stages_min):
            return None
        # The last part runs to the end of the run (a space with fewer stages than the
        # skeleton).
        parts[-1] = (parts[-1][0], space.total_epochs)
    if any(end - start < space.min_stage_epochs for start, end in parts):
        return None
    flat: StageDecay = "constant" if "constant" in space.decays else space.decays[0]
    rule, equivalence = _rules(space)
    base = space.base_batch_size
    lr = lr_scale(rule, batch, base)  # the first stage's LR, in units of the base LR
    stages: list[Stage] = []
    for i, (start, end) in enumerate(parts):
        size = min(batch * DECAY_FACTOR**i, space.largest_batch)
        # The cuts so far divide the LR by DECAY_FACTOR each; the larger batch stands for
        # part of that (all of it for SGD, uncapped), the LR for the rest.
        grown = lr_scale(equivalence, size, base) / lr_scale(equivalence, batch, base)
        stage_lr = lr * grown / DECAY_FACTOR**i
        last = i == len(parts) - 1
        stages.append(
            Stage(
                start_epoch=start,
                end_epoch=end,
                batch_size=size,
                lr_multiplier=_mult(space, size, stage_lr),
                warmup_epochs=_warmup(space, end - start)
                if i == 0
                else min(space.warmup_min, end - start),
                decay=_decay(space) if last else flat,
            )
        )
    return space.schedule(stages, label_smoothing=space.label_smoothing[0])


def _stable_then_cooldown(
    space: ScheduleSpace, start: int, batch: int, mult: float, stages_before: int
) -> list[Stage] | None:
    """AdamW's warm-up-stable-decay from epoch ``start`` to the end of the run at ``batch``:
    the LR warmed up to and held, then a cooldown to zero over the last
    :data:`COOLDOWN_FRACTION` of the run, as two stages. None for another optimizer, or where
    the space cannot draw them after ``stages_before`` stages."""
    epochs = space.total_epochs
    cooldown = max(1, space.min_stage_epochs, round(COOLDOWN_FRACTION * epochs))
    stable = epochs - cooldown
    if (
        space.optimizer != "adamw"
        or not space.stages_min <= stages_before + 2 <= space.stages_max
        or stable - start < space.min_stage_epochs
        or not {"constant", "cosine"} <= set(space.decays)
    ):
        return None
    return [
        Stage(start, stable, batch, mult, _warmup(space, stable - start), "constant"),
        Stage(stable, epochs, batch, mult, min(space.warmup_min, cooldown), "cosine"),
    ]


def _batch_warmup(
    space: ScheduleSpace, objective: object, train_size: int | None
) -> Schedule | None:
    """The batch warm-up recipe under the objective's step cap (None without one): the
    shortest first stage with which some pair of batches (the first smaller than the second,
    the LR growing at most :data:`MAX_LR_JUMP` times between them) meets every constraint,
    and of those pairs the one with the most optimizer steps (of equal counts, the smaller
    second batch, then the smaller first)."""
    if getattr(objective, "max_steps", None) is None or train_size is None:
        return None
    if space.stages_max < 2:
        return None
    shortest = max(1, space.min_stage_epochs)
    for length in range(shortest, space.total_epochs - shortest + 1):
        fits: list[tuple[int, int, int, Schedule]] = []
        for first in space.batch_sizes:
            for second in (b for b in space.batch_sizes if b > first):
                schedule = _warmup_schedule(space, first, length, second)
                if schedule is None or _lr_jump(schedule) > MAX_LR_JUMP * (1 + 1e-6):
                    continue
                if all(
                    v <= 0 for v in constraint_violations(schedule, objective, train_size).values()
                ):
                    fits.append((-schedule.total_steps(train_size), second, first, schedule))
        if fits:
            return min(fits, key=lambda f: f[:3])[3]
    return None


def _lr_jump(schedule: Schedule) -> float:
    """How many times the first stage's peak LR the second stage's is."""
    return schedule.peak_lr(1) / schedule.peak_lr(0)


def _warmup_schedule(space: ScheduleSpace, first: int, length: int, second: int) -> Schedule | None:
    """``first`` for ``length`` epochs at the recipe's scaling rule's LR, then ``second`` to
    the end: at the study's rule's LR for SGD and LARS (Goyal's, reached by a warm-up), at
    the square-root rule's from the first stage for AdamW, with its cooldown."""
    epochs = space.total_epochs
    rule, _ = _rules(space)
    base = space.base_batch_size
    lr = lr_scale(rule, first, base)  # in units of the base LR
    if space.optimizer == "adamw":
        later = lr * lr_scale("sqrt", second, base) / lr_scale("sqrt", first, base)
    else:
        later = lr_scale(rule, second, base)
    flat: StageDecay = "constant" if "constant" in space.decays else space.decays[0]
    mult = _mult(space, second, later)
    stages = [Stage(0, length, first, _mult(space, first, lr), _warmup(space, length), flat)]
    wsd = _stable_then_cooldown(space, length, second, mult, stages_before=1)
    if wsd is not None:
        stages += wsd
    else:
        rest = epochs - length
        stages.append(Stage(length, epochs, second, mult, _warmup(space, rest), _decay(space)))
    if len(stages) < space.stages_min or any(
        st.end_epoch - st.start_epoch < space.min_stage_epochs for st in stages
    ):
        return None
    return space.schedule(stages, label_smoothing=space.label_smoothing[0])
