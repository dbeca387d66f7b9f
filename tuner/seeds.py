"""Seed-robust picks: the study's result is chosen on fresh seeds, not on one lucky run.

On small tasks the seed-to-seed spread of a schedule's final metric (validation accuracy,
loss, PSNR: the study's) is as large as the
differences a search ranks, so the best single run is partly the luckiest one. Before a
single-objective study reports its result, its ``finalists`` (the best tuned schedules by
their search run, plus the best baseline) train again, whole, on ``seed_runs`` fresh seeds
(:func:`fresh_seeds`; never the study seed, so the run that selected a finalist does not
count towards its mean and the mean carries no winner's curse). The result is the finalist
with the best mean objective value (:func:`pick`); every finalist is reported as mean ± std
(:class:`SeedStats`).

A seed run that does not complete (diverged, failed, a constraint missed) counts against its
schedule: finalists are ranked first by how many of their seed runs failed, then by mean.

When the pick proves **unstable** (its fresh seeds disagree: the final metric spreads more
than ``UNSTABLE_STD``, relative for a metric larger than 1, or a run did not complete), the
finalists were likely lucky on the study seed and the schedules the search stopped early may
hold a safer one (ASHA stops on early evidence).
Up to ``reserve_finalists`` more tuned schedules then train on the same fresh seeds
(:func:`reserves`): those whose evidence in the search (their last cooldown-probe score, else
their last value of the metric, oriented so that larger is better) beats the pick's mean,
the longest-trained first. The pick is
then made among all of them. Reserves also fill the finalist places a study left empty: when
fewer tuned trials ran to the end than ``finalists`` asks for (ASHA stopped the others), a
stable pick would otherwise be compared with nothing; up to that many reserves (and at most
``reserve_finalists``) train then, on the same rule. And a stable pick sends the **split's
ties** (:func:`split_ties`): trials that ran to the end whose single run is within what one
run on the validation split can read (:func:`tuner.objectives.split_reads`) of the lowest
tuned finalist's. The finalist places went to the best single runs, but between runs that
close a few validation samples decided which; on mnist1d's 8,000-sample split the batch
warm-up recipe's variant once missed them by three samples (99.075 % against 99.10 and
99.11) and the study picked a schedule 0.09 point worse on the test split.

The pick's **lead** over the runner-up (:func:`lead`) is measured on the seeds both trained
on, seed by seed: the fresh seeds are shared, so the per-seed differences carry less noise
than the two means. A lead smaller than twice its standard error is within the seeds' noise:
with 3 seeds that was so in 69 of the 121 picks with a runner-up in the committed quality
benchmark results.

**Ties go to the cheaper schedule** (``budget.tie_break: fewer_steps``, the default): when a
finalist takes at most :data:`CHEAPER` of the best mean's optimizer steps, the best mean's
lead over it is within the seeds' noise (under twice its standard error, and it is not
unstable where the best mean is stable) and no larger than the best mean's own spread over
the seeds (its std), the study picks it, the one with the fewest steps among several: by
what the seeds can tell it is as good, and it trains faster, the reason a user tunes a batch
schedule at all. The spread bound keeps a finalist whose lead is only hidden by a noisy
difference (a tinylm finalist 0.15 nats behind) from being picked. The summary says so,
with the best mean's lead. ``tie_break: mean`` always picks the best mean; a lead within
noise is then reported with what the runner-up would save.

This module is pure: the engine trains the runs and hands their outcomes here.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from tuner.objectives import UNSTABLE_STD, StudyObjective, TrialOutcome, rank_key
from tuner.spec import TieBreak

__all__ = [
    "CHEAPER",
    "Lead",
    "SeedStats",
    "finalists",
    "fresh_seeds",
    "lead",
    "pick",
    "reserves",
    "seed_stats",
    "seed_text",
    "split_ties",
]

#: A finalist is cheaper than another when it takes at most this fraction of its optimizer steps
#: (mean over the seed runs): the saving :func:`pick` trades a lead within noise for.
CHEAPER: Final = 0.95

# Fresh seeds are the study seed plus multiples of this (a prime, so they do not collide with
# the small offsets the trainable derives its per-stream seeds from).
_SEED_STRIDE = 7919


def fresh_seeds(study_seed: int, n: int) -> list[int]:
    """``n`` seeds for the seed runs, all different from ``study_seed``."""
    return [study_seed + _SEED_STRIDE * (i + 1) for i in range(n)]


def finalists(
    outcomes: Sequence[TrialOutcome], objective: StudyObjective, tuned: int
) -> list[TrialOutcome]:
    """The ``tuned`` best eligible tuned trials by their search run, then the best eligible
    baseline (none for a multi-objective study: its result is a front, not one value)."""
    if objective.is_multi:
        return []
    eligible = sorted((o for o in outcomes if o.eligible), key=lambda o: rank_key(o, objective))
    tops = [o for o in eligible if o.baseline is None][:tuned]
    base = [o for o in eligible if o.baseline is not None][:1]
    return tops + base


@dataclass(frozen=True)
class SeedStats:
    """One finalist's seed runs: its objective value and the final value of the study's metric
    (validation accuracy for classification) per fresh seed."""

    number: int
    baseline: str | None
    seeds: tuple[int, ...]
    values: tuple[float | None, ...]  # the objective's value per seed; None: run not completed
    accuracies: tuple[float | None, ...]  # the metric's final value per seed (``metric``)
    compute_epochs: float
    # Means over the completed seed runs (the figures of the whole schedule, also for a reserve
    # the search stopped early); None without a completed run.
    steps: float | None = None
    samples: float | None = None
    wall_time_s: float | None = None
    reserve: bool = False  # trained as a reserve (see reserves)
    metric: str = "val_accuracy"
    # The metric's per-sample standard deviation on the validation split, the mean over the
    # completed seed runs (None: the task does not report it): how finely the split reads it.
    metric_sd: float | None = None

    @property
    def failed(self) -> int:
        return sum(1 for v in self.values if v is None)

    @property
    def unstable(self) -> bool:
        """Its fresh seeds disagree: the metric's final value spreads more than
        :data:`~tuner.objectives.UNSTABLE_STD` (sample std; for a metric larger than 1 in
        size, relative to its mean: 2 % of a loss or of a PSNR)."""
        mean, std = self._mean_std(self.accuracies)
        return std is not None and mean is not None and std > UNSTABLE_STD * max(1.0, abs(mean))

    @property
    def accuracy_mean(self) -> float | None:
        """The mean of the metric's final values (the name is older than study metrics)."""
        return self._mean_std(self.accuracies)[0]

    @staticmethod
    def _mean_std(xs: Sequence[float | None]) -> tuple[float | None, float | None]:
        done = [x for x in xs if x is not None]
        if not done:
            return None, None
        mean = statistics.fmean(done)
        return mean, (statistics.stdev(done) if len(done) > 1 else 0.0)

    @property
    def mean(self) -> float | None:
        return self._mean_std(self.values)[0]

    @property
    def std(self) -> float | None:
        return self._mean_std(self.values)[1]

    def to_dict(self) -> dict[str, Any]:
        acc_mean, acc_std = self._mean_std(self.accuracies)
        return {
            "number": self.number,
            "baseline": self.baseline,
            "seeds": list(self.seeds),
            "values": list(self.values),
            "mean": self.mean,
            "std": self.std,
            "metric": self.metric,
            "metric_values": list(self.accuracies),
            "metric_mean": acc_mean,
            "metric_std": acc_std,
            # The same under the metric's name (e.g. val_accuracy_mean), as stored before
            # studies named their metric.
            self.metric: list(self.accuracies),
            f"{self.metric}_mean": acc_mean,
            f"{self.metric}_std": acc_std,
            "failed": self.failed,
            "compute_epochs": round(self.compute_epochs, 3),
            "steps": self.steps,
            "reserve": self.reserve,
            "metric_sd": self.metric_sd,
        }


