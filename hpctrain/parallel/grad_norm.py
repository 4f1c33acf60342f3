"""The global gradient norm over every mesh dimension, and clipping by it.

Each gradient's sum of squares is summed over the ranks that hold different pieces of it: the mesh
dimensions its DTensor is sharded on (FSDP's dp_shard, TP's column/row splits), then over the pipeline
stages, which hold different parameters. Replicated pieces (DDP, HSDP's replicas, TP's replicated norms) are
counted once. One all-reduce per (mesh, sharded dimensions) group and one over the pipeline, not one per
parameter. A weight that two stages each hold a copy of (a tied embedding and LM head: Megatron's embedding
group, hpctrain.parallel.shared) would be counted twice by the sum over the pipeline: the copies other than
the first stage's are left out of the norm (``uncounted``), and clipped like the rest.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate

from hpctrain import torchapi

# torch.nn.utils.clip_grad_norm_'s epsilon: the coefficient is max_norm / (norm + 1e-6), capped at 1.
EPS = 1e-6


@torch.no_grad()
def global_grad_norm(
    parameters: list[torch.nn.Parameter],
    pp_group: dist.ProcessGroup | None,
    uncounted: Collection[torch.nn.Parameter] = (),
) -> torch.Tensor:
    groups: dict[tuple[DeviceMesh | None, tuple[int, ...]], list[torch.Tensor]] = defaultdict(list)
    skip = {id(p) for p in uncounted}
    for param in parameters:
        grad = param.grad
        if grad is None or id(param) in skip:
            continue
        if isinstance(grad, DTensor):
            if any(p.is_partial() for p in grad.placements):
                raise RuntimeError(
                    f"gradient pending a reduction {grad.placements}: reduce_partial_grads first"
                )
            # Every dimension that is not replicated splits the tensor: Shard, and FSDP-over-TP's
            # _StridedShard, which is not a Shard subclass in torch 2.13.
            sharded = tuple(i for i, p in enumerate(grad.placements) if not p.is_replicate())
            groups[(grad.device_mesh, sharded)].append(grad.to_local())
        else:
            groups[(None, ())].append(grad)
    device = parameters[0].device if parameters else torch.device("cpu")
    total = torch.zeros((), dtype=torch.float32, device=_local_device(device))
    for (mesh, sharded), grads in groups.items():
        squares = torch.stack([g.detach().float().pow(2).sum() for g in grads]).sum()
        for dim in sharded:
            assert mesh is not None
            dist.all_reduce(squares, group=mesh.get_group(dim))
        total += squares
    if pp_group is not None:
        dist.all_reduce(total, group=pp_group)
    return total.sqrt()


@torch.no_grad()
def reduce_partial_grads(parameters: list[torch.nn.Parameter]) -> None:
    """Finish the reduction of gradients DTensor left pending (``Partial``: each tensor-parallel rank holds
    a summand), e.g. of a sequence-parallel norm's replicated weight, whose tokens are spread over the
    ranks. Done once here rather than implicitly inside every optimizer op that touches them."""
    for param in parameters:
        grad = param.grad
        if isinstance(grad, DTensor) and any(p.is_partial() for p in grad.placements):
            placements = [Replicate() if p.is_partial() else p for p in grad.placements]
            param.grad = grad.redistribute(grad.device_mesh, placements)


@torch.no_grad()
def clip_grad_norm_(
    parameters: list[torch.nn.Parameter],
    max_norm: float,
    pp_group: dist.ProcessGroup | None,
    uncounted: Collection[torch.nn.Parameter] = (),
) -> torch.Tensor:
    """Scale all gradients so that their global norm is at most ``max_norm`` (0: only measure it).
    Returns the norm before clipping. ``uncounted``: copies of a weight counted elsewhere (still clipped)."""
    reduce_partial_grads(parameters)
    norm = global_grad_norm(parameters, pp_group, uncounted)
    if max_norm > 0:
        coefficient = torch.clamp(max_norm / (norm + EPS), max=1.0)
        local = [_local(p.grad) for p in parameters if p.grad is not None]
        if local:
            torchapi.foreach_mul_(local, coefficient.to(local[0].device))
    return norm


def _local(grad: torch.Tensor) -> torch.Tensor:
    return grad.to_local() if isinstance(grad, DTensor) else grad


def _local_device(device: torch.device) -> torch.device:
    return torch.device("cpu") if device.type == "meta" else device
