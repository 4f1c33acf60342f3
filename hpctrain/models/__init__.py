"""Models. Importing this package does not import torch (``flops`` is used on the submit path);
``build_model`` imports the model code when called."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

__all__ = ["build_model"]


def build_model(cfg: Any) -> nn.Module:
    """Construct the model named by ``cfg.arch`` ("gpt" | "vit"), initialised from torch's current RNG."""
    if cfg.arch == "gpt":
        from hpctrain.models.gpt import GPT

        return GPT(cfg)
    if cfg.arch == "vit":
        from hpctrain.models.vit import ViT

        return ViT(cfg)
    raise ValueError(f"unknown model arch {cfg.arch!r}; expected 'gpt' or 'vit'")
