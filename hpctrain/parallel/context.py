"""Context parallelism: every sample's sequence split over the ``cp`` ranks, attention by a ring.

Where the residual stream starts (a plan's ``enter`` module's output, or ``enter_input``'s first input),
each rank keeps 2 of the sequence's 2·cp equal chunks: chunk r and chunk 2·cp − 1 − r. Under causal
attention a late chunk attends to far more keys than an early one; pairing one of each end gives every
rank the same work (the load balancing of Megatron-LM's context parallelism and Llama 3, Grattafiori et
al. 2024, §3.3.2). Everything per position (norms, MLPs, the head, the loss) then runs on those 2 chunks;
each rank's loss is the mean over its own positions, which have the same count on every rank, so the mean
over ranks is the sequence's mean and FSDP's gradient average over the cp ranks (``Degrees.fsdp``) is the
gradient of one process.

Attention needs every key: inside the plan's ``attention`` modules, ``F.scaled_dot_product_attention`` is
replaced (a ``TorchFunctionMode`` while the module runs) by ring attention (Liu et al. 2023, "Ring
Attention with Blockwise Transformers"): the keys and values travel around the cp ranks (send/recv, so it
runs on gloo as on NCCL) while each rank attends its queries to each block in turn, merging the blocks
with their log-sum-exp (the online softmax of Milakov & Gimelshein 2018, as flash attention does); the
backward sends the keys and values round again with their accumulating gradients, which reach their owner
after the last step. Masks come from the global positions of the chunks. torch's own
``torch.distributed.tensor.experimental.context_parallel`` does not run on CPUs (torch 2.13: no DTensor
sharding rule for ``_scaled_dot_product_flash_attention_for_cpu``), hence this ring of its own.

A model says what context parallelism needs in its class's ``CONTEXT_PLAN`` (module-name pattern → role,
as ``TP_PLAN``): ``enter`` / ``enter_input`` (where the stream is split), ``attention`` (modules whose
scaled_dot_product_attention sees the whole sequence), ``positions`` (modules whose keyword arguments
carry per-position tensors computed on the whole sequence, such as rotary embeddings: split alike). A
transformers decoder gets its plan from its layers (:func:`hpctrain.models.hf.context_plan`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.overrides import TorchFunctionMode

from hpctrain.errors import ConfigError
from hpctrain.models.hf import context_plan as transformers_context_plan
from hpctrain.parallel.tp import check_plan, pattern_modules

CONTEXT_ROLES = ("enter", "enter_input", "attention", "positions")


def context_plan_of(model: nn.Module) -> tuple[dict[str, str], str] | None:
    """(plan, where it came from) of ``model``, or None when it declares none."""
    declared = getattr(type(model), "CONTEXT_PLAN", None)
    if declared:
        return dict(declared), f"{type(model).__name__}.CONTEXT_PLAN"
    found = transformers_context_plan(model)
    if found:
        return found, f"{type(model).__name__}'s decoder layers"
    return None


def require_context_plan(model: nn.Module, cp: int, pp: int = 1) -> dict[str, str]:
    """The model's plan, every pattern naming a module of it; else one line saying what to declare."""
    found = context_plan_of(model)
    name = type(model).__name__
    if found is None:
        raise ConfigError(
            "parallel.cp",
            cp,
            f"model {name} declares no attention context parallelism can split: give its "
            "class a CONTEXT_PLAN (module-name pattern → role, e.g. {'drop': enter, 'layers.*.attn': "
            "attention}) whose attention is causal F.scaled_dot_product_attention",
            valid="roles " + ", ".join(CONTEXT_ROLES),
        )
    plan, source = found
    check_plan(model, plan, source, CONTEXT_ROLES, "not a context-parallel role")
    roles = set(plan.values())
    if "attention" not in roles or not roles & {"enter", "enter_input"}:
        raise ConfigError(
            "parallel.cp",
            cp,
            f"{source} must name its attention and where the stream starts",
            valid="an attention entry and an enter or enter_input entry",
        )
    if pp > 1 and "positions" in roles:
        # A later pipeline stage computes its positions from the hidden states it receives: a share.
        raise ConfigError(
            "parallel.pp",
            pp,
            f"{source} splits per-position arguments computed from the whole sequence, "
            "which a later pipeline stage does not have",
            valid="1 with parallel.cp, or a built-in model",
        )
    return plan


