"""The environment a test gives a process it starts, without the caller's own settings."""

from __future__ import annotations

import os

#: Kept however a test cleans the environment: the session's cache of generated task data
#: (``tests/conftest.py``), so a process the tests start neither generates mnist1d again nor
#: writes to the user's cache.
KEPT = ("STAGETUNE_CACHE_DIR",)


def environ_without(*prefixes: str) -> dict[str, str]:
    """``os.environ`` less every variable that starts with one of ``prefixes`` (but
    :data:`KEPT`)."""
    return {k: v for k, v in os.environ.items() if k in KEPT or not k.startswith(prefixes)}
