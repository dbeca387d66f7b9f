"""The task registry and the built-in tasks: data, models, options, evaluation."""

from __future__ import annotations

import os
import pickle
import random
from collections.abc import Iterator
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from pydantic import Field
from torch import nn

from tuner.errors import ConflictError, NotFoundError, StagetuneError, ValidationError
from tuner.settings import get_settings
from tuner.spec import StudySpec
from tuner.tasks import available_tasks
from workers.tasks import (
    BUILTIN_TASKS,
    BaseTask,
    TaskData,
    TaskOptions,
    clear_data_cache,
    evaluate,
    evaluate_totals,
    get_task,
    list_tasks,
    register_task,
    unregister_task,
)
from workers.tasks.base import load_tensors
from workers.tasks.cifar10 import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    read_cifar10_batch,
    write_cifar10_python_format,
)
from workers.tasks.models import count_parameters

SMALL_MNIST1D = {"num_train_samples": 300, "num_val_samples": 200, "num_test_samples": 200}


def rows_shared(a: torch.Tensor, b: torch.Tensor) -> int:
    """How many rows of ``a`` also occur (exactly) in ``b``."""
    seen = {row.tobytes() for row in b.reshape(len(b), -1).numpy()}
    return sum(row.tobytes() in seen for row in a.reshape(len(a), -1).numpy())


def assert_same_data(a: TaskData, b: TaskData) -> None:
    for split in ("train", "val", "test"):
        (xa, ya), (xb, yb) = a.split(split), b.split(split)
        assert torch.equal(xa, xb), split
        assert torch.equal(ya, yb), split


@pytest.fixture(scope="module")
def mnist1d_default() -> TaskData:
    """The default mnist1d data set (5,000 / 8,000 / 8,000), generated once for the module."""
    return load_tensors(get_task("mnist1d"), {}, seed=0)


# --------------------------------------------------------------------------------------------
# registry


def test_builtins_are_listed_with_usable_defaults() -> None:
    infos = {info.name: info for info in list_tasks()}
    assert {"mnist1d", "digits", "synthetic", "cifar10", "tinylm", "denoise"} <= set(infos)
    assert set(available_tasks()) <= set(infos)  # every name the API accepts loads here
    for name, info in infos.items():
        task = get_task(name)
        assert task.name == name
        assert info.default_epochs >= 1
        assert info.default_base_batch_size >= 1
        assert info.default_base_lr > 0
        assert info.default_optimizer.name in ("sgd", "adamw", "lars")
        assert info.options_schema["type"] == "object"
        assert "data_seed" in info.options_schema["properties"]
    assert infos["cifar10"].options_schema["required"] == ["data_dir"]


def test_entry_points_and_builtin_fallback_name_the_same_modules() -> None:
    for name, target in BUILTIN_TASKS.items():
        module = target.partition(":")[0]
        assert type(get_task(name)).__module__ == module


def test_unknown_task_names_the_known_ones() -> None:
    with pytest.raises(NotFoundError) as info:
        get_task("mnist2d")
    message = str(info.value)
    assert "mnist2d" in message
    for name in ("cifar10", "denoise", "digits", "mnist1d", "synthetic", "tinylm"):
        assert name in message


EXT_MODULE = """
from __future__ import annotations

import torch
from pydantic import Field

from workers.tasks import BaseTask, TaskData, TaskOptions


class ExtOptions(TaskOptions):
    n: int = Field(default=4, ge=2, le=100)


class ExtTask(BaseTask[ExtOptions]):
    name = "ext-demo"
    description = "A third-party task."
    default_epochs = 2
    default_base_batch_size = 2
    default_base_lr = 0.1
    options_model = ExtOptions

    def _load(self, opts: ExtOptions, data_seed: int) -> TaskData:
        x = torch.arange(opts.n, dtype=torch.float32).unsqueeze(1)
        y = torch.arange(opts.n) % 2
        return TaskData(x, y, x, y, x, y, num_classes=2, input_shape=(1,))

    def _build(self, opts: ExtOptions) -> torch.nn.Module:
        return torch.nn.Linear(1, 2)


TASK = ExtTask()
"""


def _with_entry_points(monkeypatch: pytest.MonkeyPatch, extra: list[EntryPoint]) -> None:
    real = list(entry_points(group="stagetune.tasks"))

    def fake(group: str) -> list[EntryPoint]:
        assert group == "stagetune.tasks"
        return real + extra

    monkeypatch.setattr("workers.tasks.entry_points", fake)


