"""Issue 43, item 1: a failure classified and acted on, locally, with real faults. A rank that takes memory
under a real memory limit (a cgroup's, as a Slurm job's) is killed by the kernel's OOM killer: the launcher
names it out of memory with its peak RSS and does not restart it, restarts on or not. A full disk under the
run directory (a real, small tmpfs) is named with its path and not restarted. The user's own error at the
same step twice stops after two attempts, its frame named.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from hpctrain.rundir import RunDir
from tests.support import FAST, REPO, hpctrain, this_checkout_first
from tests.support.limits import join, memory_limit, small_disk
from tests.support.user_project import broken_project

BASE = [*FAST, "trainer.max_steps=8", "trainer.log_every=1", "trainer.eval_every=0"]
RUN = [*BASE, "cluster.nproc=2"]
# Room for the run (launcher, fork server, two ranks: ~1.3 GiB here) and not for a rank taking memory.
LIMIT = 3 * 1024**3


def _restarts(run: Path) -> list[dict]:
    return RunDir(run).read_answers()


def test_a_rank_the_oom_killer_ends_is_named_out_of_memory_and_not_restarted(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [*RUN, "cluster.max_restarts=2", "faults.oom_at=1:3", f"hydra.run.dir={run}"]
    own_server = {k: v for k, v in os.environ.items() if k != "HPCTRAIN_FORKSERVER"}
    with memory_limit(LIMIT) as group:
        done = subprocess.run(
            [sys.executable, "-m", "hpctrain", *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=300,
            # Its own fork server, in the cgroup with its ranks (not the suite's, outside any limit).
            env={**own_server, "PYTHONPATH": this_checkout_first()},
            preexec_fn=lambda: join(group),
        )
    assert done.returncode != 0, done.stdout[-2000:]
    (record,) = _restarts(run)  # one attempt: no restart after it
    assert (record["rank"], record["kind"], record["action"]) == (1, "out of memory", "stopped"), record
    assert "by the kernel's OOM killer at" in record["detail"] and "GiB peak RSS" in record["detail"], record
    assert re.search(r"GiB peak RSS \(plan: 0\.\d\d GiB for the rank\)", record["detail"]), (
        record
    )  # issue 43, 3
    error = json.loads((run / "logs" / "rank1.error.json").read_text())
    assert "OOM killer" in error["message"] and "max_restarts" not in error["message"], error
    status = hpctrain("status", str(run))
    assert "not restarted: out of memory" in status.stdout and "OOM killer" in status.stdout, status.stdout


def test_the_users_error_at_the_same_step_twice_stops_naming_its_frame(tmp_path: Path) -> None:
    run = tmp_path / "run"
    project = tmp_path / "project"
    broken = broken_project(project)
    one = ["parallel=none", "cluster.nproc=1", "cluster.max_restarts=3"]
    done = hpctrain(*broken, *one, *BASE, f"hydra.run.dir={run}", cwd=project)
    assert done.returncode != 0, done.stdout[-2000:]
    assert "Error" in done.stderr, done.stderr[-2000:]
    records = _restarts(run)
    assert [r["action"] for r in records] == ["restart", "stopped"], records  # two attempts, no third
    assert "in your code at" in records[-1]["detail"] and "brokenmodel.py" in records[-1]["detail"], records
    status = hpctrain("status", str(run))
    assert "the same error at step 3 twice" in status.stdout, status.stdout
    assert "(in your code at " in status.stdout and "brokenmodel.py:14 in forward)" in status.stdout, (
        status.stdout
    )


def test_a_full_disk_is_named_and_not_restarted(tmp_path: Path) -> None:
    """The run directory on a real 1,000 KiB file system: the first checkpoint (about 950 KiB) fills it. The
    failed save's shards are removed (room for the ranks' records), and the answer names the storage."""
    with small_disk(tmp_path / "disk", 1000) as disk:
        run = disk / "run"
        done = hpctrain(*RUN, "trainer.ckpt_every=2", "cluster.max_restarts=2", f"hydra.run.dir={run}")
        assert done.returncode != 0, done.stdout[-2000:]
        assert "not restarted: the storage refused a write" in done.stderr, done.stderr[-2000:]
        (record,) = _restarts(run)
        assert (record["kind"], record["action"]) == ("storage", "stopped"), record
        assert "no space left on the device" in record["detail"], record
        assert not list((run / "checkpoints").glob(".tmp-*")), "the failed save's shards are gone"
        status = hpctrain("status", str(run))
        assert "FAILED" in status.stdout and "No space left on device" in status.stdout, status.stdout
