"""Seed-robust picks: which trials are finalists, how their seed runs are summed up, and
which one the study reports."""

from __future__ import annotations

import dataclasses

import pytest

from tuner.objectives import (
    StudyObjective,
    TrialOutcome,
    search_text,
    split_resolution,
    summarize,
)
from tuner.seeds import (
    SeedStats,
    finalists,
    fresh_seeds,
    lead,
    pick,
    reserves,
    seed_stats,
    seed_text,
    split_ties,
)
from tuner.spec import StudySpec


def objective(text: str = "task: digits") -> StudyObjective:
    return StudyObjective.of(StudySpec.from_yaml(text), 4)


def outcome(number: int, acc: float, *, baseline: str | None = None, **kw: object) -> TrialOutcome:
    return TrialOutcome(
        number=number,
        baseline=baseline,
        schedule={},
        status=kw.pop("status", "completed"),  # type: ignore[arg-type]
        epochs_done=4,
        val_accuracy=acc,
        metric_value=acc,
        steps=int(kw.pop("steps", 100)),  # type: ignore[call-overload]
        values=(acc,),
        extra={"compute_epochs": 4.0},
    )


def test_fresh_seeds_never_include_the_study_seed() -> None:
    for seed in (0, 1, 7919, 123456):
        seeds = fresh_seeds(seed, 5)
        assert len(set(seeds)) == 5
        assert seed not in seeds
    assert fresh_seeds(3, 0) == []


def test_finalists_are_the_best_tuned_runs_then_the_best_baseline() -> None:
    obj = objective()
    outcomes = [
        outcome(0, 0.95, baseline="small_batch"),
        outcome(1, 0.97, baseline="large_batch"),
        outcome(3, 0.96),
        outcome(4, 0.99, status="stopped"),  # not eligible: ASHA stopped it
        outcome(5, 0.98),
        outcome(6, 0.96, steps=50),  # ties trial 3 with fewer steps
    ]
    assert [o.number for o in finalists(outcomes, obj, 2)] == [5, 6, 1]
    pareto = objective("task: digits\nobjective: {kind: pareto, cost: steps}")
    assert finalists(outcomes, pareto, 2) == []


def test_the_pick_is_the_best_mean_and_failed_runs_count_against_a_schedule() -> None:
    obj = objective()
    lucky, steady = outcome(5, 0.99), outcome(6, 0.97)
    stats = [
        seed_stats(lucky, {10: outcome(5, 0.90), 11: outcome(5, 0.92)}, [10, 11]),
        seed_stats(steady, {10: outcome(6, 0.96), 11: outcome(6, 0.97)}, [10, 11]),
    ]
    assert stats[0].mean == pytest.approx(0.91)
    assert stats[1].std == pytest.approx(0.00707, abs=1e-4)
    assert pick(stats, obj) is stats[1]
    # A schedule whose run on one seed diverged ranks below one that completed all of them.
    broken = seed_stats(
        outcome(7, 0.99), {10: outcome(7, 0.995), 11: outcome(7, 0.5, status="diverged")}, [10, 11]
    )
    assert broken.failed == 1
    assert broken.values == (0.995, None)
    assert pick([broken, *stats], obj) is stats[1]
    assert seed_text(broken.to_dict()) == "0.9950 ± 0.0000 (1 of 2 runs did not complete)"
    assert seed_text(None) == "-"
    # A time-to-accuracy study minimises its value.
    tta = objective("task: digits\nobjective: {kind: time_to_accuracy, target_accuracy: 0.9}")
    fast = SeedStats(1, None, (1, 2), (100.0, 120.0), (0.9, 0.9), 8.0)
    slow = SeedStats(2, None, (1, 2), (200.0, 90.0), (0.9, 0.9), 8.0)
    assert pick([slow, fast], tta) is fast


