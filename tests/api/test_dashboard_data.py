"""The dashboard's data builders (:mod:`api.dashboard_data`): pure functions on records."""

from __future__ import annotations

import math
import random
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from api import dashboard_data as dd
from tuner.schedule import Schedule, Stage
from tuner.store import EpochMetrics, StudyRecord, StudyStatus, TrialRecord, TrialStatus

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def study(**kw: Any) -> StudyRecord:
    fields: dict[str, Any] = {
        "id": 7,
        "name": "sweep",
        "owner": None,
        "task": "digits",
        "spec": {"objective": {"kind": "accuracy"}, "schedule": {"total_epochs": 6}},
        "status": StudyStatus.RUNNING,
        "cancel_requested": False,
        "budget": 10,
        "created_at": NOW - timedelta(hours=1),
        "started_at": NOW - timedelta(minutes=30),
        "finished_at": None,
        "heartbeat_at": NOW,
        "worker_id": "w1",
        "attempts": 1,
        "error": None,
        "best_trial_id": None,
        "best_trial_number": None,
        "best_value": None,
        "summary": None,
        "trials_done": 0,
        "trials_running": 0,
    }
    fields.update(kw)
    return StudyRecord(**fields)


def schedule(*stages: tuple[int, int, int], **kw: Any) -> Schedule:
    return Schedule(
        stages=tuple(Stage(start_epoch=a, end_epoch=b, batch_size=c) for a, b, c in stages),
        base_lr=0.1,
        base_batch_size=stages[0][2],
        **kw,
    )


def trial(number: int, **kw: Any) -> TrialRecord:
    fields: dict[str, Any] = {
        "id": 100 + number,
        "study_id": 7,
        "number": number,
        "baseline": None,
        "schedule": schedule((0, 2, 32), (2, 6, 128)).to_dict(),
        "params": {},
        "status": TrialStatus.COMPLETED,
        "stop_reason": None,
        "started_at": NOW - timedelta(minutes=20),
        "finished_at": NOW - timedelta(minutes=10),
        "epochs_done": 6,
        "val_accuracy": 0.9,
        "val_loss": 0.3,
        "steps": 1000,
        "samples": 64_000,
        "wall_time_s": 100.0,
        "mean_batch_size": 64.0,
        "objective_values": None,
    }
    fields.update(kw)
    return TrialRecord(**fields)


def metrics(trial_id: int, epoch: int, acc: float | None) -> EpochMetrics:
    return EpochMetrics(
        trial_id, epoch, acc, None, None, None, None, None, None, None, None, None, {}
    )


# -- formatting and objectives ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (None, "—"),
        (-1.0, "—"),
        (math.nan, "—"),
        (0, "0s"),
        (0.0432, "0.043s"),
        (0.4, "0.40s"),
        (3.24, "3.2s"),
        (9.96, "10s"),
        (42, "42s"),
        (187, "3m 07s"),
        (7500, "2h 05m"),
        (90_000, "1d 01h"),
    ],
)
def test_format_duration(seconds: float | None, text: str) -> None:
    assert dd.format_duration(seconds) == text


def test_format_objective_follows_the_value_name() -> None:
    assert dd.format_objective(0.93456, "val_accuracy") == "93.46%"
    assert dd.format_objective(12345.0, "steps_to_target") == "12,345 steps"
    assert dd.format_objective(125.0, "wall_time_to_target") == "2m 05s"
    assert dd.format_objective(None, "val_accuracy") == "—"


def test_objective_info_for_each_kind() -> None:
    acc = dd.objective_info({"objective": {"kind": "accuracy", "max_mean_batch_size": 512}})
    assert acc["names"] == ["val_accuracy"]
    assert acc["directions"] == ["maximize"]
    assert "mean batch ≤ 512" in acc["label"]
    tta = dd.objective_info(
        {"objective": {"kind": "time_to_accuracy", "target_accuracy": 0.9, "cost": "wall_time"}}
    )
    assert tta["names"] == ["wall_time_to_target"]
    assert tta["directions"] == ["minimize"]
    assert "90.0%" in tta["label"]
    pareto = dd.objective_info({"objective": {"kind": "pareto", "cost": "steps"}})
    assert pareto["names"] == ["val_accuracy", "steps"]
    assert dd.objective_info({})["kind"] == "accuracy"  # a spec without objective


