"""The dashboard's routes through the app (SQLite and PostgreSQL): pages, page data, live
updates, assets and their caching, parameter importance from the Optuna storage, auth."""

from __future__ import annotations

import json
import re
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from api.dashboard import plotly_js_path
from tests.api.conftest import Seeded, make_settings, open_client, seed_running_study
from tuner.spec import StudySpec
from tuner.store import StudyStore

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient


def embedded_data(html: str) -> dict[str, Any]:
    match = re.search(r'<script type="application/json" id="study-data">(.*?)</script>', html, re.S)
    assert match is not None, "the study page embeds its data"
    data: dict[str, Any] = json.loads(match.group(1))
    return data


@pytest.fixture
def seeded(store: StudyStore) -> Seeded:
    return seed_running_study(store)


# -- pages -----------------------------------------------------------------------------------------


def test_studies_page_lists_studies_with_progress(client: TestClient, seeded: Seeded) -> None:
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    html = response.text
    assert f'href="/studies/{seeded.study_id}"' in html
    assert 'class="badge badge-running"' in html
    assert "3 / 6" in html  # trials done / budget
    assert "1 running" in html
    assert "90.00%" in html  # the best so far
    assert 'data-live="true"' in html  # refreshes itself while a study runs


def test_studies_page_without_studies(client: TestClient) -> None:
    html = client.get("/").text
    assert "No studies yet" in html
    assert 'data-live="false"' in html


def test_study_page_embeds_all_its_data(client: TestClient, seeded: Seeded) -> None:
    response = client.get(f"/studies/{seeded.study_id}")
    assert response.status_code == 200
    assert response.headers["cache-control"] == "no-store"
    data = embedded_data(response.text)
    assert data["study"]["id"] == seeded.study_id
    assert data["live"] is True
    assert [t["number"] for t in data["trials"]] == [0, 1, 2, 3]
    assert data["trials"][0]["baseline"] == "small_batch"
    assert data["trials"][2]["status"] == "diverged"
    assert data["curves"]["1"] == {"epoch": [1, 2], "value": [0.51, 0.61]}
    assert data["curves"]["3"]["epoch"] == [1]  # the running trial so far
    assert set(data["schedules"]) == {"0", "1"}  # the baseline and the best trial
    assert data["schedules"]["1"]["batch_sizes"] == [32, 128, 128]
    assert data["links"]["best_yaml"] == f"/api/v1/studies/{seeded.study_id}/schedule.yaml"
    # Everything the page loads comes from this server.
    assert "https://" not in response.text
    assert "http://" not in response.text
    for asset in re.findall(r'(?:src|href)="(/dashboard/static/[^"]+)"', response.text):
        assert client.get(asset).status_code == 200


def test_study_page_of_an_unknown_study_is_a_404_page(client: TestClient) -> None:
    response = client.get("/studies/999")
    assert response.status_code == 404
    assert "Study 999 does not exist" in response.text
    assert response.headers["content-type"].startswith("text/html")


def test_names_cannot_break_out_of_the_page(client: TestClient, store: StudyStore) -> None:
    evil = "</script><script>alert(1)</script>"
    study_id = store.create_study("digits", {"task": "digits"}, 3, name=evil).id
    page = client.get(f"/studies/{study_id}").text
    assert "<script>alert(1)" not in page
    assert embedded_data(page)["study"]["name"] == evil
    assert "<script>alert(1)" not in client.get("/").text


# -- page data and live updates --------------------------------------------------------------------


def test_page_data_endpoint_with_etag(
    client: TestClient, store: StudyStore, seeded: Seeded
) -> None:
    url = f"/dashboard/data/studies/{seeded.study_id}"
    first = client.get(url)
    assert first.status_code == 200
    data = first.json()
    assert data["incremental"] is False
    assert len(data["trials"]) == 4
    server_time = datetime.fromisoformat(first.headers["x-server-time"].replace("Z", "+00:00"))
    assert abs(server_time - datetime.now(UTC)) < timedelta(minutes=1)
    # Nothing changed (time passing changes nothing): 304 and no body.
    again = client.get(url, headers={"If-None-Match": first.headers["etag"]})
    assert again.status_code == 304
    assert again.content == b""
    store.add_epoch_metrics(
        store.get_trial(seeded.study_id, seeded.running_number).id, 1, {"val_accuracy": 0.7}
    )
    changed = client.get(url, headers={"If-None-Match": first.headers["etag"]})
    assert changed.status_code == 200
    assert changed.json()["curves"]["3"]["value"] == [0.53, 0.7]


