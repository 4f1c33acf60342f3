"""Memory per rank from the model's fact sheet (:class:`hpctrain.models.facts.ModelFacts`), declared or
measured: model state and the buffers of each strategy from the sheet's parameters, the activations from
its source (:mod:`hpctrain.plan.activations`). Torch-free; the method and its sources are in
:mod:`hpctrain.plan.estimate`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hpctrain.config.schema import Config
from hpctrain.models.facts import ModelFacts, ParamFact
from hpctrain.plan.activations import held as held_by_source
from hpctrain.plan.activations import in_flight
from hpctrain.plan.layout import FP32, HALF, MIB, Layout, declared_facts, local_numel, rank_stages

# The order a rank's buffers are listed in (the plan's table): the strategies' first, then what the
# model's tensors need.
BUFFERS = (
    "DDP buckets",
    "compression error feedback",
    "FSDP gathered parameters",
    "FSDP unreduced gradients",
    "FSDP reduce-scatter",
    "TP/SP collectives",
    "CP ring attention",
    "EP all-to-all",
    "autocast weight copies",
    "pipeline receive buffers",
    "loss gradients",
    "recomputed block",
    "model buffers",
)


@dataclass(frozen=True)
class RankMemory:
    """Bytes one rank holds at its peak (the start of the backward of its last in-flight micro-batch)."""

    pp_rank: int
    stages: tuple[int, ...]
    blocks: int  # blocks (FSDP units) on this rank
    param_numel: int  # this rank's parameter elements (local shards)
    param_tensors: int
    params: int  # on the device (0 when FSDP offloads them to the host)
    grads: int
    optimizer: int
    activations: int  # saved for backward, all micro-batches in flight
    in_flight: int  # micro-batches (stage-chunks for looped schedules) whose activations are held
    buffers: int
    host: int  # parameters, gradients and optimizer state offloaded to host memory (parallel.cpu_offload)
    parts: dict[str, int] = field(default_factory=dict)  # named parts of activations and buffers

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    @property
    def model_state(self) -> int:
        """Parameters + gradients + optimizer state wherever they live (device or host)."""
        return self.params + self.grads + self.optimizer + self.host


def stages_of(cfg: Config, lay: Layout, pp_rank: int) -> list[int]:
    d = lay.degrees
    return rank_stages(cfg.parallel.schedule, pp_rank, d.pp, lay.per_rank) if d.pp > 1 else [0]


def params_on(facts: ModelFacts, lay: Layout, stages: list[int]) -> list[ParamFact]:
    """The parameter tensors of the rank holding pipeline ``stages`` (all of them without a pipeline)."""
    if lay.degrees.pp == 1:
        return list(facts.params)
    held = set(stages)
    return [q for q in facts.params if q.stages is None or not held.isdisjoint(q.stages)]


@dataclass(frozen=True)
class RankParams:
    """What the parameter tensors of one rank add up to: the local shards (TP shard, then FSDP chunk) and
    the tensor-parallel-local sizes FSDP gathers and autocast copies."""

    tensors: int
    param_numel: int
    grad_numel: int
    param_bytes: int
    grad_bytes: int
    root: int  # TP-local elements of FSDP's root unit (what no block holds)
    units: tuple[int, ...]  # TP-local elements of each block (FSDP unit) on the rank, largest first
    n_units: int  # blocks on the rank
    autocast_copies: int  # TP-local elements of the tensors autocast keeps a 16-bit copy of
    trained_bytes: int = 0  # of param_bytes, what trains (the optimizer's state is shaped like it)
    trained_tensors: int = 0
    trained_numel: int = 0
    # TP-local elements with a gradient (all but frozen ones: LoRA's base) of the root and of each block,
    # largest first: what FSDP reduce-scatters (it reduces only the parameters that have a gradient).
    trained_root: int = 0
    trained_units: tuple[int, ...] = ()

    @property
    def unsharded(self) -> int:
        """Elements before FSDP sharding (after TP): what the rank's all-gathers assemble."""
        return self.root + sum(self.units)