def test_study_row_progress_and_elapsed() -> None:
    row = dd.study_row(study(trials_done=3, trials_running=2, best_value=0.91234), NOW)
    assert (row["done_pct"], row["running_pct"]) == (30.0, 20.0)
    assert row["best_text"] == "91.23%"
    assert row["elapsed_text"] == "30m 00s"
    done = study(
        status=StudyStatus.COMPLETED, finished_at=NOW - timedelta(minutes=5), trials_done=12
    )
    row = dd.study_row(done, NOW)
    assert row["done_pct"] == 100.0
    assert row["running_pct"] == 0.0
    assert row["elapsed_s"] == 25 * 60
    assert row["finished"] is True
    assert dd.study_row(study(started_at=None), NOW)["elapsed_text"] == "—"


# -- schedule pictures ----------------------------------------------------------------------------


def _interpolate(xs: list[float], ys: list[float], x: float) -> float:
    """The value a straight-line plot of the points shows at ``x`` (right side of a jump)."""
    for i in range(len(xs) - 1, 0, -1):
        if xs[i - 1] <= x <= xs[i] and xs[i] > xs[i - 1]:
            t = (x - xs[i - 1]) / (xs[i] - xs[i - 1])
            return ys[i - 1] + t * (ys[i] - ys[i - 1])
    raise AssertionError(f"{x} outside the picture")


@pytest.mark.parametrize(
    "stages",
    [
        (Stage(0, 3, 64), Stage(3, 8, 256, warmup_epochs=1.5), Stage(8, 12, 1024, 0.5)),
        (Stage(0, 10, 128, decay="step", step_every_epochs=3, step_gamma=0.5),),
        (Stage(0, 4, 64, warmup_epochs=1), Stage(4, 12, 512, decay="cosine", warmup_epochs=2)),
        (Stage(0, 5, 32, decay="linear", decay_final_factor=0.1), Stage(5, 9, 64)),
    ],
)
def test_schedule_picture_draws_the_schedules_lr_and_batch(stages: tuple[Stage, ...]) -> None:
    sched = Schedule(stages=stages, base_lr=0.1, base_batch_size=64)
    picture = dd.schedule_picture(sched.to_dict())
    assert picture is not None
    assert picture["summary"] == sched.summary()
    assert picture["batch_epochs"] == [s.start_epoch for s in stages] + [stages[-1].end_epoch]
    assert picture["batch_sizes"][:-1] == [s.batch_size for s in stages]
    xs, ys = picture["lr_epochs"], picture["lrs"]
    assert xs == sorted(xs)
    assert xs[0] == 0
    assert xs[-1] == sched.total_epochs
    rng = random.Random(0)
    # Exact but for rounding, except a cosine: sampled, within 0.2 % of the peak LR.
    cosine = any(s.decay == "cosine" for s in stages)
    peak = max(sched.peak_lr(i) for i in range(sched.num_stages))
    tolerance = 0.002 * peak if cosine else 1e-5 * peak
    for x in [rng.uniform(0, sched.total_epochs - 1e-6) for _ in range(300)]:
        assert _interpolate(xs, ys, x) == pytest.approx(sched.lr_at(x), abs=tolerance)


def test_schedule_picture_of_an_invalid_schedule_is_none() -> None:
    assert dd.schedule_picture({"stages": []}) is None
    assert dd.schedule_summary({"version": 2}) is None
    assert dd.schedule_summary({"stages": [{"start_epoch": 0, "end_epoch": "x"}]}) is None


@pytest.mark.parametrize("seed", range(20))
def test_schedule_summary_reads_what_schedule_summary_says(seed: int) -> None:
    rng = random.Random(seed)
    bounds = sorted(rng.sample(range(1, 40), rng.randint(0, 4)))
    edges = [0, *bounds, 40]
    batches = sorted(2 ** rng.randint(4, 12) for _ in range(len(edges) - 1))
    sched = schedule(*[(a, b, c) for a, b, c in zip(edges, edges[1:], batches, strict=False)])
    assert dd.schedule_summary(sched.to_dict()) == sched.summary()


# -- the study page's data ------------------------------------------------------------------------


