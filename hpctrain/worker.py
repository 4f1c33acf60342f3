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
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.rundir import RunDir, RunLock

if TYPE_CHECKING:
    from hpctrain.rendezvous.env import DistEnv
    from hpctrain.resilience.signals import StopSignals
    from hpctrain.resilience.watchdog import Heartbeat

PR_SET_PDEATHSIG = 1
LOCK_WAIT_S = 15.0

log = logging.getLogger("hpctrain.worker")


def run(run_dir: Path) -> None:
    """Train this process's rank of the run in ``run_dir``; raise (after recording it) on failure."""
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
    try:
        _train(run_dir)
    except BaseException as err:
        _record_error(run_dir, rank, err)
        raise


def main(argv: list[str]) -> None:
    _die_with_launcher()
    try:
        run(Path(argv[0]))
    except BaseException:
        _finish(1)
    _finish(0)


def _train(run_dir: Path) -> None:
    from hpctrain.resilience.signals import StopSignals

    # First of all: a pre-emption signal that arrives while torch is still importing must not be lost (nor,
    # for USR2, kill the process, its default action).
    signals = StopSignals({"USR2", "TERM"})

    from hpctrain.rendezvous.env import DistEnv
    from hpctrain.resilience import requeue
    from hpctrain.rundir.records import error_file

    env = DistEnv.from_environ()
    error_file(run_dir, env.rank).unlink(missing_ok=True)  # left by an earlier start of a requeued job
    job_id = requeue.slurm_job_id()
    # One run per directory: under Slurm rank 0 holds the lock (the local launcher holds it for local runs).
    # A requeued job's previous incarnation may still be dying: wait a few seconds for its lock to go.
    lock = RunLock(run_dir).acquire(wait_s=LOCK_WAIT_S, job_id=job_id) if job_id and env.is_main else None
    try:
        from hpctrain.config.io import load_run_config

        cfg = load_run_config(RunDir(run_dir).config)
        if cfg.task.name == "script":
            _script(run_dir, env, job_id, signals, cfg)
        else:
            _fit(run_dir, env, job_id, signals)
    finally:
        if lock is not None:
            lock.release()


def _fit(run_dir: Path, env: DistEnv, job_id: str | None, signals: StopSignals) -> None:
    from omegaconf import OmegaConf

    from hpctrain.config.io import load_run_config
    from hpctrain.config.shape import run_shape
    from hpctrain.observe.loggers import ConsoleLogHandler, Observer, open_console
    from hpctrain.rendezvous.group import init_distributed, record_topology
    from hpctrain.resilience import requeue
    from hpctrain.resilience.stop import StopCheck
    from hpctrain.resilience.watchdog import STALE_AFTER_S, Watchdog, find_culprit, job_key, read_heartbeats
    from hpctrain.rundir.records import is_peer_symptom, read_error_record
    from hpctrain.slurm import commands
    from hpctrain.train.overrides import keep_global_batch
    from hpctrain.train.trainer import fit

    console = open_console() if env.is_main else None
    _setup_logging(run_dir, env.rank, console_handler=ConsoleLogHandler(console) if console else None)
    cfg = load_run_config(RunDir(run_dir).config)
    signals.listen(cfg.cluster.signal)
    device = init_distributed(env, cfg.cluster.dist_timeout_s, RunDir(run_dir))
    log.info("rank %d/%d on %s (%s), pid %d", env.rank, env.world_size, env.hostname, device, os.getpid())
    record_topology(env, RunDir(run_dir))
    end_time = commands.end_time(job_id) if job_id and env.is_main else None
    observer = None
    if env.is_main:
        plain = OmegaConf.to_container(OmegaConf.load(RunDir(run_dir).config))
        observer = Observer(cfg.logger, run_dir, console, plain)  # type: ignore[arg-type]

    def on_hang(culprit: Heartbeat | None, why: str) -> None:
        requeue.respond_to_fault(run_dir, job_id, culprit, why, cfg.cluster.max_requeues)

    t = cfg.trainer
    watchdog = Watchdog(run_dir, env.rank, env.hostname, t.watchdog_factor, t.watchdog_min_s, on_hang)
    try:
        stop = StopCheck(signals, end_time, env.is_main, device)
        cfg = keep_global_batch(cfg, run_dir)
        result = fit(cfg, run_shape(cfg), env, device, run_dir, observer, stop, watchdog)
    except Exception as err:
        if job_id is not None and is_peer_symptom(str(err)):
            # A peer went away: wait until its heartbeat is visibly stale, then name it. A peer that raised an
            # error of its own (a bug, bad data) recorded it: that run must fail, not be requeued. One that
            # left no record was killed (OOM, a node failure): requeue without its node.
            time.sleep(STALE_AFTER_S + 1)
            beats = read_heartbeats(run_dir, job_key())
            culprit, why = find_culprit(beats, time.time())
            own_error = read_error_record(run_dir, culprit.rank) if culprit else None
            if own_error is None or is_peer_symptom(own_error["message"]):
                requeue.respond_to_fault(run_dir, job_id, culprit, why, cfg.cluster.max_requeues)
        raise
    finally:
        watchdog.close()
        if observer is not None:
            observer.close()
    if result.stopped_by is None:
        return
    if job_id is None:
        log.info("Stopped at step %d; continue with trainer.resume=auto", result.state.step)
        return
    requeue.requeue_or_fail(
        job_id, result.stopped_by, result.state.step, cfg.cluster.max_requeues, env.is_main
    )


