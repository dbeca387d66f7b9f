"""The schedule document: the YAML / dict form of a :class:`~tuner.schedule.model.Schedule`.

Format version 1 (``docs/schedule-format.md``): a mapping with ``version``, ``units``, the
run-wide settings, ``stages`` (one mapping per :class:`~tuner.schedule.stage.Stage`), and
optionally ``placement`` (a :class:`PlacementHint`) and ``provenance`` (free-form JSON-like
data). This module builds the document from a schedule (:func:`schedule_to_dict`) and a
schedule from a document (:func:`schedule_from_dict`, reporting unknown or missing keys, a
wrong version or units and every value problem at once), writes and reads it as YAML
(``yaml.safe_dump`` / ``yaml.safe_load`` only) and reads and writes schedule files. The
methods ``Schedule.to_dict`` / ``from_dict`` / ``to_yaml`` / ``from_yaml`` / ``load`` /
``dump`` call these functions, and ``Schedule`` checks and copies its ``provenance`` with
``_copy_json_like`` (the limits of ``MAX_PROVENANCE_DEPTH`` / ``MAX_PROVENANCE_ITEMS``).
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar

import yaml

from tuner.schedule.stage import _STAGE_FLOAT_FIELDS, Stage
from tuner.schedule.values import (
    FORMAT_VERSION,
    MAX_BATCH_SIZE,
    MAX_PROVENANCE_DEPTH,
    MAX_PROVENANCE_ITEMS,
    MAX_STAGES,
    MAX_WORLD_SIZE,
    MAX_YAML_CHARS,
    UNITS,
    ScheduleError,
    _is_int,
    _norm_int,
    _show,
    _stage_label,
)

if TYPE_CHECKING:
    from tuner.schedule.model import Schedule

_S = TypeVar("_S", bound="Schedule")

#: The run-wide float fields of a schedule (integers given for them are stored as floats).
_TOP_FLOAT_FIELDS: Final = ("base_lr", "momentum", "weight_decay", "label_smoothing")


# --------------------------------------------------------------------------------------------
# Placement hint (part of the document)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementHint:
    """The placement a schedule was tuned on (informational; ``place`` takes its own args)."""

    world_size: int
    micro_batch: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "world_size", _norm_int(self.world_size))
        if self.micro_batch is not None:
            object.__setattr__(self, "micro_batch", _norm_int(self.micro_batch))

    def problems(self) -> list[str]:
        """Problems of this hint (without a label); empty if valid."""
        out: list[str] = []
        if not _is_int(self.world_size) or not 1 <= self.world_size <= MAX_WORLD_SIZE:
            out.append(
                f"placement.world_size must be an integer in [1, {MAX_WORLD_SIZE}], "
                f"got {_show(self.world_size)}"
            )
        mb = self.micro_batch
        if mb is not None and (not _is_int(mb) or not 1 <= mb <= MAX_BATCH_SIZE):
            out.append(f"placement.micro_batch must be a positive integer or null, got {_show(mb)}")
        return out


# --------------------------------------------------------------------------------------------
# Schedule <-> document, YAML and files
# --------------------------------------------------------------------------------------------


def schedule_to_dict(schedule: Schedule) -> dict[str, Any]:
    """The body of :meth:`Schedule.to_dict <tuner.schedule.model.Schedule.to_dict>`."""
    out: dict[str, Any] = {
        "version": FORMAT_VERSION,
        "units": dict(UNITS),
        "base_lr": schedule.base_lr,
        "base_batch_size": schedule.base_batch_size,
        "scaling_rule": schedule.scaling_rule,
        "optimizer": schedule.optimizer,
        "momentum": schedule.momentum,
        "weight_decay": schedule.weight_decay,
        "label_smoothing": schedule.label_smoothing,
    }
    if schedule.warmup_start_lr is not None:
        out["warmup_start_lr"] = schedule.warmup_start_lr
    out["allow_decreasing_batch"] = schedule.allow_decreasing_batch
    out["stages"] = [_stage_to_dict(st) for st in schedule.stages]
    if schedule.placement is not None:
        hint: dict[str, Any] = {"world_size": schedule.placement.world_size}
        if schedule.placement.micro_batch is not None:
            hint["micro_batch"] = schedule.placement.micro_batch
        out["placement"] = hint
    if schedule.provenance is not None:
        out["provenance"] = _copy_json_like(schedule.provenance, "provenance", 0, [0], [])
    return out


def schedule_from_dict(cls: type[_S], data: object, *, yaml_numbers: bool) -> _S:
    """A ``cls`` (Schedule or a subclass) built from document ``data``; ScheduleError lists
    every problem. ``yaml_numbers`` accepts ``1e-3``-style strings in numeric fields."""
    problems: list[str] = []
    kwargs = _parse_document(data, problems, yaml_numbers)
    if kwargs is None:
        raise ScheduleError(problems)
    if not problems:
        return cls(**kwargs)
    # Structural problems (unknown keys...): still report the value problems of whatever
    # could be read, so that one pass shows everything.
    if all(key in kwargs for key in _TOP_REQUIRED if key not in ("version", "units")):
        try:
            cls(**kwargs)
        except ScheduleError as exc:
            problems.extend(exc.problems)
    raise ScheduleError(problems)


def document_to_yaml(document: Mapping[str, Any]) -> str:
    """The YAML text of a document (the body of :meth:`Schedule.to_yaml
    <tuner.schedule.model.Schedule.to_yaml>`)."""
    text = _safe_dump(document, allow_unicode=True)
    if _reads_back(text, document):
        return text
    return _safe_dump(document, allow_unicode=False)


def schedule_from_yaml(cls: type[_S], text: str) -> _S:
    """The body of :meth:`Schedule.from_yaml <tuner.schedule.model.Schedule.from_yaml>`."""
    if not isinstance(text, str):
        raise ScheduleError(f"a schedule YAML document must be text, got {_show(text)}")
    if len(text) > MAX_YAML_CHARS:
        raise ScheduleError(
            f"the schedule YAML document has {len(text)} characters, more than the "
            f"maximum {MAX_YAML_CHARS}"
        )
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ScheduleError(_yaml_error_message(exc)) from None
    if data is None:
        raise ScheduleError("the schedule YAML document is empty")
    return schedule_from_dict(cls, data, yaml_numbers=True)


def load_schedule(path: str | os.PathLike[str], from_yaml: Callable[[str], _S]) -> _S:
    """Read the YAML file ``path`` and parse it with ``from_yaml``; errors name the file."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(MAX_YAML_CHARS + 1)
    except OSError as exc:
        raise ScheduleError(
            f"cannot read schedule file {os.fspath(path)}: {exc.strerror or exc}"
        ) from None
    except UnicodeDecodeError:
        raise ScheduleError(f"schedule file {os.fspath(path)} is not UTF-8 text") from None
    try:
        return from_yaml(text)
    except ScheduleError as exc:
        raise ScheduleError([f"{os.fspath(path)}: {p}" for p in exc.problems]) from None


