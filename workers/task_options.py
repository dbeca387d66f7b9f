"""The options models of the built-in tasks, and their base :class:`TaskOptions`.

This module imports neither torch nor NumPy (only pydantic and :mod:`tuner`), so the API can
validate a study's ``task_options`` at submission without loading training code: each model
is published under the entry-point group ``stagetune.task_options`` (see ``pyproject.toml``)
and loaded by :func:`tuner.tasks.validate_task_options`. The task modules
(:mod:`workers.tasks.cifar10`, ...) use these models and re-export them under the same names.

An option that is a path to data is declared :data:`tuner.task_paths.DataPath`: the path
policy (inside the datasets root ``STAGETUNE_DATASETS_DIR``; no URL, ``~`` or ``..``) applies
to it at submission and again when the worker loads the data.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from tuner.task_paths import DataPath
from tuner.tasks import CLASSIFICATION_METRICS

__all__ = [
    "CLASSIFICATION_METRICS",
    "MAX_TINYLM_TRAIN_TOKENS",
    "MAX_TOTAL_VALUES",
    "Cifar10Options",
    "DenoiseOptions",
    "DigitsOptions",
    "Mnist1dOptions",
    "SyntheticOptions",
    "TaskOptions",
    "TinyLMOptions",
]


class TaskOptions(BaseModel):
    """Base of every task's options model: unknown keys are rejected, values are immutable.

    ``data_seed`` fixes the data (generation, split) so that every trial of a study sees the
    same data whatever its own seed; ``None`` derives the data from the seed passed to
    ``load_data`` instead.

    The model also carries the task's torch-free declaration of its validation metrics:
    ``metrics`` maps each metric the task reports every epoch (``val_<name>``) to its
    direction (``"max"`` or ``"min"``), ``primary_metric`` is the one a study optimises when
    its objective names none. ``val_loss`` is always declared (a non-finite validation loss
    means the trial diverged). The default is classification's (accuracy and cross-entropy).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    metrics: ClassVar[Mapping[str, Literal["max", "min"]]] = CLASSIFICATION_METRICS
    primary_metric: ClassVar[str] = "val_accuracy"
    #: The option that sets the validation split's size (``None``: the task's split is
    #: fixed); a study's result names it when its pick's lead is finer than the split reads.
    val_size_option: ClassVar[str | None] = None

    data_seed: int | None = Field(
        default=0,
        ge=0,
        le=2**32 - 1,
        description="Seed of data generation and splits; null: use the trial's seed.",
    )


class Mnist1dOptions(TaskOptions):
    num_train_samples: int = Field(
        default=5000, ge=100, le=200_000, multiple_of=10, description="Training samples."
    )
    val_size_option: ClassVar[str | None] = "num_val_samples"
    num_val_samples: int = Field(
        default=8000,
        ge=100,
        le=100_000,
        multiple_of=10,
        description="Validation samples (what a study ranks schedules on: 8,000 read one run "
        "to about 0.12 point at 98.9 %, 2,000 to about 0.23, more than the differences "
        "between the schedules near the best).",
    )
    num_test_samples: int = Field(
        default=8000, ge=100, le=100_000, multiple_of=10, description="Held-out test samples."
    )
    width: int = Field(default=32, ge=4, le=512, description="Channels of the first conv layers.")


class DenoiseOptions(TaskOptions):
    """Options of ``denoise`` (:mod:`workers.tasks.denoise`): image denoising, not
    classification, so it declares its own metrics (PSNR in dB, the primary one, and the
    mean per-patch MSE as the loss)."""

    metrics: ClassVar[Mapping[str, Literal["max", "min"]]] = {
        "val_psnr": "max",
        "val_loss": "min",
    }
    primary_metric: ClassVar[str] = "val_psnr"

    patch_size: int = Field(
        default=24, ge=8, le=64, description="Side of the square grey-level patches, in pixels."
    )
    num_train_patches: int = Field(
        default=1024,
        ge=64,
        le=200_000,
        description="Training patches (random crops of the training regions, flipped/rotated).",
    )
    noise_sigma: float = Field(
        default=25 / 255,
        gt=0.0,
        le=1.0,
        description="Std of the Gaussian noise on the [0, 1] scale (25/255: sigma 25 of 255).",
    )
    depth: int = Field(default=7, ge=3, le=20, description="Conv layers of the DnCNN.")
    width: int = Field(default=32, ge=4, le=128, description="Channels of its hidden layers.")


class DigitsOptions(TaskOptions):
    hidden_dim: int = Field(default=128, ge=8, le=4096, description="Width of the hidden layers.")
    num_hidden_layers: int = Field(default=1, ge=0, le=8, description="Hidden layers of the MLP.")


#: Upper bound of synthetic's (train + val + test samples) x features: 2**28 float32 = 1 GiB.
MAX_TOTAL_VALUES: Final = 2**28


