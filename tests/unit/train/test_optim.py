"""Optimizers and the learning-rate schedule (hpctrain.train.optim): weight decay on matrices only; linear
warmup to the peak, cosine decay to ``min_lr_ratio`` of it (GPT-3 §2.3, nanoGPT)."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

from hpctrain.config.schema import OptimConfig
from hpctrain.train.optim import build_optimizer, build_scheduler, lr_factor


def test_warmup_then_cosine_to_the_floor() -> None:
    warmup, total, floor = 4, 14, 0.1
    factors = [lr_factor(s, warmup, total, floor) for s in range(total + 3)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]  # (step + 1) / warmup
    assert factors[4] == 1.0 and factors[9] == pytest.approx(floor + (1 - floor) * 0.5)  # half-way: the mean
    assert factors[14:] == [pytest.approx(floor)] * 3  # held at the floor after the last step
    assert all(a >= b for a, b in itertools.pairwise(factors[4:]))
    assert factors[7] == pytest.approx(floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * 3 / 10)))


def test_weight_decay_on_matrices_only_and_the_schedule_drives_the_lr() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.LayerNorm(4))
    adamw = build_optimizer(model, OptimConfig(name="adamw", lr=1e-2, weight_decay=0.1, warmup_steps=2))
    decayed, plain = adamw.param_groups
    assert [p.shape for p in decayed["params"]] == [torch.Size([4, 3])] and decayed["weight_decay"] == 0.1
    assert len(plain["params"]) == 3 and plain["weight_decay"] == 0.0  # bias, norm weight and bias
    schedule = build_scheduler(adamw, OptimConfig(name="adamw", lr=1e-2, warmup_steps=2), total_steps=10)
    assert [g["lr"] for g in adamw.param_groups] == [pytest.approx(5e-3)] * 2  # before step 0: 1/2 warmup
    adamw.step()
    schedule.step()
    assert [g["lr"] for g in adamw.param_groups] == [pytest.approx(1e-2)] * 2
    sgd = build_optimizer(model, OptimConfig(name="sgd", lr=0.1, momentum=0.9, nesterov=True))
    assert isinstance(sgd, torch.optim.SGD) and sgd.param_groups[0]["nesterov"]
    with pytest.raises(ValueError, match="unknown optimizer 'lamb'"):
        build_optimizer(model, OptimConfig(name="lamb"))