def test_the_summary_reports_the_seed_pick_with_its_spread() -> None:
    obj = objective()
    lucky = outcome(1, 0.999, baseline="large_batch")
    steady = outcome(5, 0.97)
    outcomes = [outcome(0, 0.95, baseline="small_batch"), lucky, steady]
    stats = [
        seed_stats(steady, {10: outcome(5, 0.96), 11: outcome(5, 0.98)}, [10, 11]),
        seed_stats(lucky, {10: outcome(1, 0.90), 11: outcome(1, 0.91)}, [10, 11]),
    ]
    summary = summarize(outcomes, obj, seed_runs=stats, seeds=[10, 11])
    assert summary["best"]["number"] == 5
    assert not summary["best_is_baseline"]
    assert summary["best"]["seeds"]["val_accuracy_mean"] == pytest.approx(0.97)
    assert summary["seed_runs"]["search_pick"] == 1
    assert summary["seed_runs"]["picked"] == 5
    assert summary["seed_runs"]["compute_epochs"] == 16.0
    assert summary["note"] == "the result is tuned trial 5 (best mean over 2 fresh seeds)"
    large = next(b for b in summary["baselines"] if b["baseline"] == "large_batch")
    assert large["vs_best"]["accuracy_mean_delta"] == pytest.approx(0.97 - 0.905)
    small = next(b for b in summary["baselines"] if b["baseline"] == "small_batch")
    assert small["seeds"] is None
    # Without seed runs the best single run is the result, as before.
    plain = summarize(outcomes, obj)
    assert plain["best"]["number"] == 1
    assert plain["seed_runs"] is None


def test_an_unstable_pick_is_reported_with_a_warning() -> None:
    """A pick that trains on some fresh seeds and not on others (a lucky search run at a high
    LR) is still the best mean, but the note says it is unstable and what to change."""
    obj = objective()
    risky = outcome(3, 0.984)
    worse = outcome(4, 0.98)
    stats = [
        seed_stats(
            risky,
            {10: outcome(3, 0.987), 11: outcome(3, 0.985), 12: outcome(3, 0.838)},
            [10, 11, 12],
        ),
        seed_stats(
            worse, {10: outcome(4, 0.48), 11: outcome(4, 0.42), 12: outcome(4, 0.40)}, [10, 11, 12]
        ),
    ]
    summary = summarize([risky, worse], obj, seed_runs=stats, seeds=[10, 11, 12])
    assert summary["best"]["number"] == 3
    assert summary["note"] == (
        "the result is tuned trial 3 (best mean over 3 fresh seeds). Warning: the pick is "
        "unstable across seeds (final validation accuracy 0.8380 to 0.9870); raise "
        "budget.finalists, budget.reserve_finalists or budget.seed_runs for a safer pick, or "
        "narrow the space (a lower space.batch_size.max or space.lr_multiplier.max)"
    )


def test_reserves_train_only_when_the_pick_is_unstable() -> None:
    """When the pick's fresh seeds disagree, the schedules the search rated above its mean
    (completed or stopped early, the longest-trained first) are the reserves; a stable pick
    sends none."""
    obj = objective()
    shaky = outcome(3, 0.99)
    stopped_late = _with(outcome(7, 0.97, status="stopped"), epochs_done=3, score=0.978)
    stopped_early = _with(outcome(8, 0.98, status="stopped"), epochs_done=1, score=0.985)
    below = outcome(9, 0.90)  # its search run is under the pick's mean
    failed = _with(outcome(10, 0.99, status="failed"), epochs_done=4)
    base = outcome(11, 0.995, baseline="small_batch")  # baselines are never reserves
    pool = [shaky, stopped_late, stopped_early, below, failed, base]
    unstable = [
        seed_stats(shaky, {10: outcome(3, 0.98), 11: outcome(3, 0.86), 12: outcome(3, 0.97)}, S)
    ]
    assert unstable[0].unstable
    assert [o.number for o in reserves(pool, obj, unstable, 2)] == [7, 8]
    assert [o.number for o in reserves(pool, obj, unstable, 1)] == [7]
    assert reserves(pool, obj, unstable, 0) == []
    stable = [
        seed_stats(shaky, {10: outcome(3, 0.98), 11: outcome(3, 0.97), 12: outcome(3, 0.975)}, S)
    ]
    assert not stable[0].unstable
    assert reserves(pool, obj, stable, 2) == []
    # A seed run that did not complete makes the pick unstable too.
    broken = [seed_stats(shaky, {10: outcome(3, 0.98), 11: outcome(3, 0.97)}, S)]
    assert broken[0].failed == 1
    assert [o.number for o in reserves(pool, obj, broken, 1)] == [7]


