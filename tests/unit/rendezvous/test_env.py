"""A task's place in its job (hpctrain.rendezvous.env), from srun's environment."""

from __future__ import annotations

from hpctrain.rendezvous.env import task_from_environ
from hpctrain.slurm.spec import rendezvous_port


def test_task_from_srun_environment():
    env = {
        "SLURM_PROCID": "5",
        "SLURM_LOCALID": "1",
        "SLURM_NTASKS": "6",
        "SLURM_NODEID": "2",
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NODELIST": "node[3-5]",
        "SLURM_TASKS_PER_NODE": "2(x3)",
    }
    task = task_from_environ(env)
    assert task is not None
    assert (task.rank, task.local_rank, task.world_size, task.local_world_size) == (5, 1, 6, 2)
    assert (task.master_addr, task.master_port) == ("node3", rendezvous_port("4242"))
    assert task_from_environ({"SLURM_JOB_ID": "1"}) is None  # inside an allocation but not in an srun step


def test_uneven_tasks_per_node():
    env = {
        "SLURM_PROCID": "0",
        "SLURM_NTASKS": "5",
        "SLURM_JOB_ID": "7",
        "SLURM_JOB_NODELIST": "n[1-3]",
        "SLURM_TASKS_PER_NODE": "2(x2),1",
        "SLURM_NODEID": "2",
    }
    task = task_from_environ(env)
    assert task is not None and task.local_world_size == 1
