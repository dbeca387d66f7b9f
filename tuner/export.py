"""Production export of a tuned schedule: the versioned schedule YAML with provenance.

``export_yaml(study, trial)`` turns a study's trial into the schedule document that production
training loads (``Schedule.from_yaml``, :mod:`tuner.runtime`, the emitters of
:mod:`tuner.emitters`). The document is the schedule format version 1 of :mod:`tuner.schedule`
plus

* ``placement``: the world size and micro-batch the document is for (the ones the trial was
  tuned on; :func:`tuner.retarget.retarget` rewrites it for other hardware), and
* ``provenance``: where the schedule came from (study, task, objective, the trial and its
  metrics, the study's metric and the trial's value of it, the stagetune version, when it was
  exported, and the placement it was tuned on).

Every exported document is validated against the published JSON Schema
``tuner/schemas/schedule.schema.json`` (draft 2020-12); its ``$defs/exportProvenance`` is the
full provenance record. See ``docs/export.md``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from functools import lru_cache
from importlib import resources
from typing import Any, Protocol

import jsonschema
import yaml

from tuner import __version__
from tuner.errors import InvalidStateError, NotFoundError, ValidationError
from tuner.objectives import study_metric
from tuner.schedule import PlacementHint, Schedule, ScheduleError
from tuner.store.records import StudyRecord, TrialRecord, TrialStatus

__all__ = [
    "PROVENANCE_SOURCE",
    "SCHEMA_ID",
    "ExportValidationError",
    "TrialSource",
    "build_provenance",
    "export_schedule",
    "export_yaml",
    "render_yaml",
    "schedule_schema",
    "select_trial",
    "trial_schedule",
    "tuned_on",
    "validate_document",
]

#: ``provenance.source`` of every document this module writes.
PROVENANCE_SOURCE = "stagetune export"
_SCHEMA_FILE = "schedule.schema.json"


class ExportValidationError(ValidationError):
    """A schedule document does not match the published schema; ``problems`` lists why."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = tuple(problems)
        shown = "; ".join(problems[:10])
        more = f" (and {len(problems) - 10} more)" if len(problems) > 10 else ""
        super().__init__(f"schedule document does not match {_SCHEMA_FILE}: {shown}{more}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (list(self.problems),))


class TrialSource(Protocol):
    """What export needs from a store (``tuner.store.StudyStore`` provides it)."""

    def get_study(self, study_id: int) -> StudyRecord: ...

    def get_trial(self, study_id: int, number: int) -> TrialRecord: ...


# ------------------------------------------------------------------------------ schema


@lru_cache(maxsize=1)
def _schema_text() -> str:
    return resources.files("tuner").joinpath("schemas", _SCHEMA_FILE).read_text(encoding="utf-8")


def schedule_schema() -> dict[str, Any]:
    """The published JSON Schema of the schedule document (a fresh copy)."""
    schema: dict[str, Any] = json.loads(_schema_text())
    return schema


SCHEMA_ID: str = str(schedule_schema()["$id"])


@lru_cache(maxsize=2)
def _validator(export: bool) -> jsonschema.protocols.Validator:
    schema = schedule_schema()
    if export:
        # The same document schema, with provenance required to be the full export record.
        schema["properties"]["provenance"] = {"$ref": "#/$defs/exportProvenance"}
        schema["required"] = [*schema["required"], "provenance"]
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    return validator


def validate_document(document: Mapping[str, Any], *, export: bool = False) -> None:
    """Check a schedule document (the mapping of a YAML file) against the published schema.

    With ``export=True`` it must also carry ``placement`` and the full provenance record that
    :func:`export_yaml` writes. Raises :class:`ExportValidationError` listing every mismatch
    with its location (e.g. ``stages[1].batch_size``). The schema checks structure only; build
    a :class:`~tuner.schedule.Schedule` for the cross-field rules.
    """
    errors = sorted(
        _validator(export).iter_errors(document), key=lambda e: [str(p) for p in e.absolute_path]
    )
    if errors:
        raise ExportValidationError([f"{_where(e)}: {e.message}" for e in errors])


def _where(error: jsonschema.ValidationError) -> str:
    out = ""
    for part in error.absolute_path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "top level"


# ------------------------------------------------------------------------------ provenance


def _spec_value(spec: Mapping[str, Any], *paths: str) -> Any:
    """The first present, non-null value among dotted ``paths`` of the study spec."""
    for path in paths:
        node: Any = spec
        for part in path.split("."):
            if not isinstance(node, Mapping) or part not in node:
                node = None
                break
            node = node[part]
        if node is not None:
            return node
    return None


def _int_or_none(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and (not math.isfinite(value) or value != int(value)):
        return None
    return int(value)


def _float_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    out = float(value)
    return out if math.isfinite(out) else None


def _json_like(value: object) -> Any:
    """A JSON round trip: plain dicts/lists/scalars only (and a private copy)."""
    return json.loads(json.dumps(value, default=str))


def tuned_on(study: StudyRecord, trial: TrialRecord) -> PlacementHint | None:
    """The data-parallel placement the trial trained on, if the study recorded it.

    Read from the trial's schedule ``placement``, else the spec's resources.
    """
    placement = trial.schedule.get("placement")
    world: int | None = None
    micro: int | None = None
    if isinstance(placement, Mapping):
        world = _int_or_none(placement.get("world_size"))
        micro = _int_or_none(placement.get("micro_batch"))
    if world is None:
        world = _int_or_none(
            _spec_value(
                study.spec,
                "resources.world_size",
                "resources.workers",
                "resources.num_workers",
                "world_size",
                "workers",
            )
        )
        micro = _int_or_none(
            _spec_value(study.spec, "resources.micro_batch", "resources.micro_batch_size")
        )
    if world is None or world < 1:
        return None
    return PlacementHint(world_size=world, micro_batch=micro if micro and micro > 0 else None)


def build_provenance(
    study: StudyRecord, trial: TrialRecord, *, exported_at: datetime | None = None
) -> dict[str, Any]:
    """The provenance record of an export (``$defs/exportProvenance`` of the schema).

    ``metrics`` leads with ``metric``, the metric the study optimised (its summary's, else
    resolved from the spec and the task: :func:`tuner.objectives.study_metric`), and
    ``metric_value``, the trial's final value of it (:meth:`TrialRecord.metric`); what replay
    compares. ``objective`` stays the spec's, as submitted."""
    when = (exported_at or datetime.now(UTC)).astimezone(UTC)
    placement = tuned_on(study, trial)
    task_options = _spec_value(study.spec, "task_options", "task.options")
    objective = _spec_value(study.spec, "objective")
    seed = _int_or_none(trial.params.get("seed"))
    if seed is None:
        seed = _int_or_none(_spec_value(study.spec, "seed"))
    accuracy = _float_or_none(trial.val_accuracy)
    metric = study_metric(study.spec, study.summary)[0]
    return {
        "source": PROVENANCE_SOURCE,
        "stagetune_version": __version__,
        "exported_at": when.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "study_id": study.id,
        "study_name": study.name if study.name is not None else _spec_value(study.spec, "name"),
        "task": study.task,
        "task_options": _json_like(task_options) if isinstance(task_options, Mapping) else {},
        "objective": _json_like(objective) if isinstance(objective, Mapping | str) else None,
        "trial_number": trial.number,
        "trial_status": str(trial.status),
        "baseline": trial.baseline,
        "seed": seed,
        "metrics": {
            "metric": metric,
            "metric_value": _float_or_none(trial.metric(metric)),
            "val_accuracy": accuracy,
            "val_loss": _float_or_none(trial.val_loss),
            "steps": _int_or_none(trial.steps),
            "samples": _int_or_none(trial.samples),
            "epochs_done": _int_or_none(trial.epochs_done),
            "wall_time_s": _float_or_none(trial.wall_time_s),
            "mean_batch_size": _float_or_none(trial.mean_batch_size),
        },
        "tuned_on": {
            "world_size": placement.world_size if placement else None,
            "micro_batch": placement.micro_batch if placement else None,
        },
    }


# ------------------------------------------------------------------------------ export


def trial_schedule(
    study: StudyRecord, trial: TrialRecord, *, exported_at: datetime | None = None
) -> Schedule:
    """The trial's schedule with export provenance and the placement it was tuned on.

    Raises InvalidStateError for a trial that is still running, ValidationError when the
    stored schedule is not a valid schedule document.
    """
    if trial.study_id != study.id:
        raise ValidationError(
            f"trial {trial.number} belongs to study {trial.study_id}, not to study {study.id}"
        )
    if trial.status is TrialStatus.RUNNING:
        raise InvalidStateError(
            f"trial {trial.number} of study {study.id} is still running, so it has no final "
            "metrics to export; wait until it finishes or export another trial"
        )
    document = dict(trial.schedule)
    document.pop("provenance", None)
    document.pop("placement", None)
    try:
        schedule = Schedule.from_dict(document)
    except ScheduleError as exc:
        raise ValidationError(
            f"trial {trial.number} of study {study.id} stored an invalid schedule: {exc}"
        ) from exc
    return Schedule(
        **{
            **{name: getattr(schedule, name) for name in _SCHEDULE_INIT_FIELDS},
            "placement": tuned_on(study, trial),
            "provenance": build_provenance(study, trial, exported_at=exported_at),
        }
    )


_SCHEDULE_INIT_FIELDS = (
    "stages",
    "base_lr",
    "base_batch_size",
    "scaling_rule",
    "optimizer",
    "momentum",
    "weight_decay",
    "label_smoothing",
    "warmup_start_lr",
    "allow_decreasing_batch",
)


def render_yaml(
    schedule: Schedule, *, comments: list[str] | None = None, export: bool = True
) -> str:
    """The schedule as a YAML document with a comment header, validated against the schema.

    ``export=True`` requires the full export provenance and a placement.
    """
    document = schedule.to_dict()
    validate_document(document, export=export)
    header = [
        f"stagetune schedule (format version {document['version']}): {schedule.summary()}",
        f"JSON Schema: {SCHEMA_ID}",
    ]
    prov = schedule.provenance or {}
    if prov.get("source") == PROVENANCE_SOURCE:
        name = f" ({prov['study_name']})" if prov.get("study_name") else ""
        header.append(
            f"From study {prov.get('study_id')}{name}, trial {prov.get('trial_number')}, "
            f"task {prov.get('task')}; exported {prov.get('exported_at')} by stagetune "
            f"{prov.get('stagetune_version')}."
        )
    header.extend(comments or [])
    body = yaml.safe_dump(document, sort_keys=False, default_flow_style=False, allow_unicode=True)
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + body


def export_yaml(
    study: StudyRecord, trial: TrialRecord, *, exported_at: datetime | None = None
) -> str:
    """The schedule YAML of ``trial`` (of ``study``) with provenance, schema-validated.

    ``Schedule.from_yaml`` reads it back. Raises InvalidStateError for a running trial.
    """
    return render_yaml(trial_schedule(study, trial, exported_at=exported_at))


def select_trial(
    store: TrialSource, study_id: int, trial_number: int | None = None
) -> tuple[StudyRecord, TrialRecord]:
    """The study and the trial to export: ``trial_number``, or the study's best trial.

    Raises NotFoundError for an unknown study or trial, InvalidStateError when the study has
    no best trial yet.
    """
    study = store.get_study(study_id)
    if study is None:
        raise NotFoundError(f"study {study_id} not found")
    number = trial_number
    if number is None:
        number = study.best_trial_number
        if number is None:
            raise InvalidStateError(
                f"study {study_id} has no best trial yet (status {study.status}, "
                f"{study.trials_done} trial(s) finished, {study.trials_running} running); "
                "wait for a trial to complete or choose one with --trial N"
            )
    trial = store.get_trial(study_id, number)
    if trial is None:
        raise NotFoundError(f"study {study_id} has no trial {number}")
    return study, trial


def export_schedule(
    store: TrialSource,
    study_id: int,
    trial_number: int | None = None,
    *,
    exported_at: datetime | None = None,
) -> Schedule:
    """The exported schedule (with provenance and tuned-on placement) of a stored trial.

    ``trial_number=None`` exports the study's best trial. Raises NotFoundError /
    InvalidStateError (see :func:`select_trial`), and ExportValidationError if the result
    does not match the published schema.
    """
    study, trial = select_trial(store, study_id, trial_number)
    schedule = trial_schedule(study, trial, exported_at=exported_at)
    validate_document(schedule.to_dict(), export=True)
    return schedule
