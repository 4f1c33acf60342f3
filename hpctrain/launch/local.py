"""``cluster=local``: start ``nproc`` worker processes on this machine and supervise them.

Each worker is ``python -m hpctrain.worker RUN_DIR`` with torchrun-style variables (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT on loopback): forked from a fork server that has imported torch once
(:mod:`hpctrain.launch.forked`; ``cluster.fork_server=false`` or ``HPCTRAIN_FORKSERVER=off`` start fresh
interpreters instead). Each runs in its own session so that the launcher can stop a worker together with
anything it spawned (compile workers, the W&B service); workers also ask the kernel to kill them if the
process that started them dies (see :mod:`hpctrain.worker`): the launcher, or the fork server, which the
launcher's death or hang-up ends in turn. No process outlives a run.

When one worker fails, the others are stopped (SIGTERM, then SIGKILL after ``cluster.kill_grace_s``) and
the launcher exits non-zero naming the rank and its error. Ctrl-C (or SIGTERM) is different: the workers
are asked to stop and given all the time they need to finish their step and save a checkpoint; a second
Ctrl-C stops them as after a failure. No torch import here.

The launch is the workers' job (``HPCTRAIN_JOB_ID``, a fresh id unless the launcher's own environment has one:
a restart that keeps it is inside the same job). The checkpoint fast tier of a job
(``checkpoint.local_every``) is removed when the launch that made its id ends; one whose id was given from
outside belongs to whoever gave it (a restart agent), which removes it (``FastTierPaths.remove_job``).

Over 400 lines: the local launcher's start, supervision, stop and failure reports share one set of workers and
their signals (issue 42's one supervisor will move the decisions out).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hpctrain.config.schema import Config
from hpctrain.config.shape import run_shape
from hpctrain.errors import ConfigError
from hpctrain.launch.exits import exit_outcome, oom_kills
from hpctrain.launch.forked import ForkServer, ForkServerError, server_for
from hpctrain.launch.health import problem as health_problem
from hpctrain.launch.project import PROJECT_DIR_ENV, project_dir, worker_pythonpath
from hpctrain.launch.spawn import start_worker
from hpctrain.launch.supervision import (
    Outcome,
    RestartBook,
    Stalls,
    hang_culprit,
    is_final,
    worker_restart_env,
)
from hpctrain.plan.host import planned
from hpctrain.rendezvous.env import RESTART_ENV
from hpctrain.resilience import policy
from hpctrain.resilience.watchdog import job_key
from hpctrain.rundir import RunDir
from hpctrain.rundir.checkpoints import JOB_ID_ENV, FastTierPaths, job_identity, run_key
from hpctrain.rundir.records import (
    EXIT_STOPPED,
    is_peer_symptom,
    read_error_file,
    read_user_traceback,
    record_killed,
    write_error_record,
)
from hpctrain.rundir.runs import continue_command

log = logging.getLogger(__name__)

POLL_S = 0.05
# After a first failure, how long to keep collecting exits before stopping the rest: when one rank dies, its
# peers fail within a second with a connection error, and the report should name the cause, not a symptom.
SETTLE_S = 1.0


class _Process(Protocol):
    """What supervision needs of a worker: a ``subprocess.Popen`` or a ``forked.ForkedProcess``."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class _Worker:
    rank: int
    proc: _Process
    log_path: Path
    exited_at: float | None = None


@dataclass
class _Failure:
    rank: int
    pid: int
    returncode: int
    detail: str
    log_path: Path

    exited_at: float

    def describe(self) -> str:
        return f"rank {self.rank} (pid {self.pid}) {self.detail} — log: {self.log_path}"

    @property
    def is_peer_symptom(self) -> bool:
        return self.returncode > 0 and is_peer_symptom(self.detail)


