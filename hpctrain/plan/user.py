"""Memory per rank and time per step of a model that declares no shapes (a user's ``_target_``), from the
facts :mod:`hpctrain.submit.footprint` measured (:class:`hpctrain.models.facts.MeasuredModel`). Torch-free:
the caller measures, this module only counts.

Under data parallelism one rank stands for all, FSDP's first shard rank holding the most. Under tensor
and pipeline parallelism (a plan and a split found or declared, :mod:`hpctrain.parallel.tp` and
:mod:`hpctrain.parallel.stages`) each parameter is cut by its role's dimension and kept on the stages of
the split that hold it, exactly; the activations are split approximately (the blocks' measured part by the
rank's share of the blocks and by tp, the ends' on the end stages, times the micro-batches in flight), and
TP/PP communication buffers and time are not counted: the plan says so.

Model state is counted as for the built-ins (:mod:`hpctrain.plan.memory`) from each parameter's exact shape
and dtype: gradients like the parameters, AdamW's two states like them plus a 4-byte step per tensor, SGD's
momentum buffer; FSDP2 cuts dimension 0 of each tensor into ⌈n / dp_shard⌉ rows. The FSDP units are the blocks
:mod:`hpctrain.parallel.blocks` finds (the model as one unit when it finds none): ZeRO-3 gathers the running
block, the prefetched next one and the root. Activations are the measured line (fixed + per sample) at
``trainer.micro_batch_size``, in the layout's precision regime, and the loss's gradients (the logits' bytes,
and fp32 log-probabilities like them) as a buffer; under full checkpointing the measured bytes outside the
blocks plus their inputs, and the block being recomputed as a buffer. Selective checkpointing of a user's
block keeps the matmul outputs and recomputes the rest: not measured, the full measurement is its upper bound.
FLOPs: counted in the measured forward and backward, else 6·N per token (or per sample).
"""

from __future__ import annotations

from hpctrain.config.schema import Config
from hpctrain.models.facts import MeasuredModel, ParamFact
from hpctrain.models.spec import ParamSpec
from hpctrain.plan.layout import FP32, HALF, MIB, Layout, local_numel, rank_stages
from hpctrain.plan.memory import RankMemory, in_flight
from hpctrain.plan.time import StepTime, data_parallel_comms, timed_step


def applied_ac(lay: Layout, facts: MeasuredModel) -> str:
    """The checkpointing that takes effect: none where no blocks were found to wrap."""
    return lay.ac if facts.blocks else "none"


def _local(p: ParamFact, tp: int, shards: int) -> int:
    return local_numel(ParamSpec(p.name, p.shape, p.tp_dim), tp, shards, 0)


