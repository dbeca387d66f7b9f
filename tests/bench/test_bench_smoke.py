"""Smoke runs of the benchmark scripts (``bench/schedule_quality.py``,
``bench/tuning_efficiency.py``): their ``--smoke`` mode (digits, 2 epochs, 1 seed, 3 trials;
schedule quality on tinylm's validation loss too) produces every figure (JSON keys, markdown
table, PNG, the summary line); and the fork-cost and experiment-start parts of
``bench/trial_overhead.py``. Targets are not checked here: they need the full runs (see
``bench/README.md``)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

# The smokes that run Ray (the session's instance, or their own) are marked ``ray``; those
# that train in this process only are ``ray_free``, so `make test` runs them beside the Ray
# tests.
pytestmark = [pytest.mark.slow]


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCH / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _last_line(out: str) -> str:
    return [line for line in out.splitlines() if line.strip()][-1]


def _fields(line: str, prefix: str) -> dict[str, str]:
    assert line.startswith(prefix + " "), line
    return dict(re.findall(r"(\w+)=(\S+)", line))


def _png(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 5_000


@pytest.mark.ray
def test_schedule_quality_smoke(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    module = _load("schedule_quality")
    data = module.main(["--smoke", "--results-dir", str(tmp_path)])
    line = _last_line(capsys.readouterr().out)
    fields = _fields(line, "quality")
    assert set(fields) == {
        "task",
        "dominated",
        "steps_ratio_at_small_acc",
        "tuned_acc",
        "small_acc",
        "small_std",
        "tuned_steps",
        "small_steps",
        "steps_ratio",
        "best_baseline",
        "best_baseline_acc",
        "large_batch_gap",
    }
    assert fields["task"] == "digits"
    assert 0 <= float(fields["tuned_acc"]) <= 100
    assert int(fields["small_steps"]) > int(fields["tuned_steps"]) > 0

    saved = json.loads((tmp_path / "schedule_quality_smoke.json").read_text())
    assert saved["summary_line"] == line
    assert {"config", "tuning", "rows", "targets", "machine"} <= set(saved)
    labels = [row["schedule"] for row in saved["rows"]]
    recipes = ["small_batch", "large_linear", "large_sqrt", "increase_batch", "linear_ramp"]
    # The smoke run's one extra study: under the cheapest recipe's steps (Goyal's).
    goyal = next(r for r in saved["rows"] if r["schedule"] == "large_linear")
    assert labels == [*recipes, "tuned", f"tuned@{goyal['steps']}"]
    cheap = saved["rows"][-1]
    assert cheap["steps"] <= goyal["steps"]
    # dominated=K/N counts the recipes some tuned schedule matches (within one std) at no
    # more steps.
    front = saved["targets"]["every_recipe_dominated"]
    assert fields["dominated"] == f"{front['dominated']}/5"
    rows = {r["schedule"]: r for r in saved["rows"]}
    gap = 100 * (rows["small_batch"]["test_acc_mean"] - rows["large_linear"]["test_acc_mean"])
    assert float(fields["large_batch_gap"]) == pytest.approx(gap, abs=0.006)
    for recipe, by in front["by"].items():
        r = rows[recipe]
        matched = [
            t
            for label, t in rows.items()
            if label.startswith("tuned")
            and t["steps"] <= r["steps"]
            and t["test_acc_mean"] >= r["test_acc_mean"] - r["test_acc_std"]
        ]
        assert (by is not None) == bool(matched), recipe
    for row in saved["rows"]:
        assert {"test_acc_mean", "test_acc_std", "steps", "mean_batch_size"} <= set(row)
        assert 0 <= row["test_acc_mean"] <= 1
        assert row["seeds"] == [1000]
    # The tuned schedule was retrained with the fresh seed from the study's YAML.
    assert saved["tuning"]["best_number"] is not None
    assert "schedule:" in saved["tuning"]["yaml"] or "stages" in saved["tuning"]["yaml"]
    assert set(saved["targets"]) == {
        "every_recipe_dominated",
        "small_acc_at_5x_fewer_steps",
        "within_small_batch_spread",
        "at_least_5x_fewer_steps",
        "above_every_large_batch_baseline",
    }
    assert data["rows"] == saved["rows"]

    md = (tmp_path / "schedule_quality_smoke.md").read_text()
    assert "| schedule |" in md
    assert "| **tuned** |" in md
    assert "Targets:" in md
    assert f"Large-batch gap of the task: {fields['large_batch_gap']} points" in md
    _png(tmp_path / "schedule_quality_smoke.png")


@pytest.mark.ray
def test_tuning_efficiency_smoke(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The four methods of the summary line's ratios, then the other two in a second run that
    takes those four studies from the first (``--reuse``), then a re-score of that file."""
    module = _load("tuning_efficiency")
    ratio_methods = ["default", "tpe_asha", "random", "pbt"]
    module.main(["--smoke", "--results-dir", str(tmp_path), "--methods", ",".join(ratio_methods)])
    line = _last_line(capsys.readouterr().out)
    fields = _fields(line, "efficiency")
    assert set(fields) == {
        "task",
        "default",
        "ratio_vs_random",
        "ratio_vs_tpe_asha",
        "ratio_vs_pbt",
    }
    assert fields["task"] == "digits"
    assert fields["default"] == "tpe+probes+prefixes+recipes"
    assert float(fields["ratio_vs_random"]) > 0
    assert float(fields["ratio_vs_tpe_asha"]) > 0
    assert float(fields["ratio_vs_pbt"]) > 0

    saved = json.loads((tmp_path / "tuning_efficiency_smoke.json").read_text())
    assert saved["summary_line"] == line
    markdown = (tmp_path / "tuning_efficiency_smoke.md").read_text().rstrip()
    assert markdown.endswith(f"```\n{line}\n```")  # the results page ends with its summary
    assert {"config", "best_known", "threshold", "methods", "ratio", "studies"} <= set(saved)
    assert list(saved["methods"]) == ratio_methods
    assert [s["method"] for s in saved["studies"]] == ratio_methods
    assert math.isnan(saved["ratio_stagewise_vs_random"])  # not run
    assert "to random: not run" in markdown

    # The stage-wise and probes-only searches; the other studies come from the first run, as
    # they were.
    again = tmp_path / "again"
    module.main(
        [
            "--smoke",
            "--results-dir",
            str(again),
            "--methods",
            "stagewise,tpe_asha_probes",
            "--reuse",
            str(tmp_path / "tuning_efficiency_smoke.json"),
        ]
    )
    rerun = json.loads((again / "tuning_efficiency_smoke.json").read_text())
    methods = ["default", "stagewise", "tpe_asha_probes", "tpe_asha", "random", "pbt"]
    assert list(rerun["methods"]) == methods
    assert [s["method"] for s in rerun["studies"]] == [
        *ratio_methods,
        "stagewise",
        "tpe_asha_probes",
    ]
    assert [s["trials"] for s in rerun["studies"][:4]] == [s["trials"] for s in saved["studies"]]
    assert rerun["reused"]["methods"] == ratio_methods
    assert "are those of an earlier run" in (again / "tuning_efficiency_smoke.md").read_text()

    for study in rerun["studies"]:
        spent = [p["trial_epochs"] for p in study["curve"]]
        assert spent == sorted(spent)
        assert spent[-1] == study["trial_epochs_total"]
    default, plain, random_study, pbt, stagewise, probed = rerun["studies"]
    # The cooldown probes (after epoch 1 of 2, ASHA's rung) are counted as compute; the
    # searches without probes spend exactly the epochs they train.
    assert any(t["compute_epochs"] > t["epochs_done"] for t in probed["trials"])
    assert plain["trial_epochs_total"] == sum(t["epochs_done"] for t in plain["trials"])
    # The stage-wise search's trials either trained a whole schedule or stopped at the end
    # of their round's stage.
    for t in stagewise["trials"]:
        assert t["epochs_done"] == 2 or t["stop_reason"].startswith("stage-wise search"), t
    # Random search without early stopping trains every trial for all its epochs.
    assert random_study["trial_epochs_total"] == 3 * rerun["config"]["epochs"]
    # PBT's population of 2 trains every epoch and probes at its perturbation epoch.
    assert rerun["config"]["pbt_population"] == 2
    assert [t["epochs_done"] for t in pbt["trials"]] == [2, 2]
    assert pbt["trial_epochs_total"] > 2 * rerun["config"]["epochs"]
    assert 0 < rerun["best_known"] <= 1

    # The default search starts from the recipes fitted to the budget; the others do not.
    by_number = sorted(default["trials"], key=lambda t: t["number"])
    assert [t["candidate"] for t in by_number[:2]] == ["fitted_constant", "fitted_increase"]
    assert not any(t["candidate"] for s in rerun["studies"][1:] for t in s["trials"])
    assert [lv["tolerances"] for lv in rerun["levels"]] == [5.0, 2.5, 1.5, 1.0]

    md = (again / "tuning_efficiency_smoke.md").read_text()
    assert "| method |" in md
    assert "tpe_asha (mean)" in md
    assert "Trial-epochs to reach each level" in md
    _png(again / "tuning_efficiency_smoke.png")

    # Re-scored: the same studies and figures, no study trained again, the machine they ran
    # on kept; and the cross-seed check retrains the default's best schedule.
    rescored_dir = tmp_path / "rescored"
    rescored = module.main(
        [
            "--smoke",
            "--results-dir",
            str(rescored_dir),
            "--rescore",
            str(again / "tuning_efficiency_smoke.json"),
            "--cross-seed",
        ]
    )
    cross = rescored["cross_seed"]
    assert cross["seeds"] == [0]
    rows = cross["schedules"]
    row = rows[0]
    # The seed's best full run of any search among those that finished within the budget (a
    # trial still running when the budget was spent finishes, outside it).
    budget = rerun["config"]["budget_trial_epochs"]
    full = []
    for study in rerun["studies"]:
        spent_at = {p["number"]: p["trial_epochs"] for p in study["curve"]}
        full += [
            (study["method"], t)
            for t in study["trials"]
            if t["status"] == "completed"
            and t["epochs_done"] == 2
            and t["feasible"]
            and spent_at.get(t["number"], math.inf) <= budget
        ]
    found_by, best = max(full, key=lambda pair: pair[1]["metric_value"])
    assert (row["found_on_seed"], row["found_by"], row["trial"]) == (0, found_by, best["number"])
    # the second candidate: the best run of another schedule (each seed's two by default)
    others = [(m, t) for m, t in full if t["schedule"] != best["schedule"]]
    if others:
        second_by, second = max(others, key=lambda pair: pair[1]["metric_value"])
        assert [(r["found_by"], r["trial"]) for r in rows[1:]] == [(second_by, second["number"])]
    else:
        assert len(rows) == 1
    if found_by != "pbt":  # a PBT run's weights came from its donors, not one straight run
        # the same schedule on the same seed, trained straight through: the study's value
        assert row["values"]["0"] == pytest.approx(best["metric_value"], abs=1e-6)
    assert "Cross-seed check" in (rescored_dir / "tuning_efficiency_smoke.md").read_text()
    # the paired measure: against that schedule's value on the study's own seed, which the
    # study that trained it reaches
    paired = rescored["paired"]
    assert paired["best_known"] == {"0": row["values"]["0"]}
    if found_by != "pbt":
        assert paired["methods"][found_by]["epochs_to_reach"][0] is not None
    assert (
        "Against the best schedule known trained on each study's own seed"
        in (rescored_dir / "tuning_efficiency_smoke.md").read_text()
    )
    assert rescored["summary_line"] == rerun["summary_line"]
    assert rescored["studies"] == rerun["studies"]
    assert rescored["machine"] == rerun["machine"]
    assert set(rescored["per_seed"]["best_known"]) == {"0"}
    rescored_md = (rescored_dir / "tuning_efficiency_smoke.md").read_text()
    assert "Re-scored from" in rescored_md
    # that file's studies came partly from the first run, and the re-score says so
    assert (
        "that run took the studies of default, tpe_asha, random, pbt from "
        "`tuning_efficiency_smoke.json`" in rescored_md
    )


