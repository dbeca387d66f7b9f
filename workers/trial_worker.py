"""What the Tune trainable needs of the trial loop, without importing it.

The trainable's process (one per Tune trial actor) never trains: the gang's processes do. So it
takes the loop's out-of-memory error from here and hands the gang :func:`trial_worker`, which
imports :mod:`workers.loop` (and with it PyTorch) in the gang's process; the trial states it
passes between the gang, checkpoints and the prefix store stay pickled bytes
(:meth:`workers.gang.Gang.states`). A new trainable process so imports no PyTorch: 1.5-3 s of
CPU less before each Tune experiment's first trial starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuner.errors import StagetuneError

if TYPE_CHECKING:
    from workers.gang import WorkerContext
    from workers.tasks import Task

__all__ = ["TrialOOMError", "trial_worker"]


class TrialOOMError(StagetuneError):
    """A stage does not fit in device memory even with micro-batch 1."""


def trial_worker(context: WorkerContext, tasks: Sequence[Task] = ()) -> Any:
    """A :class:`workers.loop.TrialWorker` (the gang's worker factory, called in its process)."""
    from workers.loop import TrialWorker

    return TrialWorker(context, tasks=tasks)
