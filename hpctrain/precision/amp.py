"""The regime of :mod:`hpctrain.precision` in torch's terms: the autocast context around a forward and
backward, the loss scaler, FSDP's mixed-precision policy, and the dtype the planner's measurement casts to."""

from __future__ import annotations

import contextlib

import torch
from torch.distributed.fsdp import MixedPrecisionPolicy

from hpctrain.precision import scales_loss

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast(device: torch.device, precision: str, regime: str) -> contextlib.AbstractContextManager[None]:
    """``torch.autocast`` in ``precision`` under the ``autocast`` regime; nothing otherwise (fp32, or FSDP
    casting the parameters itself)."""
    if regime != "autocast":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[precision])


def autocast_dtype(precision: str, regime: str) -> torch.dtype | None:
    """The dtype autocast computes in, None where there is no autocast."""
    return DTYPES[precision] if regime == "autocast" else None


def grad_scaler(device: torch.device, precision: str, sharded_grads: bool) -> torch.amp.GradScaler:
    """fp16 loss scaling (disabled otherwise). Where ranks hold different gradients (shards, stages), an
    overflow on one must skip the step on all: ShardedGradScaler all-reduces the inf check."""
    enabled = scales_loss(precision)
    if enabled and sharded_grads:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

        return ShardedGradScaler(device.type)
    return torch.amp.GradScaler(device.type, enabled=enabled)


def fsdp_policy(precision: str) -> MixedPrecisionPolicy:
    """FSDP's own mixed precision: parameters gathered and used in ``precision``; the reduction of gradients
    stays float32 (fp32 runs: no cast at all)."""
    param_dtype = None if precision == "fp32" else DTYPES[precision]
    return MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
