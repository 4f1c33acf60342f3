"""Flexible walltime on the real test cluster (issue 45, item 5): with ``cluster.time_min`` (sbatch
--time-min), backfill starts a run in a gap shorter than its ``cluster.time`` while a job of the same shape
with a fixed ``--time`` waits; the run reads the limit Slurm granted, saves before it ends, requeues itself
and resumes from that checkpoint."""

from __future__ import annotations

import re
import subprocess
import time
from datetime import datetime
from pathlib import Path

from hpctrain.rundir.records import read_job
from hpctrain.slurm import commands
from tests.support import FAST, hpctrain

from .test_preemption import last_step, resumes, submit, wait_until
from .test_submit import wait_final


def _sbatch(*args: str) -> str:
    out = subprocess.run(
        ["sbatch", "--parsable", "--output=/dev/null", *args], capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def _state(job_id: str) -> str:
    return commands.job_fields(job_id).get("JobState", "")


def _start(job_id: str) -> float:
    return datetime.fromisoformat(commands.job_fields(job_id)["StartTime"]).timestamp()


def test_a_time_min_job_is_backfilled_saves_before_its_granted_end_and_resumes(slurm_cluster, tmp_path: Path):
    # The gap: node1 and node2 busy for up to 2 minutes (their job's limit; it ends after 20 s), and a job of
    # all 3 nodes waiting for them, whose start backfill must not delay. node3 is free until then: shorter
    # than either job's --time=60 below, at least their --time-min=1.
    blocker = _sbatch("--nodelist=node1,node2", "--nodes=2", "--exclusive", "--time=2", "--wrap=sleep 20")
    wait_until(lambda: _state(blocker) == "RUNNING", "the blocker to start", timeout=60)
    waiting = _sbatch("--nodes=3", "--exclusive", "--time=1", "--wrap=sleep 1")
    submitted = time.time()
    fixed = _sbatch("--nodes=1", "--exclusive", "--time=60", "--wrap=sleep 1")  # its shape, a fixed --time
    run = tmp_path / "run"
    job_id = submit(
        run,
        *FAST,
        "cluster=slurm_test",
        "cluster.nodes=1",
        "cluster.exclusive=true",
        "cluster.time=60",
        "cluster.time_min=1",
        # USR2 55 s into a one-minute grant: the walltime guard stops the run first. With 30 s, a start-up
        # slowed past 30 s by the whole suite beside it (seen once: no rank had its handler yet) ended both
        # tasks by the signal, with nothing saved and no requeue.
        "cluster.signal_lead_s=5",
        "cluster.max_requeues=10",  # backfill may grant the requeued job a minute again while the gap lasts
        "trainer.max_steps=1000000",
        "trainer.ckpt_every=0",
        "trainer.eval_every=0",
        "trainer.log_every=1",
    )
    wait_until(lambda: _state(job_id) == "RUNNING", "backfill to start the run", timeout=60)
    granted = commands.job_fields(job_id)
    assert granted["TimeLimit"] == "00:01:00", granted  # less than its cluster.time, at least its time_min
    assert (_state(blocker), _state(waiting), _state(fixed)) == ("RUNNING", "PENDING", "PENDING")
    backfilled_s = _start(job_id) - submitted

    # The run knows its end is Slurm's granted one and saves before it (the walltime guard, which leaves room
    # for a save it has not timed yet, 30 s, stops a one-minute job at its first steps), and requeues itself.
    wait_until(lambda: resumes(run) >= 1, "the requeued run to resume from its checkpoint", timeout=120)
    log = run / "logs" / "rank0.log"
    text = log.read_text()
    said = re.search(r"Slurm ends this job at \S+, in (\d+) s \(cluster.time=60, cluster.time_min=1\)", text)
    assert said and int(said.group(1)) <= 60, text[-3000:]
    assert re.search(r"Stopped by (SIGUSR2|the time limit is near)", text), text[-3000:]
    assert int(re.search(r"Resumed from \S*step_0*(\d+)", text).group(1)) >= 1  # type: ignore[union-attr]

    # Requeued, it asks for its whole cluster.time again (Slurm would keep the granted minute): once the gap
    # has closed, a start of 60 minutes, which `hpctrain stop` ends with a checkpoint.
    wait_until(
        lambda: commands.job_fields(job_id).get("TimeLimit") == "01:00:00" and _state(job_id) == "RUNNING",
        "a start with the whole time limit",
        timeout=120,
    )
    fixed_s = _start(fixed) - submitted
    print(f"start after submission: --time=60 --time-min=1 {backfilled_s:.0f} s, --time=60 {fixed_s:.0f} s")
    assert backfilled_s < fixed_s, (backfilled_s, fixed_s)
    step = last_step(run)
    wait_until(lambda: last_step(run) > step, "the long start to train", timeout=60)
    assert hpctrain("stop", str(run)).returncode == 0
    assert wait_final([job_id], timeout=120)[job_id].state == "COMPLETED"
    record = read_job(run)  # one job all along: requeued, never a second submission
    assert record is not None and record.job_id == job_id
    assert wait_final([blocker, waiting, fixed], timeout=60)[fixed].state == "COMPLETED"
