"""The data files that ship with scikit-learn, read without importing scikit-learn.

``import sklearn`` takes 1.3-3 s of CPU (it imports SciPy's statistics), and every new trial
process that loads ``digits`` or ``denoise`` paid it; the files themselves (the digits CSV,
the two sample photographs) load in milliseconds. This module finds scikit-learn's package
directory without running its ``__init__`` and reads them as ``load_digits`` and
``load_sample_images`` do, and :func:`stratified_split` gives exactly the indices of
``train_test_split(..., test_size=n, stratify=y, random_state=seed)`` (scikit-learn 1.4-1.9's
``StratifiedShuffleSplit``; ``tests/workers/test_sklearn_data.py`` checks both against the
installed scikit-learn).
"""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["digits", "sample_images", "sklearn_dir", "stratified_split"]


def sklearn_dir() -> Path:
    """scikit-learn's package directory (found, not imported)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "scikit-learn is not installed: the digits and denoise tasks read the data files "
            "that ship with it (pip install scikit-learn)"
        )
    return Path(next(iter(spec.submodule_search_locations)))


def digits() -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``load_digits(return_X_y=True)``: ``(1797, 64)`` float64 pixels, ``(1797,)`` int64
    labels."""
    with gzip.open(sklearn_dir() / "datasets" / "data" / "digits.csv.gz", mode="rt") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1], data[:, -1].astype(np.int64)


def sample_images() -> list[np.ndarray[Any, Any]]:
    """``load_sample_images().images``: the sample photographs (sorted by file name) as
    ``(height, width, 3)`` uint8 arrays. Needs Pillow."""
    from PIL import Image

    images = []
    for path in sorted((sklearn_dir() / "datasets" / "images").glob("*.jpg")):
        with Image.open(path) as image:
            images.append(np.asarray(image))
    return images


def _approximate_mode(
    class_counts: np.ndarray[Any, Any], n_draws: int, rng: np.random.RandomState
) -> np.ndarray[Any, Any]:
    """Samples per class of ``n_draws`` draws, ties broken by ``rng`` (scikit-learn's
    ``sklearn.utils.extmath._approximate_mode``)."""
    continuous = class_counts / class_counts.sum() * n_draws
    floored = np.floor(continuous)
    need_to_add = int(n_draws - floored.sum())
    if need_to_add > 0:
        remainder = continuous - floored
        for value in np.sort(np.unique(remainder))[::-1]:
            (inds,) = np.where(remainder == value)
            add_now = min(len(inds), need_to_add)
            inds = rng.choice(inds, size=add_now, replace=False)
            floored[inds] += 1
            need_to_add -= add_now
            if need_to_add == 0:
                break
    counts: np.ndarray[Any, Any] = floored.astype(int)
    return counts


def stratified_split(
    y: np.ndarray[Any, Any], n_test: int, seed: int
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """``(train, test)`` indices into ``y``: those of scikit-learn's
    ``train_test_split(..., test_size=n_test, stratify=y, random_state=seed)``."""
    n_train = len(y) - n_test
    classes, y_indices, class_counts = np.unique(y, return_inverse=True, return_counts=True)
    if np.min(class_counts) < 2 or n_train < len(classes) or n_test < len(classes):
        raise ValueError(
            f"cannot stratify {len(y)} labels of {len(classes)} classes into {n_train} train "
            f"and {n_test} test samples: each class needs 2 samples and each side one per class"
        )
    class_indices = np.split(np.argsort(y_indices, kind="stable"), np.cumsum(class_counts)[:-1])
    rng = np.random.RandomState(seed)
    n_i = _approximate_mode(class_counts, n_train, rng)
    t_i = _approximate_mode(class_counts - n_i, n_test, rng)
    train: list[int] = []
    test: list[int] = []
    for i in range(len(classes)):
        permuted = class_indices[i].take(rng.permutation(class_counts[i]), mode="clip")
        train.extend(permuted[: n_i[i]])
        test.extend(permuted[n_i[i] : n_i[i] + t_i[i]])
    return rng.permutation(train), rng.permutation(test)
