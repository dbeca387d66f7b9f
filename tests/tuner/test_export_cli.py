"""``stagetune export``: YAML, re-targeted YAML, Megatron-LM and DeepSpeed from the store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from tests.cli import run_stagetune
from tuner.export import validate_document
from tuner.schedule import Schedule, Stage
from tuner.store import StudyStore, TrialStatus
from workers.cli import app

N = 4096
SPEC = {"task": "mnist1d", "seed": 3, "resources": {"workers": 2}}


def tuned() -> Schedule:
    return Schedule(
        stages=(Stage(0, 3, 64, warmup_epochs=1.0), Stage(3, 8, 256), Stage(8, 12, 1024)),
        base_lr=0.05,
        base_batch_size=64,
    )


@pytest.fixture
def study(sqlite_url: str) -> int:
    store = StudyStore.from_url(sqlite_url, create=True)
    try:
        record = store.create_study("mnist1d", SPEC, budget=2, name="cli")
        store.claim_study("w", stale_after_s=60)
        trial = store.create_trial(record.id, 0, tuned().to_dict(), {})
        store.finish_trial(trial.id, TrialStatus.COMPLETED, final={"val_accuracy": 0.75})
        store.set_best(record.id, trial.id, 0.75)
        return record.id
    finally:
        store.close()


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def test_export_yaml_and_retargeted_yaml(study: int, sqlite_url: str, tmp_path: Path) -> None:
    code, out, err = run("export", str(study), "--database-url", sqlite_url)
    assert code == 0
    # It says which study and trial it exported, and from which database.
    assert err.strip().splitlines()[-1] == (
        f"exported study {study} (cli), trial 0 from the database {sqlite_url}"
    )
    validate_document(yaml.safe_load(out), export=True)
    schedule = Schedule.from_yaml(out)
    assert schedule.stages == tuned().stages
    assert schedule.provenance is not None
    assert schedule.provenance["study_id"] == study

    target = tmp_path / "eight.yaml"
    code, _, err = run(
        "export", str(study), "--database-url", sqlite_url, "--world-size", "8",
        "--micro-batch", "16", "--out", str(target),
    )  # fmt: skip
    assert code == 0
    assert "stage 3 (epochs 8-12): global batch 1024 = 8 x 128 per worker, 8 accumulation" in err
    placed = Schedule.load(target)
    assert placed.placement is not None
    assert (placed.placement.world_size, placed.placement.micro_batch) == (8, 16)
    assert placed.stages == tuned().stages


def test_export_deepspeed_and_megatron(study: int, sqlite_url: str, tmp_path: Path) -> None:
    code, out, err = run(
        "export", str(study), "--database-url", sqlite_url, "--format", "deepspeed",
        "--world-size", "8", "--micro-batch", "32", "--dataset-size", str(N),
    )  # fmt: skip
    assert code == 0
    plan = json.loads(out)
    for stage in plan["stages"]:
        c = stage["config"]
        assert (
            c["train_micro_batch_size_per_gpu"] * c["gradient_accumulation_steps"] * 8
            == c["train_batch_size"]
        )
    assert "warning: DeepSpeed's batch size (train_batch_size) is fixed" in err
    assert "--out DIR writes what DeepSpeed takes" in err

    # With --out DIR: what DeepSpeed takes, one plain config per stage, and the index.
    out_dir = tmp_path / "ds"
    code, _, err = run(
        "export", str(study), "--database-url", sqlite_url, "--format", "deepspeed",
        "--world-size", "8", "--micro-batch", "32", "--dataset-size", str(N), "-o", str(out_dir),
    )  # fmt: skip
    assert code == 0
    index = json.loads((out_dir / "stages.json").read_text())
    assert [s["config_file"] for s in index["stages"]] == [
        f"ds_config_stage{i + 1}.json" for i in range(len(plan["stages"]))
    ]
    for entry, stage in zip(index["stages"], plan["stages"], strict=True):
        config = json.loads((out_dir / entry["config_file"]).read_text())
        assert config == stage["config"]  # a DeepSpeed config as is, nothing wrapped around
        assert entry["epochs"] == stage["epochs"]
    assert index["limitations"]
    assert "config_file" in index["how_to_run"]

    code, out, err = run(
        "export", str(study), "--database-url", sqlite_url, "--format", "megatron",
        "--dataset-size", str(N),
    )  # fmt: skip
    assert code == 0
    assert "--rampup-batch-size 64" in out
    assert "--micro-batch-size 32" in out  # 2 tuned workers: 64 = 2 x 32
    assert "warning: Megatron-LM changes the global batch only through" in err
    # Written to a file, it is bash a launcher can source as is.
    args_file = tmp_path / "args.sh"
    code, _, _ = run(
        "export", str(study), "--database-url", sqlite_url, "--format", "megatron",
        "--dataset-size", str(N), "-o", str(args_file),
    )  # fmt: skip
    assert code == 0
    shown = subprocess.run(
        ["bash", "-c", f'source "{args_file}" && echo "${{STAGETUNE_MEGATRON_ARGS[@]}}"'],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--rampup-batch-size 64" in shown


@pytest.mark.slow
@pytest.mark.ray_free
def test_export_errors_are_one_line_with_exit_codes(
    study: int, sqlite_url: str, tmp_path: Path
) -> None:
    missing = run_stagetune("export", "99", "--database-url", sqlite_url)
    assert missing.returncode == 3
    assert missing.stderr.strip() == "stagetune: error: study 99 does not exist"
    no_db = run_stagetune("export", "1", "--database-url", f"sqlite:///{tmp_path / 'none.db'}")
    assert no_db.returncode == 3
    assert "no study database at" in no_db.stderr
    unplaceable = run_stagetune(
        "export", str(study), "--database-url", sqlite_url, "--world-size", "48"
    )
    assert unplaceable.returncode == 2
    assert len(unplaceable.stderr.strip().splitlines()) == 1
    assert "cannot re-target the schedule to 48 workers" in unplaceable.stderr
