"""Real checks against the multi-node test cluster: nodes, sbatch, submitit + gloo, signals."""

from __future__ import annotations

import socket
import sys
import time
from datetime import timedelta
from pathlib import Path

import cloudpickle
import pytest
import submitit

from .cluster import SlurmTestCluster

# submitit pickles the job function; pytest imports this file under a name (e.g. `slurm.test_cluster`)
# that the job's interpreter cannot import, so ship this module's functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


def _sacct_state(cluster: SlurmTestCluster, job_id: str, timeout: float = 30.0) -> str:
    """Wait until sacct records a terminal state for the job's allocation; return it."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        out = cluster.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"], check=False).stdout
        # "CANCELLED by 0" -> "CANCELLED"
        state = out.strip().split(" ")[0] if out.strip() else ""
        if state in TERMINAL_STATES:
            return state
        time.sleep(0.3)
    raise AssertionError(f"job {job_id} not finished after {timeout} s (last sacct state {state!r})")


def _wait_for_file(path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.1)


def test_sinfo_shows_all_nodes_idle(slurm_cluster: SlurmTestCluster) -> None:
    expected = {"node1": "idle", "node2": "idle", "node3": "idle"}
    # Other tests sharing the session cluster may have run first: give their jobs time to end.
    deadline = time.monotonic() + 20
    while True:
        out = slurm_cluster.run(["sinfo", "-h", "-N", "-p", slurm_cluster.partition, "-o", "%N %T"]).stdout
        states = dict(line.split() for line in out.splitlines())
        if states == expected or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert states == expected
    assert slurm_cluster.node_names == ["node1", "node2", "node3"]


def test_sbatch_two_nodes_runs_on_distinct_hosts(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    out = tmp_path / "hostnames.txt"
    cmd = ["sbatch", "--parsable", "-N2", "--ntasks-per-node=1", "-w", "node[1-2]", "-o", str(out)]
    job_id = slurm_cluster.run([*cmd, "--wrap", "srun hostname"]).stdout.strip().split(";")[0]
    assert _sacct_state(slurm_cluster, job_id) == "COMPLETED"
    # Each node is its own UTS namespace: the step reports two different hostnames.
    assert sorted(out.read_text().split()) == ["node1", "node2"]


def _gloo_all_reduce() -> tuple[str, int, float]:
    """Runs inside the job: one task per node, all-reduce of (rank + 1) over gloo."""
    import os

    import submitit
    import torch
    import torch.distributed as dist

    env = submitit.JobEnvironment()
    # Node names resolve (bind-mounted hosts file) to the nodes' bridge addresses, not 127.x.
    os.environ["MASTER_ADDR"] = env.hostnames[0]
    # Per job, so a lingering socket from an earlier job can never collide.
    os.environ["MASTER_PORT"] = str(20000 + int(env.job_id) % 20000)
    dist.init_process_group(
        "gloo", rank=env.global_rank, world_size=env.num_tasks, timeout=timedelta(seconds=60)
    )
    try:
        value = torch.tensor([float(env.global_rank + 1)])
        dist.all_reduce(value)
    finally:
        dist.destroy_process_group()
    return socket.gethostname(), env.global_rank, float(value.item())


@pytest.mark.timeout(180)  # job.results() would otherwise wait as long as the job can run
def test_submitit_two_node_gloo_all_reduce(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    executor = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    executor.update_parameters(
        nodes=2,
        tasks_per_node=1,
        cpus_per_task=1,
        timeout_min=5,
        slurm_partition=slurm_cluster.partition,
        slurm_setup=["export OMP_NUM_THREADS=1"],
    )
    job = executor.submit(_gloo_all_reduce)
    results = sorted(job.results(), key=lambda r: r[1])
    assert [rank for _, rank, _ in results] == [0, 1]
    assert [total for _, _, total in results] == [3.0, 3.0]  # 1 + 2 on every task
    hosts = [host for host, _, _ in results]
    assert len(set(hosts)) == 2 and set(hosts) <= set(slurm_cluster.node_names)
    # Results are written before the tasks exit; the final state comes from accounting.
    assert _sacct_state(slurm_cluster, job.job_id) == "COMPLETED"


def test_scancel_usr2_reaches_the_running_step(slurm_cluster: SlurmTestCluster, tmp_path: Path) -> None:
    ready, seen = tmp_path / "ready", tmp_path / "usr2-seen"
    # `scancel --signal` (without --full) signals the job's steps, as it does submitit's srun step.
    step = f'trap "echo USR2 > {seen}; exit 0" USR2; touch {ready}; while true; do sleep 0.2; done'
    script = f"#!/bin/bash\nsrun bash -c '{step}'\n"
    cmd = ["sbatch", "--parsable", "-N1", "-n1", "-o", str(tmp_path / "out.txt")]
    job_id = slurm_cluster.run(cmd, input=script).stdout.strip().split(";")[0]
    _wait_for_file(ready, timeout=30)
    slurm_cluster.run(["scancel", "--signal=USR2", job_id])
    _wait_for_file(seen, timeout=15)
    assert seen.read_text().strip() == "USR2"
    # The trap exits 0, so the step and then the batch script end normally.
    assert _sacct_state(slurm_cluster, job_id) == "COMPLETED"
