"""Degrees of parallelism: which mesh dimensions a strategy has and how large each is. Torch-free.

The device mesh is ``pp × dp_replicate × dp_shard × tp`` (outermost first, torchtitan's order): tensor
parallelism, the chattiest, stays innermost so its ranks are neighbours (one node, NVLink); pipeline
parallelism, which only sends activations between neighbouring stages, is outermost and crosses nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hpctrain.config.errors import ConfigError
from hpctrain.config.schema import ParallelConfig

MESH_DIMS = ("pp", "dp_replicate", "dp_shard", "tp")

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
}


@dataclass(frozen=True)
class Degrees:
    pp: int = 1
    dp_replicate: int = 1
    dp_shard: int = 1
    tp: int = 1

    @property
    def dp(self) -> int:
        """Data-parallel size: how many different slices of each global batch are processed at once."""
        return self.dp_replicate * self.dp_shard

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

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
        if dim not in dims and value > 1:
            having = [s for s, d in STRATEGY_DIMS.items() if dim in d]
            raise ConfigError(
                f"parallel.{dim}", value, f"parallel={name} has no {dim} dimension", valid=", ".join(having)
            )
    given = {dim: getattr(parallel, dim) for dim in dims if getattr(parallel, dim) > 0}
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
            raise ConfigError(
                f"parallel.{next(iter(given))}",
                given[next(iter(given))],
                f"world size {world_size} is not divisible by {spelled} = {product}",
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
