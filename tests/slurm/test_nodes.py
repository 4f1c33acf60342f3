"""A lost node does not end the job, on the real test cluster: node2 of a 2-node job dies mid-run (its slurmd
and every process on it SIGKILLed: :meth:`SlurmTestCluster.lose_node`). With ``cluster.spare_nodes=1``
(submitit) the waiting spare node3 takes its place in the same job and the run ends bitwise equal to an
uninterrupted one; with ``cluster.min_nodes=1`` and no spare (the srun template) the run shrinks onto node1
(data-parallel size 2, the global batch kept by two passes a step) and completes, its final loss within
1e-5 of the uninterrupted run's. One job per mode; the node comes back (a reboot) once the job has ended,
so later tests have three nodes (a slurmd back during the job would make srun abort the step)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hpctrain.rundir import RunDir
from hpctrain.slurm import commands
from tests.support import FAST, assert_same_state, hpctrain, metrics, trained

from .cluster import SlurmTestCluster
from .test_preemption import last_step, submit, wait_until
from .test_submit import wait_final

STEPS = 16
RUN = [
    *FAST,
    f"trainer.max_steps={STEPS}",
    "trainer.ckpt_every=4",
    "trainer.log_every=1",
    "trainer.eval_every=0",
]
LOSSY = ["cluster=slurm_test", "cluster.max_restarts=1", "cluster.dist_timeout_s=60"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained(tmp_path_factory.mktemp("nodes") / "reference", *RUN, "cluster.nproc=4")


def restarts(run: Path) -> list[dict]:
    return RunDir(run).read_answers()


def lose_node2(cluster: SlurmTestCluster, run: Path, job_id: str) -> dict:
    """Kill node2 once the step-4 checkpoint is behind the run; the restart that answered it."""
    wait_until(lambda: last_step(run) >= 6, "training past the step-4 checkpoint", timeout=180)
    cluster.lose_node("node2")
    state = None
    try:
        # Within the group's timeout (LOSSY: 60 s) the survivors see the peer gone; on a loaded machine the
        # restart's record comes later than that, so the wait is longer than the timeout itself.
        wait_until(lambda: any(r.get("lost") for r in restarts(run)), "the lost node's restart", timeout=180)
        state = wait_final([job_id], timeout=180)[job_id]
    finally:
        if state is None:  # failed: a job left running would hold node1 until its time limit, and every
            subprocess.run(["scancel", job_id], check=False)  # later test's job would wait behind it
            wait_final([job_id], timeout=60)
        cluster.revive_node("node2")
    assert state.state == "COMPLETED", (state, restarts(run))
    assert commands.job_fields(job_id).get("Restarts") == "0"  # the same job: no requeue
    (record,) = restarts(run)
    assert record["lost"] == ["node2"] and record["resume_step"] >= 4, record
    fault = RunDir(run).read_faults()[-1]
    assert (fault["host"], fault["excluded"]) == ("node2", True), fault  # no later start takes it back
    assert [r["step"] for r in metrics(run)][-1] == STEPS
    return record


def test_a_spare_takes_the_lost_nodes_place(slurm_cluster, reference: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    job_id = submit(run, *RUN, *LOSSY, "cluster.spare_nodes=1")
    record = lose_node2(slurm_cluster, run, job_id)
    assert (record["spares"], record["nodes"], record["shrunk"]) == (["node3"], ["node1", "node3"], False)
    hosts = {r["rank"]: r["host"] for r in json.loads((run / "ranks.json").read_text())}
    assert hosts == {0: "node1", 1: "node1", 2: "node3", 3: "node3"}, hosts
    assert_same_state(run, reference, STEPS)
    status = hpctrain("status", str(run)).stdout
    assert "node node2 lost" in status and "replaced by node3" in status, status


def test_without_a_spare_the_run_shrinks_and_completes(
    slurm_cluster, reference: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    job_id = submit(run, *RUN, *LOSSY, "cluster.min_nodes=1", "cluster.exclude=node3", "launcher=sbatch")
    record = lose_node2(slurm_cluster, run, job_id)
    assert (record["spares"], record["nodes"], record["shrunk"]) == ([], ["node1"], True)
    assert {r["host"] for r in json.loads((run / "ranks.json").read_text())} == {"node1"}
    log = (run / "logs" / "rank0.log").read_text()
    assert "Shrunk: on 1 of cluster.nodes=2 nodes (node1): data-parallel size 2" in log, log[-2000:]
    ours, theirs = metrics(run)[-1]["loss"], metrics(reference)[-1]["loss"]
    assert abs(ours - theirs) <= 1e-5, (ours, theirs)
    status = hpctrain("status", str(run)).stdout
    assert "node node2 lost" in status and "shrunk to 1 nodes" in status, status
