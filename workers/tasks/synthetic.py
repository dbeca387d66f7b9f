"""``synthetic``: seeded Gaussian-cluster classification data of any size, and an MLP.

For throughput and scaling work, where the data's size and dimension matter more than its
content. Each class is a Gaussian cluster (unit variance per feature) around a random centre;
centres lie about ``class_sep`` apart whatever the dimension, so ``class_sep`` sets how
separable the classes are: with 10 classes the nearest-centre rule scores about 0.85 at 4,
0.93 at 5 (the default) and 0.98 at 6. Train, val and test are independent draws from the same
clusters (the test split does not change with ``num_samples``).
"""

from __future__ import annotations

import math

import torch
from torch import nn

from workers.task_options import MAX_TOTAL_VALUES, SyntheticOptions
from workers.tasks.base import BaseTask, OptimizerDefaults, TaskData, derive_seed
from workers.tasks.models import MLP

__all__ = ["MAX_TOTAL_VALUES", "TASK", "SyntheticOptions", "SyntheticTask"]


def _generate(centres: torch.Tensor, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    num_classes, num_features = centres.shape
    y = torch.arange(n, dtype=torch.int64) % num_classes
    y = y[torch.randperm(n, generator=gen)]
    x = torch.randn(n, num_features, generator=gen)
    x += centres[y]
    return x, y


class SyntheticTask(BaseTask[SyntheticOptions]):
    name = "synthetic"
    description = (
        "Seeded Gaussian-cluster classification of configurable size, dimension and class "
        "count (default 10,000 train / 2,000 val / 2,000 test, 32 features, 10 classes); an "
        "MLP (2 hidden layers of 256 by default). For throughput and scaling measurements."
    )
    default_epochs = 10
    default_base_batch_size = 64
    default_base_lr = 0.05
    default_optimizer = OptimizerDefaults(name="sgd", momentum=0.9, weight_decay=0.0)
    options_model = SyntheticOptions

    def _load(self, opts: SyntheticOptions, data_seed: int) -> TaskData:
        gen = torch.Generator().manual_seed(derive_seed(data_seed, 0))
        centres = torch.randn(opts.num_classes, opts.num_features, generator=gen)
        centres *= opts.class_sep / math.sqrt(2 * opts.num_features)
        # centre distances ~ class_sep whatever the dimension; noise is unit per feature, so
        # in high dimension the classes are separable along the centre differences.
        splits = [
            _generate(centres, n, derive_seed(data_seed, stream))
            for stream, n in enumerate(
                (opts.num_samples, opts.num_val_samples, opts.num_test_samples), start=1
            )
        ]
        (train_x, train_y), (val_x, val_y), (test_x, test_y) = splits
        return TaskData(
            train_x=train_x,
            train_y=train_y,
            val_x=val_x,
            val_y=val_y,
            test_x=test_x,
            test_y=test_y,
            num_classes=opts.num_classes,
            input_shape=(opts.num_features,),
        )

    def _build(self, opts: SyntheticOptions) -> nn.Module:
        return MLP(opts.num_features, opts.num_classes, opts.hidden_dim, opts.num_hidden_layers)


TASK = SyntheticTask()