def dump_yaml(path: str | os.PathLike[str], text: str) -> None:
    """Write YAML ``text`` to ``path`` (UTF-8)."""
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)


def _safe_dump(document: Mapping[str, Any], *, allow_unicode: bool) -> str:
    return yaml.safe_dump(
        document, sort_keys=False, default_flow_style=False, allow_unicode=allow_unicode
    )


def _reads_back(text: str, document: Mapping[str, Any]) -> bool:
    try:
        text.encode("utf-8")
        return bool(yaml.safe_load(text) == document)
    except (UnicodeEncodeError, yaml.YAMLError):
        return False


def _stage_to_dict(st: Stage) -> dict[str, Any]:
    out: dict[str, Any] = {
        "start_epoch": st.start_epoch,
        "end_epoch": st.end_epoch,
        "batch_size": st.batch_size,
        "lr_multiplier": st.lr_multiplier,
        "warmup_epochs": st.warmup_epochs,
        "decay": st.decay,
    }
    if st.decay in ("cosine", "linear") or st.decay_final_factor != 0.0:
        out["decay_final_factor"] = st.decay_final_factor
    if st.step_every_epochs is not None:
        out["step_every_epochs"] = st.step_every_epochs
    if st.decay == "step" or st.step_gamma != 0.1:
        out["step_gamma"] = st.step_gamma
    return out


