"""Tensor and sequence parallelism (DTensor): a model's ``TP_PLAN`` roles → torch ``ParallelStyle``s.

Megatron-LM (Shoeybi et al. 2019, §3): in each block the first projections split their output features
(column-wise: q, k, v, fc_in; each rank keeps n_heads / tp heads and hidden / tp MLP units) and the second
ones split their input features (row-wise: o, fc_out), so one all-reduce per sub-block sums the partial
outputs. Sequence parallelism (Korthikanti et al. 2022, §4.2) splits that all-reduce into a
reduce-scatter over the sequence and an all-gather before the next column-wise split; norms and dropout
in between then work on T / tp tokens per rank.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hpctrain.errors import ConfigError
from hpctrain.parallel.shared import tied_parameters

SEQUENCE = Shard(1)  # [batch, sequence, features]: the sequence dimension


def style_for(role: str, sequence_parallel: bool) -> ParallelStyle | None:
    """The style for one role of a model's plan; None where the role needs nothing (no sequence parallel).

    Roles: ``colwise`` / ``rowwise`` (the Megatron splits; row-wise outputs are reduce-scattered over the
    sequence under sequence parallelism), ``norm`` (runs on sequence shards), ``gather_sequence`` (a module
    that needs the whole sequence: all-gather its input), ``enter_sequence_shards`` (the residual stream
    starts here: keep this rank's tokens), ``vocab_embedding`` / ``vocab_head`` (the vocabulary split over
    the ranks: a masked lookup with an all-reduce; logits gathered for the loss).
    """
    stream = SEQUENCE if sequence_parallel else Replicate()
    if role == "colwise":
        return ColwiseParallel()
    if role == "rowwise":
        return RowwiseParallel(output_layouts=stream)
    if role == "vocab_embedding":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if role == "vocab_head":
        return ColwiseParallel(input_layouts=stream, output_layouts=Replicate())
    if not sequence_parallel:
        return None
    if role == "norm":
        return SequenceParallel(use_local_output=True)
    if role == "gather_sequence":
        return PrepareModuleInput(
            input_layouts=(SEQUENCE,), desired_input_layouts=(Replicate(),), use_local_output=True
        )
    if role == "enter_sequence_shards":
        return PrepareModuleOutput(
            output_layouts=(Replicate(),), desired_output_layouts=(SEQUENCE,), use_local_output=True
        )
    raise ValueError(f"unknown tensor-parallel role {role!r}")


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Parallelize ``model`` (or a pipeline stage of it) in place by its class's ``TP_PLAN``.

    Entries naming modules this stage does not have are skipped. Tied parameters (GPT's embedding and LM
    head) are tied again afterwards: each module's parameter is replaced by its own DTensor, so the tie would
    otherwise silently become two parameters.
    """
    declared = getattr(type(model), "TP_PLAN", None)
    if declared is None:  # the pre-submit check refuses this layout; a direct caller gets the same line
        raise ConfigError("parallel.tp", tp_mesh.size(), f"model {type(model).__name__} declares no TP_PLAN")
    plan: dict[str, ParallelStyle] = {}
    for pattern, role in declared.items():
        style = style_for(role, sequence_parallel)
        if style is not None and _has_module(model, pattern):
            plan[pattern] = style
    ties = tied_parameters(model)
    parallelize_module(model, tp_mesh, plan)
    for names in ties:
        first = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            other = model.get_parameter(name)
            if getattr(other, "placements", None) != getattr(first, "placements", None):
                raise ValueError(f"tied parameters {names[0]} and {name} are split differently by the plan")
            setattr(model.get_submodule(owner), attr, first)


def _has_module(model: nn.Module, pattern: str) -> bool:
    """Whether ``pattern`` (dotted, ``*`` matching one level) names a module that exists (is not None)."""
    modules = [model]
    for atom in pattern.split("."):
        modules = [
            child
            for module in modules
            for name, child in module.named_children()
            if child is not None and (atom == "*" or atom == name)
        ]
    return bool(modules)