def test_reserves_fill_the_finalist_places_a_stable_pick_left_empty() -> None:
    """ASHA let one tuned schedule run to the end, so the stable pick has no tuned rival: the
    stopped schedules rated above its mean fill the empty finalist places (at most
    ``reserve_finalists``); with every place taken, a stable pick sends none."""
    obj = objective()
    only = outcome(3, 0.99)
    stopped_late = _with(outcome(7, 0.97, status="stopped"), epochs_done=3, score=0.978)
    stopped_early = _with(outcome(8, 0.98, status="stopped"), epochs_done=1, score=0.985)
    below = _with(outcome(9, 0.90, status="stopped"), epochs_done=5, score=0.95)
    pool = [only, stopped_late, stopped_early, below]
    stable = [
        seed_stats(only, {10: outcome(3, 0.974), 11: outcome(3, 0.97), 12: outcome(3, 0.972)}, S)
    ]
    assert not stable[0].unstable
    assert not stable[0].failed
    assert reserves(pool, obj, stable, 2) == []  # every finalist place taken
    assert [o.number for o in reserves(pool, obj, stable, 2, open_slots=1)] == [7]
    assert [o.number for o in reserves(pool, obj, stable, 2, open_slots=3)] == [7, 8]
    assert reserves(pool, obj, stable, 0, open_slots=1) == []  # reserve_finalists: 0, never
    # An unstable pick still sends up to reserve_finalists, whatever places are empty (its
    # lower mean, 0.937, lets trial 9's 0.95 in: the longest-trained first).
    unstable = [
        seed_stats(only, {10: outcome(3, 0.98), 11: outcome(3, 0.86), 12: outcome(3, 0.97)}, S)
    ]
    assert [o.number for o in reserves(pool, obj, unstable, 2, open_slots=1)] == [9, 7]


def test_a_stable_pick_sends_the_runs_the_validation_split_cannot_tell_from_a_finalist() -> None:
    """The mnist1d quality benchmark's step-cap study on 8,000 validation samples: two TPE
    draws took the finalist places at 99.11 and 99.10 %, the batch warm-up recipe's variant
    ran 99.075 % (three samples fewer) and the recipe itself 99.025 %. One run there reads
    accuracy to about ± 0.105 point, so those two are as much finalists as the others: they
    train on the fresh seeds too (up to reserve_finalists, best first); a run further off,
    one the search stopped, a baseline and an unknown resolution send none."""
    obj = objective()
    first, second = outcome(14, 0.991125, steps=891), outcome(15, 0.991, steps=747)
    variant, recipe = outcome(9, 0.99075, steps=747), outcome(0, 0.99025, steps=747)
    further = outcome(1, 0.988875, steps=915)
    stopped = _with(outcome(19, 0.99100, status="stopped"), epochs_done=20, score=0.9893)
    base = outcome(30, 0.9911, baseline="small_batch")
    pool = [first, second, variant, recipe, further, stopped, base]

    def runs(o: TrialOutcome, *accs: float) -> dict[int, TrialOutcome]:
        return {s: outcome(o.number, a) for s, a in zip(S, accs, strict=True)}

    stats = [
        seed_stats(first, runs(first, 0.9889, 0.9903, 0.9894), S),
        seed_stats(second, runs(second, 0.9893, 0.9894, 0.9885), S),
        seed_stats(base, runs(base, 0.989, 0.989, 0.989), S),
    ]
    reads = split_resolution(0.991, 8000)
    assert reads == pytest.approx(0.00105, abs=1e-5)
    assert [o.number for o in split_ties(pool, obj, stats, reads)] == [9, 0]
    assert [o.number for o in reserves(pool, obj, stats, 2, resolution=reads)] == [9, 0]
    assert [o.number for o in reserves(pool, obj, stats, 1, resolution=reads)] == [9]
    assert reserves(pool, obj, stats, 0, resolution=reads) == []  # reserve_finalists: 0
    assert reserves(pool, obj, stats, 2) == []  # the split's size unknown: the pick stands
    # A finer split tells the recipe from the finalists: only the variant is left.
    assert [o.number for o in split_ties(pool, obj, stats, 0.0003)] == [9]
    # A loss (minimised): within the resolution above the highest finalist loss.
    loss = objective("task: digits\nobjective: {metric: val_loss}")
    losses = [outcome(1, 2.40), outcome(2, 2.41), outcome(3, 2.43), outcome(4, 2.50)]
    loss_stats = [
        seed_stats(o, runs(o, *[o.metric_value or 0.0] * 3), S, metric="val_loss")
        for o in losses[:2]
    ]
    assert [o.number for o in split_ties(losses, loss, loss_stats, 0.022)] == [3]
    # A time-to-accuracy study ranks on time, not on the split: no ties.
    tta = objective("task: digits\nobjective: {kind: time_to_accuracy, target_accuracy: 0.9}")
    assert split_ties(pool, tta, stats, reads) == []


