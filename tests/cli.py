"""``stagetune`` as a process a test starts: the interpreter running the tests, so the
command under test is the checkout's, whatever ``PATH`` holds."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

#: The command line of ``stagetune``; append its arguments.
STAGETUNE = [sys.executable, "-c", "from workers.cli import main; main()"]


def run_stagetune(
    *args: str,
    cwd: Path | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``stagetune ARGS`` to its end, its output captured as text; never raises on its exit
    code (the tests assert it)."""
    return subprocess.run(
        [*STAGETUNE, *args],
        cwd=cwd,
        env=None if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
