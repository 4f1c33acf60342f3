"""A small convolutional net for 1×8×8 images: plain PyTorch, nothing of hpctrain."""

from __future__ import annotations

from torch import nn


def build_cnn(width: int = 32, num_classes: int = 10) -> nn.Module:
    """conv → ReLU → conv → ReLU → 2×2 average pool → linear; initialised from torch's current RNG."""
    return nn.Sequential(
        nn.Conv2d(1, width, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(width, width, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(2),
        nn.Flatten(),
        nn.Linear(4 * width, num_classes),
    )