def test_a_reserve_picked_on_its_seed_runs_reports_the_whole_schedules_figures() -> None:
    """A reserve the search stopped after 1 epoch wins on the fresh seeds: the result row shows
    its seed runs' means (accuracy, steps), not the stopped run's, and the note says what it
    is."""
    obj = objective()
    shaky = outcome(3, 0.99)
    reserve = _with(outcome(8, 0.60, status="stopped", steps=25), epochs_done=1, score=0.985)
    stats = [
        seed_stats(shaky, {10: outcome(3, 0.98), 11: outcome(3, 0.70), 12: outcome(3, 0.97)}, S),
        seed_stats(
            reserve,
            {
                10: outcome(8, 0.975, steps=100),
                11: outcome(8, 0.977, steps=100),
                12: outcome(8, 0.976, steps=100),
            },
            S,
            reserve=True,
        ),
    ]
    summary = summarize([shaky, reserve], obj, seed_runs=stats, seeds=S)
    best = summary["best"]
    assert best["number"] == 8
    assert best["val_accuracy"] == pytest.approx(0.976)
    assert best["steps"] == 100
    assert "trained whole on the fresh seeds as a reserve" in best["stop_reason"]
    assert summary["note"] == (
        "the result is tuned trial 8 (best mean over 3 fresh seeds; stopped early by the "
        "search, then trained whole on those seeds as a reserve)"
    )
    assert summary["seed_runs"]["finalists"][1]["reserve"] is True
    assert seed_text(summary["best"]["seeds"]) == "0.9760 ± 0.0010 (reserve)"


S = [10, 11, 12]


def _with(o: TrialOutcome, *, epochs_done: int, score: float | None = None) -> TrialOutcome:
    return dataclasses.replace(o, epochs_done=epochs_done, extra={**o.extra, "score": score})


def _tie() -> tuple[TrialOutcome, TrialOutcome, list[SeedStats]]:
    """Two finalists the 3 fresh seeds cannot tell apart (the mnist1d quality benchmark's step-cap
    study): trial 12 has the better mean by 0.0003 ± 0.0014, trial 2 takes 747 steps to 915."""
    longer, shorter = outcome(12, 0.988), outcome(2, 0.9875)
    stats = [
        seed_stats(
            shorter,
            {
                10: outcome(2, 0.9875, steps=747),
                11: outcome(2, 0.9875, steps=747),
                12: outcome(2, 0.986, steps=747),
            },
            S,
        ),
        seed_stats(
            longer,
            {
                10: outcome(12, 0.987, steps=915),
                11: outcome(12, 0.987, steps=915),
                12: outcome(12, 0.988, steps=915),
            },
            S,
        ),
    ]
    return longer, shorter, stats


