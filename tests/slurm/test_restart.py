"""Restart inside the allocation on the real test cluster (``cluster.max_restarts``), on both Slurm launch
paths: a rank killed with SIGKILL, then (in the restarted start) a rank stopped with SIGSTOP, are answered by
restarting every rank inside the same job — same job id, ``SLURM_RESTART_COUNT`` unchanged, no requeue —
and the run ends bitwise equal to an uninterrupted one. One job per launch path, both faults in each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpctrain.rundir import RunDir
from hpctrain.slurm import commands
from tests.support import FAST, assert_same_state, hpctrain, trained

from .test_preemption import submit
from .test_submit import wait_final

STEPS = 20
RUN = [
    *FAST,
    f"trainer.max_steps={STEPS}",
    "trainer.ckpt_every=4",
    "trainer.log_every=1",
    "trainer.eval_every=0",
    "model.dropout=0.1",
]
# No cluster.max_restarts: the slurm_test profile's default (3 on Slurm, cluster.DEFAULT_RESTARTS) answers.
FAULTS = [
    "faults.kill_at=3:6",  # rank 3 (node2) kills itself at step 6: resume from 4
    "faults.stop_at=1:14@1",  # in the restarted start, rank 1 (node1) stops at step 14: resume from 12,
    "faults.stop_in=report",  # after its update, where its peers wait to log it (no watchdog limit armed)
    "trainer.watchdog_factor=10",
    "trainer.watchdog_min_s=4",
    "cluster.dist_timeout_s=60",
    "cluster.exclude=node3",
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return trained(tmp_path_factory.mktemp("restart") / "reference", *RUN, "cluster.nproc=4")


@pytest.mark.parametrize("launch", [["launcher=auto"], ["launcher=sbatch"]], ids=["submitit", "sbatch"])
def test_killed_and_stopped_ranks_restart_inside_the_job(
    slurm_cluster, reference: Path, tmp_path: Path, launch: list[str]
) -> None:
    run = tmp_path / "run"
    job_id = submit(run, "cluster=slurm_test", *RUN, *FAULTS, *launch)
    state = wait_final([job_id], timeout=420)[job_id]
    assert state.state == "COMPLETED", (state, RunDir(run).read_answers())
    records = RunDir(run).read_answers()
    assert [r["action"] for r in records] == ["restart", "restart"], records
    assert {r["job"] for r in records} == {f"{job_id}.r0"}  # one job start: no requeue
    assert commands.job_fields(job_id).get("Restarts") == "0"
    ranks = {r["rank"]: r["host"] for r in json.loads((run / "ranks.json").read_text())}
    assert (records[0]["rank"], records[0]["host"], records[0]["resume_step"]) == (3, ranks[3], 4)
    assert "SIGKILL" in records[0]["cause"]
    assert (records[1]["rank"], records[1]["host"], records[1]["resume_step"]) == (1, ranks[1], 12)
    assert "hung" in records[1]["cause"]
    assert_same_state(run, reference, STEPS)
    status = hpctrain("status", str(run))
    assert "2 inside the allocation" in status.stdout and "COMPLETED" in status.stdout, status.stdout
