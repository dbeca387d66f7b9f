"""``denoise``: Gaussian denoising of real photographs with a small DnCNN (a regression task).

Data: the two photographs that ship with scikit-learn (``sklearn.datasets.load_sample_images``:
``china.jpg`` and ``flower.jpg``, 427 x 640 RGB; nothing is downloaded), converted to grey
levels (ITU-R BT.601 luma) on the [0, 1] scale. Each image is cut into a grid of 6 x 10
blocks of 71 x 64 pixels (the last row of pixels is unused); per image, ``data_seed`` draws
8 blocks for validation, 8 for test and leaves 44 for training, so the three splits come from
disjoint image regions and no patch of one split shares a pixel with a patch of another.

* train: ``num_train_patches`` random ``patch_size`` crops inside the training blocks (a crop
  never straddles two blocks), each flipped / rotated by one of the 8 symmetries of the square
  (deterministic data expansion, drawn with the crops);
* val and test: every crop of the split's blocks on a grid of stride ``patch_size // 2``
  (at the default 24: 16 per block, 256 patches per split; at 32: 9 per block, 144).

Inputs are the clean patches plus Gaussian noise of std ``noise_sigma`` (default 25/255),
drawn once per split from ``data_seed`` (fixed noisy copies: validation figures compare
across trials; the inputs are not clipped); targets are the clean patches. Both are float32
``(N, 1, P, P)``. Everything depends on ``data_seed`` only (never on the trial's seed), and
the val / test patches and their noise do not change with ``num_train_patches``.

Loss: the sum over the batch of each patch's mean squared error. Metrics: ``val_psnr`` (the
primary one, max), the mean over patches of each patch's PSNR, ``10 log10(1 / mse)`` dB for
[0, 1] images, and ``val_loss`` (min), the mean per-patch MSE. The noisy input itself (the
model that does nothing) scores 20.2 dB at sigma 25/255 (``10 log10(255**2 / 25**2)``).

Model: :class:`~workers.tasks.models.DnCNN` (Zhang et al. 2017), ``depth`` conv layers of
``width`` channels, predicting the noise (output = input - prediction); 47,008 parameters
by default. AdamW (beta1 0.9, no weight decay), as is usual for DnCNN.

Measured through the trial loop (``.venv/bin/python bench/denoise_batch_penalty.py``; the
project's machine: 2 shared CPU cores, one thread per run; the small-batch baseline's schedule,
the LR / 4 at 50 % and 75 % of the epochs): the default run (8 epochs of batch 32 at LR 1e-3,
256 steps) scores 23.2, 28.8, 29.3, 29.2, 30.0, 30.2, 30.2, 30.1 dB after its epochs (seed 0;
seed 1 ends at 30.2), with 1.8-1.9 s of training per epoch on a quiet machine (16 s per run,
validation included; up to 4x that under load). The same 8 epochs at a larger batch, final
val PSNR (mean of seeds 0 and 1) and the penalty against the base batch's 30.15 dB:

=====  ================  ===============================
batch  sqrt LR scaling   linear scaling + 1-epoch warm-up
=====  ================  ===============================
64     29.66 (-0.49)     29.96 (-0.19)
128    27.47 (-2.67)     28.78 (-1.37)
256    22.68 (-7.46)     20.30 (-9.85)
512    19.25 (-10.89)    16.36 (-13.79)
=====  ================  ===============================

At 8x and 16x the run has 32 and 16 optimizer steps and ends near or below the noisy input.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, Final

import numpy as np
import torch
from torch import nn

from workers.task_options import DenoiseOptions
from workers.tasks.base import BaseTask, OptimizerDefaults, TaskData, derive_seed, spreads
from workers.tasks.models import DnCNN

__all__ = [
    "BLOCK_GRID",
    "BLOCK_SHAPE",
    "TASK",
    "DenoiseOptions",
    "DenoiseTask",
    "grey_images",
    "patch_layout",
    "per_sample_mse",
    "psnr",
]

#: Rows and columns of the grid of blocks each image is cut into.
BLOCK_GRID: Final = (6, 10)
#: Height and width of a block in pixels (427 // 6, 640 // 10).
BLOCK_SHAPE: Final = (71, 64)
#: Blocks of each image that go to the val and to the test split (the rest train).
VAL_BLOCKS: Final = 8
TEST_BLOCKS: Final = 8
#: The smallest MSE a PSNR is computed from (a perfect patch scores 100 dB, not infinity).
MIN_MSE: Final = 1e-10

# Sub-streams of derive_seed(data_seed, ...): 0-2 the noise of train / val / test, 3 the
# training crops, 10 + i the block split of image i.
_NOISE_STREAM: Final = {"train": 0, "val": 1, "test": 2}
_CROP_STREAM: Final = 3
_BLOCK_STREAM: Final = 10


@functools.cache
def grey_images() -> np.ndarray[Any, Any]:
    """scikit-learn's two sample photographs as grey levels in [0, 1]: ``(2, 427, 640)``
    float32 (read once per process; needs Pillow)."""
    from workers.tasks.sklearn_data import sample_images

    rgb = np.stack(sample_images())
    luma = rgb.astype(np.float64) @ np.array([0.299, 0.587, 0.114]) / 255.0
    grey: np.ndarray[Any, Any] = luma.astype(np.float32)
    grey.setflags(write=False)
    return grey


def _blocks(data_seed: int, num_images: int) -> dict[str, list[tuple[int, int, int]]]:
    """``(image, block row, block col)`` of each split's blocks."""
    rows, cols = BLOCK_GRID
    out: dict[str, list[tuple[int, int, int]]] = {"train": [], "val": [], "test": []}
    for image in range(num_images):
        rng = np.random.default_rng(derive_seed(data_seed, _BLOCK_STREAM + image))
        order = rng.permutation(rows * cols)
        parts = {
            "val": order[:VAL_BLOCKS],
            "test": order[VAL_BLOCKS : VAL_BLOCKS + TEST_BLOCKS],
            "train": order[VAL_BLOCKS + TEST_BLOCKS :],
        }
        for split, chosen in parts.items():
            out[split] += [(image, int(b) // cols, int(b) % cols) for b in sorted(chosen)]
    return out


def patch_layout(
    patch_size: int, num_train_patches: int, data_seed: int, num_images: int = 2
) -> dict[str, np.ndarray[Any, Any]]:
    """Where each split's patches come from: ``split -> (N, 4)`` int64 rows ``(image, top,
    left, symmetry)``, the patch being ``image[top:top + P, left:left + P]`` transformed by
    symmetry ``s`` (``rot90`` by ``s % 4`` quarter turns, then a left-right flip if ``s >= 4``;
    always 0 for val and test)."""
    bh, bw = BLOCK_SHAPE
    if not 1 <= patch_size <= min(bh, bw):
        raise ValueError(f"patch_size must be in 1-{min(bh, bw)}, got {patch_size}")
    blocks = _blocks(data_seed, num_images)
    layout: dict[str, np.ndarray[Any, Any]] = {}
    stride = max(1, patch_size // 2)
    offsets = [
        (dy, dx)
        for dy in range(0, bh - patch_size + 1, stride)
        for dx in range(0, bw - patch_size + 1, stride)
    ]
    for split in ("val", "test"):
        layout[split] = np.array(
            [
                (image, r * bh + dy, c * bw + dx, 0)
                for image, r, c in blocks[split]
                for dy, dx in offsets
            ],
            dtype=np.int64,
        )
    train_blocks = np.array(blocks["train"], dtype=np.int64)
    rng = np.random.default_rng(derive_seed(data_seed, _CROP_STREAM))
    which = rng.integers(0, len(train_blocks), num_train_patches)
    dy = rng.integers(0, bh - patch_size + 1, num_train_patches)
    dx = rng.integers(0, bw - patch_size + 1, num_train_patches)
    symmetry = rng.integers(0, 8, num_train_patches)
    chosen = train_blocks[which]
    layout["train"] = np.stack(
        [chosen[:, 0], chosen[:, 1] * bh + dy, chosen[:, 2] * bw + dx, symmetry], axis=1
    )
    return layout


def _crop(
    images: np.ndarray[Any, Any], rows: np.ndarray[Any, Any], patch_size: int
) -> np.ndarray[Any, Any]:
    """The patches of ``rows`` (a :func:`patch_layout` array): ``(N, 1, P, P)`` float32."""
    out = np.empty((len(rows), 1, patch_size, patch_size), dtype=np.float32)
    for i, (image, top, left, symmetry) in enumerate(rows.tolist()):
        patch = images[image, top : top + patch_size, left : left + patch_size]
        patch = np.rot90(patch, symmetry % 4)
        if symmetry >= 4:
            patch = patch[:, ::-1]
        out[i, 0] = patch
    return out


def per_sample_mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``(B,)``: each sample's mean squared error."""
    return (output - target).square().flatten(1).mean(dim=1)


def psnr(mse: torch.Tensor) -> torch.Tensor:
    """PSNR in dB of [0, 1] images from their MSE: ``10 log10(1 / mse)`` (at most 100 dB)."""
    return -10.0 * torch.log10(mse.clamp_min(MIN_MSE))


class DenoiseTask(BaseTask[DenoiseOptions]):
    name = "denoise"
    description = (
        "Gaussian denoising (sigma 25/255) of grey-level patches of scikit-learn's two sample "
        "photographs (train / val / test from disjoint image blocks): 1,024 train / 256 val / "
        "256 test 24x24 patches by default; a 7-layer DnCNN (47k parameters). Regression: "
        "val_psnr (dB, primary; the noisy input scores 20.2) and val_loss (per-patch MSE)."
    )
    default_epochs = 8
    default_base_batch_size = 32
    default_base_lr = 1e-3
    default_optimizer = OptimizerDefaults(name="adamw", momentum=0.9, weight_decay=0.0)
    options_model = DenoiseOptions

    def _load(self, opts: DenoiseOptions, data_seed: int) -> TaskData:
        images = grey_images()
        layout = patch_layout(opts.patch_size, opts.num_train_patches, data_seed, len(images))
        tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        for split, rows in layout.items():
            clean = _crop(images, rows, opts.patch_size)
            rng = np.random.default_rng(derive_seed(data_seed, _NOISE_STREAM[split]))
            noise = rng.standard_normal(clean.shape, dtype=np.float32)
            noisy = clean + np.float32(opts.noise_sigma) * noise
            tensors[split] = torch.from_numpy(noisy), torch.from_numpy(clean)
        return TaskData(
            train_x=tensors["train"][0],
            train_y=tensors["train"][1],
            val_x=tensors["val"][0],
            val_y=tensors["val"][1],
            test_x=tensors["test"][0],
            test_y=tensors["test"][1],
            num_classes=None,
            input_shape=(1, opts.patch_size, opts.patch_size),
        )

    def _build(self, opts: DenoiseOptions) -> nn.Module:
        return DnCNN(channels=1, depth=opts.depth, width=opts.width)

    def loss(
        self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
    ) -> torch.Tensor:
        """The sum over the batch of each patch's MSE (``label_smoothing`` does not apply)."""
        return per_sample_mse(output, target).sum()

    def eval_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        mse = per_sample_mse(output, target)
        db = psnr(mse)
        return {
            "mse": mse.sum(),
            "mse_sq": mse.double().square().sum(),
            "psnr": db.sum(),
            "psnr_sq": db.double().square().sum(),
        }

    def metrics_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        return {"psnr": sums["psnr"] / count, "loss": sums["mse"] / count}

    def spread_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        """The per-patch standard deviation of PSNR and of MSE."""
        return spreads(sums, count, {"psnr": "psnr", "loss": "mse"})


TASK = DenoiseTask()