def test_third_party_task_loads_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "stagetune_ext_demo.py").write_text(EXT_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    group = "stagetune.tasks"
    _with_entry_points(
        monkeypatch,
        [
            EntryPoint(name="ext-demo", value="stagetune_ext_demo:TASK", group=group),
            EntryPoint(name="ext-broken", value="stagetune_no_such_module:TASK", group=group),
            EntryPoint(name="ext-misnamed", value="stagetune_ext_demo:TASK", group=group),
        ],
    )
    task = get_task("ext-demo")
    assert load_tensors(task, {"n": 6}, seed=0).num_train == 6
    with pytest.raises(ValidationError, match="'n'"):
        load_tensors(task, {"n": 1}, seed=0)
    with pytest.raises(StagetuneError, match="stagetune_no_such_module:TASK"):
        get_task("ext-broken")
    with pytest.raises(StagetuneError, match="calls itself 'ext-demo'"):
        get_task("ext-misnamed")
    names = [info.name for info in list_tasks()]  # the broken ones are left out
    assert "ext-demo" in names
    assert "ext-broken" not in names
    assert "mnist1d" in names


def test_builtins_resolve_without_package_metadata(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("workers.tasks.entry_points", lambda group: [])
    assert sorted(BUILTIN_TASKS) == [
        "cifar10",
        "denoise",
        "digits",
        "mnist1d",
        "synthetic",
        "tinylm",
    ]
    for name in BUILTIN_TASKS:
        assert get_task(name).name == name
    with pytest.raises(NotFoundError):
        get_task("ext-demo")


class _TinyOptions(TaskOptions):
    scale: float = Field(default=1.0, gt=0, le=10)


class _TinyTask(BaseTask[_TinyOptions]):
    name = "tiny-test-task"
    description = "Two separable points."
    default_epochs = 1
    default_base_batch_size = 2
    default_base_lr = 0.1
    options_model = _TinyOptions

    def __init__(self) -> None:
        self.loads = 0

    def _load(self, opts: _TinyOptions, data_seed: int) -> TaskData:
        self.loads += 1
        x = torch.tensor([[-opts.scale], [opts.scale]])
        y = torch.tensor([0, 1])
        return TaskData(x, y, x, y, x, y, num_classes=2, input_shape=(1,))

    def _build(self, opts: _TinyOptions) -> nn.Module:
        return nn.Linear(1, 2)


@pytest.fixture
def tiny_task() -> Iterator[_TinyTask]:
    task = register_task(_TinyTask())
    assert isinstance(task, _TinyTask)
    yield task
    unregister_task(task.name)


def test_registered_task_resolves_lists_and_unregisters(tiny_task: _TinyTask) -> None:
    assert get_task("tiny-test-task") is tiny_task
    assert "tiny-test-task" in [info.name for info in list_tasks()]
    with pytest.raises(ConflictError, match="replace=True"):
        register_task(_TinyTask())
    unregister_task("tiny-test-task")
    with pytest.raises(NotFoundError):
        get_task("tiny-test-task")
    register_task(tiny_task)  # for the fixture's clean-up


def test_a_registered_task_can_be_used_in_a_study_spec(tiny_task: _TinyTask) -> None:
    """``register_task`` makes the name valid in a ``StudySpec`` of this process, the options
    checked with the task's own model; unregistering takes it away again."""
    assert "tiny-test-task" in available_tasks()
    spec = StudySpec.from_dict({"task": "tiny-test-task", "task_options": {"scale": 2.0}})
    assert spec.task_options == {"scale": 2.0}
    with pytest.raises(ValidationError, match=r"task_options\.scale"):
        StudySpec.from_dict({"task": "tiny-test-task", "task_options": {"scale": 20}})
    with pytest.raises(ValidationError, match=r"task_options\.bogus"):
        StudySpec.from_dict({"task": "tiny-test-task", "task_options": {"bogus": 1}})
    unregister_task("tiny-test-task")
    try:
        with pytest.raises(ValidationError, match="unknown task"):
            StudySpec.from_dict({"task": "tiny-test-task"})
    finally:
        register_task(tiny_task)  # for the fixture's clean-up


def test_registering_a_builtin_name_needs_replace() -> None:
    class Shadow(_TinyTask):
        name = "digits"

    with pytest.raises(ConflictError, match="digits"):
        register_task(Shadow())
    shadow = register_task(Shadow(), replace=True)
    try:
        assert get_task("digits") is shadow
    finally:
        unregister_task("digits")
    assert type(get_task("digits")).__module__ == "workers.tasks.digits"


def test_loaded_data_is_cached_per_options_and_data_seed(tiny_task: _TinyTask) -> None:
    clear_data_cache()
    first = load_tensors(tiny_task, {}, seed=1)
    assert load_tensors(tiny_task, {}, seed=2) is first  # default data_seed 0: seed not used
    assert tiny_task.loads == 1
    load_tensors(tiny_task, {"scale": 2.0}, seed=1)
    load_tensors(tiny_task, {"data_seed": None}, seed=7)
    assert tiny_task.loads == 3
    clear_data_cache()
    load_tensors(tiny_task, {}, seed=1)
    assert tiny_task.loads == 4


# --------------------------------------------------------------------------------------------
# options


@pytest.mark.parametrize(
    ("task", "options", "expected"),
    [
        ("mnist1d", {"num_train_samples": 10**7}, ["num_train_samples", "<= 200000"]),
        ("mnist1d", {"num_train_samples": 1005}, ["num_train_samples", "multiple of 10"]),
        ("mnist1d", {"epochs": 3}, ["unknown option 'epochs'", "num_train_samples"]),
        ("digits", {"hidden_dim": 0}, ["hidden_dim", ">= 8"]),
        ("digits", {"data_seed": -1}, ["data_seed", ">= 0"]),
        ("synthetic", {"num_classes": 1}, ["num_classes", ">= 2"]),
        (
            "synthetic",
            {"num_samples": 10_000_000, "num_features": 1000},
            ["num_samples", "num_features", "1 GiB"],
        ),
        ("cifar10", {}, ["data_dir", "required"]),
        ("cifar10", {"data_dir": "/x", "depth": 21}, ["depth", "6n + 2"]),
    ],
)
def test_bad_options_name_the_option_and_what_it_allows(
    task: str, options: dict[str, Any], expected: list[str]
) -> None:
    with pytest.raises(ValidationError) as info:
        get_task(task).validate_options(options)
    for text in expected:
        assert text in str(info.value)
    with pytest.raises(ValidationError):
        get_task(task).build_model(options)


def test_validate_options_fills_in_defaults() -> None:
    assert get_task("mnist1d").validate_options(None) == {
        "data_seed": 0,
        "num_train_samples": 5000,
        "num_val_samples": 8000,
        "num_test_samples": 8000,
        "width": 32,
    }


# --------------------------------------------------------------------------------------------
# mnist1d


def test_mnist1d_default_splits(mnist1d_default: TaskData) -> None:
    data = mnist1d_default
    assert (data.num_train, data.num_val, data.num_test) == (5000, 8000, 8000)
    assert data.input_shape == (1, 40)
    assert data.train_x.shape == (5000, 1, 40)
    assert data.train_x.dtype == torch.float32
    assert data.train_y.dtype == torch.int64
    assert data.num_classes == 10
    for _, y in (data.split("train"), data.split("val"), data.split("test")):
        assert torch.bincount(y, minlength=10).tolist() == [len(y) // 10] * 10
    assert rows_shared(data.val_x, data.train_x) == 0
    assert rows_shared(data.test_x, data.train_x) == 0
    assert rows_shared(data.test_x, data.val_x) == 0


def test_mnist1d_is_deterministic_and_independent_of_trial_seed() -> None:
    task = get_task("mnist1d")
    first = load_tensors(task, SMALL_MNIST1D, seed=0)
    clear_data_cache()
    again = load_tensors(task, SMALL_MNIST1D, seed=123)  # regenerated, same data_seed
    assert again is not first
    assert_same_data(first, again)
    other = load_tensors(task, {**SMALL_MNIST1D, "data_seed": 1}, seed=0)
    assert not torch.equal(other.train_x, first.train_x)
    from_trial_seed = load_tensors(task, {**SMALL_MNIST1D, "data_seed": None}, seed=1)
    assert_same_data(from_trial_seed, other)


def test_mnist1d_test_split_does_not_depend_on_train_size() -> None:
    task = get_task("mnist1d")
    small = load_tensors(task, SMALL_MNIST1D, seed=0)
    larger = load_tensors(task, {**SMALL_MNIST1D, "num_train_samples": 400}, seed=0)
    assert torch.equal(small.test_x, larger.test_x)
    assert torch.equal(small.val_x, larger.val_x)


def test_mnist1d_generation_leaves_global_rngs_alone() -> None:
    clear_data_cache()
    np.random.seed(5)
    random.seed(5)
    expected = (np.random.random(), random.random())
    np.random.seed(5)
    random.seed(5)
    load_tensors(get_task("mnist1d"), {**SMALL_MNIST1D, "data_seed": 99}, seed=0)
    assert (np.random.random(), random.random()) == expected


# --------------------------------------------------------------------------------------------
# digits and synthetic


def test_digits_splits_are_standardised_stratified_and_deterministic() -> None:
    task = get_task("digits")
    data = load_tensors(task, {}, seed=0)
    assert (data.num_train, data.num_val, data.num_test) == (1079, 359, 359)
    assert data.train_x.shape == (1079, 64)
    assert data.input_shape == (64,)
    assert data.train_x.dtype == torch.float32
    assert data.num_classes == 10
    assert data.train_x.mean(0).abs().max() < 1e-4
    for _, y in (data.split("val"), data.split("test")):
        assert torch.bincount(y, minlength=10).min() >= 33  # about 36 of each digit
    clear_data_cache()
    assert_same_data(data, load_tensors(task, {}, seed=5))
    assert not torch.equal(load_tensors(task, {"data_seed": 1}, seed=0).test_y, data.test_y)


def test_synthetic_follows_its_options() -> None:
    task = get_task("synthetic")
    options = {
        "num_samples": 500,
        "num_val_samples": 50,
        "num_test_samples": 70,
        "num_features": 12,
        "num_classes": 3,
    }
    data = load_tensors(task, options, seed=0)
    assert data.train_x.shape == (500, 12)
    assert (data.num_val, data.num_test) == (50, 70)
    assert data.num_classes == 3
    assert set(data.train_y.tolist()) == {0, 1, 2}
    assert data.train_x.dtype == torch.float32
    assert rows_shared(data.test_x, data.train_x) == 0
    clear_data_cache()
    assert_same_data(data, load_tensors(task, options, seed=9))
    more = load_tensors(task, {**options, "num_samples": 600}, seed=0)
    assert torch.equal(more.test_x, data.test_x)


# --------------------------------------------------------------------------------------------
# cifar10


@pytest.fixture
def datasets_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """``tmp_path`` as the datasets root (``STAGETUNE_DATASETS_DIR``) of this process."""
    monkeypatch.setenv("STAGETUNE_DATASETS_DIR", str(tmp_path))
    get_settings.cache_clear()
    yield tmp_path
    get_settings.cache_clear()


def _write_original_format(directory: Path, n_per_batch: int, seed: int) -> dict[str, Any]:
    """A tiny CIFAR-10 set written the way the original files are laid out (no stagetune code):
    pickled dicts with bytes keys, b"data" uint8 (N, 3072), b"labels" a list of ints."""
    rng = np.random.default_rng(seed)
    directory.mkdir()
    written: dict[str, Any] = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        data = rng.integers(0, 256, size=(n_per_batch, 3072), dtype=np.uint8)
        labels = [int(v) for v in rng.integers(0, 10, size=n_per_batch)]
        with open(directory / name, "wb") as fh:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels}, fh)
        written[name] = (data, labels)
    return written


@pytest.mark.usefixtures("datasets_root")
def test_cifar10_reads_the_python_format(tmp_path: Path) -> None:
    written = _write_original_format(tmp_path / "cifar", n_per_batch=8, seed=0)
    task = get_task("cifar10")
    options = {"data_dir": str(tmp_path / "cifar"), "num_val_samples": 10}
    data = load_tensors(task, options, seed=0)
    assert (data.num_train, data.num_val, data.num_test) == (30, 10, 8)
    assert data.input_shape == (3, 32, 32)
    assert data.train_x.dtype == torch.float32
    assert data.num_classes == 10

    # the test split is test_batch in order, channel-major rows, normalised per channel
    raw, labels = written["test_batch"]
    assert data.test_y.tolist() == labels
    pixel = raw[3].reshape(3, 32, 32)[:, 5, 7] / 255.0
    expected = (pixel - np.array(CIFAR10_MEAN)) / np.array(CIFAR10_STD)
    np.testing.assert_allclose(data.test_x[3, :, 5, 7].numpy(), expected, rtol=1e-5, atol=1e-5)

    # train + val partition the five training batches
    train_raw = np.concatenate([written[f"data_batch_{i}"][0] for i in range(1, 6)])
    all_x = torch.cat([data.train_x, data.val_x])
    assert rows_shared(data.val_x, data.train_x) == 0
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    restored = ((all_x * std + mean) * 255).round().to(torch.uint8).reshape(40, -1)
    assert sorted(map(bytes, restored.numpy())) == sorted(map(bytes, train_raw))

    clear_data_cache()
    assert_same_data(data, load_tensors(task, options, seed=3))
    quick = load_tensors(task, {**options, "max_train_samples": 12, "max_test_samples": 5}, seed=0)
    assert (quick.num_train, quick.num_val, quick.num_test) == (12, 10, 5)
    assert torch.equal(quick.val_x, data.val_x)


@pytest.mark.usefixtures("datasets_root")
def test_cifar10_writer_round_trips(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(23, 32, 32, 3), dtype=np.uint8)  # HWC
    labels = rng.integers(0, 10, size=23)
    out = write_cifar10_python_format(tmp_path / "c", images, labels, images[:4], labels[:4])
    data, read_labels = read_cifar10_batch(out / "data_batch_1")
    assert len(data) == 5  # 23 images over 5 batches: 5, 5, 5, 4, 4
    np.testing.assert_array_equal(data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1), images[:5])
    np.testing.assert_array_equal(read_labels, labels[:5])
    task_data = load_tensors(get_task("cifar10"), {"data_dir": str(out), "num_val_samples": 3}, 0)
    assert (task_data.num_train, task_data.num_val, task_data.num_test) == (20, 3, 4)


