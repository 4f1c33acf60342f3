"""One run per run directory: an exclusive ``flock`` on ``<run>/.lock``. Torch-free.

Two runs writing into one directory would corrupt each other's checkpoints and metrics. The holder (the
local launcher for the run's life, or rank 0 of a Slurm job) keeps the lock file open with ``LOCK_EX``; the
kernel releases it when the holder dies, however it dies, so a stale lock never blocks a later run. The file
holds the holder's host, pid and Slurm job id, written in place (not through ``atomic_write``: a rename would
put a new, unlocked inode at the path), so a refused run can name who holds it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from hpctrain.errors import ConfigError

LOCK_FILE = ".lock"


class RunLock:
    """An exclusive lock on a run directory; :meth:`acquire` raises ConfigError naming the holder."""

    def __init__(self, run_dir: Path) -> None:
        self.path = Path(run_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self, wait_s: float = 0.0, job_id: str | None = None) -> RunLock:
        """Take the lock, retrying for up to ``wait_s`` seconds (a requeued job's previous incarnation may
        still be dying)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = _describe(self.path)
                    os.close(fd)
                    raise ConfigError(
                        "hydra.run.dir",
                        self.path.parent,
                        f"another run is using this directory ({holder})",
                        "a different hydra.run.dir, or wait for that run to end",
                    ) from None
                time.sleep(0.2)
        record = {"host": socket.gethostname(), "pid": os.getpid(), "job_id": job_id}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def is_held(self) -> bool:
        """Whether a live process holds the lock (a shared probe: nothing is written, nothing kept)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            return True
        finally:
            os.close(fd)
        return False

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.release()


def _describe(path: Path) -> str:
    try:
        record = json.loads(path.read_text())
        text = f"held by pid {record['pid']} on {record['host']}"
        if record.get("job_id"):
            text += f", Slurm job {record['job_id']}"
        return text
    except (OSError, ValueError, KeyError, TypeError):
        return "held by a process that has not yet recorded itself"
