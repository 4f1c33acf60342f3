"""logger=wandb offline: one W&B run id for a run, kept in the checkpoint, so a resumed run continues it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from hpctrain.checkpoint.tiers import read_checkpoint
from tests.support import FAST, REPO, hpctrain, metrics, this_checkout_first, worker_pids


def test_wandb_offline_run_id_survives_resume(run_dir: Path):
    args = [
        *FAST,
        "logger=wandb",
        "logger.progress_bar=false",
        "cluster.nproc=1",
        "parallel=none",
        f"hydra.run.dir={run_dir}",
    ]
    assert hpctrain(*args, "trainer.max_steps=4").returncode == 0
    first_id = read_checkpoint(run_dir / "checkpoints" / "step_00000004")["train"]["wandb_run_id"]
    assert re.fullmatch(r"[a-z0-9]{8}", first_id)
    assert hpctrain(*args, "trainer.max_steps=8").returncode == 0
    assert read_checkpoint(run_dir / "checkpoints" / "step_00000008")["train"]["wandb_run_id"] == first_id
    runs = sorted(p.name for p in (run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(name.endswith(f"-{first_id}") for name in runs), runs


def _descendants(root: int) -> list[int]:
    parents = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = [], {root}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier}
        found += frontier
    return found


def test_a_dead_wandb_service_stops_wandb_not_the_training(run_dir: Path):
    """Slurm's pre-emption SIGTERM reaches every process of a job, W&B's service too, which exits: the run
    (its checkpoint, its metrics) must go on without it. Here the service is SIGTERMed mid-run."""
    args = [
        *FAST,
        "logger=wandb",
        "logger.progress_bar=false",
        "cluster.nproc=1",
        "parallel=none",
        "trainer.log_every=1",
    ]
    run = subprocess.Popen(
        [sys.executable, "-m", "hpctrain", *args, "trainer.max_steps=100", f"hydra.run.dir={run_dir}"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": this_checkout_first()},
    )
    deadline = time.monotonic() + 120
    service: list[int] = []
    while not service and run.poll() is None and time.monotonic() < deadline:
        metrics_file = run_dir / "metrics.jsonl"
        if metrics_file.exists() and metrics_file.read_text().count("\n") >= 3:
            service = [
                pid
                for worker in worker_pids(run_dir)  # the rank may be forked from the session's fork server
                for pid in _descendants(worker)
                if b"wandb-core" in Path(f"/proc/{pid}/cmdline").read_bytes()
            ]
        time.sleep(0.05)
    assert service, "no W&B service process found while the run trained"
    for pid in service:
        os.kill(pid, signal.SIGTERM)
    _, stderr = run.communicate(timeout=300)
    assert run.returncode == 0, stderr[-3000:]
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, 101))
    assert "W&B stopped logging for this job" in (run_dir / "logs" / "rank0.log").read_text()
    assert (run_dir / "checkpoints" / "step_00000100").is_dir()