@pytest.mark.usefixtures("datasets_root")
def test_cifar10_rejects_missing_directory_and_files(tmp_path: Path) -> None:
    task = get_task("cifar10")
    with pytest.raises(ValidationError, match="does not exist"):
        load_tensors(task, {"data_dir": str(tmp_path / "nowhere")}, seed=0)
    _write_original_format(tmp_path / "partial", n_per_batch=2, seed=0)
    os.remove(tmp_path / "partial" / "data_batch_3")
    os.remove(tmp_path / "partial" / "test_batch")
    with pytest.raises(ValidationError) as info:
        load_tensors(task, {"data_dir": str(tmp_path / "partial")}, seed=0)
    message = str(info.value)
    assert "data_batch_3, test_batch" in message
    assert "data_batch_1" not in message.split("lacks")[1].split("(")[0]


@pytest.mark.usefixtures("datasets_root")
def test_cifar10_rejects_too_large_val_split(tmp_path: Path) -> None:
    _write_original_format(tmp_path / "c", n_per_batch=2, seed=0)
    with pytest.raises(ValidationError, match=r"num_val_samples = 5000 .* 10 training images"):
        load_tensors(get_task("cifar10"), {"data_dir": str(tmp_path / "c")}, seed=0)


class _Payload:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, ("echo pwned",))


