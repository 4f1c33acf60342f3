"""The parallelize step: turn a plain model into this rank's share of it, by ``parallel.name``.

Order (torchtitan's): fp8's float8 Linear layers first (a model conversion: every later step sees them as
Linear layers), the pipeline split, then for each stage tensor parallelism → context parallelism's hooks →
expert parallelism → activation checkpointing → compile → FSDP (FSDP last: it shards whatever the earlier
steps made of the parameters, DTensors included); DDP, which only hooks gradients, applies to the unsplit
model instead of FSDP. FSDP applies wherever ranks see other tokens of a step and hold the same weights:
dp_shard, ep and cp flattened (:attr:`hpctrain.config.shape.Degrees.fsdp`), HSDP's replicas beside.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.nn.parallel import DistributedDataParallel

from hpctrain.config.schema import Config, ParallelConfig
from hpctrain.config.shape import RunShape, run_shape
from hpctrain.parallel.blocks import find_blocks
from hpctrain.parallel.compile import apply_compile
from hpctrain.parallel.compression import CompressionState, register_compression, single_bucket_cap_mb
from hpctrain.parallel.context import ContextShards, apply_context, require_context_plan
from hpctrain.parallel.fsdp import apply_fsdp
from hpctrain.parallel.mesh import ParallelDims, build_mesh
from hpctrain.parallel.moe import (
    RouterMetrics,
    apply_expert_parallel,
    count_tokens_over,
    quiet_flattened_slices,
    require_experts,
    router_metrics,
)
from hpctrain.parallel.pipeline import Pipeline, dropped_modules, split_stage, stage_ids, stage_owners
from hpctrain.parallel.recompute import apply_activation_checkpointing
from hpctrain.parallel.shared import (
    SharedWeight,
    Tie,
    saved_names,
    shared_weights,
    stage_ties,
    tied_parameters,
)
from hpctrain.parallel.stages import merge_stages, require_split, sequential_dropped, sequential_stage
from hpctrain.parallel.tp import apply_tp, require_tp_plan
from hpctrain.precision import amp


@dataclass
class Parallelized:
    model: nn.Module  # what this rank runs and trains: parameter names are the whole model's
    dims: ParallelDims
    pipeline: Pipeline | None = None  # set under pipeline parallelism: run steps through it, not `model`
    regime: str = "fp32"  # the precision regime (hpctrain.precision): fsdp_mixed means no autocast around it
    compression: CompressionState | None = None  # DDP hook state to checkpoint (per rank)
    parts: list[nn.Module] = field(default_factory=list)  # the stages this rank holds (or the model)
    # Weights that several pipeline stages hold a copy of (a tied embedding and LM head): their gradients
    # are summed over the embedding group each step (hpctrain.parallel.shared).
    shared: list[SharedWeight] = field(default_factory=list)
    # {parameter name here: the name it is saved under} for the second names of tied parameters and the
    # later stages' copies of shared ones: a checkpoint holds each weight once, under the whole model's name.
    saved_names: dict[str, str] = field(default_factory=dict)
    # Context parallelism: this rank's share of each sequence (the targets are split alike).
    context: ContextShards | None = None
    # A mixture of experts anywhere in the run: what its routers did, summed over the ranks (a collective).
    router: RouterMetrics | None = None

    def local_targets(self, targets: Any) -> Any:
        """The targets of the positions this rank computes (a share of each sequence under context
        parallelism, else all)."""
        return self.context.split_targets(targets) if self.context is not None else targets

    def local_batch(self, batch: Any, target_key: str) -> Any:
        """``batch`` with its targets cut to this rank's positions (the model splits its input itself)."""
        if self.context is None:
            return batch
        if isinstance(batch, dict):
            return {k: self.local_targets(v) if k == target_key else v for k, v in batch.items()}
        return (batch[0], self.local_targets(batch[1]), *batch[2:])

    def reduce_shared_grads(self) -> None:
        """Sum the gradients of every shared weight's copies (after backward, before clipping)."""
        for weight in self.shared:
            weight.reduce_grads()

    @property
    def uncounted(self) -> list[nn.Parameter]:
        """Copies whose gradient the global norm leaves out: another stage's copy counts the weight."""
        return [p for weight in self.shared for p in weight.uncounted]

    @property
    def whole_grads(self) -> bool:
        """Every rank holds whole, identical gradients (one process, or DDP replicas): the local gradient
        norm is the global one, and an fp16 overflow is seen alike everywhere."""
        return self.dims.mesh is None or isinstance(self.model, DistributedDataParallel)

    @property
    def data_parallel(self) -> tuple[int, int]:
        """(index, size) of this rank's slice of each global batch."""
        return self.dims.dp_rank, self.dims.degrees.dp


