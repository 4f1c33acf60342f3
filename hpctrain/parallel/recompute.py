"""Activation checkpointing (recompute in backward what is not kept), applied per block.

``full`` keeps only each block's input and recomputes the block in backward (Chen et al. 2016):
activation memory per block drops to one [B, T, d] tensor for one extra forward. ``selective`` keeps the
outputs of the matmuls and attention, the expensive ops, and recomputes the cheap, memory-hungry rest
(norms, GELU, dropout, residual adds) — Korthikanti et al. 2022, "Reducing Activation Recomputation".
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from hpctrain import torchapi
from hpctrain.parallel.blocks import find_blocks, replace_block


def _ops_to_save() -> set[object]:
    aten = torch.ops.aten
    ops = {aten.mm.default, aten.addmm.default, aten.bmm.default}
    ops |= torchapi.attention_ops()  # the fused attention kernels (those this torch has)
    # A tensor-parallel block's reduce-scatter: recomputing it would repeat the communication.
    ops.add(torchapi.reduce_scatter_op())
    return ops


def _selective_policy(ops: set[object], ctx: object, op: object, *args: object, **kwargs: object) -> object:
    return CheckpointPolicy.MUST_SAVE if op in ops else CheckpointPolicy.PREFER_RECOMPUTE


def apply_activation_checkpointing(model: nn.Module, mode: str, block_classes: Sequence[str] = ()) -> None:
    """Wrap every block of ``model`` in place (parameter names are unchanged for checkpoints: torch's
    state-dict API drops the wrapper's prefix)."""
    if mode == "none":
        return
    options: dict[str, object] = {"preserve_rng_state": True}
    if mode == "selective":
        policy = functools.partial(_selective_policy, _ops_to_save())
        options["context_fn"] = functools.partial(create_selective_checkpoint_contexts, policy)
    elif mode != "full":
        raise ValueError(f"unknown activation checkpointing mode {mode!r}")
    for block in find_blocks(model, block_classes):
        replace_block(block, torchapi.checkpoint_wrapper(block.module, **options))
