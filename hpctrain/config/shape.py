"""The shape of a run: every number derived from a config, computed once. Torch-free.

:func:`run_shape` turns a validated config into a frozen :class:`RunShape` (world size, mesh degrees,
data-parallel size, pipeline stages, samples per pass, global batch). Validation, the
planner, the trainer and the reports read it; nothing else re-derives these numbers.

The device mesh is ``pp × dp_replicate × dp_shard × ep × cp × tp`` (outermost first, torchtitan's order):
tensor parallelism, the chattiest, stays innermost so its ranks are neighbours (one node, NVLink); context
parallelism's ring (a block of keys and values per attention layer and step) next to it; expert
parallelism's all-to-all among data-parallel neighbours; pipeline parallelism, which only sends activations
between neighbouring stages, is outermost and crosses nodes.

Expert parallelism places a mixture-of-experts model's experts on ``ep`` ranks that train different samples
(data-parallel ranks, as torchtitan and DeepSpeed-MoE borrow it from data parallelism): the data-parallel
size is ``dp_replicate × dp_shard × ep``. Context parallelism splits each sample's sequence over ``cp``
ranks that train the same samples. The gradients of a weight every rank holds are averaged over every rank
that saw other tokens of the step (``dp_shard × ep × cp``: FSDP over them, :attr:`Degrees.fsdp`), an
expert's over the ranks that hold the same expert (``dp_shard × cp``: :attr:`Degrees.expert_fsdp`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.config.schema import Config, ParallelConfig
from hpctrain.errors import ConfigError
from hpctrain.precision import regime

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "ep", "cp", "tp")

# The mesh dimensions each strategy has. Every other dimension has size 1.
STRATEGY_DIMS: dict[str, tuple[str, ...]] = {
    "none": (),
    "ddp": ("dp_replicate",),
    "fsdp": ("dp_shard",),
    "hsdp": ("dp_replicate", "dp_shard"),
    "tp": ("tp",),
    "pp": ("pp",),
    "2d": ("dp_shard", "tp"),
    "3d": ("pp", "dp_shard", "tp"),
    "cp": ("cp",),
    "4d": ("pp", "dp_shard", "cp", "tp"),
}
# Dimensions a strategy may add, given (never derived): expert and context parallelism. Both need FSDP over
# the ranks that see other tokens (a rank's gradients are partial sums), so only the strategies that shard
# (or CP's own) take them.
EXTRA_DIMS = ("ep", "cp")
TAKES_EXTRA = ("fsdp", "hsdp", "2d", "3d", "4d", "cp")

# Pipeline schedules (torch.distributed.pipelining) → how many stages each rank holds (0: any number ≥ 2).
PIPELINE_SCHEDULES = {
    "gpipe": 1,
    "1f1b": 1,
    "interleaved_1f1b": 0,
    "interleaved_zero_bubble": 0,
    "zbv_zero_bubble": 2,
}


@dataclass(frozen=True)
class Degrees:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1
    ep: int = 1
    cp: int = 1

    @property
    def dp(self) -> int:
        """Data-parallel size: how many different slices of each global batch are processed at once (expert
        parallel ranks train different samples)."""
        return self.dp_replicate * self.dp_shard * self.ep

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.cp * self.tp

    @property
    def fsdp(self) -> int:
        """Ranks FSDP shards a weight every rank holds over (and averages its gradients over, times the
        replicas): every rank of a replica that saw other tokens of the step."""
        return self.dp_shard * self.ep * self.cp

    @property
    def expert_fsdp(self) -> int:
        """Ranks FSDP shards an expert over: those holding the same experts (the ep ranks hold others)."""
        return self.dp_shard * self.cp

    @property
    def token_ranks(self) -> int:
        """Ranks whose tokens differ in a step (a router's counts are summed over them): data and context
        parallel; tensor- and pipeline-parallel peers see the same tokens."""
        return self.dp * self.cp

    def dp_index(self, replicate: int, shard: int, expert: int) -> int:
        """The data-parallel index (which slice of each global batch) of the rank at these coordinates of
        dp_replicate, dp_shard and ep (row-major, as the mesh)."""
        return (replicate * self.dp_shard + shard) * self.ep + expert

    def fsdp_index(self, shard: int, expert: int, context: int) -> int:
        """A rank's index in FSDP's group (dp_shard × ep × cp flattened, row-major as the mesh): which
        chunk of every dense weight it holds."""
        return (shard * self.ep + expert) * self.cp + context

    def expert_fsdp_index(self, fsdp_index: int) -> int:
        """The rank at ``fsdp_index``'s index among the ranks holding the same experts (dp_shard × cp, the
        ep coordinate dropped): which chunk of its experts it holds."""
        return (fsdp_index // (self.ep * self.cp)) * self.cp + fsdp_index % self.cp

    def stride(self, dim: str) -> int:
        """How many ranks apart two neighbours of mesh dimension ``dim`` are (the mesh is row-major in
        :data:`MESH_DIMS` order: tp innermost)."""
        inner = MESH_DIMS[MESH_DIMS.index(dim) + 1 :]
        return math.prod(getattr(self, d) for d in inner)

    def sizes(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in MESH_DIMS}

    def __str__(self) -> str:
        return " × ".join(f"{name}={size}" for name, size in self.sizes().items() if size > 1) or "1 process"


def resolve_degrees(parallel: ParallelConfig, world_size: int) -> Degrees:
    """The degree of every mesh dimension for ``parallel`` on ``world_size`` ranks, or a ConfigError.

    A strategy's dimensions are given (> 0) or derived (0); one derived dimension takes whatever the given
    ones leave of the world size. Dimensions the strategy does not have must stay 0 or 1.
    """
    name = parallel.name
    if name not in STRATEGY_DIMS:
        raise ConfigError("parallel", name, "not a known choice", valid=", ".join(STRATEGY_DIMS))
    dims = STRATEGY_DIMS[name]
    for dim in MESH_DIMS:
        value = getattr(parallel, dim)
        if value < 0:
            raise ConfigError(f"parallel.{dim}", value, "must be ≥ 0 (0: derived from the world size)")
        extra = dim in EXTRA_DIMS and name in TAKES_EXTRA
        if dim not in dims and value > 1 and not extra:
            having = [
                s for s, d in STRATEGY_DIMS.items() if dim in d or (dim in EXTRA_DIMS and s in TAKES_EXTRA)
            ]
            raise ConfigError(
                f"parallel.{dim}", value, f"parallel={name} has no {dim} dimension", valid=", ".join(having)
            )
    given = {dim: getattr(parallel, dim) for dim in dims if getattr(parallel, dim) > 0}
    # The extra dimensions a strategy takes are given or 1, never derived.
    given.update({d: getattr(parallel, d) for d in EXTRA_DIMS if d not in dims and getattr(parallel, d) > 1})
    open_dims = [dim for dim in dims if dim not in given]
    product = math.prod(given.values())
    spelled = " × ".join(f"{d}={v}" for d, v in given.items())
    if len(open_dims) > 1:
        raise ConfigError(
            f"parallel.{open_dims[0]}",
            0,
            f"parallel={name} can derive only one of {', '.join(open_dims)} from the world size",
            valid="give all but one of them",
        )
    if open_dims:
        if world_size % product:
            # Name a degree that does not divide the world size itself, else the last one given.
            culprit = next((d for d, v in given.items() if world_size % v), list(given)[-1])
            raise ConfigError(
                f"parallel.{culprit}",
                given[culprit],
                f"world size {world_size} is not divisible by {spelled} = {product}",
                valid=f"degrees whose product divides {world_size}",
            )
        given[open_dims[0]] = world_size // product
    elif product != world_size:
        raise ConfigError(
            "parallel",
            name,
            f"world size {world_size} ≠ {spelled or '1'} = {product}",
            valid=f"degrees whose product is {world_size}",
        )
    return Degrees(**given)


def world_size(cfg: Config) -> int:
    c = cfg.cluster
    return c.nproc if c.kind == "local" else c.nodes * c.tasks_per_node


def degrees(cfg: Config) -> Degrees:
    return resolve_degrees(cfg.parallel, world_size(cfg))


def stages_per_rank(parallel: ParallelConfig) -> int:
    """Pipeline stages each rank holds: as configured, or what the schedule needs."""
    if parallel.stages_per_rank:
        return parallel.stages_per_rank
    return PIPELINE_SCHEDULES.get(parallel.schedule, 1) or 2


def samples_per_pass(cfg: Config) -> int:
    """Samples all data-parallel ranks process in one forward/backward pass of the whole model: a micro-batch
    each, or under a pipeline one micro-batch per pipeline micro-batch."""
    d = degrees(cfg)
    pipeline = cfg.parallel.microbatches if d.pp > 1 else 1
    return cfg.trainer.micro_batch_size * d.dp * pipeline


def global_batch_size(cfg: Config) -> int:
    """Samples per optimizer step: as configured, or one pass (no gradient accumulation)."""
    return cfg.trainer.global_batch_size or samples_per_pass(cfg)


@dataclass(frozen=True)
class RunShape:
    """Every derived number of a run. ``microbatches`` is the pipeline's (1 without a pipeline)."""

    world_size: int
    degrees: Degrees
    stages_per_rank: int
    microbatches: int
    micro_batch_size: int
    global_batch_size: int
    regime: str  # the precision regime (hpctrain.precision): fp32 | autocast | fsdp_mixed

    @property
    def dp(self) -> int:
        return self.degrees.dp

    @property
    def n_stages(self) -> int:
        return self.degrees.pp * self.stages_per_rank if self.degrees.pp > 1 else 1

    @property
    def samples_per_pass(self) -> int:
        """Samples of one forward/backward pass over all data-parallel ranks."""
        return self.micro_batch_size * self.dp * self.microbatches

    @property
    def rank_samples_per_pass(self) -> int:
        """This data-parallel rank's samples per pass."""
        return self.samples_per_pass // self.dp

    @property
    def rank_samples_per_step(self) -> int:
        """This data-parallel rank's samples per optimizer step."""
        return self.global_batch_size // self.dp

    @property
    def forward_passes(self) -> int:
        """Forward passes a rank runs per optimizer step: passes × pipeline micro-batches."""
        return self.passes * self.microbatches

    @property
    def passes(self) -> int:
        """Forward/backward passes per optimizer step (gradient accumulation); at least one."""
        return max(1, self.global_batch_size // self.samples_per_pass)

    @property
    def loss_holders(self) -> int:
        """Ranks that compute the loss: all but the earlier pipeline stages."""
        return self.world_size // self.degrees.pp


def run_shape(cfg: Config) -> RunShape:
    """The shape of ``cfg`` (a ConfigError if its degrees do not fit its world size)."""
    d = degrees(cfg)
    return RunShape(
        world_size=d.world,
        degrees=d,
        stages_per_rank=stages_per_rank(cfg.parallel) if d.pp > 1 else 1,
        microbatches=cfg.parallel.microbatches if d.pp > 1 else 1,
        micro_batch_size=cfg.trainer.micro_batch_size,
        global_batch_size=global_batch_size(cfg),
        regime=regime(cfg.trainer.precision, sharded=d.fsdp > 1),
    )
