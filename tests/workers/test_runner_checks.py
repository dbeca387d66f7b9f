"""What the runner checks with the task loaded, before any study is created or trial runs."""

from __future__ import annotations

from pathlib import Path

import pytest

from tuner.errors import ValidationError
from tuner.spec import StudySpec
from tuner.store.storage import StudyStore
from workers.runner import check_spec, tune_spec


def test_task_defaults_and_dataset_size_resolve_the_spec() -> None:
    resolved, train_size = check_spec(StudySpec.from_yaml("task: digits"))
    assert train_size == 1079  # digits: 1,079 train / 359 val / 359 test
    assert resolved.total_epochs == 15
    assert resolved.base_batch_size == 32
    assert resolved.base_lr == 0.05
    assert (resolved.batch_min, resolved.batch_max) == (32, 512)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("task: digits\ntask_options: {hiden_dim: 3}", "hiden_dim"),
        (
            "task: digits\nspace: {batch_size: {min: 32, max: 2048}}",
            "exceeds the task's 1079 training samples",
        ),
        (
            "task: digits\nschedule: {total_epochs: 10}\nspace: {batch_size: {max: 128}}\n"
            "objective: {max_steps: 50}",
            "no schedule can meet objective.max_steps=50",
        ),
    ],
)
def test_specs_that_cannot_run_are_rejected_with_the_reason(text: str, reason: str) -> None:
    with pytest.raises(ValidationError) as info:
        check_spec(StudySpec.from_yaml(text))
    assert reason in str(info.value)


def test_tune_rejects_a_spec_before_creating_a_study(sqlite_url: str, tmp_path: Path) -> None:
    spec = StudySpec.from_yaml("task: digits\nspace: {batch_size: {max: 4096}}")
    with pytest.raises(ValidationError, match="training samples"):
        tune_spec(spec, sqlite_url, tmp_path / "best.yaml", quiet=True)
    assert not (tmp_path / "best.yaml").exists()
    with StudyStore(sqlite_url, create=True) as store:
        assert store.list_studies().total == 0


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "examples").glob("*.yaml"))
STUDY_EXAMPLES = [p for p in EXAMPLES if p.name in ("mnist1d.yaml", "digits.yaml")]


@pytest.mark.parametrize("path", STUDY_EXAMPLES, ids=lambda p: p.name)
def test_the_example_specs_can_run(path: Path) -> None:
    resolved, train_size = check_spec(StudySpec.from_yaml(path.read_text(encoding="utf-8")))
    assert resolved.spec.budget.trials > 3
    assert train_size > 0