def parallelize(
    model: nn.Module, cfg: Config, device: torch.device, shape: RunShape | None = None
) -> Parallelized:
    """Apply the layout of ``cfg`` to ``model`` in a fixed order: pipeline split, TP, activation
    checkpointing, compile, FSDP, then DDP or the pipeline schedule. ``shape`` is the run's (derived from
    ``cfg`` when not given)."""
    p, precision = cfg.parallel, cfg.trainer.precision
    shape = shape or run_shape(cfg)
    dims = build_mesh(shape.degrees, device)
    # A model on the meta device (a rehearsal: hpctrain.task.rehearse) is laid out where it is: only shapes.
    meta = any(t.is_meta for t in model.parameters())
    if not meta:
        model = model.to(device)
    if precision == "fp8":
        amp.require_float8(device)
        apply_float8(model, p.block_classes)
    # The plans are read off the whole model, before a pipeline split removes modules they name.
    plan = require_tp_plan(model, dict(p.tp_plan), dims.degrees.tp) if dims.has("tp") else None
    context_plan = require_context_plan(model, dims.degrees.cp, dims.degrees.pp) if dims.has("cp") else None
    if dims.has("ep"):
        require_experts(model, dims.degrees.ep)
    n_stages = shape.n_stages if dims.has("pp") else 1
    ties = tied_parameters(model)
    across: list[Tie] = []  # the ties whose names land on different pipeline stages
    if dims.has("pp"):
        per_rank = shape.stages_per_rank
        ids = stage_ids(p.schedule, dims.pp_rank, dims.degrees.pp, per_rank)
        split = require_split(model, dict(p.pp_split), n_stages)
        if split is None:  # the model splits itself (PIPELINE_INPUT / PIPELINE_OUTPUT)
            dropped = [dropped_modules(model, s, n_stages) for s in range(n_stages)]
            parts = {i: split_stage(model, i, n_stages) for i in ids}
        else:
            dropped = [sequential_dropped(model, split, s, n_stages) for s in range(n_stages)]
            parts = {i: sequential_stage(model, split, i, n_stages) for i in ids}
        across = stage_ties(ties, dropped)
        del model  # each stage is a pruned copy; the whole model is not kept
    else:
        parts = {0: model}
    data_parallel = [d for d in ("dp_replicate", "dp_shard") if dims.has(d)]
    sharded = shape.degrees.fsdp > 1
    quiet_flattened_slices()
    dense_mesh = dims.fsdp_mesh("dp_shard", "ep", "cp")
    expert_mesh = dims.fsdp_mesh("dp_shard", "cp")
    shards = ContextShards(dims.submesh("cp")) if context_plan is not None else None
    for i, part in parts.items():
        if plan is not None:
            apply_tp(part, dims.submesh("tp"), p.sequence_parallel, plan, i == 0, i == n_stages - 1)
        if context_plan is not None:
            apply_context(part, shards, context_plan)
        experts = apply_expert_parallel(part, dims.submesh("ep")) if dims.has("ep") else []
        apply_activation_checkpointing(part, p.activation_checkpointing, p.block_classes)
        if p.compile:
            apply_compile(part, p.block_classes)
        if sharded:
            assert dense_mesh is not None
            apply_fsdp(part, dense_mesh, p, precision, device, experts, expert_mesh)
    tokens = dims.flat("dp_replicate", "dp_shard", "ep", "cp")
    for part in parts.values():
        count_tokens_over(part, tokens.get_group() if tokens is not None else None)
    first = next(iter(parts.values()))
    result = Parallelized(first, dims, regime=shape.regime, parts=list(parts.values()))
    result.context = shards
    result.router = router_metrics(list(parts.values()), dims.coordinate("tp"), shape.degrees.token_ranks)
    result.saved_names = saved_names(ties, across, parts)
    if dims.has("pp"):
        group = dims.pp_group
        assert group is not None and dims.mesh is not None
        owners = stage_owners(p.schedule, dims.degrees.pp, per_rank)
        result.shared = shared_weights(across, parts, owners, dims.mesh)
        result.pipeline = Pipeline(parts, owners, p.schedule, p.microbatches, device, group)
        result.model = first if len(parts) == 1 else merge_stages(list(parts.values()))
    elif data_parallel == ["dp_replicate"] and not meta:
        # On the meta device DDP is not applied: its constructor compares real parameters across the ranks,
        # and it changes no parameter's shape or placement (what a rehearsal reads).
        result.model, result.compression = apply_ddp(parts[0], p, device, dims.submesh("dp_replicate"))
    return result


