"""``tinylm``: byte-level language modelling of CPython's own documentation, and a tiny
pre-LN causal Transformer.

Data: the text of ``pydoc_data.topics.topics`` (the help topics ``help()`` shows, shipped with
the standard library; nothing is downloaded). Under CPython 3.11 it has 79 topics, 466,117
bytes of UTF-8 English text; another Python version ships other text, so the data is
deterministic in ``data_seed`` for a given interpreter. Tokens are the text's **bytes** (a
fixed vocabulary of 256, no tokenizer to build).

Splits, by topic (no leakage: a topic's text belongs to one split only): the topics, in sorted
order, are permuted with a seed derived from ``data_seed``; topics are taken from that
permutation for the test split until its text holds ``num_test_sequences`` non-overlapping
windows of ``seq_len + 1`` bytes, then likewise for validation; every other topic is
training text. Validation and test are that many of their split's non-overlapping windows
(chosen by the same seed); training is ``num_train_sequences`` windows at distinct seeded
random offsets of the training text (they may overlap one another, never another split).
A window ``w`` gives the input ``x = w[:-1]`` and the targets ``y = w[1:]``, both
``(N, seq_len)`` int64. Defaults: 2,048 train / 512 val / 512 test sequences of 64 bytes.

Model: token + learned position embeddings, ``num_layers`` pre-LN blocks (causal multi-head
self-attention, a 4x GELU MLP), a final LayerNorm and an output head tied to the token
embedding; it maps ``(B, T)`` token ids (``T <= seq_len``) to ``(B, T, 256)`` logits. The
default (width 64, 2 layers, 4 heads) has 120,576 parameters. Loss: each sequence's mean
next-byte cross-entropy (nats), summed over the batch; metrics ``val_loss`` (primary),
``val_perplexity`` = exp(val_loss) and next-byte ``val_accuracy``.

Measured (CPython 3.11, torch 2.13 on 2 shared CPU cores, one thread; each run
``Schedule.constant(batch, 10, 3e-3, 32, scaling_rule=rule, warmup_epochs=w,
optimizer="adamw", momentum=0.9, weight_decay=0.01)`` trained epoch by epoch by
``TrialWorker(WorkerContext(0, 1, "cpu", "gloo", 1.0))``, trial seeds 0 / 1; validation loss
in nats per byte after the 10 default epochs; the training split's byte frequencies give 3.28):

* the defaults, batch 32 at 3e-3: 1.91 / 1.84 (3.03 / 2.76 after one epoch), about 1.5-1.8 s
  an epoch plus 0.25 s of evaluation. (At batch 32, seed 0: LR 1e-3 2.08, 2e-3 2.00,
  5e-3 2.19.)
* 8x, batch 256, one warm-up epoch from 3e-3: sqrt rule (8.5e-3) 2.88 / 2.91, linear (2.4e-2)
  3.13 / 2.97; 16x, batch 512: sqrt (1.2e-2) 3.17 / 3.15, linear (4.8e-2) 3.15 / 3.29.

The large-batch penalty at fixed epochs is 1.0-1.4 nats: 80 or 40 steps barely leave the
unigram plateau (batch 256 at the unscaled 3e-3 does better, 2.67 for seed 0, than either
scaling rule).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import lru_cache

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from tuner.errors import ValidationError
from workers.task_options import TinyLMOptions
from workers.tasks.base import BaseTask, OptimizerDefaults, TaskData, derive_seed, spreads

__all__ = ["TASK", "TinyLMOptions", "TinyLMTask", "TinyTransformerLM", "corpus_topics"]

VOCAB_SIZE = 256


@lru_cache(maxsize=1)
def corpus_topics() -> tuple[tuple[str, bytes], ...]:
    """``(topic name, UTF-8 text)`` of every pydoc topic, sorted by name."""
    from pydoc_data.topics import topics

    return tuple((name, topics[name].encode("utf-8")) for name in sorted(topics))


def split_topics(data_seed: int, window: int, num_val: int, num_test: int) -> dict[str, list[str]]:
    """The topic names of each split (``"train"``, ``"val"``, ``"test"``; each sorted).

    Topics are taken in a seeded permutation, first for test until its text holds
    ``num_test`` windows of ``window`` bytes, then for validation; the rest train."""
    topics = corpus_topics()
    order = np.random.default_rng(derive_seed(data_seed, 0)).permutation(len(topics))
    chosen: dict[str, list[str]] = {"test": [], "val": [], "train": []}
    position = 0
    for split, wanted in (("test", num_test), ("val", num_val)):
        size = 0
        while size // window < wanted:
            if position >= len(order):
                raise ValidationError(
                    f"tinylm: the corpus ({sum(len(t) for _, t in topics):,} bytes) is too small "
                    f"for {num_test} test and {num_val} validation sequences of "
                    f"{window - 1} tokens; lower num_val_sequences, num_test_sequences or "
                    "seq_len"
                )
            name, text = topics[order[position]]
            chosen[split].append(name)
            size += len(text)
            position += 1
    chosen["train"] = [topics[i][0] for i in order[position:]]
    return {split: sorted(names) for split, names in chosen.items()}


def _text(names: list[str]) -> np.ndarray:
    texts = dict(corpus_topics())
    return np.frombuffer(b"".join(texts[name] for name in names), dtype=np.uint8)


def _windows(text: np.ndarray, starts: np.ndarray, window: int) -> tuple[torch.Tensor, ...]:
    rows = torch.from_numpy(text[starts[:, None] + np.arange(window)].astype(np.int64))
    return rows[:, :-1].contiguous(), rows[:, 1:].contiguous()


class CausalSelfAttention(nn.Module):
    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.num_heads, c // self.num_heads).unbind(2)
        out = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )
        projected: torch.Tensor = self.proj(out.transpose(1, 2).reshape(b, t, c))
        return projected


class Block(nn.Module):
    """A pre-LN Transformer block: ``x + attn(ln(x))``, then ``x + mlp(ln(x))``."""

    def __init__(self, width: int, num_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, num_heads)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        out: torch.Tensor = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return out


class TinyTransformerLM(nn.Module):
    """A GPT-style byte-level language model: ``(B, T)`` int64 tokens -> ``(B, T, vocab)``.

    Initialisation as GPT-2's (normal, std 0.02; the residual output projections scaled by
    ``1 / sqrt(2 * num_layers)``; zero biases), deterministic under ``torch.manual_seed``.
    """

    def __init__(
        self, vocab_size: int, max_len: int, width: int, num_layers: int, num_heads: int
    ) -> None:
        super().__init__()
        self.max_len = max_len
        self.tokens = nn.Embedding(vocab_size, width)
        self.positions = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList(Block(width, num_heads) for _ in range(num_layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.tokens.weight  # tied
        for module in self.modules():
            if isinstance(module, nn.Linear | nn.Embedding):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for block in self.blocks:
            assert isinstance(block, Block)
            for proj in (block.attn.proj, block.out):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * num_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = x.shape[1]
        if t > self.max_len:
            raise ValueError(f"sequences of {t} tokens exceed the model's {self.max_len}")
        h = self.tokens(x) + self.positions(torch.arange(t, device=x.device))
        for block in self.blocks:
            h = block(h)
        logits: torch.Tensor = self.head(self.norm(h))
        return logits


class TinyLMTask(BaseTask[TinyLMOptions]):
    name = "tinylm"
    description = (
        "Byte-level language modelling of CPython's pydoc topics (English documentation "
        "shipped with Python, split by topic): 2,048 train / 512 val / 512 test sequences of "
        "64 bytes by default; a 2-block pre-LN causal Transformer (width 64, 121k parameters). "
        "Metrics: val_loss (nats per byte, primary), val_perplexity, val_accuracy."
    )
    default_epochs = 10
    default_base_batch_size = 32
    default_base_lr = 3e-3
    default_optimizer = OptimizerDefaults(name="adamw", momentum=0.9, weight_decay=0.01)
    options_model = TinyLMOptions

    def _load(self, opts: TinyLMOptions, data_seed: int) -> TaskData:
        window = opts.seq_len + 1
        names = split_topics(data_seed, window, opts.num_val_sequences, opts.num_test_sequences)
        rng = np.random.default_rng(derive_seed(data_seed, 1))
        tensors: dict[str, tuple[torch.Tensor, ...]] = {}
        for split, count in (("test", opts.num_test_sequences), ("val", opts.num_val_sequences)):
            text = _text(names[split])
            chosen = np.sort(rng.choice(len(text) // window, size=count, replace=False))
            tensors[split] = _windows(text, chosen * window, window)
        text = _text(names["train"])
        positions = len(text) - window + 1
        if positions < opts.num_train_sequences:
            raise ValidationError(
                f"tinylm: the training text ({len(text):,} bytes) has only {max(positions, 0):,} "
                f"windows of {window} bytes, fewer than num_train_sequences = "
                f"{opts.num_train_sequences:,}"
            )
        starts = np.sort(rng.choice(positions, size=opts.num_train_sequences, replace=False))
        tensors["train"] = _windows(text, starts, window)
        return TaskData(
            train_x=tensors["train"][0],
            train_y=tensors["train"][1],
            val_x=tensors["val"][0],
            val_y=tensors["val"][1],
            test_x=tensors["test"][0],
            test_y=tensors["test"][1],
            num_classes=None,
            input_shape=(opts.seq_len,),
        )

    def _build(self, opts: TinyLMOptions) -> nn.Module:
        return TinyTransformerLM(
            VOCAB_SIZE, opts.seq_len, opts.width, opts.num_layers, opts.num_heads
        )

    def loss(
        self, output: torch.Tensor, target: torch.Tensor, label_smoothing: float = 0.0
    ) -> torch.Tensor:
        """The sum over the batch of each sequence's mean next-token cross-entropy."""
        total = F.cross_entropy(
            output.flatten(0, -2),
            target.flatten(),
            reduction="sum",
            label_smoothing=label_smoothing,
        )
        return total / target.shape[-1]

    def eval_sums(self, output: torch.Tensor, target: torch.Tensor) -> dict[str, torch.Tensor]:
        """Summed per-sequence mean cross-entropy and per-sequence next-token accuracy."""
        length = target.shape[-1]
        per_token = F.cross_entropy(output.flatten(0, -2), target.flatten(), reduction="none")
        per_sequence = per_token.view(target.shape).double().mean(dim=-1)
        hits = output.argmax(dim=-1) == target
        return {
            "loss": per_token.sum() / length,
            "loss_sq": per_sequence.square().sum(),
            "correct": hits.sum(dtype=torch.float64) / length,
            "correct_sq": hits.double().mean(dim=-1).square().sum(),
        }

    def spread_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        """The per-sequence standard deviation of the loss (nats per byte) and of next-byte
        accuracy (perplexity is not a mean over sequences)."""
        return spreads(sums, count, {"loss": "loss", "accuracy": "correct"})

    def metrics_from_sums(self, sums: Mapping[str, float], count: int) -> dict[str, float]:
        loss = sums["loss"] / count
        return {
            "loss": loss,
            "perplexity": math.inf if loss > 700.0 else math.exp(loss),
            "accuracy": sums["correct"] / count,
        }


TASK = TinyLMTask()