@pytest.mark.usefixtures("datasets_root")
def test_cifar10_refuses_pickles_that_run_code(tmp_path: Path) -> None:
    _write_original_format(tmp_path / "c", n_per_batch=2, seed=0)
    with open(tmp_path / "c" / "test_batch", "wb") as fh:
        pickle.dump({b"data": _Payload(), b"labels": [0]}, fh)
    with pytest.raises(ValidationError, match="refusing to load"):
        load_tensors(
            get_task("cifar10"), {"data_dir": str(tmp_path / "c"), "num_val_samples": 1}, 0
        )


def test_cifar10_data_dir_is_relative_to_the_datasets_root(datasets_root: Path) -> None:
    _write_original_format(datasets_root / "cifar", n_per_batch=2, seed=0)
    data = load_tensors(get_task("cifar10"), {"data_dir": "cifar", "num_val_samples": 2}, 0)
    assert (data.num_train, data.num_val, data.num_test) == (8, 2, 2)


@pytest.mark.parametrize(
    "data_dir",
    ["../outside", "/etc", "~root", "file:///etc", "http://example.com/cifar", "link/inner"],
)
def test_cifar10_loading_rechecks_the_path_policy(
    datasets_root: Path, tmp_path_factory: pytest.TempPathFactory, data_dir: str
) -> None:
    """The worker checks the path again when it loads (a symlink may have been planted or
    changed after submission): nothing outside the datasets root is read."""
    outside = tmp_path_factory.mktemp("outside")
    _write_original_format(outside / "inner", n_per_batch=2, seed=0)
    (datasets_root / "link").symlink_to(outside, target_is_directory=True)
    clear_data_cache()
    with pytest.raises(ValidationError, match="data_dir") as info:
        load_tensors(get_task("cifar10"), {"data_dir": data_dir, "num_val_samples": 2}, 0)
    assert "STAGETUNE_DATASETS_DIR" in str(info.value)


