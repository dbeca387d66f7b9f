"""Your own training workload as a stagetune task: a small CNN on scikit-learn's 8x8 digits.

This file is what you write to tune a batch-size schedule for your model: where your training
script builds its dataset and its model, a task does the same in ``_load`` and ``_build``;
stagetune's trial loop does the rest (data-parallel workers, the schedule's batch sizes and
LRs, evaluation, checkpoints). Run it with::

    stagetune tune examples/own-task/spec.yaml --task-file examples/own-task/my_task.py

The data ships with scikit-learn (nothing is downloaded). See docs/own-task.md.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field
from sklearn.datasets import load_digits
from torch import nn

from workers.tasks import BaseTask, OptimizerDefaults, TaskData, TaskOptions


class DigitsCNNOptions(TaskOptions):
    """Options a study may set under ``task_options`` (unknown keys are rejected)."""

    channels: int = Field(default=16, ge=1, le=256, description="Channels of the first conv.")
    data_seed: int | None = Field(default=0, description="Fixes the train/val/test split.")


class DigitsCNN(BaseTask[DigitsCNNOptions]):
    name = "my-digits-cnn"
    description = "A small CNN on scikit-learn's 8x8 digits (an example of your own task)."
    default_epochs = 6
    default_base_batch_size = 32
    default_base_lr = 0.05  # the LR your script uses at default_base_batch_size
    default_optimizer = OptimizerDefaults(name="sgd", momentum=0.9, weight_decay=5e-4)
    options_model = DigitsCNNOptions

    def _load(self, opts: DigitsCNNOptions, data_seed: int) -> TaskData:
        digits = load_digits()
        x = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1)  # (N, 1, 8, 8)
        x = (x - x.mean()) / x.std()
        y = torch.tensor(digits.target, dtype=torch.int64)
        order = torch.from_numpy(np.random.default_rng(data_seed).permutation(len(y)))
        x, y = x[order], y[order]
        n_val = n_test = len(y) // 5
        n_train = len(y) - n_val - n_test
        return TaskData(
            train_x=x[:n_train],
            train_y=y[:n_train],
            val_x=x[n_train : n_train + n_val],
            val_y=y[n_train : n_train + n_val],
            test_x=x[n_train + n_val :],
            test_y=y[n_train + n_val :],
            num_classes=10,
            input_shape=(1, 8, 8),
        )

    def _build(self, opts: DigitsCNNOptions) -> nn.Module:
        c = opts.channels
        return nn.Sequential(
            nn.Conv2d(1, c, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),  # 4x4
            nn.Conv2d(c, 2 * c, 3, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(2 * c * 4 * 4, 10),
        )