def counted_params(facts: ModelFacts, lay: Layout, stages: list[int], shard_rank: int = 0) -> RankParams:
    """:class:`RankParams` of the rank holding ``stages`` at FSDP shard ``shard_rank``, in one pass.

    Gradients are shaped like their parameters except where a fact says otherwise
    (:attr:`ParamFact.whole_grad_under_tp`: the vocabulary-split embedding's gradient is whole under tensor
    parallelism without FSDP). An expert's grouped weight is split over the ep ranks
    (:attr:`ParamFact.ep_dim`), then sharded by FSDP over the ranks holding the same experts
    (``Degrees.expert_fsdp``); every other weight over ``Degrees.fsdp``. A frozen parameter (LoRA's base)
    has no gradient.
    """
    d = lay.degrees
    shards = d.fsdp if lay.sharded else 1
    expert_shards = d.expert_fsdp if lay.sharded else 1
    key = (id(facts), d.tp, d.ep, shards, shard_rank, tuple(stages) if d.pp > 1 else ())
    cached = _RANK_PARAMS.get(key)
    if cached is not None and cached[0] is facts:
        return cached[1]
    numel = grad_numel = param_bytes = grad_bytes = root = copies = 0
    trained_bytes = trained_tensors = trained_numel = trained_root = 0
    by_unit: dict[int, int] = {}
    trained_by_unit: dict[int, int] = {}
    mine = params_on(facts, lay, stages)
    for q in mine:
        if q.ep_dim is not None and d.ep > 1:
            split = list(q.shape)
            split[q.ep_dim] //= d.ep
            q = dataclasses.replace(q, shape=tuple(split))
            # shard_rank indexes dp_shard × ep × cp; the experts' group drops the ep index.
            expert_rank = d.expert_fsdp_index(shard_rank)
            local = local_numel(q, d.tp, expert_shards, expert_rank if lay.sharded else 0)
        else:
            local = local_numel(q, d.tp, shards, shard_rank)
        tp_local = local_numel(q, d.tp, 1, 0)
        whole = q.numel - tp_local if q.whole_grad_under_tp and d.tp > 1 and not lay.sharded else 0
        numel += local
        param_bytes += local * q.itemsize
        if q.trainable:
            grad_numel += local + whole
            grad_bytes += (local + whole) * q.itemsize
            trained_bytes += local * q.itemsize
            trained_numel += local
            trained_tensors += 1
            if q.unit >= 0:
                trained_by_unit[q.unit] = trained_by_unit.get(q.unit, 0) + tp_local
            else:
                trained_root += tp_local
        if q.unit >= 0:
            by_unit[q.unit] = by_unit.get(q.unit, 0) + tp_local
        else:
            root += tp_local
        if q.autocast_copy:
            copies += tp_local
    units = tuple(sorted((u for u in by_unit.values() if u), reverse=True))
    trained_units = tuple(sorted((u for u in trained_by_unit.values() if u), reverse=True))
    found = RankParams(
        len(mine),
        numel,
        grad_numel,
        param_bytes,
        grad_bytes,
        root,
        units,
        len(by_unit),
        copies,
        trained_bytes,
        trained_tensors,
        trained_numel,
        trained_root,
        trained_units,
    )
    # The search estimates many variants (checkpointing, micro-batch sizes) of each split: count it once.
    if len(_RANK_PARAMS) >= 4096:
        _RANK_PARAMS.clear()
    _RANK_PARAMS[key] = (facts, found)
    return found


_RANK_PARAMS: dict[tuple[int, ...], tuple[ModelFacts, RankParams]] = {}


@dataclass(frozen=True)
class ModelState:
    """Elements of one rank's local parameter and gradient tensors (TP shard, then FSDP chunk)."""

    param_numel: int
    grad_numel: int
    tensors: int
    trained_numel: int  # what the optimizer keeps state for (all but frozen parameters)
    trained_tensors: int


def model_state_numel(
    cfg: Config, lay: Layout, pp_rank: int, shard_rank: int = 0, facts: ModelFacts | None = None
) -> ModelState:
    """The local shards of pipeline rank ``pp_rank`` at FSDP shard ``shard_rank`` (of the built-in model's
    declared sheet unless ``facts`` are given)."""
    facts = declared_facts(cfg) if facts is None else facts
    counted = counted_params(facts, lay, stages_of(cfg, lay, pp_rank), shard_rank)
    return ModelState(
        counted.param_numel,
        counted.grad_numel,
        counted.tensors,
        counted.trained_numel,
        counted.trained_tensors,
    )


def rank_state_bytes(
    cfg: Config, lay: Layout, pp_rank: int, shard_rank: int, facts: ModelFacts | None = None
) -> dict[str, int]:
    """The bytes of one rank's parameters, gradients and optimizer state, by its pipeline and FSDP
    coordinates: what a measurement (``hpctrain.verify.plan_measure``) reads off that rank's sharded tensors
    after a real step. ``sharded_grads``: one gradient like each trained parameter's local shard, what a
    rehearsal (``hpctrain.task.rehearse``, no backward) holds; ``grads`` adds what a backward makes whole
    (the vocabulary-parallel embedding's gradient under TP without FSDP, ``whole_grad_under_tp``)."""
    state = model_state_numel(cfg, lay, pp_rank, shard_rank, facts)
    return {
        "params": FP32 * state.param_numel,
        "grads": FP32 * state.grad_numel,
        "sharded_grads": FP32 * state.trained_numel,
        "optimizer": optimizer_bytes(cfg, state.trained_numel, state.trained_tensors),
    }


def optimizer_state(cfg: Config, param_bytes: int, tensors: int) -> int:
    """AdamW: exp_avg and exp_avg_sq like each parameter and a 4-byte fp32 ``step`` per tensor (on the host
    for CUDA parameters unless fused/capturable); SGD: one momentum buffer when momentum > 0."""
    if cfg.optim.name == "adamw":
        return 2 * param_bytes + FP32 * tensors
    return param_bytes if cfg.optim.momentum > 0 else 0