def test_cifar10_augmentation_crops_and_flips_each_image() -> None:
    task = get_task("cifar10")
    x = torch.randn(6, 3, 32, 32)
    out = task.augment_batch(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape
    padded = nn.functional.pad(x, (4, 4, 4, 4))
    for i in range(len(x)):
        candidates = [
            view
            for dy in range(9)
            for dx in range(9)
            for view in (padded[i, :, dy : dy + 32, dx : dx + 32],)
            for view in (view, view.flip(-1))
        ]
        assert any(torch.equal(out[i], c) for c in candidates)
    assert not torch.equal(out, x)
    assert torch.equal(task.augment_batch(x, torch.Generator().manual_seed(0)), out)
    assert get_task("digits").augment_batch(x) is x


# --------------------------------------------------------------------------------------------
# models and evaluation


@pytest.mark.parametrize(
    ("name", "options", "input_shape", "num_classes", "params"),
    [
        ("mnist1d", {}, (1, 40), 10, (20_000, 50_000)),
        ("digits", {}, (64,), 10, (5_000, 20_000)),
        ("synthetic", {"num_features": 7, "num_classes": 4}, (7,), 4, (1_000, 200_000)),
        ("cifar10", {"data_dir": "/unused", "depth": 8}, (3, 32, 32), 10, (50_000, 100_000)),
        ("cifar10", {"data_dir": "/unused"}, (3, 32, 32), 10, (250_000, 300_000)),
    ],
)
def test_models_give_logits_and_initialise_deterministically(
    name: str,
    options: dict[str, Any],
    input_shape: tuple[int, ...],
    num_classes: int,
    params: tuple[int, int],
) -> None:
    task = get_task(name)
    torch.manual_seed(0)
    model = task.build_model(options)
    torch.manual_seed(0)
    twin = task.build_model(options)
    for (key, a), b in zip(model.state_dict().items(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b), key
    assert params[0] <= count_parameters(model) <= params[1]
    model.eval()
    logits = model(torch.randn(5, *input_shape))
    assert logits.shape == (5, num_classes)


def test_cifar_resnet_accepts_channels_last() -> None:
    torch.manual_seed(0)
    model = get_task("cifar10").build_model({"data_dir": "/unused", "depth": 8}).eval()
    x = torch.randn(4, 3, 32, 32)
    expected = model(x)
    cl_model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    got = cl_model(x.contiguous(memory_format=torch.channels_last))
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_evaluate_matches_cross_entropy_and_accuracy() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5))
    model.train()
    x = torch.randn(37, 3)
    y = torch.randint(0, 4, (37,))
    loss, accuracy = evaluate(model, x, y, batch_size=8)
    assert model.training  # mode restored
    with torch.no_grad():
        logits = model[0](x)  # eval mode: dropout is the identity
    assert loss == pytest.approx(nn.functional.cross_entropy(logits, y).item(), rel=1e-6)
    assert accuracy == pytest.approx((logits.argmax(1) == y).float().mean().item())
    loss_sum, correct, count = evaluate_totals(model, x, y, batch_size=100)
    assert count == 37
    assert loss_sum / count == pytest.approx(loss, rel=1e-6)
    assert correct / count == pytest.approx(accuracy)


