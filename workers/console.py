"""Where the command line prints.

On a terminal, rich's own console (its width, colours, live displays). On a pipe or a log
file (CI, ``docker logs``, ``stagetune tune ... | tee run.log``) rich falls back to 80
columns, which cut a trial's progress line in two and the result table's candidate names to
an ellipsis (``fitted…``); there lines are up to :data:`LOG_WIDTH` columns wide (more where
``COLUMNS`` says so) and wrap only past that.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from rich.console import Console

LOG_WIDTH: Final = 160
"""Columns of a console that does not write to a terminal."""


def stdout_console(**options: Any) -> Console:
    """A console on stdout (or ``options["file"]``): rich's defaults on a terminal, at least
    :data:`LOG_WIDTH` columns elsewhere. ``options`` are ``rich.console.Console``'s
    (``quiet``, ``highlight``, ``file``...)."""
    from rich.console import Console

    console = Console(soft_wrap=False, **options)
    if console.is_terminal or "width" in options:
        return console
    return Console(width=max(console.width, LOG_WIDTH), soft_wrap=False, **options)
