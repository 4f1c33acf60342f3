"""The one place that starts ``hpctrain.worker``: forked from a fork server, or a fresh interpreter.

Every supervisor starts its workers here: the local launcher (its ``nproc`` ranks), a Slurm task's agent
(its rank, again for each restart: submitit's task and the srun template's) and a pack's task (each member
in turn). The worker is named,
never imported by the launch layer: ``python -m hpctrain.worker RUN_DIR`` is what a spawned worker runs and
what a forked one becomes (:mod:`hpctrain.forkserver`). The sbatch templates' ``srun`` lines name the
same module.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.launch.forkwire import ServerGone
from hpctrain.observe.goodput import STARTED_ENV
from hpctrain.resilience.signals import HELD_AT_START

if TYPE_CHECKING:
    from hpctrain.launch.forked import ForkedProcess, ForkServer

WORKER_MODULE = "hpctrain.worker"


def start_worker(
    run_dir: Path | str,
    env: Mapping[str, str] | None = None,
    server: ForkServer | None = None,
    out: int | None = None,
    console_fd: int | None = None,
    session: bool = True,
) -> subprocess.Popen[bytes] | ForkedProcess:
    """Start the worker of ``run_dir``: forked from ``server`` when one is given and still there, else a
    fresh interpreter. ``env``: its whole environment (None: this process's); ``out``: the descriptor its
    stdout and stderr go to (None: this process's stdout); ``console_fd``: passed on, under the number
    ``env["HPCTRAIN_CONSOLE_FD"]`` names; ``session``: a fresh interpreter leads a session of its own (a
    forked one always does), so that its supervisor can kill its process group."""
    sys.stdout.flush()
    # The worker starts with the stop signals blocked (forked: the mask sent with the request; spawned: the
    # mask inherited through fork and exec); it takes them once its handlers are in. Held here meanwhile too:
    # a Ctrl-C during the start reaches this process's handler right after it.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_AT_START)
    try:
        return _start(run_dir, env, server, out, console_fd, session)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def _start(
    run_dir: Path | str,
    env: Mapping[str, str] | None,
    server: ForkServer | None,
    out: int | None,
    console_fd: int | None,
    session: bool,
) -> subprocess.Popen[bytes] | ForkedProcess:
    environ = dict(os.environ if env is None else env)
    environ[STARTED_ENV] = repr(time.time())  # the goodput ledger's start of this attempt
    environ.setdefault("PYTHONUNBUFFERED", "1")  # its lines reach its log (or Slurm's output file) as written
    if server is not None:
        with contextlib.suppress(ServerGone):  # died since it was checked: this start spawns instead
            fd = sys.stdout.fileno() if out is None else out
            return server.spawn(WORKER_MODULE, [str(run_dir)], environ, fd, console_fd)
    return subprocess.Popen(
        [sys.executable, "-m", WORKER_MODULE, str(run_dir)],
        env=environ,
        stdin=subprocess.DEVNULL if out is not None else None,
        stdout=out,
        stderr=subprocess.STDOUT if out is not None else None,
        start_new_session=session,
        pass_fds=(console_fd,) if console_fd is not None else (),
    )
