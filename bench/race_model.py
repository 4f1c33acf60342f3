"""The race's model and data (bench/race.py, bench/mfu.py): plain PyTorch, nothing of hpctrain.

hpctrain trains these as a user's ``model._target_`` / ``data._target_`` (race.py copies this file into a
project folder); the hand-written and Fabric loops (race_loops.py) import them directly.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)  # GPT-2's fused c_attn
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, self.n_heads, C // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    """Pre-norm block (GPT-2, Radford et al. 2019, section 2.3): ``x + attn(ln(x))``, ``x + mlp(ln(x))``."""

    def __init__(self, d_model: int, n_heads: int) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = CausalSelfAttention(d_model, n_heads)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc = nn.Linear(d_model, 4 * d_model)
        self.proj = nn.Linear(4 * d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2-like decoder: learned positions, pre-norm blocks, final LayerNorm, LM head tied to the token
    embedding. No dropout modules (the race compares deterministic runs)."""

    def __init__(
        self,
        vocab_size: int = 512,
        seq_len: int = 128,
        n_layers: int = 4,
        d_model: int = 256,
        n_heads: int = 8,
    ) -> None:
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, d_model)
        self.pos_emb = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, n_heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.head.weight = self.tok_emb.weight
        # GPT-2 init (nanoGPT): N(0, 0.02), residual projections scaled by 1/sqrt(2·L) (2 per block).
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * n_layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def matmul_params(model: GPT) -> int:
    """N of PaLM's 6·N (Chowdhery et al. 2022, appendix B): the parameters used in matmuls. The embedding
    lookups are left out; the LM head counts although tied to the token embedding, since its d·V matmul runs
    either way (nanoGPT's estimate_mfu, and hpctrain's GPTSpec.param_count)."""
    lookups = model.tok_emb.weight.numel() + model.pos_emb.weight.numel()
    return sum(p.numel() for p in model.parameters()) - lookups + model.head.weight.numel()


class MarkovTokens(torch.utils.data.Dataset):
    """Token sequences of a seeded random Markov chain (each token has ``branches`` equally likely
    successors), so the loss falls towards ln(branches) as the model learns the table. Items
    ``(input [seq_len], target [seq_len])``, the target shifted by one; item i is a pure function of the
    arguments and i (hpctrain's data contract). The val split is the same chain, another stream."""

    def __init__(
        self,
        split: str,
        n_samples: int = 4096,
        seq_len: int = 128,
        vocab_size: int = 512,
        branches: int = 4,
        seed: int = 0,
    ) -> None:
        rng = np.random.default_rng(seed)
        successors = rng.integers(0, vocab_size, size=(vocab_size, branches))
        n = n_samples if split == "train" else max(64, n_samples // 64)
        stream = np.random.default_rng((seed, 0 if split == "train" else 1))
        tokens = np.empty((n, seq_len + 1), dtype=np.int64)
        tokens[:, 0] = stream.integers(0, vocab_size, size=n)
        choices = stream.integers(0, branches, size=(n, seq_len))
        for t in range(seq_len):
            tokens[:, t + 1] = successors[tokens[:, t], choices[:, t]]
        self.tokens = torch.from_numpy(tokens)

    def __len__(self) -> int:
        return len(self.tokens)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.tokens[i, :-1], self.tokens[i, 1:]