def test_page_data_shows_forks_clones_and_probes_from_the_stored_epochs(
    client: TestClient, store: StudyStore
) -> None:
    """The search view's lanes come from what trials stored: a fork's replayed epochs, a PBT
    clone's copied ones (StudyStore.set_trial_schedule) and the cooldown probes."""
    spec = {"task": "digits", "schedule": {"total_epochs": 4}, "budget": {"trials": 3}}
    study = store.create_study("digits", spec, 3)
    assert store.claim_study("w", 60) is not None
    doc = {
        "version": 1,
        "base_lr": 0.1,
        "base_batch_size": 32,
        "stages": [
            {"start_epoch": 0, "end_epoch": 2, "batch_size": 32},
            {"start_epoch": 2, "end_epoch": 4, "batch_size": 64},
        ],
    }
    parent = store.create_trial(study.id, 0, doc, {})
    child = store.create_trial(study.id, 1, doc, {})
    clone = store.create_trial(study.id, 2, {**doc, "base_lr": 0.2}, {})
    for epoch in range(4):
        probe = {"probe_val_accuracy": 0.8} if epoch == 1 else {}
        store.add_epoch_metrics(parent.id, epoch, {"val_accuracy": 0.5, **probe})
        forked = {"replayed": epoch < 2, "forked_epochs": 2}
        store.add_epoch_metrics(child.id, epoch, {"val_accuracy": 0.5, **forked})
    store.add_epoch_metrics(clone.id, 0, {"val_accuracy": 0.1})
    store.set_trial_schedule(clone.id, doc, cloned_from=parent.id, clone_epoch=2)
    store.add_epoch_metrics(clone.id, 2, {"val_accuracy": 0.9})

    lanes = client.get(f"/dashboard/data/studies/{study.id}").json()["lanes"]
    assert lanes["0"] == {"segments": [[0, 4, "own", None]], "probes": [[2, 0.8]], "origin": None}
    assert lanes["1"]["segments"] == [[0, 2, "fork", 0], [2, 4, "own", None]]
    assert lanes["1"]["origin"] == "forked from #0 at epoch 2"
    assert lanes["2"]["segments"] == [[0, 2, "clone", 0], [2, 3, "own", None]]
    assert lanes["2"]["probes"] == [[2, 0.8]]  # the lineage's probe, copied with its epoch