def apply_float8(model: nn.Module, block_classes: Sequence[str] = (), emulate: bool = False) -> list[str]:
    """fp8: the Linear layers of the model's blocks that gain from float8 become torchao's Float8Linear
    (:func:`hpctrain.precision.amp.convert_to_float8`); a model without blocks has all of its own converted.
    Only the blocks' by default: the embeddings and the LM head, whose logits feed the loss directly, stay
    in bf16, as Micikevicius et al. 2022 ("FP8 Formats for Deep Learning", section 4) kept their first and
    last layers in 16 bits; the blocks hold nearly all of a transformer's matmul FLOPs. Returns the
    converted layers' names."""
    return amp.convert_to_float8(model, [b.name for b in find_blocks(model, block_classes)], emulate)


def apply_ddp(
    model: nn.Module, parallel: ParallelConfig, device: torch.device, mesh: DeviceMesh
) -> tuple[DistributedDataParallel, CompressionState]:
    group = mesh.get_group()
    bucket_cap_mb = parallel.bucket_cap_mb
    if parallel.compression == "powersgd" and dist.get_backend(group) == "gloo":
        # PowerSGD's hook deadlocks intermittently on gloo with several buckets: use one.
        bucket_cap_mb = max(bucket_cap_mb, single_bucket_cap_mb(model))
    ddp = DistributedDataParallel(
        model,
        device_ids=[device] if device.type == "cuda" else None,
        process_group=group,
        bucket_cap_mb=bucket_cap_mb,
        gradient_as_bucket_view=parallel.gradient_as_bucket_view,
        static_graph=parallel.static_graph,
    )
    state = register_compression(
        ddp,
        parallel.compression,
        topk_ratio=parallel.topk_ratio,
        powersgd_rank=parallel.powersgd_rank,
        powersgd_start_step=parallel.powersgd_start_step,
        process_group=group,
    )
    return ddp, state


def prime_ddp_buckets(model: nn.Module, loss_of: Callable[[nn.Module], torch.Tensor]) -> None:
    """Let DDP settle its gradient buckets before the first real step, so that a resumed run is exact.

    DDP reduces its first iteration's gradients in buckets laid out in parameter order, then rebuilds them
    in the order gradients became ready. With more than two ranks, gloo's and NCCL's ring all-reduce sum each
    element in an order that depends on its place in the bucket; so the first step after a resume (a fresh
    DDP, initial layout) would round differently from the same step of an uninterrupted run (rebuilt layout).
    One throwaway forward/backward of a zero loss (``loss_of(model)``: the run's loss on one batch) —
    weights, gradients and RNG streams left as they were —
    gives every run the rebuilt layout from its first real step on.
    """
    if not isinstance(model, DistributedDataParallel):
        return
    device = next(model.parameters()).device
    devices = [device] if device.type == "cuda" else []
    was_training = model.training
    with torch.random.fork_rng(devices=devices):
        model.eval()
        (loss_of(model).float() * 0.0).backward()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
