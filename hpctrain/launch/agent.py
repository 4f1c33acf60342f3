"""Restart inside the allocation (``cluster.max_restarts``): a fault answered at the speed of a fork, not of
the queue. No torch import here.

When a rank exits abnormally or hangs, every rank of the job start is started again, in the same allocation
(same Slurm job id, ``SLURM_RESTART_COUNT`` unchanged), and resumes from the newest valid checkpoint (the
node-local fast tier when it is newer: :mod:`hpctrain.checkpoint.fast`). The workers are forked from a fork
server that imported torch once (:mod:`hpctrain.launch.forked`), so a restart costs a fork, a rendezvous and
a checkpoint load, not an interpreter importing torch.

Who restarts: the local launcher for its ``nproc`` workers (:mod:`hpctrain.launch.local`), and under Slurm
(submitit's tasks and the srun template) one agent per Slurm task, :func:`run_task`, which is that task's
rank: it starts its worker, forwards Slurm's signals to it, and watches it and the job start's
*generation* (``RUN_DIR/agents/<job>.generation``). The agent whose worker failed claims the restart
(an exclusive create), records it and moves the generation on; every agent that sees the generation move
kills its worker (SIGKILL: a hung or stopped process takes no other signal in time; the state it held is
given up for the checkpoint) and starts the next generation's. A rendezvous port of its own per generation
(:func:`hpctrain.rendezvous.env.task_from_environ`) keeps the new start off the ports the killed one held.

A hang becomes an exit: the watchdog of a rank blocked in a collective (``trainer.watchdog_factor``,
``watchdog_min_s``) records the culprit and exits its process; its agent then restarts the start as above,
and the culprit's agent kills the hung worker. A worker stopped or frozen whole is caught by its own
supervisor in whatever phase (:class:`Stalls`: its heartbeat, written once a second by a thread, stands
still while the process lives), also where its peers wait in a collective no limit is armed in (a report's,
a save's): the supervisor kills it, and the policy answers as for any hang.

Who decides: the supervisor, never the worker. A worker records what it saw (its error, a hang it watched
a peer into) and exits; the agent that claims the fault asks the pure fault policy
(:mod:`hpctrain.resilience.policy`) and carries out its answer: a restart while ``cluster.max_restarts``
has one left in this job start, else a requeue of the Slurm job within ``cluster.max_requeues`` (without
the culprit's node when the fault was the node's), else the end; ``cluster.max_no_progress`` attempts in a
row without a single new training step end the run (a crash loop: the same import error, a full disk) with
the cause in one line. Every Slurm task is its rank's agent, restarts on or off. A stop on Slurm's signal
(a pre-emption, the time limit) is no fault: the worker saves and rank 0 requeues the job
(:func:`hpctrain.resilience.requeue.requeue_or_fail`). Outside the policy: the torchrun sbatch template,
where torchrun's agent restarts the workers (``--max-restarts``) and the job ends once it gives up.

Before each start of its worker an agent checks its node (:mod:`hpctrain.launch.health`); a node that fails
is excluded by a requeue without it.

A lost node (its slurmd gone, its ranks unreachable) is replaced by a spare or left out at the next
generation (``cluster.spare_nodes``, ``cluster.min_nodes``): :mod:`hpctrain.launch.nodes` decides which.

Both run one loop, :class:`hpctrain.launch.supervisor.Supervisor`; this module is a Slurm task's site for it
(:class:`_Task`: its rank's place, its node's health and fork server, a lost node). What the loop reads and
records (how a generation ended, the book of faults and the policy's answers, a stalled worker) is
:mod:`hpctrain.launch.supervision`; the health check lives apart.

Why not torchrun's agent (torch.distributed.elastic): it starts each restart's workers as fresh
interpreters (each imports torch again: 7 s of CPU per rank on the test machine, more than the whole
restart budget), stops a worker with SIGTERM and waits up to 30 s before SIGKILL (a SIGSTOPped rank holds
the restart that long), has no hang detection of its own, and its c10d rendezvous needs one agent per node
where submitit and the srun template start one task per rank. The torchrun sbatch template keeps it
(``--max-restarts``, the same cap).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpctrain.launch import health
from hpctrain.launch.jobscript import survives_lost_nodes
from hpctrain.launch.nodes import Nodes
from hpctrain.launch.nodeserver import node_server
from hpctrain.launch.supervision import Outcome, RestartBook, Stalls, worker_restart_env
from hpctrain.launch.supervisor import POLL_S, Supervisor, Worker
from hpctrain.rendezvous.env import RESTART_ENV
from hpctrain.resilience import policy, requeue
from hpctrain.resilience.watchdog import Heartbeat, job_key, read_heartbeats
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import read_error_record

if TYPE_CHECKING:
    from hpctrain.config.schema import Config

log = logging.getLogger(__name__)

AGENT_PID_ENV = "HPCTRAIN_AGENT_PID"
EXIT_CRASH_LOOP = 4


# --- one Slurm task's agent -------------------------------------------------------------------------------


def slurm_job_start() -> str:
    """This job start's name for the agents' files: job id (array task) and Slurm's restart count."""
    env = os.environ
    job = env.get("SLURM_JOB_ID", "local")
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        job = f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return f"{job}.r{env.get('SLURM_RESTART_COUNT', '0')}"