class ContextShards:
    """This rank's share of the sequence and the ring around its cp group."""

    def __init__(self, mesh: DeviceMesh) -> None:
        self.group = mesh.get_group()
        self.size = mesh.size()
        self.rank = mesh.get_local_rank()
        self.length: int | None = None  # the whole sequence, noted where the stream is split
        ranks = dist.get_process_group_ranks(self.group)
        self.next = ranks[(self.rank + 1) % self.size]
        self.previous = ranks[(self.rank - 1) % self.size]

    def positions(
        self, length: int, rank: int | None = None, device: torch.device | None = None
    ) -> torch.Tensor:
        """The global positions a rank keeps of a ``length``-long sequence: chunks r and 2·cp − 1 − r."""
        rank = self.rank if rank is None else rank
        chunks = 2 * self.size
        if length % chunks:
            raise ValueError(
                f"a sequence of {length} positions does not split into 2·cp = {chunks} equal chunks "
                f"(parallel.cp={self.size})"
            )
        c = length // chunks
        first, last = rank * c, (chunks - 1 - rank) * c
        return torch.cat([torch.arange(first, first + c), torch.arange(last, last + c)]).to(device)

    def split(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """This rank's chunks of ``x`` along ``dim`` (autograd: the gradient of the rest is zero)."""
        return x.index_select(dim, self.positions(x.shape[dim], device=x.device))

    def enter(self, x: torch.Tensor) -> torch.Tensor:
        self.length = x.shape[1]
        return self.split(x)

    def split_targets(self, targets: Any) -> Any:
        """The targets of this rank's positions ([B, T, ...] tensors split on T)."""
        if isinstance(targets, torch.Tensor) and targets.dim() >= 2:
            return self.split(targets)
        return targets

    def split_positional(self, value: Any) -> Any:
        """A per-position keyword argument (dimension 1 the whole sequence), or a tuple of them, split."""
        if isinstance(value, torch.Tensor) and value.dim() >= 2 and value.shape[1] == self.length:
            return self.split(value)
        if isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
            return tuple(self.split_positional(v) for v in value)
        return value


# ----------------------------------------------------------------------------------------- ring attention
def _exchange(shards: ContextShards, tensor: torch.Tensor) -> tuple[torch.Tensor, list[Any]]:
    """Send ``tensor`` to the next rank of the ring and receive the previous rank's into a new buffer."""
    received = torch.empty_like(tensor)
    ops = [
        dist.P2POp(dist.isend, tensor, shards.next, shards.group),
        dist.P2POp(dist.irecv, received, shards.previous, shards.group),
    ]
    return received, dist.batch_isend_irecv(ops)


def _wait(requests: list[Any]) -> None:
    for request in requests:
        request.wait()


def _scores(
    q: torch.Tensor, k: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor, causal: bool, scale: float
) -> torch.Tensor | None:
    """Scaled scores [B, H, Tq, Tk] in fp32 with future positions at −inf; None when all are masked."""
    scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
    if causal:
        allowed = q_pos[:, None] >= k_pos[None, :]
        if not bool(allowed.any()):
            return None
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


class RingAttention(torch.autograd.Function):
    """Attention of this rank's queries to the whole sequence's keys and values, blockwise around the ring
    (see the module docstring). Inputs [B, H, T/cp, D]; what it saves for the backward is what a flash
    kernel saves: q, k, v, the output and the log-sum-exp."""

    @staticmethod
    def forward(
        ctx: Any,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        shards: ContextShards,
        causal: bool,
        scale: float,
    ) -> torch.Tensor:
        length = q.shape[2] * shards.size
        q_pos = shards.positions(length, device=q.device)
        out = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        for step in range(shards.size):
            source = (shards.rank - step) % shards.size
            pending = _exchange(shards, kv) if step < shards.size - 1 else None
            scores = _scores(q, kv[0], q_pos, shards.positions(length, source, q.device), causal, scale)
            if scores is not None:
                block_lse = torch.logsumexp(scores, dim=-1)
                finite = torch.where(torch.isinf(block_lse), torch.zeros_like(block_lse), block_lse)
                block_out = torch.matmul(torch.exp(scores - finite[..., None]).to(v.dtype), kv[1]).float()
                new_lse = torch.logaddexp(lse, block_lse)
                new_finite = torch.where(torch.isinf(new_lse), torch.zeros_like(new_lse), new_lse)
                out = (
                    out * torch.exp(lse - new_finite)[..., None]
                    + block_out * torch.exp(block_lse - new_finite)[..., None]
                )
                lse = new_lse
            if pending is not None:
                kv, requests = pending
                _wait(requests)
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.shards, ctx.causal, ctx.scale = shards, causal, scale
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        shards, causal, scale = ctx.shards, ctx.causal, ctx.scale
        length = q.shape[2] * shards.size
        q_pos = shards.positions(length, device=q.device)
        grad = grad.contiguous()
        delta = (grad.float() * out.float()).sum(-1)  # rowsum(dO ∘ O): the softmax's backward term
        finite_lse = torch.where(torch.isinf(lse), torch.zeros_like(lse), lse)
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros(kv.shape, dtype=torch.float32, device=q.device)
        for step in range(shards.size):
            source = (shards.rank - step) % shards.size
            pending = _exchange(shards, kv) if step < shards.size - 1 else None
            scores = _scores(q, kv[0], q_pos, shards.positions(length, source, q.device), causal, scale)
            if scores is not None:
                p = torch.exp(scores - finite_lse[..., None])  # the softmax, masked entries 0
                dkv[1] += torch.matmul(p.transpose(-1, -2).to(grad.dtype), grad).float()
                dp = torch.matmul(grad, kv[1].transpose(-1, -2)).float()
                ds = p * (dp - delta[..., None]) * scale
                dq += torch.matmul(ds.to(q.dtype), kv[0]).float()
                dkv[0] += torch.matmul(ds.transpose(-1, -2).to(q.dtype), q).float()
            if pending is not None:
                kv, kv_requests = pending
                _wait(kv_requests)
            # The gradients of the keys and values held until now travel on after them; after the last step
            # they reach the rank that owns them.
            dkv, requests = _exchange(shards, dkv)
            _wait(requests)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None


def ring_attention(
    shards: ContextShards,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``F.scaled_dot_product_attention``'s signature, over the whole sequence of this rank's cp group."""
    if attn_mask is not None:
        raise ValueError(
            "context parallelism takes attention whose mask is causal or none (is_causal), not an explicit "
            "attn_mask: the ranks hold shares of the sequence"
        )
    if dropout_p > 0:
        raise ValueError("context parallelism's ring attention takes no attention dropout")
    if (
        enable_gqa and key.shape[-3] != query.shape[-3]
    ):  # grouped-query attention: each key/value head serves several
        repeats = query.shape[-3] // key.shape[-3]
        key = key.repeat_interleave(repeats, dim=-3)
        value = value.repeat_interleave(repeats, dim=-3)
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    return RingAttention.apply(query, key, value, shards, is_causal, scale)


class _RingMode(TorchFunctionMode):
    """While active, ``F.scaled_dot_product_attention`` is :func:`ring_attention` over ``shards``."""

    def __init__(self, shards: ContextShards) -> None:
        super().__init__()
        self.shards = shards

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return ring_attention(self.shards, *args, **kwargs)
        return func(*args, **kwargs)


# ------------------------------------------------------------------------------------------ applying it
def apply_context(model: nn.Module, shards: ContextShards, plan: dict[str, str]) -> ContextShards:
    """Hook ``model`` (or a pipeline stage of it) by ``plan`` for ``shards`` (one per rank, shared by its
    stages); entries naming modules this stage does not have are skipped. The stream's split runs before
    any other hook on the same module (tensor parallelism's sequence split then divides this rank's
    share)."""
    modes: list[_RingMode] = []

    def split_output(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
        return shards.enter(output)

    def split_input(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return (shards.enter(args[0]), *args[1:]), kwargs

    def split_positions(_module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return args, {name: shards.split_positional(value) for name, value in kwargs.items()}

    def enter_ring(_module: nn.Module, _args: Any) -> None:
        mode = _RingMode(shards)
        mode.__enter__()
        modes.append(mode)

    def leave_ring(_module: nn.Module, _args: Any, _output: Any) -> None:
        modes.pop().__exit__(None, None, None)

    order = sorted(plan.items(), key=lambda item: CONTEXT_ROLES.index(item[1]))  # splits first
    for pattern, role in order:
        for module in pattern_modules(model, pattern):
            if role == "enter":
                module.register_forward_hook(split_output, prepend=True)
            elif role == "enter_input":
                module.register_forward_pre_hook(split_input, prepend=True, with_kwargs=True)
            elif role == "positions":
                module.register_forward_pre_hook(split_positions, with_kwargs=True)
            else:
                module.register_forward_pre_hook(enter_ring)
                module.register_forward_hook(leave_ring, always_call=True)
    return shards
