"""One supervisor loop for a set of local ranks: the ``nproc`` workers of ``cluster=local``
(:mod:`hpctrain.launch.local`) or the one rank of each Slurm task (:mod:`hpctrain.launch.agent`). No torch
import here.

    generation = the restart book's (RUN_DIR/agents/<job>.generation)
    while the run goes on:
        the site's checks before a start (its node's health; a spare's wait; the ranks' places)
        start the generation's workers (forked or fresh: hpctrain.launch.spawn)
        watch them: exits, stalls (a heartbeat stale while its process lives), stop signals, and where other
            supervisors share the job start (Slurm tasks) the generation moving on under them
        a failed exit: how it ended (hpctrain.launch.exits), the cause among several (a peer's symptom last)
        claim the fault (one supervisor of a job start answers it), ask the pure fault policy
            (hpctrain.resilience.policy) and act: restart | requeue | the end

What only the place knows is its :class:`Site`: how a rank is spawned and named, what is checked before a
start, and what a lost node means. The supervisor's :class:`Ended` is what the site reports or exits with.

Over 400 lines: the loop, its watch of a generation, its reading of their exits and its claim of a fault
share one supervisor's workers and signals; :mod:`hpctrain.launch.supervision` holds what it reads and
records (the restart book, stalls, the answer to a fault).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hpctrain.launch.exits import exit_outcome, oom_kills
from hpctrain.launch.forkwire import ServerGone
from hpctrain.launch.health import UNHEALTHY
from hpctrain.launch.supervision import (
    Outcome,
    RestartBook,
    Stalls,
    answer_fault,
    hang_culprit,
    is_final,
)
from hpctrain.plan.host import planned
from hpctrain.resilience import policy
from hpctrain.rundir.records import (
    EXIT_STOPPED,
    is_peer_symptom,
    read_error_file,
    read_error_record,
    record_killed,
    write_error_record,
)

if TYPE_CHECKING:
    from hpctrain.config.schema import Config

log = logging.getLogger(__name__)

POLL_S = 0.05
# After a first failure, how long to keep collecting exits before stopping the rest: when one rank dies, its
# peers fail within a second with a connection error, and the report should name the cause, not a symptom.
SETTLE_S = 1.0
# A worker that failed because a peer went away (a connection error) waits this long for the peer's
# supervisor to claim the restart with the real cause before claiming it itself (Slurm tasks only).
SYMPTOM_WAIT_S = 1.5


class Process(Protocol):
    """What supervision needs of a worker: a ``subprocess.Popen`` or a ``forked.ForkedProcess``."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Worker:
    rank: int
    proc: Process
    log_path: Path | None = None
    exited_at: float | None = None
    told: bool = False  # a stop signal was forwarded to it


@dataclass
class Failure:
    """A worker that ended other than cleanly (or was killed hung by its supervisor)."""

    rank: int
    pid: int
    returncode: int
    detail: str
    log_path: Path | None
    exited_at: float

    def describe(self) -> str:
        where = f" — log: {self.log_path}" if self.log_path else ""
        return f"rank {self.rank} (pid {self.pid}) {self.detail}{where}"

    @property
    def is_peer_symptom(self) -> bool:
        return self.returncode > 0 and is_peer_symptom(self.detail)


@dataclass
class Ended:
    """How the supervisor's last generation ended. ``failures``: cause first; ``action``: the policy's answer
    (None: not asked: a clean end, a stop, a final error, restarts off locally); ``code``: an exit status the
    site decided itself (an unhealthy node, a spare no longer needed); ``stopped``: the run was stopped by
    the policy (a repeated error; ``crash_loop``: a crash loop), perhaps on another supervisor's answer."""

    workers: list[Worker] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    signal: int | None = None
    action: policy.Action | None = None
    code: int | None = None
    stopped: bool = False
    crash_loop: bool = False

    @property
    def why(self) -> str | None:
        """Why the policy ended the run, when it did (not its caps: the failure itself says that)."""
        action = self.action
        if isinstance(action, policy.Fail) and action.error != policy.CAPS_USED:
            return action.why
        return None


