"""Who am I, who are my peers — from the launcher's environment. No torch: pure and cheap to test.

The local launcher and torchrun export RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR and
MASTER_PORT; a task started by srun (submitit, or an sbatch template) has SLURM_PROCID & co instead
(:func:`task_from_environ`).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from hpctrain.slurm.spec import expand_nodelist, rendezvous_port

# Set by a restart agent (hpctrain.launch.agent) or the local launcher in every worker it starts: which
# generation of the job start's workers this is (0 first, +1 per restart inside the allocation). How a fault
# is answered is the supervisor's to decide, never the worker's.
RESTART_ENV = "HPCTRAIN_RESTART"
# Set by a Slurm task's restart agent when the job has spare nodes or may shrink (cluster.spare_nodes,
# cluster.min_nodes): the nodes this generation's ranks run on, in rank order, comma-separated. A task on
# another node of the allocation waits (a spare); ranks, world size and the rendezvous host follow this list
# rather than srun's step (which still counts the spares and the lost nodes).
NODES_ENV = "HPCTRAIN_NODES"


def adopt_torchrun_restarts(env: dict[str, str] | os._Environ[str]) -> int:
    """A worker started by torchrun's agent (the torchrun sbatch template, ``--max-restarts`` from
    ``cluster.max_restarts``) takes torchrun's restart count for its generation, as a worker of hpctrain's
    own agent is told it: a fault injected in generation G fires only there. Returns torchrun's restart
    count (0: none, or not started by torchrun)."""
    count, most = env.get("TORCHELASTIC_RESTART_COUNT"), env.get("TORCHELASTIC_MAX_RESTARTS")
    if RESTART_ENV in env or count is None or most is None or not count.isdigit() or not most.isdigit():
        return 0
    env[RESTART_ENV] = count
    return int(count)


def restart_generation(environ: dict[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    return int(env.get(RESTART_ENV, "0") or 0)


@dataclass(frozen=True)
class DistEnv:
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    master_addr: str
    master_port: int
    hostname: str
    # Started by srun: (job id, array task, restart count), from which every task derives the same port
    # candidates (hpctrain.slurm.spec.rendezvous_port); None when a launcher chose MASTER_PORT.
    port_key: tuple[str, str, str] | None = None

    @classmethod
    def from_environ(cls, environ: dict[str, str] | None = None) -> DistEnv:
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


def task_from_environ(env: dict[str, str]) -> DistEnv | None:
    """This task's place in the job from the variables srun sets (None outside an srun step).

    The rendezvous host is the job's first node; the port comes from the job id, array task and restart
    count, so every task agrees without talking (and rank 0 moves on to the next candidate, telling the
    others through the run directory, when the port is taken: :mod:`hpctrain.rendezvous.group`).
    """
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return None
    members = [n for n in env.get(NODES_ENV, "").split(",") if n]
    if members:
        return _member_task(env, members)
    nodes = expand_nodelist(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
    restart = env.get("SLURM_RESTART_COUNT", "0")
    generation = restart_generation(env)
    if generation:  # a restart inside the allocation: off the port its killed predecessor held
        restart = f"{restart}.{generation}"
    key = (env["SLURM_JOB_ID"], env.get("SLURM_ARRAY_TASK_ID", ""), restart)
    return DistEnv(
        rank=int(env["SLURM_PROCID"]),
        local_rank=int(env.get("SLURM_LOCALID", "0")),
        world_size=int(env["SLURM_NTASKS"]),
        local_world_size=_tasks_on_this_node(env),
        master_addr=nodes[0],
        master_port=rendezvous_port(*key),
        hostname=socket.gethostname(),
        port_key=key,
    )


def this_node(env: dict[str, str]) -> str:
    """The Slurm name of the node this task runs on."""
    return env.get("SLURMD_NODENAME") or socket.gethostname()


def _member_task(env: dict[str, str], members: list[str]) -> DistEnv:
    """This task's place among the generation's ``members`` (NODES_ENV): node-major ranks, as srun's block
    distribution numbers them, over the member nodes only."""
    per_node = _tasks_on_this_node(env)
    restart = env.get("SLURM_RESTART_COUNT", "0")
    generation = restart_generation(env)
    key = (env["SLURM_JOB_ID"], env.get("SLURM_ARRAY_TASK_ID", ""), f"{restart}.{generation}")
    return DistEnv(
        rank=members.index(this_node(env)) * per_node + int(env.get("SLURM_LOCALID", "0")),
        local_rank=int(env.get("SLURM_LOCALID", "0")),
        world_size=len(members) * per_node,
        local_world_size=per_node,
        master_addr=members[0],
        master_port=rendezvous_port(*key),
        hostname=socket.gethostname(),
        port_key=key,
    )


def _tasks_on_this_node(env: dict[str, str]) -> int:
    # SLURM_TASKS_PER_NODE looks like "2(x3),1": counts per node, run-length encoded.
    counts: list[int] = []
    for item in env.get("SLURM_STEP_TASKS_PER_NODE", env.get("SLURM_TASKS_PER_NODE", "1")).split(","):
        count, _, repeat = item.partition("(x")
        counts += [int(count)] * (int(repeat.rstrip(")")) if repeat else 1)
    node = int(env.get("SLURM_NODEID", "0"))
    return counts[node] if node < len(counts) else counts[-1]
