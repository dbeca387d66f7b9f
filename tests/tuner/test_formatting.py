"""How the search line and the CLI write a metric's figures (``tuner.formatting``)."""

from __future__ import annotations

import math

from tuner.formatting import format_metric_delta, format_metric_spread


def test_a_spread_is_written_in_the_metrics_own_units() -> None:
    """What one run on the validation split reads, as the search line says it: an accuracy's
    in points like the accuracies beside it (not a bare fraction), a PSNR's in dB, a loss's in
    its own units; unknown when it cannot be told."""
    assert format_metric_spread(0.0010500, "val_accuracy") == "± 0.105 points"
    assert format_metric_spread(0.30421, "val_psnr") == "± 0.304 dB"
    assert format_metric_spread(0.022143, "val_loss") == "± 0.0221"
    assert format_metric_spread(None, "val_loss") == "± ?"
    assert format_metric_spread(math.nan, "val_accuracy") == "± ?"


def test_a_delta_is_signed_in_the_same_units() -> None:
    assert format_metric_delta(0.05, "val_accuracy") == "+0.05 points"
    assert format_metric_delta(-0.12, "val_psnr") == "-0.12 dB"
    assert format_metric_delta(0.0023, "val_loss") == "+0.0023"


def test_one_rule_tells_what_a_metric_is_wherever_it_is_shown() -> None:
    """The CLI's table, the replay's comparison, the search line and the dashboard's columns
    read a metric's kind from its name by one rule, so they cannot disagree."""
    from api.dashboard_data import objective_info
    from tuner.formatting import format_metric, format_objective, in_own_units, metric_kind

    kinds = {
        "val_accuracy": "percent",
        "test_top5_accuracy": "percent",
        "val_psnr": "db",
        "wall_time_s": "duration",
        "steps": "count",
        "val_loss": "number",
        "val_perplexity": "number",
    }
    for name, kind in kinds.items():
        assert metric_kind(name) == kind
        shown = objective_info({}, {"objective": {"metric": name, "metric_direction": "max"}})
        assert shown["metric_format"] == kind
        assert in_own_units(name) == (kind not in ("percent", "db"))
    assert format_objective(0.9712, "val_accuracy") == "97.12%"
    assert format_metric(0.9712, "test_top5_accuracy", percent=True) == "97.12%"
    assert format_metric(27.314, "val_psnr") == "27.31 dB"
    assert format_objective(1234, "steps") == "1,234 steps"
    assert format_metric(0.31234, "val_loss") == "0.3123"
