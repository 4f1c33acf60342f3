"""Tensor and sequence parallelism (DTensor): a model's tensor-parallel plan → torch ``ParallelStyle``s.

Megatron-LM (Shoeybi et al. 2019, §3): in each block the first projections split their output features
(column-wise: q, k, v, fc_in; each rank keeps n_heads / tp heads and hidden / tp MLP units) and the second
ones split their input features (row-wise: o, fc_out), so one all-reduce per sub-block sums the partial
outputs. Sequence parallelism (Korthikanti et al. 2022, §4.2) splits that all-reduce into a
reduce-scatter over the sequence and an all-gather before the next column-wise split; norms and dropout
in between then work on T / tp tokens per rank.

A plan maps module-name patterns (``*`` matches one level) to roles (:data:`hpctrain.config.schema.TP_ROLES`).
It comes from ``parallel.tp_plan``, else the model class's ``TP_PLAN``, else a transformers model's own
plan (``base_model_tp_plan`` under the base model's prefix, plus its head's), its role names translated.

Any sequence length: the residual stream is padded to a multiple of tp before it is split over the ranks,
and every module that needs the whole sequence gathers it and drops the padding first, so attention and the
loss never see a padded position and results match one process. The padded rows only flow through
per-token work (norms, residual adds, the MLP's row-wise output) and never reach the loss, so their
gradients are zero.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import (
    DTensor,
    Placement,
    Replicate,
    Shard,
    distribute_module,
    distribute_tensor,
)
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    ParallelStyle,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

from hpctrain import torchapi
from hpctrain.config.schema import TP_ROLES
from hpctrain.errors import ConfigError
from hpctrain.models.adapters import is_transposed_linear
from hpctrain.parallel.shared import tied_parameters

log = logging.getLogger(__name__)
SEQUENCE = Shard(1)  # [batch, sequence, features]: the sequence dimension
# transformers' role names (``base_model_tp_plan`` / ``_tp_plan``) for the roles hpctrain implements.
HF_ROLES = {
    "colwise": "colwise",
    "rowwise": "rowwise",
    "colwise_gather_output": "vocab_head",
    "embedding_rowwise": "vocab_embedding",
    "sequence_parallel": "norm",
    "replicated_with_grad_allreduce": "replicated",
}
SEQUENCE_ROLES = ("enter_sequence_shards",)  # a plan without one keeps the stream replicated


def tp_plan_of(
    model: nn.Module, configured: dict[str, str] | None = None
) -> tuple[dict[str, str], str] | None:
    """(plan, where it came from) for ``model``, or None when nothing declares one."""
    if configured:
        return dict(configured), "parallel.tp_plan"
    declared = getattr(type(model), "TP_PLAN", None)
    if declared:
        return dict(declared), f"{type(model).__name__}.TP_PLAN"
    hf = getattr(model, "_tp_plan", None)  # transformers: the whole model's, prefixes applied
    if hf:
        unknown = sorted({role for role in hf.values() if role not in HF_ROLES})
        if unknown:
            raise ConfigError(
                "parallel.tp",
                "transformers plan",
                f"{type(model).__name__}'s base_model_tp_plan uses roles hpctrain does not implement: "
                + ", ".join(unknown),
                valid="set parallel.tp_plan with roles " + ", ".join(TP_ROLES),
            )
        return {k: HF_ROLES[v] for k, v in hf.items()}, f"{type(model).__name__}'s base_model_tp_plan"
    return None


def require_tp_plan(model: nn.Module, configured: dict[str, str] | None, tp: int) -> dict[str, str]:
    """The plan of ``model``, every pattern naming a module of it; else one line saying what to declare."""
    found = tp_plan_of(model, configured)
    if found is None:
        raise ConfigError(
            "parallel.tp",
            tp,
            f"model {type(model).__name__} has no tensor-parallel plan: set parallel.tp_plan "
            "(module-name pattern → role, e.g. {'layers.*.attn.q': colwise, 'layers.*.attn.o': rowwise}) "
            "or declare a TP_PLAN class attribute",
            valid="roles " + ", ".join(TP_ROLES),
        )
    plan, source = found
    check_plan(model, plan, source, TP_ROLES, "not a tensor-parallel role")
    return plan


class SequenceShards:
    """The residual stream of one model (or pipeline stage) split over the tp ranks along the sequence.

    ``scatter`` pads a replicated ``[B, T, ...]`` to a multiple of tp and keeps this rank's share, noting T;
    ``gather`` all-gathers the shares and drops the padding; ``pad`` pads a row-wise layer's input so its
    reduce-scatter splits evenly. The collectives are DTensor redistributions, so autograd runs their
    duals in the backward (all-gather ↔ split, reduce-scatter ↔ all-gather).
    """

    def __init__(self, mesh: DeviceMesh) -> None:
        self.mesh = mesh
        self.size = mesh.size()
        self.length: int | None = None

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        extra = -x.shape[1] % self.size
        if not extra:
            return x
        # F.pad counts pairs from the last dimension backwards: leave every dimension after 1 alone.
        return F.pad(x, (0, 0) * (x.dim() - 2) + (0, extra))

    def scatter(self, x: torch.Tensor) -> torch.Tensor:
        self.length = x.shape[1]
        whole = DTensor.from_local(self.pad(x), self.mesh, [Replicate()], run_check=False)
        return whole.redistribute(self.mesh, [SEQUENCE]).to_local()

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        shares = DTensor.from_local(x, self.mesh, [SEQUENCE], run_check=False)
        whole = shares.redistribute(self.mesh, [Replicate()]).to_local()
        assert self.length is not None, "the sequence was gathered before it was split"
        # contiguous: a pipeline stage's output is sent, and its receiver's buffer is made like it
        return whole[:, : self.length].contiguous() if whole.shape[1] != self.length else whole


class _Colwise(ColwiseParallel):
    """torch's column-wise split, which also splits transformers' ``Conv1D`` (GPT-2's projections: weight
    [in, out], so its output features are dimension 1; torch's styles take nn.Linear and nn.Embedding)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not is_transposed_linear(module):
            return super()._apply(module, device_mesh)
        return distribute_module(
            module,
            device_mesh,
            _split({"weight": Shard(1), "bias": Shard(0)}),
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


class _Rowwise(RowwiseParallel):
    """torch's row-wise split, which also splits transformers' ``Conv1D`` (its input features: dimension 0
    of its [in, out] weight; the bias whole, added once to the reduced sum)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not is_transposed_linear(module):
            return super()._apply(module, device_mesh)
        self.desired_input_layouts: tuple[Placement, ...] = (Shard(-1),)
        return distribute_module(
            module,
            device_mesh,
            _split({"weight": Shard(0), "bias": Replicate()}),
            partial(self._prepare_input_fn, self.input_layouts, self.desired_input_layouts),
            partial(self._prepare_output_fn, self.output_layouts, self.use_local_output),
        )


def _split(placements: dict[str, Placement]) -> Any:
    """A ``distribute_module`` partition function placing a module's own parameters by name."""

    def partition(_name: str, module: nn.Module, mesh: DeviceMesh) -> None:
        for name, param in list(module.named_parameters(recurse=False)):
            whole = distribute_tensor(param, mesh, [placements[name]])
            module.register_parameter(name, nn.Parameter(whole, requires_grad=param.requires_grad))

    return partition


def style_for(role: str, sequence_parallel: bool) -> ParallelStyle | None:
    """The torch style for one role; None where the role needs none (hooks do the sequence work).

    Roles: ``colwise`` / ``rowwise`` (the Megatron splits; row-wise outputs are reduce-scattered over the
    sequence under sequence parallelism), ``norm`` (runs on sequence shards), ``gather_sequence`` (a module
    that needs the whole sequence), ``enter_sequence_shards`` (the residual stream starts at this module's
    output), ``vocab_embedding`` / ``vocab_head`` (the vocabulary split over the ranks: a masked lookup with
    an all-reduce; logits gathered for the loss), ``replicated`` (nothing split), ``whole_sequence`` (a
    module with replicated weights that runs on the whole sequence and returns it: its input gathered, its
    output split again; the backward of the split gathers its gradient, so every rank computes the same
    weight gradients, as under no tensor parallelism: a mixture of experts).
    """
    stream = SEQUENCE if sequence_parallel else Replicate()
    if role == "colwise":
        return _Colwise()
    if role == "rowwise":
        return _Rowwise(output_layouts=stream)
    if role == "vocab_embedding":
        return RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if role == "vocab_head":  # under sequence parallelism a hook has gathered the sequence already
        return ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
    if role == "norm" and sequence_parallel:
        return SequenceParallel(use_local_output=True)
    if role in ("norm", "gather_sequence", "whole_sequence", "enter_sequence_shards", "replicated"):
        return None
    raise ValueError(f"unknown tensor-parallel role {role!r}")


def apply_tp(
    model: nn.Module,
    tp_mesh: DeviceMesh,
    sequence_parallel: bool,
    plan: dict[str, str] | None = None,
    first_stage: bool = True,
    last_stage: bool = True,
) -> None:
    """Parallelize ``model`` (or a pipeline stage of it) in place by ``plan`` (default: its own).

    Entries naming modules this stage does not have are skipped. Under sequence parallelism a pipeline
    stage other than the first takes the whole sequence and splits it, and one other than the last
    gathers it again, so stages exchange unpadded activations of a known length. Tied parameters (GPT's
    embedding and LM head) are tied again afterwards: each module's parameter is replaced by its own
    DTensor, so the tie would otherwise silently become two parameters.
    """
    if plan is None:
        plan = require_tp_plan(model, None, tp_mesh.size())
    if sequence_parallel and not any(role in SEQUENCE_ROLES for role in plan.values()):
        log.info("the tensor-parallel plan marks no sequence entry: the residual stream stays replicated")
        sequence_parallel = False
    styles: dict[str, ParallelStyle] = {}
    for pattern, role in plan.items():
        style = style_for(role, sequence_parallel)
        if style is not None and pattern_modules(model, pattern):
            styles[pattern] = style
    ties = tied_parameters(model)
    # LoRA's adapters (hpctrain.models.adapters) are children of the Linear they adapt: the styles would
    # split them as the Linear's own weight. They are set aside, and split to match it afterwards.
    adapters = _detach_adapters(model)
    # A style replaces each parameter it splits or replicates by a new one, trainable (SequenceParallel's
    # norms): what was frozen (LoRA's base) stays frozen.
    frozen = {name for name, param in model.named_parameters() if not param.requires_grad}
    parallelize_module(model, tp_mesh, styles)
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    _attach_adapters(adapters, _roles(model, plan), tp_mesh)
    if sequence_parallel:
        _hook_sequence(model, plan, SequenceShards(tp_mesh), first_stage, last_stage)
    for names in ties:
        first = model.get_parameter(names[0])
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            other = model.get_parameter(name)
            if getattr(other, "placements", None) != getattr(first, "placements", None):
                raise ValueError(f"tied parameters {names[0]} and {name} are split differently by the plan")
            setattr(model.get_submodule(owner), attr, first)


def _detach_adapters(model: nn.Module) -> list[tuple[nn.Module, nn.Module, nn.Module]]:
    found = []
    for module in list(model.modules()):
        children = torchapi.own_children(module)
        a, b = children.get("lora_A"), children.get("lora_B")
        if a is not None and b is not None:
            del children["lora_A"], children["lora_B"]
            found.append((module, a, b))
    return found


def _roles(model: nn.Module, plan: dict[str, str]) -> dict[int, str]:
    return {id(m): role for pattern, role in plan.items() for m in pattern_modules(model, pattern)}


def _attach_adapters(
    adapters: list[tuple[nn.Module, nn.Module, nn.Module]], roles: dict[int, str], mesh: DeviceMesh
) -> None:
    """Each adapter back on its Linear, split as the Linear is: under a column-wise split ``A`` whole and
    ``B``'s output rows split (the update ``B A x`` comes out split as the Linear's output); under a
    row-wise split ``A``'s input columns split and ``B`` whole (``B A x`` is a partial sum, reduced with
    the Linear's). The adapter's forward hook then computes on DTensors as the Linear does."""
    placements = {"colwise": ([Replicate()], [Shard(0)]), "rowwise": ([Shard(1)], [Replicate()])}
    for module, a, b in adapters:
        role = roles.get(id(module), "replicated")
        if role not in (*placements, "replicated"):
            raise ConfigError(
                "model.lora.targets",
                role,
                "LoRA adapts Linear layers split column- or row-wise, or not",
                valid="colwise, rowwise or replicated modules of the tensor-parallel plan",
            )
        if role in placements:
            for adapter, place in zip((a, b), placements[role], strict=True):
                weight = adapter.weight
                adapter.weight = nn.Parameter(
                    distribute_tensor(weight.data, mesh, place), requires_grad=weight.requires_grad
                )
        module.lora_A, module.lora_B = a, b


def _hook_sequence(
    model: nn.Module, plan: dict[str, str], shards: SequenceShards, first_stage: bool, last_stage: bool
) -> None:
    """Where the stream is split, gathered and padded, as forward hooks (prepended: they run before the
    styles' own input handling)."""

    def scatter_output(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
        return shards.scatter(output)

    def gather_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (shards.gather(args[0]), *args[1:])

    def pad_input(_module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        return (shards.pad(args[0]), *args[1:])

    for pattern, role in plan.items():
        for module in pattern_modules(model, pattern):
            if role == "enter_sequence_shards":
                module.register_forward_hook(scatter_output)
            elif role == "whole_sequence":  # replicated: the whole sequence in, this rank's shard out
                module.register_forward_pre_hook(gather_input, prepend=True)
                module.register_forward_hook(scatter_output)
            elif role in ("gather_sequence", "vocab_head"):
                module.register_forward_pre_hook(gather_input, prepend=True)
            elif role == "rowwise":
                module.register_forward_pre_hook(pad_input, prepend=True)
    if not first_stage:
        model.register_forward_pre_hook(lambda _m, args: (shards.scatter(args[0]), *args[1:]), prepend=True)
    if not last_stage:
        model.register_forward_hook(lambda _m, _args, output: shards.gather(output))


def check_plan(
    model: nn.Module, plan: Mapping[str, str], source: str, roles: Sequence[str], not_a_role: str
) -> None:
    """Every entry of a module plan (TP_PLAN, CONTEXT_PLAN, MOE_PLAN; ``source`` names where it came from) a
    role of ``roles`` whose pattern names a module of ``model``; else one line naming the entry."""
    for pattern, role in plan.items():
        if role not in roles:
            raise ConfigError(f"{source}[{pattern}]", role, not_a_role, valid=", ".join(roles))
        if not pattern_modules(model, pattern):
            raise ConfigError(
                f"{source}[{pattern}]", role, f"the pattern names no module of {type(model).__name__}"
            )


def pattern_modules(model: nn.Module, pattern: str) -> list[nn.Module]:
    """The modules ``pattern`` (dotted, ``*`` matching one level) names that exist (are not None)."""
    modules = [model]
    for atom in pattern.split("."):
        modules = [
            child
            for module in modules
            for name, child in module.named_children()
            if child is not None and (atom == "*" or atom == name)
        ]
    return modules
