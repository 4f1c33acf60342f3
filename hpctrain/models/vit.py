"""A Vision Transformer (Dosovitskiy et al. 2020): patch embedding, class token, pre-norm blocks."""

from __future__ import annotations

import torch
from torch import nn

from hpctrain.config.schema import ViTConfig
from hpctrain.models.layers import INIT_STD, Block, init_gpt2_


class ViT(nn.Module):
    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
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
        self.drop = nn.Dropout(cfg.dropout)
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
        """``x``: float [B, C, H, W], C = in_channels, H = W = image_size. Returns logits [B, num_classes]."""
        cfg = self.cfg
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
        return self.head(self.norm(x[:, 0]))
