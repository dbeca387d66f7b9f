"""``cifar10``: CIFAR-10 read from a local directory in the standard *python* format, a ResNet.

``data_dir`` must hold the files of ``cifar-10-python.tar.gz`` (the ``cifar-10-batches-py``
folder): ``data_batch_1`` .. ``data_batch_5`` and ``test_batch``, each a pickled dict with
``b"data"`` (uint8, ``(N, 3072)``: the 1024 red, then green, then blue values of a 32x32 image,
row-major) and ``b"labels"`` (N ints in 0..9); ``batches.meta`` is optional. Nothing is
downloaded. ``data_dir`` is a :data:`~tuner.task_paths.DataPath`: a path relative to the
datasets root (``STAGETUNE_DATASETS_DIR``, default ``<STAGETUNE_DATA_DIR>/datasets``), or an
absolute path inside it; the API refuses anything else at submission, and ``load_data``
checks it again.

**The directory must be trusted.** The format is a pickle. Files are read with an unpickler that
only accepts the NumPy array reconstructors and plain containers, which blocks the usual
code-execution payloads, but a pickle from an untrusted source should not be read at all.

The validation split (``num_val_samples``, default 5,000) is carved from the training batches by
a permutation seeded with ``data_seed``; the test split is ``test_batch``. Inputs are normalised
with the usual per-channel CIFAR-10 mean and std and held as float32 ``(N, 3, 32, 32)``
(the full set: about 740 MB). :meth:`Cifar10Task.augment_batch` applies the standard random
crop (4-pixel padding) and horizontal flip to a training batch on its device.

:func:`write_cifar10_python_format` writes images in the same format (tests, benchmarks with
synthetic CIFAR-size data; :func:`write_synthetic_cifar10`).
"""

from __future__ import annotations

import codecs
import os
import pickle
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from tuner.errors import ValidationError
from tuner.task_paths import check_data_path
from workers.task_options import Cifar10Options
from workers.tasks.base import BaseTask, OptimizerDefaults, TaskData, derive_seed
from workers.tasks.models import CifarResNet

__all__ = [
    "CIFAR10_LABEL_NAMES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "TASK",
    "TEST_FILE",
    "TRAIN_FILES",
    "Cifar10Options",
    "Cifar10Task",
    "random_crop_flip",
    "read_cifar10_batch",
    "write_cifar10_python_format",
    "write_synthetic_cifar10",
]

TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_FILE = "test_batch"
META_FILE = "batches.meta"
IMAGE_SHAPE = (3, 32, 32)
IMAGE_VALUES = 3 * 32 * 32
NUM_CLASSES = 10
CIFAR10_LABEL_NAMES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)


# --------------------------------------------------------------------------------------------
# reading and writing the python format


def _allowed_globals() -> dict[tuple[str, str], Any]:
    empty = np.empty(0, dtype=np.uint8)
    reconstruct = empty.__reduce__()[0]
    frombuffer = empty.__reduce_ex__(5)[0]
    scalar = np.int64(0).__reduce__()[0]
    allowed: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray}
    allowed[("numpy", "dtype")] = np.dtype
    # Python 3 writes bytes as _codecs.encode(str, "latin1") under pickle protocols < 3.
    allowed[("_codecs", "encode")] = codecs.encode
    for core in ("numpy.core", "numpy._core"):
        allowed[(f"{core}.multiarray", "_reconstruct")] = reconstruct
        allowed[(f"{core}.multiarray", "scalar")] = scalar
        allowed[(f"{core}.numeric", "_frombuffer")] = frombuffer
    return allowed


class _ArrayUnpickler(pickle.Unpickler):
    """Unpickles dicts / lists / bytes / numbers / NumPy arrays, nothing else."""

    _allowed = _allowed_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(
                f"refusing to load {module}.{name}: not part of the CIFAR-10 python format"
            ) from None


