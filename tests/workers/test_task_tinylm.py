"""The ``tinylm`` task: byte-level language modelling of CPython's pydoc topics.

Data (splits by topic, determinism, shapes), the model (causal, deterministic init), the
task's loss and metrics, and training through the real trial loop (one CPU worker).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch.nn import functional as F  # noqa: N812

from tuner.errors import ValidationError
from tuner.schedule import Schedule
from workers.gang import WorkerContext
from workers.loop import TrialWorker
from workers.tasks import TaskData, check_model, clear_data_cache, evaluate_metrics, get_task
from workers.tasks.base import load_tensors
from workers.tasks.models import count_parameters
from workers.tasks.tinylm import VOCAB_SIZE, corpus_topics, split_topics

SMALL = {"num_train_sequences": 256, "num_val_sequences": 64, "num_test_sequences": 64}


def rows_shared(a: torch.Tensor, b: torch.Tensor) -> int:
    seen = {row.tobytes() for row in b.numpy()}
    return sum(row.tobytes() in seen for row in a.numpy())


def assert_same_data(a: TaskData, b: TaskData) -> None:
    for split in ("train", "val", "test"):
        (xa, ya), (xb, yb) = a.split(split), b.split(split)
        assert torch.equal(xa, xb), split
        assert torch.equal(ya, yb), split


@pytest.fixture(scope="module")
def default_data() -> TaskData:
    return load_tensors(get_task("tinylm"), {}, seed=0)


# --------------------------------------------------------------------------------------------
# data


def test_default_splits_shapes_and_targets(default_data: TaskData) -> None:
    data = default_data
    assert (data.num_train, data.num_val, data.num_test) == (2048, 512, 512)
    assert data.num_classes is None
    assert data.input_shape == (64,)
    for split in ("train", "val", "test"):
        x, y = data.split(split)
        assert x.shape == y.shape == (len(x), 64), split
        assert x.dtype == y.dtype == torch.int64, split
        assert int(x.min()) >= 0, split
        assert int(x.max()) < VOCAB_SIZE, split
        # y is x shifted by one byte: the next token of every position
        assert torch.equal(y[:, :-1], x[:, 1:]), split
    text = b"".join(t for _, t in corpus_topics())
    assert bytes(data.val_x[0].tolist()) + bytes([int(data.val_y[0, -1])]) in text


def test_splits_are_disjoint_topics_and_share_no_sequence(default_data: TaskData) -> None:
    names = split_topics(0, 65, 512, 512)
    train, val, test = set(names["train"]), set(names["val"]), set(names["test"])
    assert not train & val
    assert not train & test
    assert not val & test
    assert train | val | test == {name for name, _ in corpus_topics()}
    assert min(len(train), len(val), len(test)) >= 1
    data = default_data
    assert rows_shared(data.val_x, data.train_x) == 0
    assert rows_shared(data.test_x, data.train_x) == 0
    assert rows_shared(data.test_x, data.val_x) == 0


def test_data_is_deterministic_in_data_seed_and_independent_of_trial_seed() -> None:
    task = get_task("tinylm")
    first = load_tensors(task, SMALL, seed=0)
    clear_data_cache()
    again = load_tensors(task, SMALL, seed=123)  # rebuilt, same data_seed (0)
    assert again is not first
    assert_same_data(first, again)
    other = load_tensors(task, {**SMALL, "data_seed": 1}, seed=0)
    assert not torch.equal(other.val_x, first.val_x)
    assert not torch.equal(other.train_x, first.train_x)
    from_trial_seed = load_tensors(task, {**SMALL, "data_seed": None}, seed=1)
    assert_same_data(from_trial_seed, other)


def test_held_out_splits_do_not_depend_on_the_train_size() -> None:
    task = get_task("tinylm")
    small = load_tensors(task, SMALL, seed=0)
    larger = load_tensors(task, {**SMALL, "num_train_sequences": 512}, seed=0)
    assert torch.equal(small.val_x, larger.val_x)
    assert torch.equal(small.test_x, larger.test_x)
    assert larger.num_train == 512


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"width": 30, "num_heads": 4}, ["width (30)", "num_heads (4)"]),
        ({"seq_len": 4}, ["seq_len", ">= 8"]),
        (
            {"seq_len": 1024, "num_train_sequences": 20_000},
            ["num_train_sequences x seq_len", "16,777,216"],
        ),
        ({"vocab": 128}, ["unknown option 'vocab'"]),
    ],
)
def test_bad_options_name_the_option(options: dict[str, Any], expected: list[str]) -> None:
    with pytest.raises(ValidationError) as info:
        get_task("tinylm").validate_options(options)
    for text in expected:
        assert text in str(info.value)


def test_options_the_corpus_cannot_satisfy_are_refused_when_loading() -> None:
    task = get_task("tinylm")
    with pytest.raises(ValidationError, match=r"corpus \(.* bytes\) is too small"):
        load_tensors(task, {"seq_len": 1024, "num_val_sequences": 4096}, seed=0)
    with pytest.raises(ValidationError, match="fewer than num_train_sequences"):
        load_tensors(
            task,
            {
                "seq_len": 128,
                "num_train_sequences": 100_000,
                "num_val_sequences": 1500,
                "num_test_sequences": 1500,
            },
            seed=0,
        )


# --------------------------------------------------------------------------------------------
# model, loss, metrics


def test_model_is_causal_small_and_initialises_deterministically(default_data: TaskData) -> None:
    task = get_task("tinylm")
    torch.manual_seed(0)
    model = task.build_model({})
    torch.manual_seed(0)
    twin = task.build_model({})
    for (key, a), b in zip(model.state_dict().items(), twin.state_dict().values(), strict=True):
        assert torch.equal(a, b), key
    assert count_parameters(model) == 120_576
    model.eval()
    x = default_data.val_x[:3]
    with torch.no_grad():
        logits = model(x)
        assert logits.shape == (3, 64, VOCAB_SIZE)
        changed = x.clone()
        changed[:, 40:] = (changed[:, 40:] + 1) % VOCAB_SIZE
        other = model(changed)
        torch.testing.assert_close(other[:, :40], logits[:, :40])  # the past ignores the future
        assert not torch.allclose(other[:, 40:], logits[:, 40:])
        torch.testing.assert_close(model(x[:, :10]), logits[:, :10], rtol=1e-5, atol=1e-5)


def test_check_model_passes_and_declares_language_model_metrics(default_data: TaskData) -> None:
    task = get_task("tinylm")
    check_model(task, {}, default_data)
    assert dict(task.metrics) == {
        "val_loss": "min",
        "val_perplexity": "min",
        "val_accuracy": "max",
    }
    assert task.primary_metric == "val_loss"
    assert task.default_optimizer.name == "adamw"


def test_loss_and_metrics_are_per_sequence_means_summed(default_data: TaskData) -> None:
    task = get_task("tinylm")
    torch.manual_seed(0)
    model = task.build_model({}).eval()
    x, y = default_data.val_x[:5], default_data.val_y[:5]
    with torch.no_grad():
        out = model(x)
    per_sequence = torch.stack([F.cross_entropy(out[i], y[i]) for i in range(5)])
    torch.testing.assert_close(task.loss(out, y), per_sequence.sum())
    assert float(task.loss(out, y, label_smoothing=0.1)) != pytest.approx(float(per_sequence.sum()))
    metrics = evaluate_metrics(task, model, x, y, split="test", batch_size=2)
    assert set(metrics) == {"test_loss", "test_perplexity", "test_accuracy"}
    assert metrics["test_loss"] == pytest.approx(float(per_sequence.mean()), rel=1e-5)
    assert metrics["test_perplexity"] == pytest.approx(math.exp(metrics["test_loss"]), rel=1e-9)
    accuracy = (out.argmax(-1) == y).float().mean()
    assert metrics["test_accuracy"] == pytest.approx(float(accuracy), rel=1e-6)
    assert math.isinf(task.metrics_from_sums({"loss": 1e4, "correct": 0.0}, 1)["perplexity"])


# --------------------------------------------------------------------------------------------
# training through the trial loop (one CPU worker)

#: Cross-entropy of the validation split under the training split's byte frequencies
#: (data_seed 0): what a model that ignores the context gets at best, about.
UNIGRAM_VAL_LOSS = 3.28


def _default_worker(epochs: int) -> TrialWorker:
    task = get_task("tinylm")
    opt = task.default_optimizer
    schedule = Schedule.constant(
        task.default_base_batch_size,
        epochs,
        task.default_base_lr,
        optimizer=opt.name,
        momentum=opt.momentum,
        weight_decay=opt.weight_decay,
    )
    torch.set_num_threads(1)
    worker = TrialWorker(WorkerContext(0, 1, "cpu", "gloo", 1.0))
    worker.configure(
        {"schedule": schedule.to_dict(), "task": "tinylm", "task_options": {}, "seed": 0}
    )
    return worker


def test_one_epoch_through_the_trial_loop_reports_the_task_metrics() -> None:
    # Measured (seed 0, one thread): val_loss 3.03 after the first epoch (unigram: 3.28).
    result = _default_worker(1).train_epoch(0)
    assert result["steps_in_epoch"] == 2048 // 32
    assert result["val_loss"] < 3.2
    assert result["val_perplexity"] == pytest.approx(math.exp(result["val_loss"]), rel=1e-9)
    assert 0.0 < result["val_accuracy"] < 1.0
    assert result["diverged"] is False


@pytest.mark.slow
@pytest.mark.ray_free
def test_default_run_learns_far_beyond_byte_frequencies() -> None:
    """The task's defaults, its default epochs: the loss the docs state (measured, seed 0,
    one thread on a shared 2-core CPU: 3.03 after epoch 1, 1.91 after 10; ~2 s an epoch)."""
    task = get_task("tinylm")
    worker = _default_worker(task.default_epochs)
    losses = [worker.train_epoch(epoch)["val_loss"] for epoch in range(task.default_epochs)]
    assert losses[-1] < 2.2 < UNIGRAM_VAL_LOSS
    assert losses[-1] < losses[0] - 0.8