class Site(Protocol):
    """What only the place of a supervisor's ranks knows."""

    run_dir: Path
    host: str
    shared: bool  # other supervisors share the job start (Slurm tasks): its generation may move under them
    interactive: bool  # a second stop signal stops the workers at once (a second Ctrl-C)

    def begin(self, generation: int) -> list[int] | int | None:
        """Before a start: the ranks to start; an exit status (the supervisor ends); None: the generation
        moved meanwhile (a spare's wait ended)."""
        ...

    def spawn(self, rank: int, generation: int) -> Worker: ...

    def key(self, generation: int) -> str:
        """The job key of ``generation``'s workers (their heartbeats name it)."""
        ...

    def stalls(self, generation: int) -> Stalls: ...

    def grace_s(self, generation: int) -> float:
        """How long the others of a failed generation get to stop (0: a restart follows)."""
        ...

    def unhealthy(self, rank: int, why: str) -> int | None:
        """A rank's device failed its check: the exit status that ends the supervisor (None: a fault)."""
        ...

    def lost(self, outcome: Outcome, hung: bool, ended: float, first_step: int) -> Any:
        """A peer gone or hung: its node's answer (spares, shrinking): (outcome, the restart record's node
        fields) or an exit status (fewer nodes than allowed would remain: requeued)."""
        ...

    def culprit(self, outcome: Outcome, key: str, ended: float, restarts: bool) -> Outcome:
        """A peer-only failure with no restart left: the peer that caused it, where one can tell."""
        ...


@dataclass
class _Start:
    generation: int
    workers: list[Worker]
    started: float
    first_step: int
    oom_before: int | None


