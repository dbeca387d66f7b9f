"""The metric-generic parts of ``bench/tuning_efficiency.py`` without training anything: the
best-so-far curve follows the study metric's direction and counts only full runs, the
threshold lies on the metric's worse side of the best known, and a study reaches it when its
best-so-far is at least that good. The runs themselves are covered by ``test_bench_smoke.py``."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def te() -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(
        "bench_tuning_efficiency", BENCH / "tuning_efficiency.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _trial(number: int, epochs: int, value: float | None, compute: float, **kw: Any) -> Any:
    return {
        "number": number,
        "status": kw.get("status", "completed"),
        "feasible": kw.get("feasible", True),
        "epochs_done": epochs,
        "compute_epochs": compute,
        "metric_value": value,
        "val_accuracy": kw.get("val_accuracy"),
        "schedule": {"stages": kw.get("schedule", f"schedule of trial {number}")},
    }


def test_a_loss_study_curve_goes_down_and_counts_full_runs_only(te: ModuleType) -> None:
    loss = te.Metric("val_loss", "min")
    trials = [
        _trial(0, 10, 2.40, 10.0),
        _trial(1, 3, 1.50, 3.6),  # stopped by ASHA at a low mid-run loss: not a schedule found
        _trial(2, 10, 2.10, 10.0),
        _trial(3, 10, 2.30, 10.0),  # worse than the best so far: the curve stays
        _trial(4, 10, float("nan"), 10.0),  # diverged
        _trial(5, 10, 1.95, 12.0, status="error"),
        _trial(6, 10, 1.98, 8.0),  # forked: fewer trial-epochs than its epochs
    ]
    points = te.curve(trials, 10, loss)
    assert [p["best"] for p in points] == [2.40, 2.40, 2.10, 2.10, 2.10, 2.10, 1.98]
    assert [p["trial_epochs"] for p in points] == [10.0, 13.6, 23.6, 33.6, 43.6, 55.6, 63.6]

    studies = [{"best_within_budget": 1.98}, {"best_within_budget": 2.02}]
    assert te.best_value(studies, loss) == 1.98
    threshold = loss.threshold(1.98, 0.05)
    assert threshold == pytest.approx(2.03)
    # 2.10 is not within 0.05 nats of 1.98; 1.98 is, after 63.6 trial-epochs.
    assert te.epochs_to_reach(points, threshold, 100, loss) == 63.6
    assert te.epochs_to_reach(points, threshold, 60, loss) is None  # not within the budget


def test_the_cross_seed_check_retrains_the_run_behind_the_best_within_budget(
    te: ModuleType,
) -> None:
    """The schedule the cross-seed check retrains is the full run that set the study's
    ``best_within_budget``: not a stopped trial, not one that finished after the budget."""
    loss = te.Metric("val_loss", "min")
    trials = [
        _trial(0, 10, 2.40, 10.0),
        _trial(1, 3, 1.50, 3.6),  # stopped early
        _trial(2, 10, 2.10, 10.0),
        _trial(3, 10, 1.90, 10.0),  # best of all, but it finished past 30 trial-epochs
    ]
    study = {"method": "default", "seed": 0, "trials": trials, "curve": te.curve(trials, 10, loss)}

    def retrained(budget: float) -> list[int]:
        return [t["number"] for _, t in te.seed_bests([study], 10, loss, budget)]

    assert retrained(30.0) == [2]
    assert retrained(40.0) == [3]
    assert retrained(5.0) == []


def test_an_accuracy_study_reads_as_it_always_did(te: ModuleType) -> None:
    acc = te.Metric("val_accuracy", "max")
    trials = [
        _trial(0, 12, None, 12.0, val_accuracy=0.97),  # stored before metric_value existed
        _trial(1, 12, 0.985, 12.0),
    ]
    points = te.curve(trials, 12, acc)
    assert [p["best"] for p in points] == [0.97, 0.985]
    assert te.best_value([{"best_within_budget": 0.985}, {"best_within_budget": None}], acc) == (
        0.985
    )
    threshold = acc.threshold(0.985, 0.002)
    assert threshold == pytest.approx(0.983)
    assert te.epochs_to_reach(points, threshold, 144, acc) == 24.0
    assert acc.default_tolerance == 0.002
    assert te.Metric("val_psnr", "max").default_tolerance == 0.2
    assert te.Metric("val_perplexity", "min").default_tolerance is None


def test_the_study_spec_names_the_metric_and_leaves_the_lr_range_to_the_space(
    te: ModuleType,
) -> None:
    spec = te.study_spec(
        "default", "tinylm", 10, 512, 128, 24, 0, 2, 2, 100, "val_loss", None, None
    )
    assert spec.objective_metric() == ("val_loss", "min")
    assert "lr_multiplier" not in spec.space.model_fields_set
    legacy = te.study_spec("random", "digits", 2, 128, None, 3, 0, 1, 1)
    assert legacy.objective_metric() == ("val_accuracy", "max")
    assert legacy.space.lr_multiplier.min == 0.25


#: An mnist1d run's configuration as ``study_config`` records it (what ``--reuse`` compares).
MNIST1D_CONFIG: dict[str, Any] = {
    "task": "mnist1d",
    "task_options": {},
    "epochs": 12,
    "random_trials": 12,
    "tpe_trials": 72,
    "pbt_population": 8,
    "grace": 2,
    "concurrent": 2,
    "max_steps": 374,
    "budget_trial_epochs": 144,
    "random_budget": "trial_epochs",
}


def test_reusing_a_run_with_another_configuration_is_refused(
    te: ModuleType, tmp_path: Path
) -> None:
    import argparse
    import json

    config = dict(MNIST1D_CONFIG)
    study = {"method": "random", "seed": 0, "trials": [], "epochs_to_reach": 36.0}
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"config": config, "studies": [study], "best_known": 0.98}))
    drop = ("max_steps", "budget_trial_epochs", "random_budget")
    args = argparse.Namespace(**{k: v for k, v in config.items() if k not in drop})
    args.reuse, args.methods, args.seeds = old, ["default"], 3
    studies, info = te.reused_studies(args, 374, 144)
    assert [s["method"] for s in studies] == ["random"]
    assert "epochs_to_reach" not in studies[0]  # recomputed against the new best known
    assert info["methods"] == ["random"]  # the methods left out that the file has
    # A file that reused studies says where from; re-scoring it again keeps saying so.
    origin = {"file": "first.json", "methods": ["random"]}
    old.write_text(
        json.dumps({"config": config, "studies": [study], "reused": origin, "best_known": 0.98})
    )
    _, info = te.reused_studies(args, 374, 144)
    assert info["earlier"] == origin
    rescored = {**info, "rescored": True}
    old.write_text(
        json.dumps({"config": config, "studies": [study], "reused": rescored, "best_known": 0.98})
    )
    _, again = te.reused_studies(args, 374, 144)
    assert again["earlier"] == origin
    args.epochs = 30
    with pytest.raises(SystemExit, match=r"differs in epochs \(epochs=12 here 30\)"):
        te.reused_studies(args, 374, 144)


def test_a_variant_run_at_another_grace_period_says_what_its_reused_studies_ran_with(
    te: ModuleType, tmp_path: Path
) -> None:
    """The default search at another ASHA grace period against the other methods as an
    earlier run measured them: allowed, and the results name the grace the reused studies ran
    with; not when that would mix two grace periods within one method, nor from a file that is
    itself such a variant."""
    import argparse
    import json

    config = dict(MNIST1D_CONFIG)
    studies: list[dict[str, Any]] = [
        {"method": m, "seed": 0, "trials": [], "epochs_to_reach": 36.0}
        for m in ("default", "tpe_asha")
    ]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"config": config, "studies": studies, "best_known": 0.98}))
    drop = ("max_steps", "budget_trial_epochs", "random_budget")
    args = argparse.Namespace(**{k: v for k, v in config.items() if k not in drop})
    args.reuse, args.methods, args.seeds, args.grace = old, ["default"], 1, 1
    kept, info = te.reused_studies(args, 374, 144)
    assert [s["method"] for s in kept] == ["tpe_asha"]
    assert info["differs"] == {"grace": 2}
    data = {
        "config": {**config, "grace": 1, "metric": {"name": "val_accuracy", "direction": "max"}},
        "reused": info,
        "studies": kept,
    }
    text = te.reuse_markdown(data, te.Metric("val_accuracy", "max"))
    assert "ran with ASHA grace 2 epochs (random search and PBT do not use it)" in text
    assert "the others with 1" in text
    assert "same configuration" not in text
    # The same grace: nothing to say.
    args.grace = 2
    _, same = te.reused_studies(args, 374, 144)
    assert same["differs"] == {}
    assert "grace" not in te.reuse_markdown(
        {**data, "reused": same}, te.Metric("val_accuracy", "max")
    )
    # More seeds for a method at another grace would mix two grace periods within it.
    args.grace, args.seeds, args.first_seed = 1, 2, 1
    with pytest.raises(SystemExit, match=r"differs in grace"):
        te.reused_studies(args, 374, 144)
    # A variant run is not a source for further runs: its reused studies ran at another grace.
    args.seeds, args.first_seed = 1, 0
    old.write_text(
        json.dumps(
            {
                "config": {**config, "grace": 1},
                "studies": studies,
                "best_known": 0.98,
                "reused": {**info, "file": "first.json"},
            }
        )
    )
    with pytest.raises(SystemExit, match=r"a variant run.*reuse the file they came from, first"):
        te.reused_studies(args, 374, 144)


def test_more_seeds_reuse_the_lower_seeds_of_every_method(te: ModuleType, tmp_path: Path) -> None:
    """``--first-seed`` adds seeds to an earlier run: the methods run now train only the new
    seeds, and their lower seeds come from the file with the other methods' studies."""
    import argparse
    import json

    config = {
        "task": "tinylm",
        "task_options": {},
        "epochs": 10,
        "random_trials": 12,
        "tpe_trials": 72,
        "pbt_population": 8,
        "grace": 2,
        "concurrent": 2,
        "max_steps": 128,
        "budget_trial_epochs": 120,
        "random_budget": "trial_epochs",
    }
    studies: list[dict[str, Any]] = [
        {"method": m, "seed": k, "trials": [], "epochs_to_reach": 1.0}
        for m in ("default", "random")
        for k in (0, 1, 2)
    ]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"config": config, "studies": studies, "best_known": 2.5}))
    drop = ("max_steps", "budget_trial_epochs", "random_budget")
    args = argparse.Namespace(**{k: v for k, v in config.items() if k not in drop})
    args.reuse, args.methods, args.seeds, args.first_seed = old, ["default"], 3, 2
    kept, info = te.reused_studies(args, 128, 120)
    # random (not run now): all three seeds; default (run now): seeds 0 and 1, not seed 2
    assert sorted((s["method"], s["seed"]) for s in kept) == [
        ("default", 0),
        ("default", 1),
        ("random", 0),
        ("random", 1),
        ("random", 2),
    ]
    assert info["seeds"] == [0, 1]
    # a method run now whose lower seeds the file lacks cannot be completed from it
    args.methods, args.first_seed = ["default", "pbt"], 1
    with pytest.raises(SystemExit, match="has no study of pbt seed 0"):
        te.reused_studies(args, 128, 120)