def test_a_tie_within_the_seeds_noise_goes_to_the_schedule_with_fewer_steps() -> None:
    """The finalists share the fresh seeds, so the lead is measured seed by seed. When the best
    mean leads a cheaper finalist by less than twice the lead's standard error and by no more
    than its own spread over the seeds, the study picks the cheaper one (``budget.tie_break:
    fewer_steps``, the default) and says so, with the best mean's lead and what the pick
    saves."""
    obj = objective()
    longer, shorter, stats = _tie()
    assert pick(stats, obj, tie_break="mean") is stats[1]
    assert pick(stats, obj) is stats[0]
    ahead = lead(stats, obj)
    assert ahead is not None
    assert ahead.for_steps
    assert ahead.runner_up == 12
    assert ahead.mean == pytest.approx(-0.000333, abs=1e-6)
    assert ahead.std == pytest.approx(0.001443, abs=1e-6)
    assert not ahead.clear
    summary = summarize([shorter, longer], obj, seed_runs=stats, seeds=S)
    assert summary["best"]["number"] == 2
    assert summary["seed_runs"]["picked"] == 2
    assert summary["seed_runs"]["lead"]["runner_up"] == 12
    assert summary["seed_runs"]["lead"]["for_steps"] is True
    assert search_text({**summary, "compute_epochs": 60.0}).endswith(
        "2 finalists trained again on 3 fresh seeds (24.0 of those trial-epochs); the result is "
        "the fewest steps within the seeds' noise of the best mean"
    )
    assert summary["note"] == (
        "the result is tuned trial 2 (the fewest steps within the seeds' noise of the best mean "
        "over 3 fresh seeds). Picked for fewer optimizer steps within the seeds' noise: tuned "
        "trial 12 has the best mean, ahead by 0.0003 ± 0.0014 validation accuracy over the same "
        "3 fresh seeds, and the pick takes 18% fewer steps (747 against 915); raise "
        "budget.seed_runs to tell them apart, or set budget.tie_break: mean to pick the best mean"
    )
    # A cheaper finalist the best mean clearly leads (the same means on seeds that agree) is
    # behind, whatever it saves: the best mean is the pick and the note is the plain one.
    steady = [
        seed_stats(
            shorter,
            {
                10: outcome(2, 0.9860, steps=747),
                11: outcome(2, 0.9865, steps=747),
                12: outcome(2, 0.9870, steps=747),
            },
            S,
        ),
        seed_stats(
            longer,
            {
                10: outcome(12, 0.9865, steps=915),
                11: outcome(12, 0.9870, steps=915),
                12: outcome(12, 0.9875, steps=915),
            },
            S,
        ),
    ]
    assert pick(steady, obj) is steady[1]
    clear = lead(steady, obj)
    assert clear is not None
    assert clear.clear
    assert not clear.for_steps
    assert clear.mean == pytest.approx(0.0005)
    plain = summarize([shorter, longer], obj, seed_runs=steady, seeds=S)
    assert plain["note"] == "the result is tuned trial 12 (best mean over 3 fresh seeds)"


def test_equal_means_are_called_the_same_mean_not_a_lead_of_minus_zero() -> None:
    """Runs on a small validation split often get the same count of samples right on every
    seed (a digits study: 0.9721, 0.9749, 0.9777 for both finalists): the note says the means
    are the same, not that one is "ahead by -0.0000 ± 0.0000"."""
    obj = objective()
    shorter, longer = outcome(5, 0.975), outcome(0, 0.975, baseline="small_batch")
    values = {10: 0.9721, 11: 0.9749, 12: 0.9777}
    stats = [
        seed_stats(shorter, {s: outcome(5, v, steps=76) for s, v in values.items()}, S),
        seed_stats(
            longer,
            {s: outcome(0, v, steps=132, baseline="small_batch") for s, v in values.items()},
            S,
        ),
    ]
    summary = summarize([shorter, longer], obj, seed_runs=stats, seeds=S)
    assert summary["best"]["number"] == 5
    note = summary["note"]
    assert "-0.0000" not in note
    assert note.endswith(
        "Picked for fewer optimizer steps within the seeds' noise: the small_batch baseline "
        "(trial 0) has the same mean validation accuracy over the same 3 fresh seeds (their "
        "difference ± 0.0000), and the pick takes 42% fewer steps (76 against 132); raise "
        "budget.seed_runs to tell them apart"
    ), note
    by_mean = summarize([shorter, longer], obj, seed_runs=stats, seeds=S, tie_break="mean")
    assert "-0.0000" not in by_mean["note"]
    assert "the same mean validation accuracy over the same 3 fresh seeds" in by_mean["note"]


