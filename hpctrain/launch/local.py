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

The supervision is :class:`hpctrain.launch.supervisor.Supervisor`'s, the one loop every Slurm task's agent
runs too; this module is what only this machine knows (:class:`_Site`) and the launch's report.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from hpctrain.config.schema import Config
from hpctrain.config.shape import run_shape
from hpctrain.errors import ConfigError
from hpctrain.launch.forked import ForkServer, ForkServerError, server_for
from hpctrain.launch.health import problem as health_problem
from hpctrain.launch.project import PROJECT_DIR_ENV, project_dir, worker_pythonpath
from hpctrain.launch.spawn import start_worker
from hpctrain.launch.supervision import Outcome, RestartBook, Stalls, worker_restart_env
from hpctrain.launch.supervisor import POLL_S, Ended, Supervisor, Worker
from hpctrain.rendezvous.env import RESTART_ENV
from hpctrain.resilience.watchdog import job_key
from hpctrain.rundir import RunDir
from hpctrain.rundir.checkpoints import JOB_ID_ENV, FastTierPaths, job_identity, run_key
from hpctrain.rundir.records import EXIT_STOPPED, read_user_traceback
from hpctrain.rundir.runs import continue_command

log = logging.getLogger(__name__)


@dataclass
class LocalLauncher:
    poll_s: float = POLL_S
    _supervisor: Supervisor | None = field(default=None, init=False)
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
        log.info("Run directory: %s", run_dir)
        own_job = JOB_ID_ENV not in os.environ
        self._job_id = os.environ.get(JOB_ID_ENV) or uuid.uuid4().hex[:16]
        site = _Site(cfg, run_dir, self._job_id, _console_fd())
        c = cfg.cluster
        book = None  # restarts off: the first failure ends the launch, unanswered
        if c.max_restarts:
            book = RestartBook(run_dir, self._job_id, c.max_restarts, c.max_no_progress)
        # Before the handlers and the fork server (seconds: it imports torch): a Ctrl-C from here on is the
        # supervisor's, which tells the workers once they are up.
        self._supervisor = Supervisor(site, book, cfg, self.poll_s)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        owned = False
        try:
            site.server, owned = server_for(cfg.cluster.fork_server, _server_env(cfg))
            how = f", forked from fork server {site.server.pid}" if site.server else ""
            log.info("Starting %d worker process%s (rank logs in %s%s)", nproc, "es" * (nproc > 1), logs, how)
            ended = self._supervisor.run()
        except (ConfigError, ForkServerError) as err:  # the server named by HPCTRAIN_FORKSERVER, or it died
            print(f"hpctrain: {err}", file=sys.stderr)
            return 2 if isinstance(err, ConfigError) else 1
        finally:
            self._supervisor.close()
            if own_job and cfg.checkpoint.local_every is not None:  # the job ends with this launch
                job = job_identity({JOB_ID_ENV: self._job_id})
                assert job is not None
                FastTierPaths(Path(cfg.checkpoint.local_path), run_key(run_dir), job).remove_job()
            if site.server is not None and owned:
                site.server.close()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            if site.console_fd is not None:
                os.close(site.console_fd)
        return _report(ended, run_dir)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self._supervisor is not None:  # made before the handlers are installed
            self._supervisor.on_signal(signum)


