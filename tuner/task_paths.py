"""The path policy of task options: where a task may read data from.

A task option that names a file or directory (cifar10's ``data_dir``) is declared with the
type :data:`DataPath` in the task's options model. A study spec comes from API users, so such
an option must not let them make a worker read an arbitrary path. Every :data:`DataPath`
value must satisfy the policy, at submission (:func:`tuner.tasks.validate_task_options`, which
``StudySpec`` runs) and again on the worker when the task loads its data
(``workers.tasks.BaseTask.load_data``: symlinks may have changed in between):

* no URL (``scheme://...``, ``file:...``), no leading ``~``, no ``..`` component, no NUL byte;
* a relative path is resolved against the **datasets root**, the setting
  ``STAGETUNE_DATASETS_DIR`` (default ``<STAGETUNE_DATA_DIR>/datasets``);
* an absolute path is accepted only if it lies inside the root;
* either way the path, with every symlink resolved (``os.path.realpath``), must lie inside the
  root (or be the root).

The path need not exist at submission (the data may be mounted on the workers only); the task
says so when it loads. The API server and the workers read the root from their own settings:
give them the same ``STAGETUNE_DATASETS_DIR`` (the same path on every node).
"""

from __future__ import annotations

import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

from tuner.errors import ValidationError

__all__ = [
    "DATASETS_DIR_SETTING",
    "PATH_MARKER",
    "DataPath",
    "check_data_path",
    "datasets_root",
    "path_fields",
]

#: Key of the JSON-schema extra that marks a path-valued option (value: ``"dataset"``).
PATH_MARKER: Final = "x-stagetune-path"
#: The environment variable of the datasets root (``Settings.datasets_dir``).
DATASETS_DIR_SETTING: Final = "STAGETUNE_DATASETS_DIR"
MAX_PATH_CHARS: Final = 4096

DataPath = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_PATH_CHARS,
        json_schema_extra={PATH_MARKER: "dataset"},
    ),
]
"""A task option that is a path to data: checked against the datasets root (module docs)."""

_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")


def datasets_root() -> Path:
    """The datasets root of this process: ``STAGETUNE_DATASETS_DIR`` (absolute, resolved)."""
    from tuner.settings import get_settings

    return get_settings().resolved_datasets_dir


def _marked(info: FieldInfo | None) -> bool:
    if info is None:
        return False
    extra = info.json_schema_extra
    if isinstance(extra, dict) and PATH_MARKER in extra:
        return True
    return any(isinstance(meta, FieldInfo) and _marked(meta) for meta in info.metadata)


def _annotation_marked(annotation: Any) -> bool:
    if typing.get_origin(annotation) is Annotated:
        base, *metadata = typing.get_args(annotation)
        if any(isinstance(m, FieldInfo) and _marked(m) for m in metadata):
            return True
        return _annotation_marked(base)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_annotation_marked(arg) for arg in typing.get_args(annotation))
    return False


def path_fields(model: type[BaseModel]) -> list[str]:
    """Names of the options of ``model`` declared as :data:`DataPath` (or ``DataPath | None``)."""
    return [
        name
        for name, info in model.model_fields.items()
        if _marked(info) or _annotation_marked(info.annotation)
    ]


def _refusal(option: str | None, value: str, rule: str, fix: str) -> ValidationError:
    where = f"{option}: " if option else ""
    return ValidationError(f"{where}{value!r} {rule}; {fix}")


def check_data_path(value: str, *, option: str | None = None, root: Path | None = None) -> Path:
    """The absolute path (symlinks resolved) that ``value`` names inside the datasets root.

    ``option`` names the option at the start of the message (e.g. ``task_options.data_dir``);
    ``root`` defaults to :func:`datasets_root`. Raises :class:`ValidationError` saying the rule
    broken and the setting to change.
    """
    inside = f"give a path relative to the datasets root ({DATASETS_DIR_SETTING} on the server)"
    if not isinstance(value, str) or not value:
        raise _refusal(option, str(value), "is not a path", "give a non-empty string")
    if "\x00" in value:
        raise _refusal(option, value, "contains a NUL byte", inside)
    if _URL.match(value) or value.lower().startswith("file:"):
        raise _refusal(option, value, "is a URL; only local paths are read", inside)
    if value.startswith("~"):
        raise _refusal(option, value, "starts with '~' (home directories are not read)", inside)
    if ".." in re.split(r"[/\\]", value):
        raise _refusal(option, value, "contains a '..' component", inside)
    base = os.path.realpath(root if root is not None else datasets_root())
    candidate = value if os.path.isabs(value) else os.path.join(base, value)
    real = os.path.realpath(candidate)
    if _inside(real, base):
        return Path(real)
    if _inside(os.path.normpath(candidate), base):
        rule = f"leaves the datasets root {base} through a symlink"
    else:
        rule = f"is outside the datasets root {base}"
    raise _refusal(
        option,
        value,
        rule,
        "put the data under the root and give its path relative to it, or set "
        f"{DATASETS_DIR_SETTING} on the server to a directory that holds it",
    )


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)
