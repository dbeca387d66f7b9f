"""A study's trials, their per-epoch metrics and schedules."""

from __future__ import annotations

from typing import Annotated, Final

from fastapi import APIRouter, Query, Response

from api.deps import StoreDep
from api.errors import ApiError
from api.routes.downloads import YAML_RESPONSE, schedule_download
from api.routes.params import Limit, Offset, StudyId, TrialNumber
from api.schemas import (
    EpochOut,
    StudyMetricsOut,
    TrialMetricsOut,
    TrialOut,
    TrialPage,
    error_responses,
)
from tuner.objectives import study_metric
from tuner.store import TRIAL_SORT_KEYS, StudyStore, TrialStatus

router = APIRouter(prefix="/studies/{study_id}", tags=["trials"])

#: Trials per page of ``GET /studies/{id}/metrics`` (each with all its epochs).
DEFAULT_CURVES_PAGE: Final = 50
MAX_CURVES_PAGE: Final = 200

#: Accepted values of ``sort``: a key, or ``-key`` for descending.
SORT_VALUES: Final = tuple(v for key in TRIAL_SORT_KEYS for v in (key, f"-{key}"))


@router.get(
    "/trials",
    response_model=TrialPage,
    summary="List a study's trials",
    responses=error_responses(401, 404, 422),
)
async def list_trials(
    store: StoreDep,
    study_id: StudyId,
    status: Annotated[
        list[TrialStatus] | None, Query(description="Only these statuses (repeatable).")
    ] = None,
    baseline: Annotated[
        bool | None, Query(description="true: only baselines; false: only tuned trials.")
    ] = None,
    sort: Annotated[
        str,
        Query(
            description="Sort key, prefix '-' for descending; ties go by trial number in the same "
            "direction; trials without a value come last either way.",
            json_schema_extra={"enum": list(SORT_VALUES)},
        ),
    ] = "number",
    limit: Limit = 50,
    offset: Offset = 0,
) -> TrialPage:
    if sort not in SORT_VALUES:
        message = (
            f"cannot sort trials by {sort!r}; use one of {', '.join(TRIAL_SORT_KEYS)} "
            "(prefix - for descending)"
        )
        raise ApiError(
            422,
            message,
            details=[
                {"field": "sort", "loc": ["query", "sort"], "message": message, "type": "enum"}
            ],
        )
    page = store.list_trials(
        study_id, status=status, baseline=baseline, sort=sort, limit=limit, offset=offset
    )
    metric = _metric(store, study_id)
    return TrialPage(
        items=[TrialOut.from_record(t, metric) for t in page.items],
        total=page.total,
        limit=page.limit,
        offset=page.offset,
    )


@router.get(
    "/trials/{number}",
    response_model=TrialOut,
    summary="Get a trial",
    responses=error_responses(401, 404, 422),
)
async def get_trial(store: StoreDep, study_id: StudyId, number: TrialNumber) -> TrialOut:
    trial = store.get_trial(study_id, number)
    return TrialOut.from_record(trial, _metric(store, study_id))


def _metric(store: StudyStore, study_id: int) -> str:
    """The study's metric, which a trial's ``metric_value`` is a value of."""
    study = store.get_study(study_id)
    return study_metric(study.spec, study.summary)[0]


@router.get(
    "/trials/{number}/metrics",
    response_model=TrialMetricsOut,
    summary="A trial's per-epoch metrics",
    responses=error_responses(401, 404, 422),
)
async def trial_metrics(store: StoreDep, study_id: StudyId, number: TrialNumber) -> TrialMetricsOut:
    trial = store.get_trial(study_id, number)
    return TrialMetricsOut(
        study_id=study_id,
        trial_id=trial.id,
        number=trial.number,
        baseline=trial.baseline,
        status=trial.status,
        epochs=[EpochOut.from_record(m) for m in store.trial_metrics(trial.id)],
    )


@router.get(
    "/trials/{number}/schedule.yaml",
    response_class=Response,
    summary="Download a trial's schedule",
    responses={**YAML_RESPONSE, **error_responses(401, 404, 409, 422)},
)
def trial_schedule_yaml(store: StoreDep, study_id: StudyId, number: TrialNumber) -> Response:
    """The trial's schedule as YAML with provenance. 409 while the trial is running."""
    return schedule_download(store, study_id, number)


@router.get(
    "/metrics",
    response_model=StudyMetricsOut,
    summary="A page of the study's learning curves",
    responses=error_responses(401, 404, 422),
)
def study_metrics(
    store: StoreDep,
    study_id: StudyId,
    limit: Annotated[
        int,
        Query(
            ge=1,
            le=MAX_CURVES_PAGE,
            description=f"Trials per page (at most {MAX_CURVES_PAGE}): each comes with all "
            "its epochs.",
        ),
    ] = DEFAULT_CURVES_PAGE,
    offset: Offset = 0,
) -> StudyMetricsOut:
    """Every trial's per-epoch metrics, a page of trials at a time in number order (page
    with ``offset`` until ``offset + limit >= total``); a trial that has not reported yet
    has no epochs."""
    return StudyMetricsOut.from_page(
        study_id, store.study_curves(study_id, limit=limit, offset=offset)
    )
