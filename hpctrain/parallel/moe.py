"""Expert parallelism and a mixture of experts' bookkeeping across ranks, applied from outside the model.

**Which modules are experts.** A model declares them as it declares a tensor-parallel plan: its class's
``MOE_PLAN`` maps module-name patterns to the role ``experts``; without one, the experts of every
:class:`hpctrain.models.moe.MoE` layer. An experts module holds grouped weights (every parameter has the
experts as dimension 0) and its forward takes ``(rows, counts)``: the routed token rows sorted by expert and
the rows per expert (:class:`hpctrain.models.moe.GroupedExperts` is one).

**Expert parallelism** (``parallel.ep``; GShard, Lepikhin et al. 2021; DeepSpeed-MoE, Rajbhandari et al.
2022): the ep ranks train different samples and each holds E/ep of the experts (the parameters become
DTensors ``Shard(0)`` over the ep mesh, so a checkpoint holds every expert under its whole name and
reshards between ep degrees). Around the experts module's forward, hooks send every row to the rank holding
its expert and the results back: ``all_to_all_single`` of the row counts, then of the rows (the autograd
all-to-all of ``torch.distributed._functional_collectives``, so the backward runs the reverse exchange), on
gloo as on NCCL. The forward sees its local experts' weights and rows; the model's code is unchanged.

**Gradients.** An expert's gradient sums the contributions of every ep rank's tokens, while a dense weight's
is averaged over the ranks that saw other tokens (FSDP over ``Degrees.fsdp``: dp_shard × ep × cp). The
experts are sharded by FSDP over the ranks holding the same experts (``Degrees.expert_fsdp``: dp_shard ×
cp, with HSDP's replicas), which averages over those; the ep ranks' share of the average is taken in the
backward itself: the gradient reaching the experts' output is divided by ep and the one leaving their input
multiplied back (:class:`GradScale`; exact for the powers of two ep usually is), so the weights' gradients
are the mean over every rank's tokens and the tokens' own are unchanged. FSDP's ``set_gradient_divide_factor``
would do the first half, but runs as ``PREMUL_SUM``, which gloo lacks. Every weight's gradient is then
that of one process over the whole batch.

**The router's counts and statistics.** Each :class:`~hpctrain.models.moe.MoE` layer's load-balancing loss
needs the assignments of every rank whose tokens differ (data and context parallel: ``count_hook`` sums
them there), and :class:`RouterMetrics` sums what the layers routed over every rank for ``metrics.jsonl``.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from hpctrain import torchapi
from hpctrain.errors import ConfigError
from hpctrain.models.moe import GroupedExperts, moe_layers
from hpctrain.parallel.tp import check_plan, pattern_modules

MOE_ROLES = ("experts",)


def experts_of(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The experts modules of ``model`` (see the module docstring), with their qualified names."""
    names = {id(m): n for n, m in model.named_modules()}
    plan = getattr(type(model), "MOE_PLAN", None)
    if plan:
        found = [
            m for pattern, role in plan.items() if role == "experts" for m in pattern_modules(model, pattern)
        ]
    else:
        found = [layer.experts for _, layer in moe_layers(model)]
    return [(names[id(m)], m) for m in found]


def require_experts(model: nn.Module, ep: int) -> list[tuple[str, nn.Module]]:
    """The model's experts, each with a number of experts ep divides; else one line saying why not."""
    name = type(model).__name__
    check_plan(
        model, getattr(type(model), "MOE_PLAN", None) or {}, f"{name}.MOE_PLAN", MOE_ROLES, "not a role"
    )
    found = experts_of(model)
    if not found:
        raise ConfigError(
            "parallel.ep",
            ep,
            f"model {name} declares no experts to place on ranks: give its class a "
            "MOE_PLAN ({'layers.*.moe.experts': experts}) or build it of hpctrain.models.moe.MoE layers",
            valid="1, or a mixture-of-experts model",
        )
    for path, module in found:
        counts = {p.shape[0] for p in module.parameters(recurse=False)}
        if len(counts) != 1:
            raise ConfigError(
                "parallel.ep", ep, f"{path}'s parameters do not all hold its experts as dimension 0"
            )
        (experts,) = counts
        if experts % ep:
            divisors = ", ".join(str(k) for k in range(1, experts + 1) if experts % k == 0)
            raise ConfigError(
                "parallel.ep",
                ep,
                f"does not divide the {experts} experts of {path} ({experts} % {ep} = {experts % ep})",
                valid=divisors,
            )
    return found


