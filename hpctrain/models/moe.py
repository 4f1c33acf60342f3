"""Mixture of experts: a top-k router and experts held as one grouped weight. Plain PyTorch, no distribution.

:class:`MoE` replaces a transformer block's MLP (Shazeer et al. 2017; Switch Transformer, Fedus et al. 2022;
Mixtral, Jiang et al. 2024): a linear router scores every token against the ``E`` experts, each token goes to
its ``top_k`` experts (softmax probabilities, the chosen ones renormalised to sum to 1, as Mixtral), and its
output is the gate-weighted sum of theirs.

- **Dropless by default**: every assignment is computed, so which tokens an expert sees never depends on how
  the batch is split over ranks (expert parallelism sends them to the expert's rank; nothing is cut).
  ``capacity`` > 0 caps each expert at ⌈capacity · k · N / E⌉ assignments of the N tokens of the pass (GShard,
  Lepikhin et al. 2021): the first in token order are kept, the rest dropped (their share of the token's
  output is 0) and counted.
- **Experts as one grouped weight** (:class:`GroupedExperts`): ``w_in`` [E, d, h], ``w_out`` [E, h, d] and
  their biases; the tokens, sorted by expert, run through their expert's slice. Its forward takes the sorted
  rows and the rows per expert: the contract expert parallelism (:mod:`hpctrain.parallel.moe`) keeps when it
  sends rows to the rank holding their expert.
- **Load balancing** (Switch Transformer, eq. 4): ``aux = E · Σ_e f_e · P_e``, f_e the share of the
  assignments expert e got and P_e its mean router probability, weighted by ``aux_loss_weight``. f counts the
  tokens of every rank of the step (``count_hook``, set from outside by :mod:`hpctrain.parallel.moe`; identity
  on one process), P is this rank's mean: their gradients, averaged over the data-parallel ranks, are those of
  the loss over the whole batch. It reaches the backward through :class:`AuxLoss` (Megatron-LM's
  ``MoEAuxLossAutoScaler``): the output is unchanged, the auxiliary loss's gradient joins the main loss's,
  scaled as the trainer scales the main loss (:func:`set_aux_loss_scale`).

Each forward adds to the layer's :class:`RouterStats` (assignments per expert, dropped assignments, the
auxiliary loss) until the trainer reads and clears them (``metrics.jsonl``: ``moe_load``, ``moe_dropped``,
``moe_aux_loss``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from hpctrain import torchapi
from hpctrain.models.layers import INIT_STD


class AuxLoss(torch.autograd.Function):
    """Identity on ``output``; the backward also sends ``scale`` into ``aux`` (a scalar loss computed in the
    forward), so the auxiliary loss's gradient flows without being added to the reported loss."""

    scale: ClassVar[float] = 1.0  # what the main loss is multiplied by before its backward

    @staticmethod
    def forward(ctx: Any, output: torch.Tensor, aux: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(aux)
        return output

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        (aux,) = ctx.saved_tensors
        return grad, torch.full_like(aux, AuxLoss.scale)


def set_aux_loss_scale(scale: float) -> None:
    """The factor the trainer applies to the main loss before its backward (loss scaling, the share of a
    pass in an accumulated step): the auxiliary losses are back-propagated with it too."""
    AuxLoss.scale = float(scale)


@dataclass
class RouterStats:
    """What one MoE layer routed since the last read, on this rank."""

    assignments: torch.Tensor | None = None  # [E] assignments per expert, before any drop
    dropped: torch.Tensor | None = None  # assignments dropped at capacity
    aux: torch.Tensor | None = None  # sum of the auxiliary loss over the forwards
    forwards: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, assignments: torch.Tensor, dropped: torch.Tensor, aux: torch.Tensor) -> None:
        if self.assignments is None:
            self.assignments, self.dropped, self.aux = assignments.clone(), dropped.clone(), aux.clone()
        else:
            assert self.dropped is not None and self.aux is not None
            self.assignments += assignments
            self.dropped += dropped
            self.aux += aux
        self.forwards += 1

    def clear(self) -> None:
        self.assignments = self.dropped = self.aux = None
        self.forwards = 0