@dataclass
class _Site:
    """This machine, for the supervisor: ``nproc`` ranks on loopback, a fresh rendezvous port per
    generation, the fork server started for the launch (or named by HPCTRAIN_FORKSERVER)."""

    cfg: Config
    run_dir: Path
    job_id: str
    console_fd: int | None
    server: ForkServer | None = None
    host: str = field(default_factory=socket.gethostname)
    shared: ClassVar[bool] = False  # one supervisor holds every rank of the launch
    interactive: ClassVar[bool] = True  # a second Ctrl-C stops the workers at once
    port: int = 0

    def begin(self, generation: int) -> list[int] | int:
        unhealthy = health_problem(self.run_dir, self.cfg.cluster.health_check, self.host)
        if unhealthy is not None:  # one machine: nothing to exclude, the run cannot start
            print(f"hpctrain: {unhealthy}", file=sys.stderr)
            return 1
        self.port = free_port(self.cfg.cluster.master_addr)  # off the ports a killed generation held
        return list(range(self.cfg.cluster.nproc))

    def spawn(self, rank: int, generation: int) -> Worker:
        nproc = self.cfg.cluster.nproc
        env = _server_env(self.cfg)
        env.update(worker_restart_env(generation))
        env.update(
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(nproc),
            LOCAL_WORLD_SIZE=str(nproc),
            MASTER_ADDR=self.cfg.cluster.master_addr,
            MASTER_PORT=str(self.port),
            # The process whose death must end the worker: its parent, this launcher or the fork server.
            HPCTRAIN_LAUNCHER_PID=str(self.server.pid if self.server else os.getpid()),
            HPCTRAIN_JOB_ID=self.job_id,
            PYTHONUNBUFFERED="1",
        )
        # Ranks ≥ cores oversubscribe the CPU and every intra-op pool fights for it: split the cores.
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
        console = self.console_fd if rank == 0 else None
        if console is not None:
            env["HPCTRAIN_CONSOLE_FD"] = str(console)
        log_path = RunDir(self.run_dir).log(rank)
        with open(log_path, "ab") as out:
            worker = start_worker(self.run_dir, env, self.server, out.fileno(), console)
        mode = getattr(worker, "mode", "fork")
        if mode != "fork":
            log.info("Rank %d: a fresh interpreter, not a fork: %s", rank, mode)
        return Worker(rank, worker, log_path)

    def key(self, generation: int) -> str:
        c = self.cfg.cluster
        return job_key(
            {"MASTER_ADDR": c.master_addr, "MASTER_PORT": str(self.port), RESTART_ENV: str(generation)}
        )

    def stalls(self, generation: int) -> Stalls:
        return Stalls(self.run_dir, None, self.job_id, generation, generation < self.cfg.cluster.max_restarts)

    def grace_s(self, generation: int) -> float:
        # A restart follows a failure: the others are killed at once (their state is given up for the
        # checkpoint), not given kill_grace_s to stop.
        c = self.cfg.cluster
        return 0.0 if c.max_restarts and generation < c.max_restarts else c.kill_grace_s

    def unhealthy(self, rank: int, why: str) -> int | None:
        return None  # one machine: nothing to exclude; the fault is answered as any other

    def lost(self, outcome: Outcome, hung: bool, ended: float, first_step: int) -> None:
        return None  # no node to lose but this one

    def culprit(self, outcome: Outcome, key: str, ended: float, restarts: bool) -> Outcome:
        return outcome  # every rank is this launcher's: the cause came in first (supervisor.SETTLE_S)


def _report(ended: Ended, run_dir: Path) -> int:
    """The launch's last lines and exit status."""
    if ended.code is not None:
        return ended.code
    workers, failures = ended.workers, ended.failures
    if ended.signal is not None:
        if workers and all(w.proc.returncode == EXIT_STOPPED for w in workers):
            # Every rank saved, and rank 0 said so on the console ("Stopped by Ctrl-C after step N;
            # checkpoint saved"): one stop line, then only the way on.
            log.info("hpctrain: continue with: %s", continue_command(run_dir))
        else:  # a second Ctrl-C, or a rank that could not save: no rank said anything
            name = signal.Signals(ended.signal).name
            name = "Ctrl-C" if ended.signal == signal.SIGINT else name
            log.error("hpctrain: stopped by %s; continue with: %s", name, continue_command(run_dir))
        return 128 + ended.signal
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
        if ended.why is not None:  # the cause last, in one line
            print(f"hpctrain: {ended.why}", file=sys.stderr)
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