def test_tie_break_mean_picks_the_best_mean_and_names_the_cheaper_runner_up() -> None:
    """``budget.tie_break: mean`` keeps the best mean; a lead within noise is then reported
    with the steps the runner-up would save. A saving under 5 % is no reason to give up the
    best mean under the default either."""
    obj = objective()
    longer, shorter, stats = _tie()
    ahead = lead(stats, obj, tie_break="mean")
    assert ahead is not None
    assert not ahead.for_steps
    assert not ahead.clear
    assert ahead.runner_up == 2
    assert ahead.mean == pytest.approx(0.000333, abs=1e-6)
    summary = summarize([shorter, longer], obj, seed_runs=stats, seeds=S, tie_break="mean")
    assert summary["best"]["number"] == 12
    assert search_text({**summary, "compute_epochs": 60.0}).endswith("the result is the best mean")
    assert summary["seed_runs"]["lead"]["clear"] is False
    assert summary["note"] == (
        "the result is tuned trial 12 (best mean over 3 fresh seeds). Within the seeds' noise "
        "tuned trial 2 is as good: the pick leads it by 0.0003 ± 0.0014 validation accuracy "
        "over the same 3 fresh seeds, and it takes 18% fewer optimizer steps (747 against "
        "915); raise budget.seed_runs to tell them apart"
    )
    near = [dataclasses.replace(stats[0], steps=880.0), stats[1]]  # 4 % fewer steps
    assert pick(near, obj) is near[1]
    assert not lead(near, obj).for_steps  # type: ignore[union-attr]


def test_the_cheapest_of_several_tied_finalists_is_picked_and_failures_still_come_first() -> None:
    obj = objective()
    _, _, stats = _tie()
    cheapest = dataclasses.replace(stats[0], number=7, steps=500.0)
    assert pick([*stats, cheapest], obj).number == 7  # type: ignore[union-attr]
    # A cheaper finalist with a failed seed run is behind on that alone.
    failed = dataclasses.replace(cheapest, values=(0.9875, None, 0.986))
    assert pick([*stats, failed], obj) is stats[0]
    # So is one whose seeds disagree where the best mean's agree.
    shaky = dataclasses.replace(
        cheapest, values=(0.999, 0.95, 0.999), accuracies=(0.999, 0.95, 0.999)
    )
    assert shaky.unstable
    assert pick([stats[1], shaky], obj) is stats[1]
    # And one whose lead is hidden only by noisy differences: within twice the standard error,
    # but further behind than the best mean's own spread over the seeds.
    best = dataclasses.replace(stats[1], values=(0.990, 0.991, 0.989))
    noisy = dataclasses.replace(cheapest, values=(0.995, 0.975, 0.980))
    behind = lead([best, noisy], obj, tie_break="mean")
    assert behind is not None
    assert not behind.clear
    assert behind.mean > (best.std or 0.0)
    assert pick([best, noisy], obj) is best


