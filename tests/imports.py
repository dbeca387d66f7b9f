"""What a fresh Python process imports: for tests that keep a module's imports light."""

from __future__ import annotations

import json
import subprocess
import sys


def imported_after(code: str, *packages: str) -> list[str]:
    """The modules of ``packages`` (top-level names) imported once ``code`` has run in a fresh
    interpreter (this one's, with its environment), sorted."""
    wanted = sorted(packages)
    script = (
        f"{code}\n"
        "import json, sys\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {wanted!r})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr
    modules: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return modules
