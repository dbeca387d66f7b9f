"""The catalogue of training tasks, by name, and the validation of their options.

Tasks register under the entry-point group ``stagetune.tasks``. Listing them reads package
metadata only: nothing is imported, so the API can validate task names without loading
training code. Loading a task happens in :mod:`workers.tasks`.

A task's options model (a pydantic model, ``extra="forbid"``) is published under the second
entry-point group ``stagetune.task_options``, in a module that imports neither torch nor
NumPy (the built-ins: :mod:`workers.task_options`). :func:`validate_task_options` loads it
from there, so the API and the CLI check options at submission, the path policy of
:mod:`tuner.task_paths` included, without importing training code. A task that publishes no
options model has its options checked by the worker only, when the study starts.

Tasks added in a process with ``workers.tasks.register_task`` are announced here through
:func:`register_task_name` (with their options model), so a ``StudySpec`` of that process
accepts them too.
"""

from __future__ import annotations

import re
import threading
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any, Final, Literal

import pydantic
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from tuner.errors import NotFoundError, StagetuneError, ValidationError
from tuner.task_paths import check_data_path, path_fields

__all__ = [
    "CLASSIFICATION_METRICS",
    "ENTRY_POINT_GROUP",
    "OPTIONS_ENTRY_POINT_GROUP",
    "MetricDirection",
    "OptionProblem",
    "available_tasks",
    "check_task_name",
    "describe_field",
    "metric_declaration",
    "option_problems",
    "options_model",
    "register_task_name",
    "resolve_metric",
    "task_metrics",
    "task_option_problems",
    "unregister_task_name",
    "validate_task_options",
]

ENTRY_POINT_GROUP: Final = "stagetune.tasks"
MetricDirection = Literal["max", "min"]
#: A task's metrics when it declares none: classification's (accuracy and cross-entropy).
CLASSIFICATION_METRICS: Final[Mapping[str, MetricDirection]] = {
    "val_accuracy": "max",
    "val_loss": "min",
}
_METRIC_NAME: Final = re.compile(r"^val_[a-z][a-z0-9_]{0,39}$")
OPTIONS_ENTRY_POINT_GROUP: Final = "stagetune.task_options"

_lock = threading.RLock()
#: Tasks announced by ``workers.tasks.register_task`` in this process: name -> options model.
_in_process: dict[str, type[BaseModel] | None] = {}
#: Options models loaded from entry points, by (name, target).
_loaded_models: dict[tuple[str, str], type[BaseModel]] = {}


def available_tasks() -> list[str]:
    """Names of every registered task (entry points and in-process registrations), sorted."""
    names = {ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)}
    with _lock:
        names.update(_in_process)
    return sorted(names)


def check_task_name(name: str) -> str:
    """Return ``name`` if a task of that name is registered, else raise a ``ValidationError``."""
    known = available_tasks()
    if name not in known:
        raise ValidationError(f"unknown task {name!r}; registered tasks: {', '.join(known)}")
    return name


def register_task_name(name: str, options: type[BaseModel] | None = None) -> None:
    """Make ``name`` a valid task name in this process, its options checked with ``options``
    (``None``: by the worker only). Called by ``workers.tasks.register_task``."""
    with _lock:
        _in_process[name] = options


def unregister_task_name(name: str) -> None:
    """Undo :func:`register_task_name` (entry-point tasks stay available)."""
    with _lock:
        _in_process.pop(name, None)