@dataclass
class LocalLauncher:
    poll_s: float = POLL_S
    _stop_signal: int | None = field(default=None, init=False)
    _signals_seen: int = field(default=0, init=False)
    _job_id: str = field(default="", init=False)

    def launch(self, cfg: Config, run_dir: Path) -> int:
        nproc = cfg.cluster.nproc
        if cfg.dry_run:
            log.info("Dry run: nothing started.")
            log.info(
                "Plan: %d local process%s (parallel=%s: %s), each: %s -m hpctrain.worker %s",
                nproc,
                "es" * (nproc > 1),
                cfg.parallel.name,
                run_shape(cfg).degrees,
                sys.executable,
                run_dir,
            )
            return 0
        logs = RunDir(run_dir).logs
        logs.mkdir(parents=True, exist_ok=True)
        for stale in RunDir(run_dir).error_files():  # from an earlier attempt in the same run dir
            stale.unlink()
        port = free_port(cfg.cluster.master_addr)
        log.info("Run directory: %s", run_dir)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        console_fd = _console_fd()
        workers: list[_Worker] = []
        own_job = JOB_ID_ENV not in os.environ
        self._job_id = os.environ.get(JOB_ID_ENV) or uuid.uuid4().hex[:16]
        server: ForkServer | None = None
        owned = False
        stopped_why: str | None = None  # why the policy stopped the run (a crash loop, out of memory, ...)
        try:
            server, owned = server_for(cfg.cluster.fork_server, _server_env(cfg))
            how = f", forked from fork server {server.pid}" if server else ""
            log.info("Starting %d worker process%s (rank logs in %s%s)", nproc, "es" * (nproc > 1), logs, how)
            c = cfg.cluster
            book = None
            if c.max_restarts:
                book = RestartBook(run_dir, self._job_id, c.max_restarts, c.max_no_progress)
            generation = 0
            while True:
                unhealthy = health_problem(run_dir, c.health_check, socket.gethostname())
                if unhealthy is not None:  # one machine: nothing to exclude, the run cannot start
                    print(f"hpctrain: {unhealthy}", file=sys.stderr)
                    return 1
                started, first_step = time.time(), book.resume_step() if book else 0
                oom_before = oom_kills()
                for rank in range(nproc):
                    workers.append(self._spawn(cfg, run_dir, rank, port, console_fd, server, generation))
                # A restart follows a failure: the others are killed at once (their state is given up for the
                # checkpoint), not given kill_grace_s to stop.
                grace = 0.0 if book is not None and generation < c.max_restarts else c.kill_grace_s
                stalls = Stalls(run_dir, None, self._job_id, generation, generation < c.max_restarts)
                failures = self._supervise(workers, grace, run_dir, stalls)
                host = socket.gethostname()
                plan = functools.partial(planned, cfg)  # asked for only after an OOM kill
                outcomes = [
                    exit_outcome(run_dir, f.rank, host, f.returncode, f.pid, oom_before, plan)
                    for f in failures
                ]
                for outcome, failed in zip(outcomes, failures, strict=True):
                    if failed.returncode < 0 and self._stop_signal is None:  # it could record nothing itself
                        record_killed(
                            run_dir, failed.rank, -failed.returncode, c.max_restarts, outcome.detail
                        )
                if not failures or book is None or self._stop_signal is not None:
                    break
                if any(is_final(run_dir, f.rank) for f in failures):  # e.g. trainer.nonfinite=stop
                    break
                outcome = outcomes[0]
                hang = hang_culprit(run_dir, started)
                if hang is not None:
                    outcome = Outcome(*hang, kind=policy.HUNG)
                book.claim(generation)
                key = job_key(
                    {"MASTER_ADDR": c.master_addr, "MASTER_PORT": str(port), RESTART_ENV: str(generation)}
                )
                action = book.answer(generation, outcome, started, first_step, key)
                if isinstance(action, policy.Fail):
                    if action.error == policy.CRASH_LOOP:  # else its rank's record is the cause
                        with contextlib.suppress(OSError):
                            write_error_record(run_dir, 0, "CrashLoop", action.why)
                    if action.error != policy.CAPS_USED:
                        stopped_why = action.why
                if not isinstance(action, policy.Restart):
                    break
                for worker in workers:
                    _kill_group(worker.proc.pid, signal.SIGKILL)
                workers.clear()
                generation += 1
                port = free_port(c.master_addr)  # off the ports the killed generation held
        except (ConfigError, ForkServerError) as err:  # the server named by HPCTRAIN_FORKSERVER, or it died
            print(f"hpctrain: {err}", file=sys.stderr)
            return 2 if isinstance(err, ConfigError) else 1
        finally:
            for worker in workers:
                _kill_group(worker.proc.pid, signal.SIGKILL)  # leftovers of finished workers, if any
            if own_job and cfg.checkpoint.local_every is not None:  # the job ends with this launch
                job = job_identity({JOB_ID_ENV: self._job_id})
                assert job is not None
                FastTierPaths(Path(cfg.checkpoint.local_path), run_key(run_dir), job).remove_job()
            if server is not None and owned:
                server.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if console_fd is not None:
                os.close(console_fd)
        if self._stop_signal is not None:
            if workers and all(w.proc.returncode == EXIT_STOPPED for w in workers):
                # Every rank saved, and rank 0 said so on the console ("Stopped by Ctrl-C after step N;
                # checkpoint saved"): one stop line, then only the way on.
                log.info("hpctrain: continue with: %s", continue_command(run_dir))
            else:  # a second Ctrl-C, or a rank that could not save: no rank said anything
                name = signal.Signals(self._stop_signal).name
                name = "Ctrl-C" if self._stop_signal == signal.SIGINT else name
                log.error("hpctrain: stopped by %s; continue with: %s", name, continue_command(run_dir))
            return 128 + self._stop_signal
        if failures:
            first, *others = failures
            # Ranks that failed with the very same error (a refusal every rank reaches alike) add no line.
            alike = [o.rank for o in others if o.detail == first.detail]
            also = f" (rank{'s' * (len(alike) > 1)} {', '.join(map(str, alike))} alike)" if alike else ""
            frames = read_user_traceback(run_dir, first.rank)  # the user's code raised: their frames first
            if frames:
                print(frames, file=sys.stderr, end="")
            print(f"hpctrain: {first.describe()}{also}", file=sys.stderr)
            for other in others:
                if other.detail != first.detail:
                    print(f"hpctrain:   then {other.describe()}", file=sys.stderr)
            if stopped_why is not None:  # the cause last, in one line
                print(f"hpctrain: {stopped_why}", file=sys.stderr)
            return 1
        if any(w.proc.returncode == EXIT_STOPPED for w in workers):
            # A stop signal reached the workers but not this command (e.g. one kill of a rank): they saved,
            # but the run did not reach its end, and the exit status must not say it did.
            print(
                "hpctrain: the workers stopped before the end (a stop signal reached them, not this "
                f"command); continue with: {continue_command(run_dir)}",
                file=sys.stderr,
            )
            return EXIT_STOPPED
        _print_outputs(run_dir)
        return 0

    def _on_signal(self, signum: int, _frame: object) -> None:
        self._stop_signal = signum
        self._signals_seen += 1

    def _spawn(
        self,
        cfg: Config,
        run_dir: Path,
        rank: int,
        port: int,
        console_fd: int | None,
        server: ForkServer | None,
        generation: int = 0,
    ) -> _Worker:
        nproc = cfg.cluster.nproc
        env = _server_env(cfg)
        env.update(worker_restart_env(generation))
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR=cfg.cluster.master_addr,
            MASTER_PORT=str(port),
            # The process whose death must end the worker: its parent, this launcher or the fork server.
            HPCTRAIN_LAUNCHER_PID=str(server.pid if server else os.getpid()),
            HPCTRAIN_JOB_ID=self._job_id,
            PYTHONUNBUFFERED="1",
        )
        # Ranks ≥ cores oversubscribe the CPU and every intra-op pool fights for it: split the cores.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        console = console_fd if rank == 0 else None
        if console is not None:
            env["HPCTRAIN_CONSOLE_FD"] = str(console)
        log_path = RunDir(run_dir).log(rank)
        with open(log_path, "ab") as out:
            worker = start_worker(run_dir, env, server, out.fileno(), console)
        mode = getattr(worker, "mode", "fork")
        if mode != "fork":
            log.info("Rank %d: a fresh interpreter, not a fork: %s", rank, mode)
        return _Worker(rank, worker, log_path)

    def _supervise(
        self, workers: list[_Worker], grace_s: float, run_dir: Path, stalls: Stalls
    ) -> list[_Failure]:
        """Wait for the workers; on the first failure, stop the rest. Failures come back cause first. A
        worker hung in any phase (its own heartbeat stale) is killed: its failure says so."""
        failures: list[_Failure] = []
        settle_until: float | None = None
        asked = False  # the workers were asked to stop (first Ctrl-C)
        while True:
            look = not failures and stalls.due()
            for worker in workers:
                hung = (
                    stalls.hung(worker.rank, worker.proc.pid) if look and worker.exited_at is None else None
                )
                if hung is not None:
                    _kill_group(worker.proc.pid, signal.SIGKILL)
                    worker.proc.wait()
                if worker.exited_at is None and worker.proc.poll() is not None:
                    worker.exited_at = time.monotonic()
                    if hung is not None:
                        failures.append(_failure(worker, run_dir, hung))
                    elif worker.proc.returncode not in (0, EXIT_STOPPED):
                        failures.append(_failure(worker, run_dir))
            if failures and settle_until is None:
                settle_until = time.monotonic() + SETTLE_S
            done = all(w.exited_at is not None for w in workers)
            settled = settle_until is not None and time.monotonic() >= settle_until
            if self._stop_signal is not None and self._signals_seen == 1 and not failures and not done:
                if not asked:
                    # Not SIGKILL after a grace time: a step longer than it would lose every step since
                    # the last checkpoint. The workers save at their next step boundary and exit.
                    log.warning(
                        "Stopping: the workers finish their step and save a checkpoint "
                        "(Ctrl-C again to stop them at once)"
                    )
                    # The signal this command got: SIGINT for a Ctrl-C (the workers' sessions are not the
                    # terminal's, so only this reaches them), which their stop line then calls Ctrl-C.
                    for worker in workers:
                        if worker.proc.poll() is None:
                            _kill_group(worker.proc.pid, self._stop_signal)
                    asked = True
                time.sleep(self.poll_s)
                continue
            if self._stop_signal is not None or settled or (done and failures):
                _stop(workers, grace_s)
                return sorted(failures, key=lambda f: (f.is_peer_symptom, f.exited_at))
            if done:
                return failures
            time.sleep(self.poll_s)


