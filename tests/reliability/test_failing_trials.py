"""Trials that fail on their own do not fail the study: a tiny real study through the runner
(``workers.runner.run_study``: the engine, the real trainable on the session's Ray, the store)
in which some trials diverge (learning-rate multipliers up to 1000x) and some run out of
memory (a test-only task whose model raises the real ``torch.OutOfMemoryError``).

The task is registered programmatically (``register_task`` in this process, shipped to the
worker processes through ``ScheduleTrainable.extra_tasks``). Its model raises
``torch.OutOfMemoryError`` on a training micro-batch above 64 samples and, from then on, on
every training forward pass of that model (memory that stays fragmented), so the loop's
retry with more accumulation cannot save it: a trial that ever trains a batch above 64 fails
with an out-of-memory reason; one that stays at or below 64 trains normally.

Expected: the study completes with its whole budget; the small-batch baseline (batch 32)
completes; the large-batch baseline (batch 256) fails with an out-of-memory reason; at least
one tuned trial diverges (with the reason); every failed trial says why; no trial is left
running; the best trial is a completed one.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import ray.cloudpickle
import torch
from torch import nn

from tuner.spec import StudySpec
from tuner.store import StudyStatus, StudyStore, TrialStatus
from workers.runner import run_study
from workers.tasks import BaseTask, TaskData, TaskOptions, get_task, register_task, unregister_task
from workers.tasks.base import load_tensors
from workers.trainable import ScheduleTrainable

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
]

# Worker processes cannot import this test module by name: pickle its classes by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # type: ignore[no-untyped-call]

OOM_ABOVE = 64
TASK_NAME = "reltest_sticky_oom_digits"


class _StickyOOM(nn.Module):
    """Raises ``torch.OutOfMemoryError`` on a training batch above ``limit``, and on every
    training batch after that one."""

    def __init__(self, inner: nn.Module, limit: int) -> None:
        super().__init__()
        self.inner = inner
        self.limit = limit
        self.exhausted = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and (self.exhausted or x.shape[0] > self.limit):
            self.exhausted = True
            raise torch.OutOfMemoryError(
                f"test: a micro-batch of {x.shape[0]} samples does not fit (limit {self.limit}, "
                "memory fragmented since)"
            )
        out: torch.Tensor = self.inner(x)
        return out


class StickyOOMDigits(BaseTask[TaskOptions]):
    name = TASK_NAME
    description = f"digits; a training batch above {OOM_ABOVE} exhausts the memory for good"
    default_epochs = 3
    default_base_batch_size = 32
    default_base_lr = 0.05
    options_model = TaskOptions
    limit: ClassVar[int] = OOM_ABOVE

    def _load(self, opts: TaskOptions, data_seed: int) -> TaskData:
        return load_tensors(get_task("digits"), {"data_seed": data_seed}, data_seed)

    def _build(self, opts: TaskOptions) -> nn.Module:
        return _StickyOOM(get_task("digits").build_model({}), self.limit)


TASK = StickyOOMDigits()


class ReliabilityTrainable(ScheduleTrainable):
    extra_tasks = (TASK,)


BUDGET = 8
SPEC: dict[str, Any] = {
    "task": TASK_NAME,
    "name": "diverge-and-oom",
    "seed": 0,
    "schedule": {"total_epochs": 3},
    "space": {
        "stages": {"min": 1, "max": 2},
        "batch_size": {"min": 32, "max": 256},
        "lr_multiplier": {"min": 1.0, "max": 1000.0},
        "warmup_epochs": {"min": 0.0, "max": 0.0},
    },
    "budget": {
        "trials": BUDGET,
        "early_stopping": False,
        "max_failures": 0,
        "max_concurrent": 2,
        "seed_runs": 0,
        # The sampler's own draws (multipliers up to 1000x) are what diverges; the recipes
        # (multiplier 1) would take two of the six tuned trials.
        "recipe_candidates": False,
    },
    "resources": {"workers": 1, "cpus_per_worker": 1},
    "baselines": True,
}


@pytest.fixture
def registered_task(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The test task, registered in this process (``register_task`` also makes its name valid
    in a ``StudySpec`` of this process)."""
    register_task(TASK, replace=True)
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    yield
    unregister_task(TASK_NAME)


def test_diverged_and_out_of_memory_trials_do_not_fail_the_study(
    ray_session: None, registered_task: None, sqlite_url: str, tmp_path: Path
) -> None:
    spec = StudySpec.from_dict(SPEC)
    with StudyStore(sqlite_url, create=True) as store:
        study_id = store.create_study(spec.task, spec.to_dict(), BUDGET, name=spec.name).id
        claimed = store.claim_study("w-failures", 600)
        assert claimed is not None
        assert claimed.id == study_id
        result = run_study(
            store,
            study_id,
            worker_id="w-failures",
            trainable=ReliabilityTrainable,
            storage_path=tmp_path / "ray",
        )
        study = store.get_study(study_id)
        trials = store.list_trials(study_id).items
        table = [(t.number, t.baseline, t.status.value, t.stop_reason) for t in trials]
        print("\n".join(map(str, table)))

        assert result.status is StudyStatus.COMPLETED
        assert study.status is StudyStatus.COMPLETED, study.error
        assert [t.number for t in trials] == list(range(BUDGET)), table
        by_baseline = {t.baseline: t for t in trials if t.baseline is not None}
        assert by_baseline["small_batch"].status is TrialStatus.COMPLETED, table
        large = by_baseline["large_batch"]
        assert large.status is TrialStatus.FAILED, table
        assert large.stop_reason is not None
        assert "out of memory" in large.stop_reason.lower(), large.stop_reason
        statuses = {t.status for t in trials}
        assert TrialStatus.RUNNING not in statuses, table
        assert statuses <= {TrialStatus.COMPLETED, TrialStatus.FAILED, TrialStatus.DIVERGED}
        diverged = [t for t in trials if t.status is TrialStatus.DIVERGED]
        assert diverged, f"no trial diverged (sampler seed {spec.seed}): {table}"
        for t in trials:
            if t.status is TrialStatus.FAILED:
                assert t.stop_reason is not None
                assert "out of memory" in t.stop_reason.lower(), t.stop_reason
            if t.status is TrialStatus.DIVERGED:
                assert t.stop_reason, t
                # The metrics up to the divergence are kept, all finite.
                curve = store.trial_metrics(t.id)
                assert all(m.val_accuracy is not None for m in curve[:-1]), curve
        assert study.best_trial_number is not None
        best = store.get_trial(study_id, study.best_trial_number)
        assert best.status is TrialStatus.COMPLETED, best
