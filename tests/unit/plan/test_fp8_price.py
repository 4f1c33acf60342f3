"""The planner prices fp8: the float8 layers' FLOPs at the profile's float8 peak, the rest at its bf16 peak;
memory as bf16's (the master weights, gradients and optimizer stay float32; activations are bf16)."""

from __future__ import annotations

import pytest

from hpctrain.config.compose import compose, to_typed
from hpctrain.plan.estimate import estimate
from hpctrain.plan.text import time_table


def _plan(*overrides: str):  # type: ignore[no-untyped-def]
    cfg = to_typed(compose(["cluster=h100x64", "model=gpt2_350m", *overrides]))
    return cfg, estimate(cfg)


def test_fp8_prices_the_converted_layers_at_the_float8_peak() -> None:
    _, bf16 = _plan("trainer.precision=bf16")
    cfg, fp8 = _plan("trainer.precision=fp8")
    assert bf16.time is not None and fp8.time is not None
    # gpt2_350m: only each block's fc_in (4096 × 1024) gains; 6 FLOPs per weight per token of 24 of them.
    # 6N + 12·L·H·Q·T; N: 24 blocks of 12,596,224, the final norm, the LM head (1024 × 50304).
    flops_per_token = 6 * (24 * 12_596_224 + 2 * 1024 + 1024 * 50304) + 12 * 24 * 1024 * 1024
    share = 6 * 24 * 4096 * 1024 / flops_per_token
    assert fp8.time.float8_share == pytest.approx(share)
    ratio = (1 - share) + share * 989e12 / 1979e12
    assert fp8.time.compute_s / bf16.time.compute_s == pytest.approx(ratio)
    assert fp8.time.mfu > bf16.time.mfu  # MFU stays against the dense bf16 peak
    assert fp8.largest.total == bf16.largest.total
    assert any("% of the FLOPs in float8 at 1979 TFLOP/s peak" in line for line in time_table(cfg, fp8))


def test_without_a_float8_peak_fp8_is_priced_as_bf16() -> None:
    _, bf16 = _plan("trainer.precision=bf16")
    _, fp8 = _plan("trainer.precision=fp8", "cluster.peak_fp8_flops=null")
    assert fp8.time is not None and bf16.time is not None
    assert fp8.time.float8_share == 0.0 and fp8.time.compute_s == bf16.time.compute_s
