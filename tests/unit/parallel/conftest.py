"""A one-rank gloo process group in this process, for parallel code that needs one (a DeviceMesh, DTensors,
FSDP): what one process of a run has, joined by hpctrain.rendezvous.group as every rank joins."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh

from hpctrain.config.schema import ParallelConfig
from hpctrain.launch.local import free_port
from hpctrain.parallel.fsdp import apply_fsdp
from hpctrain.rendezvous.env import DistEnv
from hpctrain.rendezvous.group import init_distributed


@pytest.fixture(scope="module")
def one_rank() -> Iterator[torch.device]:
    """This process as rank 0 of 1; the group is destroyed after the module's tests."""
    assert not dist.is_initialized()
    env = DistEnv(
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=free_port("127.0.0.1"),
        hostname="localhost",
    )
    device = init_distributed(env, timeout_s=30)
    try:
        yield device
    finally:
        dist.destroy_process_group()


Shard = Callable[[nn.Module], nn.Module]  # a model in, its sharded copy out


@pytest.fixture
def fsdp_copy(one_rank: torch.device) -> Shard:
    """A copy of a model under FSDP2 over this one rank, in fp32 (its blocks and its root sharded)."""

    def shard(model: nn.Module) -> nn.Module:
        sharded = copy.deepcopy(model)
        mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("dp_shard",))
        apply_fsdp(sharded, mesh, ParallelConfig(), "fp32", one_rank)
        return sharded

    return shard