def _server_env(cfg: Config) -> dict[str, str]:
    """The environment every worker of the run shares (a per-launch fork server starts with it too)."""
    env = dict(os.environ)
    # cluster.env, secrets included, from the launching process's typed config (config.yaml has *** for a
    # secret): the workers inherit it, as a Slurm job inherits the submitter's environment.
    env.update({str(k): str(v) for k, v in cfg.cluster.env.items()})
    # The user's package, importable from the submit directory, after hpctrain's own path entry.
    env[PROJECT_DIR_ENV] = str(project_dir())
    env["PYTHONPATH"] = worker_pythonpath(project_dir(), env.get("PYTHONPATH"))
    return env


def _stop(workers: list[_Worker], grace_s: float) -> None:
    alive = [w for w in workers if w.proc.poll() is None]
    for worker in alive:
        _kill_group(worker.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(w.proc.poll() is None for w in alive) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for worker in alive:
        if worker.proc.poll() is None:
            _kill_group(worker.proc.pid, signal.SIGKILL)
        worker.proc.wait()


def _kill_group(pid: int, sig: int) -> None:
    # The worker leads its own session: its process group id is its pid.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _failure(worker: _Worker, run_dir: Path, hung: str | None = None) -> _Failure:
    code = worker.proc.returncode
    assert code is not None
    if hung is not None:  # killed by this launcher: its heartbeat stood still
        detail = hung
    elif code < 0:
        detail = f"was killed by {signal.Signals(-code).name}"
    else:
        error = read_error_file(run_dir, worker.rank)
        detail = f"failed with exit code {code}" + (f": {error}" if error else "")
    assert worker.exited_at is not None
    return _Failure(worker.rank, worker.proc.pid, code, detail, worker.log_path, worker.exited_at)


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _console_fd() -> int | None:
    """A duplicate of our stdout for rank 0's progress bar; None when stdout is not a real file. Rank 0
    writes to it directly (hpctrain.observe.loggers.open_console), and survives its reader going away."""
    try:
        sys.stdout.flush()
        return os.dup(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        return None


def _print_outputs(run_dir: Path) -> None:
    log.info("Outputs in %s", run_dir)
    rd = RunDir(run_dir)
    for path, what in (
        (rd.config, "config"),
        (rd.metrics, "metrics"),
        (rd.checkpoints, "checkpoints"),
        (rd.logs, "logs"),
    ):
        if path.exists():
            shown = rd.shared_checkpoints if path == rd.checkpoints else path  # checkpoint.path: the store
            log.info("  %-12s %s", what, shown)