def _options_entry_point(name: str) -> EntryPoint | None:
    for ep in entry_points(group=OPTIONS_ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep
    return None


def options_model(task: str) -> type[BaseModel] | None:
    """The options model of ``task``: an in-process registration's, else the one published
    under ``stagetune.task_options``; ``None`` when the task publishes none.

    Raises :class:`NotFoundError` for an unknown task and :class:`StagetuneError` when the
    published model cannot be imported or is not a pydantic model (an installation problem).
    """
    with _lock:
        if task in _in_process:
            return _in_process[task]
    ep = _options_entry_point(task)
    if ep is None:
        if task not in available_tasks():
            raise NotFoundError(f"unknown task {task!r}")
        return None
    key = (task, ep.value)
    with _lock:
        if key in _loaded_models:
            return _loaded_models[key]
    try:
        model = ep.load()
    except Exception as exc:
        raise StagetuneError(
            f"the options model of task {task!r} ({OPTIONS_ENTRY_POINT_GROUP} entry point "
            f"{ep.value!r}) could not be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        raise StagetuneError(
            f"the {OPTIONS_ENTRY_POINT_GROUP} entry point {ep.value!r} of task {task!r} is not "
            "a pydantic model class"
        )
    with _lock:
        _loaded_models[key] = model
    return model


# --------------------------------------------------------------------------------------------
# metrics


def metric_declaration(
    task: str, model: type[BaseModel] | None
) -> tuple[dict[str, MetricDirection], str]:
    """The validation metrics a task declares on its options model (``metrics``: ``val_<name>``
    -> ``"max"`` / ``"min"``; ``primary_metric``) and its primary one; classification's
    (``val_accuracy`` max, ``val_loss`` min) when it declares none.

    Raises :class:`StagetuneError` naming what is wrong with a declaration (a task's bug, not
    the user's input): ``val_loss`` is required (the loop detects divergence with it)."""
    declared = getattr(model, "metrics", None) if model is not None else None
    primary = getattr(model, "primary_metric", None) if model is not None else None
    if declared is None:
        return dict(CLASSIFICATION_METRICS), "val_accuracy"
    where = f"task {task!r} declares metrics {dict(declared)!r}"
    if not isinstance(declared, Mapping) or not declared:
        raise StagetuneError(f"{where}: expected a non-empty mapping of names to 'max' / 'min'")
    metrics: dict[str, MetricDirection] = {}
    for name, direction in declared.items():
        if not isinstance(name, str) or not _METRIC_NAME.match(name):
            raise StagetuneError(
                f"{where}: metric {name!r} must be named val_<name> (lower case, digits, _)"
            )
        if direction not in ("max", "min"):
            raise StagetuneError(f"{where}: {name!r} has direction {direction!r}; use max or min")
        metrics[name] = direction
    if "val_loss" not in metrics:
        raise StagetuneError(f"{where}: val_loss (min) must be one of them")
    primary = primary if primary is not None else "val_loss"
    if primary not in metrics:
        raise StagetuneError(f"{where}: its primary_metric {primary!r} is not one of them")
    return metrics, primary


def resolve_metric(
    task: str, metric: str | None, *, target_accuracy: float | None = None
) -> tuple[str, MetricDirection]:
    """A study's metric and its direction, the one rule: ``metric`` (``objective.metric``),
    else validation accuracy when the objective has a ``target_accuracy``, else the task's
    primary metric. :class:`ValidationError` naming the declared metrics when the task does
    not declare it; :class:`StagetuneError` when its declaration is broken."""
    declared, primary = task_metrics(task)
    name = metric
    if name is None and target_accuracy is not None:
        name = "val_accuracy"
    name = name or primary
    if name not in declared:
        listed = ", ".join(f"{m} ({d})" for m, d in declared.items())
        raise ValidationError(
            f"objective.metric {name!r} is not a metric of task {task!r}; it reports {listed}"
        )
    return name, declared[name]


def task_metrics(task: str) -> tuple[dict[str, MetricDirection], str]:
    """:func:`metric_declaration` of a registered task (without importing its training code);
    :class:`NotFoundError` for an unknown task."""
    return metric_declaration(task, options_model(task))


# --------------------------------------------------------------------------------------------
# messages a user can act on


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(annotation))
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        names = " or ".join(_type_name(a) for a in args)
        if len(args) < len(typing.get_args(annotation)):
            names += " or null"
        return names
    simple: dict[Any, str] = {int: "an integer", float: "a number", bool: "true/false"}
    simple[str] = "a string"
    return simple.get(annotation) or str(getattr(annotation, "__name__", annotation))


