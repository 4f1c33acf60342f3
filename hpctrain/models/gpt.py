"""A GPT-2 style decoder: learned positions, pre-norm causal blocks, optional tied LM head."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from hpctrain.models.builtin import GPTSpec
from hpctrain.models.layers import BLOCK_TP_PLAN, Block, dropout_module, init_gpt2_


class GPT(nn.Module):
    """Distribution is applied from outside (hpctrain.parallel), guided by two declarations:

    - ``TP_PLAN``: module name pattern → tensor-parallel role (Megatron-LM column/row splits, sequence
      parallelism on the norms); the roles are defined in hpctrain.parallel.tp.
    - ``PIPELINE_INPUT`` / ``PIPELINE_OUTPUT``: the modules only the first / last pipeline stage keeps; the
      layers between are split evenly. A stage's copy has the others set to None, which ``forward`` allows.
    """

    TP_PLAN: ClassVar[dict[str, str]] = {
        "tok_emb": "vocab_embedding",
        "drop": "enter_sequence_shards",  # the residual stream starts here
        **BLOCK_TP_PLAN,
        "norm": "norm",
        "head": "vocab_head",
    }
    PIPELINE_INPUT: ClassVar[tuple[str, ...]] = ("tok_emb", "pos_emb", "drop")
    PIPELINE_OUTPUT: ClassVar[tuple[str, ...]] = ("norm", "head")

    def __init__(self, spec: GPTSpec | None = None, **kwargs: Any) -> None:
        """From a spec, or from the spec's fields as keyword arguments (the ``model`` config group)."""
        super().__init__()
        cfg = spec if spec is not None else GPTSpec(**kwargs)
        cfg.check()
        self.cfg = cfg
        d = cfg.d_model
        self.tok_emb = nn.Embedding(cfg.vocab_size, d)
        self.pos_emb = nn.Embedding(cfg.seq_len, d)
        self.drop = dropout_module(cfg.dropout)
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
        """``idx``: int64 [B, T] token ids with T ≤ seq_len. Returns logits [B, T, vocab_size].

        A later pipeline stage (no ``tok_emb``) takes hidden states instead; a stage before the last (no
        ``head``) returns them."""
        x = idx
        if self.tok_emb is not None:
            length = idx.shape[1]
            if length > self.cfg.seq_len:
                raise ValueError(f"sequence length {length} exceeds the model's seq_len={self.cfg.seq_len}")
            pos = torch.arange(length, device=idx.device)
            x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for layer in self.layers.values():
            x = layer(x)
        if self.head is None:
            return x
        return self.head(self.norm(x))
