"""ASHA as the engine runs it (``ProtectedASHA``): Tune's asynchronous successive halving,
with baselines (and SGD's LR up-variants) left out of the rungs and no rung stopping a trial
before it holds ``reduction_factor`` results."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from ray.tune.schedulers import TrialScheduler

from tuner.engine import ProtectedASHA
from tuner.engine_search import META_KEY, TrialMeta
from tuner.recipes import RECIPE_LR_HALF, RECIPE_LR_UP, RUNNER_UP_LR_UP, UNJUDGED_VARIANTS

CONTINUE, STOP = str(TrialScheduler.CONTINUE), str(TrialScheduler.STOP)
#: The scheduler reads nothing of Tune's controller here.
NO_CONTROLLER: Any = None


@dataclass
class FakeTrial:
    """What the scheduler reads of a Tune trial: its id and config."""

    trial_id: str
    config: dict[str, Any] = field(default_factory=dict)


def scheduler() -> ProtectedASHA:
    # Rungs at epochs 2 and 6 of a 12-epoch run, as in the efficiency bench.
    return ProtectedASHA(
        time_attr="training_iteration",
        metric="score",
        mode="max",
        max_t=12,
        grace_period=2,
        reduction_factor=3,
        brackets=1,
    )


def report(asha: ProtectedASHA, trial: FakeTrial, epoch: int, score: float | None) -> str:
    return asha.on_trial_result(NO_CONTROLLER, trial, {"training_iteration": epoch, "score": score})


def add(asha: ProtectedASHA, *names: str) -> list[FakeTrial]:
    trials = [FakeTrial(name) for name in names]
    for trial in trials:
        asha.on_trial_add(NO_CONTROLLER, cast(Any, trial))
    return trials


def test_a_rung_stops_no_trial_before_it_holds_reduction_factor_results() -> None:
    """Tune's ASHA alone would stop the second trial at epoch 2 (behind the first, on one
    sample) and the third (under the two's upper third); here both go on, and the fourth,
    behind all three, is the first the rung stops."""
    asha = scheduler()
    a, b, c, d = add(asha, "a", "b", "c", "d")
    assert report(asha, a, 2, 0.9) == CONTINUE
    assert report(asha, b, 2, 0.5) == CONTINUE
    assert report(asha, c, 2, 0.4) == CONTINUE
    assert report(asha, d, 2, 0.3) == STOP
    # The rung keeps every value it saw: a fifth trial above its upper third goes on.
    (e,) = add(asha, "e")
    assert report(asha, e, 2, 0.95) == CONTINUE


def test_each_rung_counts_its_own_results() -> None:
    """Three trials at epoch 2 fill the first rung, not the second: the second trial to
    reach epoch 6, behind the first, goes on; the fourth there, behind three, stops."""
    asha = scheduler()
    trials = add(asha, "a", "b", "c", "d", "e")
    for t, value in zip(trials, (0.5, 0.6, 0.7, 0.8, 0.9), strict=True):
        assert report(asha, t, 2, value) == CONTINUE  # each above the rung's upper third
    a, b, c, d, _ = trials
    assert report(asha, a, 6, 0.99) == CONTINUE
    assert report(asha, b, 6, 0.90) == CONTINUE
    assert report(asha, c, 6, 0.91) == CONTINUE
    assert report(asha, d, 6, 0.80) == STOP


def test_the_run_end_and_empty_scores_are_no_decision() -> None:
    """A result without a value (between cooldown probes) neither counts nor stops; the
    run's last epoch ends the trial as in Tune."""
    asha = scheduler()
    a, b = add(asha, "a", "b")
    assert report(asha, a, 1, None) == CONTINUE
    assert report(asha, a, 2, None) == CONTINUE
    assert report(asha, a, 2, 0.5) == CONTINUE
    assert report(asha, b, 12, 0.1) == STOP  # the end of the run, whatever the rungs hold


def test_baselines_are_neither_stopped_nor_counted() -> None:
    asha = scheduler()
    baselines = [
        FakeTrial(f"b{i}", {META_KEY: TrialMeta(i, "small_batch", {}).to_dict()}) for i in range(3)
    ]
    for trial in baselines:
        asha.on_trial_add(NO_CONTROLLER, cast(Any, trial))
        assert report(asha, trial, 2, 0.99) == CONTINUE
    (a, b) = add(asha, "a", "b")
    assert report(asha, a, 2, 0.9) == CONTINUE
    # Three baselines above it do not fill the rung: one tuned result is no quorum.
    assert report(asha, b, 2, 0.1) == CONTINUE


def test_sgds_lr_up_variants_run_to_the_end_and_other_candidates_do_not() -> None:
    """The best and second-best recipe at a higher LR in their larger-batch stages
    (``recipe_lr_up``, ``runner_up_lr_up``) are behind at the rungs and ahead at the end:
    ASHA neither stops nor counts them. Another LR variant behind a full rung stops."""
    asha = scheduler()
    a, b, c = add(asha, "a", "b", "c")
    for trial, value in ((a, 0.9), (b, 0.8), (c, 0.7)):
        assert report(asha, trial, 2, value) == CONTINUE
    for i, name in enumerate(UNJUDGED_VARIANTS):
        up = FakeTrial(name, {META_KEY: TrialMeta(10 + i, None, {}, candidate=name).to_dict()})
        asha.on_trial_add(NO_CONTROLLER, cast(Any, up))
        assert report(asha, up, 2, 0.1) == CONTINUE
        assert report(asha, up, 6, 0.1) == CONTINUE
    half = FakeTrial(
        RECIPE_LR_HALF, {META_KEY: TrialMeta(12, None, {}, candidate=RECIPE_LR_HALF).to_dict()}
    )
    asha.on_trial_add(NO_CONTROLLER, cast(Any, half))
    assert report(asha, half, 2, 0.1) == STOP
    # The two left out of the rung: its fourth result is the stopped one.
    (d,) = add(asha, "d")
    assert report(asha, d, 2, 0.95) == CONTINUE
    assert set(UNJUDGED_VARIANTS) == {RECIPE_LR_UP, RUNNER_UP_LR_UP}