class Supervisor:
    """One loop over generations of ``site``'s ranks (``book``: the job start's restart book; None: no
    restarts, the first failure ends it). Stop signals reach it through :meth:`on_signal`."""

    def __init__(self, site: Site, book: RestartBook | None, cfg: Config, poll_s: float = POLL_S) -> None:
        self.site, self.book, self.cfg, self.poll_s = site, book, cfg, poll_s
        self.run_dir = site.run_dir
        self.signals: list[int] = []
        self.workers: list[Worker] = []

    def on_signal(self, signum: int) -> None:
        """A stop signal: forwarded to the live workers (they save at their next step boundary), once where
        the site is interactive (a second Ctrl-C stops them at once), every time elsewhere (Slurm's)."""
        self.signals.append(signum)
        if self.site.interactive and len(self.signals) > 1:
            return
        for worker in self.workers:
            if worker.exited_at is None:
                kill_group(worker.proc.pid, signum)
                worker.told = True

    def run(self) -> Ended:
        generation = self.book.generation() if self.book else 0
        while generation is not None:
            ranks = self.site.begin(generation)
            if ranks is None:
                generation = self._generation()
                continue
            if isinstance(ranks, int):
                return Ended(code=ranks)
            start = self._start(generation, ranks)
            failures, moved = self._watch(start)
            ended = time.time()
            if moved:  # another supervisor's fault: these workers were killed, the next generation starts
                generation = self._generation()
                continue
            outcomes = self._outcomes(start, failures)
            stop = self.signals[0] if self.signals else None
            done = Ended(start.workers, failures, stop)
            if not failures or stop is not None or any(is_final(self.run_dir, f.rank) for f in failures):
                return done  # done, stopped by a signal (the workers saved), or an error no restart heals
            record = self._unhealthy(failures)
            if record is not None:
                return Ended(start.workers, failures, code=record)
            if self.book is None:
                return done
            action = self._answer(start, outcomes[0], ended)
            if action is None:  # another supervisor answered: the next generation, or the end
                generation = self._generation()
                if generation is None or self.book.ended_without_restart(start.generation):
                    return self._ended(Ended(start.workers, failures))
                continue
            if isinstance(action, int):
                return Ended(start.workers, failures, code=action)
            if not isinstance(action, policy.Restart):
                return self._ended(Ended(start.workers, failures, action=action))
            for worker in start.workers:
                kill_group(worker.proc.pid, signal.SIGKILL)
            generation = self._generation()
        return self._ended(Ended(self.workers))

    def close(self) -> None:
        """Kill whatever is left of the workers (a finished worker's leftovers; a supervisor cut short)."""
        for worker in self.workers:
            kill_group(worker.proc.pid, signal.SIGKILL)

    def _generation(self) -> int | None:
        return self.book.generation() if self.book else None

    def _start(self, generation: int, ranks: list[int]) -> _Start:
        started = time.time()
        first_step = self.book.resume_step() if self.book else 0
        oom_before = oom_kills()
        self.workers = []
        for rank in ranks:
            self.workers.append(self.site.spawn(rank, generation))
        return _Start(generation, self.workers, started, first_step, oom_before)

    def _watch(self, start: _Start) -> tuple[list[Failure], bool]:
        """Until every worker exited (failures cause first, False), or the generation moved on under this
        supervisor (True: its workers killed). A worker hung in any phase (its own heartbeat stale:
        :class:`Stalls`) is killed: its failure says so. On the first failure the rest are stopped once
        :data:`SETTLE_S` has let their own failures come in."""
        workers = start.workers
        stalls = self.site.stalls(start.generation)
        failures: list[Failure] = []
        settle_until: float | None = None
        while True:
            # Asked to stop (a first Ctrl-C, Slurm's signal): the workers finish their step and save; no
            # grace time, which a step longer than it would turn into every step since the checkpoint lost.
            asked = bool(self.signals) and not (self.site.interactive and len(self.signals) > 1)
            for worker in workers:
                if asked and not worker.told and worker.exited_at is None:  # started after the signal came
                    kill_group(worker.proc.pid, self.signals[0])
                    worker.told = True
            look = not failures and stalls.due()
            for worker in workers:
                if worker.exited_at is not None:
                    continue
                hung = stalls.hung(worker.rank, worker.proc.pid) if look else None
                if hung is not None:
                    kill_group(worker.proc.pid, signal.SIGKILL)
                    _reap(worker)
                code = self._poll(worker)
                if code is None:
                    continue
                worker.exited_at = time.monotonic()
                if hung is not None or code not in (0, EXIT_STOPPED):
                    failures.append(_failure(worker, self.run_dir, code, hung))
            done = all(w.exited_at is not None for w in workers)
            if self._moved(start, failures or done):  # another supervisor's fault moved it on
                for worker in workers:
                    kill_group(worker.proc.pid, signal.SIGKILL)
                    _reap(worker)
                return [], True
            if failures and settle_until is None:
                settle_until = time.monotonic() + SETTLE_S
            settled = settle_until is not None and time.monotonic() >= settle_until
            if asked and not failures and not done:
                time.sleep(self.poll_s)
                continue
            if self.signals or settled or (done and failures):
                _stop(workers, self.site.grace_s(start.generation))
                return sorted(failures, key=lambda f: (f.is_peer_symptom, f.exited_at)), False
            if done:
                return failures, False
            time.sleep(self.poll_s)

    def _moved(self, start: _Start, ended: bool) -> bool:
        """Whether the generation moved on under this supervisor (Slurm tasks share it) while its workers
        live: an exit of its own is answered first."""
        book = self.book
        return self.site.shared and book is not None and not ended and book.generation() != start.generation

    def _poll(self, worker: Worker) -> int | None:
        """A worker's exit status. A node's shared fork server that died took its children along: as if
        SIGKILLed, and the next start forks from a server of the task's own. The local launcher's own
        server dying is the launch's end (ForkServerError: one line)."""
        return _poll_gone_as_killed(worker) if self.site.shared else worker.proc.poll()

    def _outcomes(self, start: _Start, failures: list[Failure]) -> list[Outcome]:
        """How each failed worker ended, classified; a worker killed from outside (kill -9, the OOM
        killer) could record nothing itself: its record is written here."""
        plan = functools.partial(planned, self.cfg)  # asked for only after an OOM kill
        outcomes = []
        for failed in failures:
            outcome = exit_outcome(
                self.run_dir,
                failed.rank,
                self.site.host,
                failed.returncode,
                failed.pid,
                start.oom_before,
                plan,
            )
            if failed.returncode < 0 and not self.signals:
                record_killed(
                    self.run_dir,
                    failed.rank,
                    -failed.returncode,
                    self.cfg.cluster.max_restarts,
                    outcome.detail,
                )
            outcomes.append(outcome)
        return outcomes

    def _unhealthy(self, failures: list[Failure]) -> int | None:
        for failed in failures:
            record = read_error_record(self.run_dir, failed.rank)
            if record is not None and record.get("type") == UNHEALTHY:  # the device failed its check
                return self.site.unhealthy(failed.rank, str(record.get("message", "")))
        return None

    def _answer(self, start: _Start, outcome: Outcome, ended: float) -> policy.Action | int | None:
        """The fault that ended ``start``, claimed and answered by the policy (None: another supervisor of
        the job start claimed it; an int: the site ended it, a lost node's requeue)."""
        book, generation = self.book, start.generation
        assert book is not None
        symptom = outcome.peer_symptom
        hang = hang_culprit(self.run_dir, start.started)
        if hang is not None:
            outcome = Outcome(*hang, kind=policy.HUNG)
        if self.site.shared and symptom and wait_for_move(book, generation, SYMPTOM_WAIT_S):
            return None
        if not book.claim(generation):  # another supervisor is deciding
            wait_for_word(book, generation)
            return None
        key = self.site.key(generation)
        lost = None
        if symptom or hang is not None:
            found = self.site.lost(outcome, hang is not None, ended, start.first_step)
            if isinstance(found, int):
                return found
            if found is not None:
                outcome, lost = found
        restarts = generation < self.cfg.cluster.max_restarts
        if outcome.fault_kind() == policy.PEER:
            outcome = self.site.culprit(outcome, key, ended, restarts)
        return answer_fault(book, generation, outcome, start.started, start.first_step, key, lost)

    def _ended(self, ended: Ended) -> Ended:
        """The end, as the site gets it; a run the policy stopped on a crash loop has it recorded as rank 0's
        error by the supervisor of rank 0, which ``hpctrain status`` prints (any other class it stops on has
        its rank's own record for cause)."""
        if self.book is None or self.book.generation() is not None:
            return ended
        ended.stopped = True
        stop = next((r for r in reversed(self.book.rd.read_answers()) if r.get("action") == "stopped"), {})
        ended.crash_loop = stop.get("error") == policy.CRASH_LOOP
        if ended.crash_loop and any(w.rank == 0 for w in self.workers):
            with contextlib.suppress(OSError):  # a full disk: the cause is in the fault log still
                write_error_record(self.run_dir, 0, policy.CRASH_LOOP, str(stop.get("why", "crash loop")))
        return ended


