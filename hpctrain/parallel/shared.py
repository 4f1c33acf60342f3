"""Weights shared by several pipeline stages: Megatron-LM's embedding group, found generically.

A model may register one parameter under several names, as GPT-2 does when its LM head reuses the token
embedding matrix. A pipeline split puts those names on different stages (the embedding on the first, the
head on the last), each stage holding its own copy. Megatron-LM keeps such copies one weight (Narayanan et
al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", the embedding
group): both copies start equal (the same initialisation), and every step, after backward and before
clipping and the optimizer, their gradients are summed over the ranks that hold them at the same data- and
tensor-parallel coordinates. With equal gradients and equal optimizer updates the copies stay equal.

Nothing here knows a model: the ties are the names under which the whole model registers one parameter
(:func:`tied_parameters`), and which stage keeps which name follows from the split
(:func:`hpctrain.parallel.pipeline.dropped_modules`). The copy on the first stage that holds one is the
weight; the others are counted once by the gradient norm and saved once, under the whole model's first name
for it (its ``named_parameters()`` name), so checkpoints move between pipeline layouts and none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor


def tied_parameters(model: nn.Module) -> list[list[str]]:
    """Groups of names under which one parameter is registered more than once (in registration order: the
    first is the name ``named_parameters()`` and checkpoints use)."""
    names_of: dict[int, list[str]] = {}
    for module_name, module in model.named_modules():
        for attr, param in module.named_parameters(recurse=False):
            names_of.setdefault(id(param), []).append(f"{module_name}.{attr}" if module_name else attr)
    return [names for names in names_of.values() if len(names) > 1]


def kept(name: str, dropped: Iterable[str]) -> bool:
    """Whether a stage that dropped the modules ``dropped`` (dotted paths) still has parameter ``name``."""
    return not any(name == path or name.startswith(path + ".") for path in dropped)


@dataclass(frozen=True)
class Tie:
    """One parameter of the whole model, registered under ``names`` (the saved name first), and the name
    each stage holds it under (``holders``: stage → name; a stage that keeps several of the names holds one
    parameter, tied within the stage)."""

    names: tuple[str, ...]
    holders: dict[int, str]

    @property
    def weight_stage(self) -> int:
        """The stage whose copy is the weight: counted by the gradient norm."""
        return min(self.holders)


def stage_ties(ties: list[list[str]], dropped_by_stage: list[list[str]]) -> list[Tie]:
    """The ties whose names land on more than one stage (``dropped_by_stage[s]``: what stage s drops)."""
    out = []
    for names in ties:
        holders = {}
        for stage, dropped in enumerate(dropped_by_stage):
            held = [name for name in names if kept(name, dropped)]
            if held:
                holders[stage] = held[0]
        if len(holders) > 1:
            out.append(Tie(tuple(names), holders))
    return out


def saved_names(ties: list[list[str]], stage_ties_: list[Tie], stages: Iterable[int]) -> dict[str, str]:
    """{name on this rank: the name it is saved under} for every name of a tied parameter that is not its
    saved name: within a model (the second name of a tie), and across stages (a later stage's copy)."""
    aliases = {name: names[0] for names in ties for name in names[1:]}
    for tie in stage_ties_:
        for stage in stages:
            if stage in tie.holders:
                aliases.setdefault(tie.holders[stage], tie.names[0])
    aliases = {name: saved for name, saved in aliases.items() if name != saved}
    return aliases


@dataclass
class SharedWeight:
    """This rank's copies of one weight that several stages hold, and the group that sums their gradients."""

    name: str  # the saved name
    copies: list[nn.Parameter]  # this rank's (one per stage it runs that holds the weight)
    group: dist.ProcessGroup | None  # the embedding group; None when every copy is on this rank
    uncounted: list[nn.Parameter]  # the copies the gradient norm leaves out (the weight is counted once)

    @torch.no_grad()
    def reduce_grads(self) -> None:
        """Give every copy the sum of all copies' gradients, here and on the other ranks of the group."""
        grads = [_in_param_layout(p) for p in self.copies]
        total = _local(grads[0])
        for grad in grads[1:]:  # two stages on one rank (the V schedule): one parameter, summed here
            total.add_(_local(grad))
        if self.group is not None:
            # Both stages split the weight alike (FSDP's dp shards, TP's vocabulary rows of the same
            # [V, d] tensor), so the local pieces line up element by element.
            dist.all_reduce(total, group=self.group)
        for grad in grads[1:]:
            _local(grad).copy_(total)


def _in_param_layout(param: nn.Parameter) -> torch.Tensor:
    """``param``'s gradient laid out like the parameter (a zero one if it got none).

    Under tensor parallelism without FSDP the vocabulary-split embedding's gradient can come back
    replicated or pending a reduction while the head's is split by rows: bring both to the parameter's
    placements, so that the copies' local pieces correspond."""
    grad = param.grad
    if grad is None:
        grad = param.grad = torch.zeros_like(param)
    if isinstance(grad, DTensor) and isinstance(param, DTensor) and grad.placements != param.placements:
        grad = param.grad = grad.redistribute(param.device_mesh, param.placements)
    return grad


def _local(grad: torch.Tensor) -> torch.Tensor:
    return grad.to_local() if isinstance(grad, DTensor) else grad


def shared_weights(
    stage_ties_: list[Tie],
    parts: dict[int, nn.Module],
    owners: list[int],
    mesh: DeviceMesh,
) -> list[SharedWeight]:
    """This rank's :class:`SharedWeight` for each tie across stages. Collective over every rank (the
    embedding groups are made on all of them, in the same order), whether or not it holds a copy."""
    out = []
    groups: dict[tuple[int, ...], dist.ProcessGroup | None] = {}
    for tie in stage_ties_:
        ranks = tuple(sorted({owners[stage] for stage in tie.holders}))
        if ranks not in groups:
            groups[ranks] = embedding_group(mesh, ranks)
        mine = [stage for stage in tie.holders if stage in parts]
        if not mine:
            continue
        copies = [parts[stage].get_parameter(tie.holders[stage]) for stage in mine]
        uncounted = [p for stage, p in zip(mine, copies, strict=True) if stage != tie.weight_stage]
        group = groups[ranks] if len(ranks) > 1 else None
        out.append(SharedWeight(tie.names[0], copies, group, uncounted))
    return out


def embedding_group(mesh: DeviceMesh, pp_ranks: tuple[int, ...]) -> dist.ProcessGroup | None:
    """The group of ranks at pipeline ranks ``pp_ranks`` and this rank's other coordinates (data and tensor
    parallel): the whole pipeline group when those are all its ranks, else one new group per coordinate
    (made by every rank, as ``new_group`` requires); None when there is only one such rank."""
    if len(pp_ranks) < 2:
        return None
    names = mesh.mesh_dim_names
    assert names is not None and "pp" in names
    pp = mesh.size(names.index("pp"))
    if len(pp_ranks) == pp:
        return mesh.get_group("pp")
    grid = mesh.mesh.movedim(names.index("pp"), -1).reshape(-1, pp).tolist()
    me = dist.get_rank()
    mine = None
    for row in grid:
        ranks = [row[r] for r in pp_ranks]
        group = dist.new_group(ranks)
        if me in ranks:
            mine = group
    return mine
