"""Time per step: compute at the achievable MFU, each strategy's communication, the pipeline bubble, from
the model's fact sheet (declared or measured). Torch-free; the method and its sources are in
:mod:`hpctrain.plan.estimate`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from hpctrain.config.schema import Config
from hpctrain.models.facts import ModelFacts
from hpctrain.plan.activations import applied_ac, model_parallel_volumes
from hpctrain.plan.layout import (
    BACKWARD_SHARE,
    COMM_EFFICIENCY,
    FP32,
    HALF,
    LOOPED_SCHEDULES,
    SELECTIVE_RECOMPUTE,
    Layout,
)
from hpctrain.plan.memory import RankMemory, counted_params
from hpctrain.precision import float8_converts, matmul_peak


# ------------------------------------------------------------------------------------------------ time
@dataclass(frozen=True)
class Comm:
    """One kind of communication of a step, per rank."""

    name: str
    bytes: float  # sent per rank per step
    seconds: float | None  # at the group's bandwidth (None: bandwidth unknown)
    exposed_s: float | None  # what is not hidden behind compute
    link: str  # NVLink | InfiniBand | "" (unknown)


@dataclass(frozen=True)
class StepTime:
    flops_per_step: float  # model FLOPs of one optimizer step, all ranks (6N + 12·L·H·Q·T per token)
    executed_flops: float  # with the recomputation of full activation checkpointing
    compute_s: float  # per rank at the achievable MFU
    bubble: float  # fraction of the step a pipeline rank idles
    comms: tuple[Comm, ...]
    step_s: float
    samples_per_s: float
    tokens_per_s: float
    mfu: float  # model FLOPs / (step time × ranks × peak): the peak of the run's precision (fp8: bf16's)
    gpu_hours: float  # for trainer.max_steps
    cost: float | None  # gpu_hours × cluster.cost_per_gpu_hour
    float8_share: float = 0.0  # of the model FLOPs, those priced at cluster.peak_fp8_flops (fp8 runs)
    peak_kind: str = "bf16"  # which peak prices the other matmuls (hpctrain.precision.matmul_peak)
    peak: float = 0.0  # that peak, FLOP/s of one device

    def rate(self, unit: str) -> float:
        """Throughput in ``unit`` per second (a model's throughput unit: tokens or samples)."""
        return float(getattr(self, f"{unit}_per_s"))


def ranks_per_node(cfg: Config) -> int:
    c = cfg.cluster
    return c.nproc if c.kind == "local" else c.tasks_per_node


def group_bandwidth(cfg: Config, size: int, stride: int) -> tuple[float | None, str]:
    """Bus bandwidth (bytes/s) of one group of the mesh, whose ranks are ``stride`` apart.

    Ranks fill nodes in order (the mesh is pp × dp_replicate × dp_shard × tp, tp innermost). A group inside a
    node uses NVLink. One that spans nodes is bound by the nodes' network links, which every group of that
    mesh dimension on a node shares at once: a group with k ranks per node gets k / ranks-per-node of it
    (a ring over whole nodes gets all of it, as in nccl-tests).
    """
    c = cfg.cluster
    per_node = ranks_per_node(cfg)
    members = 1 if stride >= per_node else min(size, per_node // stride)
    if size <= members:
        if c.intra_node_gbps is None:
            return None, "NVLink"
        return c.intra_node_gbps * 1e9 / 8 * COMM_EFFICIENCY, "NVLink"
    if c.inter_node_gbps is None:
        return None, "InfiniBand"
    return c.inter_node_gbps * 1e9 / 8 * COMM_EFFICIENCY * members / per_node, "InfiniBand"


def _comm(cfg: Config, name: str, volume: float, size: int, stride: int, hidden_behind: float) -> Comm:
    bandwidth, link = group_bandwidth(cfg, size, stride)
    if bandwidth is None:
        return Comm(name, volume, None, None, link)
    seconds = volume / bandwidth
    return Comm(name, volume, seconds, max(0.0, seconds - hidden_behind), link)


def communication(
    cfg: Config, lay: Layout, mem: RankMemory, facts: ModelFacts, compute_s: float
) -> list[Comm]:
    """What one rank sends per step, by strategy (ring collectives: all-reduce 2(n−1)/n × size, all-gather
    and reduce-scatter (n−1)/n × size, each size being the whole tensor the group assembles): the
    data-parallel collectives of the rank's parameters, and the tensor- and pipeline-parallel traffic the
    sheet's activation source gives (:func:`hpctrain.plan.activations.model_parallel_volumes`)."""
    d = lay.degrees
    whole = counted_params(facts, lay, list(mem.stages)).unsharded
    share = facts.powersgd_share(cfg.parallel.powersgd_rank)
    comms = data_parallel_comms(cfg, lay, whole, compute_s, share)
    groups = {  # (size, stride)
        "TP collectives": (d.tp, 1),
        "CP ring": (d.cp, d.stride("cp")),
        "EP all-to-all": (d.ep, d.stride("ep")),
        "PP send/receive": (d.pp, d.stride("pp")),
    }
    for name, volume in model_parallel_volumes(lay, facts, mem.blocks, mem.stages).items():
        size, stride = groups[name]
        comms.append(_comm(cfg, name, volume, size, stride, 0.0))
    return comms


def data_parallel_comms(
    cfg: Config, lay: Layout, whole: int, compute_s: float, powersgd_factor: float
) -> list[Comm]:
    """DDP's, FSDP's and HSDP's communication for ``whole`` parameter elements per rank (before FSDP's
    sharding); ``powersgd_factor``: the share of the gradient bytes PowerSGD sends."""
    p, d = cfg.parallel, lay.degrees
    comms: list[Comm] = []
    forward_passes = lay.shape.forward_passes
    shard_stride, replicate_stride = d.stride("dp_shard"), d.stride("dp_replicate")
    if d.dp_replicate > 1 and not lay.sharded:
        n = d.dp_replicate
        grad_bytes = whole * FP32
        # fp16/bf16 hooks halve the bytes. Top-k all-gathers k fp32 values and int64 indices per rank:
        # (n − 1)·12·ratio bytes per element against the all-reduce's 2(n − 1)/n·4. PowerSGD all-reduces
        # P (a × r) and Q (b × r) for each a × b matrix: r(a + b)/(ab), about 2r/d for square blocks.
        factor = {"fp16": 0.5, "bf16": 0.5, "topk": 1.5 * p.topk_ratio * n}.get(p.compression, 1.0)
        if p.compression == "powersgd":
            factor = powersgd_factor
        volume = 2 * (n - 1) / n * grad_bytes * factor
        # DDP all-reduces each bucket as soon as its gradients are ready: it overlaps the backward.
        comms.append(_comm(cfg, "DDP all-reduce", volume, n, replicate_stride, BACKWARD_SHARE * compute_s))
    if lay.sharded:
        # FSDP's group: dp_shard × ep × cp flattened (adjacent in the mesh: the innermost one's stride).
        n = d.fsdp
        shard_stride = min(d.stride(dim) for dim in ("dp_shard", "ep", "cp") if getattr(d, dim) > 1)
        param_bytes = HALF if lay.regime == "fsdp_mixed" else FP32
        if d.pp > 1:
            # Under the pipeline a block stays gathered after its backward (see rank_memory): gathered once
            # for the first forward, then again for each backward under ZeRO-3; reduced once per pass.
            gathers = lay.passes + lay.shape.forward_passes if p.reshard_after_forward else lay.passes
        else:
            gathers = (2 if p.reshard_after_forward else 1) * forward_passes
        reduces = lay.passes
        gather = gathers * (n - 1) / n * whole * param_bytes
        reduce = reduces * (n - 1) / n * whole * FP32
        # FSDP2 prefetches the next block's all-gather during this block's compute, and reduce-scatters
        # during the backward: all of it can hide behind compute.
        fsdp = _comm(cfg, "FSDP all-gather + reduce-scatter", gather + reduce, n, shard_stride, compute_s)
        comms.append(fsdp)
        if d.dp_replicate > 1:
            # HSDP then all-reduces each shard over the replicas, in the backward too: it hides in what
            # compute the FSDP traffic left over.
            r = d.dp_replicate
            volume = lay.passes * 2 * (r - 1) / r * whole / n * FP32
            window = max(0.0, compute_s - (fsdp.seconds or 0.0))
            comms.append(_comm(cfg, "HSDP all-reduce", volume, r, replicate_stride, window))
    return comms


def pipeline_bubble(schedule: str, pp: int, microbatches: int, per_rank: int) -> float:
    """Fraction of a pipelined step spent idle: (pp − 1)/(m + pp − 1) for GPipe and 1F1B; the looped
    schedules divide the bubble by their stages per rank (Narayanan et al. 2021, section 2.2.2)."""
    if pp <= 1:
        return 0.0
    bubble = (pp - 1) / (per_rank if schedule in LOOPED_SCHEDULES else 1)
    return bubble / (microbatches + bubble)


def step_time(cfg: Config, lay: Layout, mem: RankMemory, facts: ModelFacts) -> StepTime | None:
    """None when the cluster's peak FLOP/s for the run's precision is unknown (CPU profiles, or a profile
    that states only another precision's peak)."""
    if not cfg.cluster.peak(matmul_peak(cfg.trainer.precision)):
        return None
    model_flops = facts.training_flops(lay.shape.global_batch_size)
    ac = applied_ac(lay, facts)
    comms = lambda seconds: communication(cfg, lay, mem, facts, seconds)  # noqa: E731
    return timed_step(cfg, lay, model_flops, ac, comms, float8_share(cfg, facts))


def float8_share(cfg: Config, facts: ModelFacts) -> float:
    """The share of the model's FLOPs that ``trainer.precision=fp8`` runs in float8: 6 FLOPs per weight per
    position (forward and both backward matmuls) of the blocks' Linear layers that
    :func:`hpctrain.precision.float8_converts` picks (the layers hpctrain converts), over all model FLOPs.
    0 for other precisions, or when the profile names no ``cluster.peak_fp8_flops`` to price them at."""
    if cfg.trainer.precision != "fp8" or not cfg.cluster.peak_fp8_flops:
        return 0.0
    linear = sum(
        p.shape[0] * p.shape[1]
        for p in facts.params
        if p.unit >= 0 and not p.copy and len(p.shape) == 2 and float8_converts(p.shape[0], p.shape[1])
    )
    if facts.flops_per_token is not None:  # declared
        return 6 * linear / facts.flops_per_token
    return 6 * linear * (facts.tokens_per_sample or 1) / facts.training_flops(1)


def timed_step(
    cfg: Config,
    lay: Layout,
    model_flops: float,
    ac: str,
    comms_of: Callable[[float], list[Comm]],
    fp8_share: float = 0.0,
) -> StepTime:
    """The step of ``model_flops`` (forward and backward, all ranks) under checkpointing ``ac`` (as
    applied: "none" where it applies to nothing), its communication ``comms_of(compute seconds)``;
    ``fp8_share`` of the FLOPs run at ``cluster.peak_fp8_flops``, the rest at the peak of the run's
    precision (:func:`hpctrain.precision.matmul_peak`: an fp32 run's at ``cluster.peak_fp32_flops``, a
    bf16, fp16 or fp8 run's at ``cluster.peak_flops``), so an fp32 step is not priced at tensor-core speed."""
    c = cfg.cluster
    kind = matmul_peak(cfg.trainer.precision)
    peak = c.peak(kind)
    assert peak
    samples = lay.shape.global_batch_size
    tokens = samples * lay.tokens
    # Full checkpointing runs each block's forward again in the backward: one third more (the forward is 2
    # of the 6 FLOPs per parameter per token). Selective recomputes only element-wise work.
    executed = model_flops * (4 / 3 if ac == "full" else 1.0)
    ranks = lay.shape.world_size
    seconds_per_flop = (1 - fp8_share) / peak + (fp8_share / c.peak_fp8_flops if fp8_share else 0.0)
    compute_s = executed / ranks * seconds_per_flop / c.achievable_mfu
    if ac == "selective":
        compute_s *= 1 + SELECTIVE_RECOMPUTE
    comms = comms_of(compute_s)
    blocking = sum(x.exposed_s or 0.0 for x in comms if x.name.startswith(("TP", "PP")))
    hidden = sum(x.exposed_s or 0.0 for x in comms if not x.name.startswith(("TP", "PP")))
    bubble = pipeline_bubble(cfg.parallel.schedule, lay.degrees.pp, lay.microbatches, lay.per_rank)
    step_s = (compute_s + blocking) / (1 - bubble) + hidden
    gpu_hours = step_s * cfg.trainer.max_steps * ranks / 3600
    return StepTime(
        flops_per_step=model_flops,
        executed_flops=executed,
        compute_s=compute_s,
        bubble=bubble,
        comms=tuple(comms),
        step_s=step_s,
        samples_per_s=samples / step_s,
        tokens_per_s=tokens / step_s,
        mfu=model_flops / (step_s * ranks * peak),
        gpu_hours=gpu_hours,
        cost=gpu_hours * c.cost_per_gpu_hour if c.cost_per_gpu_hour is not None else None,
        float8_share=fp8_share,
        peak_kind=kind,
        peak=peak,
    )
