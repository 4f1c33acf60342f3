"""What the supervisor loop (:mod:`hpctrain.launch.supervisor`, run by the local launcher and by each Slurm
task's agent) reads and records: how one generation of the workers ended
(:class:`Outcome`, read from an exit by :mod:`hpctrain.launch.exits`), a worker stalled in any phase
(:class:`Stalls`), and the run directory's book of a job start's faults and the fault policy's answers to
them (:class:`RestartBook`, :func:`answer_fault`: recorded in the fault log, faults.jsonl, and carried
out). No torch import here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpctrain.rendezvous.env import RESTART_ENV
from hpctrain.resilience import policy, requeue, stacks
from hpctrain.resilience.watchdog import PHASES, read_heartbeats, stalled, stalled_why
from hpctrain.rundir import RunDir
from hpctrain.rundir import checkpoints as checkpoint_layout
from hpctrain.rundir.files import atomic_write
from hpctrain.rundir.records import read_error_record, write_error_record

log = logging.getLogger(__name__)

STALL_CHECK_S = 0.5  # how often a supervisor reads its workers' own heartbeats (watchdog.stalled)
USED_UP = "none: restarts used up"  # the fault log's action when a fault finds no restart left
REQUEUE = "requeue"  # the fault log's action when the policy answers a fault with a requeue of the Slurm job
NO_RESTART = (USED_UP, REQUEUE)
STOPPED = "stop"  # the generation file's word for "the run stopped: no more restarts" (a crash loop)
REPEATED = policy.REPEATED  # the fault log's word for a run stopped on the same error at the same step twice


@dataclass
class Outcome:
    """How one generation of the workers ended, as its agent (or the local launcher) saw it. ``kind``: one
    of the policy's fault kinds (:func:`hpctrain.launch.exits.exit_outcome` sets it); else read from the
    cause's words. ``detail``: what attribution adds (the OOM killer, a path, a frame)."""

    rank: int | None
    host: str | None
    cause: str
    peer_symptom: bool = False
    kind: str | None = None
    step: int | None = None  # the step the failing rank was in, when known (its last heartbeat)
    detail: str = ""

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

    def __init__(
        self,
        run_dir: Path,
        job: str,
        max_restarts: int,
        max_no_progress: int,
        max_requeues: int = 0,
        slurm_job: str | None = None,
    ) -> None:
        self.rd = RunDir(run_dir)
        self.job = job
        self.max_restarts = max_restarts
        self.max_no_progress = max_no_progress
        # A Slurm job (its id for scontrol): the policy's requeue is one of the answers; None: local.
        self.max_requeues = max_requeues
        self.slurm_job = slurm_job
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
        found = checkpoint_layout.committed(self.rd.shared_checkpoints)
        return checkpoint_layout.step_of(found[0]) if found else 0  # newest first

    def ended_without_restart(self, generation: int) -> bool:
        """Whether the end of ``generation`` of this job start was recorded with no restart to follow (the
        restarts used up, or a requeue instead)."""
        return any(
            r.get("job") == self.job and r.get("generation") == generation and r.get("action") in NO_RESTART
            for r in self.rd.read_answers()
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
        """:meth:`answer`, as whether the next generation starts now (True: the generation file moved on)."""
        return isinstance(self.answer(generation, outcome, started, first_step, key, nodes), policy.Restart)

    def answer(
        self,
        generation: int,
        outcome: Outcome,
        started: float,
        first_step: int,
        key: str,
        nodes: dict[str, Any] | None = None,
    ) -> policy.Action:
        """Ask the fault policy how to answer the end of ``generation``; its answer is recorded
        (the fault log): a restart (the generation file moves on), a requeue (for the caller to carry out:
        :func:`hpctrain.resilience.requeue.requeue_job`), or the end (the caps used up; or a crash loop or
        a repeated error: the run was stopped, and every agent stops)."""
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
        fault = policy.Fault(
            kind,
            outcome.cause,
            outcome.rank,
            outcome.host,
            record.get("step"),
            progress,
            detail=outcome.detail,
        )
        history = policy.History(
            policy.past_from(self.rd.read_answers()),
            generation,
            requeues_done=requeue.restart_count() if self.slurm_job else 0,
            on_slurm=self.slurm_job is not None,
        )
        caps = policy.Caps(self.max_restarts, self.max_no_progress, self.max_requeues)
        action = policy.decide(fault, history, caps)
        record.update(kind=kind, verdict=policy.verdict(fault, action))
        if outcome.detail:
            record["detail"] = outcome.detail
        if isinstance(action, policy.Fail) and action.error not in (policy.CAPS_USED,):
            self._stop(record, action.error, action.why)
            return action
        if isinstance(action, policy.Requeue):
            record.update(action=REQUEUE, exclude=list(action.exclude))
            self._append(record)
            log.error(
                "No restart inside the allocation (%d of cluster.max_restarts=%d used): %s %s; requeueing "
                "job %s%s",
                generation,
                self.max_restarts,
                where(outcome),
                outcome.cause,
                self.slurm_job,
                f" without {', '.join(action.exclude)}" if action.exclude else "",
            )
            return action
        if not isinstance(action, policy.Restart):
            record.update(action=USED_UP, why=action.why)
            self._append(record)
            log.error("No restart inside the allocation: %s", action.why)
            return action
        record["action"] = "restart"
        record["resume_step"] = self.resume_step()
        self._append(record)
        atomic_write(self.rd.agent_generation(self.job), str(generation + 1))
        log.warning(
            "Restart %d of at most %d inside the allocation: %s %s; resuming from step %d",
            generation + 1,
            self.max_restarts,
            where(outcome),
            outcome.cause,
            record["resume_step"],
        )
        return action

    def _append(self, record: dict[str, Any]) -> None:
        """The answer's line in the fault log; a storage that refuses it (full, read-only) does not change
        the answer, which the caller carries out and prints."""
        try:
            self.rd.append_answer(record)
        except OSError as err:
            log.warning(
                "hpctrain: the answer to a fault could not be recorded in %s: %s", self.rd.faults, err
            )

    def _stop(self, record: dict[str, Any], error: str, why: str) -> None:
        """The run stops: recorded (``error`` is the type its error record takes), and every agent stops."""
        record.update(action="stopped", error=error, why=why)
        self._append(record)
        with contextlib.suppress(OSError):  # a full disk: the other agents' workers fail on it alike
            atomic_write(self.rd.agent_generation(self.job), STOPPED)
        log.error("hpctrain: %s", why)


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
    found = checkpoint_layout.committed(RunDir(run_dir).shared_checkpoints)
    if found:
        done = max(done, checkpoint_layout.step_of(found[0]))
    return done > first_step


def worker_restart_env(generation: int) -> dict[str, str]:
    """What tells a worker its generation (its faults' injection points and heartbeats name it)."""
    return {RESTART_ENV: str(generation)}


def hang_culprit(run_dir: Path, since: float) -> tuple[int | None, str | None, str] | None:
    """The culprit a watchdog recorded in faults.jsonl since ``since``: (rank, host, why)."""

    for record in reversed(RunDir(run_dir).read_faults()):
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
        # Where it stands, for status and the user: read from outside (py-spy; it answers nothing itself),
        # and every live rank asked for its own, answered within a quarter second (no wait here: the
        # restart goes on, and a rank its supervisor kills first leaves no answer).
        name = f"stall-{time.strftime('%Y%m%d-%H%M%S')}-rank{rank}"
        stacks.dump_stopped(self.run_dir, name, rank, pid)
        with contextlib.suppress(OSError):
            stacks.ask(self.run_dir, name)
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


def answer_fault(
    book: RestartBook,
    generation: int,
    outcome: Outcome,
    started: float,
    first_step: int,
    key: str,
    lost: dict[str, Any] | None = None,
) -> policy.Action:
    """The claimed fault that ended ``generation``, answered: the policy's action, recorded and carried out.
    A restart moves the generation on; a requeue is asked of Slurm (without the culprit's node when the fault
    was the node's); where no restart follows, the fault's line in faults.jsonl says the answer (a line a
    watchdog wrote for a hang it saw first stands: one line per start)."""
    action = book.answer(generation, outcome, started, first_step, key, lost)
    if isinstance(action, policy.Restart):
        return action
    if isinstance(action, policy.Requeue):
        words = f"requeue without {', '.join(action.exclude)}" if action.exclude else "requeue"
    else:
        words = f"the run ends ({action.error})"
    step = outcome.step if outcome.step is not None else fault_step(book.rd.path, key, outcome.rank)
    at = Outcome(outcome.rank, outcome.host, outcome.cause, outcome.peer_symptom, outcome.kind, step)
    job_id = book.slurm_job
    launch = job_id or book.job
    requeue.record_fault(book.rd.path, job_id, at, outcome.cause, words, launch=launch, generation=generation)
    if isinstance(action, policy.Requeue) and job_id is not None:
        host = outcome.host if action.exclude else None
        requeue.requeue_job(book.rd.path, job_id, host, outcome.fault_kind(), outcome.cause)
    return action


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
    elif records[-1].get("verdict") and records[-1].get("action") != "restart":  # a requeue, the caps used
        lines.append(str(records[-1]["verdict"]))
    return lines


def _when(stamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))
