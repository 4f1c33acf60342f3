"""The user's own project as a 2-node Slurm job: the code snapshot carries their git-tracked code."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from hpctrain.rundir.records import read_job
from hpctrain.slurm.commands import JobState, job_states
from tests.support import REPO, hpctrain, metrics


def wait_final(job_id: str, timeout: float = 240) -> JobState:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = job_states([job_id])
        if job_id in states and states[job_id].final:
            return states[job_id]
        time.sleep(1)
    raise AssertionError(f"job {job_id} did not finish in {timeout} s: {job_states([job_id])}")


def test_users_project_runs_as_a_two_node_job(slurm_cluster, tmp_path: Path):
    project = tmp_path / "project"
    shutil.copytree(REPO / "examples" / "user_project", project, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.email=u@example.org", "-c", "user.name=u"]
    subprocess.run([*git, "init", "-q"], cwd=project, check=True)
    subprocess.run([*git, "add", "."], cwd=project, check=True)
    subprocess.run([*git, "commit", "-qm", "my project"], cwd=project, check=True)
    run = tmp_path / "run"
    args = [
        "--config-dir",
        "conf",
        "model=cnn",
        "data=digits8",
        "cluster=slurm_test",
        "trainer.max_steps=10",
        "trainer.eval_batches=1",
        "logger=jsonl",
        f"hydra.run.dir={run}",
    ]
    result = hpctrain(*args, cwd=project)
    assert result.returncode == 0, result.stderr
    # The job must run the snapshot, not the folder: take the user's package away before it starts.
    (project / "mynets").rename(project / "mynets.moved")
    record = read_job(run)
    assert record is not None and record.nodes == 2
    state = wait_final(record.job_id)
    assert state.state == "COMPLETED", (state, (run / "logs" / "rank0.log").read_text()[-2000:])
    assert metrics(run)[-1]["step"] == 10
    snapshot = run / "code"
    assert any(snapshot.rglob("mynets/cnn.py")), sorted(p.name for p in snapshot.iterdir())
