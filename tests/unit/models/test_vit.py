"""The built-in ViT (hpctrain.models.vit): shapes, every patch reaches the class token, indivisible patches
refused, and a small model that overfits a batch of digits."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from hpctrain.data.datasets import Digits
from hpctrain.models.builtin import ViTSpec as ViTConfig
from hpctrain.models.vit import ViT

TINY_VIT = ViTConfig(n_layers=2, d_model=32, n_heads=4, image_size=8, patch_size=2, num_classes=10)


def test_vit_is_not_causal_and_shapes() -> None:
    torch.manual_seed(0)
    model = ViT(TINY_VIT).eval()
    x = torch.randn(3, 1, 8, 8)
    logits = model(x)
    assert logits.shape == (3, 10)
    # The last patch (bottom-right) must reach the class token.
    y = x.clone()
    y[:, :, -2:, -2:] += 1.0
    assert not torch.allclose(model(y), logits)
    with pytest.raises(ValueError, match=r"\[B, 1, 8, 8\]"):
        model(torch.randn(1, 1, 16, 16))


def test_vit_rejects_indivisible_patches() -> None:
    with pytest.raises(ValueError, match=r"patch_size=3.*image_size=10"):
        ViT(replace(TINY_VIT, image_size=10, patch_size=3))


@pytest.mark.usefixtures("one_thread")
def test_vit_overfits_digits_batch() -> None:
    torch.manual_seed(0)
    model = ViT(ViTConfig())  # the conf/model/vit.yaml size: d_model=64, 2x2 patches of 8x8 digits
    x, y = Digits().get_batch(range(32))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    losses = []
    for _ in range(50):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