def test_digits_trains_to_high_accuracy_quickly() -> None:
    torch.set_num_threads(1)
    task = get_task("digits")
    data = load_tensors(task, {}, seed=0)
    torch.manual_seed(0)
    model = task.build_model({})
    _, accuracy_before = evaluate(model, data.val_x, data.val_y)
    opt = torch.optim.SGD(model.parameters(), lr=task.default_base_lr, momentum=0.9)
    batch = task.default_base_batch_size
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        perm = torch.randperm(data.num_train, generator=gen)
        for start in range(0, data.num_train - batch + 1, batch):
            idx = perm[start : start + batch]
            loss = nn.functional.cross_entropy(model(data.train_x[idx]), data.train_y[idx])
            opt.zero_grad()
            loss.backward()  # type: ignore[no-untyped-call]
            opt.step()
    _, accuracy = evaluate(model, data.val_x, data.val_y)
    assert accuracy_before < 0.3
    assert accuracy > 0.90


def _per_sample_values(task_name: str, out: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    """Each sample's metric values, computed here without the task's sums."""
    if task_name == "denoise":
        mse = (out - y).square().flatten(1).mean(dim=1).double()
        return {"loss": mse, "psnr": -10.0 * torch.log10(mse)}
    if task_name == "tinylm":
        ce = nn.functional.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="none")
        right = (out.argmax(-1) == y).double()
        return {"loss": ce.view(y.shape).double().mean(-1), "accuracy": right.mean(-1)}
    ce = nn.functional.cross_entropy(out, y, reduction="none").double()
    return {"loss": ce, "accuracy": (out.argmax(1) == y).double()}