def _study(method: str, seed: int, points: list[tuple[float, float]]) -> dict[str, Any]:
    curve = [{"trial_epochs": e, "best": b} for e, b in points]
    return {"method": method, "seed": seed, "curve": curve, "best_within_budget": points[-1][1]}


def test_each_seed_is_measured_against_its_own_best_schedule(te: ModuleType) -> None:
    """Seed 0 is lucky for every schedule: against the best known over all seeds (1.90) no
    study of seed 1 can come within 0.05 nats, whatever it finds; against its own seed's
    best (2.10) the default gets there after 50 trial-epochs and random search does not."""
    loss = te.Metric("val_loss", "min")
    studies = [
        _study("default", 0, [(10, 2.3), (30, 1.90)]),
        _study("random", 0, [(10, 2.4), (60, 2.00)]),
        _study("default", 1, [(20, 2.4), (50, 2.10)]),
        _study("random", 1, [(20, 2.20), (80, 2.18)]),
    ]
    per_seed = te.per_seed_of(studies, 0.05, 100, loss)
    assert per_seed["best_known"] == {"0": 1.90, "1": 2.10}
    assert per_seed["methods"]["default"]["epochs_to_reach"] == [30.0, 50.0]
    assert per_seed["methods"]["random"]["epochs_to_reach"] == [None, None]
    assert per_seed["methods"]["random"]["epochs_to_reach_mean"] == 100  # the budget
    assert per_seed["ratio_vs_random"] == pytest.approx(0.4)
    assert math.isnan(per_seed["ratio_vs_pbt"])  # not run
    # The global measure: only the lucky seed's default study reaches 1.95.
    global_threshold = loss.threshold(te.best_value(studies, loss), 0.05)
    assert [te.epochs_to_reach(s["curve"], global_threshold, 100, loss) for s in studies] == [
        30.0,
        None,
        None,
        None,
    ]