def run_task(run_dir: Path, cfg: Config) -> int:
    """One Slurm task's rank, with restarts inside the allocation when ``cluster.max_restarts`` > 0: the
    supervisor's loop over one rank (start the worker, watch it and the generation, answer its fault).
    Returns the task's exit status. ``cfg``: the run's config.yaml, as the task read it (once)."""
    c = cfg.cluster
    job_id = requeue.slurm_job_id()
    book = RestartBook(run_dir, slurm_job_start(), c.max_restarts, c.max_no_progress, c.max_requeues, job_id)
    # Spares, or shrinking: this generation's ranks run on its member nodes (hpctrain.launch.nodes).
    nodes = Nodes(run_dir, book.job, c.nodes, c.min_nodes) if survives_lost_nodes(c) else None
    site = _Task(cfg, run_dir, book, job_id, nodes)
    supervisor = Supervisor(site, book, cfg)
    site.signals = supervisor.signals
    for name in ("SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGURG"):
        signal.signal(getattr(signal, name), lambda signum, _frame: supervisor.on_signal(signum))
    try:
        if nodes is not None:
            nodes.start()
        ended = supervisor.run()
    finally:
        supervisor.close()
        if site.server is not None:
            site.server.close()
        if nodes is not None:
            nodes.done()  # the spares leave
            nodes.close()
    if ended.code is not None:
        return ended.code
    if ended.crash_loop:
        return EXIT_CRASH_LOOP
    code = ended.workers[0].proc.returncode if ended.workers else None
    if ended.stopped and not ended.failures:  # stopped by another agent's answer: its worker was killed
        return 1
    if not ended.failures and code is not None:
        return code  # done, or stopped by Slurm's signal (the worker saved and requeued)
    return code or 1


class _Task:
    """One Slurm task, for the supervisor: its rank (its node's place among the members where spares or
    shrinking are on), its node's health before each start, the node's shared fork server (one of the
    task's own after it died), and what a lost node means (:mod:`hpctrain.launch.nodes`)."""

    shared = True
    interactive = False

    def __init__(
        self, cfg: Config, run_dir: Path, book: RestartBook, job_id: str | None, nodes: Nodes | None
    ) -> None:
        self.cfg, self.run_dir, self.book, self.job_id, self.nodes = cfg, run_dir, book, job_id, nodes
        self.host = os.uname().nodename
        self.rank = int(os.environ.get("SLURM_PROCID", "0"))
        self.place: dict[str, str] = {}
        self.server: Any = None
        self.want_server = cfg.cluster.fork_server
        # The node's checks before each start: where restarts are on, or a site script is given.
        self.checks_health = cfg.cluster.max_restarts > 0 or cfg.cluster.health_check is not None
        self.signals: list[int] = []

    def begin(self, generation: int) -> list[int] | int | None:
        if self.nodes is not None:
            members = self.nodes.members()
            if self.nodes.node not in members:  # a spare: wait for a lost node's place, or the end
                self.rank = -1
                return None if _wait_as_spare(self.book, self.nodes, generation, self.signals) else 0
            self.place = self.nodes.place(members)
            self.rank = int(self.place["SLURM_PROCID"])
        unhealthy = (
            health.problem(self.run_dir, self.cfg.cluster.health_check, self.host)
            if self.checks_health
            else None
        )
        if unhealthy is not None:  # before this node's rank joins: the job goes on without the node
            return self.unhealthy(self.rank, unhealthy)
        if self.want_server and (self.server is None or self.server.gone()):  # the first start, or it died
            share = self.server is None  # the node's at first; after it died (with the node's first task's
            if self.server is not None:  # agent), one of this task's own
                self.server.close()
            self.server = node_server(os.environ, self.book.job, self.host, share)
            self.want_server = self.server is not None  # none: fresh interpreters from here on
        return [self.rank]

    def spawn(self, rank: int, generation: int) -> Worker:
        from hpctrain.launch.spawn import start_worker

        env = dict(os.environ)
        env.update(self.place)
        env.update(worker_restart_env(generation))
        env[AGENT_PID_ENV] = str(self.server.pid if self.server else os.getpid())
        # stdout: this task's, i.e. Slurm's output file
        return Worker(rank, start_worker(self.run_dir, env, self.server))

    def key(self, generation: int) -> str:
        return job_key({**os.environ, RESTART_ENV: str(generation)})

    def stalls(self, generation: int) -> Stalls:
        restarts = generation < self.cfg.cluster.max_restarts
        return Stalls(self.run_dir, self.job_id, self.job_id or self.book.job, generation, restarts)

    def grace_s(self, generation: int) -> float:
        return self.cfg.cluster.kill_grace_s  # its one worker has exited: nothing is left to stop

    def unhealthy(self, rank: int, why: str) -> int:
        health.exclude(self.run_dir, rank, self.host, why, self.cfg.cluster.max_requeues)
        return health.EXIT_UNHEALTHY

    def lost(self, outcome: Outcome, hung: bool, ended: float, first_step: int) -> Any:
        if self.nodes is None:
            return None
        replacement = self.nodes.replace(ended)
        if replacement is None:
            return None
        if not replacement.members:  # fewer than min_nodes would remain
            _requeue_without(self.run_dir, replacement.lost, self.cfg.cluster.max_requeues, first_step)
            return 1
        self.nodes.commit(replacement, first_step, requeue.slurm_job_id())
        lost = {
            "lost": replacement.lost,
            "nodes": replacement.members,
            "spares": replacement.spares,
            "shrunk": replacement.shrunk,
        }
        why = f"lost node {', '.join(replacement.lost)}"
        return Outcome(None, replacement.lost[0], why, kind=policy.LOST_NODE), lost

    def culprit(self, outcome: Outcome, key: str, ended: float, restarts: bool) -> Outcome:
        if restarts or self.job_id is None:
            return outcome
        return _peer_culprit(self.run_dir, key, ended, outcome)