# --------------------------------------------------------------------------------------------
# Document parsing
# --------------------------------------------------------------------------------------------

_TOP_KEYS: Final = (
    "version",
    "units",
    "base_lr",
    "base_batch_size",
    "scaling_rule",
    "optimizer",
    "momentum",
    "weight_decay",
    "label_smoothing",
    "warmup_start_lr",
    "allow_decreasing_batch",
    "stages",
    "placement",
    "provenance",
)
_TOP_REQUIRED: Final = ("version", "units", "base_lr", "base_batch_size", "stages")
_STAGE_KEYS: Final = (
    "start_epoch",
    "end_epoch",
    "batch_size",
    "lr_multiplier",
    "warmup_epochs",
    "decay",
    "decay_final_factor",
    "step_every_epochs",
    "step_gamma",
)
_STAGE_REQUIRED: Final = ("start_epoch", "end_epoch", "batch_size")
_PLACEMENT_KEYS: Final = ("world_size", "micro_batch")
_UNITS_EXAMPLE: Final = "units: {time: epochs, batch_size: samples, lr: absolute}"
_UNIT_HINTS: Final[Mapping[str, str]] = {
    "time": "all times (start_epoch, end_epoch, warmup_epochs, step_every_epochs) are in epochs",
    "batch_size": "batch sizes are global samples per optimizer step",
    "lr": "base_lr and warmup_start_lr are absolute learning rates",
}
# YAML 1.1 reads 1e-3 (no dot) as a string; accept it in numeric fields of YAML input.
_EXP_FLOAT: Final = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def _yaml_error_message(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is not None:
        return (
            f"invalid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}; "
            "check the indentation and quoting there"
        )
    return f"invalid YAML: {problem}"


def _check_keys(
    mapping: Mapping[Any, Any],
    where: str,
    allowed: Sequence[str],
    required: Sequence[str],
    problems: list[str],
) -> None:
    for key in mapping:
        if key not in allowed:
            problems.append(f"{where}: unknown key {key!r}; allowed: {', '.join(allowed)}")
    for key in required:
        if key not in mapping:
            problems.append(f"{where}: missing required key {key!r}")


def _yaml_number(value: object, yaml_numbers: bool) -> object:
    if yaml_numbers and isinstance(value, str) and _EXP_FLOAT.fullmatch(value.strip()):
        return float(value)
    return value


def _parse_document(data: object, problems: list[str], yaml_numbers: bool) -> dict[str, Any] | None:
    if not isinstance(data, Mapping):
        problems.append(
            f"a schedule document must be a mapping with version, units, base_lr, "
            f"base_batch_size and stages, got {_show(data)}"
        )
        return None
    if "version" not in data:
        problems.append(
            f"top level: missing 'version'; this stagetune reads schedule format version "
            f"{FORMAT_VERSION}: add 'version: {FORMAT_VERSION}'"
        )
    else:
        version = data["version"]
        if not _is_int(version) or version != FORMAT_VERSION:
            problems.append(
                f"top level: unsupported version {_show(version)}; this stagetune reads "
                f"schedule format version {FORMAT_VERSION} only"
            )
            return None  # another version's keys would only add noise
    _check_keys(data, "top level", _TOP_KEYS, (), problems)
    for key in _TOP_REQUIRED:
        if key == "version" or key in data:
            continue
        hint = f"; add {_UNITS_EXAMPLE}" if key == "units" else ""
        problems.append(f"top level: missing required key {key!r}{hint}")
    if "units" in data:
        _check_units(data["units"], problems)

    kwargs: dict[str, Any] = {}
    for key in _TOP_KEYS:
        if key in ("version", "units", "stages", "placement", "provenance") or key not in data:
            continue
        value = data[key]
        if key in (*_TOP_FLOAT_FIELDS, "warmup_start_lr"):
            value = _yaml_number(value, yaml_numbers)
        kwargs[key] = value

    stages_raw = data.get("stages")
    stages: list[Stage] = []
    stages_complete = False
    if "stages" in data:
        if not isinstance(stages_raw, list):
            problems.append(f"stages: must be a list of stage mappings, got {_show(stages_raw)}")
        elif len(stages_raw) > MAX_STAGES:
            problems.append(
                f"stages: {len(stages_raw)} stages exceed the maximum of {MAX_STAGES} (MAX_STAGES)"
            )
        else:
            stages_complete = True
            for i, raw in enumerate(stages_raw):
                stage = _parse_stage(i, raw, problems, yaml_numbers)
                if stage is None:
                    stages_complete = False
                else:
                    stages.append(stage)
    if stages_complete:
        kwargs["stages"] = tuple(stages)

    if "placement" in data and data["placement"] is not None:
        raw_p = data["placement"]
        if not isinstance(raw_p, Mapping):
            problems.append(
                f"placement: must be a mapping with world_size and optionally micro_batch, "
                f"got {_show(raw_p)}"
            )
        else:
            _check_keys(raw_p, "placement", _PLACEMENT_KEYS, ("world_size",), problems)
            if "world_size" in raw_p:
                kwargs["placement"] = PlacementHint(
                    world_size=raw_p["world_size"], micro_batch=raw_p.get("micro_batch")
                )
    if "provenance" in data and data["provenance"] is not None:
        prov = data["provenance"]
        if not isinstance(prov, Mapping):
            problems.append(f"provenance: must be a mapping, got {_show(prov)}")
        else:
            kwargs["provenance"] = _copy_json_like(prov, "provenance", 0, [0], problems)
    return kwargs


def _check_units(units: object, problems: list[str]) -> None:
    if not isinstance(units, Mapping):
        problems.append(f"units: must be a mapping, {_UNITS_EXAMPLE}; got {_show(units)}")
        return
    for key in units:
        if key not in UNITS:
            problems.append(f"units: unknown key {key!r}; allowed: {', '.join(UNITS)}")
    for key, expected in UNITS.items():
        if key not in units:
            problems.append(f"units: missing key {key!r}; version 1 requires {_UNITS_EXAMPLE}")
        elif units[key] != expected:
            problems.append(
                f"units.{key}: {_show(units[key])} is not supported; version 1 uses "
                f"{key}: {expected} ({_UNIT_HINTS[key]})"
            )


def _parse_stage(index: int, raw: object, problems: list[str], yaml_numbers: bool) -> Stage | None:
    if not isinstance(raw, Mapping):
        problems.append(f"stage {index + 1}: must be a mapping, got {_show(raw)}")
        return None
    label = _stage_label(index, raw.get("start_epoch"), raw.get("end_epoch"))
    _check_keys(raw, label, _STAGE_KEYS, _STAGE_REQUIRED, problems)
    if any(key not in raw for key in _STAGE_REQUIRED):
        return None
    kwargs: dict[str, Any] = {}
    for key in _STAGE_KEYS:
        if key in raw:
            value = raw[key]
            if key in (*_STAGE_FLOAT_FIELDS, "step_every_epochs"):
                value = _yaml_number(value, yaml_numbers)
            kwargs[key] = value
    return Stage(**kwargs)


def _copy_json_like(
    value: object, where: str, depth: int, count: list[int], problems: list[str]
) -> Any:
    """Copy a JSON-like value (str keys; str/int/float/bool/null, lists, mappings).

    Tuples become lists. Non-finite floats, other types, too deep or too large values are
    reported in ``problems``.
    """
    count[0] += 1
    if count[0] > MAX_PROVENANCE_ITEMS:
        if count[0] == MAX_PROVENANCE_ITEMS + 1:
            problems.append(f"provenance: more than {MAX_PROVENANCE_ITEMS} values; keep it small")
        return None
    if depth > MAX_PROVENANCE_DEPTH:
        problems.append(f"{where}: nested deeper than {MAX_PROVENANCE_DEPTH} levels")
        return None
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            problems.append(f"{where}: {value!r} is not allowed (JSON has no NaN or infinity)")
        return value
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                problems.append(f"{where}: key {key!r} must be a string")
                continue
            out[key] = _copy_json_like(item, f"{where}.{key}", depth + 1, count, problems)
        return out
    if isinstance(value, (list, tuple)):
        return [
            _copy_json_like(item, f"{where}[{j}]", depth + 1, count, problems)
            for j, item in enumerate(value)
        ]
    problems.append(
        f"{where}: {_show(value)} is not allowed; use strings, numbers, booleans, null, "
        "lists and mappings"
    )
    return None
