"""Watching jobs without flooding the controller: one ``squeue`` of all the user's jobs per
:data:`INTERVAL_S`, shared by every watcher of this user on this machine.

Sites rate-limit Slurm's RPCs per user (snakemake's executor: 40 calls, then 4 a minute, #467), and the known
failures of job launchers are watchers that each poll: submitit's sacct floods (#1759), Parsl's sacct hanging
above 200 jobs (#3814). Here whatever waits for a job to end (``hpctrain logs -f``, a sweeper waiting for its
members' results, the pruner's look at evaluation jobs) asks :func:`watched_states` instead of Slurm. Its
answer comes from a snapshot of the user's queue, taken at most once per :data:`INTERVAL_S` by whichever
watcher finds it stale first (a file under the user's cache, :func:`hpctrain.paths.cache_dir`, written
atomically under a lock) and read by every other. A job missing from the snapshot has ended (or was submitted
after it): its state is asked of Slurm once (``sacct`` for an ended one) and a final state is kept in the
process. So N watchers of M jobs cost one ``squeue`` per interval plus one query per job as it ends, not
N × M queries a poll.

The snapshot's file is read only when this user owns it (a cache folder others may write is not trusted
to say a job ended), and is named for the cluster it describes (the ``cluster.ssh`` login node, or
``SLURM_CONF`` and the configuration's modification time: a test cluster started again reuses job ids), and a
snapshot older than the interval is never read, whatever its name.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from dataclasses import asdict
from pathlib import Path
from typing import IO

from hpctrain.paths import cache_dir
from hpctrain.slurm import commands
from hpctrain.slurm.commands import JobState

INTERVAL_S = 15.0  # issue 44: any watching of a job polls at most once per 15 s per user

# What this process learnt, by the snapshot's file (a cluster and a cache): final states (they never change),
# states asked for directly since the last snapshot, and its own snapshot where the file cannot be written.
_final: dict[tuple[str, str], JobState] = {}
_direct: dict[tuple[str, str], tuple[float, JobState]] = {}
_own: dict[str, tuple[float, dict[str, JobState]]] = {}


def watched_states(job_ids: list[str]) -> dict[str, JobState]:
    """Each job's state as of at most :data:`INTERVAL_S` ago (a job array's id: its members, as
    :func:`hpctrain.slurm.commands.job_states` answers). Raises what the Slurm clients raise."""
    job_ids = [j for j in dict.fromkeys(job_ids) if commands.JOB_ID.fullmatch(j)]
    if not job_ids:
        return {}
    path = _snapshot_path()
    where = str(path)
    taken, queue = _snapshot(path)
    now = time.time()
    by_array: dict[str, dict[str, JobState]] = {}  # 12 → {12_0: …, 12_1: …}; a plain job under itself
    for key, state in queue.items():
        by_array.setdefault(key.split("_")[0], {})[key] = state
    states: dict[str, JobState] = {}
    missing = []
    for job in job_ids:
        members = {job: queue[job]} if job in queue else by_array.get(job, {})
        direct = _direct.get((where, job))
        if members:
            states.update(members)
        elif (where, job) in _final:
            states[job] = _final[where, job]
        elif direct is not None and direct[0] > taken and now - direct[0] < INTERVAL_S:
            states[job] = direct[1]
        else:
            missing.append(job)
    if missing:
        asked = commands.job_states(missing)
        for job, state in asked.items():
            if state.final:
                _final[where, job] = state
            else:
                _direct[where, job] = (now, state)
        states.update(asked)
    return states


def _snapshot(path: Path | None) -> tuple[float, dict[str, JobState]]:
    """(when it was taken, the user's queue): the shared file's when fresh, else a new one, written there."""
    fresh = _read(path)
    if fresh is not None:
        return fresh
    lock = _lock(path)
    try:
        fresh = _read(path)  # another watcher may have taken it while this one waited for the lock
        if fresh is not None:
            return fresh
        taken, queue = time.time(), commands.user_queue()
        _write(path, taken, queue)
        return taken, queue
    finally:
        if lock is not None:
            lock.close()


def _snapshot_path() -> Path | None:
    remote = commands.remote()
    if remote is not None:
        where = f"ssh:{remote.destination}"
    else:
        conf = os.environ.get("SLURM_CONF") or str(commands.DEFAULT_CONF)
        try:
            where = f"{os.path.abspath(conf)}:{os.stat(conf).st_mtime_ns}"
        except OSError:
            where = conf  # configless: the controller found by DNS
    digest = hashlib.sha256(f"{os.getuid()}:{where}".encode()).hexdigest()[:16]
    directory = cache_dir() / "slurm-watch"
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None  # no cache to share: this process keeps its own snapshot
    return directory / f"{digest}.json"


def _read(path: Path | None) -> tuple[float, dict[str, JobState]] | None:
    """The fresh snapshot: the shared file's, else this process's own (where the file cannot be written)."""
    found = _own.get(str(path))
    if path is not None:
        try:
            if path.stat().st_uid != os.getuid():
                raise ValueError("another user's file")  # a shared HPCTRAIN_CACHE: never their answers
            raw = json.loads(path.read_text())
            taken = float(raw["taken"])
            queue = {job: JobState(**fields) for job, fields in raw["queue"].items()}
            if found is None or taken > found[0]:
                found = (taken, queue)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or torn or foreign: this process's, or a new one
    return found if found is not None and 0 <= time.time() - found[0] < INTERVAL_S else None


def _write(path: Path | None, taken: float, queue: dict[str, JobState]) -> None:
    if path is None:
        _own[str(path)] = (taken, queue)
        return
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"taken": taken, "queue": {job: asdict(s) for job, s in queue.items()}}))
        os.replace(tmp, path)
    except OSError:
        _own[str(path)] = (taken, queue)
        with contextlib.suppress(OSError):
            tmp.unlink()


def _lock(path: Path | None) -> IO[str] | None:
    """The snapshot's lock, held until the returned file is closed; None where it cannot be taken (then
    this watcher takes its own snapshot: a second query beats waiting)."""
    if path is None:
        return None
    try:
        handle = open(path.with_suffix(".lock"), "a")  # noqa: SIM115 (closed by the caller)
        fcntl.flock(handle, fcntl.LOCK_EX)
    except OSError:
        return None
    return handle
