"""Test-only fault injection: the one place that knows how to break a run on purpose.

The ``faults`` config group (default ``none``, which injects nothing) exists to exercise the resilience path
(requeue after a crash, the hang watchdog, the straggler report, a crash in the middle of a save). The
training loop and the checkpoint manager call :meth:`FaultInjector.at` at named points; nothing else in the
package knows what a fault is. Torch-free.

Points:
- ``"step"``: start of a train step (before data). ``fail_at=RANK:STEP`` raises there;
  ``hang_at=RANK:STEP`` sleeps forever there (in a Slurm job's first start only, so the requeued job heals).
- ``"data"``: the data phase of every step. ``slow_rank=RANK:SECONDS`` sleeps that long (a straggler).
- ``"commit"``: rank 0, after a checkpoint's shards are written and before it is committed.
  ``save_delay_s`` sleeps that long (a window to kill the job mid-save).
- ``"step"`` also: ``kill_at=RANK:STEP`` makes that rank kill itself there with SIGKILL (a real ``kill -9``:
  no exception, no cleanup; its checkpoint writer dies with it).
- ``"step"`` also: ``stop_at=RANK:STEP`` makes that rank stop itself with SIGSTOP (a hung process: it takes
  no signal but SIGKILL, its threads and heartbeat stop).
- ``"report"``: after a step's update, where the ranks meet to log it. With ``stop_in=report``, ``stop_at``
  stops the rank there instead (its peers then wait in the logging collective, where no watchdog limit is
  armed: only its supervisor, reading its stale heartbeat, can tell).
- ``kill_at``, ``stop_at`` and ``hang_at`` fire in the first start of a job's workers only, or with
  ``RANK:STEP@G`` in their generation G (``HPCTRAIN_RESTART``: the G-th restart inside the allocation), so a
  restarted start heals and one job can take several faults in turn.
- ``nan_at=RANK:STEP``: that rank's loss at that step is NaN (once per process: a rollback that trains the
  step again does not meet it again), for the non-finite guard (``trainer.nonfinite``).
- ``"step"`` also: ``oom_at=RANK:STEP[@G]`` makes that rank take memory there (64 MiB at a time, every page
  written) until the OOM killer ends it: for a run under a memory limit (a cgroup's), as a job's is.
- ``"write"``: in a rank's checkpoint writer process, while it writes a save of that step (after each
  buffer of a shard). ``writer_kill_at=RANK:STEP`` makes that rank's writer kill itself there with SIGKILL.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from dataclasses import dataclass

from hpctrain.errors import ConfigError

log = logging.getLogger(__name__)

POINTS = ("step", "data", "report", "commit", "write")
STOP_POINTS = ("step", "report")  # where stop_at may stop a rank (faults.stop_in)


@dataclass
class FaultsConfig:
    fail_at: str | None = None  # "RANK:STEP": that rank raises at the start of that step
    hang_at: str | None = None  # "RANK:STEP": that rank sleeps forever there (first start of a job only)
    slow_rank: str | None = None  # "RANK:SECONDS": that rank sleeps so long in every step's data phase
    save_delay_s: float = 0.0  # rank 0 waits so long between writing a checkpoint and committing it
    kill_at: str | None = None  # "RANK:STEP": that rank kills itself (SIGKILL) at the start of that step
    writer_kill_at: str | None = None  # "RANK:STEP": that rank's checkpoint writer kills itself mid-write
    stop_at: str | None = None  # "RANK:STEP[@G]": that rank stops itself (SIGSTOP) at the start of that step
    stop_in: str = "step"  # where stop_at stops it: at the step's start, or in its report (STOP_POINTS)
    nan_at: str | None = None  # "RANK:STEP": that rank's loss is NaN at that step (once per process)
    oom_at: str | None = None  # "RANK:STEP[@G]": that rank takes memory there until the OOM killer ends it


def _rank_step(key: str, value: str | None) -> tuple[int, int] | None:
    if value is None:
        return None
    rank, _, step = value.partition(":")
    if not (rank.isdigit() and step.isdigit()):
        raise ConfigError(f"faults.{key}", value, "expected RANK:STEP", valid="e.g. 1:5")
    return int(rank), int(step)


def _generation_of(key: str, value: str | None) -> tuple[int, int, int] | None:
    """``RANK:STEP`` (generation 0) or ``RANK:STEP@G``."""
    if value is None:
        return None
    spec, at, generation = value.partition("@")
    if at and not generation.isdigit():
        raise ConfigError(
            f"faults.{key}", value, "expected RANK:STEP or RANK:STEP@GENERATION", valid="e.g. 1:5@1"
        )
    found = _rank_step(key, spec)
    assert found is not None
    return (*found, int(generation) if at else 0)


def _slow(value: str | None) -> tuple[int, float] | None:
    if value is None:
        return None
    rank, _, seconds = value.partition(":")
    try:
        delay = float(seconds)
        if not rank.isdigit() or not delay >= 0:  # `not >=` also refuses nan
            raise ValueError
    except ValueError:
        raise ConfigError("faults.slow_rank", value, "expected RANK:SECONDS", valid="e.g. 1:0.2") from None
    return int(rank), delay


def check_faults(faults: FaultsConfig) -> None:
    """One-line ConfigError for a malformed fault spec (run on the submitting machine)."""
    _rank_step("fail_at", faults.fail_at)
    _generation_of("hang_at", faults.hang_at)
    _generation_of("kill_at", faults.kill_at)
    _generation_of("stop_at", faults.stop_at)
    _generation_of("oom_at", faults.oom_at)
    if faults.stop_in not in STOP_POINTS:
        raise ConfigError(
            "faults.stop_in", faults.stop_in, "not a point where a rank stops", valid=", ".join(STOP_POINTS)
        )
    _rank_step("nan_at", faults.nan_at)
    _rank_step("writer_kill_at", faults.writer_kill_at)
    _slow(faults.slow_rank)
    if not faults.save_delay_s >= 0:
        raise ConfigError("faults.save_delay_s", faults.save_delay_s, "must be ≥ 0", valid="seconds, e.g. 8")


def check_fault_ranks(faults: FaultsConfig, world: int) -> None:
    """A fault on a rank the run does not have would never fire, and a test built on it would pass for
    nothing: one line naming the key and the world size."""
    for key in (
        "fail_at",
        "hang_at",
        "kill_at",
        "stop_at",
        "oom_at",
        "nan_at",
        "writer_kill_at",
        "slow_rank",
    ):
        value = getattr(faults, key)
        rank = value.partition(":")[0] if value is not None else ""
        if rank.isdigit() and int(rank) >= world:
            raise ConfigError(
                f"faults.{key}",
                value,
                f"rank {rank} is not in this run of {world} rank(s)",
                valid=f"a rank from 0 to {world - 1}",
            )


class FaultInjector:
    """What one rank does at each named point; a no-op for ``faults=none``."""

    def __init__(self, faults: FaultsConfig | None, rank: int) -> None:
        faults = faults or FaultsConfig()
        self.rank = rank
        self.spec = faults
        self._fail = _rank_step("fail_at", faults.fail_at)
        # A requeued job does not hang again: it is the first start's hang that the tests observe.
        first_start = not os.environ.get("SLURM_RESTART_COUNT")
        self.generation = int(os.environ.get("HPCTRAIN_RESTART", "0") or 0)
        self._hang = self._here("hang_at", faults.hang_at) if first_start else None
        self._stop = self._here("stop_at", faults.stop_at)
        self._nan = _rank_step("nan_at", faults.nan_at)
        self._slow = _slow(faults.slow_rank)
        self._save_delay_s = float(faults.save_delay_s)
        self._kill = self._here("kill_at", faults.kill_at)
        self._oom = self._here("oom_at", faults.oom_at)
        self._kill_writer = _rank_step("writer_kill_at", faults.writer_kill_at)

    def _here(self, key: str, value: str | None) -> tuple[int, int] | None:
        """(rank, step) of a fault that fires in this generation of the workers, else None."""
        found = _generation_of(key, value)
        return found[:2] if found is not None and found[2] == self.generation else None

    def nan_loss(self, step: int) -> bool:
        """Whether this rank's loss at ``step`` is to be NaN (``nan_at``; once per process)."""
        if self._nan == (self.rank, step):
            self._nan = None
            log.warning("A NaN loss at step %d on purpose (faults.nan_at=%s)", step, self.spec.nan_at)
            return True
        return False

    def at(self, point: str, step: int = 0) -> None:
        """Inject whatever this rank has at ``point`` of ``step`` (the step being trained, 1-based)."""
        if point == "step":
            if self._fail == (self.rank, step):
                raise RuntimeError(f"injected failure at step {step} (faults.fail_at={self.spec.fail_at})")
            if self._hang == (self.rank, step):
                log.warning("Hanging at step %d on purpose (faults.hang_at=%s)", step, self.spec.hang_at)
                threading.Event().wait()
            if self._kill == (self.rank, step):
                log.warning(
                    "Killing this rank (SIGKILL) at step %d (faults.kill_at=%s)", step, self.spec.kill_at
                )
                os.kill(os.getpid(), signal.SIGKILL)
            if self._stop == (self.rank, step) and self.spec.stop_in == "step":
                self._stop_here(point, step)
            if self._oom == (self.rank, step):
                self._take_memory(step)
        elif point == "report":
            if self._stop == (self.rank, step) and self.spec.stop_in == "report":
                self._stop_here(point, step)
        elif point == "data":
            if self._slow is not None and self._slow[0] == self.rank:
                time.sleep(self._slow[1])
        elif point == "commit":
            if self._save_delay_s > 0:
                time.sleep(self._save_delay_s)
        elif point == "write":
            if self._kill_writer == (self.rank, step):
                os.kill(os.getpid(), signal.SIGKILL)
        else:
            raise ValueError(f"unknown fault point {point!r} (known: {', '.join(POINTS)})")

    def _take_memory(self, step: int) -> None:
        log.warning("Taking memory until the OOM killer ends this rank (faults.oom_at=%s)", self.spec.oom_at)
        for handler in logging.getLogger().handlers:
            handler.flush()
        # Never the whole machine's: without a limit below it, the injection gives up first.
        most = 0.8 * os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        held, chunk = [], 64 << 20
        while len(held) * chunk < most:  # bytes repeated: every page written, so resident
            held.append(b"\x01" * chunk)
            time.sleep(0.02)  # the heartbeat thread runs between chunks: the peak RSS it records is near
        raise RuntimeError(
            f"faults.oom_at={self.spec.oom_at}: no OOM killer by 80 % of this machine's memory"
        )

    def _stop_here(self, point: str, step: int) -> None:
        log.warning(
            "Stopping this rank (SIGSTOP) at step %d, %s (faults.stop_at=%s)", step, point, self.spec.stop_at
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os.kill(os.getpid(), signal.SIGSTOP)


NO_FAULTS = FaultInjector(None, rank=-1)
