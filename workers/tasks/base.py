"""The task protocol, its data type, option validation, the in-process data cache, evaluation.

A *task* is a training workload: a dataset (train / val / test tensors) and a model factory.
:class:`Task` is the protocol the training loop relies on; :class:`BaseTask` implements the
plumbing (option validation with user-facing messages, seeded caching of loaded data, no-op
augmentation) so a concrete task only writes ``_load`` and ``_build``.
"""

from __future__ import annotations

import json
import math
import threading
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Final, Generic, Literal, Protocol, TypeVar, runtime_checkable

import numpy as np
import pydantic
import torch
from pydantic import BaseModel
from torch import nn
from torch.utils.data import Dataset, default_collate

from tuner.errors import ValidationError
from tuner.task_paths import check_data_path, path_fields
from tuner.tasks import describe_field, metric_declaration
from workers.task_options import TaskOptions

__all__ = [
    "BaseTask",
    "MetricDirection",
    "OptimizerDefaults",
    "Task",
    "TaskData",
    "TaskInfo",
    "TaskOptions",
    "check_model",
    "classification_sums",
    "clear_data_cache",
    "derive_seed",
    "describe_field",
    "evaluate",
    "evaluate_batches",
    "evaluate_metrics",
    "evaluate_sums",
    "evaluate_totals",
    "load_tensors",
    "metric_spread",
    "parse_options",
    "sample_std",
    "set_data_cache_size",
    "spreads",
    "task_info",
]

Split = Literal["train", "val", "test"]
MetricDirection = Literal["max", "min"]


