"""Issue 17, acceptance a: the user's own DDP script (examples/script/train_ddp.py) as a 2-node job. It
trains, gets the pre-emption warning (scancel --signal=USR2), saves in its own SIGTERM handler, the job
requeues itself, the script resumes from HPCTRAIN_CHECKPOINT_DIR and finishes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hpctrain.rundir.records import read_job
from tests.support import REPO, hpctrain

from .test_preemption import wait_until
from .test_submit import wait_final


def test_users_script_is_preempted_requeued_and_resumes(slurm_cluster, tmp_path: Path):
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(REPO / "examples" / "script" / "train_ddp.py", project / "train_ddp.py")
    run = tmp_path / "run"
    result = hpctrain(
        "task=script",
        "task.path=train_ddp.py",
        "task.args=[--steps,40,--sleep,0.2]",
        "cluster=slurm_test",
        f"hydra.run.dir={run}",
        cwd=project,
    )
    assert result.returncode == 0, result.stderr
    record = read_job(run)
    assert record is not None and record.nodes == 2
    log = run / "logs" / "rank0.log"
    wait_until(lambda: log.is_file() and "step 5 loss" in log.read_text(), "the script to train")
    subprocess.run(["scancel", "--signal=USR2", record.job_id], check=True)
    state = wait_final([record.job_id], timeout=240)[record.job_id]
    text = log.read_text()
    assert state.state == "COMPLETED", (state, text[-3000:])
    # Each rank's worker forwards the warning when it sees it; a script whose peers stopped first (their
    # stop flag is all-reduced) may have saved and exited before its own worker's next look, so the
    # forwarding is asked of some rank, not of rank 0.
    ranks = [path.read_text() for path in sorted((run / "logs").glob("rank*.log"))]
    assert any("forwarding it to the script as SIGTERM" in each for each in ranks), text[-3000:]
    assert f"requeueing job {record.job_id}" in text
    assert "stopped, saved at step" in text and "(requeue 1)" in text and "finished at step 40" in text
    assert (run / "checkpoints" / "state.pt").is_file()
