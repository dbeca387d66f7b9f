"""The catalogue of training tasks, by name.

Tasks register under the entry-point group ``stagetune.tasks``. Listing them reads package
metadata only: nothing is imported, so the API can validate task names without loading
training code. Loading a task happens in :mod:`workers.tasks`.
"""

from __future__ import annotations

from importlib.metadata import entry_points

from tuner.errors import ValidationError

ENTRY_POINT_GROUP = "stagetune.tasks"


def available_tasks() -> list[str]:
    """Names of every registered task, sorted."""
    return sorted({ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)})


def check_task_name(name: str) -> str:
    """Return ``name`` if a task of that name is registered, else raise a ``ValidationError``."""
    known = available_tasks()
    if name not in known:
        raise ValidationError(f"unknown task {name!r}; registered tasks: {', '.join(known)}")
    return name
