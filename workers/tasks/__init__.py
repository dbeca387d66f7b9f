"""Training tasks by name: the registry, and the built-ins (mnist1d, digits, synthetic, cifar10,
tinylm, denoise).

A task bundles data and model (see :class:`workers.tasks.base.Task`)::

    from workers.tasks import get_task, evaluate

    task = get_task("mnist1d")
    data = task.load_data({"num_train_samples": 5000}, seed=0)   # TaskData of CPU tensors
    model = task.build_model({})                                  # (B, 1, 40) -> (B, 10)
    val_loss, val_acc = evaluate(model, data.val_x, data.val_y, batch_size=1024)

Lookup order of :func:`get_task`: tasks registered in this process with :func:`register_task`,
then the entry-point group ``stagetune.tasks``, then the built-ins (which resolve even without
installed package metadata).

Adding a task from another package
----------------------------------
Subclass :class:`BaseTask` (it validates options and caches loaded data), expose an instance,
and register it under the entry-point group ``stagetune.tasks`` in that package's
``pyproject.toml``. Put its options model in a module of its own that imports neither torch
nor NumPy and publish it under ``stagetune.task_options``: the API then validates the options
of a submitted study (unknown options, bounds, the path policy) without loading training
code. A task that publishes no options model is still accepted by name; its options are then
checked by the worker only, when the study starts (a bad option fails the study)::

    # mypkg/options.py: pydantic and tuner only (no torch, no numpy)
    from pydantic import Field
    from tuner.task_paths import DataPath
    from workers.task_options import TaskOptions

    class MyOptions(TaskOptions):
        hidden_dim: int = Field(default=64, ge=8, le=1024)
        data_dir: DataPath = "mydata"   # a path option: the datasets-root policy applies

    # mypkg/tasks.py
    from workers.tasks import BaseTask, TaskData
    from mypkg.options import MyOptions

    class MyTask(BaseTask[MyOptions]):
        name = "mytask"
        description = "What it trains, on what data."
        default_epochs = 20
        default_base_batch_size = 64
        default_base_lr = 0.1
        options_model = MyOptions

        def _load(self, opts: MyOptions, data_seed: int) -> TaskData: ...
        def _build(self, opts: MyOptions) -> torch.nn.Module: ...

    TASK = MyTask()

    # pyproject.toml of mypkg
    [project.entry-points."stagetune.tasks"]
    mytask = "mypkg.tasks:TASK"

    [project.entry-points."stagetune.task_options"]
    mytask = "mypkg.options:MyOptions"

Reinstall the package (``pip install -e .``) so its metadata lists the entry points; the API then
accepts ``"mytask"`` and workers load it by name. A path option declared
:data:`tuner.task_paths.DataPath` reaches ``_load`` as an absolute path inside the datasets
root (``STAGETUNE_DATASETS_DIR``), checked at submission and again by ``load_data``.

In tests and notebooks, ``register_task(MyTask())`` does the same for the current process only:
the name is then valid in a ``StudySpec`` of this process (``tuner.tasks.register_task_name``),
its options checked with the task's own ``options_model``. Worker processes of a study need
the task too (e.g. ``ScheduleTrainable.extra_tasks``).
"""

from __future__ import annotations

import importlib
import logging
import threading
from collections.abc import Callable
from functools import partial
from importlib.metadata import EntryPoint, entry_points

from tuner.errors import ConflictError, NotFoundError, StagetuneError
from tuner.tasks import ENTRY_POINT_GROUP, register_task_name, unregister_task_name
from workers.tasks.base import (
    AnyTaskData,
    BaseTask,
    DatasetData,
    OptimizerDefaults,
    Task,
    TaskData,
    TaskInfo,
    TaskOptions,
    check_model,
    classification_sums,
    clear_data_cache,
    evaluate,
    evaluate_metrics,
    evaluate_sums,
    evaluate_totals,
    load_tensors,
    set_data_cache_size,
    task_info,
)

__all__ = [
    "BUILTIN_TASKS",
    "AnyTaskData",
    "BaseTask",
    "DatasetData",
    "OptimizerDefaults",
    "Task",
    "TaskData",
    "TaskInfo",
    "TaskOptions",
    "check_model",
    "classification_sums",
    "clear_data_cache",
    "evaluate",
    "evaluate_metrics",
    "evaluate_sums",
    "evaluate_totals",
    "get_task",
    "list_tasks",
    "load_tensors",
    "register_task",
    "set_data_cache_size",
    "task_names",
    "unregister_task",
]

