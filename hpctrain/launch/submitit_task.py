"""What each Slurm task runs when submitted through submitit (imported on the node from the code snapshot).

The worker is named, not imported: like the local launcher (``python -m hpctrain.worker``) and the sbatch
templates, the launch layer starts the worker side by module name and never imports it
(:mod:`hpctrain.launch.spawn`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
from pathlib import Path
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)


class RestartsFailed(RuntimeError):
    """The task's workers failed and no restart inside the allocation followed (see faults.jsonl)."""


def run_task(run_dir: str) -> None:
    """This Slurm task: its rank's agent (hpctrain.launch.agent), which starts the worker, supervises it and
    answers its faults."""
    from hpctrain.config.io import load_run_config
    from hpctrain.launch.agent import run_task as agent_task
    from hpctrain.rundir import RunDir

    cfg = load_run_config(RunDir(run_dir).config)  # once: the agent takes it from here
    code = agent_task(Path(run_dir), cfg)
    if code != 0:  # an error ends the job FAILED, as the worker's own would
        raise RestartsFailed(f"the worker of this task ended with status {code} ({run_dir})")


class PackFailed(RuntimeError):
    """A member of a pack failed (its own run directory holds the error); the others still ran."""


def run_pack(run_dirs: list[str]) -> None:
    """``cluster.pack``: this task's rank of each member, one member after another, each in its own process
    (a fresh process group, its own lock, its own resume). Every task of the job walks the same list, so a
    member's ranks meet in its rendezvous.

    A requeued pack starts again from the first member: a member already at ``max_steps`` returns at once
    ("nothing to train"), the one that was stopped resumes from its checkpoint, the rest start. A warning
    signal or SIGTERM reaches this process too: the member running then saves and requeues the job itself,
    and no further member is started in this allocation.
    """
    from hpctrain.config.io import load_run_config
    from hpctrain.launch.agent import AGENT_PID_ENV, slurm_job_start
    from hpctrain.launch.nodeserver import node_server
    from hpctrain.launch.spawn import start_worker
    from hpctrain.rundir import RunDir

    stopping: list[str] = []
    child: list[Any] = []

    def note(signum: int, _frame: FrameType | None) -> None:
        stopping.append(signal.Signals(signum).name)
        # Slurm signals the whole step, but a process tracker that does not follow children (or a member
        # forked from the fork server, not this task's child) would leave the member's worker unwarned: pass
        # it on (the worker's stop flag takes it twice alike).
        if child and child[0].poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child[0].pid, signum)

    # Replaces submitit's handlers: the member's worker answers the signal (save, requeue), not submitit.
    for name in ("SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGURG"):
        signal.signal(getattr(signal, name), note)
    # The members fork from the node's fork server (one torch import per node and job start, not one per
    # member and task); their config is the pack's, the first member's says whether.
    server = None
    if load_run_config(RunDir(run_dirs[0]).config).cluster.fork_server:
        server = node_server(os.environ, slurm_job_start(), os.uname().nodename)
    env = {**os.environ, AGENT_PID_ENV: str(server.pid)} if server is not None else None
    failed = []
    try:
        for run_dir in run_dirs:
            if stopping:
                log.info("pack: %s received, not starting %s in this allocation", stopping[0], run_dir)
                return
            log.info("pack: starting %s", run_dir)
            child[:] = [start_worker(run_dir, env, server, session=False)]
            code = child[0].wait()
            if code != 0:
                failed.append(f"{run_dir} (exit {code})")
    finally:
        if server is not None:
            server.close()
    if failed and not stopping:
        raise PackFailed(f"{len(failed)} of {len(run_dirs)} pack members failed: {', '.join(failed)}")
