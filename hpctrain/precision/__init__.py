"""Precision has one home: which numbers a run computes in, decided once from ``trainer.precision`` and the
layout, read alike by the trainer, the planner and the footprint measurement. Torch-free (the planner runs
on login nodes); :mod:`hpctrain.precision.amp` turns the decision into torch's autocast, loss scaler and
FSDP mixed-precision policy.

A run trains in one of three regimes:

- ``fp32``: everything in float32;
- ``autocast``: float32 master weights, optimizer and gradients; matmuls (and what autocast lists) in
  bf16/fp16 under ``torch.autocast`` (Micikevicius et al. 2018, "Mixed Precision Training");
- ``fsdp_mixed``: where FSDP shards the parameters, its mixed-precision policy all-gathers them in bf16/fp16
  and the whole forward/backward runs in that dtype, while the sharded master copy, the optimizer and the
  gradient reduction stay float32 (torch's FSDP2 ``MixedPrecisionPolicy``); no autocast around the model.

fp16 also scales the loss (a ``GradScaler``; sharded where ranks hold different gradients), bf16 does not.
"""

from __future__ import annotations

PRECISIONS = ("fp32", "bf16", "fp16")
REGIMES = ("fp32", "autocast", "fsdp_mixed")


def regime(precision: str, sharded: bool) -> str:
    """The regime of a run in ``precision`` whose parameters FSDP shards (``sharded``) or not."""
    if precision == "fp32":
        return "fp32"
    return "fsdp_mixed" if sharded else "autocast"


def regimes_of(precision: str, can_shard: bool) -> list[str]:
    """Every regime a run in ``precision`` may train in under some layout: the planner proposes layouts that
    shard only where there is more than one rank (``can_shard``)."""
    if precision == "fp32":
        return ["fp32"]
    return ["autocast", "fsdp_mixed"] if can_shard else ["autocast"]


def scales_loss(precision: str) -> bool:
    """fp16's narrow exponent range needs loss scaling; bf16 has float32's range and does not."""
    return precision == "fp16"
