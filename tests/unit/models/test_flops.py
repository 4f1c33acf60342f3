"""Parameter counts and FLOPs (hpctrain.models.flops) from a model's shapes, against the built model and by
hand; torch-free (a fresh interpreter)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from hpctrain.models import build_model
from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.models.builtin import ViTSpec as ViTConfig
from hpctrain.models.flops import flops_per_token, param_count, tokens_per_sample
from hpctrain.models.gpt import GPT

TINY_GPT = GPTConfig(n_layers=2, d_model=32, n_heads=4, vocab_size=64, seq_len=16)
TINY_VIT = ViTConfig(n_layers=2, d_model=32, n_heads=4, image_size=8, patch_size=2, num_classes=10)


def _real_count(model: torch.nn.Module, include_embeddings: bool) -> int:
    embedding_names = ("tok_emb.weight", "pos_emb.weight", "pos_emb", "cls_token")
    total = 0
    for name, p in model.named_parameters():  # de-duplicates tied parameters (named by first owner)
        if name in embedding_names and not include_embeddings:
            continue
        total += p.numel()
    if not include_embeddings and isinstance(model, GPT) and model.cfg.tie_embeddings:
        total += model.head.weight.numel()  # the tied head's matmul counts as non-embedding compute
    return total


@pytest.mark.parametrize(
    "cfg",
    [
        TINY_GPT,
        replace(TINY_GPT, tie_embeddings=False),
        replace(TINY_GPT, mlp_ratio=2, n_layers=3),
        TINY_VIT,
        replace(TINY_VIT, in_channels=3, image_size=12, patch_size=4, num_classes=7),
    ],
)
def test_param_count_matches_model(cfg: GPTConfig | ViTConfig) -> None:
    model = build_model(cfg)
    for include in (True, False):
        assert param_count(cfg, include_embeddings=include) == _real_count(model, include)


def test_param_count_gpt2_small() -> None:
    # GPT-2 small with the padded 50304 vocabulary: nanoGPT reports ~124M.
    cfg = GPTConfig(n_layers=12, d_model=768, n_heads=12, seq_len=1024, vocab_size=50304)
    assert param_count(cfg) == 124_475_904


def test_flops_per_token_hand_computed() -> None:
    cfg = GPTConfig(n_layers=2, d_model=64, n_heads=4, mlp_ratio=4, vocab_size=256, seq_len=64)
    # Per block: 2 LayerNorms 4·64 + q/k/v/o 4·(64² + 64) + MLP (64·256 + 256) + (256·64 + 64) = 49984.
    # N = 2·49984 + final norm 128 + head 64·256 = 116480; attention: 12·2·4·16·64 = 98304.
    assert param_count(cfg, include_embeddings=False) == 116_480
    assert tokens_per_sample(cfg) == 64
    assert flops_per_token(cfg) == 6 * 116_480 + 98_304
    assert tokens_per_sample(TINY_VIT) == 17


def test_flops_and_catalog_do_not_import_torch() -> None:
    code = (
        "import sys, hpctrain.models.flops, hpctrain.data.catalog, hpctrain.data.sampler; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
