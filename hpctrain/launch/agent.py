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

Caps: ``cluster.max_restarts`` restarts per job start (each worker is told how many are left,
``HPCTRAIN_RESTARTS_LEFT``; the last generation answers a fault as before: a requeue within
``cluster.max_requeues``), and ``cluster.max_no_progress`` attempts in a row without a single new training
step end the run (a crash loop: the same import error, a full disk) with the cause in one line.

Before each start of its worker an agent checks its node (:mod:`hpctrain.launch.health`); a node that fails
is excluded by a requeue without it.

A lost node (its slurmd gone, its ranks unreachable) is replaced by a spare or left out at the next
generation (``cluster.spare_nodes``, ``cluster.min_nodes``): :mod:`hpctrain.launch.nodes` decides which.

Over 400 lines: the restart book, the Slurm task's agent loop and its status lines belong together (one
protocol); the health check lives apart.

Why not torchrun's agent (torch.distributed.elastic): it starts each restart's workers as fresh
interpreters (each imports torch again: 7 s of CPU per rank on the test machine, more than the whole
restart budget), stops a worker with SIGTERM and waits up to 30 s before SIGKILL (a SIGSTOPped rank holds
the restart that long), has no hang detection of its own, and its c10d rendezvous needs one agent per node
where submitit and the srun template start one task per rank. The torchrun sbatch template keeps it
(``--max-restarts``, the same cap).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from hpctrain.launch import health
from hpctrain.launch.jobscript import survives_lost_nodes
from hpctrain.launch.nodes import Nodes
from hpctrain.launch.nodeserver import node_server
from hpctrain.launch.spawn import become_worker
from hpctrain.rendezvous.env import RESTART_ENV, RESTARTS_LEFT_ENV
from hpctrain.resilience import policy, requeue
from hpctrain.resilience.watchdog import PHASES, Heartbeat, job_key, read_heartbeats, stalled, stalled_why
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as checkpoint_layout
from hpctrain.rundir.files import atomic_write
from hpctrain.rundir.records import read_error_record, record_killed, write_error_record

if TYPE_CHECKING:
    from hpctrain.config.schema import ClusterConfig, Config

log = logging.getLogger(__name__)

AGENT_PID_ENV = "HPCTRAIN_AGENT_PID"
POLL_S = 0.05
STALL_CHECK_S = 0.5  # how often a supervisor reads its workers' own heartbeats (watchdog.stalled)
USED_UP = "none: restarts used up"  # restarts.jsonl's action when a fault finds no restart left
STOPPED = "stop"  # the generation file's word for "the run stopped: no more restarts" (a crash loop)
# A worker that failed because a peer went away (a connection error) waits this long for the peer's agent
# to claim the restart with the real cause before claiming it itself.
SYMPTOM_WAIT_S = 1.5
EXIT_CRASH_LOOP = 4
REPEATED = policy.REPEATED  # restarts.jsonl's word for a run stopped on the same error at the same step twice


@dataclass
class Outcome:
    """How one generation of the workers ended, as its agent (or the local launcher) saw it. ``kind``: one
    of the policy's fault kinds; by default read from :func:`describe_exit`'s words for the exit."""

    rank: int | None
    host: str | None
    cause: str
    peer_symptom: bool = False
    kind: str | None = None

    def fault_kind(self) -> str:
        if self.kind is not None:
            return self.kind
        if self.peer_symptom:
            return policy.PEER
        if self.cause.startswith("failed with exit code"):
            return policy.RAISED
        return policy.KILLED if self.cause.startswith("was killed by") else policy.EXITED


