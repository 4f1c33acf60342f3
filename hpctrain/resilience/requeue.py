"""After a stop with a checkpoint saved: requeue the Slurm job (once, from rank 0), up to a cap.

Slurm counts the job's requeues in SLURM_RESTART_COUNT, whoever asked for them, so the cap holds across
pre-emptions, time limits and faults alike. Past ``cluster.max_requeues`` the job ends FAILED, saying why.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from pathlib import Path

from hpctrain.resilience.watchdog import Heartbeat
from hpctrain.slurm.spec import expand_nodelist

log = logging.getLogger(__name__)


class RequeueCapReached(RuntimeError):
    pass


def slurm_job_id() -> str | None:
    """This job as Slurm commands must name it (None outside Slurm, or under the local launcher).

    A job-array task is ``<array id>_<task id>``: its own SLURM_JOB_ID may equal the array's id, and
    ``scontrol requeue <array id>`` would requeue every member of the sweep."""
    if "HPCTRAIN_LAUNCHER_PID" in os.environ:
        return None
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def restart_count() -> int:
    return int(os.environ.get("SLURM_RESTART_COUNT", "0"))


def cancelled(job_id: str) -> bool:
    """Did someone scancel the job? Then its SIGTERM is no pre-emption: requeueing would undo the cancel.

    Accounting shows "CANCELLED by <uid>" as soon as scancel runs, while a signal alone (pre-emption
    schemes, ``scancel --signal``) leaves the job RUNNING. Without accounting, a job Slurm is already ending
    (COMPLETING) is taken as cancelled: not requeueing a job is the safe mistake.
    """
    sacct = subprocess.run(
        ["sacct", "--noheader", "--allocations", "--jobs", job_id, "--format", "State%40"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if sacct.returncode == 0 and sacct.stdout.strip():
        return sacct.stdout.split()[0] == "CANCELLED"
    show = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    return "JobState=COMPLETING" in show.stdout or "JobState=CANCELLED" in show.stdout


def requeue_or_fail(job_id: str, reason: str, step: int, max_requeues: int, is_main: bool) -> None:
    """Requeue ``job_id`` (rank 0 asks), or raise RequeueCapReached on every rank when the cap is reached.
    A job that was cancelled is left to end."""
    if cancelled(job_id):
        log.info(
            "Stopped by %s at step %d (checkpoint saved): the job was cancelled, not requeueing", reason, step
        )
        return
    done = restart_count()
    if done >= max_requeues:
        raise RequeueCapReached(
            f"stopped by {reason} at step {step} (checkpoint saved), but the job was already requeued {done} "
            f"time{'s' * (done != 1)} and cluster.max_requeues={max_requeues}: not requeueing. "
            "Resubmit with trainer.resume=auto to continue."
        )
    if is_main:
        log.info(
            "Stopped by %s at step %d; requeueing job %s (requeue %d of at most %d)",
            reason,
            step,
            job_id,
            done + 1,
            max_requeues,
        )
        result = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60)
        if result.returncode != 0:
            # A pre-empting partition with PreemptMode=REQUEUE requeues the job itself: then this is a no-op.
            log.warning(
                "scontrol requeue %s failed (%s); the checkpoint of step %d is saved either way",
                job_id,
                result.stderr.strip(),
                step,
            )


def respond_to_fault(
    run_dir: Path,
    job_id: str | None,
    culprit: Heartbeat | None,
    why: str,
    max_requeues: int,
) -> None:
    """After a hang or a dead rank: record the culprit and requeue the job without the culprit's node (when
    the partition has enough other nodes), within the requeue cap. The first rank to get here acts; the
    others only log (a slower one would also take the ranks that exited meanwhile for dead)."""
    where = f"rank {culprit.rank} on {culprit.host}" if culprit else "an unknown rank"
    log.error("Fault: %s — %s", where, why)
    done = restart_count()
    if not _first_to_respond(run_dir, job_id, done):
        return
    record = {
        "time": time.time(),
        "job_id": job_id,
        "restart": done,
        "rank": culprit.rank if culprit else None,
        "host": culprit.host if culprit else None,
        "step": culprit.step if culprit else None,
        "why": why,
    }
    with open(run_dir / FAULTS, "a") as out:
        out.write(json.dumps(record) + "\n")
    if job_id is None or cancelled(job_id):
        return
    if done >= max_requeues:
        log.error(
            "Not requeueing: the job was already requeued %d time(s) and cluster.max_requeues=%d",
            done,
            max_requeues,
        )
        return
    exclude = _exclusion(job_id, culprit.host) if culprit else None
    _scontrol("requeue", job_id)
    # Slurm takes an exclusion only while the job is pending: now, while the requeued job waits for its old
    # credentials to expire. No requeuehold: a job left held by a failed release would never run again.
    if exclude and _scontrol("update", f"JobId={job_id}", f"ExcNodeList={exclude}"):
        log.info(
            "Requeued job %s without %s (excluded: %s)", job_id, culprit.host if culprit else "", exclude
        )


FAULTS = "faults.jsonl"


def _first_to_respond(run_dir: Path, job_id: str | None, restart: int) -> bool:
    """Claim the response to this start's fault: an exclusive create succeeds for one rank only."""
    try:
        fd = os.open(run_dir / f".fault-{job_id}-{restart}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _scontrol(*args: str, attempts: int = 5) -> bool:
    """Run scontrol; immune to the SIGTERM that a requeue sends the job's processes (this one included)."""
    for attempt in range(attempts):
        result = subprocess.run(
            ["scontrol", *args], capture_output=True, text=True, timeout=60, preexec_fn=_ignore_sigterm
        )
        if result.returncode == 0:
            return True
        if attempt + 1 < attempts:
            time.sleep(0.5)  # e.g. "no longer pending" while the requeue is still under way
    log.warning(
        "scontrol %s failed (exit %d): %s",
        " ".join(args),
        result.returncode,
        (result.stderr or result.stdout).strip(),
    )
    return False


def _ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _exclusion(job_id: str, host: str) -> str | None:
    """The job's excluded nodes plus ``host``, or None when too few nodes would remain to run it."""
    show = subprocess.run(
        ["scontrol", "show", "job", job_id], capture_output=True, text=True, timeout=30
    ).stdout
    fields = dict(item.split("=", 1) for item in show.split() if "=" in item)
    excluded = (
        [] if fields.get("ExcNodeList", "(null)") == "(null)" else expand_nodelist(fields["ExcNodeList"])
    )
    partition = fields.get("Partition", os.environ.get("SLURM_JOB_PARTITION", ""))
    nodes = subprocess.run(
        ["sinfo", "--noheader", "--partition", partition, "--format", "%N"],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout.split()
    available = {n for item in nodes for n in expand_nodelist(item)} - set(excluded) - {host}
    needed = int(os.environ.get("SLURM_JOB_NUM_NODES", fields.get("NumNodes", "1").split("-")[0]))
    if len(available) < needed:
        log.warning(
            "Not excluding %s: only %d other node(s) in partition %s, the job needs %d",
            host,
            len(available),
            partition,
            needed,
        )
        return None
    return ",".join(sorted({*excluded, host}))
