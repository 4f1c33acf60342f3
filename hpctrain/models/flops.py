"""Parameter and FLOP counts from a model's spec alone (:mod:`hpctrain.models.spec`). Torch-free.

The submit path uses these to size jobs and report MFU targets without building models. A spec that
declares no counts (a user's model) gives None; the trainer then counts the built module's parameters
(:func:`hpctrain.train.metrics.module_flops_per_sample`).
"""

from __future__ import annotations

from hpctrain.config.schema import ModelConfig
from hpctrain.models.builtin import model_spec
from hpctrain.models.spec import ModelSpec


def param_count(model: ModelConfig | ModelSpec, include_embeddings: bool = True) -> int | None:
    """Distinct trainable parameters (tied weights once); without embeddings, those used in matmuls."""
    return model_spec(model).param_count(include_embeddings)


def flops_per_token(model: ModelConfig | ModelSpec) -> float | None:
    """Training FLOPs per token (PaLM's 6·N + 12·L·H·Q·T, see ``TransformerSpec.flops_per_token``)."""
    return model_spec(model).flops_per_token()


def tokens_per_sample(model: ModelConfig | ModelSpec) -> int:
    """Positions per sample the blocks see: seq_len for gpt, patches + class token for vit, else 1."""
    return model_spec(model).tokens_per_sample
