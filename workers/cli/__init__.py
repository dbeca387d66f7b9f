"""The ``stagetune`` command line: the composition root of the product.

Each command group lives in its own module and registers itself on :data:`app` (defined in
:mod:`workers.cli.app`) when imported.
"""

from __future__ import annotations

from workers.cli import client as _client  # noqa: F401  (submit, status)
from workers.cli import export as _export  # noqa: F401  (export, replay)
from workers.cli import local as _local  # noqa: F401  (tune, demo)
from workers.cli import service as _service  # noqa: F401  (serve, worker)
from workers.cli import storage as _storage  # noqa: F401  (storage)
from workers.cli.app import app, main

__all__ = ["app", "main"]
