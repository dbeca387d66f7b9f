"""What the runner checks with the task loaded, before any study is created or trial runs."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from torch import nn

from tuner.errors import ClusterUnavailableError, ValidationError
from tuner.spec import StudySpec
from tuner.store.records import StudyStatus
from tuner.store.storage import StudyStore
from workers.runner import check_spec, tune_spec
from workers.tasks import BaseTask, TaskData, TaskOptions, register_task, unregister_task


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


class _Bad(BaseTask[TaskOptions]):
    """A task whose model is wrong in the way ``kind`` says."""

    description = "a task with a broken model"
    default_epochs = 2
    default_base_batch_size = 8
    default_base_lr = 0.1
    options_model = TaskOptions

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.name = f"bad-model-{kind}"  # type: ignore[misc]

    def _load(self, opts: TaskOptions, data_seed: int) -> TaskData:
        x, y = torch.randn(600, 3), torch.arange(600) % 4
        return TaskData(x, y, x, y, x, y, num_classes=4, input_shape=(3,))

    def _build(self, opts: TaskOptions) -> nn.Module:
        if self.kind == "build":
            raise ImportError("No module named 'timm'")
        if self.kind == "shape":
            return nn.Linear(3, 5)  # 5 logits for 4 classes
        if self.kind == "forward":
            return nn.Linear(4, 4)  # expects 4 input features, gets 3
        return nn.Linear(3, 4)

    def loss(
        self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
    ) -> torch.Tensor:
        if self.kind == "loss-per-sample":  # forgot the sum
            return nn.functional.cross_entropy(output, target, reduction="none")
        if self.kind == "loss-nan":
            return output.sum() * float("nan")
        return super().loss(output, target, label_smoothing)

    def metrics_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        if self.kind == "metric-missing":  # declares val_accuracy but computes only the loss
            return {"loss": sums["loss"] / count}
        return super().metrics_from_sums(sums, count)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("build", "building its model failed: ImportError: No module named 'timm'"),
        ("shape", "maps a batch of shape (2, 3) to (2, 5); expected (2, 4) (one logit per class"),
        ("forward", "its model failed on a batch of shape (2, 3) (2 training samples)"),
        (
            "loss-per-sample",
            "its loss on the model's output (2, 4) and targets (2,) is (2,); expected a scalar "
            "tensor (the sum of the batch's per-sample losses)",
        ),
        ("loss-nan", "its loss on the model's output (2, 4) and targets (2,) is nan"),
        (
            "metric-missing",
            "metrics_from_sums returns ['loss'] but the task declares val_accuracy",
        ),
    ],
)
def test_a_task_whose_model_cannot_train_is_rejected_before_any_trial(
    kind: str, message: str, sqlite_url: str, tmp_path: Path
) -> None:
    task = register_task(_Bad(kind), replace=True)
    try:
        spec = StudySpec.from_dict({"task": task.name})
        with pytest.raises(ValidationError) as info:
            tune_spec(spec, sqlite_url, tmp_path / "best.yaml", quiet=True)
        assert str(info.value).startswith(f"task {task.name!r}: ")
        assert message in str(info.value)
        with StudyStore(sqlite_url, create=True) as store:
            assert store.list_studies().total == 0  # no study was created
    finally:
        unregister_task(task.name)
    good = register_task(_Bad("fine"), replace=True)
    try:
        check_spec(StudySpec.from_dict({"task": good.name}))  # the same task, a sound model
    finally:
        unregister_task(good.name)


def test_a_study_whose_ray_cannot_be_reached_goes_back_to_the_queue(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray unreachable as the study starts (here ``ray.init`` raises what Ray raises when it
    cannot start or reach its instance): no trial ran, so the study is queued again, not
    failed, and the error says so. (A ``RAY_ADDRESS`` where nothing answers, for real:
    tests/workers/test_cli_client.py.)"""
    import ray

    def unreachable(*args: object, **kwargs: object) -> None:
        raise ConnectionError("Could not find any running Ray instance.")

    # Ray as a process that has not connected yet (a Ray this test session runs stays up:
    # the clean-up shutdown after the failed connect is recorded, not done)
    shutdowns: list[object] = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", unreachable)
    monkeypatch.setattr(ray, "shutdown", lambda *a, **k: shutdowns.append(a))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    spec = StudySpec.from_yaml("task: digits\nbaselines: false\nbudget: {trials: 2, seed_runs: 0}")
    with pytest.raises(ClusterUnavailableError) as info:
        tune_spec(spec, db_url, tmp_path / "best.yaml", quiet=True)
    message = str(info.value)
    assert (
        "could not connect to a local Ray instance (ConnectionError: Could not find any "
        "running Ray instance.)"
    ) in message
    with StudyStore(db_url) as store:
        (study,) = store.list_studies().items
        assert f"Study {study.id} is queued again" in message
        assert (study.status, study.worker_id) == (StudyStatus.QUEUED, None)
        assert study.error is not None
        assert study.error.startswith("not started: could not connect to a local Ray instance")
        assert store.list_trials(study.id).total == 0
    assert not (tmp_path / "best.yaml").exists()
    assert len(shutdowns) == 1  # what the failed connect left behind is cleaned up
