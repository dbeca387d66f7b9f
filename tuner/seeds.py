"""Seed-robust picks: the study's result is chosen on fresh seeds, not on one lucky run.

On small tasks the seed-to-seed spread of a schedule's final accuracy is as large as the
differences a search ranks, so the best single run is partly the luckiest one. Before a
single-objective study reports its result, its ``finalists`` (the best tuned schedules by
their search run, plus the best baseline) train again, whole, on ``seed_runs`` fresh seeds
(:func:`fresh_seeds`; never the study seed, so the run that selected a finalist does not
count towards its mean and the mean carries no winner's curse). The result is the finalist
with the best mean objective value (:func:`pick`); every finalist is reported as mean ± std
(:class:`SeedStats`).

A seed run that does not complete (diverged, failed, a constraint missed) counts against its
schedule: finalists are ranked first by how many of their seed runs failed, then by mean.

This module is pure: the engine trains the runs and hands their outcomes here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tuner.objectives import StudyObjective, TrialOutcome, rank_key

__all__ = ["SeedStats", "finalists", "fresh_seeds", "pick", "seed_stats", "seed_text"]

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
    """One finalist's seed runs: its objective value and final accuracy per fresh seed."""

    number: int
    baseline: str | None
    seeds: tuple[int, ...]
    values: tuple[float | None, ...]  # the objective's value per seed; None: run not completed
    accuracies: tuple[float | None, ...]
    compute_epochs: float

    @property
    def failed(self) -> int:
        return sum(1 for v in self.values if v is None)

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
            "val_accuracy": list(self.accuracies),
            "val_accuracy_mean": acc_mean,
            "val_accuracy_std": acc_std,
            "failed": self.failed,
            "compute_epochs": round(self.compute_epochs, 3),
        }


def seed_stats(
    finalist: TrialOutcome,
    runs: Mapping[int, TrialOutcome | None],
    seeds: Sequence[int],
) -> SeedStats:
    """A finalist's :class:`SeedStats` from its seed runs' outcomes (by seed; a seed with no
    outcome, or an outcome that is not eligible, counts as a failed run)."""
    values: list[float | None] = []
    accuracies: list[float | None] = []
    compute = 0.0
    for seed in seeds:
        run = runs.get(seed)
        ok = run is not None and run.eligible and run.values
        value = run.values[0] if ok and run is not None and run.values else None
        values.append(value if value is not None and math.isfinite(value) else None)
        accuracies.append(run.val_accuracy if run is not None and ok else None)
        if run is not None:
            compute += float(run.extra.get("compute_epochs") or run.epochs_done or 0)
    return SeedStats(
        number=finalist.number,
        baseline=finalist.baseline,
        seeds=tuple(seeds),
        values=tuple(values),
        accuracies=tuple(accuracies),
        compute_epochs=compute,
    )


def pick(stats: Sequence[SeedStats], objective: StudyObjective) -> SeedStats | None:
    """The finalist the study reports: fewest failed seed runs, then the best mean (ties: the
    lower trial number). ``None`` if no finalist completed a seed run."""
    done = [s for s in stats if s.mean is not None]
    if not done:
        return None
    sign = -1.0 if objective.directions[0] == "maximize" else 1.0
    return min(done, key=lambda s: (s.failed, sign * (s.mean or 0.0), s.number))


def seed_text(stats: Mapping[str, Any] | None) -> str:
    """A finalist's seed runs as the CLI and dashboard print them: ``0.9712 ± 0.0021`` (final
    validation accuracy, mean ± std over the fresh seeds), with the runs that did not
    complete; ``-`` for a trial that was not a finalist."""
    if not stats:
        return "-"
    mean, std = stats.get("val_accuracy_mean"), stats.get("val_accuracy_std")
    n = len(stats.get("seeds") or ())
    failed = int(stats.get("failed") or 0)
    text = "-" if mean is None else f"{mean:.4f} ± {float(std or 0.0):.4f}"
    if failed:
        text += f" ({failed} of {n} runs did not complete)"
    return text