def read_cifar10_batch(path: Path) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``(data uint8 (N, 3072), labels int64 (N,))`` of one python-format batch file.

    ``ValidationError`` naming the file if it is not in that format.
    """
    try:
        with open(path, "rb") as fh:
            batch = _ArrayUnpickler(fh, encoding="bytes").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as exc:
        raise ValidationError(
            f"{path} is not a CIFAR-10 python-format batch (a pickled dict): {exc}"
        ) from None
    if not isinstance(batch, dict):
        raise ValidationError(f"{path}: expected a pickled dict, found {type(batch).__name__}")
    batch = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in batch.items()}
    if "data" not in batch or "labels" not in batch:
        raise ValidationError(f"{path}: the batch dict lacks 'data' or 'labels'")
    data = np.asarray(batch["data"])
    labels = np.asarray(batch["labels"], dtype=np.int64).reshape(-1)
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != IMAGE_VALUES:
        raise ValidationError(
            f"{path}: 'data' must be uint8 of shape (N, {IMAGE_VALUES}), "
            f"found {data.dtype} {data.shape}"
        )
    if labels.shape[0] != data.shape[0]:
        raise ValidationError(f"{path}: {data.shape[0]} images but {labels.shape[0]} labels")
    if labels.size and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValidationError(f"{path}: labels must be in 0..{NUM_CLASSES - 1}")
    return data, labels


def _as_rows(images: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8, got {images.dtype}")
    if images.ndim == 2 and images.shape[1] == IMAGE_VALUES:
        return np.ascontiguousarray(images)
    if images.ndim == 4 and images.shape[1:] == (32, 32, 3):  # NHWC, as most image libraries
        return np.ascontiguousarray(images.transpose(0, 3, 1, 2).reshape(len(images), -1))
    if images.ndim == 4 and images.shape[1:] == IMAGE_SHAPE:  # NCHW
        return np.ascontiguousarray(images.reshape(len(images), -1))
    raise ValueError(
        f"images must be (N, 3072), (N, 32, 32, 3) or (N, 3, 32, 32) uint8, got {images.shape}"
    )


def _dump(path: Path, obj: dict[bytes, Any]) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=4)


def write_cifar10_python_format(
    directory: str | os.PathLike[str],
    train_images: np.ndarray[Any, Any],
    train_labels: Sequence[int] | np.ndarray[Any, Any],
    test_images: np.ndarray[Any, Any],
    test_labels: Sequence[int] | np.ndarray[Any, Any],
    *,
    label_names: Sequence[str] = CIFAR10_LABEL_NAMES,
) -> Path:
    """Write images in CIFAR-10's python format into ``directory`` (created if needed).

    Images are uint8, ``(N, 32, 32, 3)`` (HWC), ``(N, 3, 32, 32)`` or ``(N, 3072)`` rows; labels
    ints in 0..9. The training images are split over ``data_batch_1..5`` in order; the test
    images go to ``test_batch``; ``batches.meta`` lists ``label_names``. Returns the directory.
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    train_rows = _as_rows(train_images)
    test_rows = _as_rows(test_images)
    train_y = [int(v) for v in np.asarray(train_labels).reshape(-1)]
    test_y = [int(v) for v in np.asarray(test_labels).reshape(-1)]
    if len(train_y) != len(train_rows) or len(test_y) != len(test_rows):
        raise ValueError("each image needs exactly one label")
    if any(not 0 <= v < NUM_CLASSES for v in train_y + test_y):
        raise ValueError(f"labels must be in 0..{NUM_CLASSES - 1}")
    chunks = np.array_split(np.arange(len(train_rows)), len(TRAIN_FILES))
    for i, (file_name, idx) in enumerate(zip(TRAIN_FILES, chunks, strict=True)):
        _dump(
            out / file_name,
            {
                b"batch_label": f"training batch {i + 1} of 5".encode(),
                b"labels": [train_y[j] for j in idx],
                b"data": train_rows[idx],
                b"filenames": [f"train_{j:05d}.png".encode() for j in idx],
            },
        )
    _dump(
        out / TEST_FILE,
        {
            b"batch_label": b"testing batch 1 of 1",
            b"labels": test_y,
            b"data": test_rows,
            b"filenames": [f"test_{j:05d}.png".encode() for j in range(len(test_y))],
        },
    )
    _dump(
        out / META_FILE,
        {
            b"num_cases_per_batch": int(chunks[0].size),
            b"label_names": [name.encode() for name in label_names],
            b"num_vis": IMAGE_VALUES,
        },
    )
    return out


def write_synthetic_cifar10(
    directory: str | os.PathLike[str],
    num_train: int = 50_000,
    num_test: int = 10_000,
    seed: int = 0,
) -> Path:
    """Write CIFAR-size synthetic images (class-dependent colour and stripes plus noise, so they
    are learnable) in the python format, for throughput benchmarks without the real data."""
    rng = np.random.default_rng(seed)
    colours = rng.uniform(40, 215, size=(NUM_CLASSES, 3))
    stripes = np.sin(np.arange(32)[None, :] * (np.arange(NUM_CLASSES)[:, None] + 1) * 0.3)

    def images(n: int) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        labels = rng.integers(0, NUM_CLASSES, size=n)
        x = colours[labels][:, :, None, None] + 30 * stripes[labels][:, None, None, :]
        x = x + rng.normal(0, 40, size=(n, 3, 32, 32))
        return np.clip(x, 0, 255).astype(np.uint8), labels

    train_x, train_y = images(num_train)
    test_x, test_y = images(num_test)
    return write_cifar10_python_format(directory, train_x, train_y, test_x, test_y)


# --------------------------------------------------------------------------------------------
# the task


