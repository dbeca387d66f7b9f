"""How durations read wherever stagetune prints them (CLI tables, dashboard, API texts).

One rule: a duration keeps two significant digits below 10 s (``0.043s``, ``0.43s``,
``3.2s``: the trials of small tasks take well under a second, and "0s" says nothing), whole
seconds up to a minute, then the two largest units (``3m 07s``, ``2h 05m``, ``1d 01h``). The
dashboard's ``fmtDuration`` (``api/static/dashboard.js``) follows the same rule; a browser
test checks them against each other.
"""

from __future__ import annotations

import math

__all__ = ["format_bytes", "format_duration"]


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
