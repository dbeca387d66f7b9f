"""The ``wine-mlp`` task: scikit-learn's wine data (178 samples, 13 features, 3 classes)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_wine
from torch import nn

from stagetune_wine.options import WineOptions
from workers.tasks import BaseTask, OptimizerDefaults, TaskData


class WineTask(BaseTask[WineOptions]):
    name = "wine-mlp"
    description = "An MLP on scikit-learn's wine data (an example task package)."
    default_epochs = 20
    default_base_batch_size = 8
    default_base_lr = 0.05
    default_optimizer = OptimizerDefaults(name="sgd", momentum=0.9, weight_decay=0.0)
    options_model = WineOptions

    def _load(self, opts: WineOptions, data_seed: int) -> TaskData:
        wine = load_wine()
        order = np.random.default_rng(data_seed).permutation(len(wine.target))
        x = torch.tensor(wine.data[order], dtype=torch.float32)
        y = torch.tensor(wine.target[order], dtype=torch.int64)
        n_val = n_test = len(y) // 5
        n_train = len(y) - n_val - n_test
        mean, std = x[:n_train].mean(0), x[:n_train].std(0)
        x = (x - mean) / std  # standardised with the training split's statistics
        return TaskData(
            train_x=x[:n_train],
            train_y=y[:n_train],
            val_x=x[n_train : n_train + n_val],
            val_y=y[n_train : n_train + n_val],
            test_x=x[n_train + n_val :],
            test_y=y[n_train + n_val :],
            num_classes=3,
            input_shape=(13,),
        )

    def _build(self, opts: WineOptions) -> nn.Module:
        return nn.Sequential(
            nn.Linear(13, opts.hidden_dim), nn.ReLU(), nn.Linear(opts.hidden_dim, 3)
        )


TASK = WineTask()