@pytest.mark.ray
def test_trial_overhead_measures_what_a_fork_costs(ray_session: None, tmp_path: Path) -> None:
    """The fork-cost part of ``bench/trial_overhead.py`` (the rest of its smoke mode starts a
    Ray Train run per trial, over a minute): a real save at a stage boundary and a real load
    into the next trial's workers, timed."""
    module = _load("trial_overhead")
    (row,) = module.run_fork_cost(["digits"], str(tmp_path))
    assert row["task"] == "digits"
    assert row["state_bytes"] > 0
    assert len(row["save_s"]) == len(row["load_s"]) == 1 + module.FORK_ROUNDS
    assert all(0 < s < 30 for s in [*row["save_s"], *row["load_s"]])
    assert row["fork_s"] == row["save_median_s"] + row["load_median_s"]


@pytest.mark.ray
def test_trial_overhead_measures_a_later_experiments_start(
    ray_session: None, tmp_path: Path
) -> None:
    """The experiment-start part of ``bench/trial_overhead.py``: after a first Tune
    experiment, a later one's first trial trains on the gang the driver's pool kept (the same
    worker pids), and once the pool is killed, on new processes; both timed."""
    from workers.gang_pool import close_driver_pool

    module = _load("trial_overhead")
    close_driver_pool()  # gangs that earlier tests gave back would be lent first
    first, pids = module.run_reuse("digits", 1, 1, str(tmp_path))
    assert len(first) == 1
    assert len(pids) == 2
    starts = module.run_experiment_starts("digits", 1, str(tmp_path), pids)
    assert starts["pooled_pids"] == list(pids)
    assert not set(starts["fresh_pids"]) & set(pids)
    for row in (first[0], starts["pooled"], starts["fresh"]):
        assert 0 < row["training_s"] < row["wall_s"]
        assert row["non_training_s"] == pytest.approx(row["wall_s"] - row["training_s"])