def _script(run_dir: Path, env: DistEnv, job_id: str | None, signals: StopSignals, cfg: Any) -> None:
    """``task=script``: the user's script on this rank (hpctrain.resilience.script); the script joins the
    process group itself."""
    from hpctrain.resilience.script import run_script

    _setup_logging(run_dir, env.rank, console_handler=None)
    run_script(run_dir, env, job_id, signals, cfg)


def _die_with_launcher() -> None:
    """Ask the kernel for SIGKILL when the local launcher dies, so a killed launcher leaves no orphans."""
    launcher = os.environ.get("HPCTRAIN_LAUNCHER_PID")
    if launcher is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != int(launcher):  # it died before the request was in place
        os._exit(1)


def _setup_logging(run_dir: Path, rank: int, console_handler: logging.Handler | None) -> None:
    """Every rank logs to logs/rank<R>.log; rank 0 also to the console (a terminal, or Slurm's output)."""
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    stamped = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    if "HPCTRAIN_LAUNCHER_PID" in os.environ:
        to_file: logging.Handler = logging.StreamHandler(sys.stderr)  # the local launcher redirects it there
    else:
        RunDir(run_dir).logs.mkdir(parents=True, exist_ok=True)
        to_file = logging.FileHandler(RunDir(run_dir).log(rank))
    to_file.setFormatter(stamped)
    root.addHandler(to_file)
    if console_handler is None and rank == 0 and "HPCTRAIN_LAUNCHER_PID" not in os.environ:
        console_handler = logging.StreamHandler(sys.stdout)
    if console_handler is not None:
        console_handler.setFormatter(logging.Formatter("%(message)s"))
        root.addHandler(console_handler)


def _record_error(run_dir: Path, rank: int, err: BaseException) -> None:
    from hpctrain.rundir.records import write_error_record

    text = "".join(traceback.format_exception(err))
    print(text, file=sys.stderr, flush=True)
    message = str(err).strip().splitlines()
    try:
        write_error_record(run_dir, rank, type(err).__name__, message[0] if message else "", text)
    except OSError as io_err:
        print(f"could not record the error in {RunDir(run_dir).logs}: {io_err}", file=sys.stderr)


def _finish(status: int) -> None:
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    main(sys.argv[1:])