def wait_for_word(book: RestartBook, generation: int) -> bool:
    """Until the supervisor that claimed the end of ``generation`` has decided: True when the generation
    moved on (a restart, or the run stopped: a crash loop), False when no restart was left."""
    while book.generation() == generation:
        if book.ended_without_restart(generation):
            return False
        time.sleep(POLL_S)
    return True


def wait_for_move(book: RestartBook, generation: int, timeout: float | None) -> bool:
    deadline = None if timeout is None else time.monotonic() + timeout
    while book.generation() == generation:
        if deadline is not None and time.monotonic() >= deadline:
            return False
        time.sleep(POLL_S)
    return True


def kill_group(pid: int, sig: int) -> None:
    # The worker leads its own session: its process group holds it and whatever it started.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _poll_gone_as_killed(worker: Worker) -> int | None:
    try:
        return worker.proc.poll()
    except ServerGone:  # the workers' server died and took them along: as if SIGKILLed
        worker.proc.returncode = -signal.SIGKILL
        return -signal.SIGKILL


def _reap(worker: Worker) -> None:
    with contextlib.suppress(ServerGone):  # its server went too: the worker is gone either way
        worker.proc.wait()


def _stop(workers: list[Worker], grace_s: float) -> None:
    """The live workers asked to end (SIGTERM), then killed after ``grace_s``."""
    alive = [w for w in workers if _poll_gone_as_killed(w) is None]
    for worker in alive:
        kill_group(worker.proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_poll_gone_as_killed(w) is None for w in alive) and time.monotonic() < deadline:
        time.sleep(POLL_S)
    for worker in alive:
        if _poll_gone_as_killed(worker) is None:
            kill_group(worker.proc.pid, signal.SIGKILL)
        _reap(worker)


def _failure(worker: Worker, run_dir: Path, code: int, hung: str | None) -> Failure:
    if hung is not None:  # killed by its supervisor: its heartbeat stood still
        detail = hung
    elif code < 0:
        detail = f"was killed by {signal.Signals(-code).name}"
    else:
        error = read_error_file(run_dir, worker.rank)
        detail = f"failed with exit code {code}" + (f": {error}" if error else "")
    assert worker.exited_at is not None
    return Failure(worker.rank, worker.proc.pid, code, detail, worker.log_path, worker.exited_at)