def optimizer_bytes(cfg: Config, numel: int, tensors: int) -> int:
    """:func:`optimizer_state` of ``numel`` fp32 parameter elements."""
    return optimizer_state(cfg, FP32 * numel, tensors)


def fsdp_buffers(cfg: Config, lay: Layout, counted: RankParams) -> dict[str, int]:
    """FSDP2's unsharded parameters and gradients of a rank, its units being the blocks (each parameter's
    :attr:`ParamFact.unit`) and the root (the rest: embeddings, final norm, head)."""
    param_bytes = HALF if lay.regime == "fsdp_mixed" else FP32
    units, root = counted.units, counted.root
    # Gradients, and so the reduce-scatter, only of what trains (a LoRA run's base has none).
    reduced = max(counted.trained_units, default=counted.trained_root)
    buffers: dict[str, int] = {}
    if lay.degrees.pp > 1:
        # torch.distributed.pipelining turns off FSDP's resharding after backward and its gradient
        # reduction for all but the last micro-batch: once a block has run a backward it stays gathered,
        # and its unreduced gradient accumulates whole (in the fp32 reduce dtype) until the step's end.
        buffers["FSDP gathered parameters"] = (sum(units) + root) * param_bytes
        buffers["FSDP unreduced gradients"] = (sum(counted.trained_units) + counted.trained_root) * FP32
        # There the unreduced gradients above are the computed ones; the flat fp32 reduce-scatter input.
        buffers["FSDP reduce-scatter"] = reduced * FP32
        return buffers
    # ZeRO-3: the block running and the next one, prefetched; ZeRO-2 keeps every block gathered from its
    # forward to its backward. The root unit (embeddings, head) is not resharded after the forward.
    held = units[: 2 if cfg.parallel.reshard_after_forward else len(units)]
    buffers["FSDP gathered parameters"] = (sum(held) + root) * param_bytes
    # The unsharded gradients of the unit being reduced and of the one being computed, in the parameters'
    # dtype, and the flat fp32 reduce-scatter input.
    buffers["FSDP reduce-scatter"] = reduced * (2 * param_bytes + FP32)
    return buffers


def rank_memory(cfg: Config, lay: Layout, pp_rank: int, facts: ModelFacts | None = None) -> RankMemory:
    """The memory of pipeline rank ``pp_rank`` at its first data-parallel (and any tensor-parallel)
    coordinate: FSDP's first shard rank holds the most (⌈n / dp_shard⌉ rows of every tensor). Of the
    built-in model's declared sheet unless ``facts`` are given."""
    facts = declared_facts(cfg) if facts is None else facts
    p, d = cfg.parallel, lay.degrees
    stages = stages_of(cfg, lay, pp_rank)
    counted = counted_params(facts, lay, stages)
    params, grads = counted.param_bytes, counted.grad_bytes
    optimizer = optimizer_state(cfg, counted.trained_bytes, counted.trained_tensors)
    flying = in_flight(p.schedule, d.pp, pp_rank, lay.microbatches, lay.per_rank)
    by_source = held_by_source(cfg, lay, facts, stages, counted.n_units, flying)
    buffers = dict(by_source.buffers)
    if d.dp_replicate > 1 and not lay.sharded:  # DDP
        buffers["DDP buckets"] = round(2 * p.bucket_cap_mb * MIB)  # one reducing, one filling (or compressed)
        if not p.gradient_as_bucket_view:
            buffers["DDP buckets"] += grads  # the buckets are a second copy of the gradients
        if p.compression in ("powersgd", "topk"):
            buffers["compression error feedback"] = grads  # what was not sent, kept per parameter
    if lay.sharded:
        buffers.update(fsdp_buffers(cfg, lay, counted))
    if lay.regime == "autocast" and counted.autocast_copies:
        # Autocast caches a 16-bit copy of each weight a linear or conv reads (TP-local, whole under FSDP).
        buffers["autocast weight copies"] = counted.autocast_copies * HALF
    if facts.buffer_bytes:
        buffers["model buffers"] = facts.buffer_bytes
    host = 0
    if p.cpu_offload and lay.sharded:
        host, params, grads, optimizer = params + grads + optimizer, 0, 0, 0
    ordered = {name: buffers[name] for name in BUFFERS if name in buffers}
    ordered.update(buffers)  # any other after them
    return RankMemory(
        pp_rank=pp_rank,
        stages=tuple(stages),
        blocks=counted.n_units,
        param_numel=counted.param_numel,
        param_tensors=counted.tensors,
        params=params,
        grads=grads,
        optimizer=optimizer,
        activations=sum(by_source.activations.values()),
        in_flight=flying,
        buffers=sum(ordered.values()),
        host=host,
        parts={**by_source.activations, **ordered},
    )
