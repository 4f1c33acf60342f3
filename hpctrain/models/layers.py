"""Transformer building blocks shared by the GPT and the ViT.

Every projection is its own ``nn.Linear`` (no fused qkv) so that a tensor-parallel plan can address them by
name: ``q``/``k``/``v``/``fc_in`` split column-wise, ``o``/``fc_out`` row-wise (Megatron-LM, Shoeybi et al.
2019, section 3). Nothing here knows about distribution.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# GPT-2 initialisation (Radford et al. 2019, section 2.3; nanoGPT's _init_weights).
INIT_STD = 0.02
# Names of the projections that write into the residual stream; GPT-2 scales their init by 1/sqrt(2·L)
# because each of the L blocks adds two of them to the residual, so its variance would otherwise grow with L.
RESIDUAL_PROJECTIONS = ("attn.o.weight", "mlp.fc_out.weight")
# Tensor-parallel roles of every Block under a model's ``layers`` (see hpctrain.parallel.tp): the norms work
# on sequence shards, attention and MLP gather the sequence, then column-wise in, row-wise out.
BLOCK_TP_PLAN = {
    "layers.*.ln1": "norm",
    "layers.*.attn": "gather_sequence",
    "layers.*.attn.q": "colwise",
    "layers.*.attn.k": "colwise",
    "layers.*.attn.v": "colwise",
    "layers.*.attn.o": "rowwise",
    "layers.*.ln2": "norm",
    "layers.*.mlp": "gather_sequence",
    "layers.*.mlp.fc_in": "colwise",
    "layers.*.mlp.fc_out": "rowwise",
}


def dropout_module(p: float) -> nn.Module:
    """``nn.Dropout(p)``, or ``nn.Identity`` at p = 0: torch's dropout returns its input unchanged there and
    draws no random numbers, so the output is the same, without a module call per use (~3 µs each on a CPU,
    9 a pass in a 4-layer GPT). A TP plan's hooks on the module work on either."""
    return nn.Dropout(p) if p > 0 else nn.Identity()


class Attention(nn.Module):
    """Multi-head self-attention via ``F.scaled_dot_product_attention`` (flash / memory-efficient kernels)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, causal: bool = True) -> None:
        super().__init__()
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.head_dim = d_model // n_heads
        self.causal = causal
        self.dropout = dropout
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        self.resid_dropout = dropout_module(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # The head count is read off the projection's output (-1), not stored: under a tensor-parallel split
        # each rank holds only n_heads / tp of the heads.
        q = self.q(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # [B, H, T, Q]
        k = self.k(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=self.causal
        )
        y = y.transpose(1, 2).reshape(B, T, -1)
        return self.resid_dropout(self.o(y))


class MLP(nn.Module):
    """Position-wise feed-forward: d → mlp_ratio·d → d with GELU (tanh approximation, as in GPT-2)."""

    def __init__(self, d_model: int, mlp_ratio: int = 4, dropout: float = 0.0) -> None:
        super().__init__()
        self.fc_in = nn.Linear(d_model, mlp_ratio * d_model)
        self.act = nn.GELU(approximate="tanh")
        self.fc_out = nn.Linear(mlp_ratio * d_model, d_model)
        self.dropout = dropout_module(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.fc_out(self.act(self.fc_in(x))))


class Block(nn.Module):
    """Pre-norm transformer block (GPT-2 / ViT): ``x + attn(ln1(x))`` then ``x + mlp(ln2(x))``."""

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        mlp_ratio: int = 4,
        dropout: float = 0.0,
        causal: bool = True,
        mlp: nn.Module | None = None,
    ) -> None:
        """``mlp``: what runs in place of the MLP (a mixture of experts), with the same input and output."""
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = Attention(d_model, n_heads, dropout, causal)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = mlp if mlp is not None else MLP(d_model, mlp_ratio, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def init_gpt2_(model: nn.Module, n_layers: int) -> None:
    """GPT-2 style init in place: N(0, 0.02) weights, zero biases, LayerNorm (1, 0), residual outputs scaled.

    Deterministic given ``torch.manual_seed``: modules are visited in registration order. Tied parameters
    are simply initialised twice with the same distribution.
    """
    for module in model.modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=INIT_STD)
        elif isinstance(module, nn.LayerNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    residual_std = INIT_STD / math.sqrt(2 * n_layers)
    for name, param in model.named_parameters():
        if name.endswith(RESIDUAL_PROJECTIONS):
            nn.init.normal_(param, mean=0.0, std=residual_std)