class GradScale(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by ``factor``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


class ExpertDispatch:
    """The hooks around one experts module under expert parallelism (see the module docstring)."""

    def __init__(self, module: nn.Module, mesh: DeviceMesh) -> None:
        self.module = module
        self.mesh = mesh
        self.group = mesh.get_group()
        self.ep = mesh.size()
        self.names = [name for name, _ in module.named_parameters(recurse=False)]
        for name in self.names:
            param = module.get_parameter(name)
            # Every rank built the same weights: each keeps its own experts' slice, nothing is sent.
            local = distribute_tensor(param.data, mesh, [Shard(0)], src_data_rank=None)
            module.register_parameter(name, nn.Parameter(local, requires_grad=param.requires_grad))
        self._pending: list[tuple[torch.Tensor, list[int], list[int]]] = []
        module.register_forward_pre_hook(self._dispatch, with_kwargs=True)
        module.register_forward_hook(self._combine, always_call=True)

    def _dispatch(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        rows, counts = args[0], args[1]
        experts = counts.shape[0]
        local_experts = experts // self.ep
        send = counts.to(torch.int64).view(self.ep, local_experts)  # [destination rank, its local expert]
        received = torch.empty_like(send)
        dist.all_to_all_single(received, send.contiguous(), group=self.group)  # [source rank, local expert]
        send_splits = send.sum(1).tolist()
        receive_splits = received.sum(1).tolist()
        arrived = torchapi.all_to_all_autograd(rows, receive_splits, send_splits, self.group)
        # Arrived grouped by source, then expert: regroup by expert (then source) for the experts' forward.
        sizes = received.flatten().tolist()
        starts = torch.tensor([0, *sizes[:-1]]).cumsum(0).tolist()
        pieces = [
            torch.arange(
                starts[s * local_experts + e], starts[s * local_experts + e] + sizes[s * local_experts + e]
            )
            for e in range(local_experts)
            for s in range(self.ep)
        ]
        order = torch.cat(pieces).to(rows.device) if pieces else torch.zeros(0, dtype=torch.long)
        self._pending.append((order, send_splits, receive_splits))
        for name in self.names:  # the forward reads its local experts' weights as plain tensors
            param = torchapi.own_parameters(module)[name]
            module.__dict__[name] = param.to_local() if isinstance(param, DTensor) else param
        rows_here = GradScale.apply(arrived.index_select(0, order), float(self.ep))
        return (rows_here, received.sum(0).to(counts.device), *args[2:]), kwargs

    def _combine(self, module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
        for name in self.names:
            module.__dict__.pop(name, None)
        order, send_splits, receive_splits = self._pending.pop()
        output = GradScale.apply(output, 1.0 / self.ep)
        back = output.new_empty(output.shape).index_copy(0, order, output)  # by source again
        return torchapi.all_to_all_autograd(back, send_splits, receive_splits, self.group)


def apply_expert_parallel(model: nn.Module, mesh: DeviceMesh) -> list[nn.Module]:
    """Place the experts of ``model`` (or a pipeline stage) on the ep ranks; returns the experts modules."""
    found = [module for _, module in experts_of(model)]
    for module in found:
        ExpertDispatch(module, mesh)
    return found


def count_tokens_over(model: nn.Module, group: dist.ProcessGroup | None) -> None:
    """Every MoE layer's load-balancing loss counts the assignments of every rank of ``group`` (the ranks
    whose tokens differ); None: this rank's alone."""

    def summed(counts: torch.Tensor) -> torch.Tensor:
        counts = counts.clone()
        dist.all_reduce(counts, group=group)
        return counts

    for _, layer in moe_layers(model):
        layer.count_hook = summed if group is not None else None


class RouterMetrics:
    """What the MoE layers of this rank's model routed since the last report, summed over every rank:
    ``moe_load`` (each expert's share of the assignments, all layers), ``moe_dropped`` (assignments over
    capacity), ``moe_aux_loss`` (the load-balancing loss, mean over layers and passes). Tensor-parallel peers
    route the same tokens: only the first counts them."""

    def __init__(self, parts: list[nn.Module], counts_here: bool, token_ranks: int) -> None:
        self.layers = [layer for part in parts for _, layer in moe_layers(part)]
        self.counts_here = counts_here
        self.token_ranks = token_ranks
        self.experts = max((layer.n_experts for layer in self.layers), default=0)

    def report(self, device: torch.device) -> dict[str, Any]:
        """Collective: every rank calls it at the same step."""
        totals = torch.zeros(self.experts + 3, dtype=torch.float64, device=device)
        if self.counts_here:
            for layer in self.layers:
                stats = layer.stats
                if stats.assignments is None:
                    continue
                assert stats.dropped is not None and stats.aux is not None
                totals[: layer.n_experts] += stats.assignments.to(device, torch.float64)
                totals[-3] += float(stats.dropped)
                # The global loss of a pass is the mean of the ranks' (each holds f over all of them).
                totals[-2] += float(stats.aux) / self.token_ranks
                totals[-1] += stats.forwards / self.token_ranks
        for layer in self.layers:
            layer.stats.clear()
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(totals)
        assigned = totals[: self.experts]
        load = (assigned / assigned.sum()).tolist() if float(assigned.sum()) > 0 else [0.0] * self.experts
        aux = float(totals[-2] / totals[-1]) if float(totals[-1]) > 0 else 0.0
        return {"moe_load": [round(x, 6) for x in load], "moe_dropped": int(totals[-3]), "moe_aux_loss": aux}


def router_metrics(parts: list[nn.Module], tp_rank: int, token_ranks: int) -> RouterMetrics | None:
    """A :class:`RouterMetrics` over this rank's stages when any holds MoE layers anywhere in the run (a
    collective must run on every rank: a stage without them reports zeros)."""
    metrics = RouterMetrics(parts, tp_rank == 0, token_ranks)
    has = torch.tensor([len(metrics.layers), metrics.experts], dtype=torch.int64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
    if not int(has[0]):
        return None
    metrics.experts = int(has[1])
    return metrics


def quiet_flattened_slices() -> None:
    """torch 2.13 warns of a mesh sliced by a flattened dimension's name (HSDP over a flattened shard
    dimension, as torchtitan does): the slicing is what FSDP needs here."""
    warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")


__all__ = [
    "GroupedExperts",
    "apply_expert_parallel",
    "count_tokens_over",
    "require_experts",
    "router_metrics",
]
