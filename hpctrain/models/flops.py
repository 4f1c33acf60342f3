"""Parameter and FLOP counts computed from a model config alone.

Must not import torch: the submit path uses it to size jobs and report MFU targets without building models.
``cfg`` may be a ``GPTConfig``/``ViTConfig`` dataclass or an OmegaConf node with the same fields.

"Embedding" parameters here are those that cost no matmul FLOPs: lookup tables and additive terms (GPT's
``tok_emb``/``pos_emb``, ViT's ``cls_token``/``pos_emb``). Every parameter used in a matmul counts as
non-embedding, including the LM head even when it is tied to ``tok_emb`` (its d·V matmul runs either way,
as in nanoGPT's MFU estimate) and ViT's patch projection.
"""

from __future__ import annotations

from typing import Any

from hpctrain.config.shape import tokens_per_sample


def _block_params(d: int, mlp_ratio: int) -> int:
    """One pre-norm block: two LayerNorms, q/k/v/o with biases, fc_in/fc_out with biases."""
    hidden = mlp_ratio * d
    layer_norms = 2 * (2 * d)
    attention = 4 * (d * d + d)
    mlp = (d * hidden + hidden) + (hidden * d + d)
    return layer_norms + attention + mlp


def _n_patches(cfg: Any) -> int:
    if cfg.image_size % cfg.patch_size != 0:
        raise ValueError(f"image_size={cfg.image_size} is not divisible by patch_size={cfg.patch_size}")
    return (cfg.image_size // cfg.patch_size) ** 2


def param_count(cfg: Any, include_embeddings: bool = True) -> int:
    """Number of distinct trainable parameters of ``build_model(cfg)`` (tied weights counted once).

    With ``include_embeddings=False``: only the parameters that take part in matmuls (see module docstring),
    the N of the 6·N FLOPs rule; the tied LM head then counts once, as the head.
    """
    d = cfg.d_model
    blocks = cfg.n_layers * _block_params(d, cfg.mlp_ratio)
    final_norm = 2 * d
    if cfg.arch == "gpt":
        head = d * cfg.vocab_size
        embeddings = cfg.vocab_size * d + cfg.seq_len * d
        if not include_embeddings:
            return blocks + final_norm + head
        # Tied: the head *is* tok_emb, already counted among the embeddings.
        return embeddings + blocks + final_norm + (0 if cfg.tie_embeddings else head)
    if cfg.arch == "vit":
        n_patches = _n_patches(cfg)
        patch_proj = cfg.in_channels * cfg.patch_size**2 * d + d
        head = d * cfg.num_classes + cfg.num_classes
        embeddings = d + (n_patches + 1) * d  # cls_token + pos_emb
        dense = patch_proj + blocks + final_norm + head
        return dense + embeddings if include_embeddings else dense
    raise ValueError(f"unknown model arch {cfg.arch!r}; expected 'gpt' or 'vit'")


def flops_per_token(cfg: Any) -> float:
    """Training FLOPs (forward + backward) per token: ``6·N + 12·L·H·Q·T``.

    From Chowdhery et al. 2022, "PaLM: Scaling Language Modeling with Pathways", appendix B: N is the number
    of non-embedding parameters (``param_count(cfg, include_embeddings=False)``), L the number of layers, H
    the number of heads, Q the head dimension and T the tokens per sample (``tokens_per_sample``). The
    attention term is not halved for causal masking, following the paper; multiply by tokens per second
    and divide by peak FLOP/s for MFU.
    """
    n = param_count(cfg, include_embeddings=False)
    head_dim = cfg.d_model // cfg.n_heads
    attention = 12 * cfg.n_layers * cfg.n_heads * head_dim * tokens_per_sample(cfg)
    return float(6 * n + attention)