class RestartBook:
    """The run directory's record of restarts and the decisions on them, for one job start (``job``):
    shared by the local launcher and the Slurm agents (which meet only through these files)."""

    def __init__(self, run_dir: Path, job: str, max_restarts: int, max_no_progress: int) -> None:
        self.rd = RunDir(run_dir)
        self.job = job
        self.max_restarts = max_restarts
        self.max_no_progress = max_no_progress
        self.rd.agents.mkdir(parents=True, exist_ok=True)

    def generation(self) -> int | None:
        """The job start's current generation (0 before any restart); None when the run was stopped."""
        try:
            text = self.rd.agent_generation(self.job).read_text().strip()
        except FileNotFoundError:
            return 0
        if text == STOPPED:
            return None
        try:
            return int(text)
        except ValueError:  # being replaced: atomic_write makes this impossible, but never crash an agent
            return 0

    def claim(self, generation: int) -> bool:
        """Claim the restart that ends ``generation``: an exclusive create succeeds for one agent only."""
        try:
            fd = os.open(self.rd.agent_claim(self.job, generation), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        os.close(fd)
        return True

    def resume_step(self) -> int:
        """The step the next generation resumes from: the newest committed shared checkpoint (0: none). A
        newer fast-tier copy, when there is one, is what the workers load; they log which."""
        found = checkpoint_layout.committed(self.rd.checkpoints)
        return checkpoint_layout.step_of(found[0]) if found else 0  # newest first

    def ended_without_restart(self, generation: int) -> bool:
        """Whether the end of ``generation`` of this job start was recorded with no restart to follow."""
        return any(
            r.get("job") == self.job and r.get("generation") == generation and r.get("action") == USED_UP
            for r in self.rd.read_restarts()
        )

    def decide(
        self,
        generation: int,
        outcome: Outcome,
        started: float,
        first_step: int,
        key: str,
        nodes: dict[str, Any] | None = None,
    ) -> bool:
        """Record how ``generation`` ended and whether the next one starts: True: restart now (the generation
        file moved on); False: no restart (used up: the worker's own answer stands; or a crash loop: the run
        was stopped, recorded, and every agent stops)."""
        progress = attempt_progress(self.rd.path, key, first_step)
        record: dict[str, Any] = {
            "time": time.time(),
            "job": self.job,
            "generation": generation,
            "cause": outcome.cause,
            "rank": outcome.rank,
            "host": outcome.host,
            "progress": progress,
            "attempt_s": round(time.time() - started, 3),
            **(nodes or {}),  # a lost node: which, what took its place (hpctrain.launch.nodes)
        }
        kind = outcome.fault_kind()
        step = fault_step(self.rd.path, key, outcome.rank)
        if step is not None and kind == policy.RAISED:  # only such an error can be the run's own bug
            record["step"] = step
        fault = policy.Fault(kind, outcome.cause, outcome.rank, outcome.host, record.get("step"), progress)
        # The requeue that follows used-up restarts is the worker's own answer (it was told none is left).
        caps = policy.Caps(self.max_restarts, self.max_no_progress, max_requeues=0)
        action = policy.decide(
            fault, policy.History(policy.past_from(self.rd.read_restarts()), generation), caps
        )
        if isinstance(action, policy.Fail) and action.error in (policy.CRASH_LOOP, policy.REPEATED):
            return self._stop(record, action.error, action.why)
        if not isinstance(action, policy.Restart):
            record["action"] = USED_UP
            self.rd.append_restart(record)
            log.error(
                "No restart inside the allocation: %d of cluster.max_restarts=%d used; %s",
                generation,
                self.max_restarts,
                outcome.cause,
            )
            return False
        record["action"] = "restart"
        record["resume_step"] = self.resume_step()
        self.rd.append_restart(record)
        atomic_write(self.rd.agent_generation(self.job), str(generation + 1))
        log.warning(
            "Restart %d of at most %d inside the allocation: %s %s; resuming from step %d",
            generation + 1,
            self.max_restarts,
            where(outcome),
            outcome.cause,
            record["resume_step"],
        )
        return True

    def _stop(self, record: dict[str, Any], error: str, why: str) -> bool:
        """The run stops: recorded (``error`` is the type its error record takes), and every agent stops."""
        record.update(action="stopped", error=error, why=why)
        self.rd.append_restart(record)
        atomic_write(self.rd.agent_generation(self.job), STOPPED)
        log.error("hpctrain: %s", why)
        return False


def where(outcome: Outcome) -> str:
    return f"rank {outcome.rank} on {outcome.host}" if outcome.rank is not None else "a rank"


def fault_step(run_dir: Path, key: str, rank: int | None) -> int | None:
    """The step ``rank`` was in when its attempt (``key``) ended, from its last heartbeat."""
    beats = [b.step for b in read_heartbeats(run_dir, key) if b.rank == rank]
    return beats[0] if beats else None


def attempt_progress(run_dir: Path, key: str, first_step: int) -> bool:
    """Whether an attempt trained a step beyond ``first_step`` (the checkpoint it resumed from), from its
    ranks' heartbeats (``key``: its job key) or a newer committed checkpoint."""
    done = first_step
    for beat in read_heartbeats(run_dir, key):
        # A rank in step s's data or compute phase finished s - 1; in its report or checkpoint, s.
        finished = beat.step if beat.phase in PHASES[3:] else beat.step - 1
        done = max(done, finished)
    found = checkpoint_layout.committed(RunDir(run_dir).checkpoints)
    if found:
        done = max(done, checkpoint_layout.step_of(found[0]))
    return done > first_step


def worker_restart_env(generation: int, max_restarts: int) -> dict[str, str]:
    """What tells a worker its generation and whether a fault of its own is answered by a restart."""
    return {RESTART_ENV: str(generation), RESTARTS_LEFT_ENV: str(max(0, max_restarts - generation))}


def hang_culprit(run_dir: Path, since: float) -> tuple[int | None, str | None, str] | None:
    """The culprit a watchdog recorded in faults.jsonl since ``since``: (rank, host, why)."""
    from hpctrain.rundir.files import read_jsonl

    for record in reversed(read_jsonl(RunDir(run_dir).faults)):
        if record.get("time", 0) >= since:
            return record.get("rank"), record.get("host"), f"hung: {record.get('why', '')}"
    return None


class Stalls:
    """A supervisor's look at its live workers' own heartbeats, every :data:`STALL_CHECK_S`: a worker
    whose heartbeat went stale while it lives (stopped, or frozen whole) is hung in whatever phase, where
    the peers' watchdogs may not be armed (a report's or a save's collective). ``launch`` and
    ``generation``: the start its workers belong to (the fault's line in faults.jsonl is written once)."""

    def __init__(self, run_dir: Path, job_id: str | None, launch: str, generation: int, restarts: bool):
        self.run_dir, self.job_id, self.launch = run_dir, job_id, launch
        self.generation, self.restarts = generation, restarts
        self._next = time.monotonic() + STALL_CHECK_S

    def due(self) -> bool:
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + STALL_CHECK_S
        return True

    def hung(self, rank: int, pid: int) -> str | None:
        """When ``rank``'s worker ``pid`` is hung: its error record and the fault's line are written (the
        caller kills it next: SIGKILL, the one signal a stopped process takes) and the cause is returned."""
        now = time.time()
        beat = stalled(self.run_dir, rank, pid, now)
        if beat is None:
            return None
        why = stalled_why(beat, now)
        write_error_record(self.run_dir, rank, "Hang", f"step {beat.step} ({beat.phase}): {why}")
        action = "restart inside the allocation" if self.restarts else "killed by its supervisor"
        requeue.record_fault(
            self.run_dir, self.job_id, beat, why, action, launch=self.launch, generation=self.generation
        )
        return f"hung: {why}"


def is_final(run_dir: Path, rank: int) -> bool:
    """Whether the worker of ``rank`` ended with an error that asks for no restart (the policy's final
    errors)."""
    record = read_error_record(run_dir, rank)
    return record is not None and record.get("type") in policy.FINAL_ERRORS


def describe_exit(run_dir: Path, rank: int, code: int) -> tuple[str, bool]:
    """A worker's exit in words, and whether it only reports a peer's failure (a connection error)."""
    from hpctrain.rundir.records import is_peer_symptom

    if code < 0:
        return f"was killed by {signal.Signals(-code).name}", False
    record = read_error_record(run_dir, rank)
    if record is None:
        return f"exited with code {code}", False
    message = str(record.get("message", ""))
    return f"failed with exit code {code}: {record.get('type', '')}: {message}", is_peer_symptom(message)


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
    book = RestartBook(run_dir, slurm_job_start(), cfg.cluster.max_restarts, cfg.cluster.max_no_progress)
    # Spares, or shrinking: this generation's ranks run on its member nodes (hpctrain.launch.nodes).
    nodes = (
        Nodes(run_dir, book.job, cfg.cluster.nodes, cfg.cluster.min_nodes)
        if survives_lost_nodes(cfg.cluster)
        else None
    )
    server: ForkServer | None = None
    want_server = cfg.cluster.fork_server
    # Here only so that the tasks of a node share a fork server: no restarts, no health check, the worker's
    # own answer to a fault stands (as when the task was its worker).
    launcher_only = cfg.cluster.max_restarts == 0 and cfg.cluster.health_check is None
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
            unhealthy = None if launcher_only else health.problem(run_dir, cfg.cluster.health_check, host)
            if unhealthy is not None:  # before this node's rank joins: the job goes on without the node
                health.exclude(run_dir, rank, host, unhealthy, cfg.cluster.max_requeues)
                return health.EXIT_UNHEALTHY
            env = dict(os.environ)
            env.update(place)
            env.update(worker_restart_env(generation, cfg.cluster.max_restarts))
            if want_server and (server is None or server.gone()):  # the first start, or the server died
                share = server is None  # the node's at first; after it died (with the node's first task's
                if server is not None:  # agent), one of this task's own
                    server.close()
                server = node_server(os.environ, book.job, host, share)
                want_server = server is not None  # none: fresh interpreters from here on
            env[AGENT_PID_ENV] = str(server.pid if server else os.getpid())
            started = time.time()
            first_step = book.resume_step()
            worker[:] = [_start(server, env, run_dir)]
            restarts = generation < cfg.cluster.max_restarts
            job_id = requeue.slurm_job_id()
            stalls = Stalls(run_dir, job_id, job_id or book.job, generation, restarts)
            code, moved = _watch(worker[0], book, generation, rank, stalls)
            ended = time.time()
            if moved:  # another rank's fault: this worker was killed, the next generation starts
                generation = book.generation()
                continue
            assert code is not None
            if code < 0 and not pending:  # kill -9, the OOM killer: the worker could record nothing itself
                record_killed(run_dir, rank, -code, cfg.cluster.max_restarts)
            if code == 0 or pending or launcher_only or is_final(run_dir, rank):
                return code  # done, stopped by Slurm's signal (the worker saved and requeued), or final
            record = read_error_record(run_dir, rank)
            if record is not None and record.get("type") == health.UNHEALTHY:  # the device failed its check
                health.exclude(run_dir, rank, host, str(record.get("message", "")), cfg.cluster.max_requeues)
                return health.EXIT_UNHEALTHY
            cause, symptom = describe_exit(run_dir, rank, code)
            outcome = Outcome(rank, host, cause, symptom)
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
            if not book.decide(generation, outcome, started, first_step, key, lost):
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


def _final(book: RestartBook, run_dir: Path, rank: int, code: int) -> int:
    """The task's exit status once no restart follows; a crash loop is recorded as rank 0's error, which
    ``hpctrain status`` prints, and ends the job FAILED."""
    if book.generation() is None:
        records = book.rd.read_restarts()
        stop = next((r for r in reversed(records) if r.get("action") == "stopped"), {})
        if stop.get("error") == REPEATED:  # the user's own error (its rank's record) is the run's cause
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


def task_is_agent(cluster: ClusterConfig) -> bool:
    """Whether a task is its rank's agent: restarts inside the allocation, a site health check, or tasks
    that share a node, whose workers then fork from one server per node (:mod:`hpctrain.launch.nodeserver`:
    one torch import per node, not per task). Else the task is its worker, as before the agent."""
    shares_a_node = cluster.tasks_per_node > 1 and cluster.fork_server
    return cluster.max_restarts > 0 or cluster.health_check is not None or shares_a_node


def main(argv: list[str]) -> None:
    """``python -m hpctrain.launch.agent RUN_DIR``: the srun template's task. Without restarts inside the
    allocation the task becomes its worker (exec: same process, same signals, same exit status)."""
    from hpctrain.config.io import load_run_config

    cfg = load_run_config(RunDir(argv[0]).config)
    if not task_is_agent(cfg.cluster):
        become_worker(argv[0])
    logging.basicConfig(level=logging.INFO, format="%(asctime)s agent %(levelname)s %(message)s")
    code = run_task(Path(argv[0]), cfg)
    logging.shutdown()
    sys.stdout.flush()
    os._exit(code)


def summary(records: list[dict[str, Any]]) -> list[str]:
    """``hpctrain status``'s lines for a run's restarts: how many, the last one, a crash loop."""
    restarts = [r for r in records if r.get("action") == "restart"]
    lines = []
    if restarts:
        last = restarts[-1]
        where = f"rank {last.get('rank')} on {last.get('host')}" if last.get("rank") is not None else "a rank"
        lines.append(
            f"{len(restarts)} inside the allocation; last {_when(last['time'])}: {where} "
            f"{last.get('cause', '')} → resumed from step {last.get('resume_step', 0)}"
        )
    for record in (r for r in restarts if r.get("lost")):
        lost, now_on = ", ".join(record["lost"]), ", ".join(record.get("nodes", []))
        how = f"replaced by {', '.join(record['spares'])}" if record.get("spares") else "left out"
        shrunk = f"; shrunk to {len(record.get('nodes', []))} nodes" if record.get("shrunk") else ""
        lines.append(f"node {lost} lost {_when(record['time'])}: {how}{shrunk} (now on {now_on})")
    stopped = [r for r in records if r.get("action") == "stopped"]
    if stopped:
        lines.append(str(stopped[-1].get("why", "crash loop")))
    return lines


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


if __name__ == "__main__":
    main(sys.argv[1:])