def seed_stats(
    finalist: TrialOutcome,
    runs: Mapping[int, TrialOutcome | None],
    seeds: Sequence[int],
    *,
    reserve: bool = False,
    metric: str = "val_accuracy",
) -> SeedStats:
    """A finalist's :class:`SeedStats` from its seed runs' outcomes (by seed; a seed with no
    outcome, or an outcome that is not eligible, counts as a failed run)."""
    values: list[float | None] = []
    accuracies: list[float | None] = []
    done: list[TrialOutcome] = []
    compute = 0.0
    for seed in seeds:
        run = runs.get(seed)
        ok = run is not None and run.eligible and run.values
        value = run.values[0] if ok and run is not None and run.values else None
        values.append(value if value is not None and math.isfinite(value) else None)
        accuracies.append(run.metric_value if run is not None and ok else None)
        if run is not None:
            compute += float(run.extra.get("compute_epochs") or run.epochs_done or 0)
            if ok:
                done.append(run)

    def mean_of(xs: Sequence[float | int | None]) -> float | None:
        known = [float(x) for x in xs if x is not None]
        return statistics.fmean(known) if known else None

    return SeedStats(
        number=finalist.number,
        baseline=finalist.baseline,
        seeds=tuple(seeds),
        values=tuple(values),
        accuracies=tuple(accuracies),
        compute_epochs=compute,
        steps=mean_of([r.steps for r in done]),
        samples=mean_of([r.samples for r in done]),
        wall_time_s=mean_of([r.wall_time_s for r in done]),
        reserve=reserve,
        metric=metric,
        metric_sd=mean_of([_number(r.extra.get("metric_sd")) for r in done]),
    )


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _evidence(outcome: TrialOutcome, objective: StudyObjective) -> float | None:
    """What the search learnt of a trial's schedule, larger is better: its last cooldown-probe
    score (or, at the run's end, its final metric), else its last value of the metric."""
    score = outcome.extra.get("score")
    if isinstance(score, int | float) and not isinstance(score, bool) and math.isfinite(score):
        return float(score)
    return objective.score_of(outcome.metric_value)


