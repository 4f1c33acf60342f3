"""One DeviceMesh for the whole run; its named sub-meshes give each dimension its process groups.

These are the "process sets" of Horovod: a rank takes part in one group per dimension (its pipeline
neighbours, its data-parallel peers, its tensor-parallel peers), and every collective names the group it
runs on. Only dimensions of size > 1 are in the mesh.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hpctrain.config.shape import Degrees


@dataclass
class ParallelDims:
    degrees: Degrees
    mesh: DeviceMesh | None  # None when every degree is 1

    def has(self, dim: str) -> bool:
        return getattr(self.degrees, dim) > 1

    def submesh(self, *dims: str) -> DeviceMesh:
        assert self.mesh is not None and all(self.has(d) for d in dims), dims
        return self.mesh[dims if len(dims) > 1 else dims[0]]

    def coordinate(self, dim: str) -> int:
        return self.mesh.get_local_rank(dim) if self.mesh is not None and self.has(dim) else 0

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel index: which slice of each global batch it processes."""
        return self.coordinate("dp_replicate") * self.degrees.dp_shard + self.coordinate("dp_shard")

    @property
    def pp_rank(self) -> int:
        return self.coordinate("pp")

    @property
    def pp_group(self) -> dist.ProcessGroup | None:
        return self.submesh("pp").get_group() if self.has("pp") else None


def build_mesh(degrees: Degrees, device: torch.device) -> ParallelDims:
    sizes = {name: size for name, size in degrees.sizes().items() if size > 1}
    if not sizes:
        return ParallelDims(degrees, None)
    world = dist.get_world_size()
    if degrees.world != world:
        raise RuntimeError(f"the degrees {degrees} need {degrees.world} ranks, the process group has {world}")
    mesh = init_device_mesh(device.type, tuple(sizes.values()), mesh_dim_names=tuple(sizes))
    return ParallelDims(degrees, mesh)