class SyntheticOptions(TaskOptions):
    num_samples: int = Field(default=10_000, ge=10, le=10_000_000, description="Train samples.")
    val_size_option: ClassVar[str | None] = "num_val_samples"
    num_val_samples: int = Field(default=2000, ge=1, le=1_000_000, description="Val samples.")
    num_test_samples: int = Field(default=2000, ge=1, le=1_000_000, description="Test samples.")
    num_features: int = Field(default=32, ge=1, le=65_536, description="Input dimension.")
    num_classes: int = Field(default=10, ge=2, le=10_000, description="Number of classes.")
    class_sep: float = Field(
        default=5.0, gt=0.0, le=100.0, description="Typical distance between class centres."
    )
    hidden_dim: int = Field(default=256, ge=1, le=16_384, description="MLP hidden width.")
    num_hidden_layers: int = Field(default=2, ge=0, le=16, description="MLP hidden layers.")

    @model_validator(mode="after")
    def _fits_in_memory(self) -> SyntheticOptions:
        total = (self.num_samples + self.num_val_samples + self.num_test_samples) * (
            self.num_features
        )
        if total > MAX_TOTAL_VALUES:
            raise ValueError(
                f"(num_samples + num_val_samples + num_test_samples) x num_features = {total:,} "
                f"values exceeds the limit of {MAX_TOTAL_VALUES:,} (1 GiB of float32); "
                "reduce the sample counts or num_features"
            )
        return self


#: Upper bound of tinylm's num_train_sequences x seq_len: 2**24 int64 tokens = 128 MiB.
MAX_TINYLM_TRAIN_TOKENS: Final = 2**24


class TinyLMOptions(TaskOptions):
    """Options of ``tinylm``: a byte-level causal Transformer on CPython's pydoc topics.

    Its metrics are a language model's: mean next-byte cross-entropy in nats (``val_loss``,
    the primary one), ``val_perplexity`` = exp(val_loss) and next-byte ``val_accuracy``.
    """

    metrics: ClassVar[Mapping[str, Literal["max", "min"]]] = {
        "val_loss": "min",
        "val_perplexity": "min",
        "val_accuracy": "max",
    }
    primary_metric: ClassVar[str] = "val_loss"

    seq_len: int = Field(
        default=64, ge=8, le=1024, description="Tokens (bytes) per sequence the model reads."
    )
    num_train_sequences: int = Field(
        default=2048,
        ge=16,
        le=200_000,
        description="Training sequences, cut at seeded random offsets of the training text.",
    )
    val_size_option: ClassVar[str | None] = "num_val_sequences"
    num_val_sequences: int = Field(
        default=512, ge=16, le=4096, description="Validation sequences (non-overlapping)."
    )
    num_test_sequences: int = Field(
        default=512, ge=16, le=4096, description="Held-out test sequences (non-overlapping)."
    )
    width: int = Field(default=64, ge=8, le=1024, description="Model width (embedding size).")
    num_layers: int = Field(default=2, ge=1, le=12, description="Transformer blocks.")
    num_heads: int = Field(default=4, ge=1, le=16, description="Attention heads per block.")

    @model_validator(mode="after")
    def _heads_divide_width_and_data_fits(self) -> TinyLMOptions:
        if self.width % self.num_heads:
            raise ValueError(
                f"width ({self.width}) must be a multiple of num_heads ({self.num_heads})"
            )
        tokens = self.num_train_sequences * self.seq_len
        if tokens > MAX_TINYLM_TRAIN_TOKENS:
            raise ValueError(
                f"num_train_sequences x seq_len = {tokens:,} tokens exceeds the limit of "
                f"{MAX_TINYLM_TRAIN_TOKENS:,} (128 MiB of int64 per tensor); reduce "
                "num_train_sequences or seq_len"
            )
        return self


class Cifar10Options(TaskOptions):
    data_dir: DataPath = Field(
        description="Trusted directory with data_batch_1..5 and test_batch (python format), "
        "relative to the datasets root (STAGETUNE_DATASETS_DIR) or an absolute path inside it.",
    )
    val_size_option: ClassVar[str | None] = "num_val_samples"
    num_val_samples: int = Field(
        default=5000, ge=1, le=49_999, description="Validation images carved from training."
    )
    max_train_samples: int | None = Field(
        default=None, ge=1, le=50_000, description="Use at most this many training images."
    )
    max_test_samples: int | None = Field(
        default=None, ge=1, le=10_000, description="Use at most this many test images."
    )
    depth: int = Field(default=20, ge=8, le=110, description="ResNet depth, 6n + 2.")
    width: int = Field(default=16, ge=4, le=128, description="Channels of the first stage.")
    augment: bool = Field(default=True, description="Random crop + flip of training batches.")

    @field_validator("depth")
    @classmethod
    def _depth_is_6n_plus_2(cls, depth: int) -> int:
        if (depth - 2) % 6:
            raise ValueError("depth must be 6n + 2 (8, 14, 20, 32, 44, 56, 110)")
        return depth
