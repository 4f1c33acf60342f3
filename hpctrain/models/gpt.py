"""A GPT-2 style decoder: learned positions, pre-norm causal blocks, optional tied LM head."""

from __future__ import annotations

import torch
from torch import nn

from hpctrain.config.schema import GPTConfig
from hpctrain.models.layers import Block, init_gpt2_


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig) -> None:
        super().__init__()
        self.cfg = cfg
        d = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        self.pos_emb = nn.Embedding(cfg.seq_len, d)
        self.drop = nn.Dropout(cfg.dropout)
        # Layers keyed "0".."L-1" rather than an nn.Sequential/ModuleList index so parameter names stay stable
        # when a pipeline stage deletes the layers it does not own (checkpoints reshard by name).
        self.layers = nn.ModuleDict(
            {
                str(i): Block(d, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, causal=True)
                for i in range(cfg.n_layers)
            }
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            # Weight tying (Press & Wolf 2017): the LM head reuses the token embedding matrix.
            self.head.weight = self.tok_emb.weight
        self.init_weights()

    def init_weights(self) -> None:
        """(Re)initialise every parameter; callable after ``to_empty`` when the model was built on meta."""
        init_gpt2_(self, self.cfg.n_layers)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """``idx``: int64 [B, T] token ids with T ≤ seq_len. Returns logits [B, T, vocab_size]."""
        length = idx.shape[1]
        if length > self.cfg.seq_len:
            raise ValueError(f"sequence length {length} exceeds the model's seq_len={self.cfg.seq_len}")
        pos = torch.arange(length, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for layer in self.layers.values():
            x = layer(x)
        return self.head(self.norm(x))
