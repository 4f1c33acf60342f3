"""The pure Slurm helpers: time limits, node lists, a task's place in its job; and a rank that cannot join."""

from __future__ import annotations

import pytest

from hpctrain.launch.local import free_port
from hpctrain.rendezvous.env import DistEnv, task_from_environ
from hpctrain.rendezvous.group import init_distributed
from hpctrain.slurm.spec import expand_nodelist, parse_time_limit, rendezvous_port


@pytest.mark.parametrize(
    ("text", "minutes"),
    [("30", 30), ("5:30", 6), ("01:00:00", 60), ("2-00", 2880), ("1-02:30", 1590), ("0-00:00:59", 1)],
)
def test_time_limits(text: str, minutes: int):
    assert parse_time_limit(text) == minutes


@pytest.mark.parametrize("text", ["1h", "", "1:2:3:4", "0", "a-01", "-1"])
def test_bad_time_limits(text: str):
    with pytest.raises(ValueError, match="time limit"):
        parse_time_limit(text)


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("node1", ["node1"]),
        ("node[1-3]", ["node1", "node2", "node3"]),
        ("gpu[07-09,12],login1", ["gpu07", "gpu08", "gpu09", "gpu12", "login1"]),
        ("a[1,3]-ib,b2", ["a1-ib", "a3-ib", "b2"]),
    ],
)
def test_expand_nodelist(nodelist: str, hosts: list[str]):
    assert expand_nodelist(nodelist) == hosts


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


def test_array_tasks_get_distinct_ports():
    assert rendezvous_port("100") != rendezvous_port("101")
    assert 20000 <= rendezvous_port("123456789") < 40000


def test_a_rank_that_cannot_join_is_named():
    # Rank 1 of 2 dials a rendezvous where nobody listens: it fails within the timeout, naming itself.
    env = DistEnv(
        rank=1,
        local_rank=1,
        world_size=2,
        local_world_size=2,
        master_addr="127.0.0.1",
        master_port=free_port("127.0.0.1"),
        hostname="node7",
    )
    with pytest.raises(
        RuntimeError, match=r"rank 1 on node7 could not join the 2-rank process group at 127\.0\.0\.1"
    ):
        init_distributed(env, timeout_s=3)
