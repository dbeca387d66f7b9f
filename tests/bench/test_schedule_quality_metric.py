"""The metric-generic parts of ``bench/schedule_quality.py`` without training anything: how a
study metric's test values print, "at least as good" by its direction (dominance, the step
ratio at small-batch quality, targets), the large-batch gap's sign, the summary line of an
accuracy study (its keys as they always were) and of another metric, result names and the
default batch range. The runs themselves are covered by ``test_bench_smoke.py``."""

from __future__ import annotations

import importlib.util
import math
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture(scope="module")
def sq() -> ModuleType:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(
        "bench_schedule_quality", BENCH / "schedule_quality.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(label: str, mean: float, std: float, steps: int) -> dict[str, Any]:
    return {"schedule": label, "metric_mean": mean, "metric_std": std, "steps": steps}


def _loss_rows() -> dict[str, dict[str, Any]]:
    """A language model's front (test loss, lower is better): the large-batch recipes lose
    about 1.2 nats; the tuned schedules sit near the small batch at a fraction of its steps."""
    rows = [
        _row("small_batch", 1.90, 0.03, 640),
        _row("large_linear", 3.15, 0.10, 40),
        _row("large_sqrt", 3.00, 0.05, 40),
        _row("increase_batch", 2.00, 0.02, 400),
        _row("linear_ramp", 2.20, 0.04, 248),
        _row("tuned", 1.92, 0.02, 120),  # within the small batch's 1.90 + 0.03
        _row("tuned@40", 3.04, 0.02, 40),  # beats Goyal's, within sqrt's 3.00 + 0.05
        _row("tuned@248", 2.10, 0.02, 248),
        _row("tuned@640", 1.95, 0.01, 640),  # worse than the small batch's band: 1.93
    ]
    return {r["schedule"]: r for r in rows}


def test_metric_formats_follow_the_metric(sq: ModuleType) -> None:
    acc = sq.Metric("val_accuracy", "max")
    loss = sq.Metric("val_loss", "min")
    psnr = sq.Metric("val_psnr", "max")
    assert (acc.test_key, acc.short, acc.column) == ("test_accuracy", "acc", "test acc %")
    assert (acc.fmt(0.98875), acc.show(0.98875)) == ("98.88", "98.88%")
    assert (loss.test_key, loss.short, loss.column) == ("test_loss", "loss", "test loss")
    assert (loss.fmt(1.912345), loss.show(1.912345)) == ("1.9123", "1.9123")
    assert (psnr.fmt(27.1234), psnr.show(27.1234), psnr.column) == (
        "27.12",
        "27.12 dB",
        "test psnr dB",
    )
    assert loss.fmt(None) == "n/a"


def test_at_least_as_good_follows_the_direction(sq: ModuleType) -> None:
    loss = sq.Metric("val_loss", "min")
    acc = sq.Metric("val_accuracy", "max")
    assert loss.at_least(1.93, 1.90, 0.03)
    assert not loss.at_least(1.94, 1.90, 0.03)
    assert loss.at_least(1.0, 1.90, 0.03)
    assert acc.at_least(0.987, 0.989, 0.002)
    assert not acc.at_least(0.986, 0.989, 0.002)
    # A diverged recipe (infinite mean, NaN std) is matched by anything finite.
    assert loss.at_least(5.0, math.inf, math.nan)
    assert not loss.at_least(math.inf, 1.9, 0.03)
    assert loss.better(1.0, 2.0)
    assert not loss.better(2.0, 1.0)
    assert acc.better(0.9, 0.8)


def test_dominance_and_targets_with_a_loss(sq: ModuleType) -> None:
    loss = sq.Metric("val_loss", "min")
    rows = _loss_rows()
    dom = sq._dominance(rows, loss)
    assert dom["by"] == {
        "small_batch": "tuned",  # tuned@640 is outside the band; tuned (1.92) is in it
        "large_linear": "tuned@40",
        "large_sqrt": "tuned@40",
        "increase_batch": "tuned",  # the best (lowest) of the hits at <= 400 steps
        "linear_ramp": "tuned",
    }
    assert dom["ratio_at_small"] == pytest.approx(640 / 120)
    targets = sq._targets(rows, 5.0, loss)
    assert set(targets) == {
        "every_recipe_dominated",
        "small_loss_at_5x_fewer_steps",
        "within_small_batch_spread",
        "at_least_5x_fewer_steps",
        "above_every_large_batch_baseline",
    }
    assert targets["every_recipe_dominated"]["met"]
    assert targets["every_recipe_dominated"]["dominated"] == 5
    assert targets["small_loss_at_5x_fewer_steps"]["met"]
    assert (
        targets["within_small_batch_spread"]["detail"] == "tuned 1.9200 vs small 1.9000 +/- 0.0300"
    )
    assert targets["above_every_large_batch_baseline"]["met"]

    # The same front read as if higher were better: the worst loss would "win".
    flipped = sq._dominance(rows, sq.Metric("val_loss", "max"))
    assert flipped["by"]["small_batch"] == "tuned@40"
    assert flipped["by"]["large_linear"] is None  # 3.04 < 3.15 - 0.10


def test_large_batch_gap_is_positive_for_a_penalty(sq: ModuleType) -> None:
    rows = _loss_rows()
    assert sq._gap(rows, sq.Metric("val_loss", "min")) == pytest.approx(1.25)
    acc_rows = {
        "small_batch": _row("small_batch", 0.9892, 0.0007, 4680),
        "large_linear": _row("large_linear", 0.9627, 0.0069, 120),
    }
    assert sq._gap(acc_rows, sq.Metric("val_accuracy", "max")) == pytest.approx(2.65)
    psnr_rows = {
        "small_batch": _row("small_batch", 28.0, 0.1, 100),
        "large_linear": _row("large_linear", 26.5, 0.2, 10),
    }
    assert sq._gap(psnr_rows, sq.Metric("val_psnr", "max")) == pytest.approx(1.5)


def test_summary_line_names_its_keys_after_the_metric(sq: ModuleType) -> None:
    loss = sq.Metric("val_loss", "min")
    rows = _loss_rows()
    line = sq.summary_line("tinylm", loss, rows, sq._targets(rows, 5.0, loss))
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    assert line.startswith("quality task=tinylm metric=val_loss ")
    assert list(fields) == [
        "task",
        "metric",
        "dominated",
        "steps_ratio_at_small",
        "tuned",
        "small",
        "small_std",
        "tuned_steps",
        "small_steps",
        "steps_ratio",
        "best_baseline",
        "best_baseline_value",
        "large_batch_gap",
    ]
    assert fields["dominated"] == "5/5"
    assert fields["steps_ratio_at_small"] == "5.33"
    assert (fields["tuned"], fields["small"], fields["small_std"]) == ("1.9200", "1.9000", "0.0300")
    assert (fields["best_baseline"], fields["best_baseline_value"]) == ("increase_batch", "2.0000")
    assert fields["large_batch_gap"] == "1.2500"


def test_summary_line_of_an_accuracy_study_keeps_its_keys(sq: ModuleType) -> None:
    acc = sq.Metric("val_accuracy", "max")
    rows = {
        r["schedule"]: r
        for r in (
            _row("small_batch", 0.98925, 0.00067, 4680),
            _row("large_linear", 0.96270, 0.0069, 120),
            _row("large_sqrt", 0.97880, 0.0027, 120),
            _row("increase_batch", 0.98860, 0.0009, 2685),
            _row("linear_ramp", 0.92310, 0.0405, 1525),
            _row("tuned", 0.98870, 0.0007, 730),
            _row("tuned@120", 0.97860, 0.0021, 120),
        )
    }
    line = sq.summary_line("mnist1d", acc, rows, sq._targets(rows, 5.0, acc))
    assert line == (
        "quality task=mnist1d dominated=5/5 steps_ratio_at_small_acc=6.41 tuned_acc=98.87 "
        "small_acc=98.92 small_std=0.07 tuned_steps=730 small_steps=4680 steps_ratio=6.41 "
        "best_baseline=increase_batch best_baseline_acc=98.86 large_batch_gap=2.65"
    )


def test_result_names_and_default_batch_range(sq: ModuleType) -> None:
    assert sq._stem("mnist1d", True, False, None) == "schedule_quality"
    assert sq._stem("digits", True, True, None) == "schedule_quality_smoke"
    assert sq._stem("tinylm", False, False, None) == "schedule_quality_tinylm"
    assert sq._stem("tinylm", False, True, None) == "schedule_quality_tinylm_smoke"
    assert sq._stem("mnist1d", True, False, "b512") == "schedule_quality_b512"
    assert sq.default_batch_max("mnist1d", 32)[0] == 1024
    assert sq.default_batch_max("tinylm", 32)[0] == 512
    assert sq.default_batch_max("denoise", 64)[0] == 1024


def test_rows_of_a_min_metric_with_a_diverged_run(sq: ModuleType) -> None:
    from common import RunResult, worst_metric_value

    def run(seed: int, loss: float, diverged: bool = False) -> Any:
        return RunResult(
            label="large_linear",
            seed=seed,
            test_accuracy=None,
            val_accuracy=None,
            epochs=10,
            steps=40,
            samples=20480,
            mean_batch_size=512.0,
            train_time_s=1.0,
            samples_per_s=20480.0,
            wall_time_s=1.5,
            diverged=diverged,
            test_metrics={"test_loss": loss},
            val_metrics={"val_loss": None if diverged else loss},
        )

    loss = sq.Metric("val_loss", "min")
    assert worst_metric_value("val_loss", "min") == math.inf
    assert worst_metric_value("val_psnr", "max") == -math.inf
    assert worst_metric_value("val_accuracy", "max") == 0.0
    sq.DESCRIPTIONS.setdefault("large_linear", "")
    row = sq._row("large_linear", [run(1, 3.1), run(2, 3.3)], loss)
    assert row["metric"] == "test_loss"
    assert (row["metric_mean"], row["metric_std"]) == pytest.approx((3.2, math.sqrt(0.02)))
    assert "test_acc_mean" not in row
    assert row["val_metric_mean"] == pytest.approx(3.2)
    bad = sq._row("large_linear", [run(1, 3.1), run(2, math.inf, diverged=True)], loss)
    assert bad["metric_mean"] == math.inf
    assert math.isnan(bad["metric_std"])
    assert bad["diverged_runs"] == 1
    # Any finite tuned schedule at no more steps dominates a recipe that diverged.
    rows = {
        "small_batch": _row("small_batch", 1.9, 0.03, 640),
        "large_linear": bad,
        "tuned@40": _row("tuned@40", 3.0, 0.1, 40),
    }
    assert sq._dominance(rows, loss)["by"]["large_linear"] == "tuned@40"


def test_lr_multiplier_range_is_given_or_left_to_the_space(sq: ModuleType) -> None:
    """mnist1d's runs keep the range they always drew (0.25-4, given explicitly); ``default``
    leaves it to the space, which widens its lower bound to the square-root rule's LR at the
    largest batch (0.25 / sqrt(16) at 16x the base), so an AdamW task can reach the LR it
    needs at a large batch; a malformed range is refused naming the option."""
    import argparse

    import common  # bench/common.py (on the path once the bench module is loaded)

    assert common.parse_lr_multiplier("0.1,8") == (0.1, 8.0)
    assert common.parse_lr_multiplier("default") is None
    for bad in ("2,4", "0.5", "a,b", "0.5,0.9"):
        with pytest.raises(argparse.ArgumentTypeError, match="--lr-multiplier"):
            common.parse_lr_multiplier(bad)
    parser = argparse.ArgumentParser()
    common.add_study_arguments(parser)
    for task, given, expected in (
        ("mnist1d", [], (0.25, 4.0)),
        ("tinylm", [], None),
        ("tinylm", ["--lr-multiplier", "0.1,2"], (0.1, 2.0)),
        ("mnist1d", ["--lr-multiplier", "default"], None),
    ):
        args = parser.parse_args([*given, "--metric", "loss"])
        args.task = task
        common.study_arguments(args)
        assert args.lr_multiplier == expected
        assert args.metric == "val_loss"
        assert args.task_options == {}
    given = sq.study_spec("digits", 4, 512, 100, 4, 0, 1, 1, lr_multiplier=(0.25, 4.0))
    left = sq.study_spec("digits", 4, 512, 100, 4, 0, 1, 1, lr_multiplier=None)
    assert "lr_multiplier" in given.space.model_fields_set
    assert "lr_multiplier" not in left.space.model_fields_set

    from tuner.space import lr_multiplier_range

    assert lr_multiplier_range(given.space.lr_multiplier, "linear", 16) == (0.25, 4.0)
    assert lr_multiplier_range(left.space.lr_multiplier, "linear", 16) == (0.062, 4.0)


def test_the_front_has_a_study_at_each_ratio_asked_for(
    sq: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--ratios 2,3,4`` adds caps at a half, a third and a quarter of the small batch's
    steps to the recipes' own (denoise's: 16, 104, 148 and the small batch's 256), leaving
    out the main study's cap and any cap already there; a ratio that is no saving is refused
    naming the option."""
    import argparse

    recipes = [256, 16, 16, 148, 104]
    assert sq.front_caps(recipes, 256, 51, []) == [16, 104, 148, 256]
    assert sq.front_caps(recipes, 256, 51, sq._ratios("2,3,4")) == [16, 64, 85, 104, 128, 148, 256]
    # a ratio whose cap is the main study's (1/5: 51 steps) or a recipe's adds nothing
    assert sq.front_caps(recipes, 256, 51, [5.0, 256 / 148]) == [16, 104, 148, 256]
    for bad in ("1", "0.5,2", "two"):
        with pytest.raises(argparse.ArgumentTypeError, match="--ratios"):
            sq._ratios(bad)
    # a front of one budget, or none of its own, has no room for them
    for given in (["--budgets", "single"], ["--tuned-yaml", "best.yaml"]):
        with pytest.raises(SystemExit) as refused:
            sq.main(["--ratios", "2", *given])
        assert refused.value.code == 2  # a usage error, before anything trains
        assert "--ratios adds studies to the front: it needs --budgets recipes" in (
            capsys.readouterr().err
        )
