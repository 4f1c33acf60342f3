"""FSDP2 (``fully_shard``): ZeRO-3 by default, ZeRO-2 without resharding after forward, optional offload.

Each block (:mod:`hpctrain.parallel.blocks`: the transformer layers) is its own FSDP unit, so only one
block's full parameters exist at a time (plus the next one's, prefetched); the root unit holds the rest,
such as the embeddings, final norm and head (Rajbhandari et al. 2020,
ZeRO; Zhao et al. 2023, PyTorch FSDP).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

from hpctrain.config.schema import ParallelConfig
from hpctrain.parallel.blocks import find_blocks
from hpctrain.precision.amp import fsdp_policy


def apply_fsdp(
    model: nn.Module,
    dp_mesh: DeviceMesh,
    parallel: ParallelConfig,
    precision: str,
    device: torch.device,
    experts: Sequence[nn.Module] = (),
    expert_mesh: DeviceMesh | None = None,
) -> None:
    """Shard ``model`` (or a pipeline stage) in place over ``dp_mesh`` (1-D: FSDP; 2-D: HSDP).

    Mixed precision is FSDP's own: parameters are all-gathered and used in bf16/fp16 while the sharded
    master copy, the optimizer and the gradient reduction stay fp32.

    ``experts`` (placed by expert parallelism, :mod:`hpctrain.parallel.moe`) are units of their own over
    ``expert_mesh`` (the ranks holding the same experts), or, without one, left to the ranks that hold them
    (not sharded, not reduced).
    """
    mixed = fsdp_policy(precision)  # hpctrain.precision: the fsdp_mixed regime
    # pin_memory needs an accelerator: on a CPU-only machine torch refuses to pin.
    offload = CPUOffloadPolicy(pin_memory=device.type == "cuda") if parallel.cpu_offload else OffloadPolicy()
    options = {
        "mesh": dp_mesh,
        "reshard_after_forward": parallel.reshard_after_forward,
        "mp_policy": mixed,
        "offload_policy": offload,
    }
    ignored: set[nn.Parameter] = set()
    for module in experts:
        if expert_mesh is not None:
            fully_shard(module, **{**options, "mesh": expert_mesh})
        else:
            ignored.update(module.parameters())
    for block in find_blocks(model, parallel.block_classes):
        fully_shard(block.module, **options, ignored_params=ignored or None)
    fully_shard(model, **options, ignored_params=ignored or None)
    # torch ≥ 2.13 warns whenever an FSDP unit returns a view, because an in-place op on it would drop the
    # unit's pre-backward hook. A model whose last layer is a Linear over (batch, tokens, features) always
    # returns one (the matmul's output reshaped), and avoiding it means copying the logits. hpctrain's losses
    # read the output out of place; only a user's loss that wrote into the logits would meet the case torch
    # warns of, and for every other run the line (once per rank per FSDP run) would be noise.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")