log = logging.getLogger(__name__)

#: Built-in tasks, resolvable without package metadata (same targets as in pyproject.toml).
BUILTIN_TASKS: dict[str, str] = {
    "mnist1d": "workers.tasks.mnist1d:TASK",
    "digits": "workers.tasks.digits:TASK",
    "synthetic": "workers.tasks.synthetic:TASK",
    "cifar10": "workers.tasks.cifar10:TASK",
    "tinylm": "workers.tasks.tinylm:TASK",
    "denoise": "workers.tasks.denoise:TASK",
}

_lock = threading.RLock()
_registered: dict[str, Task] = {}  # register_task(), highest priority
_loaded: dict[tuple[str, str], Task] = {}  # (name, target) of imported entry points


def _entry_points() -> dict[str, EntryPoint]:
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def task_names() -> list[str]:
    """Every task name known to this process (registered, entry points, built-ins), sorted."""
    with _lock:
        return sorted(set(_registered) | set(_entry_points()) | set(BUILTIN_TASKS))


def _check_task(obj: object, name: str, source: str) -> Task:
    if isinstance(obj, type):
        obj = obj()
    if not isinstance(obj, Task):
        raise StagetuneError(
            f"task {name!r} from {source} is not a Task (it lacks some of: name, description, "
            "default_epochs, default_base_batch_size, default_base_lr, default_optimizer, "
            "options_model, validate_options, load_data, build_model, augment_batch)"
        )
    if obj.name != name:
        raise StagetuneError(f"task registered as {name!r} ({source}) calls itself {obj.name!r}")
    return obj


def _load_target(target: str) -> object:
    module_name, _, attr = target.partition(":")
    obj: object = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def get_task(name: str) -> Task:
    """The task called ``name``; :class:`NotFoundError` listing the known tasks if none is.

    A task whose code fails to import raises :class:`StagetuneError` saying which entry point.
    """
    with _lock:
        if name in _registered:
            return _registered[name]
        eps = _entry_points()
        if name in eps:
            target = eps[name].value
            source = f"entry point {target!r}"
            load: Callable[[], object] = eps[name].load
        elif name in BUILTIN_TASKS:
            target = BUILTIN_TASKS[name]
            source = f"built-in {target!r}"
            load = partial(_load_target, target)
        else:
            raise NotFoundError(f"unknown task {name!r}; known tasks: {', '.join(task_names())}")
        if (name, target) in _loaded:
            return _loaded[name, target]
        try:
            obj = load()
        except Exception as exc:
            raise StagetuneError(
                f"task {name!r} is registered by {source} but could not be loaded: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        task = _check_task(obj, name, source)
        _loaded[name, target] = task
        return task


def list_tasks() -> list[TaskInfo]:
    """Catalogue entries of every loadable task, sorted by name (tasks that fail to import are
    logged and left out)."""
    infos: list[TaskInfo] = []
    for name in task_names():
        try:
            infos.append(task_info(get_task(name)))
        except StagetuneError as exc:
            log.warning("skipping task %r: %s", name, exc)
    return infos


def register_task(task: Task, *, replace: bool = False) -> Task:
    """Make ``task`` resolvable by its name in this process (tests, notebooks), and its name
    valid in a ``StudySpec`` of this process (options checked with ``task.options_model``).

    Registering a name that is already known (registered, entry point or built-in) raises
    :class:`ConflictError` unless ``replace=True``, in which case ``task`` takes precedence.
    """
    checked = _check_task(task, getattr(task, "name", "?"), "register_task()")
    with _lock:
        if not replace and checked.name in task_names():
            raise ConflictError(
                f"a task named {checked.name!r} is already known; pass replace=True to override"
            )
        _registered[checked.name] = checked
        register_task_name(checked.name, checked.options_model)
    return checked


def unregister_task(name: str) -> None:
    """Undo :func:`register_task` (entry-point and built-in tasks stay available)."""
    with _lock:
        if name not in _registered:
            raise NotFoundError(
                f"no task named {name!r} was registered with register_task(); registered: "
                f"{', '.join(sorted(_registered)) or 'none'}"
            )
        del _registered[name]
        unregister_task_name(name)
