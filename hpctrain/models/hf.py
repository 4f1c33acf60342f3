"""transformers models: their own pipeline plans, read for hpctrain's pipeline split and context parallelism.

A transformers decoder (Llama, Mistral, Qwen2, ...) declares ``base_model_pp_plan``: the base model's
modules in forward order with what each takes and returns (``embed_tokens``: input ids → embeddings;
``layers``: hidden states (+ mask) → hidden states; ``norm``), and the task model adds its head
(``_pp_plan``: ``lm_head``). Its decoder layers also take the rotary position embeddings and the causal
mask that the base model's forward computes once; :func:`pipeline_split` says how to compute them from a
stage's hidden states, as ``LlamaModel.forward`` does. Nothing here is distributed.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from hpctrain.models.spec import PipelineSplit


def pipeline_split(model: nn.Module) -> PipelineSplit | None:
    """The split a transformers model declares, or None (not a transformers model, or no plan)."""
    config = getattr(model, "config", None)
    base_plan = getattr(config, "base_model_pp_plan", None)
    if not base_plan:
        return None
    prefix = getattr(model, "base_model_prefix", "")
    base = getattr(model, prefix, None) if prefix else model
    if base is None:  # the base model class itself
        base, prefix = model, ""
    names = [f"{prefix}.{name}" if base is not model else name for name in base_plan]
    blocks = next((n for n in names if isinstance(model.get_submodule(n), nn.ModuleList)), None)
    if blocks is None:
        return None
    at = names.index(blocks)
    head = [n for n in (getattr(type(model), "_pp_plan", None) or {}) if n not in names]
    keep = tuple(
        f"{prefix}.{name}" if base is not model else name
        for name, child in base.named_children()
        if name == "rotary_emb" and not any(True for _ in child.parameters())
    )

    def block_kwargs(stage: Any, hidden: torch.Tensor) -> dict[str, Any]:
        """What ``LlamaModel.forward`` passes every layer: positions 0..T-1, their rotary embeddings, the
        causal mask (None where the attention kernel masks causally itself)."""
        from transformers.masking_utils import create_causal_mask

        positions = torch.arange(hidden.shape[1], device=hidden.device).unsqueeze(0)
        kwargs: dict[str, Any] = {"position_ids": positions}
        if keep:
            kwargs["position_embeddings"] = stage.get_submodule(keep[0])(hidden, position_ids=positions)
        # No position ids here: with them transformers looks for packed sequences (a data-dependent scan);
        # a stage's sequences are whole.
        # The cache by position: transformers 5.24 renamed it (past_key_values -> cache); 5.20 is the newest
        # on Python 3.10.
        kwargs["attention_mask"] = create_causal_mask(stage.config, hidden, None, None, position_ids=None)
        return kwargs

    return PipelineSplit(tuple(names[:at]), blocks, (*names[at + 1 :], *head), keep, block_kwargs)


def context_plan(model: nn.Module) -> dict[str, str] | None:
    """Where context parallelism (:mod:`hpctrain.parallel.context`) splits a transformers decoder: the
    hidden states at its first layer's input (the base model computed positions, rotary embeddings and mask
    from the whole sequence before), the per-position arguments every layer takes (the rotary embeddings,
    the position ids), and each layer's attention (its ``*Attention`` child: scaled_dot_product_attention,
    causal, when the model runs with ``attn_implementation="sdpa"``). None for anything else."""
    split = pipeline_split(model)
    config = getattr(model, "config", None)
    if split is None or getattr(config, "_attn_implementation", None) != "sdpa":
        return None
    layers = model.get_submodule(split.blocks)
    if not isinstance(layers, nn.ModuleList) or not len(layers):
        return None
    attention = [
        name for name, child in layers[0].named_children() if type(child).__name__.endswith("Attention")
    ]
    if len(attention) != 1:
        return None
    return {
        f"{split.blocks}.0": "enter_input",
        f"{split.blocks}.*": "positions",
        f"{split.blocks}.*.{attention[0]}": "attention",
    }
