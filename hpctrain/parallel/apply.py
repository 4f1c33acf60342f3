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


def prime_ddp_buckets(model: nn.Module, sample: torch.Tensor) -> None:
    """Let DDP settle its gradient buckets before the first real step, so that a resumed run is exact.

    DDP reduces its first iteration's gradients in buckets laid out in parameter order, then rebuilds them
    in the order gradients became ready. With more than two ranks, gloo's and NCCL's ring all-reduce sum each
    element in an order that depends on its place in the bucket; so the first step after a resume (a fresh
    DDP, initial layout) would round differently from the same step of an uninterrupted run (rebuilt layout).
    One throwaway forward/backward of a zero loss — weights, gradients and RNG streams left as they were —
    gives every run the rebuilt layout from its first real step on.
    """
    if not isinstance(model, DistributedDataParallel):
        return
    devices = [sample.device] if sample.device.type == "cuda" else []
    was_training = model.training
    with torch.random.fork_rng(devices=devices):
        model.eval()
        (model(sample).float().sum() * 0.0).backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