def reserves(
    outcomes: Sequence[TrialOutcome],
    objective: StudyObjective,
    stats: Sequence[SeedStats],
    n: int,
    *,
    open_slots: int = 0,
    tie_break: TieBreak = "fewer_steps",
    resolution: float | None = None,
) -> list[TrialOutcome]:
    """Up to ``n`` more tuned trials to train on the fresh seeds when the finalists' pick is
    unstable, or up to ``min(n, open_slots)`` when it is stable but finalist places were left
    empty (fewer tuned trials ran to the end than ``budget.finalists`` asks for: ASHA stopped
    the rest): tuned trials that completed or were stopped early, are not finalists yet, and
    whose evidence (:func:`_evidence`) beats the pick's mean metric; the ones trained longest
    first, then by evidence. A stable pick also sends the :func:`split_ties` (``resolution``:
    how finely one run on the validation split reads the metric), up to ``n`` in all."""
    chosen = pick(stats, objective, tie_break=tie_break)
    if n <= 0 or chosen is None:
        return []
    if chosen.unstable or chosen.failed:
        return _above_the_pick(outcomes, objective, stats, chosen)[:n]
    fill = _above_the_pick(outcomes, objective, stats, chosen)[: min(n, open_slots)]
    ties = [o for o in split_ties(outcomes, objective, stats, resolution) if o not in fill]
    return [*fill, *ties][:n]