@pytest.mark.parametrize("task_name", ["digits", "denoise", "tinylm"])
def test_each_task_reports_its_metrics_per_sample_spread_from_its_sums(task_name: str) -> None:
    """``spread_from_sums``: the standard deviation over the split's samples of each metric
    that is a mean over them (how finely one run on the split reads it), from the same summed
    batches as the metrics, equal to the spread of the per-sample values."""
    from workers.tasks.base import metric_spread

    task = get_task(task_name)
    gen = torch.Generator().manual_seed(3)
    n = 96
    if task_name == "denoise":
        y = torch.rand(n, 1, 8, 8, generator=gen)
        out = y + 0.1 * torch.randn(n, 1, 8, 8, generator=gen) * torch.rand(n, 1, 1, 1)
    elif task_name == "tinylm":
        y = torch.randint(0, 256, (n, 12), generator=gen)
        out = torch.randn(n, 12, 256, generator=gen)
        out.scatter_add_(2, y.unsqueeze(-1), 3.0 * torch.rand(n, 12, 1, generator=gen))
    else:
        y = torch.randint(0, 10, (n,), generator=gen)
        out = torch.randn(n, 10, generator=gen)
    sums: dict[str, float] = {}
    for lo in range(0, n, 40):  # in batches, as the loop and its workers add them up
        for key, value in task.eval_sums(out[lo : lo + 40], y[lo : lo + 40]).items():
            sums[key] = sums.get(key, 0.0) + float(value)
    spread = metric_spread(task, sums, n)
    values = task.metrics_from_sums(sums, n)
    expected = _per_sample_values(task_name, out, y)
    assert set(spread) == set(expected)
    for name, per_sample in expected.items():
        assert values[name] == pytest.approx(float(per_sample.mean()), rel=1e-5)
        assert spread[name] == pytest.approx(float(per_sample.std(unbiased=False)), rel=1e-4)
        assert spread[name] > 0


@pytest.mark.parametrize(
    ("task_name", "options"),
    [
        ("synthetic", {"num_samples": 300, "num_val_samples": 130, "num_test_samples": 50}),
        ("tinylm", {"num_train_sequences": 64, "num_val_sequences": 48, "width": 16}),
        ("mnist1d", {"num_train_samples": 500, "num_val_samples": 300}),
    ],
)
def test_the_option_a_task_names_for_its_validation_size_sets_it(
    task_name: str, options: dict[str, Any]
) -> None:
    """A study's note names ``val_size_option`` as the way to a finer-reading split."""
    task = get_task(task_name)
    option = task.options_model.val_size_option  # type: ignore[attr-defined]
    assert option in options
    assert load_tensors(task, options, 0).num_val == options[option]


def test_every_task_names_a_real_option_for_its_validation_size_or_none() -> None:
    named = {}
    for name in available_tasks():
        model = get_task(name).options_model
        option = getattr(model, "val_size_option", None)
        assert option is None or option in model.model_fields, (name, option)
        named[name] = option
    # digits and denoise have fixed splits (scikit-learn's digits; a grid of image blocks)
    assert named["digits"] is None
    assert named["denoise"] is None
    assert named["cifar10"] == "num_val_samples"