def _wait_as_spare(book: RestartBook, nodes: Nodes, generation: int, pending: list[int]) -> bool:
    """A spare's wait: True when the generation moved on (perhaps onto this node), False when the job start's
    ranks are done or Slurm signalled this task (a pre-emption: the members save and requeue)."""
    while not nodes.is_done() and not pending:
        if book.generation() != generation:
            return True
        time.sleep(POLL_S)
    return False


def _requeue_without(run_dir: Path, lost: list[str], max_requeues: int, step: int) -> None:
    """Fewer than cluster.min_nodes would remain: the fault is answered as before, by a requeue without the
    lost nodes (recorded excluded, so the requeue leaves them out)."""
    now = time.time()
    for node in lost:
        RunDir(run_dir).append_fault(
            {
                "time": now,
                "job_id": requeue.slurm_job_id(),
                "rank": None,
                "host": node,
                "step": step,
                "why": "node lost, and fewer than cluster.min_nodes would remain",
                "action": "requeue",
                "excluded": True,
            }
        )
    culprit = Heartbeat(-1, lost[0], 0, step, "startup", now, now)
    requeue.respond_to_fault(
        run_dir, requeue.slurm_job_id(), culprit, f"lost node {lost[0]}", max_requeues, kind=policy.LOST_NODE
    )


def _peer_culprit(run_dir: Path, key: str, ended: float, outcome: Outcome) -> Outcome:
    """A worker that only saw a peer go away (a connection reset), with no restart left and no other agent
    answering (the peer's agent went with it: a lost node): the peer is the rank whose heartbeat stopped
    first, once heartbeats can be stale. One that recorded an error of its own failed by itself (the run's
    fault, not its node's); one that left none, or was killed, takes its node out of the requeue."""
    from hpctrain.resilience.watchdog import STALE_AFTER_S, find_culprit
    from hpctrain.rundir.records import KILLED, is_peer_symptom

    time.sleep(max(0.0, ended + STALE_AFTER_S + 1 - time.time()))
    culprit, why = find_culprit(read_heartbeats(run_dir, key), time.time())
    if culprit is None:
        return outcome
    own = read_error_record(run_dir, culprit.rank)
    if own is not None and own.get("type") != KILLED and not is_peer_symptom(str(own.get("message", ""))):
        return outcome
    return Outcome(culprit.rank, culprit.host, why, kind=policy.KILLED)


def main(argv: list[str]) -> None:
    """``python -m hpctrain.launch.agent RUN_DIR``: the srun template's task, its rank's agent."""
    from hpctrain.config.io import load_run_config

    cfg = load_run_config(RunDir(argv[0]).config)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(levelname)s %(message)s")
    code = run_task(Path(argv[0]), cfg)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


if __name__ == "__main__":
    main(sys.argv[1:])
