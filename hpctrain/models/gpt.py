"""A GPT-2 style decoder: learned positions, pre-norm causal blocks, optional tied LM head; and the same
decoder with a mixture of experts in place of every MLP (:class:`GPTMoE`)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from hpctrain.models.builtin import GPTMoESpec, GPTSpec
from hpctrain.models.layers import BLOCK_TP_PLAN, Block, dropout_module, init_gpt2_
from hpctrain.models.moe import MoE, init_experts_


class GPT(nn.Module):
    """Distribution is applied from outside (hpctrain.parallel), guided by two declarations:

    - ``TP_PLAN``: module name pattern → tensor-parallel role (Megatron-LM column/row splits, sequence
      parallelism on the norms); the roles are defined in hpctrain.parallel.tp.
    - ``PIPELINE_INPUT`` / ``PIPELINE_OUTPUT``: the modules only the first / last pipeline stage keeps; the
      layers between are split evenly. A stage's copy has the others set to None, which ``forward`` allows.
    - ``CONTEXT_PLAN``: where context parallelism splits the sequence (the residual stream, from ``drop``'s
      output on) and which modules' ``scaled_dot_product_attention`` runs as ring attention
      (hpctrain.parallel.context); the head and the loss then see this rank's positions only.
    - ``LORA_TARGETS``: the modules LoRA adapts when ``model.lora.targets`` names none (Hu et al. 2021, §7.1:
      the attention's query and value projections).
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
    CONTEXT_PLAN: ClassVar[dict[str, str]] = {"drop": "enter", "layers.*.attn": "attention"}
    LORA_TARGETS: ClassVar[tuple[str, ...]] = ("attn.q", "attn.v")
    SPEC: ClassVar[type[GPTSpec]] = GPTSpec

    def __init__(self, spec: GPTSpec | None = None, **kwargs: Any) -> None:
        """From a spec, or from the spec's fields as keyword arguments (the ``model`` config group)."""
        super().__init__()
        cfg = spec if spec is not None else self.SPEC(**kwargs)
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
                str(i): Block(d, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, causal=True, mlp=self.mlp_of(cfg))
                for i in range(cfg.n_layers)
            }
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            # Weight tying (Press & Wolf 2017): the LM head reuses the token embedding matrix.
            self.head.weight = self.tok_emb.weight
        self.init_weights()

    def mlp_of(self, cfg: GPTSpec) -> nn.Module | None:
        """What each block runs after attention: None for the dense MLP."""
        return None

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


class GPTMoE(GPT):
    """GPT whose every MLP is a mixture of experts (:class:`hpctrain.models.moe.MoE`: a top-k router, experts
    as one grouped weight, dropless unless ``moe.capacity`` > 0, Switch Transformer's load-balancing loss).

    ``MOE_PLAN`` names the experts (grouped weights with the experts as dimension 0, forward on rows sorted
    by expert) that expert parallelism places on ranks (hpctrain.parallel.moe). Under tensor parallelism
    the attention splits as GPT's, the mixture of experts runs whole on the gathered sequence
    (``whole_sequence``: its output is split again)."""

    TP_PLAN: ClassVar[dict[str, str]] = {
        **{k: v for k, v in GPT.TP_PLAN.items() if not k.startswith("layers.*.mlp")},
        "layers.*.mlp": "whole_sequence",
    }
    MOE_PLAN: ClassVar[dict[str, str]] = {"layers.*.mlp.experts": "experts"}
    SPEC: ClassVar[type[GPTSpec]] = GPTMoESpec

    def mlp_of(self, cfg: GPTSpec) -> nn.Module:
        assert isinstance(cfg, GPTMoESpec)
        m = cfg.moe
        return MoE(cfg.d_model, m.experts, m.top_k, cfg.mlp_ratio, m.capacity, m.aux_loss_weight, cfg.dropout)

    def init_weights(self) -> None:
        super().init_weights()
        init_experts_(self, self.cfg.n_layers)
