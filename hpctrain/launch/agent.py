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

What every supervisor shares (how a generation ended, the book of faults and the policy's answers, a
stalled worker) is :mod:`hpctrain.launch.supervision`; the health check lives apart.

Why not torchrun's agent (torch.distributed.elastic): it starts each restart's workers as fresh
interpreters (each imports torch again: 7 s of CPU per rank on the test machine, more than the whole
restart budget), stops a worker with SIGTERM and waits up to 30 s before SIGKILL (a SIGSTOPped rank holds
the restart that long), has no hang detection of its own, and its c10d rendezvous needs one agent per node
where submitit and the srun template start one task per rank. The torchrun sbatch template keeps it
(``--max-restarts``, the same cap).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hpctrain.launch import health
from hpctrain.launch.exits import exit_outcome, oom_kills
from hpctrain.launch.jobscript import survives_lost_nodes
from hpctrain.launch.nodes import Nodes
from hpctrain.launch.nodeserver import node_server
from hpctrain.launch.supervision import (
    Outcome,
    RestartBook,
    Stalls,
    answer_fault,
    hang_culprit,
    is_final,
    worker_restart_env,
)
from hpctrain.plan.host import planned
from hpctrain.rendezvous.env import RESTART_ENV
from hpctrain.resilience import policy, requeue
from hpctrain.resilience.watchdog import Heartbeat, job_key, read_heartbeats
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import read_error_record, record_killed, write_error_record

if TYPE_CHECKING:
    from hpctrain.config.schema import Config

log = logging.getLogger(__name__)

AGENT_PID_ENV = "HPCTRAIN_AGENT_PID"
POLL_S = 0.05
# A worker that failed because a peer went away (a connection error) waits this long for the peer's agent
# to claim the restart with the real cause before claiming it itself.
SYMPTOM_WAIT_S = 1.5
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
    """One Slurm task's rank, with restarts inside the allocation when ``cluster.max_restarts`` > 0: start
    the worker, watch it and the generation, restart. Returns the task's exit status. ``cfg``: the run's
    config.yaml, as the task read it (once)."""
    from hpctrain.launch.forked import ForkServer

    rank = int(os.environ.get("SLURM_PROCID", "0"))
    host = os.uname().nodename
    c = cfg.cluster
    job_id = requeue.slurm_job_id()
    book = RestartBook(run_dir, slurm_job_start(), c.max_restarts, c.max_no_progress, c.max_requeues, job_id)
    # Spares, or shrinking: this generation's ranks run on its member nodes (hpctrain.launch.nodes).
    nodes = (
        Nodes(run_dir, book.job, cfg.cluster.nodes, cfg.cluster.min_nodes)
        if survives_lost_nodes(cfg.cluster)
        else None
    )
    server: ForkServer | None = None
    want_server = cfg.cluster.fork_server
    # The node's checks before each start: where restarts are on, or a site script is given.
    checks_health = cfg.cluster.max_restarts > 0 or cfg.cluster.health_check is not None
    pending: list[int] = []  # signals that reached this agent, forwarded to the worker
    worker: list[Any] = []

    def forward(signum: int, _frame: FrameType | None) -> None:
        pending.append(signum)
        if worker and worker[0].poll() is None:
            _signal_group(worker[0].pid, signum)

    for name in ("SIGUSR2", "SIGTERM", "SIGINT", "SIGHUP", "SIGURG"):
        signal.signal(getattr(signal, name), forward)
    try:
        if nodes is not None:
            nodes.start()
        generation = book.generation()
        while generation is not None:
            place: dict[str, str] = {}
            if nodes is not None:
                members = nodes.members()
                if nodes.node not in members:  # a spare: wait for a lost node's place, or the end
                    rank = -1
                    if not _wait_as_spare(book, nodes, generation, pending):
                        return 0
                    generation = book.generation()
                    continue
                place = nodes.place(members)
                rank = int(place["SLURM_PROCID"])
            unhealthy = health.problem(run_dir, cfg.cluster.health_check, host) if checks_health else None
            if unhealthy is not None:  # before this node's rank joins: the job goes on without the node
                health.exclude(run_dir, rank, host, unhealthy, cfg.cluster.max_requeues)
                return health.EXIT_UNHEALTHY
            env = dict(os.environ)
            env.update(place)
            env.update(worker_restart_env(generation))
            if want_server and (server is None or server.gone()):  # the first start, or the server died
                share = server is None  # the node's at first; after it died (with the node's first task's
                if server is not None:  # agent), one of this task's own
                    server.close()
                server = node_server(os.environ, book.job, host, share)
                want_server = server is not None  # none: fresh interpreters from here on
            env[AGENT_PID_ENV] = str(server.pid if server else os.getpid())
            started = time.time()
            first_step = book.resume_step()
            oom_before = oom_kills()
            worker[:] = [_start(server, env, run_dir)]
            restarts = generation < cfg.cluster.max_restarts
            stalls = Stalls(run_dir, job_id, job_id or book.job, generation, restarts)
            code, moved = _watch(worker[0], book, generation, rank, stalls)
            ended = time.time()
            if moved:  # another rank's fault: this worker was killed, the next generation starts
                generation = book.generation()
                continue
            assert code is not None
            plan = functools.partial(planned, cfg)  # asked for only after an OOM kill
            outcome = exit_outcome(run_dir, rank, host, code, worker[0].pid, oom_before, plan)
            if code < 0 and not pending:  # kill -9, the OOM killer: the worker could record nothing itself
                record_killed(run_dir, rank, -code, cfg.cluster.max_restarts, outcome.detail)
            if code == 0 or pending or is_final(run_dir, rank):
                return code  # done, stopped by Slurm's signal (the worker saved and requeued), or final
            record = read_error_record(run_dir, rank)
            if record is not None and record.get("type") == health.UNHEALTHY:  # the device failed its check
                health.exclude(run_dir, rank, host, str(record.get("message", "")), cfg.cluster.max_requeues)
                return health.EXIT_UNHEALTHY
            symptom = outcome.peer_symptom
            hang = hang_culprit(run_dir, started)
            if hang is not None:
                outcome = Outcome(*hang, kind=policy.HUNG)
            if symptom and _wait_for_move(book, generation, SYMPTOM_WAIT_S):
                generation = book.generation()
                continue
            if not book.claim(generation):  # another agent is deciding: wait for its word
                if not _wait_for_word(book, generation):  # no restart: this worker's own answer stands
                    return _final(book, run_dir, rank, code)
                generation = book.generation()
                continue
            key = job_key({**os.environ, RESTART_ENV: str(generation)})
            lost: dict[str, Any] | None = None
            if nodes is not None and (symptom or hang is not None):
                replacement = nodes.replace(ended)
                if replacement is not None and not replacement.members:  # fewer than min_nodes would remain
                    _requeue_without(run_dir, replacement.lost, cfg.cluster.max_requeues, first_step)
                    return _final(book, run_dir, rank, code)
                if replacement is not None:
                    nodes.commit(replacement, first_step, requeue.slurm_job_id())
                    lost = {
                        "lost": replacement.lost,
                        "nodes": replacement.members,
                        "spares": replacement.spares,
                        "shrunk": replacement.shrunk,
                    }
                    why = f"lost node {', '.join(replacement.lost)}"
                    outcome = Outcome(None, replacement.lost[0], why, kind=policy.LOST_NODE)
            if outcome.fault_kind() == policy.PEER and not restarts and job_id is not None:
                outcome = _peer_culprit(run_dir, key, ended, outcome)
            action = answer_fault(book, generation, outcome, started, first_step, key, lost)
            if not isinstance(action, policy.Restart):
                return _final(book, run_dir, rank, code)
            generation = book.generation()
        return _final(book, run_dir, rank, 1)
    finally:
        if worker and worker[0].poll() is None:
            _signal_group(worker[0].pid, signal.SIGKILL)
        if server is not None:
            server.close()
        if nodes is not None:
            nodes.done()  # the spares leave
            nodes.close()


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


