"""How durations, sizes and metric values read wherever stagetune prints them (CLI tables,
dashboard, API texts).

What a value is follows from its name, by one rule (:func:`metric_kind`): an accuracy (a
fraction, shown as a percentage; its differences in percentage points), a PSNR (dB), a wall
time (a duration), a step count, or any other number (a loss, in its own units).

A duration keeps two significant digits below 10 s (``0.043s``, ``0.43s``,
``3.2s``: the trials of small tasks take well under a second, and "0s" says nothing), whole
seconds up to a minute, then the two largest units (``3m 07s``, ``2h 05m``, ``1d 01h``). The
dashboard's ``fmtDuration`` (``api/static/dashboard.js``) follows the same rule; a browser
test checks them against each other.
"""

from __future__ import annotations

import math
from typing import Literal

__all__ = [
    "MetricKind",
    "format_bytes",
    "format_duration",
    "format_metric",
    "format_metric_delta",
    "format_metric_spread",
    "format_objective",
    "in_own_units",
    "metric_kind",
    "one_line",
]

MetricKind = Literal["percent", "db", "duration", "count", "number"]


def metric_kind(name: str) -> MetricKind:
    """What a value named ``name`` is: ``percent`` (an accuracy, a fraction), ``db`` (a PSNR),
    ``duration`` (wall time), ``count`` (steps) or ``number`` (anything else: a loss, an error).
    The dashboard's page formats values by the same kinds."""
    if "accuracy" in name:
        return "percent"
    if "psnr" in name:
        return "db"
    if "wall_time" in name:
        return "duration"
    if "steps" in name:
        return "count"
    return "number"


def one_line(text: str, limit: int = 500) -> str:
    """``text`` on one line (every run of whitespace, newlines included, one space), cut to
    ``limit`` characters with an ellipsis: an error or a reason quoted where a line is
    expected (a CLI message, a table cell)."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def in_own_units(metric: str) -> bool:
    """Whether differences of the metric are in its own units (a loss), not percentage points
    (an accuracy) or dB (a PSNR)."""
    return _difference_unit(metric) == ""


def format_duration(seconds: float | None) -> str:
    """``"0.43s"``, ``"3.2s"``, ``"42s"``, ``"3m 07s"``, ``"2h 05m"``; an em dash for unknown."""
    if seconds is None or not math.isfinite(seconds) or seconds < 0:
        return "—"
    if seconds == 0:
        return "0s"
    if seconds < 9.95:
        digits = max(0, 1 - math.floor(math.log10(seconds)))
        return f"{seconds:.{digits}f}s"
    total = round(seconds)
    days, rest = divmod(total, 86_400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours:02d}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def format_bytes(size: float | None) -> str:
    """``"512 B"``, ``"3.4 MB"``, ``"1.2 GB"`` (powers of 1,024, like the spec's
    ``prefix_store_mb``); an em dash for unknown."""
    if size is None or not math.isfinite(size) or size < 0:
        return "—"
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            break
        value /= 1024
    if unit == "B":
        return f"{int(value)} B"
    return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def format_objective(value: float | None, name: str) -> str:
    """An objective value as a person reads it: accuracy as a percentage, a PSNR in dB, steps
    as a count, wall time as a duration, any other metric (a loss) to 4 significant digits."""
    if value is None or not math.isfinite(value):
        return "—"
    kind = metric_kind(name)
    if kind == "percent":
        return f"{value * 100:.2f}%"
    if kind == "db":
        return f"{value:.2f} dB"
    if kind == "duration":
        return format_duration(value)
    if kind == "count":
        return f"{value:,.0f} steps"
    return f"{value:.4g}"


def _is_accuracy(metric: str) -> bool:
    return metric_kind(metric) == "percent"


def format_metric(value: float | None, metric: str, *, percent: bool = False) -> str:
    """A value of a validation metric as the CLI prints it: an accuracy to 4 decimals
    (``0.9712``; with ``percent``, ``97.12%``), a PSNR to 2 decimals in dB (``27.31 dB``), any
    other metric (a loss, an error) to 4 significant digits (``0.3123``); ``-`` for a missing
    or non-finite value."""
    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return "-"
    kind = metric_kind(metric)
    if kind == "percent":
        return f"{100 * value:.2f}%" if percent else f"{value:.4f}"
    if kind == "db":
        return f"{value:.2f} dB"
    return f"{value:.4g}"


def _difference_unit(metric: str) -> str:
    """The unit a difference of a metric's values is written in: percentage points for an
    accuracy, dB for a PSNR, none (the metric's own units) otherwise."""
    kind = metric_kind(metric)
    if kind == "percent":
        return " points"
    return " dB" if kind == "db" else ""


def format_metric_spread(spread: float | None, metric: str) -> str:
    """How finely a figure of a metric reads, unsigned and to 3 significant digits: an
    accuracy's in percentage points (``spread`` a fraction: ``± 0.105 points``), a PSNR's in
    dB (``± 0.304 dB``), any other metric's in its own units (``± 0.0221``); ``± ?`` when
    unknown."""
    if spread is None or not math.isfinite(spread):
        return "± ?"
    value = 100 * spread if _is_accuracy(metric) else spread
    return f"± {value:.3g}{_difference_unit(metric)}"


def format_metric_delta(delta: float | None, metric: str) -> str:
    """A difference of two values of a metric, signed: an accuracy's in percentage points
    (``delta`` already in points: ``+0.05 points``), a PSNR's in dB (``-0.12 dB``), any other
    metric's in its own units to 4 significant digits (``+0.0023``); ``-`` when unknown."""
    if delta is None or not math.isfinite(delta):
        return "-"
    unit = _difference_unit(metric)
    return f"{delta:+.2f}{unit}" if unit else f"{delta:+.4g}"
