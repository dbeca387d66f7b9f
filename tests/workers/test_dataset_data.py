"""Task protocol v2: data as map-style datasets read from disk through DataLoader workers.

The loop reads a step's samples by index, so a task whose samples come from files gives the
same batches (and the same training, bit for bit) as the same samples held in memory.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tuner.errors import ValidationError
from tuner.schedule import Schedule, Stage
from workers.gang import WorkerContext
from workers.loop import TrialWorker
from workers.task_options import TaskOptions
from workers.tasks import (
    BaseTask,
    DatasetData,
    TaskData,
    check_model,
    get_task,
    load_tensors,
    register_task,
    unregister_task,
)
from workers.trainable import ScheduleTrainable


class DirOptions(TaskOptions):
    data_dir: str
    loader_workers: int = 0


class _NpyDataset(torch.utils.data.Dataset[tuple[np.ndarray, np.int64]]):
    """One split stored as ``<split>_x.npy`` / ``<split>_y.npy``, memory-mapped on first use
    (in each DataLoader worker process), one sample per ``__getitem__``."""

    def __init__(self, root: Path, split: str) -> None:
        self.root, self.split = root, split
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None
        self.length = int(np.load(root / f"{split}_y.npy", mmap_mode="r").shape[0])

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.int64]:
        if self._x is None or self._y is None:
            self._x = np.load(self.root / f"{self.split}_x.npy", mmap_mode="r")
            self._y = np.load(self.root / f"{self.split}_y.npy", mmap_mode="r")
        return np.array(self._x[index]), self._y[index]


class DiskDigits(BaseTask[DirOptions]):
    """scikit-learn's digits, read sample by sample from .npy files."""

    name = "test_disk_digits"
    description = "digits from .npy files through DataLoader workers"
    default_epochs = 3
    default_base_batch_size = 32
    default_base_lr = 0.05
    options_model = DirOptions

    def _load(self, opts: DirOptions, data_seed: int) -> DatasetData:
        root = Path(opts.data_dir)
        return DatasetData(
            *(_NpyDataset(root, split) for split in ("train", "val", "test")),
            input_shape=(64,),
            num_classes=10,
            loader_workers=opts.loader_workers,
        )

    def _build(self, opts: DirOptions) -> nn.Module:
        return get_task("digits").build_model({})


class MemoryDigits(DiskDigits):
    """The same files, loaded whole into tensors (the in-memory path)."""

    name = "test_memory_digits"

    def _load(self, opts: DirOptions, data_seed: int) -> TaskData:  # type: ignore[override]
        root = Path(opts.data_dir)
        arrays = {
            f"{split}_{part}": torch.from_numpy(np.load(root / f"{split}_{part}.npy"))
            for split in ("train", "val", "test")
            for part in ("x", "y")
        }
        return TaskData(**arrays, num_classes=10, input_shape=(64,))


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("digits-npy")
    data = load_tensors(get_task("digits"), {}, 0)
    for split in ("train", "val", "test"):
        x, y = data.split(split)
        np.save(root / f"{split}_x.npy", x.numpy())
        np.save(root / f"{split}_y.npy", y.numpy())
    return root


@pytest.fixture
def tasks() -> Iterator[tuple[DiskDigits, MemoryDigits]]:
    disk, memory = DiskDigits(), MemoryDigits()
    for task in (disk, memory):
        register_task(task, replace=True)
    yield disk, memory
    for task in (disk, memory):
        unregister_task(task.name)


def _train(
    task: BaseTask[Any], options: dict[str, Any], device: str = "cpu", **config: Any
) -> tuple[list[dict[str, Any]], list[float]]:
    schedule = Schedule(
        stages=(
            Stage(0, 2, 32, warmup_epochs=0.5),
            Stage(2, 4, 128, lr_multiplier=2.0, decay="cosine"),
        ),
        base_lr=0.05,
        base_batch_size=32,
    )
    backend = "nccl" if device.startswith("cuda") else "gloo"
    worker = TrialWorker(WorkerContext(0, 1, device, backend, 1.0), tasks=(task,))
    worker.configure(
        {
            "schedule": schedule.to_dict(),
            "task": task.name,
            "task_options": options,
            "seed": 11,
            "workers": 1,
            **config,
        }
    )
    results = [worker.train_epoch(epoch) for epoch in range(schedule.total_epochs)]
    return results, worker.parameters_digest()


_COMPARED = ("val_accuracy", "val_loss", "train_loss", "steps", "samples", "noise_scale")