def test_the_paired_measure_scores_each_study_against_the_best_schedule_on_its_seed(
    te: ModuleType,
) -> None:
    """The best-mean schedule scores 1.95 on seed 0 and 2.25 on seed 1 (seed 1 is unlucky for
    it too): a study of seed 1 reaches it at 2.30, which the global threshold (2.00) and seed
    1's own best (2.10) both refuse; random search on seed 0 stays 0.05 nats short."""
    loss = te.Metric("val_loss", "min")
    studies = [
        _study("default", 0, [(10, 2.3), (30, 1.90)]),
        _study("random", 0, [(10, 2.4), (60, 2.01)]),
        _study("default", 1, [(20, 2.30), (50, 2.10)]),
        _study("random", 1, [(20, 2.40), (80, 2.28)]),
    ]
    cross = {
        "best_mean": {
            "found_on_seed": 0,
            "found_by": "default",
            "trial": 3,
            "summary": "64@0-10",
            "values": {"0": 1.95, "1": 2.25},
        }
    }
    paired = te.paired_of(studies, cross, 0.05, 100, loss)
    assert paired["best_known"] == {"0": 1.95, "1": 2.25}
    assert paired["methods"]["default"]["epochs_to_reach"] == [30.0, 20.0]
    assert paired["methods"]["random"]["epochs_to_reach"] == [None, 80.0]
    assert paired["ratio_vs_random"] == pytest.approx(25 / 90)
    assert paired["schedule"]["summary"] == "64@0-10"
    # no cross-seed check, or a seed the schedule was not retrained on: no paired measure
    assert te.paired_of(studies, None, 0.05, 100, loss) is None
    cross["best_mean"]["values"] = {"0": 1.95, "1": None}
    assert te.paired_of(studies, cross, 0.05, 100, loss) is None