def _final(book: RestartBook, run_dir: Path, rank: int, code: int) -> int:
    """The task's exit status once no restart follows; a crash loop is recorded as rank 0's error, which
    ``hpctrain status`` prints, and ends the job FAILED."""
    if book.generation() is None:
        records = book.rd.read_restarts()
        stop = next((r for r in reversed(records) if r.get("action") == "stopped"), {})
        if stop.get("error") != policy.CRASH_LOOP:  # a class no restart heals: its rank's record is the cause
            return code or 1
        if rank == 0:
            write_error_record(run_dir, 0, "CrashLoop", stop.get("why", "crash loop"))
        return EXIT_CRASH_LOOP
    return code or 1


def _start(server: Any, env: dict[str, str], run_dir: Path) -> Any:
    """The worker, forked from ``server`` (stdout: this task's, i.e. Slurm's output file) or spawned."""
    from hpctrain.launch.spawn import start_worker

    return start_worker(run_dir, env, server)


def _watch(
    worker: Any, book: RestartBook, generation: int, rank: int, stalls: Stalls
) -> tuple[int | None, bool]:
    """Until the worker exits (its status, False) or the generation moves on (None, True: worker killed).
    A worker hung in any phase (its own heartbeat stale: :class:`Stalls`) is killed: it exits."""
    from hpctrain.launch.forked import ServerGone

    while True:
        try:
            code = worker.poll()
        except ServerGone:  # a shared server that died took its children along: as if SIGKILLed
            return -signal.SIGKILL, False
        if code is not None:
            return code, False
        if book.generation() != generation:
            _signal_group(worker.pid, signal.SIGKILL)
            worker.wait()
            return None, True
        if stalls.due() and stalls.hung(rank, worker.pid) is not None:
            _signal_group(worker.pid, signal.SIGKILL)
            try:
                return worker.wait(), False
            except ServerGone:  # its server went too: the worker is gone either way
                return -signal.SIGKILL, False
        time.sleep(POLL_S)


def _wait_for_word(book: RestartBook, generation: int) -> bool:
    """Until the agent that claimed the end of ``generation`` has decided: True when the generation moved on
    (a restart, or the run stopped: a crash loop), False when no restart was left."""
    while book.generation() == generation:
        if book.ended_without_restart(generation):
            return False
        time.sleep(POLL_S)
    return True


def _wait_for_move(book: RestartBook, generation: int, timeout: float | None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    while book.generation() == generation:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def _signal_group(pid: int, sig: int) -> None:
    # The worker leads its own session: its process group holds it and whatever it started.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


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