def test_a_lead_is_oriented_by_the_metric_and_skips_failed_and_unstable_runners_up() -> None:
    loss = objective("task: digits\nobjective: {kind: accuracy, metric: val_loss}")
    assert loss.metric == "val_loss"
    a = SeedStats(1, None, (10, 11, 12), (2.40, 2.50, 2.45), (2.40, 2.50, 2.45), 8.0, steps=124)
    b = SeedStats(
        2, "large_batch", (10, 11, 12), (2.45, 2.48, 2.47), (2.45, 2.48, 2.47), 8.0, steps=40
    )
    ahead = lead([b, a], loss, tie_break="mean")
    assert ahead is not None
    assert ahead.runner_up == 2  # a leads: its loss is lower on average
    assert ahead.mean == pytest.approx(0.05 / 3)
    summary = summarize(
        [outcome(1, 2.45), outcome(2, 2.47, baseline="large_batch")],
        loss,
        seed_runs=[b, a],
        seeds=S,
        tie_break="mean",
    )
    assert "the large_batch baseline (trial 2) is as good" in summary["note"]
    assert "validation loss" in summary["note"]
    assert "68% fewer optimizer steps (40 against 124)" in summary["note"]
    # Under the default the cheaper baseline, within noise, is the result.
    cheap = summarize(
        [outcome(1, 2.45), outcome(2, 2.47, baseline="large_batch")],
        loss,
        seed_runs=[b, a],
        seeds=S,
    )
    assert cheap["best"]["number"] == 2
    assert cheap["note"].startswith(
        "the result is the large_batch baseline (the fewest steps within the seeds' noise of "
        "the best mean over 3 fresh seeds). Picked for fewer optimizer steps within the "
        "seeds' noise: tuned trial 1 has the best mean, ahead by 0.0167 ± 0.0351 validation "
        "loss over the same 3 fresh seeds, and the pick takes 68% fewer steps (40 against 124)"
    )
    # A runner-up that failed a seed run is behind on that alone: no lead to report.
    failed = SeedStats(2, None, (10, 11, 12), (2.45, None, 2.47), (2.45, None, 2.47), 8.0)
    assert lead([a, failed], loss) is None
    # One finalist, or one seed in common: nothing to measure.
    assert lead([a], loss) is None
    one = SeedStats(2, None, (10, 11, 12), (2.45, None, None), (2.45, None, None), 8.0)
    only = SeedStats(1, None, (10, 11, 12), (2.40, None, None), (2.40, None, None), 8.0)
    assert lead([only, one], loss) is None
    # A runner-up whose seeds disagree (one run far off) is not as good as a steady pick,
    # even where the differences' spread leaves the mean lead within noise.
    steady = SeedStats(1, None, (10, 11, 12), (2.44, 2.46, 2.45), (2.44, 2.46, 2.45), 8.0)
    shaky = SeedStats(3, None, (10, 11, 12), (2.30, 3.40, 2.35), (2.30, 3.40, 2.35), 8.0)
    behind = lead([shaky, steady], loss)
    assert behind is not None
    assert behind.runner_up == 3
    assert behind.mean < 2 * behind.std / 3**0.5  # within noise on the mean alone
    assert behind.steadier
    assert behind.clear


def test_a_lead_finer_than_the_validation_split_reads_is_reported_with_what_to_change() -> None:
    """Seeds average the training noise, not the validation split's: every run is scored on
    the same samples. When the pick leads its runner-up by less than one run on the split can
    read (binomial), the note says so and names the fix; a split large enough stays silent."""
    obj = objective()
    longer, shorter, stats = _tie()  # finalists 0.0003 apart at about 0.987 validation accuracy
    assert split_resolution(0.989, 2000) == pytest.approx(0.00233, abs=1e-5)
    assert split_resolution(0.989, 8000) == pytest.approx(0.00117, abs=1e-5)
    with pytest.raises(ValueError, match="at least 1 sample"):
        split_resolution(0.9, 0)
    small = summarize(
        [shorter, longer],
        obj,
        seed_runs=stats,
        seeds=S,
        val_size=2000,
        val_size_option="num_val_samples",
    )
    expected = (
        "The validation split holds 2,000 samples: one run there reads accuracy to about "
        "± 0.0025 at 0.9870 (binomial), more than the pick's difference from tuned trial 12 "
        "(0.0003 over the fresh seeds); more seeds do not shrink that"
    )
    assert expected in small["note"]
    assert "a larger validation split does (the task option num_val_samples)" in small["note"]
    assert small["seed_runs"]["lead"]["split_note"].startswith("The validation split holds 2,000")
    assert small["seed_runs"]["val_size"] == 2000
    # A split that reads finer than the lead, an unknown split, a loss study: no sentence.
    huge = summarize([shorter, longer], obj, seed_runs=stats, seeds=S, val_size=10_000_000)
    assert "validation split" not in huge["note"]
    assert huge["seed_runs"]["lead"]["split_note"] is None
    assert (
        "validation split"
        not in summarize([shorter, longer], obj, seed_runs=stats, seeds=S)["note"]
    )
    loss = objective("task: digits\nobjective: {kind: accuracy, metric: val_loss}")
    assert (
        "validation split"
        not in summarize([shorter, longer], loss, seed_runs=stats, seeds=S, val_size=2000)["note"]
    )


