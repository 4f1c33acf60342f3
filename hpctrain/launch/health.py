"""A node's health check before its ranks join the rendezvous (``cluster.health_check``). No torch here.

The restart agent of each Slurm task (:mod:`hpctrain.launch.agent`) and the local launcher ask, before each
start of the workers: is the run directory writable, with room for a checkpoint (the newest one's size: what
the next save writes), and does the site's script (``cluster.health_check``, an absolute path, run with a
timeout) exit 0? The worker then checks its device with a tiny computation before it joins
(:func:`hpctrain.rendezvous.group.check_device`). A Slurm node that fails is recorded in faults.jsonl with
its reason, and the job is requeued without it (``ExcNodeList``, kept by every later requeue), within
``cluster.max_requeues``; a local run stops with the reason in one line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from hpctrain.resilience import policy, requeue
from hpctrain.resilience.watchdog import Heartbeat
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as checkpoint_layout

SCRIPT_TIMEOUT_S = 120.0
UNHEALTHY = "NodeUnhealthy"  # the error type a worker records when its device fails the check
EXIT_UNHEALTHY = 5


def problem(run_dir: Path, script: str | None, host: str) -> str | None:
    """Why this node may not run the job's ranks, or None when it may."""
    rd = RunDir(run_dir)
    probe = rd.agent_probe(host, os.getpid())
    try:
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"ok")
        probe.unlink()
    except OSError as err:
        return f"health check: the run directory {rd.path} is not writable from {host}: {err.strerror or err}"
    need = checkpoint_bytes(rd)
    free = shutil.disk_usage(rd.path).free
    if need and free < need:
        return (
            f"health check: {free / 2**30:.2f} GiB free for the run directory on {host}, "
            f"and a checkpoint takes {need / 2**30:.2f} GiB"
        )
    if script:
        try:
            done = subprocess.run(
                [script], capture_output=True, text=True, timeout=SCRIPT_TIMEOUT_S, stdin=subprocess.DEVNULL
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            return f"health check: cluster.health_check={script} could not run on {host}: {err}"
        if done.returncode != 0:
            said = (done.stdout + done.stderr).strip().splitlines()
            last = f": {said[-1][:200]}" if said else ""
            return f"health check: cluster.health_check={script} exited {done.returncode} on {host}{last}"
    return None


def checkpoint_bytes(rd: RunDir) -> int:
    """The size of the newest committed checkpoint (what the next save writes again); 0 before the first."""
    found = checkpoint_layout.committed(rd.checkpoints)
    if not found:
        return 0
    return sum(p.stat().st_size for p in found[0].rglob("*") if p.is_file())


def exclude(run_dir: Path, rank: int, host: str, why: str, max_requeues: int) -> None:
    """Record the failed node and requeue the job without it (the first rank of the start to get here)."""
    now = time.time()
    culprit = Heartbeat(rank, host, os.getpid(), 0, "startup", now, now)
    job = requeue.slurm_job_id()
    requeue.respond_to_fault(run_dir, job, culprit, why, max_requeues, kind=policy.UNHEALTHY)
