"""Who am I, who are my peers — from the launcher's environment. No torch: pure and cheap to test.

The local launcher and torchrun export RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; a task started by srun (submitit, or an sbatch template) has SLURM_PROCID & co instead
(:func:`hpctrain.slurm.spec.task_from_environ`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass


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
        from hpctrain.slurm.spec import task_from_environ

        env = dict(os.environ if environ is None else environ)
        if "RANK" not in env:
            task = task_from_environ(env)
            if task is not None:
                return task
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise RuntimeError(
                f"not started by a launcher: {', '.join(missing)} unset and not in an srun step"
            )
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
