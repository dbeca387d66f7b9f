"""Options of the ``wine-mlp`` task (no torch, no NumPy: the API imports this module)."""

from __future__ import annotations

from pydantic import Field

from workers.task_options import TaskOptions


class WineOptions(TaskOptions):
    hidden_dim: int = Field(default=64, ge=4, le=1024, description="Width of the hidden layer.")
    data_seed: int | None = Field(default=0, description="Fixes the train/val/test split.")