def split_ties(
    outcomes: Sequence[TrialOutcome],
    objective: StudyObjective,
    stats: Sequence[SeedStats],
    resolution: float | None,
) -> list[TrialOutcome]:
    """Tuned trials that ran to the end, are not finalists, and whose single run the
    validation split cannot tell from a tuned finalist's: their metric within ``resolution``
    (how finely one run on the split reads it, :func:`tuner.objectives.split_reads`) of the
    lowest tuned finalist's, best first. Which of them the search made a finalist was decided
    by a few validation samples (on mnist1d's 8,000, three samples once kept the best
    schedule out of the two finalist places), so they earn their seed runs too. None for an
    objective other than a metric's final value, or without a resolution."""
    if objective.is_multi or objective.kind != "accuracy" or not resolution or resolution <= 0:
        return []
    numbers = {s.number for s in stats if s.baseline is None and not s.reserve}
    scores = [
        score
        for o in outcomes
        if o.number in numbers and (score := objective.score_of(o.metric_value)) is not None
    ]
    if not scores:
        return []
    floor = min(scores) - resolution
    tried = {s.number for s in stats}
    ties = [
        (score, o)
        for o in outcomes
        if o.baseline is None
        and o.number not in tried
        and o.eligible
        and (score := objective.score_of(o.metric_value)) is not None
        and math.isfinite(score)
        and score >= floor
    ]
    ties.sort(key=lambda pair: (-pair[0], float(pair[1].steps or 0), pair[1].number))
    return [o for _, o in ties]


def _above_the_pick(
    outcomes: Sequence[TrialOutcome],
    objective: StudyObjective,
    stats: Sequence[SeedStats],
    chosen: SeedStats,
) -> list[TrialOutcome]:
    """Tuned trials, not finalists yet, that completed or were stopped early and whose
    evidence beats the pick's mean metric: the longest-trained first, then by evidence."""
    mean = objective.score_of(chosen.accuracy_mean)
    bar = mean if mean is not None else -math.inf
    tried = {s.number for s in stats}
    pool = [
        o
        for o in outcomes
        if o.baseline is None
        and o.number not in tried
        and o.status in ("completed", "stopped")
        and o.feasible
        and (_evidence(o, objective) or -math.inf) > bar
    ]
    pool.sort(key=lambda o: (-o.epochs_done, -(_evidence(o, objective) or 0.0), o.number))
    return pool


def pick(
    stats: Sequence[SeedStats],
    objective: StudyObjective,
    *,
    tie_break: TieBreak = "fewer_steps",
) -> SeedStats | None:
    """The finalist the study reports: fewest failed seed runs, then the best mean (ties: the
    lower trial number). With ``tie_break="fewer_steps"``, a finalist with as many failed runs
    that takes at most :data:`CHEAPER` of that one's steps, that it does not clearly lead
    (:attr:`Lead.clear`, seed by seed) and that it leads by no more than its own spread over
    the seeds (the std of its values) is picked instead, the fewest steps first. ``None`` if no
    finalist completed a seed run."""
    done = [s for s in stats if s.mean is not None]
    if not done:
        return None
    sign = -1.0 if objective.directions[0] == "maximize" else 1.0
    best = min(done, key=lambda s: (s.failed, sign * (s.mean or 0.0), s.number))
    if tie_break != "fewer_steps" or best.steps is None or best.std is None:
        return best
    limit, spread = CHEAPER * best.steps, best.std
    tied = [
        s
        for s in done
        if s is not best
        and s.failed == best.failed
        and s.steps is not None
        and s.steps <= limit
        and (ahead := _paired(best, s, objective)) is not None
        and not ahead.clear
        and ahead.mean <= spread
    ]
    if not tied:
        return best
    return min(tied, key=lambda s: (s.steps or 0.0, sign * (s.mean or 0.0), s.number))


