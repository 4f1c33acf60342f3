"""Fixtures of the fast tier, and one intra-op thread per test process."""

from __future__ import annotations

import logging
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from hpctrain.launch.forked import FORKSERVER_ENV, OFF
from hpctrain.slurm import commands
from tests.support.fake_slurm import FAKE, Fake

# The fast tier's models are tiny: intra-op threads gain them nothing, and with two xdist workers on two cores
# their spin-waits only slow each other down (several times, on a busy machine).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def no_fork_server(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast tier starts no local run, so no fork server: ``hpctrain`` prestarts one (a process importing
    torch) for a command that looks local and stops it once the command turns out to start nothing, which
    ~45 bad-input cases here paid for in CPU beside the other worker (tests/unit: 72-78 s -> ~62 s). A
    test of the fork server's own switch sets ``HPCTRAIN_FORKSERVER`` itself."""
    monkeypatch.setenv(FORKSERVER_ENV, OFF)


@pytest.fixture(autouse=True)
def own_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cache of each test's own (HPCTRAIN_CACHE): the shared Slurm watch's snapshot (hpctrain.slurm.watch)
    of one test's fake clients is not another's answer, and no test writes the user's."""
    monkeypatch.setenv("HPCTRAIN_CACHE", str(tmp_path_factory.mktemp("cache")))


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fake:
    root = tmp_path / "fake"
    root.mkdir()
    for name in ("sacct", "scontrol", "sinfo", "squeue"):
        path = root / name
        path.write_text(FAKE)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{root}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(root))
    monkeypatch.delenv("SLURM_JOB_NUM_NODES", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.setattr(commands.time, "sleep", lambda s: None)
    return Fake(root)


@pytest.fixture
def as_a_worker() -> Iterator[None]:
    """This process as a worker process is, for one test: what a worker sets up for its whole life (signal
    handlers, the root logger's handlers, the process group) is put back afterwards."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGINT)}
    root = logging.getLogger()
    saved, level = root.handlers[:], root.level
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        for handler in root.handlers:
            if handler not in saved:
                handler.close()
        root.handlers, root.level = saved, level
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