@pytest.mark.ray
def test_gpu_throughput_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench/gpu_throughput.py --smoke`` runs every part on the CPU: the trial loop and the
    plain loop on CIFAR-size synthetic images, then short trials through Ray Tune one at a
    time and two at once. The bench starts its own Ray (its workers must see the datasets
    root it sets), so the session's instance, if any, is stopped and started again."""
    import ray

    module = _load("gpu_throughput")
    running = ray.is_initialized()
    ray.shutdown()
    try:
        data = module.main(["--smoke", "--results-dir", str(tmp_path)])
    finally:
        if running:
            ray.init(
                num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False
            )
    fields = _fields(_last_line(capsys.readouterr().out), "gpu_throughput")
    assert set(fields) == {
        "task",
        "device",
        "loop_vs_plain_at_64",
        "loop_samples_per_s_at_64",
        "plain_samples_per_s_at_64",
        "best_sharing",
        "trials_per_hour_shared",
        "trials_per_hour_alone",
    }
    assert (fields["task"], fields["device"]) == ("cifar10", "cpu")
    assert [row["batch"] for row in data["loop_vs_plain"]] == [32, 64]
    for row in data["loop_vs_plain"]:
        assert row["loop"] > 0
        assert row["plain"] > 0
        assert row["ratio"] == pytest.approx(row["loop"] / row["plain"])
        assert row["loop_detail"]["False"]["steps"] == 384 // row["batch"]
    assert [r["sharing"] for r in data["shared"]] == [1, 2]
    assert all(r["trials"] == 2 and r["trials_per_hour"] > 0 for r in data["shared"])
    saved = json.loads((tmp_path / "gpu_throughput_smoke.json").read_text())
    assert saved["summary_line"] == _last_line(
        (tmp_path / "gpu_throughput_smoke.md").read_text().replace("```", "").strip()
    )