def test_compact_curve_counts_epochs_trained() -> None:
    store_answer = {4: [metrics(1, 0, 0.5), metrics(1, 1, None), metrics(1, 2, 0.71234567)]}
    curve = dd.compact_curve(dd.curves_of(store_answer)[4])
    assert curve["epoch"] == [1, 2, 3]
    assert curve["value"] == [0.5, None, 0.712346]  # 6 significant digits
    assert set(curve) == {"epoch", "value"}


def test_comparison_from_trials_while_running() -> None:
    trials = [
        trial(0, baseline="small_batch", val_accuracy=0.90, steps=1000, wall_time_s=200.0),
        trial(1, baseline="large_batch", val_accuracy=0.85, steps=100, wall_time_s=50.0),
        trial(2, val_accuracy=0.91, steps=250, wall_time_s=80.0, mean_batch_size=256.0),
        trial(3, baseline="increase_batch", status=TrialStatus.RUNNING, val_accuracy=None),
    ]
    rows = dd.comparison_rows(study(best_trial_number=2), trials)
    assert [(r["role"], r["number"]) for r in rows] == [
        ("best", 2),
        ("baseline", 0),
        ("baseline", 1),
    ]
    small = rows[1]["vs_best"]
    assert small["accuracy_delta"] == pytest.approx(0.01)
    assert small["steps_ratio"] == pytest.approx(0.25)
    assert small["wall_time_ratio"] == pytest.approx(0.4)
    assert small["mean_batch_size_ratio"] == pytest.approx(4.0)
    # A baseline that is the best: one row, the best one.
    rows = dd.comparison_rows(study(best_trial_number=0), trials)
    assert [(r["role"], r["number"]) for r in rows] == [("best", 0), ("baseline", 1)]
    # Before any best trial: the finished baselines, nothing to compare with.
    rows = dd.comparison_rows(study(), trials)
    assert [r["number"] for r in rows] == [0, 1]
    assert all(r["vs_best"] is None for r in rows)


def test_comparison_prefers_the_engines_summary() -> None:
    summary = {
        "best": {
            "number": 5,
            "baseline": None,
            "schedule_summary": "64@0-2 -> 512@2-6",
            "val_accuracy": 0.92,
            "steps": 300,
            "wall_time_s": 30.0,
            "mean_batch_size": 200.0,
        },
        "baselines": [
            {
                "number": 0,
                "baseline": "small_batch",
                "schedule_summary": "64@0-6",
                "val_accuracy": 0.91,
                "steps": 600,
                "wall_time_s": 60.0,
                "mean_batch_size": 64.0,
            },
        ],
    }
    rows = dd.comparison_rows(study(summary=summary, best_trial_number=5), [])
    assert rows[0]["summary"] == "64@0-2 -> 512@2-6"
    assert rows[0]["is_best"] is True
    assert rows[1]["vs_best"]["steps_ratio"] == pytest.approx(0.5)
    assert rows[1]["is_best"] is False


def test_a_baseline_outside_the_objective_says_so_in_the_comparison() -> None:
    """A capped study's small batch is trained for the comparison though it takes more steps
    than the cap; its row carries why it can never be the result (``outside``)."""
    best = {"number": 5, "baseline": None, "val_accuracy": 0.98, "steps": 465, "feasible": True}
    small = {
        "number": 0,
        "baseline": "small_batch",
        "val_accuracy": 0.986,
        "steps": 1560,
        "feasible": False,
        "violated": ["max_steps"],
    }
    capped = study(
        spec={"task": "mnist1d", "objective": {"kind": "accuracy", "max_steps": 500}},
        summary={"best": best, "baselines": [small]},
        best_trial_number=5,
    )
    rows = dd.comparison_rows(capped, [])
    assert rows[0]["outside"] is None
    assert rows[1]["outside"] == "1,560 steps, over the objective's 500"


def test_a_candidate_stopped_early_says_how_it_ended_in_the_comparison() -> None:
    """A recipe candidate ASHA stopped after its first rung has the accuracy and steps of the
    epochs it trained; its row carries how it ended (``ended``), a completed row nothing."""
    best = {"number": 5, "baseline": None, "val_accuracy": 0.986, "status": "completed"}
    small = {**best, "number": 0, "baseline": "small_batch", "val_accuracy": 0.988}
    stopped = {
        "number": 6,
        "baseline": None,
        "candidate": "fitted_constant",
        "val_accuracy": 0.8972,
        "steps": 78,
        "status": "stopped",
        "stop_reason": "stopped early after 2 of 10 epochs",
    }
    summary = {"best": best, "baselines": [small], "candidates": [stopped]}
    rows = dd.comparison_rows(study(summary=summary, best_trial_number=5), [])
    assert [(r["number"], r["ended"]) for r in rows] == [
        (5, None),
        (0, None),
        (6, "stopped early after 2 of 10 epochs"),
    ]