@dataclass(frozen=True)
class Lead:
    """How far the pick is ahead of the runner-up finalist, seed by seed on the fresh seeds
    both completed: ``mean`` and ``std`` of the differences of the objective's value, oriented
    so that a positive lead means the pick is better (in the value's units)."""

    runner_up: int  # the runner-up's trial number
    runner_up_baseline: str | None  # its baseline's name, None for a tuned trial
    mean: float
    std: float
    seeds: int  # the seeds both completed
    pick_steps: float | None = None
    runner_up_steps: float | None = None
    steadier: bool = False  # the runner-up is unstable across the seeds, the pick is not
    # The pick is a cheaper finalist within noise of the runner-up, the best mean (pick's
    # tie_break="fewer_steps"); ``mean`` is then the runner-up's lead, negated.
    for_steps: bool = False

    @property
    def clear(self) -> bool:
        """The pick is clearly ahead: the lead is more than twice its standard error
        (``std / sqrt(seeds)``), or the pick is stable across the seeds and the runner-up is
        not (:attr:`SeedStats.unstable`). Never for a pick made for fewer steps: it is behind
        the runner-up's mean, within noise."""
        if self.for_steps:
            return False
        return self.steadier or self.mean > 2.0 * self.std / math.sqrt(self.seeds)

    def to_dict(self) -> dict[str, Any]:
        return {
            "runner_up": self.runner_up,
            "runner_up_baseline": self.runner_up_baseline,
            "mean": self.mean,
            "std": self.std,
            "seeds": self.seeds,
            "clear": self.clear,
            "steadier": self.steadier,
            "pick_steps": self.pick_steps,
            "runner_up_steps": self.runner_up_steps,
            "for_steps": self.for_steps,
        }


def _paired(chosen: SeedStats, other: SeedStats, objective: StudyObjective) -> Lead | None:
    """``chosen``'s :class:`Lead` over ``other`` on the fresh seeds both completed; ``None``
    with fewer than two."""
    sign = 1.0 if objective.directions[0] == "maximize" else -1.0
    mine = dict(zip(chosen.seeds, chosen.values, strict=True))
    theirs = dict(zip(other.seeds, other.values, strict=True))
    diffs = [
        sign * (a - b)
        for seed, a in mine.items()
        if a is not None and (b := theirs.get(seed)) is not None
    ]
    if len(diffs) < 2:
        return None
    return Lead(
        runner_up=other.number,
        runner_up_baseline=other.baseline,
        mean=statistics.fmean(diffs),
        std=statistics.stdev(diffs),
        seeds=len(diffs),
        pick_steps=chosen.steps,
        runner_up_steps=other.steps,
        steadier=other.unstable and not chosen.unstable,
    )


def lead(
    stats: Sequence[SeedStats],
    objective: StudyObjective,
    *,
    tie_break: TieBreak = "fewer_steps",
) -> Lead | None:
    """The pick's :class:`Lead` over the runner-up: the best mean when :func:`pick` took a
    cheaper finalist within noise of it (``for_steps``; the lead is then negative), else the
    next finalist by mean. ``None`` with fewer than two finalists, when the runner-up failed
    more seed runs than the pick (it is behind on that alone), or when fewer than two seeds
    completed for both."""
    chosen = pick(stats, objective, tie_break=tie_break)
    if chosen is None:
        return None
    best = pick(stats, objective, tie_break="mean")
    if best is not None and best is not chosen:
        ahead = _paired(chosen, best, objective)
        return None if ahead is None else dataclasses.replace(ahead, for_steps=True)
    second = pick([s for s in stats if s is not chosen], objective, tie_break="mean")
    if second is None or second.failed > chosen.failed:
        return None
    return _paired(chosen, second, objective)


def seed_text(stats: Mapping[str, Any] | None) -> str:
    """A finalist's seed runs as the CLI and dashboard print them: ``0.9712 ± 0.0021`` (the
    study metric's final value, validation accuracy for classification, mean ± std over the
    fresh seeds), with the runs that did not complete, and ``(reserve)`` for a reserve; ``-``
    for a trial that was not a finalist."""
    if not stats:
        return "-"
    if "metric_mean" in stats:
        mean, std = stats.get("metric_mean"), stats.get("metric_std")
    else:  # stored before studies named their metric
        mean, std = stats.get("val_accuracy_mean"), stats.get("val_accuracy_std")
    n = len(stats.get("seeds") or ())
    failed = int(stats.get("failed") or 0)
    text = "-" if mean is None else f"{mean:.4f} ± {float(std or 0.0):.4f}"
    if failed:
        text += f" ({failed} of {n} runs did not complete)"
    if stats.get("reserve"):
        text += " (reserve)"
    return text