def test_page_data_gives_the_small_batchs_step_floor_against_the_step_cap(
    client: TestClient, store: StudyStore
) -> None:
    """Beside the noise-scale curve the page says how few steps could match the small batch
    (tuner.noise_candidate.noise_scale_step_floor over its stored epochs) and whether the
    study's step cap is below that; a curve with a missing epoch gives no floor."""
    spec = {
        "task": "digits",
        "schedule": {"total_epochs": 3},
        "objective": {"kind": "accuracy", "max_steps": 40},
        "budget": {"trials": 2},
    }
    study = store.create_study("digits", spec, 2)
    assert store.claim_study("w", 60) is not None
    doc = {
        "version": 1,
        "base_lr": 0.1,
        "base_batch_size": 32,
        "stages": [{"start_epoch": 0, "end_epoch": 3, "batch_size": 32}],
    }
    small = store.create_trial(study.id, 0, doc, {}, baseline="small_batch")
    # 32 steps an epoch at batch 32, the noise scale 32, 96, then too noisy to measure.
    for epoch, noise in enumerate([32.0, 96.0, None]):
        metrics = {"val_accuracy": 0.5, "batch_size": 32, "steps": 32 * (epoch + 1)}
        store.add_epoch_metrics(small.id, epoch, {**metrics, "noise_scale": noise})
    url = f"/dashboard/data/studies/{study.id}"
    floor = client.get(url).json()["noise_scale"]["step_floor"]
    assert floor["floor"] == pytest.approx(32 / 2 + 32 / 4)
    assert (floor["steps"], floor["measured_epochs"], floor["epochs"]) == (96, 2, 3)
    assert floor["ratio"] == pytest.approx(4.0)
    # The cap of 40 steps is above the floor of 24: no warning.
    assert (floor["step_cap"], floor["cap_below_floor"]) == (40, False)

    capped = store.create_study("digits", {**spec, "objective": {"max_steps": 20}}, 2)
    assert store.claim_study("w", 60) is not None
    again = store.create_trial(capped.id, 0, doc, {}, baseline="small_batch")
    for epoch in (0, 2):  # epoch 1 never stored: the steps between are not one epoch's
        metrics = {"batch_size": 32, "steps": 32 * (epoch + 1), "noise_scale": 32.0}
        store.add_epoch_metrics(again.id, epoch, {"val_accuracy": 0.5, **metrics})
    noise = client.get(f"/dashboard/data/studies/{capped.id}").json()["noise_scale"]
    assert noise["value"] == [32.0, 32.0]
    assert noise["step_floor"] is None
    store.add_epoch_metrics(again.id, 1, {"val_accuracy": 0.5, "batch_size": 32, "steps": 64})
    floor = client.get(f"/dashboard/data/studies/{capped.id}").json()["noise_scale"]["step_floor"]
    assert floor["floor"] == pytest.approx(16 + 16)  # epoch 1 has no measurement
    assert (floor["step_cap"], floor["cap_below_floor"]) == (20, True)
    # The sentence the page shows (tuner.noise_candidate.step_floor_text): the baseline is
    # still running, so it is the curve so far, and the cap is below the floor.
    assert "(#0) made in 96 steps so far takes at least ~32 steps" in floor["text"]
    assert floor["text"].endswith(
        "This study's step cap (20) is below the floor: expect its best schedule to fall "
        "short of the small batch."
    )


def test_page_data_since_returns_what_changed(
    client: TestClient, store: StudyStore, seeded: Seeded
) -> None:
    url = f"/dashboard/data/studies/{seeded.study_id}"
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    data = client.get(url, params={"since": later}).json()
    assert data["incremental"] is True
    assert [t["number"] for t in data["trials"]] == [seeded.running_number]
    assert data["trial_total"] == 4
    # A trial added afterwards is part of the next answer, with its curve.
    trial = store.create_trial(
        seeded.study_id, 4, {**store.get_trial(seeded.study_id, 0).schedule}, {}
    )
    store.add_epoch_metrics(trial.id, 0, {"val_accuracy": 0.42})
    data = client.get(url, params={"since": later}).json()
    assert [t["number"] for t in data["trials"]] == [3, 4]
    assert data["curves"]["4"]["value"] == [0.42]
    bad = client.get(url, params={"since": "yesterday"})
    assert bad.status_code == 422
    assert "ISO 8601" in bad.json()["error"]["message"]


def test_page_data_of_a_finished_study_is_not_live(
    client: TestClient, store: StudyStore, seeded: Seeded
) -> None:
    store.finish_study(seeded.study_id, "failed", error="worker lost")
    data = client.get(f"/dashboard/data/studies/{seeded.study_id}").json()
    assert data["live"] is False
    assert data["study"]["status"] == "failed"
    assert data["study"]["error"] == "worker lost"
    assert data["counts"]["failed"] == 1  # the running trial was failed with the study


def test_trial_schedule_picture(client: TestClient, seeded: Seeded) -> None:
    picture = client.get(f"/dashboard/data/studies/{seeded.study_id}/trials/2/schedule").json()
    assert picture["number"] == 2
    assert picture["batch_epochs"] == [0, 2, 4]
    assert picture["batch_sizes"] == [64, 256, 256]
    assert picture["summary"] == "64@0-2 -> 256@2-4"
    missing = client.get(f"/dashboard/data/studies/{seeded.study_id}/trials/99/schedule")
    assert missing.status_code == 404


