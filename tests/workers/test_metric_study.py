"""A study that minimises its task's validation loss, end to end: the language-model task
(``tinylm``: its primary metric is ``val_loss``) tuned by the real engine (Ray Tune, Optuna,
ASHA on cooldown probes, seed-robust picks), then read back through the store, the dashboard's
data endpoint and the REST API, and exported."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from tests.api.conftest import make_settings, open_client
from tests.seed_pick import checked_pick
from tuner.spec import StudySpec
from tuner.store import StudyStatus, StudyStore, TrialStatus
from workers.runner import tune_spec

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SPEC = """
task: tinylm
task_options: {num_train_sequences: 256, num_val_sequences: 64, num_test_sequences: 64,
               width: 32, num_layers: 1}
name: lm-loss
schedule: {total_epochs: 2}
space:
  stages: {min: 1, max: 2}
  batch_size: {min: 16, max: 128}
objective: {metric: val_loss}
budget: {trials: 5, seed_runs: 2, finalists: 1, reserve_finalists: 0}
resources: {workers: 1, cpus_per_worker: 1}
"""


def test_a_study_of_a_loss_metric_minimises_it_end_to_end(
    ray_session: None, sqlite_url: str, tmp_path: Path
) -> None:
    spec = StudySpec.from_yaml(SPEC)
    assert spec.objective.metric == "val_loss"  # also tinylm's primary metric
    assert spec.objective_metric() == ("val_loss", "min")
    out = tmp_path / "best.yaml"
    result = tune_spec(spec, sqlite_url, out, storage_path=tmp_path / "ray", quiet=True)

    store = StudyStore(sqlite_url)
    study = store.get_study(result.study_id)
    assert study.status is StudyStatus.COMPLETED
    summary = study.summary
    assert summary is not None
    assert summary["objective"]["metric"] == "val_loss"
    assert summary["objective"]["metric_direction"] == "min"
    assert summary["objective"]["names"] == ["val_loss"]
    assert summary["objective"]["directions"] == ["minimize"]

    # Every trial stores its final validation loss as its metric value, the loss of its last
    # epoch; the language model reports perplexity beside it (a task metric in the epoch's
    # extra).
    trials = store.list_trials(study.id).items
    for trial in trials:
        curve = store.trial_metrics(trial.id)
        assert curve, trial
        last_loss = curve[-1].val_loss
        assert last_loss is not None
        assert curve[-1].extra["val_perplexity"] == pytest.approx(math.exp(last_loss))
        # and the loss's spread over the 64 validation sequences (how finely they read it)
        assert 0 < curve[-1].extra["val_loss_sd"] < last_loss
        if trial.status is TrialStatus.COMPLETED:
            assert trial.metric_value == trial.val_loss == curve[-1].val_loss
            assert trial.objective_values == {"val_loss": trial.metric_value}

    # The search's best run and the seed-robust pick minimise the loss: the finalists are
    # the lowest losses, and the pick is the lowest mean over the fresh seeds (or a cheaper
    # finalist within the seeds' noise of it, budget.tie_break's default).
    completed = [t for t in trials if t.status is TrialStatus.COMPLETED]
    seeded = summary["seed_runs"]
    finalists = seeded["finalists"]
    # The finalists' seed runs carry that spread too: the note's reading of the split.
    assert seeded["val_size"] == 64
    assert all(f["metric_sd"] is not None and f["metric_sd"] > 0 for f in finalists), finalists
    tuned = sorted(
        (t for t in completed if t.baseline is None), key=lambda t: (t.val_loss, t.steps)
    )
    bases = sorted(
        (t for t in completed if t.baseline is not None), key=lambda t: (t.val_loss, t.steps)
    )
    assert [f["number"] for f in finalists] == [tuned[0].number, bases[0].number]
    for f in finalists:
        assert f["metric"] == "val_loss"
        assert f["values"] == f["metric_values"] == f["val_loss"]
        assert None not in f["values"]
    picked = checked_pick(seeded, minimize=True)  # the lowest mean, or cheaper within noise
    assert study.best_trial_number == picked["number"] == summary["best"]["number"]
    assert study.best_value == pytest.approx(picked["mean"])
    for row in summary["baselines"]:
        if row["number"] != picked["number"]:
            assert row["vs_best"]["metric_delta"] is not None
            assert row["vs_best"]["metric_delta"] == pytest.approx(
                summary["best"]["metric_value"] - row["metric_value"]
            )

    # The dashboard draws the loss: its curves are the stored losses, rows carry the metric.
    with open_client(make_settings(sqlite_url)) as client:
        data = client.get(f"/dashboard/data/studies/{study.id}").json()
        # The REST API names the metric and gives each trial's value of it.
        body = client.get(f"/api/v1/studies/{study.id}").json()
        assert (body["metric"], body["metric_direction"]) == ("val_loss", "min")
        listed = client.get(f"/api/v1/studies/{study.id}/trials").json()["items"]
        assert {t["number"]: t["metric_value"] for t in listed} == {
            t.number: t.metric_value for t in trials
        }
    objective = data["study"]["objective"]
    assert (objective["metric"], objective["metric_direction"]) == ("val_loss", "min")
    assert objective["label"] == "minimise final validation loss"
    rows = {row["number"]: row for row in data["trials"]}
    for trial in trials:
        losses = [m.val_loss for m in store.trial_metrics(trial.id)]
        assert data["curves"][str(trial.number)]["value"] == pytest.approx(losses, rel=1e-5)
        assert rows[trial.number]["metric_value"] == trial.metric_value

    # The exported schedule is the pick's, valid, with the loss it was picked on.
    exported = yaml.safe_load(out.read_text())
    assert exported["provenance"]["trial_number"] == picked["number"]
    assert exported["provenance"]["objective"]["kind"] == "accuracy"
    best_trial = next(t for t in trials if t.number == picked["number"])
    assert exported["provenance"]["metrics"]["metric"] == "val_loss"
    assert exported["provenance"]["metrics"]["metric_value"] == best_trial.metric_value
