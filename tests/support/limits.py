"""Real limits for a test's processes: a memory cgroup of this machine (v2 or v1), as Slurm's task/cgroup
plugin gives each job on a cluster, and a small file system (a tmpfs of a set size) that fills up. Root
only; CI runs as root and must not skip what needs them."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


def _required() -> bool:
    return os.environ.get("CI", "").lower() == "true" or os.environ.get("HPCTRAIN_REQUIRE_SLURM") == "1"


def _v2_memory() -> bool:
    controllers = V2 / "cgroup.controllers"
    return controllers.exists() and "memory" in controllers.read_text().split()


def _make(name: str, limit: int) -> Path:
    """The cgroup's folder, made with ``limit`` bytes of memory, swap included."""
    if _v2_memory():
        group = V2 / name
        group.mkdir()
        (group / "memory.max").write_text(str(limit))
        with contextlib.suppress(OSError):  # no swap on this kernel: nothing more to limit
            (group / "memory.swap.max").write_text("0")
        return group
    group = V1 / name
    group.mkdir()
    (group / "memory.limit_in_bytes").write_text(str(limit))
    with contextlib.suppress(OSError):  # no swap accounting on this kernel: nothing more to limit
        (group / "memory.memsw.limit_in_bytes").write_text(str(limit))
    return group


@contextlib.contextmanager
def memory_limit(limit: int) -> Iterator[Path]:
    """A memory cgroup limited to ``limit`` bytes, for the processes a test starts in it (write a pid to
    ``<it>/cgroup.procs``, e.g. from ``preexec_fn``); removed afterwards, once its processes are gone."""
    name = f"hpctrain-test-{uuid.uuid4().hex[:8]}"
    try:
        group = _make(name, limit)
    except OSError as err:
        _cannot(f"no memory cgroup can be made here ({err}): the test needs root and a memory controller")
    try:
        yield group
    finally:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                group.rmdir()
                break
            time.sleep(0.2)


def join(group: Path) -> None:
    """Move the calling process into ``group`` (a ``preexec_fn``: the child starts there)."""
    (group / "cgroup.procs").write_text(str(os.getpid()))


@contextlib.contextmanager
def small_disk(where: Path, size_kib: int) -> Iterator[Path]:
    """A tmpfs of ``size_kib`` KiB mounted at ``where`` (made), unmounted afterwards."""
    where.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(where)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        _cannot(f"no tmpfs can be mounted here ({mounted.stderr.strip()}): the test needs root")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _cannot(reason: str) -> None:
    if _required():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)