def test_dashboard_routes_stay_out_of_the_openapi_document(client: TestClient) -> None:
    paths = client.get("/openapi.json").json()["paths"]
    assert not [p for p in paths if not p.startswith("/api/v1")]


# -- assets ----------------------------------------------------------------------------------------


def test_plotly_comes_from_the_installed_package_with_caching(client: TestClient) -> None:
    html = client.get("/").text
    assert "plotly" not in html  # the studies page draws no chart
    page = client.get("/studies/1").text  # a 404 page still links the assets it needs
    assert "dashboard.css" in page
    expected = plotly_js_path().read_bytes()
    plain = client.get("/dashboard/static/plotly.min.js", headers={"Accept-Encoding": "identity"})
    assert plain.status_code == 200
    assert plain.content == expected
    assert plain.headers["content-type"].startswith("text/javascript")
    assert plain.headers["cache-control"] == "public, max-age=300"
    etag = plain.headers["etag"]
    version = etag.strip('"')
    versioned = client.get(
        f"/dashboard/static/plotly.min.js?v={version}", headers={"Accept-Encoding": "gzip"}
    )
    assert versioned.headers["cache-control"] == "public, max-age=31536000, immutable"
    assert versioned.headers["content-encoding"] == "gzip"
    assert versioned.content == expected  # httpx decodes it
    assert int(versioned.headers["content-length"]) < len(expected) / 2
    cached = client.get("/dashboard/static/plotly.min.js", headers={"If-None-Match": etag})
    assert cached.status_code == 304


def test_own_assets_and_unknown_ones(client: TestClient) -> None:
    js = client.get("/dashboard/static/dashboard.js")
    assert js.status_code == 200
    assert b"Plotly.react" in js.content
    assert client.get("/dashboard/static/dashboard.css").status_code == 200
    assert client.get("/dashboard/static/../app.py").status_code == 404
    assert client.get("/dashboard/static/secret.txt").status_code == 404


def test_pages_follow_read_auth_but_assets_do_not(url: str, seeded: Seeded) -> None:
    settings = make_settings(url, tokens=["s3cret"], protect_reads=True)
    with open_client(settings) as client:
        assert client.get("/").status_code == 401
        assert client.get(f"/studies/{seeded.study_id}").status_code == 401
        assert client.get(f"/dashboard/data/studies/{seeded.study_id}").status_code == 401
        assert client.get("/dashboard/static/dashboard.js").status_code == 200
        auth = {"Authorization": "Bearer s3cret"}
        assert client.get("/", headers=auth).status_code == 200
        assert client.get(f"/studies/{seeded.study_id}", headers=auth).status_code == 200


