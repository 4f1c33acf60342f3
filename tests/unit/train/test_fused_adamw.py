"""optim.fused=true builds torch's fused AdamW; the default leaves torch its own choice (as before)."""

from __future__ import annotations

import torch

from hpctrain.config.schema import OptimConfig
from hpctrain.train.optim import build_optimizer


def test_fused_adamw_is_torchs_fused_kernel_and_steps_like_the_default() -> None:
    torch.manual_seed(0)
    models = [torch.nn.Linear(8, 8) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    default = build_optimizer(models[0], OptimConfig())
    fused = build_optimizer(models[1], OptimConfig(fused=True))
    assert fused.defaults["fused"] is True and not default.defaults["fused"]
    x = torch.randn(4, 8)
    for model, optimizer in zip(models, (default, fused), strict=True):
        model(x).square().mean().backward()
        optimizer.step()
    for a, b in zip(models[0].parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