@pytest.mark.parametrize("loader_workers", [0, 2])
def test_datasets_read_from_disk_train_exactly_like_tensors_in_memory(
    digits_dir: Path, tasks: tuple[DiskDigits, MemoryDigits], loader_workers: int
) -> None:
    disk, memory = tasks
    # Micro-batches of 24 (accumulation in the 128 stage, a short last one) and a cooldown
    # probe after epoch 2 (its batches are not the plan's: read directly) on both paths.
    config: dict[str, Any] = {"micro_batch": 24, "probe_at": [2], "drop_last": False}
    options = {"data_dir": str(digits_dir), "loader_workers": loader_workers}
    assert isinstance(disk.load_data(options, 0), DatasetData)
    on_disk, disk_params = _train(disk, options, **config)
    in_memory, memory_params = _train(memory, options, **config)
    assert disk_params == memory_params
    for a, b in zip(on_disk, in_memory, strict=True):
        assert {k: a[k] for k in _COMPARED} == {k: b[k] for k in _COMPARED}
        assert a.get("probe_val_accuracy") == b.get("probe_val_accuracy")
    assert on_disk[-1]["val_accuracy"] > 0.9  # it did learn
    assert on_disk[1]["probe_val_accuracy"] is not None


def test_a_dataset_task_is_checked_like_a_tensor_task(
    digits_dir: Path, tasks: tuple[DiskDigits, MemoryDigits]
) -> None:
    disk, _ = tasks
    options = {"data_dir": str(digits_dir)}
    data = disk.load_data(options, 0)
    assert isinstance(data, DatasetData)
    assert (data.num_train, data.num_val, data.num_test) == (1079, 359, 359)
    x, y = data.batch("train", torch.tensor([3, 1]))
    assert x.shape == (2, 64)
    assert y.tolist() == [int(data.train[3][1]), int(data.train[1][1])]
    assert check_model(disk, options, data) is not None
    with pytest.raises(ValidationError, match="reads its data from datasets"):
        load_tensors(disk, options, 0)

    class Unpaired(torch.utils.data.Dataset[np.ndarray]):
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> np.ndarray:
            return np.zeros(64, dtype=np.float32)

    bad = DatasetData(Unpaired(), Unpaired(), Unpaired(), input_shape=(64,), num_classes=10)
    with pytest.raises(ValidationError, match="must be a pair"):
        check_model(disk, options, bad)
    with pytest.raises(ValueError, match="map-style"):
        DatasetData(iter([]), Unpaired(), Unpaired(), input_shape=(64,))  # type: ignore[arg-type]


class _DatasetTrainable(ScheduleTrainable):
    extra_tasks = (DiskDigits(), MemoryDigits())


@pytest.mark.ray
def test_two_ranks_read_their_shares_from_disk_like_from_memory(
    ray_session: None, digits_dir: Path
) -> None:
    """Two Ray worker processes (gloo), each with a DataLoader worker process of its own: the
    same metrics and final weights as the same samples in memory."""
    schedule = Schedule(
        stages=(Stage(0, 1, 64), Stage(1, 3, 256, lr_multiplier=2.0, decay="cosine")),
        base_lr=0.05,
        base_batch_size=64,
    )
    runs: dict[str, tuple[list[dict[str, Any]], list[float]]] = {}
    trainable: ScheduleTrainable | None = None
    try:
        for name in ("test_disk_digits", "test_memory_digits"):
            config = {
                "schedule": schedule.to_dict(),
                "task": name,
                "task_options": {"data_dir": str(digits_dir), "loader_workers": 1},
                "seed": 5,
                "workers": 2,
                "cpus_per_worker": 1.0,
                "micro_batch": 48,
            }
            if trainable is None:
                trainable = _DatasetTrainable(config)
            else:
                assert trainable.reset_config(config) is True
            results = [trainable.train() for _ in range(schedule.total_epochs)]
            gang = trainable._gang
            assert gang is not None
            runs[name] = (results, gang.call("parameters_digest")[0])
    finally:
        if trainable is not None:
            trainable.stop()
    disk, memory = runs["test_disk_digits"], runs["test_memory_digits"]
    assert disk[1] == memory[1]
    for a, b in zip(disk[0], memory[0], strict=True):
        assert {k: a[k] for k in _COMPARED} == {k: b[k] for k in _COMPARED}
    assert disk[0][-1]["val_accuracy"] > 0.9
