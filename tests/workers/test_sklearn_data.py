"""The digits and denoise tasks read scikit-learn's data files without importing it: the same
arrays and the same stratified splits as scikit-learn's own functions, and no ``sklearn`` module
in a process that loads them."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.datasets import load_digits, load_sample_images
from sklearn.model_selection import train_test_split

from tests.imports import imported_after
from workers.tasks import get_task, sklearn_data
from workers.tasks.base import load_tensors


def test_the_files_read_as_scikit_learns_loaders_read_them() -> None:
    x, y = sklearn_data.digits()
    want_x, want_y = load_digits(return_X_y=True)
    assert x.dtype == want_x.dtype
    assert y.dtype == np.int64
    np.testing.assert_array_equal(x, want_x)
    np.testing.assert_array_equal(y, want_y)

    images = sklearn_data.sample_images()
    want = load_sample_images().images
    assert len(images) == len(want) == 2
    for image, expected in zip(images, want, strict=True):
        np.testing.assert_array_equal(image, expected)


@pytest.mark.parametrize("seed", [0, 1, 7, 1000, 2**32 - 1])
@pytest.mark.parametrize("n_test", [10, 359, 900])
def test_the_split_is_train_test_split_with_stratify(seed: int, n_test: int) -> None:
    _, y = sklearn_data.digits()
    labels = y[: 1438 if n_test == 359 else len(y)]  # digits' second split is of 1,438
    index = np.arange(len(labels))
    want_train, want_test = train_test_split(
        index, test_size=n_test, stratify=labels, random_state=seed
    )
    train, test = sklearn_data.stratified_split(labels, n_test, seed)
    np.testing.assert_array_equal(train, want_train)
    np.testing.assert_array_equal(test, want_test)


def test_the_split_ties_and_uneven_classes_as_scikit_learn() -> None:
    """Classes of unequal sizes whose shares tie, so that the random tie-break decides."""
    labels = np.array([0] * 5 + [1] * 5 + [2] * 3 + [3] * 7 + [4] * 2)
    for seed in range(20):
        for n_test in (5, 7, 11):
            want = train_test_split(
                np.arange(len(labels)), test_size=n_test, stratify=labels, random_state=seed
            )
            got = sklearn_data.stratified_split(labels, n_test, seed)
            for a, b in zip(got, want, strict=True):
                np.testing.assert_array_equal(a, b)


def test_a_class_too_small_to_stratify_is_refused() -> None:
    with pytest.raises(ValueError, match="each class needs 2 samples"):
        sklearn_data.stratified_split(np.array([0, 0, 0, 1]), 2, 0)


def test_loading_digits_and_denoise_imports_no_scikit_learn() -> None:
    """A new trial process pays no scikit-learn import (1.3-3 s of CPU) for these tasks."""
    code = (
        "from workers.tasks import get_task\n"
        "from workers.tasks.base import load_tensors\n"
        "for name, opts in (('digits', {}), ('denoise', {'num_train_patches': 64})):\n"
        "    task = get_task(name)\n"
        "    load_tensors(task, task.validate_options(opts), 3)\n"
    )
    assert imported_after(code, "sklearn", "scipy") == []


def test_the_digits_splits_are_those_of_train_test_split() -> None:
    """The task's train / val / test tensors, built on scikit-learn's own functions."""
    task = get_task("digits")
    seed = 5
    data = load_tensors(task, task.validate_options({"data_seed": seed}), 0)
    x, y = load_digits(return_X_y=True)
    x_rest, x_test, y_rest, y_test = train_test_split(
        x, y, test_size=359, stratify=y, random_state=seed
    )
    x_train, x_val, y_train, y_val = train_test_split(
        x_rest, y_rest, test_size=359, stratify=y_rest, random_state=seed + 1
    )
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    std[std == 0] = 1.0
    for got_x, got_y, want_x, want_y in (
        (data.train_x, data.train_y, x_train, y_train),
        (data.val_x, data.val_y, x_val, y_val),
        (data.test_x, data.test_y, x_test, y_test),
    ):
        np.testing.assert_array_equal(got_y.numpy(), want_y)
        np.testing.assert_array_equal(got_x.numpy(), ((want_x - mean) / std).astype(np.float32))