class GroupedExperts(nn.Module):
    """``E`` two-layer GELU MLPs (d → h → d) as grouped weights; ``forward(rows, counts)``: ``rows`` [R, d]
    sorted by expert, ``counts`` [E] rows per expert (on the host or the device), returns [R, d]. Every
    parameter has the experts as its dimension 0 (what expert parallelism splits)."""

    def __init__(self, experts: int, d_model: int, hidden: int) -> None:
        super().__init__()
        self.w_in = nn.Parameter(torch.empty(experts, d_model, hidden))
        self.b_in = nn.Parameter(torch.empty(experts, hidden))
        self.w_out = nn.Parameter(torch.empty(experts, hidden, d_model))
        self.b_out = nn.Parameter(torch.empty(experts, d_model))
        self.act = nn.GELU(approximate="tanh")
        self.reset_parameters()

    def reset_parameters(self, residual_std: float = INIT_STD) -> None:
        """GPT-2's init per expert: N(0, 0.02) weights (the residual output scaled), zero biases."""
        nn.init.normal_(self.w_in, std=INIT_STD)
        nn.init.normal_(self.w_out, std=residual_std)
        nn.init.zeros_(self.b_in)
        nn.init.zeros_(self.b_out)

    def forward(self, rows: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        sizes = [int(n) for n in counts.tolist()]
        if sum(sizes) != rows.shape[0]:
            raise ValueError(f"{rows.shape[0]} rows for {sum(sizes)} counted by expert")
        outputs = []
        # An expert without rows still runs (on none): its weights get a zero gradient, so every rank
        # reduces the same gradients whatever its experts were sent.
        for e, x in enumerate(rows.split(sizes)):
            hidden = self.act(torch.addmm(self.b_in[e], x, self.w_in[e]))
            outputs.append(torch.addmm(self.b_out[e], hidden, self.w_out[e]))
        return torch.cat(outputs)


class MoE(nn.Module):
    """Router + experts in place of an MLP (see the module docstring). ``[..., d]`` in, ``[..., d]`` out."""

    def __init__(
        self,
        d_model: int,
        experts: int,
        top_k: int = 2,
        mlp_ratio: int = 4,
        capacity: float = 0.0,
        aux_loss_weight: float = 0.01,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if not 1 <= top_k <= experts:
            raise ValueError(f"top_k={top_k} must be between 1 and the {experts} experts")
        self.n_experts, self.top_k, self.capacity = experts, top_k, capacity
        self.aux_loss_weight = aux_loss_weight
        self.router = nn.Linear(d_model, experts, bias=False)
        self.experts = GroupedExperts(experts, d_model, mlp_ratio * d_model)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.stats = RouterStats()
        # Sums [assignments per expert..., tokens] over every rank whose tokens differ in this step (set by
        # hpctrain.parallel.moe); None: this process's tokens are all of them.
        self.count_hook: Callable[[torch.Tensor], torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        tokens = x.reshape(-1, shape[-1])
        n, k, n_experts = tokens.shape[0], self.top_k, self.n_experts
        probs = F.softmax(self.router(tokens).float(), dim=-1)  # [N, E]
        top_p, top_e = probs.topk(k, dim=-1)  # [N, k]
        gates = (top_p / top_p.sum(-1, keepdim=True)).to(x.dtype)
        flat = top_e.reshape(-1)  # [N·k] the expert of each assignment, token-major
        assigned = torch.bincount(flat, minlength=n_experts)
        keep = self._kept(flat, n) if self.capacity > 0 else None
        if keep is not None:
            gates = gates * keep.view(n, k).to(gates.dtype)
            flat_kept = torch.where(keep, flat, n_experts)  # dropped: sorted past the last expert
        else:
            flat_kept = flat
        order = torch.argsort(flat_kept, stable=True)  # assignments grouped by expert, token order within
        counts = torch.bincount(flat_kept, minlength=n_experts + 1)[:n_experts]
        kept = int(counts.sum())
        rows = tokens[order[:kept] // k]
        y = self.experts(rows, counts)
        per_assignment = y.new_zeros(n * k, shape[-1]).index_copy(0, order[:kept], y)
        out = (per_assignment.view(n, k, -1) * gates.unsqueeze(-1)).sum(1)
        aux = self._aux(probs, assigned, n)
        # Counted once per training forward: not in evaluation, nor when activation checkpointing runs the
        # forward again inside the backward.
        if self.training and not torchapi.in_backward():
            dropped = (n * k - kept) * torch.ones((), dtype=torch.long, device=x.device)
            self.stats.add(assigned.detach(), dropped, aux.detach())
        out = self.dropout(out).reshape(shape)
        if self.training and self.aux_loss_weight > 0:
            out = AuxLoss.apply(out, aux * self.aux_loss_weight)
        return out

    def _kept(self, flat: torch.Tensor, n: int) -> torch.Tensor:
        """Which assignments fit their expert's capacity: the first ⌈capacity · k · N / E⌉ of each expert, in
        token order."""
        limit = math.ceil(self.capacity * self.top_k * n / self.n_experts)
        one_hot = F.one_hot(flat, self.n_experts)
        position = (one_hot.cumsum(0) * one_hot).sum(-1) - 1  # place of each assignment in its expert
        return position < limit

    def _aux(self, probs: torch.Tensor, assigned: torch.Tensor, n: int) -> torch.Tensor:
        """Switch Transformer's load-balancing loss with the assignments of every rank of the step (see the
        module docstring) and this rank's mean probabilities."""
        counts = torch.cat([assigned.to(probs.dtype), torch.full((1,), float(n), device=probs.device)])
        if self.count_hook is not None:
            counts = self.count_hook(counts)
        share = counts[:-1] / (counts[-1] * self.top_k)  # f_e
        return self.n_experts * (share * probs.mean(0)).sum()


def init_experts_(model: nn.Module, n_layers: int) -> None:
    """GPT-2's init for every :class:`GroupedExperts` of ``model`` (their residual outputs scaled by
    1/sqrt(2·L), as the dense MLP's ``fc_out``)."""
    for module in model.modules():
        if isinstance(module, GroupedExperts):
            module.reset_parameters(INIT_STD / math.sqrt(2 * n_layers))


def moe_layers(model: nn.Module) -> list[tuple[str, MoE]]:
    """Every :class:`MoE` layer of ``model`` with its qualified name."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, MoE)]
