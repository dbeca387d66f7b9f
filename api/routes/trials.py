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
from tuner.store import MAX_PAGE_SIZE, TRIAL_SORT_KEYS, StudyStore, TrialRecord, TrialStatus

router = APIRouter(prefix="/studies/{study_id}", tags=["trials"])

#: Accepted values of ``sort``: a key, or ``-key`` for descending.
SORT_VALUES: Final = tuple(v for key in TRIAL_SORT_KEYS for v in (key, f"-{key}"))


def _all_trials(store: StudyStore, study_id: int) -> list[TrialRecord]:
    trials: list[TrialRecord] = []
    while True:
        page = store.list_trials(study_id, limit=MAX_PAGE_SIZE, offset=len(trials))
        trials.extend(page.items)
        if not page.items or not page.has_more:
            return trials


@router.get(
    "/trials",
    response_model=TrialPage,
    summary="List a study's trials",
    responses=error_responses(401, 404, 422),
)
def list_trials(
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
            description="Sort key, prefix '-' for descending; missing values sort last.",
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
    return TrialPage(
        items=[TrialOut.from_record(t) for t in page.items],
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
def get_trial(store: StoreDep, study_id: StudyId, number: TrialNumber) -> TrialOut:
    return TrialOut.from_record(store.get_trial(study_id, number))


@router.get(
    "/trials/{number}/metrics",
    response_model=TrialMetricsOut,
    summary="A trial's per-epoch metrics",
    responses=error_responses(401, 404, 422),
)
def trial_metrics(store: StoreDep, study_id: StudyId, number: TrialNumber) -> TrialMetricsOut:
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
    summary="Every trial's per-epoch metrics",
    responses=error_responses(401, 404, 422),
)
def study_metrics(store: StoreDep, study_id: StudyId) -> StudyMetricsOut:
    """All learning curves of the study in one response, trials in number order."""
    curves = store.study_metrics(study_id)
    trials = _all_trials(store, study_id)
    return StudyMetricsOut(
        study_id=study_id,
        trials=[
            TrialMetricsOut(
                study_id=study_id,
                trial_id=t.id,
                number=t.number,
                baseline=t.baseline,
                status=t.status,
                epochs=[EpochOut.from_record(m) for m in curves.get(t.number, [])],
            )
            for t in trials
        ],
    )
