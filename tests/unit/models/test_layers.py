"""The built-ins' layers (hpctrain.models.layers): attention against a hand-written softmax(QKᵀ/√d)V, causal
or not; the pre-norm block; no dropout module at p = 0; and a model's logits (hpctrain.models.outputs)
wherever its output keeps them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from hpctrain.models.layers import Attention, Block, dropout_module
from hpctrain.models.outputs import logits_of


def _by_hand(attn: Attention, x: torch.Tensor, causal: bool) -> torch.Tensor:
    B, T, d = x.shape
    heads = d // attn.head_dim

    def split(t: torch.Tensor) -> torch.Tensor:
        return t.view(B, T, heads, attn.head_dim).transpose(1, 2)

    q, k, v = split(attn.q(x)), split(attn.k(x)), split(attn.v(x))
    scores = q @ k.transpose(-2, -1) / math.sqrt(attn.head_dim)
    if causal:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, T, d)
    return attn.o(y)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_is_softmax_of_scaled_scores(causal: bool) -> None:
    torch.manual_seed(0)
    attn = Attention(16, 4, causal=causal).eval()
    x = torch.randn(2, 5, 16)
    torch.testing.assert_close(attn(x), _by_hand(attn, x, causal), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="d_model=16 is not divisible by n_heads=3"):
        Attention(16, 3)


def test_the_block_is_pre_norm_with_residuals_and_p0_has_no_dropout() -> None:
    torch.manual_seed(0)
    block = Block(16, 4).eval()
    x = torch.randn(2, 5, 16)
    h = x + block.attn(block.ln1(x))
    torch.testing.assert_close(block(x), h + block.mlp(block.ln2(h)))
    assert isinstance(dropout_module(0.0), nn.Identity) and isinstance(dropout_module(0.1), nn.Dropout)


def test_logits_are_found_where_the_output_keeps_them() -> None:
    t = torch.zeros(2, 3)
    assert logits_of(t) is t and logits_of({"logits": t, "loss": 0}) is t
    assert logits_of(SimpleNamespace(logits=t)) is t
    with pytest.raises(TypeError, match="the model returned tuple, which holds no logits"):
        logits_of((t,))