def _resolve_dir(data_dir: str) -> Path:
    """The data directory, inside the datasets root (``load_data`` has resolved ``data_dir``
    already: checking again costs a ``realpath``)."""
    resolved = check_data_path(data_dir, option="cifar10 option data_dir")
    where = repr(data_dir)
    if not resolved.is_dir():
        raise ValidationError(
            f"cifar10 option data_dir: directory {where} does not exist; put the extracted "
            "cifar-10-batches-py folder under the datasets root (STAGETUNE_DATASETS_DIR) and "
            "pass its path relative to the root"
        )
    missing = [name for name in (*TRAIN_FILES, TEST_FILE) if not (resolved / name).is_file()]
    if missing:
        raise ValidationError(
            f"cifar10 option data_dir: {where} lacks {', '.join(missing)} (expected "
            f"{', '.join(TRAIN_FILES)} and {TEST_FILE}, the CIFAR-10 python-format files of "
            "cifar-10-python.tar.gz)"
        )
    return resolved


def _normalise(rows: np.ndarray[Any, Any]) -> torch.Tensor:
    x = torch.from_numpy(rows).view(-1, *IMAGE_SHAPE).to(torch.float32).div_(255.0)
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    return x.sub_(mean).div_(std)


class Cifar10Task(BaseTask[Cifar10Options]):
    name = "cifar10"
    description = (
        "CIFAR-10 from a local directory in the standard python format (option data_dir): "
        "45,000 train / 5,000 val (carved from the training batches) / 10,000 test images; a "
        "CIFAR ResNet (ResNet-20 at width 16 by default, 272k parameters), crop + flip "
        "augmentation."
    )
    default_epochs = 30
    default_base_batch_size = 128
    default_base_lr = 0.1
    default_optimizer = OptimizerDefaults(name="sgd", momentum=0.9, weight_decay=5e-4)
    options_model = Cifar10Options

    def _fingerprint(self, opts: Cifar10Options) -> Hashable:
        root = _resolve_dir(opts.data_dir)
        stats = []
        for name in (*TRAIN_FILES, TEST_FILE):
            st = (root / name).stat()
            stats.append((name, st.st_size, st.st_mtime_ns))
        return (str(root), tuple(stats))

    def _load(self, opts: Cifar10Options, data_seed: int) -> TaskData:
        root = _resolve_dir(opts.data_dir)
        parts = [read_cifar10_batch(root / name) for name in TRAIN_FILES]
        train_rows = np.concatenate([d for d, _ in parts])
        train_labels = np.concatenate([y for _, y in parts])
        test_rows, test_labels = read_cifar10_batch(root / TEST_FILE)
        n = len(train_labels)
        if opts.num_val_samples >= n:
            raise ValidationError(
                f"cifar10 option num_val_samples = {opts.num_val_samples} must be smaller than "
                f"the {n} training images in {str(root)!r}"
            )
        perm = np.random.default_rng(derive_seed(data_seed, 0)).permutation(n)
        val_idx = np.sort(perm[: opts.num_val_samples])
        train_idx = perm[opts.num_val_samples :]
        if opts.max_train_samples is not None:
            train_idx = train_idx[: opts.max_train_samples]
        train_idx = np.sort(train_idx)
        if opts.max_test_samples is not None:
            test_rows = test_rows[: opts.max_test_samples]
            test_labels = test_labels[: opts.max_test_samples]
        return TaskData(
            train_x=_normalise(train_rows[train_idx]),
            train_y=torch.from_numpy(train_labels[train_idx]),
            val_x=_normalise(train_rows[val_idx]),
            val_y=torch.from_numpy(train_labels[val_idx]),
            test_x=_normalise(np.ascontiguousarray(test_rows)),
            test_y=torch.from_numpy(np.ascontiguousarray(test_labels)),
            num_classes=NUM_CLASSES,
            input_shape=IMAGE_SHAPE,
        )

    def _build(self, opts: Cifar10Options) -> nn.Module:
        return CifarResNet(depth=opts.depth, width=opts.width, num_classes=NUM_CLASSES)

    def augment_batch(
        self, x: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Random 32x32 crop of the zero-padded (4 px; zero is the mean colour) image and a
        random horizontal flip, per sample, on ``x``'s device. ``generator`` must live on that
        device. Returns a new tensor (in channels-last layout); ``x`` is not modified."""
        return random_crop_flip(x, padding=4, generator=generator)


def random_crop_flip(
    x: torch.Tensor, padding: int = 4, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Per-sample random crop (after zero padding) and horizontal flip of ``(B, C, H, W)``."""
    b, _, h, w = x.shape
    device = x.device
    padded = nn.functional.pad(x, (padding, padding, padding, padding))
    dy = torch.randint(0, 2 * padding + 1, (b, 1), device=device, generator=generator)
    dx = torch.randint(0, 2 * padding + 1, (b, 1), device=device, generator=generator)
    flip = torch.rand(b, 1, device=device, generator=generator) < 0.5
    rows = dy + torch.arange(h, device=device)
    cols = torch.arange(w, device=device).expand(b, w)
    cols = torch.where(flip, cols.flip(1), cols) + dx
    batch = torch.arange(b, device=device)[:, None, None]
    out = padded[batch, :, rows[:, :, None], cols[:, None, :]]  # (B, H, W, C)
    return out.permute(0, 3, 1, 2)


TASK = Cifar10Task()
