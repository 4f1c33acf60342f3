"""One DeviceMesh for the whole run; its named sub-meshes give each dimension its process groups.

These are the "process sets" of Horovod: a rank takes part in one group per dimension (its pipeline
neighbours, its data-parallel peers, its tensor-parallel peers), and every collective names the group it
runs on. Only dimensions of size > 1 are in the mesh.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hpctrain import torchapi
from hpctrain.config.shape import MESH_DIMS, Degrees


@dataclass
class ParallelDims:
    degrees: Degrees
    mesh: DeviceMesh | None  # None when every degree is 1
    _flattened: dict[str, DeviceMesh] = field(default_factory=dict)

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
        return self.degrees.dp_index(
            self.coordinate("dp_replicate"), self.coordinate("dp_shard"), self.coordinate("ep")
        )

    def flat(self, *dims: str) -> DeviceMesh | None:
        """One 1-D mesh over the ranks of ``dims`` (those of size > 1; None if none is), flattened in mesh
        order: the group FSDP shards over when several dimensions see other tokens (dp_shard × ep × cp)."""
        present = [d for d in MESH_DIMS if d in dims and self.has(d)]
        if not present:
            return None
        if len(present) == 1:
            return self.submesh(present[0])
        name = "_".join(present)
        if name not in self._flattened:
            assert self.mesh is not None
            self._flattened[name] = torchapi.flatten_mesh(self.mesh[tuple(present)], name)
        return self._flattened[name]

    def fsdp_mesh(self, *shard_dims: str) -> DeviceMesh | None:
        """FSDP's mesh sharding over ``shard_dims`` (flattened): 1-D, or 2-D (dp_replicate, shard) for HSDP;
        None when no shard dimension has ranks."""
        shard = self.flat(*shard_dims)
        if shard is None:
            return None
        if not self.has("dp_replicate"):
            return shard
        assert self.mesh is not None
        names = [d for d in MESH_DIMS if d in shard_dims and self.has(d)]
        return self.mesh["dp_replicate", names[0] if len(names) == 1 else "_".join(names)]

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
