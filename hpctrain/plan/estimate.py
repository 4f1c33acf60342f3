"""Memory per GPU and time per step of a run, computed from its typed config alone.

Must not import torch: ``hpctrain plan`` and the check before every submission run on login nodes.

Every model is estimated the same way, from its fact sheet (:class:`hpctrain.models.facts.ModelFacts`):
a built-in model's is declared by its spec (:meth:`hpctrain.models.spec.TransformerSpec.facts`), a user's
``_target_`` is measured by the caller (:mod:`hpctrain.submit.footprint`: parameters on the meta device,
activations on the CPU), so this package stays torch-free.

Memory is counted per rank, for the model as ``hpctrain.parallel.apply.parallelize`` lays it out
(:mod:`hpctrain.plan.memory`):

- **Model state** from each parameter tensor of the sheet, split as the real code splits it: tensor
  parallelism shards the dimension its role splits (the Megatron column/row dimensions and the vocabulary,
  Shoeybi et al. 2019), FSDP2 then cuts dimension 0 of each (TP-local) tensor into ``dp_shard`` chunks of
  ⌈n / dp_shard⌉ rows (``torch.chunk``), so the first data-parallel rank holds the most; a pipeline rank
  holds the tensors of its stages (a built-in's first stage the embeddings, the last the final norm and head
  and its copy of a tied embedding). Parameters and gradients are kept in the parameters' dtype (fp32 for
  the built-ins) in every precision (FSDP's mixed precision keeps fp32 master shards and reduces in fp32;
  autocast keeps fp32 parameters); AdamW keeps two states like each parameter and a 4-byte step count per
  tensor, SGD with momentum one buffer (Rajbhandari et al. 2020, ZeRO, section 3: 16 bytes per parameter
  for mixed-precision Adam, of which ZeRO-3 shards all).
- **Activations** (:mod:`hpctrain.plan.activations`): the bytes autograd and activation checkpointing keep
  from the forward for the backward, per micro-batch. Declared: from the operations of
  ``hpctrain.models.layers`` (which tensors each op saves, in which dtype; Korthikanti et al. 2022,
  "Reducing Activation Recomputation", section 4, count the same way for Megatron blocks: 34·s·b·h bytes per
  layer in 16 bits without checkpointing). Measured: the line through two batch sizes. Either times the
  micro-batches in flight: one without pipeline, ``pp − r`` on pipeline rank r under 1F1B and all of them
  under GPipe (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training", section 2.2),
  torch's warm-up count for the looped schedules.
- **Buffers**: communication and runtime memory outside the two above: DDP buckets, FSDP's all-gathered
  (unsharded) blocks and the prefetched next one, TP/SP gathers, pipeline receive buffers, autocast's
  low-precision weight copies, the loss's gradient, with activation checkpointing the one block being
  recomputed, and a model's registered buffers.

A safety reserve is kept on every GPU: :data:`CUDA_CONTEXT_GIB` for the CUDA context, cuBLAS/cuDNN
workspaces and NCCL's communicator buffers, and :data:`FRAGMENTATION` of the GPU's memory for the caching
allocator's fragmentation.

Time per step (:mod:`hpctrain.plan.time`): model FLOPs (declared:
``hpctrain.models.flops.flops_per_token``, 6N + 12·L·H·Q·T per token; measured: counted; plus a second
forward under full activation checkpointing) at ``cluster.achievable_mfu`` of the peak of the run's
precision (``cluster.peak_fp32_flops`` for fp32, ``cluster.peak_flops`` for bf16/fp16/fp8), the
communication of each strategy at :data:`COMM_EFFICIENCY` of the link bandwidth (ring collectives send
2(n−1)/n of the data per all-reduce and (n−1)/n per all-gather or reduce-scatter), data-parallel
communication hidden behind compute where it overlaps, and the pipeline bubble (pp − 1)/(m + pp − 1)
(Narayanan et al. 2021, section 2.2; divided by the stages per rank for the looped schedules).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpctrain.config.schema import PEAK_KEYS, Config
from hpctrain.errors import ConfigError
from hpctrain.models.builtin import model_spec
from hpctrain.models.facts import ModelFacts
from hpctrain.models.spec import ParamSpec
from hpctrain.plan.activations import block_activation_bytes, in_flight
from hpctrain.plan.layout import (
    CUDA_CONTEXT_GIB,
    FP32,
    FRAGMENTATION,
    GIB,
    MIB,
    Layout,
    declared_facts,
    layout_of,
    local_numel,
    rank_stages,
)
from hpctrain.plan.memory import RankMemory, model_state_numel, optimizer_bytes, rank_memory
from hpctrain.plan.time import StepTime, pipeline_bubble, step_time


# --------------------------------------------------------------------------------------------- verdict
@dataclass(frozen=True)
class Verdict:
    """Does the largest rank fit? ``kind``: gpu (GPU memory), host (host memory per process, from
    ``cluster.mem``) or none (nothing to compare with)."""

    kind: str
    capacity: int  # bytes per GPU, or per process
    reserve: int  # kept free (CUDA context and fragmentation; 0 for host memory)
    need: int
    fits: bool

    @property
    def usable(self) -> int:
        return self.capacity - self.reserve

    @property
    def margin(self) -> int:
        """Bytes left (negative: missing) after the reserve."""
        return self.usable - self.need

    @property
    def margin_pct(self) -> float:
        return 100.0 * self.margin / self.capacity if self.capacity else 0.0


_SLURM_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)


def slurm_mem_bytes(text: str | None) -> int | None:
    """Bytes of a Slurm ``--mem`` value (default unit MiB), None when absent or 0 (all of the node's)."""
    if text is None:
        return None
    match = _SLURM_MEM.match(text.strip())
    if not match:
        return None
    unit = {"": MIB, "K": 2**10, "M": MIB, "G": GIB, "T": 2**40}[match.group(2).upper()]
    value = int(float(match.group(1)) * unit)
    return value or None


def verdict(cfg: Config, mem: RankMemory) -> Verdict:
    c = cfg.cluster
    if c.gpus_per_node > 0 and c.gpu_memory_gib > 0:
        capacity = int(c.gpu_memory_gib * GIB)
        reserve = int(CUDA_CONTEXT_GIB * GIB + FRAGMENTATION * capacity)
        return Verdict("gpu", capacity, reserve, mem.total, mem.total <= capacity - reserve)
    node = slurm_mem_bytes(c.mem) if c.kind == "slurm" else None
    need = mem.total + mem.host
    if c.gpus_per_node == 0 and node:
        per_process = node // max(1, c.tasks_per_node)
        return Verdict("host", per_process, 0, need, need <= per_process)
    return Verdict("none", 0, 0, need, True)


# ------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Estimate:
    """Everything ``hpctrain plan`` prints about one config."""

    model: str  # e.g. "gpt"
    n_params: int  # distinct trainable parameters of the whole model
    world: int
    layout: Layout
    ranks: tuple[RankMemory, ...]  # one per pipeline rank (first data-parallel coordinate)
    largest: RankMemory
    verdict: Verdict
    time: StepTime | None
    facts: ModelFacts  # what the estimate is made of: declared, or measured of a user's model

    @property
    def measured(self) -> ModelFacts | None:
        """The facts when they were measured (a user's model), else None."""
        return self.facts if self.facts.measured is not None else None


def check_plan_inputs(cfg: Config) -> None:
    """The cluster's planning fields (validated here: they are only read here)."""
    c = cfg.cluster
    if c.gpu_memory_gib < 0:
        raise ConfigError("cluster.gpu_memory_gib", c.gpu_memory_gib, "must be ≥ 0 (0: no GPU)")
    if not 0.0 < c.achievable_mfu <= 1.0:
        raise ConfigError("cluster.achievable_mfu", c.achievable_mfu, "must be in (0, 1]", valid="e.g. 0.45")
    peaks = tuple(PEAK_KEYS.values())
    for key in ("intra_node_gbps", "inter_node_gbps", "storage_gbps", *peaks, "cost_per_gpu_hour"):
        value = getattr(c, key)
        if value is not None and value <= 0:  # NaN and inf: refused as every float key (config.sanity)
            raise ConfigError(f"cluster.{key}", value, "must be > 0", valid="a positive number, or null")


def estimate(cfg: Config, measured: ModelFacts | None = None) -> Estimate:
    """The plan of a validated config (``hpctrain.config.validate.validate``), from ``measured``, the facts
    measured of a model that declares no shapes (a user's), or else from the built-in model's declared
    sheet (a ConfigError for a model that has neither)."""
    check_plan_inputs(cfg)
    facts = declared_facts(cfg) if measured is None else measured
    lay = layout_of(cfg, tokens=facts.tokens_per_sample or 1)
    ranks = tuple(rank_memory(cfg, lay, r, facts) for r in range(lay.degrees.pp))
    largest = max(ranks, key=lambda m: (m.total, m.model_state))
    return Estimate(
        model=model_spec(cfg.model).name,
        n_params=facts.n_params,
        world=lay.shape.world_size,
        layout=lay,
        ranks=ranks,
        largest=largest,
        verdict=verdict(cfg, largest),
        time=step_time(cfg, lay, largest, facts),
        facts=facts,
    )


def gib(n: float) -> float:
    return n / GIB


def human_count(n: float) -> str:
    """1234567 → 1.2M, 6.4e9 → 6.4B."""
    for size, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= size:
            return f"{n / size:.1f}{suffix}"
    return f"{n:.0f}"


# The planner's public names, for hpctrain plan, the search, the measurement and the tests.
__all__ = [
    "CUDA_CONTEXT_GIB",
    "FP32",
    "FRAGMENTATION",
    "GIB",
    "MIB",
    "Estimate",
    "ParamSpec",
    "RankMemory",
    "block_activation_bytes",
    "estimate",
    "gib",
    "human_count",
    "in_flight",
    "layout_of",
    "local_numel",
    "model_state_numel",
    "optimizer_bytes",
    "pipeline_bubble",
    "rank_memory",
    "rank_stages",
    "slurm_mem_bytes",
]
