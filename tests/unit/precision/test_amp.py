"""The regime in torch's terms (hpctrain.precision.amp): autocast only under ``autocast``, fp16 loss scaling
(sharded where ranks hold different gradients), FSDP's policy with float32 gradient reduction."""

from __future__ import annotations

import torch
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from hpctrain.precision.amp import DTYPES, autocast, autocast_dtype, fsdp_policy, grad_scaler

CPU = torch.device("cpu")


def test_autocast_only_in_the_autocast_regime() -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with autocast(CPU, "bf16", "autocast"):
        assert (a @ b).dtype == torch.bfloat16
    for precision, regime in (("fp32", "fp32"), ("bf16", "fsdp_mixed")):
        with autocast(CPU, precision, regime):
            assert (a @ b).dtype == torch.float32  # FSDP casts the parameters itself: no autocast
    assert (
        autocast_dtype("bf16", "autocast") is torch.bfloat16
        and autocast_dtype("fp16", "autocast") is torch.float16
    )
    assert autocast_dtype("bf16", "fsdp_mixed") is None and autocast_dtype("fp32", "fp32") is None


def test_fp16_scales_the_loss_sharded_where_gradients_are() -> None:
    assert not grad_scaler(CPU, "bf16", sharded_grads=False).is_enabled()
    assert not grad_scaler(CPU, "fp32", sharded_grads=True).is_enabled()
    plain = grad_scaler(CPU, "fp16", sharded_grads=False)
    assert plain.is_enabled() and not isinstance(plain, ShardedGradScaler)
    assert isinstance(grad_scaler(CPU, "fp16", sharded_grads=True), ShardedGradScaler)


def test_fsdp_policy_reduces_gradients_in_float32() -> None:
    assert fsdp_policy("fp32").param_dtype is None
    for precision in ("bf16", "fp16"):
        policy = fsdp_policy(precision)
        assert policy.param_dtype is DTYPES[precision] and policy.reduce_dtype is torch.float32
