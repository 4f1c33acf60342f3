"""Memory per rank and time per step of a model that declares no shapes (a user's ``_target_``), from the
facts :mod:`hpctrain.train.footprint` measured (:class:`hpctrain.models.facts.MeasuredModel`). Torch-free:
the caller measures, this module only counts.

Such a model splits over data-parallel ranks only (tensor and pipeline parallelism need declarations it
does not have: :meth:`hpctrain.models.spec.ModelSpec.check_layout` refuses them), so one rank stands for
all, FSDP's first shard rank holding the most. Model state is counted as for the built-ins
(:mod:`hpctrain.plan.memory`) from each parameter's exact shape and dtype: gradients like the parameters,
AdamW's two states like them plus a 4-byte step per tensor, SGD's momentum buffer; FSDP2 cuts dimension 0
of each tensor into ⌈n / dp_shard⌉ rows. The FSDP units are the blocks :mod:`hpctrain.parallel.blocks`
finds (the model as one unit when it finds none): ZeRO-3 gathers the running block, the prefetched next
one and the root. Activations are the measured line (fixed + per sample) at ``trainer.micro_batch_size``,
in the layout's precision regime, and the loss's gradients (the logits' bytes, and fp32 log-probabilities
like them) as a buffer; under full checkpointing the measured bytes outside the blocks plus
their inputs, and the block being recomputed as a buffer. Selective checkpointing of a user's block keeps
the matmul outputs and recomputes the rest: not measured, the full measurement is its upper bound.
FLOPs: counted in the measured forward and backward, else 6·N per token (or per sample).
"""

from __future__ import annotations

from hpctrain.config.schema import Config
from hpctrain.models.facts import MeasuredModel, ParamFact
from hpctrain.models.spec import ParamSpec
from hpctrain.plan.layout import FP32, HALF, MIB, Layout, local_numel
from hpctrain.plan.memory import RankMemory
from hpctrain.plan.time import StepTime, data_parallel_comms, timed_step


def applied_ac(lay: Layout, facts: MeasuredModel) -> str:
    """The checkpointing that takes effect: none where no blocks were found to wrap."""
    return lay.ac if facts.blocks else "none"


def _local(p: ParamFact, shards: int) -> int:
    return local_numel(ParamSpec(p.name, p.shape), 1, shards, 0)


def user_rank_memory(cfg: Config, lay: Layout, facts: MeasuredModel) -> RankMemory:
    p, d = cfg.parallel, lay.degrees
    shards = d.dp_shard if lay.sharded else 1
    numel = sum(_local(q, shards) for q in facts.params)
    params = sum(_local(q, shards) * q.itemsize for q in facts.params)
    grads = params
    tensors = len(facts.params)
    if cfg.optim.name == "adamw":
        optimizer = 2 * params + FP32 * tensors
    else:
        optimizer = params if cfg.optim.momentum > 0 else 0
    ac = applied_ac(lay, facts)
    acts = facts.activations_in(lay.regime)
    parts: dict[str, int] = {}
    buffers: dict[str, int] = {}
    if acts is not None:
        line = acts.checkpointed if ac == "full" else acts.saved
        parts["saved for backward"] = line.at(lay.micro_batch)
        if ac == "full":
            buffers["recomputed block"] = acts.recompute.at(lay.micro_batch)
        # The loss's backward: the gradient of the logits (their dtype) and of its fp32 log-probabilities.
        logits = acts.output.at(lay.micro_batch)
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
        units = [facts.unit_numel(k) for k in range(facts.blocks)]
        root = facts.unit_numel(-1)
        largest = max(units, default=root)
        held = sorted(units, reverse=True)[: 2 if p.reshard_after_forward else len(units)]
        buffers["FSDP gathered parameters"] = (sum(held) + root) * param_bytes
        buffers["FSDP reduce-scatter"] = largest * (2 * param_bytes + FP32)
    host = 0
    if p.cpu_offload and lay.sharded:
        host, params, grads, optimizer = params + grads + optimizer, 0, 0, 0
    return RankMemory(
        pp_rank=0,
        stages=(0,),
        blocks=facts.blocks,
        param_numel=numel,
        param_tensors=tensors,
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=sum(parts.values()),
        in_flight=1,
        buffers=sum(buffers.values()),
        host=host,
        parts={**parts, **buffers},
    )


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
