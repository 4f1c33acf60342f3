"""``task=script``: the user's own training script on every rank, with hpctrain's pre-emption handling.

Each rank's worker starts ``python SCRIPT ARGS`` with torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE,
LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT: the script calls ``init_process_group()`` as under torchrun),
``HPCTRAIN_CHECKPOINT_DIR`` (RUN_DIR/checkpoints: the same folder after every requeue, so the script saves
there and resumes from what it finds) and ``HPCTRAIN_REQUEUE_COUNT`` (Slurm's count of this job's requeues).

The pre-emption warning (``cluster.signal``) reaches the worker, which forwards it to the script as
``task.signal`` (SIGTERM by default). The script gets the warning only that way: it starts with
``cluster.signal`` ignored (an ignored signal stays ignored across exec), since Slurm signals every process
of the step and the default action of USR2 would end the script before it could save. Once the script has
exited, or ``cluster.signal_lead_s`` minus a margin has passed (a script that ignores the signal is killed),
the job requeues itself with the trainer's cap (:mod:`hpctrain.resilience.requeue`). Without a warning, a
script that fails fails the run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.resilience import requeue
from hpctrain.resilience.signals import StopSignals, describe
from hpctrain.rundir import RunDir
from hpctrain.rundir.runs import continue_command

if TYPE_CHECKING:
    from hpctrain.rendezvous.env import DistEnv

log = logging.getLogger(__name__)
MARGIN_S = 10.0  # of cluster.signal_lead_s kept for the requeue after the script is gone


class ScriptFailed(RuntimeError):
    pass


def script_path(path: str, run_dir: Path) -> Path:
    """The script as submitted: the copy in the job's snapshot of the project when there is one (the folder
    may change while the job waits), else the file in the submit folder."""
    for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep):
        if entry and Path(entry).is_relative_to(run_dir) and (Path(entry) / path).is_file():
            return Path(entry) / path
    return Path(path).absolute()


def child_environment(env: DistEnv, run_dir: Path) -> dict[str, str]:
    checkpoints = RunDir(run_dir).checkpoints
    return {
        **os.environ,
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "MASTER_ADDR": env.master_addr,
        "MASTER_PORT": str(env.master_port),
        "HPCTRAIN_RUN_DIR": str(run_dir),
        "HPCTRAIN_CHECKPOINT_DIR": str(checkpoints),
        "HPCTRAIN_REQUEUE_COUNT": str(requeue.restart_count()),
    }


def _tee(source: Any, console_fd: int) -> None:
    """Copy the script's output, as it comes, to this worker's stdout (the rank's log) and the console."""
    out = sys.stdout.buffer
    for chunk in iter(lambda: source.read1(65536), b""):
        out.write(chunk)
        out.flush()
        with contextlib.suppress(OSError):  # a console gone (a closed terminal): the log has everything
            os.write(console_fd, chunk)


def run_script(run_dir: Path, env: DistEnv, job_id: str | None, signals: StopSignals, cfg: Any) -> None:
    """Run this rank's copy of the script to its end; forward the warning; requeue after a stop."""
    warning = getattr(signal, f"SIG{cfg.cluster.signal}")
    forward = getattr(signal, f"SIG{cfg.task.signal}")
    signals.listen(cfg.cluster.signal)
    RunDir(run_dir).checkpoints.mkdir(parents=True, exist_ok=True)
    script = script_path(cfg.task.path, run_dir)
    command = [sys.executable, "-u", str(script), *cfg.task.args]
    if env.is_main:
        log.info(
            "Running %s on %d rank(s); checkpoints in %s",
            " ".join(command[2:]),
            env.world_size,
            RunDir(run_dir).checkpoints,
        )

    def ignore_warning() -> None:
        signal.signal(warning, signal.SIG_IGN)
        signal.signal(forward, signal.SIG_DFL)

    # Under Slurm the worker's stdout is the job's output: the script writes to this rank's log instead.
    to_log = None if "HPCTRAIN_LAUNCHER_PID" in os.environ else open(RunDir(run_dir).log(env.rank), "a")  # noqa: SIM115
    # Here, rank 0's output also goes to the console the command was typed in (as torchrun shows it).
    console = os.environ.get("HPCTRAIN_CONSOLE_FD") if env.is_main and to_log is None else None
    tee = None
    try:
        child = subprocess.Popen(
            command,
            env=child_environment(env, run_dir),
            cwd=os.getcwd(),
            preexec_fn=ignore_warning,
            stdout=subprocess.PIPE if console else to_log,
            stderr=subprocess.STDOUT if to_log or console else None,
        )
        if console is not None:
            tee = threading.Thread(target=_tee, args=(child.stdout, int(console)), daemon=True)
            tee.start()
        forwarded_at: float | None = None
        grace = max(cfg.cluster.signal_lead_s - MARGIN_S, 5.0)
        while child.poll() is None:
            if signals.received and forwarded_at is None:
                log.info(
                    "%s: forwarding it to the script as SIG%s", describe(signals.received), cfg.task.signal
                )
                child.send_signal(forward)
                forwarded_at = time.monotonic()
            if forwarded_at is not None and time.monotonic() - forwarded_at > grace:
                log.warning("The script did not exit %.0f s after SIG%s: killing it", grace, cfg.task.signal)
                child.kill()
            time.sleep(0.2)
    finally:
        if tee is not None:
            tee.join(timeout=5)  # the script's last lines, written when it exited
        if to_log is not None:
            to_log.close()
    if signals.received:
        if job_id is None:
            log.info(
                "Stopped by %s; continue with: %s", describe(signals.received), continue_command(run_dir)
            )
            return
        requeue.requeue_or_fail(job_id, describe(signals.received), -1, cfg.cluster.max_requeues, env.is_main)
        return
    if child.returncode != 0:
        # The script's last words (its exception, usually) make the one-line cause of a failed run.
        last = _last_line(RunDir(run_dir).log(env.rank))
        said = f": {last}" if last else ""
        raise ScriptFailed(f"task.path={cfg.task.path} exited with status {child.returncode}{said}")


def _last_line(path: Path, tail_bytes: int = 4096) -> str:
    """The last non-empty line of a rank's log ('' when there is none or it cannot be read)."""
    try:
        with open(path, "rb") as log_file:
            log_file.seek(max(0, path.stat().st_size - tail_bytes))
            lines = log_file.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    return next((line.strip() for line in reversed(lines) if line.strip()), "")[:300]
