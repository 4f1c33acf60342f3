"""Stop before the time limit even when no warning signal comes (a site without --signal, a lost signal).

The end time is asked of Slurm once per job, by the worker (:func:`hpctrain.slurm.commands.end_time`:
Slurm 22.05 does not export SLURM_JOB_END_TIME); the decision here is pure: stop when the next two steps
plus one and a half checkpoint saves (as measured so far) and a margin no longer fit before the end.
"""

from __future__ import annotations

DEFAULT_SAVE_S = 30.0  # before the first save has been timed: generous for a sharded checkpoint
MARGIN_S = 10.0


def should_stop(now: float, end_time: float | None, step_s: float, save_s: float | None) -> bool:
    if end_time is None:
        return False
    needed = 2 * step_s + 1.5 * (DEFAULT_SAVE_S if save_s is None else save_s) + MARGIN_S
    return now + needed >= end_time
