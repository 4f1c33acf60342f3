"""Pre-emption on the real test cluster: signals reach every rank, all save, the job requeues itself, and the
resumed training is bit-for-bit the uninterrupted one."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from hpctrain.rundir.records import read_job
from tests.support import FAST, REPO, hpctrain, metrics, model_and_optimizer
from tests.support.wandb_history import history

from .test_submit import wait_final

# Dropout on: exactness needs every rank's RNG restored too.
STORM = [
    "trainer.max_steps=30",
    "trainer.log_every=1",
    "trainer.ckpt_every=0",
    "trainer.eval_every=0",
    "data.max_bytes=200000",
    "trainer.eval_batches=1",
    "model.dropout=0.1",
]


def resumes(run: Path) -> int:
    log = run / "logs" / "rank0.log"
    return log.read_text().count("Resumed from") if log.exists() else 0


def last_step(run: Path) -> int:
    return metrics(run)[-1]["step"] if (run / "metrics.jsonl").exists() and metrics(run) else 0


def wait_until(condition, what: str, timeout: float = 120) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def signal_job(job_id: str, name: str) -> None:
    subprocess.run(["scancel", f"--signal={name}", job_id], check=True)


def submit(run: Path, *overrides: str) -> str:
    result = hpctrain(*overrides, f"hydra.run.dir={run}")
    assert result.returncode == 0, result.stderr
    record = read_job(run)
    assert record is not None
    return record.job_id


def test_preemption_storm_resumes_bitwise_and_keeps_one_wandb_run(slurm_cluster, tmp_path: Path):
    storm, reference = tmp_path / "storm", tmp_path / "reference"
    # The uninterrupted run: the same 4 ranks, here on this machine, while the storm runs on the cluster.
    uninterrupted = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *STORM, *FAST, "cluster.nproc=4", f"hydra.run.dir={reference}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    job_id = submit(storm, *STORM, "cluster=slurm_test", "logger=wandb", "logger.progress_bar=false")
    for n, at_step in enumerate((3, 9, 15)):
        wait_until(
            lambda n=n, at_step=at_step: resumes(storm) == n and last_step(storm) >= at_step,
            f"segment {n} to pass step {at_step}",
        )
        signal_job(job_id, "USR2")
        wait_until(lambda n=n: resumes(storm) == n + 1, f"requeue {n + 1} to resume", timeout=180)
    assert wait_final([job_id])[job_id].state == "COMPLETED"
    assert uninterrupted.wait(timeout=300) == 0, uninterrupted.stderr.read() if uninterrupted.stderr else ""

    log = (storm / "logs" / "rank0.log").read_text()
    assert log.count("Stopped by SIGUSR2 after step") == 3 and log.count(f"requeueing job {job_id}") == 3
    ours, theirs = (
        model_and_optimizer(storm / "checkpoints" / "step_00000030"),
        model_and_optimizer(reference / "checkpoints" / "step_00000030"),
    )
    assert ours.keys() == theirs.keys()
    assert not [k for k in ours if not torch.equal(ours[k], theirs[k])], (
        "pre-empted run differs from uninterrupted"
    )
    assert [r["step"] for r in metrics(storm)] == list(range(1, 31)), (
        "every step exactly once in metrics.jsonl"
    )
    assert [r["loss"] for r in metrics(storm)] == [r["loss"] for r in metrics(reference)]

    run_ids, steps = history(storm)
    assert len(run_ids) == 1, f"one W&B run across the requeues, got {run_ids}"
    assert len(list((storm / "wandb").glob("offline-run-*"))) == 4  # one offline segment per start
    assert sorted(steps) == list(range(1, 31)), "W&B history holds every step once"


def test_sigterm_preemption_requeues_and_finishes(slurm_cluster, tmp_path: Path):
    # Slurm pre-empts (or reaches the time limit) by sending SIGTERM to every process of the job, then SIGKILL
    # after KillWait. The test cluster has no pre-empting partition, so `scancel --signal=TERM` delivers the
    # same SIGTERM to the same processes; what follows it (save, requeue, resume) is the path under test.
    # W&B's service process gets the SIGTERM too and exits: training must save, requeue and finish regardless.
    run = tmp_path / "run"
    job_id = submit(
        run,
        *STORM,
        "trainer.max_steps=20",
        "cluster=slurm_test",
        "cluster.nodes=1",
        "logger=wandb",
        "logger.progress_bar=false",
    )
    wait_until(lambda: last_step(run) >= 5, "training to start")
    signal_job(job_id, "TERM")
    assert wait_final([job_id], timeout=240)[job_id].state == "COMPLETED"
    log = (run / "logs" / "rank0.log").read_text()
    assert "Stopped by SIGTERM" in log and resumes(run) == 1
    assert [r["step"] for r in metrics(run)] == list(range(1, 21))
    assert len(history(run)[0]) == 1, "one W&B run across the requeue"


def test_requeue_cap_fails_the_job_naming_it(slurm_cluster, tmp_path: Path):
    run = tmp_path / "run"
    job_id = submit(
        run,
        *STORM,
        "trainer.max_steps=400",
        "cluster=slurm_test",
        "cluster.nodes=1",
        "cluster.max_requeues=1",
        "logger=jsonl",
    )
    wait_until(lambda: last_step(run) >= 3, "training to start")
    signal_job(job_id, "USR2")
    wait_until(lambda: resumes(run) == 1 and last_step(run) >= 10, "the requeued job to train", timeout=180)
    signal_job(job_id, "USR2")
    state = wait_final([job_id], timeout=120)[job_id]
    assert state.state == "FAILED"
    status = subprocess.run(
        [sys.executable, "-m", "hpctrain", "status", str(run)], capture_output=True, text=True, cwd=REPO
    )
    assert "FAILED" in status.stdout and "cluster.max_requeues=1" in status.stdout, status.stdout
    error = json.loads((run / "logs" / "rank0.error.json").read_text())
    assert error["type"] == "RequeueCapReached" and "already requeued 1 time" in error["message"]
    # Nothing was lost: the step it stopped at is committed.
    assert (run / "checkpoints" / f"step_{last_step(run):08d}").is_dir()
