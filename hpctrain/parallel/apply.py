"""The parallelize step: wrap a plain ``nn.Module`` according to ``parallel.name``.

Strategies are applied in a fixed order by small ``apply_*`` functions (torchtitan style); today: none, ddp.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config.schema import ParallelConfig


def parallelize(model: nn.Module, parallel: ParallelConfig, device: torch.device) -> nn.Module:
    model = model.to(device)
    if parallel.name == "ddp":
        return apply_ddp(model, parallel, device)
    if parallel.name == "none":
        return model
    raise ValueError(f"unknown parallel strategy {parallel.name!r}")


def apply_ddp(model: nn.Module, parallel: ParallelConfig, device: torch.device) -> nn.Module:
    return DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        bucket_cap_mb=parallel.bucket_cap_mb,
        gradient_as_bucket_view=parallel.gradient_as_bucket_view,
        static_graph=parallel.static_graph,
    )


def unwrap(model: nn.Module) -> nn.Module:
    """The plain model under any wrapper (for FLOP counts and the like)."""
    return model.module if isinstance(model, DistributedDataParallel) else model
