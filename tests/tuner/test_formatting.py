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
