"""Tasks defined in a user's own Python file, for local runs (``stagetune tune --task-file``).

The file is imported as a module of its own (nothing is installed); every task it defines is
registered in this process (:func:`workers.tasks.register_task`, so a spec of this process may
name it) and returned for the study's trainable, whose worker processes receive the tasks by
value (:func:`trainable_with_tasks`; the module is pickled by value, so workers need not import
the file, and a Ray cluster at ``RAY_ADDRESS`` works too when it has the file's imports).

A file defines its tasks as subclasses of :class:`workers.tasks.BaseTask` (instantiated here
with no arguments) or as module-level instances of one. The service never does this: it runs
registered task names only, and nothing in a request is imported.
"""

from __future__ import annotations

import importlib.util
import inspect
import re
import sys
import traceback
from pathlib import Path
from types import ModuleType

from tuner.errors import ValidationError
from workers.tasks import BUILTIN_TASKS, BaseTask, Task, register_task
from workers.tasks import _entry_points as entry_point_tasks

__all__ = ["load_task_file", "trainable_with_tasks"]

_MODULE_PREFIX = "stagetune_task_file_"


def _module_name(path: Path) -> str:
    return _MODULE_PREFIX + re.sub(r"\W", "_", path.stem)


def _import(path: Path) -> ModuleType:
    name = _module_name(path)
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ValidationError(f"task file {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, pickling by value and tracebacks need it there
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == str(path)]
        where = f" (line {frames[-1].lineno})" if frames else ""
        raise ValidationError(
            f"task file {path} failed to import{where}: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _tasks_in(module: ModuleType, path: Path) -> list[Task]:
    """The module's task instances, then an instance of each task class it defines that has
    none (by task name; two different tasks under one name are an error)."""
    found: dict[str, Task] = {}

    def add(task: Task, what: str) -> None:
        name = getattr(task, "name", None)
        if not isinstance(name, str) or not name:
            raise ValidationError(f"task file {path}: {what} has no `name` (a string)")
        other = found.get(name)
        if other is not None and type(other) is not type(task):
            raise ValidationError(
                f"task file {path} defines two tasks named {name!r} "
                f"({type(other).__qualname__} and {type(task).__qualname__}); rename one"
            )
        found.setdefault(name, task)

    values = list(vars(module).items())
    for attr, value in values:
        if isinstance(value, BaseTask):
            add(value, attr)
    for attr, value in values:
        if (
            inspect.isclass(value)
            and issubclass(value, BaseTask)
            and value.__module__ == module.__name__
            and not inspect.isabstract(value)
            and not any(type(t) is value for t in found.values())
        ):
            try:
                instance = value()
            except Exception as exc:
                raise ValidationError(
                    f"task file {path}: {attr}() failed: {type(exc).__name__}: {exc} (a task "
                    "class must be constructible without arguments; or define an instance)"
                ) from exc
            add(instance, attr)
    abstract = [
        attr
        for attr, value in values
        if inspect.isclass(value)
        and issubclass(value, BaseTask)
        and value.__module__ == module.__name__
        and inspect.isabstract(value)
    ]
    if not found:
        hint = (
            f"; {', '.join(abstract)} is abstract: implement _load(opts, data_seed) and "
            "_build(opts)"
            if abstract
            else ""
        )
        raise ValidationError(
            f"task file {path} defines no task: define a subclass of workers.tasks.BaseTask "
            f"with name, description, default_epochs, default_base_batch_size, "
            f"default_base_lr, options_model, _load and _build (see docs/own-task.md){hint}"
        )
    return list(found.values())


def load_task_file(path: str | Path) -> list[Task]:
    """Import ``path`` and register every task it defines in this process; returns them.

    Raises :class:`~tuner.errors.ValidationError` naming the file and what to fix: not found,
    not a ``.py`` file, an import error (with the file's line), no task, or a task whose name
    is a built-in or installed task's."""
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise ValidationError(f"task file not found: {path}")
    if file.suffix != ".py":
        raise ValidationError(f"task file {path} is not a Python file (.py)")
    module = _import(file)
    tasks = _tasks_in(module, file)
    taken = set(BUILTIN_TASKS) | set(entry_point_tasks())
    for task in tasks:
        if task.name in taken:
            raise ValidationError(
                f"task file {path} defines a task named {task.name!r}, which is a built-in or "
                "installed task; give yours another name"
            )
    try:
        from ray import cloudpickle

        cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    except ImportError:  # pragma: no cover - Ray is a dependency of workers
        pass
    for task in tasks:
        register_task(task, replace=True)  # a file loaded again in this process wins
    return tasks


def trainable_with_tasks(tasks: list[Task] | tuple[Task, ...]) -> type:
    """The study trainable whose workers know ``tasks`` (pickled by value with it)."""
    from workers.trainable import ScheduleTrainable

    return type(
        "ScheduleTrainable",
        (ScheduleTrainable,),
        {"extra_tasks": (*ScheduleTrainable.extra_tasks, *tasks), "__module__": __name__},
    )