def test_responses_are_compressed_for_browsers(client: TestClient, seeded: Seeded) -> None:
    response = client.get(f"/studies/{seeded.study_id}", headers={"Accept-Encoding": "gzip"})
    assert response.headers["content-encoding"] == "gzip"
    assert embedded_data(response.text)["study"]["id"] == seeded.study_id
    raw = client.get(f"/studies/{seeded.study_id}", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in raw.headers
    assert embedded_data(raw.text)["study"]["id"] == seeded.study_id


# -- parameter importance --------------------------------------------------------------------------


def _optuna_study(url: str, name: str, n: int) -> None:
    """An Optuna study (maximise) in the database at ``url``, as the engine leaves one."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = optuna.storages.RDBStorage(url)
    try:
        _fill_optuna_study(
            optuna.create_study(
                storage=storage,
                study_name=name,
                direction="maximize",
                sampler=optuna.samplers.RandomSampler(seed=3),
            ),
            n,
        )
    finally:
        storage.engine.dispose()


def _fill_optuna_study(study: Any, n: int) -> None:
    """``n`` trials whose value depends on ``batch_exp_0`` alone, and an infeasible one."""
    study.set_user_attr("stagetune_objective", ["val_accuracy"])
    for _ in range(n):
        trial = study.ask()
        exp = trial.suggest_int("batch_exp_0", 5, 10)
        mult = trial.suggest_float("lr_mult_0", 0.25, 4.0, log=True)
        noise = trial.suggest_float("warmup_0", 0.0, 1.0)
        study.tell(trial, 0.95 - 0.01 * exp + 0.0001 * mult + 0.00001 * noise)
    infeasible = study.ask()
    infeasible.suggest_int("batch_exp_0", 5, 10)
    infeasible.set_user_attr("stagetune_infeasible", True)
    study.tell(infeasible, -1.0)


def test_importance_without_optuna_storage(client: TestClient, seeded: Seeded) -> None:
    result = client.get(f"/dashboard/data/studies/{seeded.study_id}/importance").json()
    assert result["available"] is False
    assert "no Optuna" in result["note"]


def test_importance_of_a_pbt_study_says_pbt_samples_nothing_from_optuna(
    client: TestClient, store: StudyStore
) -> None:
    """A finished PBT study has no Optuna study; the panel said there was "no Optuna storage
    in this database yet", as if one were still to come."""
    spec = StudySpec.from_yaml(
        "task: digits\nname: pbt\nschedule: {total_epochs: 4}\nbudget: {trials: 8, search: pbt}"
    )
    study_id = store.create_study("digits", spec.to_dict(), 8, name="pbt").id
    result = client.get(f"/dashboard/data/studies/{study_id}/importance").json()
    assert result["available"] is False
    assert result["note"].startswith("a PBT study samples no schedules from Optuna")


def test_importance_from_the_optuna_study_in_the_same_database(
    client: TestClient, url: str, seeded: Seeded
) -> None:
    _optuna_study(url, f"stagetune-study-{seeded.study_id}", 30)
    result = client.get(f"/dashboard/data/studies/{seeded.study_id}/importance").json()
    assert result["available"] is True, result
    assert result["n_trials"] == 30  # the infeasible trial is left out
    ranking = result["objectives"][0]["params"]
    assert ranking[0]["name"] == "batch_exp_0"  # the accuracy depends on it alone
    assert sum(p["importance"] for p in ranking) == pytest.approx(1.0, abs=1e-3)
    again = client.get(f"/dashboard/data/studies/{seeded.study_id}/importance").json()
    assert again["cached"] is True
    assert again["objectives"] == result["objectives"]


def test_importance_needs_enough_trials(client: TestClient, url: str, seeded: Seeded) -> None:
    _optuna_study(url, f"stagetune-study-{seeded.study_id}", 3)
    result = client.get(f"/dashboard/data/studies/{seeded.study_id}/importance").json()
    assert result["available"] is False
    assert "at least 5" in result["note"]
    assert result["n_trials"] == 3
    # A running study may get there; the wording says which.
    assert result["note"].endswith("this study has 3 so far. Baselines are not in the Optuna study")


def test_importance_counts_trials_asha_stopped_at_their_last_epoch(
    client: TestClient, url: str, seeded: Seeded
) -> None:
    """The README's own example: 8 trials, 3 of them baselines, ASHA stops some of the five
    tuned ones. Stopped trials count with the accuracy of their last reported epoch, so the
    panel shows, and its note says which trials it used."""
    import optuna

    storage = optuna.storages.RDBStorage(url)
    try:
        study = optuna.create_study(
            storage=storage, study_name=f"stagetune-study-{seeded.study_id}", direction="maximize"
        )
        study.set_user_attr("stagetune_objective", ["val_accuracy"])
        for i in range(5):
            trial = study.ask()
            exp = trial.suggest_int("batch_exp_0", 5, 10)
            trial.suggest_float("lr_mult_0", 0.25, 4.0, log=True)
            for epoch in range(2 if i < 2 else 4):
                trial.report(0.5 + 0.05 * epoch - 0.01 * exp, epoch)
            if i < 2:
                study.tell(trial, state=optuna.trial.TrialState.PRUNED)
            else:
                study.tell(trial, 0.7 - 0.01 * exp)
    finally:
        storage.engine.dispose()
    result = client.get(f"/dashboard/data/studies/{seeded.study_id}/importance").json()
    assert result["available"] is True, result
    assert result["n_trials"] == 5
    assert result["n_stopped"] == 2
    assert "3 completed and 2 stopped early" in result["note"]