def user_rank_memory(cfg: Config, lay: Layout, facts: MeasuredModel, pp_rank: int = 0) -> RankMemory:
    """The memory of pipeline rank ``pp_rank`` (at its first data-parallel coordinate)."""
    p, d = cfg.parallel, lay.degrees
    stages = rank_stages(p.schedule, pp_rank, d.pp, lay.per_rank) if d.pp > 1 else [0]
    mine = [q for q in facts.params if d.pp == 1 or q.stages is None or set(q.stages) & set(stages)]
    shards = d.dp_shard if lay.sharded else 1
    numel = sum(_local(q, d.tp, shards) for q in mine)
    params = sum(_local(q, d.tp, shards) * q.itemsize for q in mine)
    grads = params
    tensors = len(mine)
    if cfg.optim.name == "adamw":
        optimizer = 2 * params + FP32 * tensors
    else:
        optimizer = params if cfg.optim.momentum > 0 else 0
    ac = applied_ac(lay, facts)
    acts = facts.activations_in(lay.regime)
    parts: dict[str, int] = {}
    buffers: dict[str, int] = {}
    flying = in_flight(p.schedule, d.pp, pp_rank, lay.microbatches, lay.per_rank)
    if acts is not None:
        mb = lay.micro_batch
        line = acts.checkpointed if ac == "full" else acts.saved
        if d.pp == 1 and d.tp == 1:
            parts["saved for backward"] = line.at(mb)
        else:
            # Split as the layout splits the model (an approximation): the blocks' part by the share of
            # the blocks on this rank's stages and by tp (their matmuls split), the ends' on the first and
            # last stage, each for the micro-batches in flight.
            held = [q for q in mine if q.unit >= 0]
            share = len({q.unit for q in held}) / facts.blocks if facts.blocks else 1.0
            ends = acts.outside.at(mb) if 0 in stages or lay.n_stages - 1 in stages else 0
            blocks = max(0, line.at(mb) - acts.outside.at(mb))
            parts["saved for backward"] = round(flying * (blocks * share / d.tp + ends))
        if ac == "full":
            buffers["recomputed block"] = round(acts.recompute.at(mb) / d.tp)
        if lay.n_stages - 1 in stages:
            # The loss's backward: the gradient of the logits (their dtype) and of its fp32 log-probabilities.
            logits = acts.output.at(mb)
            itemsize = FP32 if acts.regime == "fp32" else HALF
            buffers["loss gradients"] = logits + logits // itemsize * FP32
    if facts.buffer_bytes:
        buffers["model buffers"] = facts.buffer_bytes
    if d.dp_replicate > 1 and not lay.sharded:  # DDP
        buffers["DDP buckets"] = round(2 * p.bucket_cap_mb * MIB)
        if not p.gradient_as_bucket_view:
            buffers["DDP buckets"] += grads
        if p.compression in ("powersgd", "topk"):
            buffers["compression error feedback"] = grads
    if lay.sharded:
        param_bytes = HALF if lay.regime == "fsdp_mixed" else FP32
        units = [sum(_local(q, d.tp, 1) for q in mine if q.unit == k) for k in range(facts.blocks)]
        units = [u for u in units if u]
        root = sum(_local(q, d.tp, 1) for q in mine if q.unit < 0)
        largest = max(units, default=root)
        held = sorted(units, reverse=True)[: 2 if p.reshard_after_forward else len(units)]
        buffers["FSDP gathered parameters"] = (sum(held) + root) * param_bytes
        buffers["FSDP reduce-scatter"] = largest * (2 * param_bytes + FP32)
    host = 0
    if p.cpu_offload and lay.sharded:
        host, params, grads, optimizer = params + grads + optimizer, 0, 0, 0
    return RankMemory(
        pp_rank=pp_rank,
        stages=tuple(stages),
        blocks=len(units_of(mine)),
        param_numel=numel,
        param_tensors=tensors,
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=sum(parts.values()),
        in_flight=flying,
        buffers=sum(buffers.values()),
        host=host,
        parts={**parts, **buffers},
    )


def units_of(params: list[ParamFact]) -> set[int]:
    return {q.unit for q in params if q.unit >= 0}


def powersgd_share(cfg: Config, facts: MeasuredModel) -> float:
    """The share of the gradient bytes PowerSGD sends: r(a + b) for each a × b matrix (the rest whole)."""
    r, total, sent = cfg.parallel.powersgd_rank, 0, 0
    for q in facts.params:
        total += q.numel
        rows = q.shape[0] if q.shape else 1
        cols = q.numel // rows if rows else 0
        sent += min(q.numel, r * (rows + cols)) if len(q.shape) >= 2 else q.numel
    return sent / total if total else 1.0


def user_step_time(cfg: Config, lay: Layout, facts: MeasuredModel) -> StepTime | None:
    """None when the cluster's peak FLOP/s is unknown (CPU profiles)."""
    if not cfg.cluster.peak_flops:
        return None
    from hpctrain.config.shape import global_batch_size

    model_flops = facts.training_flops_per_sample() * global_batch_size(cfg)
    share = powersgd_share(cfg, facts)
    return timed_step(
        cfg,
        lay,
        model_flops,
        applied_ac(lay, facts),
        lambda seconds: data_parallel_comms(cfg, lay, facts.n_params, seconds, share),
    )