def _loss_finalists(sd: float | None) -> tuple[list[TrialOutcome], list[SeedStats]]:
    """Two finalists of a loss study 0.0007 nats apart over the fresh seeds, whose runs report
    the loss's per-sample spread on the validation split (``metric_sd``; ``None``: not)."""

    def run(number: int, loss: float) -> TrialOutcome:
        o = dataclasses.replace(outcome(number, loss), val_accuracy=None)
        return dataclasses.replace(o, extra={**o.extra, "metric_sd": sd})

    a, b = run(1, 2.450), run(2, 2.451)
    stats = [
        seed_stats(a, {10: run(1, 2.450), 11: run(1, 2.460), 12: run(1, 2.440)}, S),
        seed_stats(b, {10: run(2, 2.451), 11: run(2, 2.461), 12: run(2, 2.440)}, S),
    ]
    return [a, b], stats


def test_a_loss_study_says_when_its_lead_is_finer_than_the_split_reads_the_loss() -> None:
    """A metric other than accuracy has no binomial reading: the split reads it to its
    per-sample spread over the square root of the split's size, where the task reports the
    spread (a language model's per-sequence loss, a PSNR's per-patch)."""
    loss = objective("task: digits\nobjective: {kind: accuracy, metric: val_loss}")
    outcomes, stats = _loss_finalists(0.5)
    assert [s.metric_sd for s in stats] == [0.5, 0.5]
    assert stats[0].to_dict()["metric_sd"] == 0.5
    small = summarize(outcomes, loss, seed_runs=stats, seeds=S, val_size=64)
    assert (
        "The validation split holds 64 samples: one run there reads validation loss to about "
        "± 0.0625 at 2.4500 (its per-sample spread, 0.5000, over the square root of the "
        "samples), more than the pick's difference from tuned trial 2 (0.0007 over the fresh "
        "seeds)"
    ) in small["note"]
    assert small["seed_runs"]["lead"]["split_note"].startswith("The validation split holds 64")
    assert small["note"].endswith(
        "a larger validation split would, and this task's is fixed: take the finalists as "
        "equally good"
    )
    # A split that reads finer than the lead, or runs that report no spread: silent.
    large = summarize(outcomes, loss, seed_runs=stats, seeds=S, val_size=10_000_000)
    assert large["seed_runs"]["lead"]["split_note"] is None
    outcomes, unknown = _loss_finalists(None)
    assert unknown[0].metric_sd is None
    quiet = summarize(outcomes, loss, seed_runs=unknown, seeds=S, val_size=64)
    assert quiet["seed_runs"]["lead"]["split_note"] is None


def test_a_reported_spread_reads_accuracy_too_where_the_binomial_would_be_wrong() -> None:
    """A language model's next-byte accuracy is a mean over each sequence's bytes: its spread
    over sequences is not the binomial's. Runs that report the spread are read with it."""
    obj = objective()
    longer, shorter, stats = _tie()
    spread = [dataclasses.replace(s, metric_sd=0.05) for s in stats]
    note = summarize([shorter, longer], obj, seed_runs=spread, seeds=S, val_size=2000)["note"]
    assert (
        "one run there reads validation accuracy to about ± 0.0011 at 0.9870 (its per-sample "
        "spread, 0.0500, over the square root of the samples)"
    ) in note
    assert "binomial" not in note