def test_study_page_data_has_every_trial_and_curve() -> None:
    trials = [trial(0, baseline="small_batch"), trial(1), trial(2, status=TrialStatus.RUNNING)]
    curves: dict[int, dd.Curve] = {0: [(0, 0.5)], 1: [(0, 0.6), (1, 0.7)], 2: []}
    data = dd.study_page_data(study(best_trial_number=1), trials, curves, now=NOW)
    assert data["incremental"] is False
    assert [t["number"] for t in data["trials"]] == [0, 1, 2]
    assert data["curves"]["1"]["value"] == [0.6, 0.7]
    assert data["curves"]["2"]["epoch"] == []
    assert set(data["schedules"]) == {"0", "1"}  # the baseline and the best trial
    assert data["counts"]["completed"] == 2
    assert data["counts"]["running"] == 1
    assert data["trials"][0]["summary"] == "32@0-2 -> 128@2-6"


def test_the_header_carries_a_finalist_that_ties_the_result_within_the_seeds_noise() -> None:
    """The engine's summary says when the runner-up finalist is as good as the result within
    the seeds' noise (``seed_runs.lead.note``); the study page shows that sentence beside the
    result, and nothing for a clear lead or a study without seed runs."""
    tie = (
        "Within the seeds' noise tuned trial 2 is as good: the pick leads it by 0.0003 ± 0.0014 "
        "validation accuracy over the same 3 fresh seeds; raise budget.seed_runs to tell them apart"
    )
    lead = {"runner_up": 2, "mean": 0.0003, "std": 0.0014, "seeds": 3, "clear": False}
    tied = study(
        summary={
            "note": "the result is tuned trial 12",
            "seed_runs": {"lead": {**lead, "note": tie}},
        }
    )
    assert dd.study_header(tied, NOW)["lead_note"] == tie
    assert dd.study_header(tied, NOW)["split_note"] is None
    # A lead finer than the validation split reads (tuner.objectives.split_resolution).
    split = "The validation split holds 2,000 samples: one run there reads accuracy to ..."
    fine = study(summary={"seed_runs": {"lead": {**lead, "note": tie, "split_note": split}}})
    assert dd.study_header(fine, NOW)["split_note"] == split
    # A pick made for fewer steps (budget.tie_break: fewer_steps) trails the best mean within
    # noise: never a clear lead, so its sentence is shown too.
    cheaper = "Picked for fewer optimizer steps within the seeds' noise: tuned trial 12 has ..."
    for_steps = {**lead, "mean": -0.0003, "for_steps": True, "note": cheaper}
    assert (
        dd.study_header(study(summary={"seed_runs": {"lead": for_steps}}), NOW)["lead_note"]
        == cheaper
    )
    clear = study(summary={"seed_runs": {"lead": {**lead, "clear": True, "note": None}}})
    assert dd.study_header(clear, NOW)["lead_note"] is None
    assert dd.study_header(study(summary={"seed_runs": None}), NOW)["lead_note"] is None
    assert dd.study_header(study(), NOW)["lead_note"] is None


def test_incremental_data_leaves_out_trials_finished_long_before() -> None:
    old = trial(0, finished_at=NOW - timedelta(hours=1))
    recent = trial(1, finished_at=NOW - timedelta(seconds=30))
    running = trial(2, status=TrialStatus.RUNNING, finished_at=None)
    data = dd.study_page_data(study(), [old, recent, running], {}, now=NOW, since=NOW)
    assert data["incremental"] is True
    assert [t["number"] for t in data["trials"]] == [1, 2]
    assert set(data["curves"]) == {"1", "2"}
    assert data["trial_total"] == 3


