"""Schedule YAML downloads: the exported document (schedule + provenance) as an attachment."""

from __future__ import annotations

from typing import Any, Final

from fastapi import Response

from api.errors import ApiError
from tuner.errors import ValidationError
from tuner.export import export_yaml, select_trial
from tuner.store import StudyStore

YAML_MEDIA_TYPE: Final = "application/yaml"

#: OpenAPI description of a 200 YAML download.
YAML_RESPONSE: Final[dict[int | str, dict[str, Any]]] = {
    200: {
        "description": "The schedule YAML (format version 1) with provenance, as an attachment.",
        "content": {
            YAML_MEDIA_TYPE: {
                "schema": {
                    "type": "object",
                    "description": "A schedule document: the published JSON Schema is "
                    "tuner/schemas/schedule.schema.json (with the export provenance).",
                }
            }
        },
    }
}


def schedule_download(store: StudyStore, study_id: int, number: int | None) -> Response:
    """The YAML of trial ``number`` of the study, or of its best trial when ``None``.

    404 for an unknown study or trial; 409 while the study has no best trial yet or the trial
    is still running (see :func:`tuner.export.select_trial`).
    """
    if number is None:
        study = store.get_study(study_id)
        if study.best_trial_number is None:
            raise ApiError(
                409,
                f"study {study_id} has no finished trial yet (status {study.status}, "
                f"{study.trials_done} trial(s) finished, {study.trials_running} running); "
                "the best schedule is available once a trial has completed",
                code="no_best_trial",
            )
    study, trial = select_trial(store, study_id, number)
    try:
        text = export_yaml(study, trial)
    except ValidationError as exc:  # the stored schedule is bad: our problem, not the client's
        raise ApiError(
            500, f"cannot export trial {trial.number} of study {study_id}: {exc}"
        ) from exc
    which = "best" if number is None else f"trial-{trial.number}"
    return Response(
        content=text,
        media_type=YAML_MEDIA_TYPE,
        headers={"Content-Disposition": f'attachment; filename="study-{study_id}-{which}.yaml"'},
    )
