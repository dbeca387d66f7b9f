"""A tiny task of protocol v2 with metrics of its own, for tests of what a study of another
metric than accuracy shows: linear regression of 3 features onto 1 target.

Its options model declares ``val_loss`` (half the mean squared error, the training loss) and
``val_mse`` (the mean squared error, its primary metric), both minimised; the data has no
classes (``num_classes=None``, float targets of shape ``(N, 1)``). Register it in a test with
the :func:`regression_task` fixture (a test module imports it). For Ray workers, register
this module with Ray's cloudpickle by value (as a task file's is): they cannot import the
tests package by name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import ClassVar, Literal

import pytest
import torch
from pydantic import Field
from torch import nn

from workers.tasks import BaseTask, TaskData, TaskOptions, register_task, unregister_task

__all__ = ["TASK", "TASK_NAME", "LinearRegression", "RegressionOptions", "regression_task"]

TASK_NAME = "test-linear-regression"


class RegressionOptions(TaskOptions):
    metrics: ClassVar[Mapping[str, Literal["max", "min"]]] = {
        "val_loss": "min",
        "val_mse": "min",
    }
    primary_metric: ClassVar[str] = "val_mse"

    num_samples: int = Field(default=512, ge=32, le=100_000, description="Samples in all.")
    noise: float = Field(default=0.1, ge=0, le=10, description="Std of the target noise.")


class LinearRegression(BaseTask[RegressionOptions]):
    name = TASK_NAME
    description = "y = x . w + noise, 3 features; metrics val_loss and val_mse"
    default_epochs = 3
    default_base_batch_size = 16
    default_base_lr = 0.05
    options_model = RegressionOptions

    def _load(self, opts: RegressionOptions, data_seed: int) -> TaskData:
        generator = torch.Generator().manual_seed(data_seed)
        n = opts.num_samples
        x = torch.randn(n, 3, generator=generator)
        w = torch.tensor([[1.5], [-2.0], [0.5]])
        y = x @ w + opts.noise * torch.randn(n, 1, generator=generator)
        a, b = n // 2, 3 * n // 4
        return TaskData(
            x[:a], y[:a], x[a:b], y[a:b], x[b:], y[b:], num_classes=None, input_shape=(3,)
        )

    def _build(self, opts: RegressionOptions) -> nn.Module:
        return nn.Linear(3, 1)

    def loss(
        self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
    ) -> torch.Tensor:
        return 0.5 * ((output - target) ** 2).sum()

    def eval_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"se": ((output - target) ** 2).sum()}

    def metrics_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        mse = sums["se"] / count
        return {"loss": 0.5 * mse, "mse": mse}


TASK = LinearRegression()


@pytest.fixture
def regression_task() -> Iterator[LinearRegression]:
    """The task, registered in this process (its name is then valid in a spec)."""
    register_task(TASK, replace=True)
    yield TASK
    unregister_task(TASK_NAME)
