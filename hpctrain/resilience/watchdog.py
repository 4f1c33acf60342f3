"""Notice a hung or dead rank, say which node it was on, and get the job running again elsewhere.

Each rank runs a watchdog thread. The training loop only stores where it is (step, phase) in memory; the
thread writes that to ``heartbeats/rank<R>.json`` once a second (off the hot path) and checks the age of the
current step. A step older than ``watchdog_factor`` × the median of recent steps (and ``watchdog_min_s``) is
a hang: the thread dumps every Python stack of its process into the rank log (faulthandler), works out the
culprit from all ranks' heartbeats, and — on one rank — records it and requeues the job without that node.

Who is the culprit: ranks blocked in a collective wait for the rank that has not reached it, so the rank at
the earliest (step, phase) is the one the others wait for; a rank whose heartbeat stopped is dead.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import logging
import os
import statistics
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from hpctrain.resilience import stacks
from hpctrain.rundir import RunDir
from hpctrain.rundir.files import atomic_json
from hpctrain.rundir.records import write_error_record

log = logging.getLogger(__name__)

PHASES = ("startup", "data", "compute", "report", "checkpoint")  # in the order a step goes through them
# Only a train step's own work is timed against the recent steps. Evaluation, logging ("report") and saves
# ("checkpoint") take as long as they take: a slow save is not a hang, and killing it would requeue forever.
ARMED_PHASES = ("data", "compute")
HEARTBEAT_S = 1.0
CHECK_S = 0.25  # how often the thread compares the step's age with its limit (a file write only every beat)
STALE_AFTER_S = 3 * HEARTBEAT_S
EXIT_HUNG = 6  # apart from a stopped worker's 3 (hpctrain.rundir.records.EXIT_STOPPED): a hang is a fault


@dataclass
class Heartbeat:
    rank: int
    host: str
    pid: int
    step: int
    phase: str
    since: float  # when this (step, phase) began
    written: float
    job: str = ""  # which start of which job wrote it (job_key): files of an earlier start are not evidence
    closed: bool = False  # the loop ended (its last beat): no more beats come from a live process
    peak_rss: int = 0  # bytes: the process's peak resident set so far (VmHWM), for an OOM's verdict


def job_key(environ: dict[str, str] | None = None) -> str:
    """The same on every rank of one start of one job, different for a requeued start or another job."""
    env = os.environ if environ is None else environ
    generation = env.get("HPCTRAIN_RESTART", "0") or "0"  # a restart inside the allocation is a new start
    suffix = f".g{generation}" if generation != "0" else ""
    if "SLURM_JOB_ID" in env:
        return f"slurm:{env['SLURM_JOB_ID']}.{env.get('SLURM_RESTART_COUNT', '0')}{suffix}"
    return f"local:{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}{suffix}"


def read_heartbeats(run_dir: Path, job: str | None = None) -> list[Heartbeat]:
    """The ranks' heartbeats; with ``job``, only those written by that start of that job."""
    beats = (read_beat(path) for path in RunDir(run_dir).heartbeat_files())
    return [b for b in beats if b is not None and (job is None or b.job == job)]


