"""Networks of the built-in tasks: an MLP, a 1-D CNN (mnist1d), a CIFAR-style ResNet and a
DnCNN denoiser (denoise).

Every model uses PyTorch's default initialisation (deterministic under ``torch.manual_seed``)
except where noted. The classifiers map ``(B, *input_shape)`` to ``(B, num_classes)`` logits;
:class:`DnCNN` maps images to images of the same shape.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["MLP", "BasicBlock", "CifarResNet", "Conv1dNet", "DnCNN", "count_parameters"]


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


class MLP(nn.Sequential):
    """``in_features -> [hidden_dim, ReLU] x num_hidden_layers -> num_classes`` (flattens input)."""

    def __init__(
        self, in_features: int, num_classes: int, hidden_dim: int, num_hidden_layers: int
    ) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for _ in range(num_hidden_layers):
            layers += [nn.Linear(width, hidden_dim), nn.ReLU(inplace=True)]
            width = hidden_dim
        layers.append(nn.Linear(width, num_classes))
        super().__init__(*layers)


def _conv1d_bn(c_in: int, c_out: int, kernel: int) -> list[nn.Module]:
    return [
        nn.Conv1d(c_in, c_out, kernel, padding=kernel // 2, bias=False),
        nn.BatchNorm1d(c_out),
        nn.ReLU(inplace=True),
    ]


class Conv1dNet(nn.Sequential):
    """A small 1-D CNN for ``(B, in_channels, L)`` signals (mnist1d: ``(B, 1, 40)``).

    Four Conv1d + BatchNorm + ReLU layers (width ``w, w, 2w, 2w``, two max-pools), global average
    pooling and a linear classifier. Width 32: 22,698 parameters.
    """

    def __init__(self, in_channels: int, num_classes: int, width: int = 32) -> None:
        super().__init__(
            *_conv1d_bn(in_channels, width, 5),
            *_conv1d_bn(width, width, 3),
            nn.MaxPool1d(2),
            *_conv1d_bn(width, 2 * width, 3),
            nn.MaxPool1d(2),
            *_conv1d_bn(2 * width, 2 * width, 3),
            nn.AdaptiveAvgPool1d(1),
            nn.Flatten(),
            nn.Linear(2 * width, num_classes),
        )


class BasicBlock(nn.Module):
    """The two-3x3-conv residual block of ResNet-18/20 (projection shortcut when shapes change).

    The last BatchNorm's scale starts at zero (Goyal et al. 2017), so each block starts as the
    identity: it helps large-batch training and changes nothing else.
    """

    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        nn.init.zeros_(self.bn2.weight)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class CifarResNet(nn.Module):
    """The CIFAR ResNet of He et al. 2016 (depth ``6n + 2``: 8, 14, 20, 32, 44, 56, 110).

    Stem 3x3 conv of ``width`` channels, three stages of ``n`` :class:`BasicBlock` with ``width,
    2 width, 4 width`` channels (strides 1, 2, 2), global average pooling, linear classifier.
    Works with ``channels_last`` inputs and weights (``model.to(memory_format=...)``).
    ResNet-20 at width 16: 272,474 parameters; ResNet-8: 78,042.
    """

    def __init__(
        self, depth: int = 20, width: int = 16, num_classes: int = 10, in_channels: int = 3
    ) -> None:
        super().__init__()
        if depth < 8 or (depth - 2) % 6:
            raise ValueError(f"depth must be 6n + 2 with n >= 1 (8, 14, 20, ...), got {depth}")
        n = (depth - 2) // 6
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, width, 3, padding=1, bias=False),
            nn.BatchNorm2d(width),
            nn.ReLU(inplace=True),
        )
        blocks: list[nn.Module] = []
        c_in = width
        for stage, c_out in enumerate((width, 2 * width, 4 * width)):
            for i in range(n):
                blocks.append(BasicBlock(c_in, c_out, stride=2 if stage > 0 and i == 0 else 1))
                c_in = c_out
        self.blocks = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(c_in, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(self.blocks(self.stem(x)))
        logits: torch.Tensor = self.fc(torch.flatten(out, 1))
        return logits


class DnCNN(nn.Module):
    """The residual denoiser of Zhang et al. 2017 ("Beyond a Gaussian denoiser", DnCNN-S).

    ``depth`` 3x3 conv layers of ``width`` channels: conv + ReLU, ``depth - 2`` conv +
    BatchNorm + ReLU, conv back to ``channels``. The network predicts the noise; the output is
    the input minus that prediction, ``(B, channels, H, W)`` in and out (padding keeps the
    size). Depth 7, width 32, one channel: 47,008 parameters (the paper's: depth 17, width 64).

    The last conv's weights start at zero, so the model starts as the identity (it returns the
    noisy input) and every step improves on that; with PyTorch's default initialisation there
    the first epochs are spent undoing a random residual (measured on ``denoise``'s defaults:
    30.3 dB after 8 epochs against 26.2 dB).
    """

    def __init__(self, channels: int = 1, depth: int = 7, width: int = 32) -> None:
        super().__init__()
        if depth < 3:
            raise ValueError(f"depth must be >= 3, got {depth}")
        layers: list[nn.Module] = [
            nn.Conv2d(channels, width, 3, padding=1),
            nn.ReLU(inplace=True),
        ]
        for _ in range(depth - 2):
            layers += [
                nn.Conv2d(width, width, 3, padding=1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(inplace=True),
            ]
        last = nn.Conv2d(width, channels, 3, padding=1, bias=False)
        nn.init.zeros_(last.weight)
        layers.append(last)
        self.residual = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x - self.residual(x)
        return out