@pytest.mark.ray
def test_loop_throughput_smoke(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench/loop_throughput.py --smoke``: the trial loop against the plain loop on one
    worker (and its LR / noise-scale variants), and a gang of 2 against plain DDP in 2
    processes; ratios are what the rows say."""
    module = _load("loop_throughput")
    data = module.main(["--smoke", "--results-dir", str(tmp_path)])
    fields = _fields(_last_line(capsys.readouterr().out), "loop_throughput")
    assert set(fields) == {
        "task",
        "ratio_1w_at_64",
        "ratio_2w_at_64",
        "noise_cost_pct",
        "lr_cost_pct",
    }
    assert [r["batch"] for r in data["rows"]] == [32, 64]
    for row in data["rows"]:
        for key in ("loop_1w", "plain", "plain_lr", "plain_noise", "loop_2w", "ddp_2w"):
            assert row[key] > 0, key
        assert row["ratio_1w"] == pytest.approx(row["loop_1w"] / row["plain"])
        assert row["ratio_2w"] == pytest.approx(row["loop_2w"] / row["ddp_2w"])
    assert float(fields["ratio_1w_at_64"]) == pytest.approx(data["rows"][-1]["ratio_1w"], abs=0.006)
    saved = json.loads((tmp_path / "loop_throughput_smoke.json").read_text())
    assert saved["summary_line"] == _last_line(
        (tmp_path / "loop_throughput_smoke.md").read_text().replace("```", "").strip()
    )


@pytest.mark.ray
def test_noise_candidate_smoke(
    ray_session: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``bench/noise_candidate.py --smoke``: the small-batch baseline on one worker measures
    its noise scale at each epoch's end, the candidate built from it trains on a test seed,
    and the summary line gives what the row holds; a schedule given to ``--compare`` trains
    beside it with the same LR rule (a stage's ``xF`` scales its LR), and a schedule file as it
    is."""
    from tuner.schedule import Schedule

    module = _load("noise_candidate")
    mine = Schedule.from_dict(
        {
            "version": 1,
            "units": {"time": "epochs", "batch_size": "samples", "lr": "absolute"},
            "base_lr": 0.05,
            "base_batch_size": 32,
            "stages": [
                {"start_epoch": 0, "end_epoch": 1, "batch_size": 32, "lr_multiplier": 0.5},
                {"start_epoch": 1, "end_epoch": 2, "batch_size": 128, "lr_multiplier": 0.25},
            ],
        }
    )
    mine.dump(tmp_path / "mine.yaml")
    compare = f"64@0-1x0.5 -> 256@1-2,{tmp_path / 'mine.yaml'}"
    data = module.main(["--smoke", "--results-dir", str(tmp_path), "--compare", compare])
    fields = _fields(_last_line(capsys.readouterr().out), "noise_candidate")
    (row,) = data["rows"]
    assert row["noise_scale"][0] is not None
    assert row["noise_scale"][0] > 0
    assert row["candidate"] is not None
    assert fields["candidate"] == row["candidate"].replace(" ", "")
    assert int(fields["steps"]) == row["steps"] > 0
    assert float(fields["test"]) == pytest.approx(row["mean"], abs=1e-4)
    assert 0.1 < row["mean"] <= 1.0  # test accuracy of a trained digits model
    # The step floor of the small-batch run: below its steps, and on the summary line.
    floor = row["step_floor"]
    assert floor["steps"] == row["small_batch_steps"][-1]
    assert 0 < floor["floor"] < floor["steps"]
    assert float(fields["max_steps_ratio"]) == pytest.approx(floor["ratio"], abs=0.01)
    assert int(fields["step_floor"]) == round(floor["floor"])
    other, from_file = row["compare"]
    assert other["stages"] == "64@0-1 (lr x0.5) -> 256@1-2"
    # The scaling rule's LR (multiplier 1), the first stage's halved by its x0.5.
    assert [st["lr_multiplier"] for st in other["schedule"]["stages"]] == [0.5, 1.0]
    assert other["schedule"]["stages"][1]["warmup_epochs"] > 0  # the LR rises at the 4x step
    assert other["steps"] > 0
    assert 0.1 < other["mean"] <= 1.0
    assert Schedule.from_dict(from_file["schedule"]).stages == mine.stages
    assert from_file["steps"] > 0
    markdown = (tmp_path / "noise_candidate_smoke.md").read_text()
    assert "| digits | `64@0-1 (lr x0.5) -> 256@1-2` |" in markdown
    assert f"({floor['ratio']:.1f}x)" in markdown
    with pytest.raises(SystemExit, match="is not BATCH@START-END"):
        module.main(["--smoke", "--results-dir", str(tmp_path), "--compare", "64 for 2 epochs"])
    with pytest.raises(SystemExit, match="no schedule file"):
        module.main(["--smoke", "--results-dir", str(tmp_path), "--compare", "absent.yaml"])
    longer = Schedule.from_dict(
        {
            "version": 1,
            "units": {"time": "epochs", "batch_size": "samples", "lr": "absolute"},
            "base_lr": 0.05,
            "base_batch_size": 32,
            "stages": [{"start_epoch": 0, "end_epoch": 3, "batch_size": 32}],
        }
    )
    longer.dump(tmp_path / "longer.yaml")
    with pytest.raises(SystemExit, match="runs 3 epochs, the task's space 2"):
        module.main(
            ["--smoke", "--results-dir", str(tmp_path), "--compare", str(tmp_path / "longer.yaml")]
        )
    saved = json.loads((tmp_path / "noise_candidate_smoke.json").read_text())
    assert saved["summary_line"] == _last_line(
        (tmp_path / "noise_candidate_smoke.md").read_text().replace("```", "").strip()
    )


@pytest.mark.ray_free
def test_denoise_batch_penalty_smoke(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``bench/denoise_batch_penalty.py --smoke``: a tiny denoise model, 2 epochs at the base
    batch and at twice it (sqrt and linear LR scaling) through the trial loop (no Ray)."""
    import torch

    threads = torch.get_num_threads()
    module = _load("denoise_batch_penalty")
    data = module.main(["--smoke", "--results-dir", str(tmp_path)])
    assert torch.get_num_threads() == threads  # put back
    fields = _fields(_last_line(capsys.readouterr().out), "denoise_batch_penalty")
    assert set(fields) == {"base_psnr", "penalty_sqrt_2x", "penalty_linear_2x"}
    assert [(r["label"], r["batch"]) for r in data["rows"]] == [
        ("base", 32),
        ("2x sqrt", 64),
        ("2x linear + warm-up", 64),
    ]
    base = data["rows"][0]["mean"]
    assert float(fields["base_psnr"]) == pytest.approx(base, abs=0.006)
    for row in data["rows"][1:]:
        assert row["penalty"] == pytest.approx(base - row["mean"])
    assert len(data["base_run"]["val_psnr"]) == 2
    saved = json.loads((tmp_path / "denoise_batch_penalty_smoke.json").read_text())
    assert saved["summary_line"].startswith("denoise_batch_penalty base_psnr=")
    assert "| 2x sqrt | 64 |" in (tmp_path / "denoise_batch_penalty_smoke.md").read_text()


@pytest.mark.ray_free
@pytest.mark.parametrize(("task", "metric"), [("tinylm", "val_loss"), ("denoise", "val_psnr")])
def test_gpu_throughput_smoke_on_the_lm_and_denoising_tasks(
    task: str, metric: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--task tinylm`` / ``--task denoise``: both loops train the task's own model with its
    loss and its AdamW, and the report reads the task's metric."""
    module = _load("gpu_throughput")
    data = module.main(["--smoke", "--task", task, "--no-share", "--results-dir", str(tmp_path)])
    fields = _fields(_last_line(capsys.readouterr().out), "gpu_throughput")
    assert (fields["task"], fields["device"]) == (task, "cpu")
    assert data["config"]["metric"] == metric
    assert data["shared"] == []
    for row in data["loop_vs_plain"]:
        assert row["loop"] > 0
        assert row["plain"] > 0
        assert math.isfinite(row["loop_detail"]["False"][metric])
        assert row["loop_detail"]["False"]["steps"] == 384 // row["batch"]
    report = (tmp_path / f"gpu_throughput_{task}_smoke.md").read_text()
    assert f"trial loop's {metric} after the stage" in report
