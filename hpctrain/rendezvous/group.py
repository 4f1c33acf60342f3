"""Who am I, who are my peers: read the launcher's environment and join torch.distributed.

The local launcher and torchrun export RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; a task started by srun (submitit, or an sbatch template) has SLURM_PROCID & co instead, from
which :func:`hpctrain.rendezvous.env.task_from_environ` derives the same (first node, port from the job id).
The process group uses NCCL with one GPU per local rank when CUDA is present, gloo otherwise, and a
timeout, so that a peer that never arrives (or dies) fails the run instead of hanging it.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from hpctrain.rendezvous.env import DistEnv
from hpctrain.rundir import RunDir


def init_distributed(env: DistEnv, timeout_s: float) -> torch.device:
    """Join the process group; return this rank's device."""
    if torch.cuda.is_available():
        if env.local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"local rank {env.local_rank} has no GPU: this node has "
                f"{torch.cuda.device_count()} (run at most that many processes per node)"
            )
        device = torch.device("cuda", env.local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    try:
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{env.master_addr}:{env.master_port}",
            rank=env.rank,
            world_size=env.world_size,
            timeout=timedelta(seconds=timeout_s),
            device_id=device if backend == "nccl" else None,
        )
    except Exception as err:
        raise RuntimeError(
            f"rank {env.rank} on {env.hostname} could not join the {env.world_size}-rank process "
            f"group at {env.master_addr}:{env.master_port} ({backend}, timeout {timeout_s} s): "
            f"{err}"
        ) from err
    return device


def record_topology(env: DistEnv, run_dir: RunDir) -> list[dict[str, object]]:
    """Gather every rank's host and pid; rank 0 writes them to ranks.json for people and tools."""
    me = {"rank": env.rank, "local_rank": env.local_rank, "host": env.hostname, "pid": os.getpid()}
    everyone: list[dict[str, object]] = [{} for _ in range(env.world_size)]
    dist.all_gather_object(everyone, me)
    if env.is_main:
        run_dir.write_ranks(everyone)
    return everyone
