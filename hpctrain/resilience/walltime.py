"""Stop before the time limit even when no warning signal comes (a site without --signal, a lost signal).

The end time is asked of Slurm once per job (Slurm 22.05 does not export SLURM_JOB_END_TIME); the decision
is pure: stop when the next two steps plus one and a half checkpoint saves (as measured so far) and a margin
no longer fit before the end.
"""

from __future__ import annotations

import subprocess
from datetime import datetime

DEFAULT_SAVE_S = 30.0  # before the first save has been timed: generous for a sharded checkpoint
MARGIN_S = 10.0


def job_end_time(job_id: str) -> float | None:
    """The job's end time as a Unix timestamp, from squeue; None when unknown (no limit, no Slurm)."""
    try:
        out = subprocess.run(
            ["squeue", "--noheader", "--jobs", job_id, "--format", "%e"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = out.stdout.split()
    if out.returncode != 0 or len(lines) != 1:
        return None
    try:
        return datetime.fromisoformat(lines[0]).timestamp()  # squeue prints local time without a zone
    except ValueError:  # N/A, NONE, Unknown: no limit to guard
        return None


def should_stop(now: float, end_time: float | None, step_s: float, save_s: float | None) -> bool:
    if end_time is None:
        return False
    needed = 2 * step_s + 1.5 * (DEFAULT_SAVE_S if save_s is None else save_s) + MARGIN_S
    return now + needed >= end_time