def test_page_data_changes_with_the_study_not_with_the_clock() -> None:
    """The page ticks the elapsed time itself, so polling a study where nothing happened
    gets the same bytes (and ETag) back."""
    trials = [trial(0)]
    first = dd.study_page_data(study(), trials, {}, now=NOW)
    later = dd.study_page_data(study(), trials, {}, now=NOW + timedelta(seconds=5))
    assert first == later
    assert "elapsed_s" not in first["study"]
    changed = dd.study_page_data(study(), [trial(0, val_accuracy=0.95)], {}, now=NOW)
    assert changed != first
    assert dd.data_etag(b"a") != dd.data_etag(b"b")


def test_optuna_study_names_prefer_the_recorded_one() -> None:
    from tuner.optuna_storage import study_names

    assert study_names(study())[0] == "stagetune-study-7"
    names = study_names(study(summary={"optuna_study": "custom"}))
    assert names[:2] == ["custom", "stagetune-study-7"]


def test_a_search_lane_names_the_trial_a_fork_or_a_clone_took_its_epochs_from() -> None:
    """Trial 4 forked at epoch 2 from the prefix trial 1 trained first (trial 3 shares it but
    started later; trial 2's first stage differs); trial 5 took trial 4's epochs 0-1 and then
    trial 3's 2-3 (two PBT clones). Probes are placed after their epoch, like the curves."""
    t0 = NOW - timedelta(minutes=30)
    shared = schedule((0, 2, 32), (2, 6, 128)).to_dict()
    other_tail = schedule((0, 2, 32), (2, 6, 256)).to_dict()
    trials = [
        trial(1, schedule=shared, started_at=t0),
        trial(2, schedule=schedule((0, 2, 64), (2, 6, 128)).to_dict(), started_at=t0),
        trial(3, schedule=other_tail, started_at=t0 + timedelta(minutes=1)),
        trial(4, schedule=other_tail, started_at=t0 + timedelta(minutes=2)),
        trial(5, started_at=t0 + timedelta(minutes=3)),
    ]
    assert dd.fork_parent(trials[3], 2, trials) == 1
    assert dd.fork_parent(trials[3], 3, trials) is None  # no boundary at epoch 3
    forked = [dd.EpochOrigin(e, replayed=e < 2, forked_epochs=2) for e in range(6)]
    forked[1] = dd.EpochOrigin(1, replayed=True, forked_epochs=2, probe=0.71234567)
    lane = dd.search_lane(trials[3], forked, trials)
    assert lane["segments"] == [[0, 2, "fork", 1], [2, 6, "own", None]]
    assert lane["probes"] == [[2, 0.712346]]
    assert lane["origin"] == "forked from #1 at epoch 2"

    cloned = [
        dd.EpochOrigin(0, cloned_from=4, replayed=True, forked_epochs=2),
        dd.EpochOrigin(1, cloned_from=4),
        dd.EpochOrigin(2, cloned_from=3),
        dd.EpochOrigin(3, cloned_from=3, probe=math.nan),
        dd.EpochOrigin(4),
    ]
    lane = dd.search_lane(trials[4], cloned, trials)
    assert lane["segments"] == [[0, 2, "clone", 4], [2, 4, "clone", 3], [4, 5, "own", None]]
    assert lane["probes"] == []
    assert lane["origin"] == ("epochs 1-2 cloned from #4 (PBT); epochs 3-4 cloned from #3 (PBT)")
    plain = dd.search_lane(trials[0], [dd.EpochOrigin(e) for e in range(3)], trials)
    assert plain == {"segments": [[0, 3, "own", None]], "probes": [], "origin": None}


def test_every_named_candidate_has_a_display_label_in_both_views() -> None:
    """The baselines, the recipe candidates and the noise-scale candidate are shown by name in
    the server-rendered tables and in the browser's plots; a new one without a label would be
    shown by its identifier in one view and described in the other."""
    from pathlib import Path

    from tuner.noise_candidate import NOISE_SCALE
    from tuner.recipes import LR_VARIANTS, RECIPES
    from tuner.spec import BASELINE_NAMES

    names = {*BASELINE_NAMES, *RECIPES, *LR_VARIANTS, NOISE_SCALE}
    assert names <= set(dd.BASELINE_LABELS), names - set(dd.BASELINE_LABELS)
    js = (Path(dd.__file__).parent / "static" / "dashboard.js").read_text("utf-8")
    for name, label in dd.BASELINE_LABELS.items():
        assert f'{name}: "{label}"' in js, name