def read_beat(path: Path) -> Heartbeat | None:
    """One heartbeat file; None when there is none yet or it is being replaced right now."""
    try:
        return Heartbeat(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def stalled(run_dir: Path, rank: int, pid: int, now: float) -> Heartbeat | None:
    """The last heartbeat of ``rank``'s live process ``pid`` when it is older than :data:`STALE_AFTER_S`:
    the process lives, but its watchdog thread writes nothing (stopped by SIGSTOP, or frozen whole), in
    whatever phase, a save's and a report's included, where no peer's time limit is armed. Its supervisor
    asks (the local launcher, a Slurm task's agent): one small file read, never the other ranks'. None
    before this process's first beat and after its loop ended (its last beat is ``closed``)."""
    beat = read_beat(RunDir(run_dir).heartbeat(rank))
    if beat is None or beat.pid != pid or beat.closed or now - beat.written <= STALE_AFTER_S:
        return None
    return beat


def stalled_why(beat: Heartbeat, now: float) -> str:
    """A stalled rank's cause in words (the fault log, ``status``)."""
    state = _process_state(beat.pid)
    how = "stopped (SIGSTOP)" if state in ("T", "t") else "its threads do not run"
    # The beat is the last one written (once a second): where the rank was then, not where it stopped.
    return (
        f"no heartbeat for {now - beat.written:.0f} s while the process lives: {how}; last seen in step "
        f"{beat.step} ({beat.phase})"
    )


def _peak_rss() -> int:
    """This process's peak resident set in bytes (VmHWM of /proc/self/status); 0 where it cannot be read."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _process_state(pid: int) -> str:
    """The state letter of /proc/PID/stat (R, S, D, T, …); '' when it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return ""


def find_culprit(beats: list[Heartbeat], now: float) -> tuple[Heartbeat | None, str]:
    """The rank the others are waiting for, and why; (None, reason) when the heartbeats cannot tell."""
    # Peers of a dead rank exit too, a little later: the first heartbeat to stop is the cause.
    dead = sorted((b for b in beats if now - b.written > STALE_AFTER_S), key=lambda b: b.written)
    if dead:
        return dead[0], f"its heartbeat stopped {now - dead[0].written:.0f} s ago (the process is gone)"
    if not beats:
        return None, "no heartbeats"
    position = {b.rank: (b.step, PHASES.index(b.phase) if b.phase in PHASES else 0) for b in beats}
    earliest = min(position.values())
    behind = [b for b in beats if position[b.rank] == earliest]
    if len(behind) == len(beats):
        return None, f"every rank is at step {beats[0].step} ({beats[0].phase}): no single rank is behind"
    culprit = behind[0]
    return (
        culprit,
        f"it is still in step {culprit.step} ({culprit.phase}) while the others wait in a collective",
    )


class Watchdog:
    def __init__(
        self,
        run_dir: Path,
        rank: int,
        host: str,
        factor: float,
        min_s: float,
        on_hang: Callable[[Heartbeat | None, str], None],
        started: float | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.rank = rank
        self.host = host
        self.factor = factor
        self.min_s = min_s
        self.on_hang = on_hang
        self.step = 0
        self.phase = "startup"
        # ``started``: when the process group was ready (its start-up phase, build and load, runs from there)
        self.since = time.time() if started is None else started
        # Seconds spent in each phase so far (the goodput ledger's evidence, hpctrain.observe.goodput): one
        # addition per phase change, nothing else on the hot path.
        self.spent: dict[str, float] = {}
        self.first_step_s: float | None = None  # the first step's wall time (compilation, warm-up)
        self.resumed_from = 0  # the step this process's training started from (its checkpoint's)
        self.load_s = 0.0  # seconds the checkpoint's load took
        self.on_beat: Callable[[], None] | None = None  # called by the thread after each heartbeat
        self.flight_record = False  # an NCCL run: a hang's dump holds the flight recorder's record too
        self.step_started = self.since  # when the current step's armed phases began
        self.first_step: int | None = None  # the first step this process trained
        self.closed = False
        self.job = job_key()
        self.recent: deque[float] = deque(maxlen=50)
        self._stop = threading.Event()
        self._stacks = stacks.Answerer(run_dir, rank)  # hpctrain stacks: answered from this thread
        RunDir(run_dir).heartbeats.mkdir(parents=True, exist_ok=True)
        # At once, not after the first interval: a rank that dies in its first second must still leave a
        # heartbeat that goes stale, or its peers cannot tell who died (and requeue a run that failed).
        self._write_heartbeat()
        self._thread = threading.Thread(target=self._run, name="hpctrain-watchdog", daemon=True)
        self._thread.start()

    # --- called by the training loop: plain attribute writes, nothing else on the hot path
    def enter(self, step: int, phase: str) -> None:
        now = time.time()
        if step != self.step:
            self.step_started = now
        if self.first_step is None and phase == "data":
            self.first_step = step
        self._count_phase(now)
        self.step, self.phase, self.since = step, phase, now

    def resumed(self, step: int, load_s: float) -> None:
        """Training starts from ``step``, whose checkpoint took ``load_s`` to load (0, 0.0: a fresh start)."""
        self.resumed_from, self.load_s = step, self.load_s + load_s

    def time_spent(self, now: float) -> dict[str, float]:
        """Seconds per phase, the current one's included up to ``now``."""
        spent = dict(self.spent)
        if not self.closed:
            spent[self.phase] = spent.get(self.phase, 0.0) + max(0.0, now - self.since)
        return spent

    def _count_phase(self, now: float) -> None:
        """The current phase's seconds, up to ``now``, into :attr:`spent`."""
        self.spent[self.phase] = self.spent.get(self.phase, 0.0) + (now - self.since)

    def made_progress(self) -> bool:
        """Whether this process finished a training step (for cluster.max_no_progress)."""
        if self.first_step is None:
            return False
        return self.step > self.first_step or self.phase in ("report", "checkpoint")

    def step_done(self, seconds: float) -> None:
        if self.first_step_s is None:
            self.first_step_s = seconds
        self.recent.append(seconds)

    def median_step_s(self) -> float | None:
        return statistics.median(self.recent) if self.recent else None

    def close(self) -> None:
        self._stop.set()
        if not self.closed:  # the last phase's time, once
            self._count_phase(time.time())
        self.closed = True
        # The step this rank ended in, on file now: the thread writes once a second, and a step that raised
        # within that second would leave an older one (the restart policy compares where attempts failed).
        self._write_heartbeat()

    # --- the thread
    def _run(self) -> None:
        written = time.monotonic()
        while not self._stop.wait(CHECK_S):
            self._stacks.poll()
            if time.monotonic() - written >= HEARTBEAT_S:
                self._write_heartbeat()
                written = time.monotonic()
                if self.on_beat is not None:
                    self.on_beat()
            limit = self._limit()
            age = time.time() - self.step_started
            if limit is not None and self.phase in ARMED_PHASES and age > limit:
                self._fire(age, limit)
                return

    def _limit(self) -> float | None:
        if self.factor <= 0 or len(self.recent) < 3:
            return None  # no baseline yet: start-up hangs are the process-group timeout's job
        return max(self.factor * statistics.median(self.recent), self.min_s)

    def _write_heartbeat(self) -> None:
        beat = Heartbeat(
            self.rank,
            self.host,
            os.getpid(),
            self.step,
            self.phase,
            self.since,
            time.time(),
            self.job,
            self.closed,
            _peak_rss(),
        )
        try:
            # Not fsynced: rewritten every second, and only live processes read it.
            atomic_json(RunDir(self.run_dir).heartbeat(self.rank), asdict(beat), durable=False, indent=None)
        except OSError as err:
            log.warning("heartbeat not written: %s", err)

    def _fire(self, age: float, limit: float) -> None:
        log.error(
            "Hang: rank %d on %s has been in step %d (%s) for %.0f s, over its limit of %.0f s (median step "
            "%.3f s); dumping every thread's stack",
            self.rank,
            self.host,
            self.step,
            self.phase,
            age,
            limit,
            statistics.median(self.recent),
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        faulthandler.dump_traceback(file=_log_stream(), all_threads=True)
        # Every live rank's stacks beside this one's (their watchdog threads answer within a check).
        with contextlib.suppress(OSError):
            name = stacks.ask(self.run_dir, f"hang-{time.strftime('%Y%m%d-%H%M%S')}-rank{self.rank}")
            self._stacks.dump(name)
            if self.flight_record:
                stacks.dump_flight_record(self.run_dir, name, self.rank)
        # Every live rank's thread writes its (step, phase) once a beat: one beat and a little, and each shows
        # where it waits. A stopped or dead rank needs no more: its last beat is the earliest (step, phase),
        # or already stale (a step ran over the limit since it stopped).
        self._write_heartbeat()
        waited = time.monotonic() + HEARTBEAT_S + CHECK_S
        while time.monotonic() < waited:  # a peer's watchdog that declared it too asks for stacks meanwhile
            time.sleep(CHECK_S / 5)
            self._stacks.poll()
        culprit, why = find_culprit(read_heartbeats(self.run_dir, self.job), time.time())
        where = f"rank {culprit.rank} on {culprit.host}" if culprit else "no single rank"
        write_error_record(
            self.run_dir,
            self.rank,
            "Hang",
            f"step {self.step} ({self.phase}) ran {age:.0f} s, "
            f"over the watchdog's {limit:.0f} s; culprit: {where} ({why})",
        )
        self.on_hang(culprit, why)
        logging.shutdown()
        os._exit(EXIT_HUNG)  # the main thread is stuck: only this ends the process promptly


def _log_stream():  # type: ignore[no-untyped-def]
    """The rank log's open file when logging goes to one, else stderr (which a launcher redirects)."""
    for handler in logging.getLogger().handlers:
        stream = getattr(handler, "stream", None)
        if isinstance(handler, logging.FileHandler) and stream is not None:
            return stream
    return sys.stderr
