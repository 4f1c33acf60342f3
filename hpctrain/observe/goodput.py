"""Where a run's wall time went, from its first submission to now, across every job start, restart and
requeue: the goodput ledger (``goodput.json``, ``hpctrain status``, ``summary``, ``report``).

Evidence, written as the run goes:

- rank 0 of every attempt (a job start, a restart inside it, a local run) keeps ``attempts/<job key>.json``
  (:class:`AttemptRecorder`, every 2 s from its watchdog thread and at its end): when its supervisor started
  it, when it began and finished joining the process group, the step it resumed from and the seconds the
  checkpoint's load took, the seconds spent in each phase of the loop (the watchdog's phases: start-up,
  data, compute, report, checkpoint), its first step's time and the median step;
- Slurm's accounting (``sacct --duplicates``) for each job start: submitted, started, ended;
- the run's ``job.json``: when hpctrain submitted it.

:func:`ledger` lays these end to end on one time line, each second in exactly one bucket:

=====================  ======================================================================================
queue wait             a job start's submit (or the requeue) to its start, from Slurm's accounting
start-up               the allocation's start (a local run: the supervisor's start of the worker) to the
                       process group's start, plus the build after it (model, optimizer, data, loggers)
rendezvous             joining the process group
checkpoint load        the resume's load of a checkpoint
compile                the first step's time above the median step (compilation, warm-up)
data wait              the loop waiting for its batch
save stall             the loop held by a save (a blocking one, or staging an asynchronous one)
logging and eval       after a step: its record, evaluation, the straggler report
lost progress          steps trained again: those past the checkpoint the next attempt resumed from
restart gaps           an attempt's last record to the next attempt's (or requeue's) start
productive steps       the compute of every step that counts
=====================  ======================================================================================

The buckets tile the wall time by construction (each interval is a difference of two recorded times, and
the next one starts where it ends), so they sum to it within the clocks' rounding. What is not known is said:
with no accounting the queue is counted in the restart gaps. A killed attempt's last up to 2 s after its
last record count as a restart gap.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpctrain.rundir import RunDir
from hpctrain.rundir.files import atomic_json
from hpctrain.rundir.records import read_job

STARTED_ENV = "HPCTRAIN_STARTED_AT"  # when the supervisor started this worker (hpctrain.launch.spawn)
WRITE_EVERY_S = 2.0
BUCKETS = (
    "queue wait",
    "start-up",
    "rendezvous",
    "checkpoint load",
    "compile",
    "data wait",
    "save stall",
    "logging and eval",
    "lost progress",
    "restart gaps",
    "productive steps",
)


@dataclass
class Attempt:
    key: str  # the job key (hpctrain.resilience.watchdog.job_key): one per job start and restart
    slurm_job: str | None
    launched: float  # the supervisor started this process
    rendezvous_at: float  # joining the process group began
    joined: float  # the process group was ready
    resumed_from: int
    step: int  # the last step it finished
    load_s: float
    first_step_s: float | None
    median_step_s: float | None
    spent: dict[str, float]  # seconds per watchdog phase since ``joined``
    written: float
    closed: bool = False


class AttemptRecorder:
    """Rank 0's record of its attempt: written every :data:`WRITE_EVERY_S` from the watchdog thread (so a
    killed attempt leaves one at most that old) and at :meth:`close`."""

    def __init__(self, run_dir: Path, key: str, slurm_job: str | None, rendezvous_at: float, joined: float):
        self.path = RunDir(run_dir).attempt(key)
        self.key, self.slurm_job = key, slurm_job
        self.launched = _launched(rendezvous_at)
        self.rendezvous_at, self.joined = rendezvous_at, joined
        self._lock = threading.Lock()
        self._written = 0.0
        self._closed = False  # the last record is written: a beat of the watchdog thread after it writes none
        self.watchdog: Any = None  # hpctrain.resilience.watchdog.Watchdog, once it runs

    def attach(self, watchdog: Any) -> None:
        self.watchdog = watchdog
        watchdog.on_beat = self.maybe_write
        self.write()

    def maybe_write(self) -> None:
        if time.monotonic() - self._written >= WRITE_EVERY_S:
            self.write()

    def write(self, closed: bool = False) -> None:
        w = self.watchdog
        if w is None:
            return
        with self._lock:
            if self._closed:
                return
            self._closed = closed
            now = time.time()
            record = Attempt(
                self.key,
                self.slurm_job,
                self.launched,
                self.rendezvous_at,
                self.joined,
                w.resumed_from,
                max(w.resumed_from, w.step if w.phase in ("report", "checkpoint") else w.step - 1),
                w.load_s,
                w.first_step_s,
                w.median_step_s(),
                w.time_spent(now),
                now,
                closed,
            )
            with contextlib.suppress(OSError):  # a full disk: the ledger loses this attempt's tail only
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_json(self.path, asdict(record), durable=False, indent=None)
            self._written = time.monotonic()

    def close(self) -> None:
        self.write(closed=True)


def _launched(fallback: float) -> float:
    try:
        return float(os.environ[STARTED_ENV])
    except (KeyError, ValueError):
        return fallback  # started by something else (torchrun): its start-up from here on


def read_attempts(run_dir: Path) -> list[Attempt]:
    found = []
    for path in RunDir(run_dir).attempt_files():
        with contextlib.suppress(OSError, ValueError, TypeError):
            found.append(Attempt(**json.loads(path.read_text())))
    return sorted(found, key=lambda a: a.launched)


@dataclass
class Ledger:
    start: float  # the first submission
    end: float  # the last record
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(BUCKETS, 0.0))
    attempts: int = 0
    jobs: int = 0  # Slurm job starts
    accounting: bool = True  # whether Slurm's accounting answered (else the queue is in the gaps)

    @property
    def wall(self) -> float:
        return self.end - self.start

    @property
    def ettr(self) -> float:
        """Effective training time ratio: productive steps over the wall time."""
        return self.seconds["productive steps"] / self.wall if self.wall > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "wall_s": self.wall,
            "ettr": self.ettr,
            "buckets_s": self.seconds,
            "attempts": self.attempts,
            "job_starts": self.jobs,
            "accounting": self.accounting,
        }


def ledger(
    attempts: list[Attempt], instances: list[Any], submitted: float | None, accounting: bool
) -> Ledger:
    """The buckets of the time line from ``submitted`` (None: the first attempt's start) to the last
    record. ``instances``: Slurm's starts of the run's jobs (hpctrain.slurm.commands.Instance)."""
    attempts = sorted(attempts, key=lambda a: a.launched)
    first = attempts[0].launched if attempts else time.time()
    # A run submitted again (hpctrain resume) keeps its earlier attempts: the time line starts at the first.
    start = min(submitted, first) if submitted is not None else first
    book = Ledger(start, start, attempts=len(attempts), accounting=accounting)
    s = book.seconds
    cursor = start
    seen: set[tuple[str, float]] = set()
    for i, a in enumerate(attempts):
        job = _instance_of(a, instances)
        if job is not None and (job.job_id, job.submit) not in seen:
            seen.add((job.job_id, job.submit))
            book.jobs += 1
            if job.submit > cursor and i > 0:  # a requeue: the previous attempt's end to the new submit
                s["restart gaps"] += job.submit - cursor
                cursor = job.submit
            began = max(cursor, job.start or cursor)
            s["queue wait"] += began - cursor
            s["start-up"] += max(0.0, a.launched - began)  # the allocation to this worker's start
        else:
            s["restart gaps"] += max(0.0, a.launched - cursor)
        cursor = max(cursor, a.launched)
        _attempt(s, a, attempts[i + 1] if i + 1 < len(attempts) else None)
        cursor = max(cursor, a.written)
    book.end = cursor
    return book


def _instance_of(a: Attempt, instances: list[Any]) -> Any:
    """The Slurm start this attempt ran in: the last one of its job started at or before it."""
    mine = [
        j for j in instances if j.job_id == a.slurm_job and j.start is not None and j.start <= a.launched + 1
    ]
    return mine[-1] if mine else None


def _attempt(s: dict[str, float], a: Attempt, after: Attempt | None) -> None:
    spent = a.spent
    s["start-up"] += max(0.0, a.rendezvous_at - a.launched)
    s["rendezvous"] += max(0.0, a.joined - a.rendezvous_at)
    load = min(a.load_s, spent.get("startup", 0.0))
    s["checkpoint load"] += load
    s["start-up"] += spent.get("startup", 0.0) - load
    compute = spent.get("compute", 0.0)
    warmup = 0.0
    if a.first_step_s is not None and a.median_step_s is not None:
        warmup = min(compute, max(0.0, a.first_step_s - a.median_step_s))
    s["compile"] += warmup
    s["data wait"] += spent.get("data", 0.0)
    s["save stall"] += spent.get("checkpoint", 0.0)
    s["logging and eval"] += spent.get("report", 0.0)
    compute -= warmup
    trained = a.step - a.resumed_from
    again = max(0, a.step - after.resumed_from) if after is not None else 0
    lost = compute * min(again, trained) / trained if trained > 0 else 0.0
    s["lost progress"] += lost
    s["productive steps"] += compute - lost


def run_ledger(run_dir: Path, ask_slurm: bool = True) -> Ledger | None:
    """The run's ledger as its records say now; None before any attempt recorded anything."""
    attempts = read_attempts(run_dir)
    if not attempts:
        return None
    job = read_job(run_dir)
    jobs = sorted({a.slurm_job for a in attempts if a.slurm_job})  # raw ids, as sacct's JobIDRaw says them
    instances: list[Any] = []
    accounting = True
    if jobs and ask_slurm:
        from hpctrain.slurm import commands

        try:
            instances = commands.job_instances(jobs)
        except (commands.SlurmUnavailable, RuntimeError, OSError, ValueError):
            accounting = False
    elif jobs:
        accounting = False
    return ledger(attempts, instances, job.submitted_at if job else None, accounting)


def write_ledger(run_dir: Path, say: Callable[[str], None] | None = None) -> Ledger | None:
    """``goodput.json`` from the run's records (rank 0, at the end of an attempt that ended by itself)."""
    book = run_ledger(run_dir)
    if book is not None:
        atomic_json(RunDir(run_dir).goodput, book.as_dict())
        if say is not None:
            say(summary_line(book))
    return book


def summary_line(book: Ledger) -> str:
    """One line: the wall time, ETTR and the largest buckets."""
    top = sorted(((v, k) for k, v in book.seconds.items() if v >= 0.005 * book.wall), reverse=True)[:4]
    parts = ", ".join(f"{k} {v / book.wall:.0%}" for v, k in top) if book.wall > 0 else ""
    queue = "" if book.accounting else " (no Slurm accounting: queue wait in the gaps)"
    return f"goodput: ETTR {book.ettr:.2f} of {_duration(book.wall)} since submission ({parts}){queue}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"
