"""``trainer.eval_job``: which checkpoints the pruner keeps beyond ``keep_last`` because an evaluation job
submitted for them has not read them yet (``RUN_DIR/eval_pins/step_N.json``, :class:`hpctrain.rundir.RunDir`).

An evaluation waits in the queue as long as the partition is busy (hours), while training goes on saving and
pruning: without the pin, it starts to find its checkpoint gone. A pin whose job ended without releasing it
(cancelled, timed out, its node lost) would keep the checkpoint for ever: the pruner asks Slurm, releases
it with the job's end as the reason, and ``hpctrain status`` reports the evaluation as missing. Torch-free.
"""

from __future__ import annotations

import logging
import subprocess
import time
from pathlib import Path

from hpctrain.rundir import RunDir
from hpctrain.slurm import watch

log = logging.getLogger(__name__)

# A pin still without a job id after this long was left by a training job that died inside sbatch (whose own
# timeout is 60 s): nothing will evaluate that step.
SUBMIT_GRACE_S = 300.0


def pinned(checkpoints: Path, steps: list[int]) -> set[int]:
    """Of ``steps`` (about to be pruned), those a pending or running evaluation job still needs.

    A pin whose job Slurm reports ended (or no longer knows) is released here and logged. When Slurm cannot
    be asked, every pinned step is kept: a checkpoint kept one prune too long costs disk, one pruned too
    early costs an evaluation."""
    run = RunDir.of_checkpoints(checkpoints)
    if run is None or not steps:
        return set()
    pins = {s: p for s, p in run.read_eval_pins().items() if s in steps and p.get("released") is None}
    if not pins:
        return set()
    keep = {s for s, p in pins.items() if not p.get("job_id") and time.time() - p["time"] < SUBMIT_GRACE_S}
    jobs = {s: str(p["job_id"]) for s, p in pins.items() if p.get("job_id")}
    try:
        states = watch.watched_states(list(jobs.values())) if jobs else {}
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as err:
        log.warning(
            "trainer.eval_job: cannot ask Slurm about evaluation jobs (%s): keeping steps %s",
            err,
            ", ".join(map(str, sorted(pins))),
        )
        return set(pins)
    for step in sorted(pins):
        job = jobs.get(step)
        state = states.get(job) if job else None
        if state is not None and not state.final:  # PENDING, RUNNING, COMPLETING, REQUEUED, ...
            keep.add(step)
        elif step not in keep:
            ended = state.state if state is not None else "(unknown to Slurm)"
            why = f"job {job} ended {ended} before reading it" if job else "never submitted (sbatch hung)"
            log.warning(
                "trainer.eval_job: evaluation of step %d missing: %s; pruning its checkpoint", step, why
            )
            run.write_eval_pin(step, job, released=why)
    return keep
