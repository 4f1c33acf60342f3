"""DDP compression (hpctrain.parallel.compression) in one process: the bucket cap that holds a model's
gradients in one bucket, as PowerSGD on gloo needs. (The hooks on 2 ranks: tests/e2e/parallel/.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from hpctrain.models import build_model
from hpctrain.models.builtin import GPTSpec as GPTConfig
from hpctrain.parallel.compression import single_bucket_cap_mb

MODEL = GPTConfig(n_layers=2, d_model=32, n_heads=2, vocab_size=64, seq_len=16)


def test_single_bucket_cap_mb_covers_the_model() -> None:
    torch.manual_seed(0)
    model = build_model(MODEL)  # the model the 2-rank runs train
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    assert single_bucket_cap_mb(model) * 2**20 > total
    mixed = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).to(torch.float64))
    with pytest.raises(ValueError, match="dtype"):
        single_bucket_cap_mb(mixed)
