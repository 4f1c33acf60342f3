"""One training process.

- ``python -m hpctrain.worker RUN_DIR``: started by the local launcher, an sbatch template's srun, or
  torchrun. Exits 0 or 1 through ``os._exit`` once its results are on disk: torch's C++ teardown after
  distributed work can abort a finished process (SIGABRT at exit), and the exit status must say what the
  run did.
- :func:`run`: the same as a function, for submitit's tasks (an error propagates, so Slurm marks the job
  FAILED and submitit records the exception).

Either way the process reads RUN_DIR/config.yaml, joins the process group, trains, and on an error first
records ``logs/rank<R>.error.json`` (type, message, traceback, host) for launchers and ``hpctrain status``.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

from hpctrain.observe.logs import setup_logging
from hpctrain.observe.streams import guard_std_streams
from hpctrain.resilience.signals import LAUNCHER_PID_ENV
from hpctrain.rundir import RunDir, RunLock
from hpctrain.rundir.records import EXIT_STOPPED
from hpctrain.version import EXIT_UNSUPPORTED, UnsupportedEnvironment, environment_problem

if TYPE_CHECKING:
    from hpctrain.config.schema import Config

PR_SET_PDEATHSIG = 1
LOCK_WAIT_S = 15.0

log = logging.getLogger("hpctrain.worker")


def run(run_dir: Path, cfg: Config | None = None) -> bool:
    """Train this process's rank of the run in ``run_dir``; raise (after recording it) on failure. Whether
    the run reached its end (False: a stop signal ended it early, with a checkpoint). ``cfg``: the run's
    config when the caller has read it already (config.yaml is read once per process)."""
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    # A node's environment may not be the submitting machine's: refused before anything imports torch or
    # writes a file (no error record: the one line says it all).
    refusal = environment_problem()
    if refusal is not None:
        raise UnsupportedEnvironment(refusal)
    try:
        return _train(run_dir, cfg)
    except BaseException as err:
        _record_error(run_dir, rank, err)
        raise


def _record_torchrun_restart(run_dir: Path, generation: int) -> None:
    """The fault log's answer for a restart by torchrun's agent (it names no cause: the failed worker's own
    log and error record do)."""
    import time

    from hpctrain.resilience.requeue import slurm_job_id
    from hpctrain.rundir import checkpoints as layout

    found = layout.committed(RunDir(run_dir).shared_checkpoints)
    RunDir(run_dir).append_answer(
        {
            "time": time.time(),
            "job": f"{slurm_job_id() or 'local'}.r{os.environ.get('SLURM_RESTART_COUNT', '0')}",
            "generation": generation - 1,
            "cause": "a worker failed (restarted by torchrun's agent)",
            "rank": None,
            "host": None,
            "action": "restart",
            "resume_step": layout.step_of(found[0]) if found else 0,
        }
    )


def main(argv: list[str]) -> None:
    _die_with_launcher()
    # A rank's stdout and stderr are its log under the local launcher, but torchrun's or srun's pipes
    # elsewhere: a reader that went away must not turn a saved stop into a failed rank (observe.streams).
    guard_std_streams()
    try:
        finished = run(Path(argv[0]))
    except UnsupportedEnvironment as err:
        print(err, file=sys.stderr, flush=True)
        _finish(EXIT_UNSUPPORTED)
    except BaseException:
        _finish(1)
    _finish(0 if finished else EXIT_STOPPED)  # a stopped run is not a finished one, nor a failed one


def _train(run_dir: Path, cfg: Config | None) -> bool:
    from hpctrain.resilience.signals import StopSignals, release_held

    # First of all: a pre-emption signal that arrives while torch is still importing must not be lost (nor,
    # for USR2, kill the process, its default action). The local launcher forwards a Ctrl-C at its terminal as
    # SIGINT (its ranks have sessions of their own: the terminal's reaches none of them), so that the stop
    # line says Ctrl-C, not SIGTERM.
    signals = StopSignals({"USR2", "TERM", *(["INT"] if LAUNCHER_PID_ENV in os.environ else [])})
    release_held()  # what its supervisor forwarded while this process started comes in now

    from hpctrain.rendezvous.env import DistEnv, adopt_torchrun_restarts
    from hpctrain.resilience import requeue
    from hpctrain.rundir.records import error_file

    restarted = adopt_torchrun_restarts(os.environ)
    env = DistEnv.from_environ()
    if restarted and env.is_main:  # torchrun's agent restarted the workers: recorded as hpctrain's agent does
        _record_torchrun_restart(run_dir, restarted)
    error_file(run_dir, env.rank).unlink(missing_ok=True)  # left by an earlier start of a requeued job
    job_id = requeue.slurm_job_id()
    # One run per directory: under Slurm rank 0 holds the lock (the local launcher holds it for local runs).
    # A requeued job's previous incarnation may still be dying: wait a few seconds for its lock to go.
    lock = RunLock(run_dir).acquire(wait_s=LOCK_WAIT_S, job_id=job_id) if job_id and env.is_main else None
    try:
        if cfg is None:
            from hpctrain.config.io import load_run_config

            cfg = load_run_config(RunDir(run_dir).config)
        if cfg.task.name == "script":
            from hpctrain.task.script import run_script

            setup_logging(run_dir, env.rank, console_handler=None)
            run_script(run_dir, env, job_id, signals, cfg)
            return True
        from hpctrain.task.train import run_training

        return run_training(run_dir, env, job_id, signals, cfg)
    finally:
        if lock is not None:
            lock.release()


def _die_with_launcher() -> None:
    """Ask the kernel for SIGKILL when the local launcher dies, so a killed launcher leaves no orphans."""
    # The local launcher (or its fork server), or a Slurm task's restart agent (or its fork server).
    launcher = os.environ.get(LAUNCHER_PID_ENV) or os.environ.get("HPCTRAIN_AGENT_PID")
    if launcher is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(launcher):  # it died before the request was in place
        os._exit(1)


def _record_error(run_dir: Path, rank: int, err: BaseException) -> None:
    from hpctrain.errors import error_facts, underlying, user_traceback
    from hpctrain.rundir.records import write_error_record

    text = "".join(traceback.format_exception(err))
    print(text, file=sys.stderr, flush=True)
    # A collective save's failure is named by the error it wraps (a store's timeout, a full disk), not by
    # DCP's "CheckpointException ranks:dict_keys([1])".
    shown = underlying(err)
    message = str(shown).strip().splitlines()
    kind, first = type(shown).__name__, message[0] if message else ""
    try:
        write_error_record(run_dir, rank, kind, first, text, user_traceback(err), error_facts(err))
    except OSError as io_err:
        print(f"could not record the error in {RunDir(run_dir).logs}: {io_err}", file=sys.stderr)


def _finish(status: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
