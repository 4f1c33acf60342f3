"""Who am I, who are my peers: read the launcher's environment and join torch.distributed.

The local launcher (and torchrun) export RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT. The process group uses NCCL with one GPU per local rank when CUDA is present, gloo otherwise,
and a timeout, so that a peer that never arrives (or dies) fails the run instead of hanging it.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    hostname: str

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> DistEnv:
        env = dict(os.environ if environ is None else environ)
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise RuntimeError(f"not started by a launcher: {', '.join(missing)} unset")
        world_size = int(env["WORLD_SIZE"])
        return cls(
            rank=int(env["RANK"]),
            local_rank=int(env.get("LOCAL_RANK", env["RANK"])),
            world_size=world_size,
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", world_size)),
            master_addr=env["MASTER_ADDR"],
            master_port=int(env["MASTER_PORT"]),
            hostname=socket.gethostname(),
        )

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(env: DistEnv, timeout_s: float) -> torch.device:
    """Join the process group; return this rank's device."""
    if torch.cuda.is_available():
        if env.local_rank >= torch.cuda.device_count():
            raise RuntimeError(f"local rank {env.local_rank} has no GPU: this node has "
                               f"{torch.cuda.device_count()} (run at most that many processes per node)")
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{env.master_addr}:{env.master_port}",
        rank=env.rank,
        world_size=env.world_size,
        timeout=timedelta(seconds=timeout_s),
        device_id=device if backend == "nccl" else None,
    )
    return device
