"""A Vision Transformer (Dosovitskiy et al. 2020): patch embedding, class token, pre-norm blocks."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import nn

from hpctrain.models.builtin import ViTSpec
from hpctrain.models.layers import BLOCK_TP_PLAN, INIT_STD, Block, dropout_module, init_gpt2_


class ViT(nn.Module):
    """Declarations for hpctrain.parallel as in :class:`hpctrain.models.gpt.GPT`. The head reads the class
    token only, so under sequence parallelism the final norm gathers the sequence and runs replicated."""

    TP_PLAN: ClassVar[dict[str, str]] = {
        "drop": "enter_sequence_shards",
        **BLOCK_TP_PLAN,
        "norm": "gather_sequence",
    }
    PIPELINE_INPUT: ClassVar[tuple[str, ...]] = ("patch_emb", "cls_token", "pos_emb", "drop")
    PIPELINE_OUTPUT: ClassVar[tuple[str, ...]] = ("norm", "head")

    def __init__(self, spec: ViTSpec | None = None, **kwargs: Any) -> None:
        """From a spec, or from the spec's fields as keyword arguments (the ``model`` config group)."""
        super().__init__()
        cfg = spec if spec is not None else ViTSpec(**kwargs)
        cfg.check()
        if cfg.image_size % cfg.patch_size != 0:
            raise ValueError(f"image_size={cfg.image_size} is not divisible by patch_size={cfg.patch_size}")
        self.cfg = cfg
        d = cfg.d_model
        self.grid = cfg.image_size // cfg.patch_size
        self.n_patches = self.grid * self.grid
        # A conv with kernel = stride = patch is exactly "cut into patches, flatten, apply one Linear".
        self.patch_emb = nn.Conv2d(cfg.in_channels, d, kernel_size=cfg.patch_size, stride=cfg.patch_size)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d))
        self.pos_emb = nn.Parameter(torch.zeros(1, self.n_patches + 1, d))
        self.drop = dropout_module(cfg.dropout)
        self.layers = nn.ModuleDict(
            {
                str(i): Block(d, cfg.n_heads, cfg.mlp_ratio, cfg.dropout, causal=False)
                for i in range(cfg.n_layers)
            }
        )
        self.norm = nn.LayerNorm(d)
        self.head = nn.Linear(d, cfg.num_classes)
        self.init_weights()

    def init_weights(self) -> None:
        """(Re)initialise every parameter; callable after ``to_empty`` when the model was built on meta."""
        init_gpt2_(self, self.cfg.n_layers)
        nn.init.normal_(self.cls_token, mean=0.0, std=INIT_STD)
        nn.init.normal_(self.pos_emb, mean=0.0, std=INIT_STD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: float [B, C, H, W], C = in_channels, H = W = image_size. Returns logits [B, num_classes].

        A pipeline stage without ``patch_emb`` takes hidden states [B, n_patches + 1, d]; one without ``head``
        returns them."""
        cfg = self.cfg
        if self.patch_emb is not None:
            if tuple(x.shape[1:]) != (cfg.in_channels, cfg.image_size, cfg.image_size):
                raise ValueError(
                    f"expected images of shape [B, {cfg.in_channels}, {cfg.image_size}, {cfg.image_size}], "
                    f"got {list(x.shape)}"
                )
            x = self.patch_emb(x).flatten(2).transpose(1, 2)  # [B, n_patches, d]
            cls = self.cls_token.expand(x.shape[0], -1, -1)
            x = self.drop(torch.cat([cls, x], dim=1) + self.pos_emb)
        for layer in self.layers.values():
            x = layer(x)
        if self.head is None:
            return x
        # Normalising every token then keeping the class token equals normalising the class token alone
        # (LayerNorm is per token), and leaves the norm a module that sees the whole sequence.
        return self.head(self.norm(x)[:, 0])
