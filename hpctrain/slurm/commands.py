"""Slurm's client commands (sbatch, squeue, sacct, scancel), always with a configuration in place.

A Slurm client that finds no configuration falls back to DNS SRV look-ups (configless mode); on a machine
that is not meant to do that, every call would try to leave it. So a client runs only when SLURM_CONF or
/etc/slurm/slurm.conf is there, unless HPCTRAIN_SLURM_CONFIGLESS=1 says the site really is configless.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
# sacct states that mean the job will not run again (requeues end in PENDING/REQUEUED instead).
FINAL_STATES = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "OUT_OF_MEMORY",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}


class SlurmUnavailable(RuntimeError):
    pass


def check_client() -> None:
    """Raise SlurmUnavailable unless a Slurm client can run here without guessing its controller."""
    if shutil.which("sbatch") is None:
        raise SlurmUnavailable("no Slurm client here (sbatch is not on PATH): submit from a login node")
    conf = os.environ.get("SLURM_CONF")
    if conf is not None and not Path(conf).is_file():
        raise SlurmUnavailable(f"SLURM_CONF={conf} does not exist")
    if conf is None and not DEFAULT_CONF.is_file() and os.environ.get("HPCTRAIN_SLURM_CONFIGLESS") != "1":
        raise SlurmUnavailable(
            f"no Slurm configuration: SLURM_CONF is unset and {DEFAULT_CONF} is missing "
            "(set HPCTRAIN_SLURM_CONFIGLESS=1 on a configless site)"
        )


def run(args: list[str], timeout: float = 60) -> str:
    check_client()
    result = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


@dataclass(frozen=True)
class JobState:
    job_id: str
    state: str  # Slurm's state word: PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ...
    exit_code: str
    nodes: str
    elapsed: str
    reason: str = ""

    @property
    def final(self) -> bool:
        return self.state in FINAL_STATES


def job_states(job_ids: list[str]) -> dict[str, JobState]:
    """Each job's current state: squeue while it is queued or running, else sacct's record."""
    if not job_ids:
        return {}
    states: dict[str, JobState] = {}
    out = run(["squeue", "--noheader", "--jobs", ",".join(job_ids), "--format", "%i|%T|%N|%M|%r"])
    for line in out.splitlines():
        job, state, nodes, elapsed, reason = line.split("|")
        states[job] = JobState(job, state, "", nodes, elapsed, "" if reason == "None" else reason)
    missing = [j for j in job_ids if j not in states]
    if missing:
        out = run(
            [
                "sacct",
                "--noheader",
                "--parsable2",
                "--allocations",
                "--jobs",
                ",".join(missing),
                "--format",
                "JobID,State,ExitCode,NodeList,Elapsed",
            ]
        )
        for line in out.splitlines():
            job, state, exit_code, nodes, elapsed = line.split("|")
            # "CANCELLED by 0" → CANCELLED; sacct lists a requeued job once per run, the last is current.
            states[job] = JobState(job, state.split()[0], exit_code, nodes, elapsed)
    return states


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        run(["scancel", *job_ids])