def test_each_seeds_best_schedule_is_taken_from_whichever_search_found_it(
    te: ModuleType,
) -> None:
    loss = te.Metric("val_loss", "min")

    def study(method: str, seed: int, trials: list[Any]) -> dict[str, Any]:
        return {
            "method": method,
            "seed": seed,
            "trials": trials,
            "curve": te.curve(trials, 10, loss),
        }

    studies = [
        study("default", 0, [_trial(0, 10, 2.10, 10.0, schedule="a")]),
        study("random", 0, [_trial(0, 10, 2.00, 10.0, schedule="b")]),
        study(
            "default",
            1,
            [
                _trial(4, 10, 2.20, 10.0, schedule="a"),
                _trial(5, 10, 2.25, 10.0, schedule="a"),  # the same schedule again: one pick
                _trial(6, 10, 2.30, 10.0, schedule="c"),
                _trial(7, 10, 2.40, 10.0, schedule="d"),
            ],
        ),
        study("random", 1, [_trial(0, 3, 1.50, 3.0)]),  # stopped early: not a schedule found
    ]
    picks = te.seed_bests(studies, 10, loss, 100.0)
    assert [(seed, t["_method"], t["number"]) for seed, t in picks] == [
        (0, "random", 0),
        (1, "default", 4),
    ]
    only_default = te.seed_bests(studies, 10, loss, 100.0, method="default")
    assert [(seed, t["_value"]) for seed, t in only_default] == [(0, 2.10), (1, 2.20)]
    # each seed's two best distinct schedules, best first (the cross-seed check's candidates)
    two = te.seed_bests(studies, 10, loss, 100.0, per_seed=2)
    assert [(seed, t["_method"], t["number"]) for seed, t in two] == [
        (0, "random", 0),
        (0, "default", 0),
        (1, "default", 4),
        (1, "default", 6),
    ]
    # schedule "a" is among both seeds' picks: the check trains it once
    assert te.schedule_key(two[1][1]) == te.schedule_key(two[2][1])