def describe_field(info: FieldInfo) -> str:
    """``"an integer >= 100 and <= 100000, a multiple of 10 (default 5000)"``."""
    ranges: list[str] = []
    extras: list[str] = []
    for meta in info.metadata:
        for attr, symbol in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<")):
            value = getattr(meta, attr, None)
            if value is not None:
                ranges.append(f"{symbol} {value}")
        multiple = getattr(meta, "multiple_of", None)
        if multiple is not None:
            extras.append(f"a multiple of {multiple}")
        min_length = getattr(meta, "min_length", None)
        if min_length:
            extras.append(f"of length >= {min_length}")
    text = _type_name(info.annotation)
    if ranges:
        text += " " + " and ".join(ranges)
    if extras:
        text += ", " + ", ".join(extras)
    if info.is_required():
        return text + " (required)"
    default = info.get_default(call_default_factory=True)
    return text + f" (default {'null' if default is None else repr(default)})"


@dataclass(frozen=True)
class OptionProblem:
    """One problem with a task's options: where (``("data_dir",)``; empty for the whole
    mapping) and what, in words a user can act on."""

    loc: tuple[str | int, ...]
    message: str
    value: Any = None

    @property
    def option(self) -> str:
        return ".".join(str(part) for part in self.loc)


def option_problems(
    model: type[BaseModel], options: Mapping[str, Any], task: str | None = None
) -> tuple[BaseModel | None, list[OptionProblem]]:
    """Validate ``options`` against ``model``: ``(the model instance, [])`` or
    ``(None, problems)``, each problem naming the option and what it allows."""
    try:
        return model.model_validate(dict(options)), []
    except pydantic.ValidationError as exc:
        allowed = ", ".join(model.model_fields)
        whose = f" of task {task!r}" if task else ""
        problems: list[OptionProblem] = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            top = str(loc[0]) if loc else ""
            if err["type"] == "extra_forbidden":
                message = f"unknown option{whose} (allowed options: {allowed})"
            elif err["type"] == "missing" and top in model.model_fields:
                info = model.model_fields[top]
                what = f"{info.description.rstrip('.')}; " if info.description else ""
                allowed_here = describe_field(info).removesuffix(" (required)")
                message = f"is required ({what}{allowed_here})"
            elif top in model.model_fields:
                msg = str(err["msg"]).removeprefix("Value error, ")
                message = (
                    f"{err.get('input')!r} is invalid ({msg}); "
                    f"allowed: {describe_field(model.model_fields[top])}"
                )
            else:
                message = str(err["msg"]).removeprefix("Value error, ")
            problems.append(OptionProblem(loc, message, err.get("input")))
        return None, problems


def task_option_problems(
    task: str, options: object, *, datasets_root: Path | None = None
) -> list[OptionProblem]:
    """Every problem of ``options`` for ``task`` that can be found without loading the task:
    its published options model, then the path policy for its :data:`~tuner.task_paths.DataPath`
    options (relative to ``datasets_root``, default the setting). Empty when the task
    publishes no options model."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        kind = type(options).__name__
        return [OptionProblem((), f"must be a mapping of option names to values, not {kind}")]
    model = options_model(task)
    if model is None:
        return []
    parsed, problems = option_problems(model, options, task)
    flagged = {p.loc[:1] for p in problems}
    for name in path_fields(model):
        # The raw value when given (even if another option is bad), else the default.
        value = options[name] if name in options else getattr(parsed, name, None)
        if not isinstance(value, str) or (name,) in flagged:
            continue
        try:
            check_data_path(value, root=datasets_root)
        except ValidationError as exc:
            problems.append(OptionProblem((name,), str(exc), value))
    return problems


def validate_task_options(task: str, options: object, *, datasets_root: Path | None = None) -> None:
    """Check ``options`` of ``task`` against its published options model and the path policy;
    :class:`ValidationError` with one ``task_options.<option>: <problem>`` per problem.

    A task that publishes no options model passes (the worker checks its options)."""
    problems = task_option_problems(task, options, datasets_root=datasets_root)
    if problems:
        raise ValidationError(
            f"invalid options for task {task!r}: "
            + "; ".join(
                f"task_options.{p.option}: {p.message}" if p.loc else f"task_options: {p.message}"
                for p in problems
            )
        )
