"""A token model of the shape embed → repeated blocks → head, in plain PyTorch.

Nothing in it is declared for hpctrain: the pipeline split is found from its block list (``blocks``), and
``conf/model/mixer.yaml`` shows the tensor-parallel plan a user writes for it.
"""

from __future__ import annotations

import torch
from torch import nn


class Residual(nn.Module):
    """x + MLP(LayerNorm(x))."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class TokenMLP(nn.Module):
    """Token embedding → ``depth`` residual MLP blocks → LayerNorm → linear head over the vocabulary."""

    def __init__(self, vocab_size: int = 256, width: int = 64, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab_size, width)
        self.blocks = nn.ModuleList(Residual(width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(input_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))
