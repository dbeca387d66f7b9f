"""``/studies``: submit, list, inspect, cancel and delete studies; download the best schedule."""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Query, Request, Response

from api.deps import StoreDep
from api.routes.downloads import YAML_RESPONSE, schedule_download
from api.routes.params import NO_NUL, Limit, Offset, StudyId
from api.schemas import StudyDetail, StudyOut, StudyPage, error_responses
from api.spec_input import spec_from_body
from tuner.errors import NotFoundError
from tuner.schedule import schedule_summary
from tuner.spec import StudySpec
from tuner.store import StudyRecord, StudyStatus, StudyStore

router = APIRouter(prefix="/studies", tags=["studies"])


async def request_body(request: Request) -> bytes:
    """The raw body (the size limit middleware stops it at ``max_request_bytes``)."""
    return await request.body()


#: OpenAPI of the POST body: a StudySpec as JSON, or the same document as YAML text.
SPEC_REQUEST_BODY: Final[dict[str, Any]] = {
    "requestBody": {
        "required": True,
        "description": "A study spec (see StudySpec): JSON, or YAML with Content-Type "
        "application/yaml or text/yaml.",
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/StudySpec"}},
            "application/yaml": {"schema": {"type": "string"}, "example": "task: digits\n"},
            "text/yaml": {"schema": {"type": "string"}},
        },
    }
}


def _detail(store: StudyStore, study: StudyRecord) -> StudyDetail:
    summary = None
    if study.best_trial_number is not None:
        try:
            best = store.get_trial(study.id, study.best_trial_number)
        except NotFoundError:  # deleted in between
            best = None
        if best is not None:
            summary = best.schedule_summary or schedule_summary(best.schedule)
    return StudyDetail.from_record(study, summary)


@router.post(
    "",
    status_code=201,
    response_model=StudyDetail,
    summary="Submit a study",
    responses=error_responses(401, 413, 415, 422),
    openapi_extra=SPEC_REQUEST_BODY,
)
def create_study(
    request: Request,
    response: Response,
    store: StoreDep,
    body: Annotated[bytes, Depends(request_body)],
    owner: Annotated[
        str | None,
        Query(max_length=200, pattern=NO_NUL, description="Who the study is for (free text)."),
    ] = None,
) -> StudyDetail:
    """Queue a study from its spec; a dispatcher runs it. The ``Location`` header points at it."""
    spec: StudySpec = spec_from_body(body, request.headers.get("content-type"))
    study = store.create_study(
        spec.task, spec.to_dict(), spec.budget.trials, name=spec.name, owner=owner
    )
    response.headers["Location"] = str(request.url_for("get_study", study_id=study.id))
    return _detail(store, study)


@router.get(
    "",
    response_model=StudyPage,
    summary="List studies",
    responses=error_responses(401, 422),
)
async def list_studies(
    store: StoreDep,
    status: Annotated[
        list[StudyStatus] | None, Query(description="Only these statuses (repeatable).")
    ] = None,
    task: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    owner: Annotated[str | None, Query(max_length=200, pattern=NO_NUL)] = None,
    limit: Limit = 50,
    offset: Offset = 0,
) -> StudyPage:
    """Studies, newest first, with their progress; ``total`` counts every match."""
    page = store.list_studies(status=status, task=task, owner=owner, limit=limit, offset=offset)
    return StudyPage(
        items=[StudyOut.from_record(s) for s in page.items],
        total=page.total,
        limit=page.limit,
        offset=page.offset,
    )


@router.get(
    "/{study_id}",
    response_model=StudyDetail,
    summary="Get a study",
    responses=error_responses(401, 404, 422),
)
async def get_study(store: StoreDep, study_id: StudyId) -> StudyDetail:
    """Status, progress (trials done / running / budget), best trial so far, spec, error."""
    return _detail(store, store.get_study(study_id))


@router.post(
    "/{study_id}/cancel",
    response_model=StudyDetail,
    summary="Cancel a study",
    responses=error_responses(401, 404, 409, 422),
)
def cancel_study(store: StoreDep, study_id: StudyId) -> StudyDetail:
    """A queued study is cancelled at once; a running one stops at its worker's next check
    (``cancel_requested`` is true until then). 409 if the study already finished."""
    return _detail(store, store.request_cancel(study_id))


@router.delete(
    "/{study_id}",
    status_code=204,
    response_class=Response,
    summary="Delete a study",
    responses=error_responses(401, 404, 409, 422),
)
def delete_study(store: StoreDep, study_id: StudyId) -> Response:
    """Delete a study with its trials and metrics. 409 while it runs: cancel it first.

    Its files on the Ray storage path (Tune's experiment and checkpoints, the seed runs, the
    stage-boundary states) and its Optuna study are removed by a worker when it next looks for
    work (the dispatcher of `stagetune worker` or `stagetune serve`)."""
    store.delete_study(study_id)
    return Response(status_code=204)


@router.get(
    "/{study_id}/schedule.yaml",
    response_class=Response,
    summary="Download the best schedule",
    responses={**YAML_RESPONSE, **error_responses(401, 404, 409, 422)},
)
def best_schedule_yaml(store: StoreDep, study_id: StudyId) -> Response:
    """The best schedule so far as YAML with provenance. 409 while no trial has finished."""
    return schedule_download(store, study_id, None)