@dataclass(frozen=True)
class TaskData:
    """A task's dataset as tensors, on the CPU as loaded (move it with :meth:`to`).

    ``*_x`` are the model's inputs of shape ``(N, *input_shape)`` and ``*_y`` the targets its
    loss compares the output with, one row per sample. A classification task (``num_classes``
    set: the default protocol, cross-entropy and accuracy) has floating-point inputs and int64
    class indices in ``[0, num_classes)``. Any other task (``num_classes=None``) defines its own
    :meth:`BaseTask.loss` and evaluation, and its tensors may be of any dtype and shape (token
    ids and next tokens, noisy and clean image patches, ...). ``test_*`` is a split tuning
    never sees (benchmarks only); tuning reads ``train_*`` and ``val_*``.

    Loaded data is cached and shared between callers in the process: never modify these tensors
    in place (index them, or copy first).
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    val_x: torch.Tensor
    val_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    num_classes: int | None
    input_shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.num_classes is not None and self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 (or None), got {self.num_classes}")
        splits: tuple[Split, ...] = ("train", "val", "test")
        for split in splits:
            x, y = self.split(split)
            if self.num_classes is not None:
                if not x.is_floating_point():
                    raise ValueError(f"{split}_x must be floating point, got {x.dtype}")
                if y.dtype != torch.int64 or y.dim() != 1:
                    raise ValueError(
                        f"{split}_y must be a 1-D int64 tensor of class indices, "
                        f"got {y.dtype} {tuple(y.shape)}"
                    )
            elif y.dim() == 0:
                raise ValueError(f"{split}_y must have one row per sample, got a scalar")
            if x.shape[0] != y.shape[0]:
                raise ValueError(f"{split}_x has {x.shape[0]} rows but {split}_y {y.shape[0]}")
            if tuple(x.shape[1:]) != tuple(self.input_shape):
                raise ValueError(
                    f"{split}_x has sample shape {tuple(x.shape[1:])}, "
                    f"expected input_shape {self.input_shape}"
                )

    def split(self, name: Split) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)`` of the split ``"train"``, ``"val"`` or ``"test"``."""
        if name == "train":
            return self.train_x, self.train_y
        if name == "val":
            return self.val_x, self.val_y
        if name == "test":
            return self.test_x, self.test_y
        raise ValueError(f"unknown split {name!r}; expected 'train', 'val' or 'test'")

    @property
    def num_train(self) -> int:
        return int(self.train_y.shape[0])

    @property
    def num_val(self) -> int:
        return int(self.val_y.shape[0])

    @property
    def num_test(self) -> int:
        return int(self.test_y.shape[0])

    @property
    def in_memory(self) -> bool:
        return True

    @property
    def sample_dims(self) -> int:
        """Dimensions of a batch of inputs (``1 + len(input_shape)``)."""
        return 1 + len(self.input_shape)

    def batch(self, split: Split, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples ``indices`` of ``split`` as ``(inputs, targets)`` (on the data's
        device)."""
        x, y = self.split(split)
        return x[indices], y[indices]

    def size(self, split: Split) -> int:
        return int(self.split(split)[1].shape[0])

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> TaskData:
        """A copy with every tensor on ``device`` (the same object's tensors if already there)."""
        return replace(
            self,
            train_x=self.train_x.to(device, non_blocking=non_blocking),
            train_y=self.train_y.to(device, non_blocking=non_blocking),
            val_x=self.val_x.to(device, non_blocking=non_blocking),
            val_y=self.val_y.to(device, non_blocking=non_blocking),
            test_x=self.test_x.to(device, non_blocking=non_blocking),
            test_y=self.test_y.to(device, non_blocking=non_blocking),
        )


class DatasetData:
    """A task's data as map-style :class:`torch.utils.data.Dataset` s, for data that does not
    fit in memory or is read from disk: ``dataset[i]`` is one sample ``(input, target)``
    (tensors, or NumPy arrays / numbers that ``default_collate`` turns into tensors); the
    training loop collates the samples of each step itself, so every rank's samples for each
    step follow the schedule's global batch and the seeded permutation exactly as with
    in-memory :class:`TaskData` (the same samples give the same batches).

    ``loader_workers`` > 0 reads each step's samples ahead in that many DataLoader worker
    processes (persistent for the trial; batches pinned for a GPU); 0 reads them in the
    training process. ``num_classes`` and ``input_shape`` mean what they mean for
    :class:`TaskData`; the classification checks apply to collated batches (by
    :func:`check_model`), not to every sample up front.
    """

    def __init__(
        self,
        train: Dataset[Any],
        val: Dataset[Any],
        test: Dataset[Any],
        *,
        input_shape: tuple[int, ...],
        num_classes: int | None = None,
        loader_workers: int = 0,
        collate: Callable[[list[Any]], Any] | None = None,
    ) -> None:
        if num_classes is not None and num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 (or None), got {num_classes}")
        if loader_workers < 0:
            raise ValueError(f"loader_workers must be >= 0, got {loader_workers}")
        self.train, self.val, self.test = train, val, test
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.loader_workers = loader_workers
        self.collate: Callable[[list[Any]], Any] = collate or default_collate
        for split in ("train", "val", "test"):
            try:
                len(getattr(self, split))
            except TypeError:
                raise ValueError(
                    f"the {split} dataset must be map-style (define __len__ and __getitem__)"
                ) from None

    in_memory: Final = False

    @property
    def sample_dims(self) -> int:
        return 1 + len(self.input_shape)

    def dataset(self, split: Split) -> Dataset[Any]:
        if split not in ("train", "val", "test"):
            raise ValueError(f"unknown split {split!r}; expected 'train', 'val' or 'test'")
        dataset: Dataset[Any] = getattr(self, split)
        return dataset

    def size(self, split: Split) -> int:
        return len(self.dataset(split))  # type: ignore[arg-type]

    @property
    def num_train(self) -> int:
        return self.size("train")

    @property
    def num_val(self) -> int:
        return self.size("val")

    @property
    def num_test(self) -> int:
        return self.size("test")

    def batch(self, split: Split, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples ``indices`` of ``split``, read and collated in this process."""
        dataset = self.dataset(split)
        return collate_pair(self.collate, [dataset[int(i)] for i in indices.tolist()])

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> DatasetData:
        """The same data: samples are read on the CPU and each batch is moved by the loop."""
        return self


def collate_pair(collate: Callable[[list[Any]], Any], samples: list[Any]) -> tuple[Any, Any]:
    """``(inputs, targets)`` of collated ``(input, target)`` samples."""
    batch = collate(samples)
    if not isinstance(batch, list | tuple) or len(batch) != 2:
        raise ValidationError(
            "a dataset sample must be a pair (input, target); got "
            f"{type(samples[0]).__name__ if samples else 'nothing'}"
        )
    return batch[0], batch[1]


#: What a task's ``load_data`` returns: tensors in memory, or map-style datasets.
AnyTaskData = TaskData | DatasetData


@dataclass(frozen=True)
class OptimizerDefaults:
    """The optimizer settings a task's defaults were tuned with (a schedule may override them)."""

    name: Literal["sgd", "adamw", "lars"] = "sgd"
    momentum: float = 0.9
    weight_decay: float = 0.0


OptionsT = TypeVar("OptionsT", bound=TaskOptions)


@runtime_checkable
class Task(Protocol):
    """A registered training workload. Subclass :class:`BaseTask` to implement one."""

    @property
    def name(self) -> str:
        """The registry name (what studies and the API refer to)."""
        ...

    @property
    def description(self) -> str: ...

    @property
    def default_epochs(self) -> int: ...

    @property
    def default_base_batch_size(self) -> int: ...

    @property
    def default_base_lr(self) -> float:
        """LR at ``default_base_batch_size`` with ``default_optimizer``."""
        ...

    @property
    def default_optimizer(self) -> OptimizerDefaults: ...

    @property
    def options_model(self) -> type[BaseModel]:
        """Pydantic model of the task's options (defaults, bounds, ``extra="forbid"``)."""
        ...

    def validate_options(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        """The options with defaults filled in (JSON-compatible); ``ValidationError`` if bad."""
        ...

    def load_data(self, options: Mapping[str, Any] | None, seed: int) -> AnyTaskData:
        """The task's data, deterministic in (options, data seed); cached in-process."""
        ...

    def build_model(self, options: Mapping[str, Any] | None) -> nn.Module:
        """A fresh model (CPU, float32) mapping ``(B, *input_shape)`` to ``(B, num_classes)``.

        Its initialisation is deterministic given ``torch.manual_seed`` set by the caller.
        """
        ...

    def augment_batch(
        self, x: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Training-time augmentation of one batch (on its device); identity when none."""
        ...

    @property
    def metrics(self) -> Mapping[str, MetricDirection]:
        """The validation metrics the task reports (``val_<name>`` -> ``"max"`` / ``"min"``)."""
        ...

    @property
    def primary_metric(self) -> str:
        """The metric a study optimises when its objective names none."""
        ...

    def loss(
        self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
    ) -> torch.Tensor:
        """The training loss of a batch as the **sum** over its samples of each sample's loss
        (a scalar tensor): the loop divides by the global batch, so a step's gradient is the
        mean over the global batch however the batch is split between workers."""
        ...

    def eval_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Sums over one evaluation batch (scalar tensors, names of the task's choosing): the
        workers' sums over their shards of the split are added up before
        :meth:`metrics_from_sums`."""
        ...

    def metrics_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        """Every declared metric, named without its ``val_`` prefix, from the split's summed
        :meth:`eval_sums` over ``count`` samples (the same function gives benchmarks'
        ``test_`` figures)."""
        ...


@dataclass(frozen=True)
class TaskInfo:
    """What the catalogue shows about a task (no data loaded)."""

    name: str
    description: str
    default_epochs: int
    default_base_batch_size: int
    default_base_lr: float
    default_optimizer: OptimizerDefaults
    options_schema: dict[str, Any] = field(default_factory=dict)
    metrics: dict[str, MetricDirection] = field(default_factory=dict)
    primary_metric: str = "val_accuracy"


def check_model(task: Task, options: Mapping[str, Any] | None, data: AnyTaskData) -> nn.Module:
    """Build the task's model, run it on two training samples and evaluate the task's loss and
    metrics on its output. Returns the model; raises :class:`ValidationError` naming the task
    and what is wrong (a model that does not build or run, logits of the wrong shape for a
    classification task, a loss that is not a finite scalar, a declared metric the task does
    not compute), before any trial runs (every trial would fail the same way)."""
    if data.num_train < 2:
        raise ValidationError(
            f"task {task.name!r}: its training split has {data.num_train} samples"
        )
    try:
        x, y = data.batch("train", torch.arange(2))
    except ValidationError as exc:
        raise ValidationError(f"task {task.name!r}: {exc}") from None
    except Exception as exc:
        raise ValidationError(
            f"task {task.name!r}: reading two training samples failed: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
        raise ValidationError(
            f"task {task.name!r}: a batch of samples collates to ({type(x).__name__}, "
            f"{type(y).__name__}); expected tensors (input, target)"
        )
    if tuple(x.shape[1:]) != tuple(data.input_shape):
        raise ValidationError(
            f"task {task.name!r}: its samples have input shape {tuple(x.shape[1:])}, "
            f"expected input_shape {tuple(data.input_shape)}"
        )
    try:
        model = task.build_model(options)
    except ValidationError:
        raise
    except Exception as exc:
        raise ValidationError(
            f"task {task.name!r}: building its model failed: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        with torch.no_grad():
            out = model.eval()(x)
    except Exception as exc:
        raise ValidationError(
            f"task {task.name!r}: its model failed on a batch of shape {tuple(x.shape)} "
            f"(2 training samples): {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(out, torch.Tensor):
        raise ValidationError(
            f"task {task.name!r}: its model returns {type(out).__name__}; expected a tensor"
        )
    if data.num_classes is not None:
        expected = (x.shape[0], data.num_classes)
        if tuple(out.shape) != expected:
            raise ValidationError(
                f"task {task.name!r}: its model maps a batch of shape {tuple(x.shape)} to "
                f"{tuple(out.shape)}; expected {expected} (one logit per class, "
                f"num_classes={data.num_classes})"
            )
    if not out.is_floating_point():
        raise ValidationError(
            f"task {task.name!r}: its model returns {out.dtype} outputs; expected floating point"
        )
    _check_loss_and_metrics(task, out, y)
    return model


def _check_loss_and_metrics(task: Task, out: torch.Tensor, y: torch.Tensor) -> None:
    where = f"on the model's output {tuple(out.shape)} and targets {tuple(y.shape)}"
    try:
        loss = task.loss(out.float(), y)
    except Exception as exc:
        raise ValidationError(
            f"task {task.name!r}: its loss failed {where}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        got = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise ValidationError(
            f"task {task.name!r}: its loss {where} is {got}; expected a scalar tensor (the sum "
            "of the batch's per-sample losses)"
        )
    if not torch.isfinite(loss):
        raise ValidationError(f"task {task.name!r}: its loss {where} is {float(loss)}")
    try:
        sums = {k: float(v) for k, v in task.eval_sums(out.float(), y).items()}
        values = task.metrics_from_sums(sums, int(y.shape[0]))
    except Exception as exc:
        raise ValidationError(
            f"task {task.name!r}: its evaluation failed {where}: {type(exc).__name__}: {exc}"
        ) from exc
    missing = [m for m in task.metrics if m.removeprefix("val_") not in values]
    if missing:
        raise ValidationError(
            f"task {task.name!r}: metrics_from_sums returns {sorted(values)} but the task "
            f"declares {', '.join(missing)} (return each declared metric without its val_ prefix)"
        )


def load_tensors(task: Task, options: Mapping[str, Any] | None, seed: int) -> TaskData:
    """``task.load_data`` of a task whose data is in memory (every built-in task's);
    ``ValidationError`` for a task that reads map-style datasets."""
    data = task.load_data(options, seed)
    if not isinstance(data, TaskData):
        raise ValidationError(f"task {task.name!r} reads its data from datasets, not tensors")
    return data


def task_info(task: Task) -> TaskInfo:
    return TaskInfo(
        name=task.name,
        description=task.description,
        default_epochs=task.default_epochs,
        default_base_batch_size=task.default_base_batch_size,
        default_base_lr=task.default_base_lr,
        default_optimizer=task.default_optimizer,
        options_schema=task.options_model.model_json_schema(),
        metrics=dict(task.metrics),
        primary_metric=task.primary_metric,
    )


# --------------------------------------------------------------------------------------------
# option validation with messages a user can act on


def parse_options(
    task_name: str, model: type[OptionsT], options: Mapping[str, Any] | None
) -> OptionsT:
    """Validate ``options`` against ``model``; raise :class:`tuner.errors.ValidationError`
    naming each bad option and what it allows."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise ValidationError(
            f"options of task {task_name!r} must be a mapping of option names to values, "
            f"got {type(options).__name__}"
        )
    try:
        return model.model_validate(dict(options))
    except pydantic.ValidationError as exc:
        allowed = ", ".join(model.model_fields)
        problems: list[str] = []
        for err in exc.errors():
            loc = ".".join(str(part) for part in err["loc"])
            top = str(err["loc"][0]) if err["loc"] else ""
            if err["type"] == "extra_forbidden":
                problems.append(f"unknown option {loc!r} (allowed options: {allowed})")
            elif err["type"] == "missing":
                info = model.model_fields[top]
                what = f"{info.description.rstrip('.')}; " if info.description else ""
                allowed_here = describe_field(info).removesuffix(" (required)")
                problems.append(f"option {loc!r} is required ({what}{allowed_here})")
            elif top in model.model_fields:
                msg = str(err["msg"]).removeprefix("Value error, ")
                problems.append(
                    f"option {loc!r} = {err.get('input')!r} is invalid ({msg}); "
                    f"allowed: {describe_field(model.model_fields[top])}"
                )
            else:
                msg = str(err["msg"]).removeprefix("Value error, ")
                problems.append(msg)
        raise ValidationError(
            f"invalid options for task {task_name!r}: " + "; ".join(problems)
        ) from None


# --------------------------------------------------------------------------------------------
# in-process data cache


class _DataCache:
    """A small LRU of loaded :class:`TaskData`, keyed by (task, options, data seed)."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, AnyTaskData] = OrderedDict()
        self.lock = threading.RLock()

    def get(self, key: Hashable) -> AnyTaskData | None:
        with self.lock:
            data = self._entries.get(key)
            if data is not None:
                self._entries.move_to_end(key)
            return data

    def put(self, key: Hashable, data: AnyTaskData) -> None:
        with self.lock:
            if self.max_entries <= 0:
                return
            self._entries[key] = data
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self.lock:
            self._entries.clear()

    def resize(self, max_entries: int) -> None:
        with self.lock:
            self.max_entries = max_entries
            while len(self._entries) > max(max_entries, 0):
                self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


_CACHE = _DataCache(max_entries=4)


def clear_data_cache() -> None:
    """Forget every cached dataset of this process."""
    _CACHE.clear()


def set_data_cache_size(max_entries: int) -> None:
    """Keep at most ``max_entries`` datasets cached (0 disables caching); default 4."""
    if max_entries < 0:
        raise ValidationError(f"data cache size must be >= 0, got {max_entries}")
    _CACHE.resize(max_entries)


def derive_seed(seed: int, *stream: int) -> int:
    """An independent 32-bit seed for sub-stream ``stream`` of ``seed`` (e.g. one per split)."""
    return int(np.random.SeedSequence([seed, *stream]).generate_state(1)[0])


# --------------------------------------------------------------------------------------------
# the base class of concrete tasks


class BaseTask(ABC, Generic[OptionsT]):
    """Implements :class:`Task` around two hooks: ``_load(opts, data_seed)`` and ``_build(opts)``.

    Subclasses set the class attributes and ``options_model`` (a :class:`TaskOptions` subclass).
    """

    name: ClassVar[str]
    description: ClassVar[str]
    default_epochs: ClassVar[int]
    default_base_batch_size: ClassVar[int]
    default_base_lr: ClassVar[float]
    default_optimizer: ClassVar[OptimizerDefaults] = OptimizerDefaults()
    options_model: type[OptionsT]

    def parse(self, options: Mapping[str, Any] | None) -> OptionsT:
        """The validated options model (``ValidationError`` naming a bad option)."""
        return parse_options(self.name, self.options_model, options)

    def validate_options(self, options: Mapping[str, Any] | None) -> dict[str, Any]:
        dumped: dict[str, Any] = self.parse(options).model_dump(mode="json")
        return dumped

    def load_data(self, options: Mapping[str, Any] | None, seed: int) -> AnyTaskData:
        opts = self.resolve_paths(self.parse(options))
        data_seed = opts.data_seed if opts.data_seed is not None else int(seed)
        key = (
            type(self).__module__,
            type(self).__qualname__,
            self.name,
            json.dumps(opts.model_dump(mode="json"), sort_keys=True),
            data_seed,
            self._fingerprint(opts),
        )
        with _CACHE.lock:
            cached = _CACHE.get(key)
            if cached is not None:
                return cached
            data = self._load(opts, data_seed)
            _CACHE.put(key, data)
            return data

    def resolve_paths(self, opts: OptionsT) -> OptionsT:
        """``opts`` with every :data:`~tuner.task_paths.DataPath` option replaced by the
        absolute path it names, re-checked against this process's datasets root (the path
        policy of :mod:`tuner.task_paths`; symlinks may have changed since submission).

        :meth:`load_data` calls it, so ``_load`` and ``_fingerprint`` see resolved paths.
        """
        resolved: dict[str, str] = {}
        for name in path_fields(type(opts)):
            value = getattr(opts, name)
            if value is not None:
                option = f"{self.name} option {name}"
                resolved[name] = str(check_data_path(str(value), option=option))
        return opts.model_copy(update=resolved) if resolved else opts

    def build_model(self, options: Mapping[str, Any] | None) -> nn.Module:
        return self._build(self.parse(options))

    def augment_batch(
        self, x: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        return x

    # The metric declaration lives on the options model (torch-free, read by the API too).

    @property
    def metrics(self) -> Mapping[str, MetricDirection]:
        return metric_declaration(self.name, self.options_model)[0]

    @property
    def primary_metric(self) -> str:
        return metric_declaration(self.name, self.options_model)[1]

    # Classification by default: cross-entropy, accuracy. Override all three for another kind.

    def loss(
        self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
    ) -> torch.Tensor:
        return nn.functional.cross_entropy(
            output, target, reduction="sum", label_smoothing=label_smoothing
        )

    def eval_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        return classification_sums(output, target)

    def metrics_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        return {"loss": sums["loss"] / count, "accuracy": sums["correct"] / count}

    def spread_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        """The per-sample standard deviation of the metrics that are means over the split's
        samples, from the same sums as :meth:`metrics_from_sums` (names without ``val_``;
        those it cannot tell are left out). One run on ``count`` samples reads such a metric
        to about ``sd / sqrt(count)``: a study's result says when its pick's lead is finer.
        Classification: accuracy's binomial ``sqrt(p (1 - p))``, and the cross-entropy's
        from its summed squares (``loss_sq``) when :meth:`eval_sums` gives them. A task whose
        :meth:`eval_sums` differs overrides this (or gets nothing from it)."""
        out: dict[str, float] = {}
        if count < 1:
            return out
        if "correct" in sums:
            p = min(max(sums["correct"] / count, 0.0), 1.0)
            out["accuracy"] = math.sqrt(p * (1.0 - p))
        return {**out, **spreads(sums, count, {"loss": "loss"})}

    def _fingerprint(self, opts: OptionsT) -> Hashable:
        """Extra cache-key part, e.g. the stats of files the data is read from."""
        return ()

    @abstractmethod
    def _load(self, opts: OptionsT, data_seed: int) -> AnyTaskData: ...

    @abstractmethod
    def _build(self, opts: OptionsT) -> nn.Module: ...

    def __repr__(self) -> str:
        return f"<task {self.name!r} ({type(self).__qualname__})>"


# --------------------------------------------------------------------------------------------
# evaluation: the task's sums over a split, its metrics from them


def _model_device(model: nn.Module) -> torch.device | None:
    for param in model.parameters():
        return param.device
    for buffer in model.buffers():
        return buffer.device
    return None


def evaluate_sums(
    sums_of: Callable[[torch.Tensor, torch.Tensor], Mapping[str, torch.Tensor]],
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int = 1024,
) -> tuple[dict[str, float], int]:
    """``sums_of(output, target)`` (a task's :meth:`~Task.eval_sums`) added up over
    ``(x, y)`` in batches, and the sample count: sums rather than means so that data-parallel
    workers can all-reduce their shards'.

    The model is run in eval mode without gradients and put back in its previous mode; batches
    move to the model's device when they are elsewhere. Outputs are cast to float32 first.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} rows but y {y.shape[0]}")
    batches = (
        (x[start : start + batch_size], y[start : start + batch_size])
        for start in range(0, x.shape[0], batch_size)
    )
    return evaluate_batches(sums_of, model, batches)


def evaluate_batches(
    sums_of: Callable[[torch.Tensor, torch.Tensor], Mapping[str, torch.Tensor]],
    model: nn.Module,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
) -> tuple[dict[str, float], int]:
    """:func:`evaluate_sums` over ``(inputs, targets)`` batches (e.g. read from a dataset)."""
    device = _model_device(model)
    was_training = model.training
    model.eval()
    totals: dict[str, torch.Tensor] = {}
    count = 0
    try:
        with torch.no_grad():
            for xb, yb in batches:
                if device is not None and xb.device != device:
                    xb = xb.to(device, non_blocking=True)
                    yb = yb.to(device, non_blocking=True)
                sums = sums_of(model(xb).float(), yb)
                count += int(yb.shape[0])
                for key, value in sums.items():
                    value = value.detach().double()
                    totals[key] = totals[key] + value if key in totals else value
    finally:
        model.train(was_training)
    return {k: float(v.item()) for k, v in totals.items()}, count


def evaluate_metrics(
    task: Task,
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    split: str = "val",
    batch_size: int = 1024,
) -> dict[str, float]:
    """The task's metrics of ``model`` on ``(x, y)``, named ``<split>_<metric>`` (e.g.
    ``test_psnr``); NaN for every metric of an empty split."""
    sums, count = evaluate_sums(task.eval_sums, model, x, y, batch_size)
    names = [m.removeprefix("val_") for m in task.metrics]
    if count == 0:
        return {f"{split}_{name}": float("nan") for name in names}
    values = task.metrics_from_sums(sums, count)
    return {f"{split}_{name}": float(values[name]) for name in names}


def classification_sums(output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
    """Summed cross-entropy (and its squares, for its spread) and correct predictions of a
    batch of logits."""
    return {
        "loss": nn.functional.cross_entropy(output, target, reduction="sum"),
        "loss_sq": nn.functional.cross_entropy(output, target, reduction="none")
        .double()
        .square()
        .sum(),
        "correct": (output.argmax(dim=1) == target).sum(),
    }


def sample_std(total: float, total_sq: float, count: int) -> float:
    """The standard deviation of ``count`` values from their sum and their sum of squares
    (population form; 0 where rounding makes the variance negative)."""
    if count < 1:
        return math.nan
    mean = total / count
    return math.sqrt(max(total_sq / count - mean * mean, 0.0))


def spreads(sums: Mapping[str, float], count: int, sum_of: Mapping[str, str]) -> dict[str, float]:
    """The per-sample standard deviation of each metric (``sum_of``: metric -> the key of its
    per-sample sum in ``sums``, whose squares are under ``<key>_sq``); metrics whose squares
    were not summed are left out."""
    return {
        metric: sample_std(sums[key], sums[f"{key}_sq"], count)
        for metric, key in sum_of.items()
        if count >= 1 and key in sums and f"{key}_sq" in sums
    }


def metric_spread(task: Task, sums: Mapping[str, float], count: int) -> dict[str, float]:
    """``task.spread_from_sums(sums, count)`` for a task that has it (:class:`BaseTask`
    does; a task written to the :class:`Task` protocol alone may not), finite values only."""
    spread = getattr(task, "spread_from_sums", None)
    if spread is None:
        return {}
    return {k: float(v) for k, v in spread(sums, count).items() if math.isfinite(float(v))}


def evaluate_totals(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024
) -> tuple[float, int, int]:
    """Classification: ``(summed cross-entropy, correct predictions, samples)`` over ``(x, y)``."""
    sums, count = evaluate_sums(classification_sums, model, x, y, batch_size)
    return sums.get("loss", 0.0), int(sums.get("correct", 0)), count


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1024
) -> tuple[float, float]:
    """Classification: ``(mean cross-entropy, accuracy)`` on ``(x, y)``; ``(nan, nan)`` if
    empty."""
    loss_sum, correct, count = evaluate_totals(model, x, y, batch_size)
    if count == 0:
        return float("nan"), float("nan")
    return loss_sum / count, correct / count
