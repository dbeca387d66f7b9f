"""REST: a study's trials (paging, sorting, filters), per-epoch metrics of one trial and of
the whole study (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from tests.api.conftest import (
    STUDIES,
    TestClient,
    error_message,
    field_errors,
    new_study,
    schedule_dict,
    seed_running_study,
)
from tests.regression_task import TASK_NAME, LinearRegression, regression_task
from tuner.store import TRIAL_SORT_KEYS, StudyStore, TrialStatus

__all__ = ["regression_task"]  # the fixture, used here


def numbers(body: dict[str, list[dict[str, object]]]) -> list[object]:
    return [t["number"] for t in body["items"]]


def test_list_trials_in_number_order_with_details(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    r = client.get(f"{STUDIES}/{seeded.study_id}/trials")
    assert r.status_code == 200
    body = r.json()
    assert (body["total"], body["limit"], body["offset"]) == (4, 50, 0)
    assert numbers(body) == [0, 1, 2, 3]
    first = body["items"][0]
    assert first["baseline"] == "small_batch"
    assert first["status"] == "completed"
    assert first["val_accuracy"] == 0.8
    # The study's metric is validation accuracy: a trial stored without metric_value has its
    # val_accuracy there.
    assert [t["metric_value"] for t in body["items"]] == [0.8, 0.9, None, None]
    assert first["epochs_done"] == 2
    assert first["schedule_summary"] == "32@0-2 -> 64@2-4"
    assert first["schedule"]["stages"][0]["batch_size"] == 32
    assert first["params"] == {"seed": 0}
    assert [t["status"] for t in body["items"]] == ["completed", "completed", "diverged", "running"]


def test_sort_filter_and_paginate_trials(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    url = f"{STUDIES}/{seeded.study_id}/trials"
    # Missing values (the diverged and the running trial) sort last either way, by number in
    # the sort's direction.
    assert numbers(client.get(url, params={"sort": "-val_accuracy"}).json()) == [1, 0, 3, 2]
    assert numbers(client.get(url, params={"sort": "val_accuracy"}).json()) == [0, 1, 2, 3]
    assert numbers(client.get(url, params={"sort": "-number"}).json()) == [3, 2, 1, 0]

    page = client.get(url, params={"sort": "-number", "limit": 2, "offset": 1}).json()
    assert (numbers(page), page["total"]) == ([2, 1], 4)

    completed = client.get(url, params={"status": "completed"}).json()
    assert (numbers(completed), completed["total"]) == ([0, 1], 2)
    finished = client.get(url, params=[("status", "diverged"), ("status", "running")]).json()
    assert numbers(finished) == [2, 3]
    assert numbers(client.get(url, params={"baseline": "true"}).json()) == [0]
    assert numbers(client.get(url, params={"baseline": "false"}).json()) == [1, 2, 3]


@pytest.mark.parametrize("sort", ["schedule", "-params", "number; DROP TABLE x", ""])
def test_sort_by_an_unlisted_key_is_422_naming_the_keys(
    client: TestClient, store: StudyStore, sort: str
) -> None:
    study_id = new_study(store)
    r = client.get(f"{STUDIES}/{study_id}/trials", params={"sort": sort})
    assert r.status_code == 422
    message = field_errors(r.json())["sort"]
    for key in TRIAL_SORT_KEYS:
        assert key in message


def test_bad_trial_status_filter_is_422(client: TestClient, store: StudyStore) -> None:
    study_id = new_study(store)
    r = client.get(f"{STUDIES}/{study_id}/trials", params={"status": "queued"})
    assert r.status_code == 422
    assert "status[0]" in field_errors(r.json())


def test_get_trial_and_404s(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    r = client.get(f"{STUDIES}/{seeded.study_id}/trials/1")
    assert r.status_code == 200
    body = r.json()
    assert (body["number"], body["val_accuracy"], body["steps"]) == (1, 0.9, 101)
    assert body["study_id"] == seeded.study_id

    r = client.get(f"{STUDIES}/{seeded.study_id}/trials/7")
    assert r.status_code == 404
    assert "no trial number 7" in error_message(r.json(), "not_found")
    assert client.get(f"{STUDIES}/{seeded.study_id}/trials/-1").status_code == 422


def test_trial_metrics_per_epoch(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    r = client.get(f"{STUDIES}/{seeded.study_id}/trials/2/metrics")
    assert r.status_code == 200
    body = r.json()
    assert (body["number"], body["status"]) == (2, "diverged")
    assert [e["epoch"] for e in body["epochs"]] == [0, 1]
    assert body["epochs"][1]["val_accuracy"] == pytest.approx(0.62)
    assert body["epochs"][0]["batch_size"] == 64
    assert body["epochs"][0]["extra"] == {"custom_key": 2}
    assert client.get(f"{STUDIES}/{seeded.study_id}/trials/9/metrics").status_code == 404


def test_study_metrics_has_every_trial_curve(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    r = client.get(f"{STUDIES}/{seeded.study_id}/metrics")
    assert r.status_code == 200
    body = r.json()
    assert body["study_id"] == seeded.study_id
    assert (body["total"], body["limit"], body["offset"]) == (4, 50, 0)
    trials = body["trials"]
    assert [t["number"] for t in trials] == [0, 1, 2, 3]
    assert [len(t["epochs"]) for t in trials] == [2, 2, 2, 1]
    assert trials[0]["baseline"] == "small_batch"
    assert trials[3]["status"] == "running"
    single = client.get(f"{STUDIES}/{seeded.study_id}/trials/1/metrics").json()
    assert trials[1]["epochs"] == single["epochs"]


def test_study_without_trials_has_empty_listings(client: TestClient, store: StudyStore) -> None:
    study_id = new_study(store)
    assert client.get(f"{STUDIES}/{study_id}/trials").json()["items"] == []
    assert client.get(f"{STUDIES}/{study_id}/metrics").json() == {
        "study_id": study_id,
        "trials": [],
        "total": 0,
        "limit": 50,
        "offset": 0,
    }


def test_study_metrics_are_paged_by_trial_number(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    url = f"{STUDIES}/{seeded.study_id}/metrics"
    page = client.get(url, params={"limit": 2, "offset": 1}).json()
    assert (page["total"], page["limit"], page["offset"]) == (4, 2, 1)
    assert [t["number"] for t in page["trials"]] == [1, 2]
    assert [len(t["epochs"]) for t in page["trials"]] == [2, 2]
    assert client.get(url, params={"offset": 4}).json()["trials"] == []
    for limit in (0, 201):
        r = client.get(url, params={"limit": limit})
        assert r.status_code == 422
        assert "limit" in field_errors(r.json())
    assert client.get(url, params={"limit": 200}).status_code == 200
    assert client.get(f"{STUDIES}/98765/metrics").status_code == 404


def test_a_rerun_trial_says_so(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    url = f"{STUDIES}/{seeded.study_id}/trials/{seeded.running_number}"
    assert (client.get(url).json()["restarts"], client.get(url).json()["restart_reason"]) == (
        0,
        None,
    )
    running = store.get_trial(seeded.study_id, seeded.running_number)
    # The resumed run starts the interrupted trial again (what the progress callback does).
    store.start_trial(seeded.study_id, running.number, running.schedule, running.params)
    body = client.get(url).json()
    assert body["restarts"] == 1
    assert "did not finish" in body["restart_reason"]
    assert body["epochs_done"] == 0
    listed = client.get(f"{STUDIES}/{seeded.study_id}/trials").json()["items"]
    assert [t["restarts"] for t in listed] == [0, 0, 0, 1]


def test_trials_of_another_metric_carry_its_value(
    client: TestClient, store: StudyStore, regression_task: LinearRegression
) -> None:
    """A study of the regression task's primary metric (val_mse): each trial's metric_value
    is its final MSE; it has no accuracy."""
    study_id = new_study(store, task=TASK_NAME)
    store.claim_study("w", 60)
    for number, mse in enumerate([0.24, 0.5]):
        trial = store.create_trial(study_id, number, schedule_dict(32, 64), {"seed": number})
        store.add_epoch_metrics(trial.id, 0, {"val_loss": mse / 2, "val_mse": mse})
        final = {"val_loss": mse / 2, "metric_value": mse, "steps": 10}
        store.finish_trial(trial.id, TrialStatus.COMPLETED, final=final)
    page = client.get(f"{STUDIES}/{study_id}/trials").json()
    assert [(t["metric_value"], t["val_loss"], t["val_accuracy"]) for t in page["items"]] == [
        (0.24, 0.12, None),
        (0.5, 0.25, None),
    ]
    one = client.get(f"{STUDIES}/{study_id}/trials/0").json()
    assert (one["metric_value"], one["val_accuracy"]) == (0.24, None)
    study = client.get(f"{STUDIES}/{study_id}").json()
    assert (study["metric"], study["metric_direction"]) == ("val_mse", "min")
    epochs = client.get(f"{STUDIES}/{study_id}/trials/0/metrics").json()["epochs"]
    assert epochs[0]["extra"] == {"val_mse": 0.24}
