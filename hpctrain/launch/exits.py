"""How a worker's exit is read by its supervisor (the local launcher, a Slurm task's agent): the facts a
worker cannot give itself, classified (:mod:`hpctrain.resilience.attribution`) into an :class:`Outcome`.

- The host's count of OOM kills (:func:`oom_kills`), read before a generation of workers starts and again
  when one dies of SIGKILL: a count that went up means the OOM killer killed it.
- The worker's error record, and its last heartbeat's peak RSS.
- The run directory's room (:func:`storage_full`): a worker that left no record on a full disk could not.

No torch import here.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from pathlib import Path

from hpctrain.launch.supervision import Outcome
from hpctrain.observe.memory import read_summary
from hpctrain.plan.host import Planned
from hpctrain.resilience import policy
from hpctrain.resilience.attribution import ExitFacts, classify
from hpctrain.resilience.watchdog import read_beat
from hpctrain.rundir import RunDir
from hpctrain.rundir.records import is_peer_symptom, read_error_record


def oom_kills() -> int | None:
    """How many processes the OOM killer has killed so far, as this host lets a process see it: this
    process's memory cgroup's count (cgroup v2 ``memory.events``, v1 ``memory.oom_control``: its workers are
    in it, as children are), else the kernel's (``/proc/vmstat``); None when neither can be read. A worker
    that died of SIGKILL while the count went up was the OOM killer's."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2
            candidates = [Path("/sys/fs/cgroup") / path.lstrip("/") / "memory.events"]
        elif "memory" in controllers.split(","):
            candidates = [Path("/sys/fs/cgroup/memory") / path.lstrip("/") / "memory.oom_control"]
        else:
            continue
        for candidate in candidates:
            found = _counter(candidate, "oom_kill")
            if found is not None:
                return found
    return _counter(Path("/proc/vmstat"), "oom_kill")


def _counter(path: Path, name: str) -> int | None:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name and value.strip().isdigit():
                return int(value)
    except OSError:
        pass
    return None


def exit_outcome(
    run_dir: Path,
    rank: int,
    host: str,
    code: int,
    pid: int,
    oom_before: int | None,
    plan: Callable[[], Planned] | None = None,
) -> Outcome:
    """How the worker of ``rank`` (process ``pid``) ended, classified (hpctrain.resilience.attribution):
    its error record, its last heartbeat's peak RSS, and whether the OOM killer killed meanwhile (the count
    was ``oom_before`` when its generation started). ``plan``: the plan's figures of a rank, asked for only
    after an out-of-memory."""
    record = read_error_record(run_dir, rank) if code >= 0 else None
    symptom = record is not None and is_peer_symptom(str(record.get("message", "")))
    full = storage_full(run_dir) if code >= 0 and record is None else ""  # no record: no room for one?
    beat = read_beat(RunDir(run_dir).heartbeat(rank))
    peak = beat.peak_rss if beat is not None and beat.pid == pid and beat.peak_rss else None
    now = oom_kills() if code < 0 else None
    oom = oom_before is not None and now is not None and now > oom_before
    killed = plan is not None and oom and code == -signal.SIGKILL
    found = classify(ExitFacts(code, record, oom, peak, symptom, full, plan().host if killed else None))
    detail = found.detail
    if found.kind == policy.OOM and code >= 0:  # raised on a GPU: what filled it, when the history was armed
        summary = read_summary(run_dir, rank)
        gpu = plan().gpu if plan is not None and summary else None
        beside = f" (plan: {gpu / 1024**3:.2f} GiB per GPU)" if gpu else ""
        detail = f"{detail}: {summary}{beside}" if summary else detail
    if found.kind == policy.STORAGE and not full and not (record or {}).get("filename"):
        detail += f"; the run directory {run_dir} has {free_bytes(run_dir) // 1024} KiB free now"
    return Outcome(rank, host, found.cause, symptom, found.kind, detail=detail)


FULL_BELOW = 1 << 20  # bytes free under which a run directory is full (no error record fits, no log line)


def storage_full(run_dir: Path) -> str:
    """The run directory's storage in words when it is full (space or inodes), else ''."""
    try:
        stat = os.statvfs(run_dir)
    except OSError:
        return ""
    free = stat.f_bavail * stat.f_frsize
    if free < FULL_BELOW or (stat.f_files and stat.f_favail == 0):
        return f"no space left on the device ({run_dir}: {free // 1024} KiB free, {stat.f_favail} inodes)"
    return ""


def free_bytes(run_dir: Path) -> int:
    try:
        stat = os.statvfs(run_dir)
    except OSError:
        return 0
    return stat.f_bavail * stat.f_frsize
