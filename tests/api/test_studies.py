"""REST: submitting, listing, inspecting, cancelling and deleting studies (SQLite and
PostgreSQL), and downloading the best schedule."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.api.conftest import (
    SPEC_YAML,
    STUDIES,
    TestClient,
    error_message,
    field_errors,
    new_study,
    schedule_dict,
    seed_running_study,
)
from tests.regression_task import TASK_NAME, LinearRegression, regression_task
from tuner.schedule import Schedule
from tuner.store import StudyStatus, StudyStore
from tuner.tasks import available_tasks

YAML = {"Content-Type": "application/yaml"}

__all__ = ["regression_task"]  # the fixture, used here


# -- create ----------------------------------------------------------------------------------


def test_create_from_yaml_returns_201_with_location_of_the_queued_study(
    client: TestClient,
) -> None:
    r = client.post(STUDIES, content=SPEC_YAML, headers=YAML)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "queued"
    assert body["task"] == "digits"
    assert body["name"] == "seeded"
    assert body["progress"] == {
        "budget": 6,
        "trials_done": 0,
        "trials_running": 0,
        "trials_remaining": 6,
    }
    assert body["best"] is None
    assert (body["metric"], body["metric_direction"]) == ("val_accuracy", "max")
    assert body["spec"]["schedule"]["total_epochs"] == 4
    assert r.headers["Location"].endswith(f"{STUDIES}/{body['id']}")
    again = client.get(r.headers["Location"])
    assert again.status_code == 200
    assert again.json() == body


@pytest.mark.parametrize("content_type", ["text/yaml", "application/x-yaml", None])
def test_create_accepts_yaml_content_types(client: TestClient, content_type: str | None) -> None:
    headers = {"Content-Type": content_type} if content_type else {}
    r = client.post(STUDIES, content=SPEC_YAML.encode(), headers=headers)
    assert r.status_code == 201, r.text


def test_create_from_json_with_owner(client: TestClient) -> None:
    spec = {"task": "mnist1d", "budget": {"trials": 9}, "name": "json-study"}
    r = client.post(STUDIES, params={"owner": "alice"}, json=spec)
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["task"], body["name"], body["owner"]) == ("mnist1d", "json-study", "alice")
    assert body["progress"]["budget"] == 9


def test_invalid_field_is_422_with_field_path_and_reason(client: TestClient) -> None:
    r = client.post(STUDIES, content="task: digits\nbudget: {trials: 0}\n", headers=YAML)
    assert r.status_code == 422
    errors = field_errors(r.json())
    assert "budget.trials" in errors
    assert "greater than or equal to 1" in errors["budget.trials"]
    assert "budget.trials" in r.json()["error"]["message"]
    assert client.get(STUDIES).json()["total"] == 0  # nothing was created


def test_unknown_task_is_422_naming_the_known_tasks(client: TestClient) -> None:
    r = client.post(STUDIES, json={"task": "imagenet_from_url"})
    assert r.status_code == 422
    message = field_errors(r.json())["task"]
    assert "imagenet_from_url" in message
    for name in available_tasks():
        assert name in message


def test_unknown_and_nested_fields_are_named(client: TestClient) -> None:
    body = "task: digits\nbudgett: 3\nresources: {workers: 3}\nobjective: {kind: pareto, x: 1}\n"
    r = client.post(STUDIES, content=body, headers=YAML)
    assert r.status_code == 422
    errors = field_errors(r.json())
    assert "unknown field" in errors["budgett"]
    assert "unknown field" in errors["objective.x"]  # the discriminator tag is not in the path
    # A misspelt field names the closest known one.
    assert "did you mean `budget`?" in errors["budgett"]
    r = client.post(STUDIES, content="task: digits\nbudget: {trails: 6}\n", headers=YAML)
    assert "did you mean `budget.trials`?" in field_errors(r.json())["budget.trails"]


def test_a_yaml_body_sent_as_json_says_which_content_type_to_use(client: TestClient) -> None:
    r = client.post(
        STUDIES,
        content="task: digits\nbudget: {trials: 6}\n",
        headers={"Content-Type": "application/json"},
    )
    assert r.status_code == 422
    message = r.json()["error"]["message"]
    assert "not valid JSON" in message
    assert "it looks like YAML: send it with Content-Type: application/yaml" in message
    # Broken JSON that is no YAML mapping either gets no such hint.
    r = client.post(STUDIES, content='{"task": ', headers={"Content-Type": "application/json"})
    assert "looks like YAML" not in r.json()["error"]["message"]


def test_cross_field_problem_is_422_with_reason(client: TestClient) -> None:
    r = client.post(STUDIES, content="task: digits\nbudget: {trials: 2}\n", headers=YAML)
    assert r.status_code == 422
    assert "budget.trials (2) must exceed the 3 baseline" in r.json()["error"]["message"]


@pytest.mark.parametrize(
    ("body", "content_type", "needle"),
    [
        ("task: [digits\n", "application/yaml", "not valid YAML at line"),
        ('{"task": ', "application/json", "not valid JSON at line 1"),
        ("- task: digits\n", "application/yaml", "must be a mapping"),
        ("   \n", "application/yaml", "empty request body"),
        ("base: &b {task: digits}\nother: *b\n", "application/yaml", "aliases"),
    ],
)
def test_unparseable_bodies_are_422(
    client: TestClient, body: str, content_type: str, needle: str
) -> None:
    r = client.post(STUDIES, content=body, headers={"Content-Type": content_type})
    assert r.status_code == 422
    assert needle in error_message(r.json(), "validation_error")


def test_non_utf8_body_is_422(client: TestClient) -> None:
    r = client.post(STUDIES, content=b"task: \xff\xfe", headers=YAML)
    assert r.status_code == 422
    assert "UTF-8" in r.json()["error"]["message"]


def test_unsupported_content_type_is_415(client: TestClient) -> None:
    r = client.post(STUDIES, content="<task/>", headers={"Content-Type": "application/xml"})
    assert r.status_code == 415
    assert "application/yaml" in error_message(r.json(), "unsupported_media_type")


def test_a_study_of_another_metric_says_which(
    client: TestClient, store: StudyStore, regression_task: LinearRegression
) -> None:
    """The study's metric and its direction: from the spec and the task's declaration while
    the study is queued, from the summary the engine wrote once it finished."""
    text = f"task: {TASK_NAME}\nname: loss\nobjective: {{metric: val_loss}}\n"
    r = client.post(STUDIES, content=text, headers=YAML)
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["metric"], body["metric_direction"]) == ("val_loss", "min")
    primary = client.post(STUDIES, content=f"task: {TASK_NAME}\nname: mse\n", headers=YAML)
    assert (primary.json()["metric"], primary.json()["metric_direction"]) == ("val_mse", "min")
    listed = {s["name"]: s for s in client.get(STUDIES).json()["items"]}
    assert (listed["loss"]["metric"], listed["mse"]["metric"]) == ("val_loss", "val_mse")
    assert listed["mse"]["metric_direction"] == "min"

    claimed = store.claim_study("w", 60)
    assert claimed is not None
    assert claimed.id == body["id"]
    summary = {"objective": {"kind": "accuracy", "metric": "val_loss", "metric_direction": "min"}}
    store.finish_study(claimed.id, StudyStatus.COMPLETED, summary=summary, worker_id="w")
    done = client.get(f"{STUDIES}/{claimed.id}").json()
    assert (done["metric"], done["metric_direction"]) == ("val_loss", "min")
    assert done["summary"]["objective"]["metric"] == "val_loss"


# -- list ------------------------------------------------------------------------------------


def test_list_filters_paginates_and_counts(client: TestClient, store: StudyStore) -> None:
    ids = [new_study(store, name=f"s{i}", owner="bob" if i % 2 else "ann") for i in range(5)]
    other = new_study(store, name="other", task="mnist1d")
    claimed = store.claim_study("w1", 60)  # the oldest queued study
    assert claimed is not None
    assert claimed.id == ids[0]

    everything = client.get(STUDIES).json()
    assert everything["total"] == 6
    assert [s["id"] for s in everything["items"]] == [other, *reversed(ids)]  # newest first

    page = client.get(STUDIES, params={"limit": 2, "offset": 2}).json()
    assert (page["total"], page["limit"], page["offset"]) == (6, 2, 2)
    assert [s["id"] for s in page["items"]] == [ids[3], ids[2]]
    assert client.get(STUDIES, params={"offset": 6}).json()["items"] == []

    bob = client.get(STUDIES, params={"owner": "bob"}).json()
    assert sorted(s["id"] for s in bob["items"]) == [ids[1], ids[3]]
    assert bob["total"] == 2
    assert {(s["metric"], s["metric_direction"]) for s in everything["items"]} == {
        ("val_accuracy", "max")
    }

    mnist = client.get(STUDIES, params={"task": "mnist1d"}).json()
    assert [s["id"] for s in mnist["items"]] == [other]

    running = client.get(STUDIES, params={"status": "running"}).json()
    assert [s["id"] for s in running["items"]] == [ids[0]]
    assert running["items"][0]["worker_id"] == "w1"
    both = client.get(STUDIES, params=[("status", "running"), ("status", "queued")]).json()
    assert both["total"] == 6
    assert "spec" not in everything["items"][0]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"status": "sleeping"}, "status[0]"),
        ({"limit": 0}, "limit"),
        ({"limit": 100_000}, "limit"),
        ({"offset": -1}, "offset"),
        ({"task": "a\x00b"}, "task"),
    ],
)
def test_list_rejects_bad_query_parameters(
    client: TestClient, params: dict[str, object], field: str
) -> None:
    r = client.get(STUDIES, params=params)
    assert r.status_code == 422
    assert field in field_errors(r.json())


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ([("limit", "5"), ("limit", "abc"), ("limit", "100")], "limit"),
        ([("limit", "5"), ("limit", "5")], "limit"),
        ([("owner", "ann"), ("owner", "bob")], "owner"),
        ([("status", "queued"), ("offset", "1"), ("offset", "2")], "offset"),
    ],
)
def test_a_repeated_single_valued_parameter_is_422_not_its_last_value(
    client: TestClient, store: StudyStore, params: list[tuple[str, str]], field: str
) -> None:
    """Only the repeatable filters (``status``) may repeat; ``?limit=5&limit=abc&limit=100``
    used to list 100 studies, silently dropping the rest."""
    new_study(store, name="s")
    r = client.get(STUDIES, params=params)
    assert r.status_code == 422, r.text
    body = r.json()
    assert field_errors(body)[field].startswith(f"given {sum(k == field for k, _ in params)} times")
    assert field in body["error"]["message"]


# -- get -------------------------------------------------------------------------------------


def test_a_seed_robust_baseline_result_says_what_it_is(
    client: TestClient, store: StudyStore
) -> None:
    """The study's result is the small-batch baseline, picked on 3 fresh seeds: its best
    names the baseline, and its value is the mean with the spread."""
    seeded = seed_running_study(store, worker_id="w-seeds")
    baseline = store.get_trial(seeded.study_id, 0)
    store.set_best(seeded.study_id, baseline.id, 0.85)
    stats = {"seeds": [7919, 15838, 23757], "mean": 0.85, "std": 0.012}
    store.finish_study(
        seeded.study_id,
        "completed",
        summary={"best": {"number": 0, "baseline": "small_batch", "seeds": stats}},
        worker_id="w-seeds",
    )
    for body in (
        client.get(f"{STUDIES}/{seeded.study_id}").json(),
        next(s for s in client.get(STUDIES).json()["items"] if s["id"] == seeded.study_id),
    ):
        best = body["best"]
        assert (best["number"], best["baseline"], best["value"]) == (0, "small_batch", 0.85)
        assert (best["seeds"], best["std"]) == (3, 0.012)


def test_get_shows_progress_best_trial_and_timestamps(
    client: TestClient, store: StudyStore
) -> None:
    seeded = seed_running_study(store)
    body = client.get(f"{STUDIES}/{seeded.study_id}").json()
    assert body["status"] == "running"
    assert body["progress"] == {
        "budget": 6,
        "trials_done": 3,
        "trials_running": 1,
        "trials_remaining": 2,
    }
    assert body["best"] == {
        "number": 1,
        "value": 0.9,
        "schedule_summary": "32@0-2 -> 128@2-4",
        "baseline": None,
        "seeds": None,
        "std": None,
    }
    assert body["started_at"] is not None
    assert body["heartbeat_at"] is not None
    assert body["attempts"] == 1


def test_get_shows_the_error_of_a_failed_study(client: TestClient, store: StudyStore) -> None:
    study_id = new_study(store)
    store.claim_study("w", 60)
    store.finish_study(study_id, StudyStatus.FAILED, error="task exploded: out of memory")
    body = client.get(f"{STUDIES}/{study_id}").json()
    assert body["status"] == "failed"
    assert body["error"] == "task exploded: out of memory"
    assert body["finished_at"] is not None


def test_unknown_study_is_404(client: TestClient) -> None:
    for path in ("", "/trials", "/metrics", "/schedule.yaml", "/trials/0", "/trials/0/metrics"):
        r = client.get(f"{STUDIES}/4242{path}")
        assert r.status_code == 404, path
        assert "4242" in error_message(r.json(), "not_found")
    assert client.post(f"{STUDIES}/4242/cancel").status_code == 404
    assert client.delete(f"{STUDIES}/4242").status_code == 404


@pytest.mark.parametrize("study_id", ["abc", "0", str(2**40)])
def test_malformed_study_id_is_422(client: TestClient, study_id: str) -> None:
    r = client.get(f"{STUDIES}/{study_id}")
    assert r.status_code == 422
    assert "study_id" in field_errors(r.json())


# -- cancel / delete ---------------------------------------------------------------------------


def test_cancel_queued_running_and_finished(client: TestClient, store: StudyStore) -> None:
    running = new_study(store, name="running")
    queued = new_study(store, name="queued")
    assert store.claim_study("w", 60) is not None  # claims the older one

    r = client.post(f"{STUDIES}/{queued}/cancel")
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["cancel_requested"]) == ("cancelled", True)

    r = client.post(f"{STUDIES}/{running}/cancel")
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["cancel_requested"]) == ("running", True)
    assert store.get_study(running).cancel_requested

    r = client.post(f"{STUDIES}/{queued}/cancel")
    assert r.status_code == 409
    assert "already cancelled" in error_message(r.json(), "invalid_state")


def test_delete_is_409_while_running_and_204_after(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    r = client.delete(f"{STUDIES}/{seeded.study_id}")
    assert r.status_code == 409
    assert "running" in error_message(r.json(), "invalid_state")
    assert client.get(f"{STUDIES}/{seeded.study_id}").status_code == 200

    store.finish_study(seeded.study_id, StudyStatus.COMPLETED)
    r = client.delete(f"{STUDIES}/{seeded.study_id}")
    assert r.status_code == 204
    assert r.content == b""
    assert client.get(f"{STUDIES}/{seeded.study_id}").status_code == 404
    assert client.get(f"{STUDIES}/{seeded.study_id}/trials/0").status_code == 404


# -- schedule downloads ------------------------------------------------------------------------


def test_best_schedule_is_409_until_a_trial_has_finished(
    client: TestClient, store: StudyStore
) -> None:
    study_id = new_study(store)
    r = client.get(f"{STUDIES}/{study_id}/schedule.yaml")
    assert r.status_code == 409
    assert "no finished trial yet" in error_message(r.json(), "no_best_trial")


def test_best_schedule_yaml_downloads_and_loads_back(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    r = client.get(f"{STUDIES}/{seeded.study_id}/schedule.yaml")
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("application/yaml")
    assert r.headers["content-disposition"] == (
        f'attachment; filename="study-{seeded.study_id}-best.yaml"'
    )
    schedule = Schedule.from_yaml(r.text)
    assert schedule.summary() == "32@0-2 -> 128@2-4"
    assert schedule.provenance is not None
    assert schedule.provenance["study_id"] == seeded.study_id
    assert schedule.provenance["trial_number"] == seeded.best_number


def test_trial_schedule_yaml(client: TestClient, store: StudyStore) -> None:
    seeded = seed_running_study(store)
    r = client.get(f"{STUDIES}/{seeded.study_id}/trials/2/schedule.yaml")
    assert r.status_code == 200
    assert r.headers["content-disposition"].endswith(f'"study-{seeded.study_id}-trial-2.yaml"')
    assert Schedule.from_yaml(r.text).to_dict()["stages"] == schedule_dict(64, 256)["stages"]

    r = client.get(f"{STUDIES}/{seeded.study_id}/trials/{seeded.running_number}/schedule.yaml")
    assert r.status_code == 409
    assert "still running" in error_message(r.json(), "invalid_state")

    r = client.get(f"{STUDIES}/{seeded.study_id}/trials/99/schedule.yaml")
    assert r.status_code == 404


def test_spec_round_trips_as_json(client: TestClient) -> None:
    spec = yaml.safe_load(SPEC_YAML)
    created = client.post(
        STUDIES, content=json.dumps(spec), headers={"Content-Type": "application/json"}
    )
    assert created.status_code == 201
    stored = created.json()["spec"]
    resubmitted = client.post(STUDIES, json=stored)
    assert resubmitted.status_code == 201
    assert resubmitted.json()["spec"] == stored
